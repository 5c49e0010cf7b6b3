//! A watch for stalls no process can avoid: one SCHED_FIFO thread per CPU,
//! pinned, sleeps 1 ms at a time and records every wake-up later than a
//! threshold, with when it happened. A SCHED_FIFO thread (above every
//! normal task) wakes late only when its CPU ran nothing it could preempt
//! for: the hypervisor did not run the vCPU, or interrupts and softirqs
//! held it. The evaluation lays the hedgers' slowest requests and the
//! delay line's latest clone beside these stalls and beside the steal time
//! the kernel counted (`/proc/stat`), to tell a hedger's own lateness from
//! the machine's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use crate::wait::realtime_ns;

/// One late wake-up of a watch thread.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stall {
    pub cpu: u32,
    /// When the thread woke (CLOCK_REALTIME ns).
    pub at_ns: u64,
    /// How late it woke, µs: the CPU ran none of it during
    /// `[at_ns - late, at_ns]`.
    pub late_us: f64,
}

/// Running watch threads; [`StallWatch::stop`] returns what they saw.
pub struct StallWatch {
    stop: Arc<AtomicBool>,
    handles: Vec<(u32, JoinHandle<Vec<Stall>>)>,
    steal_before: Option<u64>,
}

/// The sleep of each watch thread.
const PERIOD: Duration = Duration::from_millis(1);

impl StallWatch {
    /// Starts one thread on each CPU the caller may use, recording
    /// wake-ups more than `min` late.
    pub fn start(min: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let cpus = qosd_actuators::proc::get_affinity(0).unwrap_or_default();
        let handles = cpus
            .into_iter()
            .filter_map(|cpu| {
                let s = stop.clone();
                let h = std::thread::Builder::new()
                    .name(format!("qosd-stall-{cpu}"))
                    .spawn(move || watch(cpu, min, &s))
                    .ok()?;
                Some((cpu, h))
            })
            .collect();
        StallWatch {
            stop,
            handles,
            steal_before: steal_ms(),
        }
    }

    /// Stops the threads: every stall seen, and the steal time the kernel
    /// counted meanwhile, ms (`None`: no `/proc/stat` steal field).
    pub fn stop(self) -> (Vec<Stall>, Option<u64>) {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for (cpu, h) in self.handles {
            match h.join() {
                Ok(v) => all.extend(v),
                Err(_) => tracing::warn!("the stall watch of CPU {cpu} panicked"),
            }
        }
        all.sort_by_key(|s| s.at_ns);
        let steal = self.steal_before.zip(steal_ms()).map(|(a, b)| b - a);
        (all, steal)
    }
}

fn watch(cpu: u32, min: Duration, stop: &AtomicBool) -> Vec<Stall> {
    if let Err(e) = qosd_actuators::proc::set_affinity(0, &[cpu]) {
        tracing::warn!("stall watch: not pinned to CPU {cpu}: {e}");
    }
    let p = libc::sched_param { sched_priority: 20 };
    // SAFETY: sets the calling thread's policy; p lives across the call.
    let fifo = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } == 0;
    if !fifo {
        tracing::warn!(
            "stall watch: no SCHED_FIFO on CPU {cpu}: its stalls include waiting for other tasks"
        );
    }
    let min_ns = min.as_nanos() as u64;
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let due = realtime_ns() + PERIOD.as_nanos() as u64;
        std::thread::sleep(PERIOD);
        let now = realtime_ns();
        let late = now.saturating_sub(due);
        if late > min_ns {
            out.push(Stall {
                cpu,
                at_ns: now,
                late_us: late as f64 / 1000.0,
            });
        }
    }
    out
}

/// The node's steal time so far, ms (`/proc/stat`'s `cpu` line, 8th
/// figure, in USER_HZ = 100 ticks a second).
fn steal_ms() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: u64 = line.split_whitespace().nth(8)?.parse().ok()?;
    Some(ticks * 10)
}

/// The largest stall of each CPU that overlaps `[from_ns, to_ns]`, as
/// (cpu, µs), CPUs in order.
pub fn during(stalls: &[Stall], from_ns: u64, to_ns: u64) -> Vec<(u32, f64)> {
    let mut out: Vec<(u32, f64)> = Vec::new();
    for s in stalls {
        let start = s.at_ns.saturating_sub((s.late_us * 1000.0) as u64);
        if start > to_ns || s.at_ns < from_ns {
            continue;
        }
        match out.iter_mut().find(|(c, _)| *c == s.cpu) {
            Some((_, l)) => *l = l.max(s.late_us),
            None => out.push((s.cpu, s.late_us)),
        }
    }
    out.sort_by_key(|(c, _)| *c);
    out
}

/// `during`'s figures as text: "CPU 0 3.2 ms, CPU 1 3.1 ms" or "none".
pub fn describe(d: &[(u32, f64)]) -> String {
    if d.is_empty() {
        return "none".into();
    }
    d.iter()
        .map(|(c, us)| format!("CPU {c} {:.2} ms", us / 1000.0))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_counts_where_its_late_span_overlaps() {
        let st = |cpu, at_ns, late_us| Stall {
            cpu,
            at_ns,
            late_us,
        };
        // CPU 0 did not run during 5-8 ms and 20-21 ms; CPU 1 during 6-9 ms.
        let v = [
            st(0, 8_000_000, 3000.0),
            st(1, 9_000_000, 3000.0),
            st(0, 21_000_000, 1000.0),
        ];
        assert_eq!(during(&v, 7_000_000, 7_500_000), [(0, 3000.0), (1, 3000.0)]);
        assert_eq!(
            during(&v, 8_500_000, 30_000_000),
            [(0, 1000.0), (1, 3000.0)]
        );
        assert!(during(&v, 10_000_000, 19_000_000).is_empty());
        assert_eq!(describe(&during(&v, 0, 5_500_000)), "CPU 0 3.00 ms");
        assert_eq!(describe(&[]), "none");
    }

    #[test]
    fn steal_is_read_from_proc_stat() {
        // Every Linux kernel since 2.6.11 has the field.
        assert!(steal_ms().is_some());
    }
}
