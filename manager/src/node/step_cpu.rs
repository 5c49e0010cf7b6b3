//! The CPU time a server's processes and threads use over one load step of
//! `qosd calibrate --model`. Threads are read while the step runs, not only
//! at its two ends: a server that gives each connection its own threads
//! (qosd's fixture) loses them when the client closes its connections at
//! the step's end, and their `/proc/PID/task` entries go with them. Read at
//! the ends only, a saturated step (which then waits seconds for the
//! server's backlog) showed "busy threads 0", and a light one only the
//! threads that had not exited yet.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Duration;

use qosd_scenarios::sim::fit::BUSY_THREAD_SHARE;
use qosd_sensors::procfs::Procfs;

/// How often threads are read during a step. A thread's CPU after its last
/// reading is missed: at most this much wall time of it.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// CPU seconds of a set of processes (every thread, the exited ones
/// included), and of each of their live threads.
pub fn cpu(procfs: &Procfs, pids: &[i32]) -> (f64, BTreeMap<i32, f64>) {
    let mut total = 0.0;
    let mut threads = BTreeMap::new();
    for &p in pids {
        total += procfs.process_cpu_s(p).ok().flatten().unwrap_or(0.0);
        for (t, s) in procfs.thread_cpu_s(p) {
            threads.insert(t, s);
        }
    }
    (total, threads)
}

/// Each thread's CPU seconds when the step started and when last seen.
#[derive(Debug, Clone, Default)]
pub struct ThreadCpu {
    start: BTreeMap<i32, f64>,
    last: BTreeMap<i32, f64>,
}

impl ThreadCpu {
    /// Reads every thread of `pids` now: the step's start.
    pub fn start(procfs: &Procfs, pids: &[i32]) -> Self {
        let (_, start) = cpu(procfs, pids);
        ThreadCpu {
            last: start.clone(),
            start,
        }
    }

    /// Reads every live thread again; threads gone since keep their last
    /// figure.
    pub fn sample(&mut self, procfs: &Procfs, pids: &[i32]) {
        self.last.extend(cpu(procfs, pids).1);
    }

    /// CPU seconds each thread used since the start (a thread born during
    /// the step, from 0).
    pub fn used(&self) -> BTreeMap<i32, f64> {
        self.last
            .iter()
            .map(|(t, s)| (*t, s - self.start.get(t).copied().unwrap_or(0.0)))
            .collect()
    }

    /// Threads that used at least [`BUSY_THREAD_SHARE`] of a CPU over `secs`.
    pub fn busy(&self, secs: f64) -> u32 {
        self.used()
            .values()
            .filter(|&&s| s >= BUSY_THREAD_SHARE * secs)
            .count() as u32
    }
}

/// Runs `step` while another thread reads the threads of `pids` every
/// [`SAMPLE_EVERY`] (and once more when `step` returns).
pub fn during<T>(procfs: &Procfs, pids: &[i32], step: impl FnOnce() -> T) -> (T, ThreadCpu) {
    let mut threads = ThreadCpu::start(procfs, pids);
    let (stop, stopped) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let sampler = s.spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(SAMPLE_EVERY) {
                threads.sample(procfs, pids);
            }
            threads.sample(procfs, pids);
            threads
        });
        let out = step();
        drop(stop);
        // The sampler only reads /proc; a panic there is a bug to show.
        let threads = match sampler.join() {
            Ok(t) => t,
            Err(p) => std::panic::resume_unwind(p),
        };
        (out, threads)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tid() -> i32 {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() }
    }

    /// A thread that works and exits before the step ends (the fixture's
    /// connection threads when the client closes) keeps its CPU time, read
    /// from the real `/proc` of this process; an idle one is not busy.
    #[test]
    fn a_thread_that_exits_before_the_step_ends_still_counts() {
        let procfs = Procfs::new("/");
        let pids = [std::process::id() as i32];
        let mut threads = ThreadCpu::start(&procfs, &pids);
        // Each thread sends its id once its work is done, then waits to be
        // let go: the reading below finds both alive, by construction.
        let spawn = |work: Duration| {
            let (tid_tx, tid_rx) = mpsc::channel();
            let (go, wait) = mpsc::channel::<()>();
            let h = std::thread::spawn(move || {
                qosd_scenarios::fixture::burn_cpu(work);
                tid_tx.send(tid()).unwrap();
                let _ = wait.recv();
            });
            (tid_rx.recv().unwrap(), go, h)
        };
        let (spun, go_spun, h_spun) = spawn(Duration::from_millis(200));
        let (rested, go_rested, h_rested) = spawn(Duration::ZERO);
        threads.sample(&procfs, &pids);
        drop((go_spun, go_rested));
        h_spun.join().unwrap();
        h_rested.join().unwrap();
        // Both are gone from /proc now: a reading at the step's end alone
        // would not see them.
        let (_, live) = cpu(&procfs, &pids);
        assert!(!live.contains_key(&spun) && !live.contains_key(&rested));
        threads.sample(&procfs, &pids);
        let used = threads.used();
        assert!(
            used[&spun] >= 0.15,
            "the spinner used 200 ms of CPU; seen {} s",
            used[&spun]
        );
        // At most a stray 10 ms tick on the idle one.
        assert!(used[&rested] <= 0.05, "idle thread: {} s", used[&rested]);
        // Over 2 s, the spinner used 0.1 CPU (>= BUSY_THREAD_SHARE): busy.
        let busy_ids: Vec<i32> = used
            .iter()
            .filter(|(_, s)| **s >= BUSY_THREAD_SHARE * 2.0)
            .map(|(t, _)| *t)
            .collect();
        assert!(busy_ids.contains(&spun) && !busy_ids.contains(&rested));
        assert_eq!(threads.busy(2.0), busy_ids.len() as u32);
    }
}
