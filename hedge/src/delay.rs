//! The delay line that holds each request's clone for `T_hedge`.
//!
//! - `netem` (the paper's): a netem qdisc on the delay veth's entry; the
//!   kernel's packet scheduler keeps the time. Used when the kernel has
//!   netem (`CONFIG_NET_SCH_NETEM`).
//! - `thread`: where the kernel has neither netem nor fq/etf (this
//!   machine's kernel has none of them, nor a BPF qdisc), a qosd thread
//!   (SCHED_FIFO when allowed) holds the clones: a packet socket on the
//!   delay veth's exit receives them, and at `T_hedge` after the kernel's
//!   receive timestamp writes them back into the veth, where the kernel
//!   program decides, on the scoreboard as it is *then*, whether to hedge.
//!   Only the timer is in user space; its lateness is measured and shown.
//!   The thread sleeps (ppoll, an hrtimer; no timer slack) until
//!   [`SPIN_NS`] before the next due time and spins the rest, so the
//!   wake-up's own latency (tens of µs on this VM) is not in the lateness;
//!   what is left is the time the vCPU did not run at all (see
//!   [`crate::stall`]). The spinning's CPU time is measured and shown.
//!   A clone of an offloading veth carries a partial UDP checksum (the
//!   pseudo-header sum only); a packet socket hands it over as is, so the
//!   thread completes it (counted) before the kernel rewrites addresses.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// What the thread delay line did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DelayStats {
    /// Clones held and written back.
    pub held: u64,
    /// Clones whose partial UDP checksum was completed.
    pub csum_completed: u64,
    /// How late clones left, µs (after their due time): p50, p99, max.
    pub late_p50_us: f64,
    pub late_p99_us: f64,
    pub late_max_us: f64,
    /// The longest `send` of a clone back into the veth, µs: the part of
    /// the lateness spent in the kernel (the clone's own path and any
    /// receive work the kernel does on the way out of the call) rather
    /// than in waking the thread.
    pub send_max_us: f64,
    /// True when the thread runs SCHED_FIFO (else the normal class).
    pub realtime: bool,
    /// When the latest clone left (CLOCK_REALTIME ns), to lay it beside
    /// the stalls [`crate::stall`] saw.
    pub late_max_at_ns: u64,
    /// CPU time the thread used, ms (its sleeps, spins and sends).
    pub cpu_ms: f64,
}

#[derive(Default)]
struct Shared {
    held: AtomicU64,
    csum_completed: AtomicU64,
    late_us: Mutex<Vec<u32>>,
    send_max_ns: AtomicU64,
    realtime: AtomicBool,
    /// (lateness ns, when) of the latest clone.
    late_max: Mutex<(u64, u64)>,
    cpu_ns: AtomicU64,
}

/// A running thread delay line; stops when dropped.
pub struct ThreadLine {
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

/// Lateness samples kept for the percentiles.
const MAX_SAMPLES: usize = 200_000;

/// How long before a clone's due time the thread stops sleeping and
/// spins: above the median of its wake-up latency here (~30 µs when it
/// slept to the due time), so most clones leave within a few µs. Not
/// longer: the spin is CPU taken at SCHED_FIFO from everything else on
/// the CPU, and 200 µs (above the wake-up's p99) cost ~2.5x the CPU time
/// for no better p99 or max (`qosd-hedge-eval`, BENCHMARKS.md).
pub const SPIN_NS: u64 = 50_000;

/// A packet socket bound to `ifindex` (open it inside the interface's
/// namespace), receiving every frame but its own.
pub fn packet_socket(ifindex: u32) -> Result<OwnedFd> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2) call; the fd is owned right below.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(proto),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("opening a packet socket");
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data; zero is a valid start.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = proto;
    sa.sll_ifindex = ifindex as i32;
    // SAFETY: sa is a valid sockaddr_ll of the size passed.
    let r = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&sa as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context("binding the packet socket");
    }
    let one: libc::c_int = 1;
    // SAFETY: an int option of the right size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            (&one as *const libc::c_int).cast(),
            4,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context("ignoring outgoing frames");
    }
    crate::wait::stamp_receives(sock.as_fd()).context("stamping received frames")?;
    Ok(sock)
}

/// Completes the UDP checksum of an Ethernet/IPv4/UDP frame when it is not
/// the full one (a zero checksum, "none", stays). True when it changed.
pub fn complete_udp_csum(f: &mut [u8]) -> bool {
    if f.len() < 14 + 20 + 8 || f[12..14] != [0x08, 0x00] || f[14 + 9] != 17 {
        return false;
    }
    let l4 = 14 + usize::from(f[14] & 0x0f) * 4;
    if f.len() < l4 + 8 {
        return false;
    }
    let udp_len = usize::from(u16::from_be_bytes([f[l4 + 4], f[l4 + 5]]));
    if udp_len < 8 || f.len() < l4 + udp_len || f[l4 + 6..l4 + 8] == [0, 0] {
        return false;
    }
    let want = udp_checksum(&f[14 + 12..14 + 20], &f[l4..l4 + udp_len]);
    if f[l4 + 6..l4 + 8] == want.to_be_bytes() {
        return false;
    }
    f[l4 + 6..l4 + 8].copy_from_slice(&want.to_be_bytes());
    true
}

/// The UDP checksum over the pseudo header (`addrs`: source and
/// destination, 8 bytes) and the datagram (its checksum field skipped).
pub fn udp_checksum(addrs: &[u8], udp: &[u8]) -> u16 {
    let mut sum: u32 = 17 + udp.len() as u32;
    let mut add = |b: &[u8], skip: Option<usize>| {
        for (i, w) in b.chunks(2).enumerate() {
            if Some(i) == skip {
                continue;
            }
            sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
    };
    add(addrs, None);
    add(udp, Some(3));
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    match !(sum as u16) {
        0 => 0xffff,
        c => c,
    }
}

impl ThreadLine {
    /// Starts holding the frames `sock` receives for `delay`.
    pub fn start(sock: OwnedFd, delay: Duration) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared::default());
        let (s, sh) = (stop.clone(), shared.clone());
        let handle = std::thread::Builder::new()
            .name("qosd-hedge-delay".into())
            .spawn(move || run(sock, delay, &s, &sh))
            .context("starting the delay-line thread")?;
        Ok(ThreadLine {
            stop,
            shared,
            handle: Some(handle),
        })
    }

    pub fn stats(&self) -> DelayStats {
        let mut late = self
            .shared
            .late_us
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default();
        late.sort_unstable();
        let pct = |p: f64| -> f64 {
            if late.is_empty() {
                return 0.0;
            }
            let rank = ((p / 100.0) * late.len() as f64).ceil() as usize;
            f64::from(late[rank.clamp(1, late.len()) - 1])
        };
        DelayStats {
            held: self.shared.held.load(Ordering::Relaxed),
            csum_completed: self.shared.csum_completed.load(Ordering::Relaxed),
            late_p50_us: pct(50.0),
            late_p99_us: pct(99.0),
            late_max_us: late.last().copied().map_or(0.0, f64::from),
            send_max_us: self.shared.send_max_ns.load(Ordering::Relaxed) as f64 / 1000.0,
            realtime: self.shared.realtime.load(Ordering::Relaxed),
            late_max_at_ns: self.shared.late_max.lock().map_or(0, |m| m.1),
            cpu_ms: self.shared.cpu_ns.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

impl Drop for ThreadLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Asks for SCHED_FIFO (priority 10) for the calling thread, and the
/// least timer slack (the default 50 µs would add to every sleep of a
/// normal-class thread; SCHED_FIFO threads have none).
fn realtime() -> bool {
    // SAFETY: prctl with integer arguments on the calling thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
    let p = libc::sched_param { sched_priority: 10 };
    // SAFETY: sets the calling thread's policy; p lives across the call.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) == 0 }
}

/// CPU time of the calling thread, ns.
fn thread_cpu_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Sends the clones that are due, recording how late each left.
fn send_due(sock: &OwnedFd, held: &mut VecDeque<(u64, Vec<u8>)>, sh: &Shared) {
    while held
        .front()
        .is_some_and(|(due, _)| *due <= crate::wait::realtime_ns())
    {
        let Some((due, frame)) = held.pop_front() else {
            break;
        };
        let woke = crate::wait::realtime_ns();
        // SAFETY: sending a live buffer on our bound packet socket.
        unsafe { libc::send(sock.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        let sent = crate::wait::realtime_ns();
        sh.send_max_ns
            .fetch_max(sent.saturating_sub(woke), Ordering::Relaxed);
        let late_ns = sent.saturating_sub(due);
        sh.held.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut m) = sh.late_max.lock() {
            if late_ns > m.0 {
                *m = (late_ns, sent);
            }
        }
        if let Ok(mut v) = sh.late_us.lock() {
            if v.len() < MAX_SAMPLES {
                v.push((late_ns / 1000).min(u64::from(u32::MAX)) as u32);
            }
        }
    }
}

/// Holds every clone waiting in the socket, due `delay_ns` after the
/// kernel received it.
fn receive_all(
    sock: &OwnedFd,
    held: &mut VecDeque<(u64, Vec<u8>)>,
    buf: &mut [u8],
    delay_ns: u64,
    sh: &Shared,
) {
    while let Ok((n, _, stamp)) = crate::wait::recv_stamped(sock.as_fd(), buf) {
        let mut frame = buf[..n].to_vec();
        if complete_udp_csum(&mut frame) {
            sh.csum_completed.fetch_add(1, Ordering::Relaxed);
        }
        held.push_back((stamp + delay_ns, frame));
    }
}

fn run(sock: OwnedFd, delay: Duration, stop: &AtomicBool, sh: &Shared) {
    sh.realtime.store(realtime(), Ordering::Relaxed);
    let delay_ns = delay.as_nanos() as u64;
    // Every clone waits the same time, so due times arrive in order.
    let mut held: VecDeque<(u64, Vec<u8>)> = VecDeque::with_capacity(4096);
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        send_due(&sock, &mut held, sh);
        let now = crate::wait::realtime_ns();
        if let Some(&(due, _)) = held.front() {
            if due.saturating_sub(now) <= SPIN_NS {
                // Close enough: take in what arrived (so a dense stream of
                // due times cannot leave clones unread) and spin to the due
                // time.
                receive_all(&sock, &mut held, &mut buf, delay_ns, sh);
                while crate::wait::realtime_ns() < due {
                    std::hint::spin_loop();
                }
                continue;
            }
        }
        let wait = held
            .front()
            .map_or(Duration::from_millis(50), |(due, _)| {
                Duration::from_nanos(due.saturating_sub(now + SPIN_NS))
            })
            .min(Duration::from_millis(50));
        match crate::wait::readable(sock.as_fd(), Some(wait)) {
            Ok(true) => {}
            _ => continue,
        }
        receive_all(&sock, &mut held, &mut buf, delay_ns, sh);
        sh.cpu_ns.store(thread_cpu_ns(), Ordering::Relaxed);
    }
    sh.cpu_ns.store(thread_cpu_ns(), Ordering::Relaxed);
}

/// Fails unless `argv` failed because the kernel lacks the qdisc.
pub fn netem_missing(e: &qosd_actuators::Error) -> Result<()> {
    match e {
        qosd_actuators::Error::Command { message, .. }
            if message.contains("qdisc kind is unknown") =>
        {
            Ok(())
        }
        e => bail!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_checksum_matches_a_known_packet() {
        // 10.0.0.1:1234 -> 10.0.0.2:80, payload "hi"; computed by hand:
        // sum of pseudo header and UDP words, folded and inverted.
        let mut f = vec![0u8; 14];
        f[12] = 0x08;
        let ip = [
            0x45, 0, 0, 30, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0x04, 0xd2, 0x00, 0x50, 0x00, 0x0a, 0x12, 0x34, b'h', b'i']);
        assert!(complete_udp_csum(&mut f));
        let c = u16::from_be_bytes([f[40], f[41]]);
        // Verifying: the sum over everything, checksum included, is 0xffff.
        let mut sum: u32 = 17 + 10;
        for w in [
            0x0a00u32,
            0x0001,
            0x0a00,
            0x0002,
            0x04d2,
            0x0050,
            0x000a,
            u32::from(c),
            0x6869,
        ] {
            sum += w;
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
        // Complete already: unchanged.
        assert!(!complete_udp_csum(&mut f));
    }
}
