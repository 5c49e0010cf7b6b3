//! The deterministic-chaos UDP server (paper 003, §4.2, Alg. 1): each
//! request is answered by echoing it after a base delay, and a request is
//! slow (one extra, long delay) when a seeded hash of its id falls under
//! the fault rate, so every contender, and every replica started with the
//! same seed, meets the very same slow requests. An id seen again within
//! `repeat_fast_ms` is never slow (the paper's anti-replay memory: a retry
//! at the same server stands for a healthy instance).
//!
//! The id rule is the hedger's ([`IdRule`]): big-endian payload bytes
//! `[offset, offset + len)`. Requests too short to hold one are answered
//! after the base delay and counted. One thread: a heap of due answers
//! and a receive timeout until the next one, so slow answers never hold up
//! fast ones.

use std::collections::{BinaryHeap, HashMap};
use std::io::Write;
use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;

use crate::IdRule;

/// How the chaos server behaves.
#[derive(Debug, Clone, Args)]
pub struct ChaosArgs {
    /// Address to listen on.
    #[arg(long)]
    pub listen: std::net::SocketAddr,
    /// Delay of every answer, µs.
    #[arg(long, default_value_t = 2000)]
    pub base_us: u64,
    /// Slow requests per 1000 (chosen by the seeded hash of the id).
    #[arg(long, default_value_t = 20)]
    pub slow_permille: u32,
    /// Extra delay of a slow request, µs.
    #[arg(long, default_value_t = 400_000)]
    pub slow_us: u64,
    /// Seed of the hash that picks the slow ids.
    #[arg(long, default_value_t = 3)]
    pub seed: u64,
    /// An id seen again within this many ms is never slow (0: off).
    #[arg(long, default_value_t = 1000)]
    pub repeat_fast_ms: u64,
    /// Request id: payload offset, bytes.
    #[arg(long, default_value_t = 0)]
    pub id_offset: u16,
    /// Request id: length, bytes (1..=8).
    #[arg(long, default_value_t = 8)]
    pub id_len: u8,
    /// Write one line per request here at exit: `id arrival_ns slow`
    /// (the kernel's receive stamp, CLOCK_REALTIME).
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Exit after this many seconds (the server is always bounded in time).
    #[arg(long, default_value_t = 600)]
    pub exit_after_s: u64,
}

impl ChaosArgs {
    /// A server on `port` of every address of its namespace: every id
    /// answered after `base_us`, `slow_permille` of them (by the seeded
    /// hash) `slow_us` later, with no anti-replay memory (a replica is
    /// another server, and the memory would make a contender fast on ids
    /// the one before it just sent). Ids: the payload's first 8 bytes.
    pub fn on_port(port: u16, base_us: u64, slow_permille: u32, slow_us: u64, seed: u64) -> Self {
        ChaosArgs {
            listen: std::net::SocketAddr::from(([0, 0, 0, 0], port)),
            base_us,
            slow_permille,
            slow_us,
            seed,
            repeat_fast_ms: 0,
            id_offset: 0,
            id_len: 8,
            log: None,
            exit_after_s: 3600,
        }
    }
}

/// SplitMix64 of the seed and id: cheap, well mixed, the same everywhere.
pub fn mix(seed: u64, id: u64) -> u64 {
    let mut z = seed
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(id)
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// True when `id` is one of the slow requests of `seed` at `permille`.
pub fn is_slow(seed: u64, permille: u32, id: u64) -> bool {
    mix(seed, id) % 1000 < u64::from(permille)
}

/// The id of `payload` under `rule`, if it is long enough.
pub fn read_id(rule: IdRule, payload: &[u8]) -> Option<u64> {
    let start = usize::from(rule.offset);
    let bytes = payload.get(start..start + usize::from(rule.len))?;
    Some(bytes.iter().fold(0u64, |v, b| (v << 8) | u64::from(*b)))
}

struct Due {
    at: Instant,
    to: std::net::SocketAddr,
    body: Vec<u8>,
}

impl PartialEq for Due {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    // Earliest first in a max-heap.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.at.cmp(&self.at)
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub id: u64,
    /// When the kernel received it: CLOCK_REALTIME, ns (one clock for
    /// every namespace; not the server thread's wake-up).
    pub arrival_ns: u64,
    pub slow: bool,
}

/// Binds, prints `listening on ADDR`, and serves until `exit_after_s`.
pub fn serve(args: ChaosArgs) -> Result<()> {
    let sock = UdpSocket::bind(args.listen).with_context(|| format!("binding {}", args.listen))?;
    println!("listening on {}", sock.local_addr()?);
    std::io::stdout().flush()?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let seen = serve_on(&args, &sock, &stop)?;
    if let Some(path) = &args.log {
        let lines: Vec<String> = seen
            .iter()
            .map(|s| format!("{} {} {}", s.id, s.arrival_ns, u8::from(s.slow)))
            .collect();
        std::fs::write(path, lines.join("\n") + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Serves on `sock` until `exit_after_s` or `stop`; returns every request
/// that carried an id, in arrival order.
pub fn serve_on(
    args: &ChaosArgs,
    sock: &UdpSocket,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<Vec<Seen>> {
    let rule = IdRule {
        offset: args.id_offset,
        len: args.id_len,
    };
    anyhow::ensure!((1..=8).contains(&rule.len), "--id-len must be 1..=8");
    sock.set_nonblocking(true)?;
    crate::wait::stamp_receives(sock.as_fd())?;
    let end = Instant::now() + Duration::from_secs(args.exit_after_s);
    let mut due = BinaryHeap::new();
    let mut seen: HashMap<u64, Instant> = HashMap::new();
    let mut log = Vec::new();
    let mut buf = [0u8; 2048];
    let repeat = Duration::from_millis(args.repeat_fast_ms);
    while Instant::now() < end && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let now = Instant::now();
        while due.peek().is_some_and(|d: &Due| d.at <= now) {
            if let Some(d) = due.pop() {
                let _ = sock.send_to(&d.body, d.to);
            }
        }
        let wait = due
            .peek()
            .map(|d: &Due| d.at.saturating_duration_since(now))
            .unwrap_or(Duration::from_millis(100))
            .clamp(Duration::from_micros(50), Duration::from_millis(100));
        if !crate::wait::readable(sock.as_fd(), Some(wait))? {
            continue;
        }
        let (n, from, arrival) = match crate::wait::recv_stamped(sock.as_fd(), &mut buf) {
            Ok((n, Some(from), stamp)) => (n, from, stamp),
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e).context("receiving"),
        };
        let now = Instant::now();
        let mut delay = Duration::from_micros(args.base_us);
        if let Some(id) = read_id(rule, &buf[..n]) {
            let again = seen
                .get(&id)
                .is_some_and(|t| now.duration_since(*t) < repeat);
            let slow = !again && is_slow(args.seed, args.slow_permille, id);
            if slow {
                delay += Duration::from_micros(args.slow_us);
            }
            if args.repeat_fast_ms > 0 {
                seen.insert(id, now);
                if seen.len() > 100_000 {
                    seen.retain(|_, t| now.duration_since(*t) < repeat);
                }
            }
            log.push(Seen {
                id,
                arrival_ns: arrival,
                slow,
            });
        }
        due.push(Due {
            at: now + delay,
            to: from,
            body: buf[..n].to_vec(),
        });
    }
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_ids_are_seeded_and_near_the_rate() {
        let n = (0..100_000).filter(|&id| is_slow(7, 20, id)).count();
        assert!((1700..2300).contains(&n), "{n} slow of 100000 at 2 %");
        let a: Vec<u64> = (0..1000).filter(|&id| is_slow(7, 20, id)).collect();
        let b: Vec<u64> = (0..1000).filter(|&id| is_slow(7, 20, id)).collect();
        let c: Vec<u64> = (0..1000).filter(|&id| is_slow(8, 20, id)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn ids_follow_the_rule() {
        let p = [0xaa, 0x01, 0x02, 0x03];
        assert_eq!(read_id(IdRule { offset: 1, len: 2 }, &p), Some(0x0102));
        assert_eq!(read_id(IdRule { offset: 3, len: 2 }, &p), None);
    }
}
