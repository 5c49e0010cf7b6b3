//! Connections still open when a target leaves or a trace ends, or (on
//! the syscall path) when a followed child exits: found (through the
//! owners' socket fds on the socket path, by walking the connection map on
//! the syscall path), their replies in flight flushed as finished
//! requests, their entries dropped so no stale state carries into a later
//! trace.

use std::collections::HashMap;

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
                // A connection timed by its replies (bpf/replies.h) has
                // recorded every parsed reply already: in flight is only
                // a lone request's reply, taken unparsed as a turn.
                let by_turns = c.by_reply != BY_REPLY_ON || c.nreq > 0;
                let responding = c.state == ST_RESPONDING && c.emit & EMIT_TURN != 0;
                let pending = (responding && by_turns).then(|| {
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
    let rows = sys_conns(maps, |tgid| members.contains(&tgid).then_some(root));
    OpenConns { rows, _fds: None }
}

/// Syscall path: the connection map's entries of the processes that
/// `root_of` counts under a root, with their reply in flight as a record
/// under that root.
fn sys_conns(maps: &Maps<'_>, root_of: impl Fn(u32) -> Option<u32>) -> Vec<(Vec<u8>, Pending)> {
    maps.conns
        .keys()
        .filter_map(|k| {
            let key: conn_key = read_pod(&k)?;
            let root = root_of(key.tgid)?;
            let v = maps.conns.lookup(&k, MapFlags::ANY).ok()??;
            let c: conn_state = read_pod(&v)?;
            let pending = (c.state == ST_RESPONDING && c.emit & EMIT_TURN != 0).then(|| {
                let times = [c.req_start_ns, c.req_start_ns, c.last_out_ns];
                let r = pending_turn(root, key.fd, c.conn_id, (c.turns, c.nreq), times);
                let mut idle = c;
                idle.state = ST_IDLE;
                (r, bytes_of(&idle).to_vec())
            });
            Some((k, pending))
        })
        .collect()
}

/// Followed children (tgid -> root) as last seen in the kernel's targets
/// map, on the syscall path. The kernel forgets a child at its exit
/// (follow.h) and closes its sockets without close(2), which the syscall
/// path never sees: the reply in flight on each of its connections (a
/// request served, whose end would come at the next inbound bytes or the
/// close) would be lost, and its entries left behind. The socket path sees
/// the kernel's close and needs none of this.
#[derive(Default)]
pub(super) struct Followed(HashMap<u32, u32>);

impl Followed {
    /// The replies in flight of the children gone since the last call,
    /// counted under the root they had; their entries dropped. A child
    /// that lives between two calls (200 ms apart), or whose pid a new
    /// child of the same root takes in between, is not seen gone.
    pub(super) fn reap(&mut self, maps: &Maps<'_>) -> Vec<req_record> {
        if maps.lports.is_some() {
            return Vec::new();
        }
        let now: HashMap<u32, u32> = maps
            .targets
            .keys()
            .filter_map(|k| {
                let v = maps.targets.lookup(&k, MapFlags::ANY).ok()??;
                let cfg: target_cfg = read_pod(&v)?;
                Some((read_pod::<u32>(&k)?, cfg.root))
            })
            .filter(|(tgid, root)| tgid != root)
            .collect();
        let mut gone = std::mem::replace(&mut self.0, now);
        gone.retain(|tgid, root| self.0.get(tgid) != Some(root));
        if gone.is_empty() {
            return Vec::new();
        }
        let rows = sys_conns(maps, |tgid| gone.get(&tgid).copied());
        let flushed: Vec<req_record> = rows
            .into_iter()
            .filter_map(|(k, pending)| {
                let _ = maps.conns.delete(&k);
                pending.map(|(r, _)| r)
            })
            .collect();
        let children: Vec<&u32> = gone.keys().collect();
        tracing::debug!(
            ?children,
            replies = flushed.len(),
            "followed children exited"
        );
        flushed
    }
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
