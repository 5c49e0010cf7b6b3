//! Best-effort co-runners: a batch job whose progress is measurable, the
//! process that runs it, and the reader of its throughput.
//!
//! The job (`qosd batch`, [`run_job`]) hashes a buffer over and over on
//! `threads` threads and prints its cumulative operation count with its own
//! clock every `report_ms` (`ops COUNT ELAPSED_US`), so a reader gets a
//! live ops/s figure each interval however the pipe is scheduled (stress-ng
//! reports its bogo-ops only when it ends). It is pure CPU work with a
//! small working set: its rate follows the CPU time it gets (cores, CPU
//! quota, frequency), which is what a controller gives it or takes away.
//!
//! [`BatchJob::start`] runs it as a child that dies with its parent
//! (`PR_SET_PDEATHSIG`), and [`BatchJob::ops_per_s`] gives the throughput
//! since the previous call: the per-interval figure of a replay's
//! `timeline.csv` (`be_ops_per_s`) and of the daemon's
//! `qosd_app_be_ops_per_second` gauge.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use nix::sys::prctl;
use nix::sys::signal::Signal;
use std::os::unix::process::CommandExt;

/// How the batch job runs (`qosd batch`).
#[derive(Debug, Clone, Args)]
pub struct BatchArgs {
    /// Worker threads (each uses up to one CPU).
    #[arg(long, default_value_t = 1)]
    pub threads: u32,
    /// Bytes hashed per operation, KiB.
    #[arg(long, default_value_t = 16)]
    pub op_kib: u32,
    /// Period of the progress lines on stdout, ms.
    #[arg(long, default_value_t = 100)]
    pub report_ms: u64,
    /// Exit after this many seconds (the job is always bounded in time).
    #[arg(long, default_value_t = 3600)]
    pub exit_after_s: u64,
}

/// Most threads a job may run (a typo guard, not a machine limit).
pub const MAX_THREADS: u32 = 256;
/// Largest operation, KiB.
pub const MAX_OP_KIB: u32 = 4096;

impl BatchArgs {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_THREADS).contains(&self.threads) {
            return Err(format!(
                "--threads {}: must be 1-{MAX_THREADS}",
                self.threads
            ));
        }
        if !(1..=MAX_OP_KIB).contains(&self.op_kib) {
            return Err(format!("--op-kib {}: must be 1-{MAX_OP_KIB}", self.op_kib));
        }
        if !(10..=10_000).contains(&self.report_ms) {
            return Err(format!("--report-ms {}: must be 10-10000", self.report_ms));
        }
        Ok(())
    }
}

/// One operation: FNV-1a over `buf`, folded back into it so that no
/// iteration can be skipped or hoisted.
fn op(buf: &mut [u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for b in buf.iter() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let i = (h as usize) % buf.len();
    buf[i] = buf[i].wrapping_add(h as u8);
    h
}

/// The job: workers count operations into shared counters; the main
/// thread prints `ops COUNT ELAPSED_US` every `report_ms` until
/// `exit_after_s` or until nobody reads stdout any more.
pub fn run_job(args: BatchArgs) -> anyhow::Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    let counters: Vec<Arc<std::sync::atomic::AtomicU64>> = (0..args.threads)
        .map(|_| Arc::new(std::sync::atomic::AtomicU64::new(0)))
        .collect();
    for (t, c) in counters.iter().enumerate() {
        let c = Arc::clone(c);
        let len = args.op_kib as usize * 1024;
        std::thread::Builder::new()
            .name(format!("batch-{t}"))
            .spawn(move || {
                let mut buf: Vec<u8> = (0..len).map(|i| (i * 31 + t) as u8).collect();
                let mut seed = t as u64;
                loop {
                    seed = std::hint::black_box(op(&mut buf, seed));
                    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
            .context("starting a batch worker thread")?;
    }
    let start = Instant::now();
    let end = start + Duration::from_secs(args.exit_after_s);
    let period = Duration::from_millis(args.report_ms);
    let mut next = start;
    let mut out = std::io::stdout().lock();
    while Instant::now() < end {
        next += period;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let total: u64 = counters
            .iter()
            .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
            .sum();
        let line = format!("ops {total} {}\n", start.elapsed().as_micros());
        // A closed pipe: the reader is gone, so is the job's purpose.
        if out
            .write_all(line.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            break;
        }
    }
    Ok(())
}

/// The last progress line read: (cumulative ops, the job's clock in µs).
type Progress = Option<(u64, u64)>;

/// Parses `ops COUNT ELAPSED_US`.
pub fn parse_progress(line: &str) -> Option<(u64, u64)> {
    let mut f = line.split_whitespace();
    if f.next()? != "ops" {
        return None;
    }
    let count = f.next()?.parse().ok()?;
    let us = f.next()?.parse().ok()?;
    f.next().is_none().then_some((count, us))
}

/// A running batch job, killed (and reaped) on drop.
pub struct BatchJob {
    pub name: String,
    pub pid: u32,
    child: Child,
    latest: Arc<Mutex<Progress>>,
    /// The progress at the previous [`BatchJob::ops_per_s`].
    mark: Progress,
}

impl Drop for BatchJob {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl BatchJob {
    /// Starts `cmd` (e.g. `[qosd, batch]`) with `args`, and waits (at most
    /// 10 s) for its first progress line. The job dies with this process's
    /// thread that started it (`PR_SET_PDEATHSIG`): start it from the
    /// thread that lives as long as the run.
    pub fn start(name: &str, cmd: &[String], args: &BatchArgs) -> anyhow::Result<BatchJob> {
        let mut job = BatchJob::spawn(name, cmd, args)?;
        let t0 = Instant::now();
        while job.progress().is_none() {
            if let Some(status) = job.child.try_wait()? {
                bail!("the batch job of {name} exited ({status}) before reporting progress");
            }
            if t0.elapsed() > Duration::from_secs(10) {
                bail!("the batch job of {name} reported no progress within 10 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        job.mark = job.progress();
        Ok(job)
    }

    /// [`BatchJob::start`] without the wait, for a caller that must not
    /// block (the daemon's loop): the first [`BatchJob::ops_per_s`] after
    /// the first progress line starts the count.
    pub fn spawn(name: &str, cmd: &[String], args: &BatchArgs) -> anyhow::Result<BatchJob> {
        args.validate().map_err(anyhow::Error::msg)?;
        let Some((prog, pre)) = cmd.split_first() else {
            bail!("no batch job command")
        };
        let mut c = Command::new(prog);
        c.args(pre)
            .args(["--threads", &args.threads.to_string()])
            .args(["--op-kib", &args.op_kib.to_string()])
            .args(["--report-ms", &args.report_ms.to_string()])
            .args(["--exit-after-s", &args.exit_after_s.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        // SAFETY: runs in the forked child before exec; prctl is a plain
        // system call (async-signal-safe) touching no memory the parent's
        // threads could hold locked.
        unsafe {
            c.pre_exec(|| prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from));
        }
        let mut child = c
            .spawn()
            .with_context(|| format!("starting the batch job of {name}: {prog:?}"))?;
        let stdout = child.stdout.take().context("the batch job's stdout")?;
        let latest: Arc<Mutex<Progress>> = Arc::new(Mutex::new(None));
        let sink = Arc::clone(&latest);
        std::thread::Builder::new()
            .name(format!("batch-read-{name}"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Some(p) = parse_progress(&line) {
                        if let Ok(mut l) = sink.lock() {
                            *l = Some(p);
                        }
                    }
                }
            })
            .context("starting the batch job's reader")?;
        Ok(BatchJob {
            name: name.to_owned(),
            pid: child.id(),
            child,
            latest,
            mark: None,
        })
    }

    /// The last progress line: (cumulative ops, the job's clock in µs).
    pub fn progress(&self) -> Progress {
        self.latest.lock().ok().and_then(|l| *l)
    }

    /// Operations per second since the previous call (or since start), by
    /// the job's own clock; `None` when no new progress line came since
    /// (an interval shorter than the job's report period, or a job that is
    /// stopped: then it made no measurable progress either).
    pub fn ops_per_s(&mut self) -> Option<f64> {
        let now = self.progress()?;
        let Some((c0, t0)) = self.mark else {
            // The first progress seen (a spawned job): the count starts here.
            self.mark = Some(now);
            return None;
        };
        if now.1 <= t0 {
            return None;
        }
        self.mark = Some(now);
        Some(now.0.saturating_sub(c0) as f64 * 1e6 / (now.1 - t0) as f64)
    }

    /// Whether the job is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// How the job ended (reaped), or `None` while it runs.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_parse_strictly() {
        assert_eq!(parse_progress("ops 12 3400"), Some((12, 3400)));
        assert_eq!(parse_progress("ops 12"), None);
        assert_eq!(parse_progress("ops 12 34 5"), None);
        assert_eq!(parse_progress("op 12 34"), None);
        assert_eq!(parse_progress("ops -1 34"), None);
        assert_eq!(parse_progress(""), None);
    }

    #[test]
    fn an_op_depends_on_every_byte() {
        let mut a = vec![7u8; 4096];
        let mut b = a.clone();
        b[4000] = 8;
        assert_ne!(op(&mut a, 1), op(&mut b, 1));
    }

    #[test]
    fn bad_arguments_are_named() {
        let ok = BatchArgs {
            threads: 2,
            op_kib: 16,
            report_ms: 100,
            exit_after_s: 5,
        };
        assert_eq!(ok.validate(), Ok(()));
        for (a, key) in [
            (
                BatchArgs {
                    threads: 0,
                    ..ok.clone()
                },
                "--threads",
            ),
            (
                BatchArgs {
                    op_kib: 0,
                    ..ok.clone()
                },
                "--op-kib",
            ),
            (
                BatchArgs {
                    report_ms: 5,
                    ..ok.clone()
                },
                "--report-ms",
            ),
        ] {
            assert!(a.validate().unwrap_err().starts_with(key), "{key}");
        }
    }
}
