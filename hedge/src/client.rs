//! The evaluation's clients (paper 003, §4.3): each of `streams` threads
//! sends its share of the ids one after another and waits for the answer
//! (1 s timeout). `Plain` is the baseline and, with the actuator on, the
//! kernel-hedged client (it does nothing else); `AppHedged` resends to the
//! replica itself when no answer came within `T_hedge` (a user-space
//! timer: `ppoll`, as the paper's `select`). Requests carry their id as 8 big-endian
//! bytes at payload offset 0 (the default [`crate::IdRule`]).

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// How a client treats a request.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    /// Send, wait.
    Plain,
    /// Send, wait `t_hedge`, resend to `replica`, wait for the first answer.
    AppHedged {
        replica: SocketAddr,
        t_hedge: Duration,
    },
}

/// One run of a client.
#[derive(Debug, Clone)]
pub struct RunArgs {
    pub service: SocketAddr,
    pub mode: Mode,
    /// Ids `first_id .. first_id + nr_requests`.
    pub first_id: u64,
    pub nr_requests: u64,
    /// Parallel sequential senders (each its own socket).
    pub streams: u64,
    /// Payload bytes (≥ 8: the id).
    pub payload_len: usize,
    pub timeout: Duration,
    /// How long to keep counting late answers after the last request
    /// (longer than the slowest answer, to see every duplicate).
    pub drain: Duration,
}

/// One request's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub id: u64,
    /// When it was sent (CLOCK_REALTIME ns), to lay it beside stalls.
    pub sent_ns: u64,
    /// Send to answer, µs; `None`: no answer within the timeout.
    pub latency_us: Option<f64>,
    /// Answers with this id received while waiting for it and for the next
    /// request of the stream (a second answer here is a duplicate).
    pub answers: u32,
}

/// Runs the client; samples are in no particular order.
pub fn run(args: &RunArgs) -> Result<Vec<Sample>> {
    let streams = args.streams.max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..streams)
            .map(|k| s.spawn(move || stream(args, k, streams)))
            .collect();
        let mut out = Vec::new();
        for h in handles {
            out.extend(
                h.join()
                    .map_err(|_| anyhow::anyhow!("a client stream panicked"))??,
            );
        }
        Ok(out)
    })
}

fn stream(args: &RunArgs, k: u64, streams: u64) -> Result<Vec<Sample>> {
    let bind: SocketAddr = if args.service.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let sock = UdpSocket::bind(bind).context("binding a client socket")?;
    // Plain clients are connected, as most UDP clients are; the kernel
    // hedger makes the replica's answers look like the service's.
    if matches!(args.mode, Mode::Plain) {
        sock.connect(args.service)
            .with_context(|| format!("connecting to {}", args.service))?;
    }
    sock.set_nonblocking(true)?;
    let mut out: Vec<Sample> = Vec::new();
    let mut buf = vec![0u8; args.payload_len.max(8)];
    let mut rx = [0u8; 2048];
    let mut id = args.first_id + k;
    while id < args.first_id + args.nr_requests {
        buf[..8].copy_from_slice(&id.to_be_bytes());
        let sent = Instant::now();
        let sent_ns = crate::wait::realtime_ns();
        let send = |to: SocketAddr| -> Result<()> {
            match args.mode {
                Mode::Plain => sock.send(&buf).map(drop),
                Mode::AppHedged { .. } => sock.send_to(&buf, to).map(drop),
            }
            .with_context(|| format!("sending to {to}"))
        };
        send(args.service)?;
        let mut hedge_at = match args.mode {
            Mode::AppHedged { replica, t_hedge } => Some((sent + t_hedge, replica)),
            Mode::Plain => None,
        };
        let deadline = sent + args.timeout;
        let mut sample = Sample {
            id,
            sent_ns,
            latency_us: None,
            answers: 0,
        };
        loop {
            let now = Instant::now();
            if let Some((at, replica)) = hedge_at {
                if now >= at {
                    send(replica)?;
                    hedge_at = None;
                    continue;
                }
            }
            let until = hedge_at.map_or(deadline, |(at, _)| at.min(deadline));
            if now >= until {
                break;
            }
            if !crate::wait::readable(sock.as_fd(), Some(until - now))? {
                continue;
            }
            match sock.recv(&mut rx) {
                Ok(n) if n >= 8 => {
                    let got = u64::from_be_bytes(rx[..8].try_into().unwrap_or_default());
                    count_answer(&mut out, &mut sample, got);
                    if got == id && sample.latency_us.is_none() {
                        sample.latency_us = Some(sent.elapsed().as_secs_f64() * 1e6);
                        break;
                    }
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e).context("receiving"),
            }
        }
        out.push(sample);
        id += streams;
    }
    // Late answers (duplicates included) still on their way.
    let end = Instant::now() + args.drain;
    let mut spare = Sample {
        id: u64::MAX,
        sent_ns: 0,
        latency_us: None,
        answers: 0,
    };
    while let Some(left) = end
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
    {
        if !crate::wait::readable(sock.as_fd(), Some(left))? {
            continue;
        }
        let Ok(n) = sock.recv(&mut rx) else {
            continue;
        };
        if n >= 8 {
            let got = u64::from_be_bytes(rx[..8].try_into().unwrap_or_default());
            count_answer(&mut out, &mut spare, got);
        }
    }
    Ok(out)
}

/// Counts an answer for `got` on the request it belongs to.
fn count_answer(done: &mut [Sample], current: &mut Sample, got: u64) {
    if got == current.id {
        current.answers += 1;
    } else if let Some(s) = done.iter_mut().rev().find(|s| s.id == got) {
        s.answers += 1;
    }
}

/// P50/P95/P99/max of the answered requests, ms, and how many got none.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Summary {
    pub requests: usize,
    pub lost: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Sorted latencies, ms (lost requests left out).
pub fn sorted_ms(samples: &[Sample]) -> Vec<f64> {
    let mut v: Vec<f64> = samples
        .iter()
        .filter_map(|s| s.latency_us)
        .map(|us| us / 1000.0)
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarize(samples: &[Sample]) -> Summary {
    let v = sorted_ms(samples);
    Summary {
        requests: samples.len(),
        lost: samples.len() - v.len(),
        p50_ms: percentile(&v, 50.0),
        p95_ms: percentile(&v, 95.0),
        p99_ms: percentile(&v, 99.0),
        max_ms: v.last().copied().unwrap_or(f64::NAN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}
