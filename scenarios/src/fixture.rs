//! A small HTTP/1.1 fixture server with known behaviour, for tests and
//! scenarios: a fixed injected delay, CPU work per request (so its capacity
//! depends on cores and frequency), a server-wide stall, and "deterministic
//! chaos" slow requests chosen by request id (`GET /r/<id>`), so every
//! contender meets the same slow requests (paper 003, §4.2).
//!
//! Each connection has a reader thread that timestamps requests and a writer
//! thread that answers them in order when due; replies are not serialised
//! behind each other's delay, only behind each other's CPU work.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;

/// How the fixture server behaves.
#[derive(Debug, Clone, Args)]
pub struct FixtureArgs {
    /// Address to listen on (loopback only); port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Delay added to every reply, µs after the request arrived.
    #[arg(long, default_value_t = 0)]
    pub delay_us: u64,
    /// CPU time burnt per request, µs (capacity ≈ cores / work).
    #[arg(long, default_value_t = 0)]
    pub work_us: u64,
    /// Start of a server-wide stall, ms after start: no reply leaves during it.
    #[arg(long)]
    pub stall_at_ms: Option<u64>,
    /// Length of the stall, ms.
    #[arg(long, default_value_t = 0)]
    pub stall_ms: u64,
    /// Requests `GET /r/<id>` with id % N == 0 are slow (deterministic chaos).
    #[arg(long)]
    pub slow_every: Option<u64>,
    /// Extra delay of a slow request, µs.
    #[arg(long, default_value_t = 0)]
    pub slow_us: u64,
    /// Exit after this many seconds (the server is always bounded in time).
    #[arg(long, default_value_t = 3600)]
    pub exit_after_s: u64,
}

struct Job {
    due: Instant,
    close: bool,
}

/// Binds, prints `listening on ADDR` on stdout, and serves until
/// `exit_after_s`.
pub fn serve(args: FixtureArgs) -> anyhow::Result<()> {
    let addr = crate::load::resolve_loopback(&args.listen)?;
    let listener = TcpListener::bind(addr)?;
    println!("listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let start = Instant::now();
    let end = start + Duration::from_secs(args.exit_after_s);
    let stall = args.stall_at_ms.map(|at| {
        (
            start + Duration::from_millis(at),
            start + Duration::from_millis(at + args.stall_ms),
        )
    });
    std::thread::spawn(move || {
        std::thread::sleep(end.saturating_duration_since(Instant::now()));
        std::process::exit(0);
    });
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let args = args.clone();
        std::thread::spawn(move || handle(conn, &args, stall));
    }
    Ok(())
}

fn handle(conn: TcpStream, args: &FixtureArgs, stall: Option<(Instant, Instant)>) {
    let _ = conn.set_nodelay(true);
    // Both threads use the one accepted fd (no dup): a server-side tracer
    // that follows the fds a process accepted sees the replies too.
    let conn = std::sync::Arc::new(conn);
    let writer = conn.clone();
    let (tx, rx) = mpsc::channel::<Job>();
    let work = Duration::from_micros(args.work_us);
    let w = std::thread::spawn(move || {
        for job in rx {
            std::thread::sleep(job.due.saturating_duration_since(Instant::now()));
            burn_cpu(work);
            if let Some((a, b)) = stall {
                let now = Instant::now();
                if now >= a && now < b {
                    std::thread::sleep(b - now);
                }
            }
            let reply: &[u8] = if job.close {
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
            };
            if (&*writer).write_all(reply).is_err() || job.close {
                let _ = writer.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
    });
    let mut reader = &*conn;
    let mut buf = Vec::with_capacity(8192);
    let mut chunk = [0u8; 8192];
    'read: loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let now = Instant::now();
        buf.extend_from_slice(&chunk[..n]);
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let close = head.contains("connection: close");
            let mut delay = Duration::from_micros(args.delay_us);
            if let (Some(k), Some(id)) = (args.slow_every, request_id(&head)) {
                if k > 0 && id % k == 0 {
                    delay += Duration::from_micros(args.slow_us);
                }
            }
            buf.drain(..end + 4);
            if tx
                .send(Job {
                    due: now + delay,
                    close,
                })
                .is_err()
                || close
            {
                break 'read;
            }
        }
        if buf.len() > 64 * 1024 {
            break;
        }
    }
    drop(tx);
    let _ = w.join();
}

/// The id of `GET /r/<id>`.
fn request_id(head: &str) -> Option<u64> {
    let rest = head.strip_prefix("get /r/")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Spins until this thread has used `d` of CPU time, so the work takes
/// longer when the thread shares a core or the core runs slower.
pub fn burn_cpu(d: Duration) {
    if d.is_zero() {
        return;
    }
    let cpu = || {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
            .map(Duration::from)
            .ok()
    };
    let Some(t0) = cpu() else { return };
    let mut x = 0u64;
    while cpu().is_some_and(|t| t.saturating_sub(t0) < d) {
        for i in 0..64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_ids() {
        assert_eq!(super::request_id("get /r/42 http/1.1\r\nhost: x"), Some(42));
        assert_eq!(super::request_id("get / http/1.1"), None);
    }
}
