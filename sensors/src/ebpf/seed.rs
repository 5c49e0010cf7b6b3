//! Connections a process accepted before tracing began, found in /proc, so
//! that a keep-alive connection already open is followed from its next
//! request on instead of being invisible until it reconnects.

use std::collections::{HashMap, HashSet};
use std::fs;

/// TCP states in /proc/net/tcp.
const TCP_ESTABLISHED: u8 = 0x01;
const TCP_LISTEN: u8 = 0x0A;

/// One row of /proc/PID/net/tcp{,6}: local port, state, socket inode.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TcpRow {
    pub local_port: u16,
    pub state: u8,
    pub inode: u64,
}

pub(crate) fn parse_tcp_table(text: &str) -> Vec<TcpRow> {
    text.lines().skip(1).filter_map(parse_tcp_row).collect()
}

fn parse_tcp_row(line: &str) -> Option<TcpRow> {
    let f: Vec<&str> = line.split_whitespace().collect();
    // sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode
    let local = f.get(1)?;
    let port = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
    let state = u8::from_str_radix(f.get(3)?, 16).ok()?;
    let inode = f.get(9)?.parse().ok()?;
    Some(TcpRow {
        local_port: port,
        state,
        inode,
    })
}

/// The TCP ports `pid` listens on (sockets among its fds).
///
/// Called every second on the tracer thread, which also drains the ring
/// buffer: it reads only the listening rows of /proc/PID/net/tcp{,6},
/// which the kernel prints first (its listening hash, then the
/// established one). Reading whole tables stalled the drain for seconds
/// beside a server that closes a connection per request (thousands of
/// TIME_WAIT rows, each table read once per traced process), and the ring
/// buffer overflowed: a fifth of a pre-fork server's requests were lost.
pub(crate) fn listening_ports(pid: u32) -> Vec<u16> {
    let rows = listening_rows(pid);
    let inodes = socket_inodes(pid);
    let mut ports: Vec<u16> = rows
        .iter()
        .filter(|r| r.state == TCP_LISTEN && inodes.iter().any(|(_, i)| *i == r.inode))
        .map(|r| r.local_port)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// (fd, socket inode) of every socket among `pid`'s fds (empty if they
/// cannot be listed).
pub(crate) fn socket_inodes(pid: u32) -> Vec<(u32, u64)> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| {
            let fd = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            let link = fs::read_link(entry.path()).ok()?;
            let inode = link
                .to_string_lossy()
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .and_then(|s| s.parse::<u64>().ok())?;
            Some((fd, inode))
        })
        .collect()
}

/// The listening rows of /proc/PID/net/tcp and tcp6 (the process's
/// network namespace): each table is read up to its first row in another
/// state.
fn listening_rows(pid: u32) -> Vec<TcpRow> {
    let mut rows = Vec::new();
    for table in ["tcp", "tcp6"] {
        if let Ok(f) = fs::File::open(format!("/proc/{pid}/net/{table}")) {
            rows.extend(leading_listeners(std::io::BufReader::new(f)));
        }
    }
    rows
}

/// The LISTEN rows at the head of a /proc/net/tcp table, read no further.
fn leading_listeners(r: impl std::io::BufRead) -> Vec<TcpRow> {
    let mut rows = Vec::new();
    for line in r.lines().skip(1).map_while(Result::ok) {
        match parse_tcp_row(&line) {
            Some(row) if row.state == TCP_LISTEN => rows.push(row),
            _ => break,
        }
    }
    rows
}

/// (fd, local port) of every established TCP connection of `pid` whose
/// local port is one the process listens on, i.e. one it accepted.
pub(crate) fn accepted_connections(pid: u32) -> Vec<(u32, u16)> {
    let mut rows = Vec::new();
    for table in ["tcp", "tcp6"] {
        if let Ok(text) = fs::read_to_string(format!("/proc/{pid}/net/{table}")) {
            rows.extend(parse_tcp_table(&text));
        }
    }
    let listening: HashSet<u16> = rows
        .iter()
        .filter(|r| r.state == TCP_LISTEN)
        .map(|r| r.local_port)
        .collect();
    let accepted: HashMap<u64, u16> = rows
        .iter()
        .filter(|r| r.state == TCP_ESTABLISHED && listening.contains(&r.local_port))
        .map(|r| (r.inode, r.local_port))
        .collect();
    let dir = match fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(d) => d,
        Err(e) => {
            // Without CAP_SYS_PTRACE another user's fds cannot be listed:
            // connections it accepted before tracing began stay unseen.
            if !accepted.is_empty() {
                tracing::warn!(
                    pid,
                    "cannot list /proc/{pid}/fd ({e}): {} connection(s) accepted before \
                     tracing began are not followed (needs CAP_SYS_PTRACE)",
                    accepted.len()
                );
            }
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(link) = fs::read_link(entry.path()) else {
            continue;
        };
        let link = link.to_string_lossy();
        let Some(inode) = link
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        if let Some(&port) = accepted.get(&inode) {
            out.push((fd, port));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn finds_children_and_listening_ports() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let found = crate::ebpf::descendants(std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&child.id()), "{found:?}");
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listening_ports(std::process::id()).contains(&port));
    }

    #[test]
    fn finds_connections_this_process_accepted() {
        use std::io::Read;
        use std::net::{TcpListener, TcpStream};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let _client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut server_side, _) = l.accept().unwrap();
        server_side.set_nonblocking(true).unwrap();
        let _ = server_side.read(&mut [0u8; 1]);
        use std::os::fd::AsRawFd;
        let fd = server_side.as_raw_fd() as u32;
        let found = accepted_connections(std::process::id());
        assert!(
            found.contains(&(fd, port)),
            "{found:?} lacks ({fd}, {port})"
        );
        // The client side's local port is ephemeral, not a listening port.
        assert_eq!(found.iter().filter(|(_, p)| *p == port).count(), 1);
    }
}
