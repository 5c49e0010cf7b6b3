//! Connections a process accepted before tracing began, found in /proc, so
//! that a keep-alive connection already open is followed from its next
//! request on instead of being invisible until it reconnects.

use std::collections::{HashMap, HashSet};
use std::fs;

use qosd_core::sys::sockets::{self, TCP_ESTABLISHED, TCP_LISTEN};
use qosd_core::sys::Root;

/// The TCP ports `pid` listens on: the listening rows of its tables whose
/// socket is one of `inodes` (its fds').
///
/// Called every second on the tracer thread, which also drains the ring
/// buffer: it reads only the listening rows of /proc/PID/net/tcp{,6},
/// which the kernel prints first (its listening hash, then the
/// established one). Reading whole tables stalled the drain for seconds
/// beside a server that closes a connection per request (thousands of
/// TIME_WAIT rows, each table read once per traced process), and the ring
/// buffer overflowed: a fifth of a pre-fork server's requests were lost.
fn ports_among(pid: u32, inodes: &[u64]) -> Vec<u16> {
    if inodes.is_empty() {
        return Vec::new();
    }
    let mut ports: Vec<u16> = sockets::tcp_listeners(&Root::default(), pid as i32)
        .iter()
        .filter(|r| r.state == TCP_LISTEN && inodes.contains(&r.inode))
        .map(|r| r.local_port)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The listening ports of each traced process as last found, kept with the
/// socket inodes among its fds then, so that the tables are read again only
/// when those change. Even its LISTEN rows alone, a read of
/// /proc/PID/net/tcp{,6} walks the kernel's whole established-connection
/// hash (262 144 buckets on this machine kind) to fill its page: ~40 % of
/// an idle tracer's CPU (~3.5 ms each second), taken from the server it
/// traces when the node is saturated. A socket may start listening after
/// it appeared (socket() then listen()): a set is trusted only once it
/// held through two refreshes, and read again every [`REREAD_EVERY`]
/// refreshes anyway.
#[derive(Default)]
pub(crate) struct ListenCache(HashMap<u32, Listening>);

struct Listening {
    inodes: Vec<u64>,
    ports: Vec<u16>,
    /// Refreshes in a row that found the same inodes.
    same: u32,
}

/// At most this many refreshes (seconds) between two reads of a process's
/// tables.
const REREAD_EVERY: u32 = 10;

impl ListenCache {
    /// The TCP ports `pid` listens on ([`ports_among`], read again only
    /// when its sockets changed).
    pub fn ports(&mut self, pid: u32) -> Vec<u16> {
        let mut inodes: Vec<u64> = socket_inodes(pid).into_iter().map(|(_, i)| i).collect();
        inodes.sort_unstable();
        if let Some(l) = self.0.get_mut(&pid) {
            if l.inodes == inodes {
                l.same += 1;
                if l.same >= 2 && l.same % REREAD_EVERY != 0 {
                    return l.ports.clone();
                }
            } else {
                l.same = 0;
            }
        }
        let ports = ports_among(pid, &inodes);
        let same = self.0.get(&pid).map_or(0, |l| l.same);
        let l = Listening {
            inodes,
            ports: ports.clone(),
            same,
        };
        self.0.insert(pid, l);
        ports
    }

    /// Forgets every process but `pids`.
    pub fn retain(&mut self, pids: &[u32]) {
        self.0.retain(|p, _| pids.contains(p));
    }
}

/// (fd, socket inode) of every socket among `pid`'s fds (empty if they
/// cannot be listed).
pub(crate) fn socket_inodes(pid: u32) -> Vec<(u32, u64)> {
    sockets::socket_inodes(&Root::default(), pid as i32).unwrap_or_default()
}

/// (fd, local port) of every established TCP connection of `pid` whose
/// local port is one the process listens on, i.e. one it accepted.
pub(crate) fn accepted_connections(pid: u32) -> Vec<(u32, u16)> {
    let mut rows = Vec::new();
    for table in ["tcp", "tcp6"] {
        if let Ok(text) = fs::read_to_string(format!("/proc/{pid}/net/{table}")) {
            rows.extend(sockets::parse_tcp_table(&text));
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
    let fds = match sockets::socket_inodes(&Root::default(), pid as i32) {
        Ok(fds) => fds,
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
    fds.into_iter()
        .filter_map(|(fd, inode)| Some((fd, *accepted.get(&inode)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut cache = ListenCache::default();
        assert!(cache.ports(std::process::id()).contains(&port));
    }

    /// A new or closed listening socket is seen at the next refresh; a
    /// socket that starts listening long after it was made, within
    /// REREAD_EVERY refreshes (other tests' sockets come and go in this
    /// process meanwhile, which only makes it sooner).
    #[test]
    fn the_listen_cache_follows_sockets() {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let me = std::process::id();
        let mut cache = ListenCache::default();
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let pa = a.local_addr().unwrap().port();
        assert!(cache.ports(me).contains(&pa));
        let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let pb = b.local_addr().unwrap().port();
        let found = cache.ports(me);
        assert!(found.contains(&pa) && found.contains(&pb), "{found:?}");
        drop(a);
        assert!(!cache.ports(me).contains(&pa));
        // socket() now, listen() after the cache has trusted the set.
        // SAFETY: plain socket(2); the fd is owned by `late` from here.
        let late = unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0);
            OwnedFd::from_raw_fd(fd)
        };
        for _ in 0..3 {
            cache.ports(me);
        }
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
            },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let (mut bound, mut blen) = (addr, len);
        // SAFETY: bind/listen/getsockname on our own socket with a
        // sockaddr_in of the right length.
        unsafe {
            let sa = &addr as *const libc::sockaddr_in as *const libc::sockaddr;
            assert_eq!(libc::bind(late.as_raw_fd(), sa, len), 0);
            assert_eq!(libc::listen(late.as_raw_fd(), 1), 0);
            let out = &mut bound as *mut libc::sockaddr_in as *mut libc::sockaddr;
            assert_eq!(libc::getsockname(late.as_raw_fd(), out, &mut blen), 0);
        }
        let pl = u16::from_be(bound.sin_port);
        let seen = (0..REREAD_EVERY).any(|_| cache.ports(me).contains(&pl));
        assert!(seen, "port {pl} not found in {REREAD_EVERY} refreshes");
        drop(b);
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
