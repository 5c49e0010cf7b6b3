//! Best-effort apps whose batch job the daemon runs (`job:` in the config,
//! the scenarios' schema and checks): the job (`qosd batch`, [`BatchJob`])
//! is the app's one process. It is started on the loop's first tick and
//! then found like any process, so the same tick admits it and moves it
//! into the app's group `qosd-<app>` with its allocation. A job that ends
//! is started again after a backoff (1 s, doubling up to 30 s); after
//! [`MAX_FAILURES`] ends in a row, each within a minute of its start, it is
//! left stopped and the app says why. Its throughput over each decision
//! interval is the app's `be_ops_per_s`. The job dies with the daemon's
//! loop thread (`PR_SET_PDEATHSIG`: also when qosd is SIGKILLed) and is
//! stopped before the knobs are put back on exit.

use anyhow::Context;
use qosd_scenarios::batch::BatchJob;

use crate::config::{AppConfig, JobSpec};

/// Ends in a row, each soon after its start, before a job is given up.
pub const MAX_FAILURES: u32 = 5;
/// A job that ran this long before it ended was healthy: its failures
/// count from zero again.
const HEALTHY_MS: u64 = 60_000;
const BACKOFF_MS: u64 = 1_000;
const MAX_BACKOFF_MS: u64 = 30_000;
/// The job runs until the daemon stops it; this bounds it anyway (a job
/// that reaches it ends cleanly and is started again).
const JOB_LIFETIME_S: u64 = 86_400;

/// One app's job and its supervision.
struct Slot {
    app: String,
    spec: JobSpec,
    job: Option<BatchJob>,
    started_ms: u64,
    /// Ends in a row, each within [`HEALTHY_MS`] of its start.
    failures: u32,
    /// When to start it (again).
    next_start_ms: u64,
    /// Why it is not running; `None` while it runs.
    note: Option<String>,
    gave_up: bool,
    /// Operations per second over the last decision interval.
    ops_per_s: Option<f64>,
    /// The job's count has started (at its first progress line).
    primed: bool,
}

/// The jobs of the configured apps, by app index.
pub struct Jobs {
    /// The job's command before its arguments: `[qosd, batch]`.
    cmd: Vec<String>,
    /// Period of the jobs' progress lines, ms.
    report_ms: u64,
    slots: Vec<Option<Slot>>,
}

impl Jobs {
    /// No app runs a job.
    pub fn none(nr_apps: usize) -> Jobs {
        Jobs {
            cmd: Vec::new(),
            report_ms: 100,
            slots: (0..nr_apps).map(|_| None).collect(),
        }
    }

    /// The jobs of `apps`, run as this executable's `batch` command,
    /// reporting every `report_ms` (10-10000). Nothing starts yet.
    pub fn new(apps: &[AppConfig], report_ms: u64) -> anyhow::Result<Jobs> {
        let exe = std::env::current_exe().context("finding qosd's executable for batch jobs")?;
        let cmd = vec![exe.display().to_string(), "batch".to_owned()];
        Ok(Jobs::with_command(apps, report_ms, cmd))
    }

    /// [`Jobs::new`] with the job's command given.
    pub fn with_command(apps: &[AppConfig], report_ms: u64, cmd: Vec<String>) -> Jobs {
        let slots = apps
            .iter()
            .map(|a| {
                a.job.clone().map(|spec| Slot {
                    app: a.name.clone(),
                    spec,
                    job: None,
                    started_ms: 0,
                    failures: 0,
                    next_start_ms: 0,
                    note: Some("not started yet".into()),
                    gave_up: false,
                    ops_per_s: None,
                    primed: false,
                })
            })
            .collect();
        Jobs {
            cmd,
            report_ms: report_ms.clamp(10, 10_000),
            slots,
        }
    }

    /// Whether app `i` runs a job (and is not found by `match:`).
    pub fn is_job(&self, i: usize) -> bool {
        matches!(self.slots.get(i), Some(Some(_)))
    }

    /// Reaps jobs that ended and starts those that are due. The lines
    /// worth logging.
    pub fn supervise(&mut self, now_ms: u64) -> Vec<String> {
        let mut ev = Vec::new();
        for s in self.slots.iter_mut().flatten() {
            if let Some(job) = s.job.as_mut() {
                let Some(status) = job.exited() else {
                    // Count from the first progress line, so that the first
                    // decision interval has its figure too.
                    if !s.primed && job.progress().is_some() {
                        let _ = job.ops_per_s();
                        s.primed = true;
                    }
                    continue;
                };
                let pid = job.pid;
                s.job = None;
                let ran_ms = now_ms.saturating_sub(s.started_ms);
                let why = format!("its job (pid {pid}) ended after {ran_ms} ms: {status}");
                ev.push(s.failed(now_ms, ran_ms, why));
            }
            if s.job.is_some() || s.gave_up || now_ms < s.next_start_ms {
                continue;
            }
            let args = s.spec.args(self.report_ms, JOB_LIFETIME_S);
            match BatchJob::spawn(&s.app, &self.cmd, &args) {
                Ok(job) => {
                    ev.push(format!(
                        "app {}: started its batch job (pid {}, threads: {})",
                        s.app, job.pid, args.threads
                    ));
                    s.job = Some(job);
                    s.primed = false;
                    s.started_ms = now_ms;
                    s.note = None;
                }
                Err(e) => ev.push(s.failed(now_ms, 0, format!("starting its job: {e:#}"))),
            }
        }
        ev
    }

    /// The processes of app `i` if it runs a job: the job's, or none while
    /// it is not running. `None` for an app found by `match:`.
    pub fn pids(&self, i: usize) -> Option<Vec<i32>> {
        let s = self.slots.get(i)?.as_ref()?;
        Some(s.job.iter().map(|j| j.pid as i32).collect())
    }

    /// Reads every job's throughput since the previous call (decision
    /// ticks): a running job's ops/s (unknown until its first two progress
    /// lines), 0 for a job that is not running.
    pub fn sample(&mut self) {
        for s in self.slots.iter_mut().flatten() {
            s.ops_per_s = match s.job.as_mut() {
                Some(j) => j.ops_per_s(),
                None => Some(0.0),
            };
        }
    }

    /// App `i`'s job's operations per second over the last decision
    /// interval (`None`: no job, or not measured yet).
    pub fn ops_per_s(&self, i: usize) -> Option<f64> {
        self.slots.get(i)?.as_ref()?.ops_per_s
    }

    /// Why app `i`'s job is not running.
    pub fn note(&self, i: usize) -> Option<String> {
        self.slots.get(i)?.as_ref()?.note.clone()
    }

    /// Stops every job (killed and reaped): on exit, before the knobs are
    /// put back, so that the groups made for them are empty.
    pub fn stop_all(&mut self) -> Vec<String> {
        let mut ev = Vec::new();
        for s in self.slots.iter_mut().flatten() {
            if let Some(job) = s.job.take() {
                ev.push(format!(
                    "app {}: stopped its batch job (pid {})",
                    s.app, job.pid
                ));
                drop(job);
            }
            s.gave_up = true;
            s.note = Some("stopped".into());
        }
        ev
    }
}

impl Slot {
    /// A job ended (or could not start) after `ran_ms`: when to try again,
    /// or give up; the log line.
    fn failed(&mut self, now_ms: u64, ran_ms: u64, why: String) -> String {
        self.failures = if ran_ms >= HEALTHY_MS {
            1
        } else {
            self.failures + 1
        };
        if self.failures >= MAX_FAILURES {
            self.gave_up = true;
            self.note = Some(format!(
                "batch job given up after {} failures in a row; last: {why}",
                self.failures
            ));
            return format!(
                "app {}: {why}; given up ({} in a row)",
                self.app, self.failures
            );
        }
        let wait = (BACKOFF_MS << (self.failures - 1).min(16)).min(MAX_BACKOFF_MS);
        self.next_start_ms = now_ms + wait;
        self.note = Some(format!("batch job restarting in {wait} ms; last: {why}"));
        format!("app {}: {why}; starting it again in {wait} ms", self.app)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(job: bool) -> AppConfig {
        let y = if job {
            "{ name: be, class: be, job: { kind: hash } }"
        } else {
            "{ name: lc, class: be, match: { pid: 1 } }"
        };
        serde_yaml_ng::from_str(y).expect("app")
    }

    /// A command that cannot start: every attempt is a failure, retried
    /// after a doubling backoff and given up after MAX_FAILURES.
    #[test]
    fn failures_back_off_then_give_up() {
        let mut j = Jobs::with_command(
            &[app(false), app(true)],
            100,
            vec!["/nonexistent/qosd".into(), "batch".into()],
        );
        assert!(!j.is_job(0) && j.is_job(1));
        assert_eq!(j.pids(0), None);
        let mut now = 0;
        let mut waits = Vec::new();
        while now <= 40_000 {
            let ev = j.supervise(now);
            if let Some(e) = ev.first() {
                assert!(e.contains("starting its job"), "{e}");
                if let Some(w) = e.split("again in ").nth(1) {
                    waits.push(w.trim_end_matches(" ms").parse::<u64>().expect("ms"));
                }
            }
            assert_eq!(j.pids(1), Some(vec![]));
            now += 500;
        }
        assert_eq!(waits, vec![1_000, 2_000, 4_000, 8_000], "{waits:?}");
        assert!(j.note(1).expect("note").contains("given up after 5"));
        j.sample();
        assert_eq!(
            j.ops_per_s(1),
            Some(0.0),
            "a job not running makes no progress"
        );
        assert_eq!(j.ops_per_s(0), None);
        // Given up: no more attempts.
        assert!(j.supervise(now + 100_000).is_empty());
    }
}
