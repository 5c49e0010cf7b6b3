//! Connections still open when a target leaves or a trace ends: found
//! (through the owners' socket fds on the socket path, by walking the
//! connection map on the syscall path), their replies in flight flushed as
//! finished requests, their entries dropped so no stale state carries into
//! a later trace.

use super::*;

/// Open connections traced under `root`: (map key, reply in flight) rows,
/// and on the socket path the socket fds that keep those keys valid.
struct OpenConns {
    rows: Vec<(Vec<u8>, Pending)>,
    _fds: Option<SocketFds>,
}

/// The TURN record of a reply sent on a connection still open.
fn pending_turn(
    root: u32,
    fd: u32,
    conn_id: u64,
    (turns, nreq): (u32, u16),
    times: [u64; 3],
) -> req_record {
    req_record {
        arrive_ns: times[0],
        start_ns: times[1],
        end_ns: times[2],
        conn_id,
        tgid: root,
        fd,
        turns,
        kind: REC_TURN,
        pad: 0,
        nreq,
    }
}

/// Open connections of `root`, whose traced processes are `members`.
fn open_conns(maps: &Maps<'_>, root: u32, members: &[u32]) -> OpenConns {
    if maps.lports.is_some() {
        // Entries live in the sockets' storage: reached through the
        // members' socket fds, not by walking a map.
        let fds = SocketFds::of(members);
        let rows = fds
            .keys()
            .filter_map(|k| {
                let v = maps.conns.lookup(&k, MapFlags::ANY).ok()??;
                let c: sock_state = read_pod(&v)?;
                if c.tgid != root {
                    return None;
                }
                let pending = (c.state == ST_RESPONDING && c.emit & EMIT_TURN != 0).then(|| {
                    let times = [c.req_arrive_ns, c.req_start_ns, c.last_out_ns];
                    let r = pending_turn(root, 0, c.conn_id, (c.turns, c.nreq), times);
                    let mut idle = c;
                    idle.state = ST_IDLE;
                    (r, bytes_of(&idle).to_vec())
                });
                Some((k.to_vec(), pending))
            })
            .collect();
        return OpenConns {
            rows,
            _fds: Some(fds),
        };
    }
    let rows = maps
        .conns
        .keys()
        .filter_map(|k| {
            let v = maps.conns.lookup(&k, MapFlags::ANY).ok()??;
            let key: conn_key = read_pod(&k)?;
            let c: conn_state = read_pod(&v)?;
            if !members.contains(&key.tgid) {
                return None;
            }
            let pending = (c.state == ST_RESPONDING && c.emit & EMIT_TURN != 0).then(|| {
                let times = [c.req_start_ns, c.req_start_ns, c.last_out_ns];
                let r = pending_turn(root, key.fd, c.conn_id, (c.turns, c.nreq), times);
                let mut idle = c;
                idle.state = ST_IDLE;
                (r, bytes_of(&idle).to_vec())
            });
            Some((k, pending))
        })
        .collect();
    OpenConns { rows, _fds: None }
}

pub(super) fn remove_target(maps: &Maps<'_>, grpc: &mut Result<GrpcProbes<'_>, String>, pid: u32) {
    if let Ok(g) = grpc.as_mut() {
        g.detach(pid);
    }
    let mut members = members_of(maps, pid);
    if !members.contains(&pid) {
        members.push(pid);
    }
    // First, so that the programs stop looking at the pids at once.
    for &m in &members {
        let _ = set_traced(maps, m, false);
        let _ = maps.targets.delete(bytes_of(&m));
    }
    // A connection left with its entry would carry stale state into a
    // later trace of the same pid.
    let open = open_conns(maps, pid, &members);
    for (k, _) in &open.rows {
        let _ = maps.conns.delete(k);
    }
    let ports: Vec<Vec<u8>> = maps
        .ports
        .keys()
        .filter(|k| read_pod::<port_key>(k).is_some_and(|p| p.tgid == pid))
        .collect();
    for k in ports {
        let _ = maps.ports.delete(&k);
    }
}

/// Turns whose reply went out on connections still open: finished
/// requests whose end the kernel only learns at the next inbound bytes.
pub(super) fn flush_open(maps: &Maps<'_>, pid: u32) -> Vec<req_record> {
    let mut members = members_of(maps, pid);
    if !members.contains(&pid) {
        members.push(pid);
    }
    let open = open_conns(maps, pid, &members);
    open.rows
        .into_iter()
        .filter_map(|(k, pending)| {
            let (r, idle) = pending?;
            let _ = maps.conns.update(&k, &idle, MapFlags::EXIST);
            Some(r)
        })
        .collect()
}
