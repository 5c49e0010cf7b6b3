//! The ports an app listens on, from its processes' sockets: the socket
//! inodes of `/proc/PID/fd/*` (links `socket:[INODE]`) matched against
//! the LISTEN entries of `/proc/PID/net/tcp{,6}` and the bound,
//! unconnected entries of `/proc/PID/net/udp{,6}`, read in the first
//! process's network namespace (an app's processes share one; a socket of
//! another namespace is not found there and does not count).

use std::collections::BTreeSet;

use super::{Root, SysError};

/// `st` of a listening TCP socket in `/proc/net/tcp`.
const TCP_LISTEN: &str = "0A";

/// The local ports `pids` listen on (TCP LISTEN, or UDP bound with no
/// peer), sorted; empty without processes or sockets.
pub fn listening_ports(root: &Root, pids: &[i32]) -> Result<Vec<u16>, SysError> {
    let Some(&first) = pids.first() else {
        return Ok(Vec::new());
    };
    let inodes: BTreeSet<u64> = pids.iter().flat_map(|&p| socket_inodes(root, p)).collect();
    if inodes.is_empty() {
        return Ok(Vec::new());
    }
    let mut ports = BTreeSet::new();
    for (file, tcp) in [
        ("tcp", true),
        ("tcp6", true),
        ("udp", false),
        ("udp6", false),
    ] {
        let text = match root.read(format!("/proc/{first}/net/{file}")) {
            Ok(t) => t,
            // No IPv6 in that namespace, or the process is gone.
            Err(e) if e.is_gone() => continue,
            Err(e) => return Err(e),
        };
        ports.extend(
            text.lines()
                .skip(1)
                .filter_map(|l| listening(l, tcp))
                .filter(|(_, inode)| inodes.contains(inode))
                .map(|(port, _)| port),
        );
    }
    Ok(ports.into_iter().collect())
}

/// The socket inodes among `pid`'s open files (none if it is gone).
fn socket_inodes(root: &Root, pid: i32) -> Vec<u64> {
    let Ok(rd) = std::fs::read_dir(root.path(format!("/proc/{pid}/fd"))) else {
        return Vec::new();
    };
    rd.filter_map(|e| {
        let link = std::fs::read_link(e.ok()?.path()).ok()?;
        let s = link.to_str()?;
        s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
    })
    .collect()
}

/// (local port, inode) of a `/proc/net/{tcp,udp}*` line that listens.
fn listening(line: &str, tcp: bool) -> Option<(u16, u64)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let (local, remote, st, inode) = (f.get(1)?, f.get(2)?, f.get(3)?, f.get(9)?);
    let port = u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()?;
    let remote_port = u16::from_str_radix(remote.rsplit_once(':')?.1, 16).ok()?;
    let listens = if tcp {
        *st == TCP_LISTEN
    } else {
        remote_port == 0
    };
    (listens && port != 0).then_some((port, inode.parse().ok()?))
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
}
