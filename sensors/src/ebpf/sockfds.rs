//! Reaching the socket path's per-connection entries from userspace. They
//! live in each socket's own storage (bpf/sockets.bpf.c), which a map
//! lookup reaches only through a socket fd of the caller: the owners'
//! socket fds are copied into this process with pidfd_getfd(2) for as
//! long as the entries are read or written.

use std::collections::HashSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::seed;

/// Copies of the socket fds of a set of processes, one per socket.
pub(crate) struct SocketFds(Vec<OwnedFd>);

impl SocketFds {
    /// Every socket among the fds of `pids` (a process that is gone, or
    /// whose fds cannot be copied, adds none).
    pub fn of(pids: &[u32]) -> Self {
        let mut seen = HashSet::new();
        let mut fds = Vec::new();
        for &pid in pids {
            let socks: Vec<(u32, u64)> = seed::socket_inodes(pid)
                .into_iter()
                .filter(|(_, inode)| seen.insert(*inode))
                .collect();
            if socks.is_empty() {
                continue;
            }
            let Some(pidfd) = pidfd_open(pid) else {
                continue;
            };
            fds.extend(socks.iter().filter_map(|(fd, _)| pidfd_getfd(&pidfd, *fd)));
        }
        Self(fds)
    }

    /// The map keys of the sockets (an fd of this process, as the kernel
    /// takes it for socket-storage maps).
    pub fn keys(&self) -> impl Iterator<Item = [u8; 4]> + '_ {
        self.0.iter().map(|fd| fd.as_raw_fd().to_ne_bytes())
    }
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1;
    // no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative result is an fd this process now owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn pidfd_getfd(pidfd: &OwnedFd, fd: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_getfd takes two fds and flags and returns a new fd
    // (close-on-exec) or -1; no memory is passed.
    let new = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd as i32, 0) };
    if new < 0 {
        let e = std::io::Error::last_os_error();
        // Without ptrace rights over the target (CAP_SYS_PTRACE, Yama)
        // replies in flight at the end are not counted and a removed
        // target's socket state is left to its socket's end: say so once.
        if e.raw_os_error() == Some(libc::EPERM) {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                tracing::warn!(
                    "pidfd_getfd: {e}: without ptrace rights over the traced processes, \
                     replies still in flight when tracing ends are not counted"
                )
            });
        }
        return None;
    }
    // SAFETY: a non-negative result is an fd this process now owns.
    Some(unsafe { OwnedFd::from_raw_fd(new as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_this_process_sockets() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let fds = SocketFds::of(&[std::process::id()]);
        let port = l.local_addr().unwrap().port();
        // The copy is the very socket: it reports the same local port.
        let same = fds.0.iter().any(|fd| {
            // SAFETY: borrowed for the call only; `fds` keeps it open.
            let s = unsafe { std::net::TcpListener::from_raw_fd(libc::dup(fd.as_raw_fd())) };
            s.local_addr().ok().map(|a| a.port()) == Some(port)
        });
        assert!(
            same,
            "no copy of the listening socket among {} fds",
            fds.0.len()
        );
        assert!(SocketFds::of(&[u32::MAX]).0.is_empty());
    }
}
