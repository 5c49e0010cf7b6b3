//! Waiting for a socket with a high-resolution timeout. `SO_RCVTIMEO`
//! (std's `set_read_timeout`) sleeps in jiffies (4 ms at HZ=250 here),
//! which would round every timer of the clients, the chaos server and the
//! delay line up by milliseconds; `ppoll` sleeps on an hrtimer.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::time::TimeSpec;

/// True when `fd` became readable within `timeout` (`None`: wait forever).
pub fn readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> std::io::Result<bool> {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match ppoll(&mut fds, timeout.map(TimeSpec::from_duration), None) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Asks the kernel to stamp every datagram `fd` receives
/// (`SO_TIMESTAMPNS`, CLOCK_REALTIME), read by [`recv_stamped`].
pub fn stamp_receives(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimestampns, &true)?;
    Ok(())
}

/// CLOCK_REALTIME now, ns (the clock of the receive stamps).
pub fn realtime_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Receives one datagram or frame without blocking: its length, its
/// sender (datagram sockets) and when the kernel received it (ns,
/// CLOCK_REALTIME; now when unstamped). A stamp from another clock (a
/// delivery time carried over from egress on a clone) reads as now too.
pub fn recv_stamped(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
) -> std::io::Result<(usize, Option<std::net::SocketAddr>, u64)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, SockaddrLike, SockaddrStorage};
    use std::os::fd::AsRawFd;
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!(TimeSpec);
    let msg = recvmsg::<SockaddrStorage>(
        fd.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT,
    )?;
    let now = realtime_ns();
    let mut stamp = now;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmTimestampns(ts) = c {
            stamp = ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64;
        }
    }
    if stamp.abs_diff(now) > 1_000_000_000 {
        stamp = now;
    }
    let from = msg.address.and_then(|a: SockaddrStorage| {
        if let Some(v4) = a.as_sockaddr_in() {
            Some(std::net::SocketAddr::V4((*v4).into()))
        } else {
            a.as_sockaddr_in6()
                .map(|v6| std::net::SocketAddr::V6((*v6).into()))
        }
        .filter(|_| a.family().is_some())
    });
    Ok((msg.bytes, from, stamp))
}
