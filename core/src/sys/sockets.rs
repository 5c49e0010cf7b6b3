//! The ports an app listens on, from its processes' sockets: the socket
//! inodes of `/proc/PID/fd/*` (links `socket:[INODE]`) matched against
//! the LISTEN entries of `/proc/PID/net/tcp{,6}` and the bound,
//! unconnected entries of `/proc/PID/net/udp{,6}`, read in the first
//! process's network namespace (an app's processes share one; a socket of
//! another namespace is not found there and does not count).
//!
//! The one reader of `/proc` socket tables and fd links: the request
//! tracer (`qosd_sensors::ebpf::seed`) finds its targets' listening ports
//! and already-accepted connections with these too.

use std::collections::BTreeSet;
use std::io::BufRead;

use super::{Root, SysError};

/// TCP states (`st`) in `/proc/net/tcp`.
pub const TCP_ESTABLISHED: u8 = 0x01;
pub const TCP_LISTEN: u8 = 0x0A;

/// One row of `/proc/PID/net/tcp{,6}`: local port, state, socket inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpRow {
    pub local_port: u16,
    pub state: u8,
    pub inode: u64,
}

/// Every row of a `/proc/net/tcp{,6}` table.
pub fn parse_tcp_table(text: &str) -> Vec<TcpRow> {
    text.lines().skip(1).filter_map(parse_tcp_row).collect()
}

fn parse_tcp_row(line: &str) -> Option<TcpRow> {
    let f: Vec<&str> = line.split_whitespace().collect();
    // sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode
    let port = u16::from_str_radix(f.get(1)?.rsplit_once(':')?.1, 16).ok()?;
    Some(TcpRow {
        local_port: port,
        state: u8::from_str_radix(f.get(3)?, 16).ok()?,
        inode: f.get(9)?.parse().ok()?,
    })
}

/// The LISTEN rows at the head of a `/proc/net/tcp{,6}` table, read no
/// further: the kernel prints its listening hash first, then the
/// established one, and reading the rest means thousands of rows beside
/// a server that closes a connection per request.
pub fn leading_listeners(r: impl BufRead) -> Vec<TcpRow> {
    let mut rows = Vec::new();
    for line in r.lines().skip(1).map_while(Result::ok) {
        match parse_tcp_row(&line) {
            Some(row) if row.state == TCP_LISTEN => rows.push(row),
            _ => break,
        }
    }
    rows
}

/// The listening rows of `/proc/PID/net/tcp` and `tcp6` (the process's
/// network namespace; a missing table, e.g. no IPv6, adds none).
pub fn tcp_listeners(root: &Root, pid: i32) -> Vec<TcpRow> {
    let mut rows = Vec::new();
    for table in ["tcp", "tcp6"] {
        if let Ok(f) = std::fs::File::open(root.path(format!("/proc/{pid}/net/{table}"))) {
            rows.extend(leading_listeners(std::io::BufReader::new(f)));
        }
    }
    rows
}

/// The local ports `pids` listen on (TCP LISTEN, or UDP bound with no
/// peer), sorted; empty without processes or sockets.
pub fn listening_ports(root: &Root, pids: &[i32]) -> Result<Vec<u16>, SysError> {
    let Some(&first) = pids.first() else {
        return Ok(Vec::new());
    };
    let inodes: BTreeSet<u64> = pids
        .iter()
        .flat_map(|&p| socket_inodes(root, p).unwrap_or_default())
        .map(|(_, inode)| inode)
        .collect();
    if inodes.is_empty() {
        return Ok(Vec::new());
    }
    let mut ports: BTreeSet<u16> = tcp_listeners(root, first)
        .into_iter()
        .filter(|r| inodes.contains(&r.inode))
        .map(|r| r.local_port)
        .collect();
    for file in ["udp", "udp6"] {
        let text = match root.read(format!("/proc/{first}/net/{file}")) {
            Ok(t) => t,
            // No IPv6 in that namespace, or the process is gone.
            Err(e) if e.is_gone() => continue,
            Err(e) => return Err(e),
        };
        ports.extend(
            text.lines()
                .skip(1)
                .filter_map(udp_bound)
                .filter(|(_, inode)| inodes.contains(inode))
                .map(|(port, _)| port),
        );
    }
    Ok(ports.into_iter().collect())
}

/// (fd, socket inode) of every socket among `pid`'s open files; the error
/// when they cannot be listed (gone, or another user's without
/// CAP_SYS_PTRACE).
pub fn socket_inodes(root: &Root, pid: i32) -> std::io::Result<Vec<(u32, u64)>> {
    let rd = std::fs::read_dir(root.path(format!("/proc/{pid}/fd")))?;
    Ok(rd
        .filter_map(|e| {
            let e = e.ok()?;
            let fd = e.file_name().to_str()?.parse().ok()?;
            let link = std::fs::read_link(e.path()).ok()?;
            let s = link.to_str()?;
            let inode = s
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()?;
            Some((fd, inode))
        })
        .collect())
}

/// (local port, inode) of a `/proc/net/udp*` line bound with no peer.
fn udp_bound(line: &str) -> Option<(u16, u64)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let (local, remote, inode) = (f.get(1)?, f.get(2)?, f.get(9)?);
    let port = u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()?;
    let remote_port = u16::from_str_radix(remote.rsplit_once(':')?.1, 16).ok()?;
    (remote_port == 0 && port != 0).then_some((port, inode.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:2C2D 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:2C2D 0100007F:D3A2 01 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 20 4 30 10 -1
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3333 1 0000000000000000 100 0 0 10 0
";
    const UDP: &str = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  100: 0101E20A:1C10 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4444 2 0000000000000000 0
  101: 0101E20A:9C40 0201E20A:1C10 01 00000000:00000000 00:00000000 00000000     0        0 5555 2 0000000000000000 0
";

    /// A fake `/proc/7` whose fds are the sockets `inodes`.
    fn fake(inodes: &[u64]) -> (tempfile::TempDir, Root) {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let fd = root.path("/proc/7/fd");
        std::fs::create_dir_all(&fd).unwrap();
        std::fs::create_dir_all(root.path("/proc/7/net")).unwrap();
        std::fs::write(root.path("/proc/7/net/tcp"), TCP).unwrap();
        std::fs::write(root.path("/proc/7/net/udp"), UDP).unwrap();
        for (i, n) in inodes.iter().enumerate() {
            std::os::unix::fs::symlink(format!("socket:[{n}]"), fd.join(i.to_string())).unwrap();
        }
        std::os::unix::fs::symlink("/dev/null", fd.join("99")).unwrap();
        (d, root)
    }

    #[test]
    fn only_the_apps_listening_sockets_count() {
        // 1111: TCP LISTEN on 11309; 2222: an accepted connection on the
        // same port; 3333: sshd's (not the app's); 4444: UDP bound on
        // 7184; 5555: a connected UDP socket.
        let (_d, root) = fake(&[1111, 2222, 4444, 5555]);
        assert_eq!(listening_ports(&root, &[7]).unwrap(), vec![7184, 11309]);
        let (_d, root) = fake(&[2222, 5555]);
        assert!(listening_ports(&root, &[7]).unwrap().is_empty());
        assert!(listening_ports(&root, &[]).unwrap().is_empty());
    }

    #[test]
    fn this_process_listening_socket_is_found() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let me = std::process::id() as i32;
        let got = listening_ports(&Root::default(), &[me]).unwrap();
        assert!(got.contains(&port), "{port} not in {got:?}");
    }

    #[test]
    fn parses_proc_net_tcp() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:2BCB 00000000:0000 0A 00000000:00000000 00:00000000 00000000   100        0 31337 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:2BCB 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000   100        0 41414 1 0000000000000000 20 4 30 10 -1\n";
        let rows = parse_tcp_table(text);
        assert_eq!(
            rows,
            vec![
                TcpRow {
                    local_port: 11211,
                    state: TCP_LISTEN,
                    inode: 31337
                },
                TcpRow {
                    local_port: 11211,
                    state: TCP_ESTABLISHED,
                    inode: 41414
                },
            ]
        );
    }

    #[test]
    fn listeners_are_read_up_to_the_first_other_row() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:2BCB 00000000:0000 0A 00000000:00000000 00:00000000 00000000   100        0 31337 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000   100        0 31338 1 0000000000000000 100 0 0 10 0\n\
   2: 0100007F:2BCB 0100007F:D2F0 06 00000000:00000000 03:00000D0D 00000000     0        0 0 3 0000000000000000\n\
   3: 0100007F:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000   100        0 31339 1 0000000000000000 100 0 0 10 0\n";
        let ports: Vec<u16> = leading_listeners(text.as_bytes())
            .iter()
            .map(|r| r.local_port)
            .collect();
        assert_eq!(ports, vec![11211, 8080]);
    }
}
