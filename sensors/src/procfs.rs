//! CPU utilisation from `/proc`: CPU time of a process (all its threads)
//! and of the node (`/proc/stat`). Every path goes through one root
//! prefix, so tests read a fake tree with the same code.
//!
//! `/proc/PID/stat` counts in clock ticks (`USER_HZ`, 100 per second) and
//! truncates utime and stime each, so a delta is good to ±2 ticks; callers
//! sum deltas over a longer span (the daemon uses its decision interval).
//! On the real root a process's CPU time comes from its CPU clock instead
//! (`clock_gettime` on the clock `clock_getcpuclockid` names: the
//! scheduler's nanoseconds, exited threads included, which `stat` splits
//! and truncates): at 0.3 CPU, `stat` read a 1 s interval within −12 to
//! +11 ms of it, no bias (BENCHMARKS.md, `cpu_clock.sh`). So an idle process
//! reads a little CPU, not 0. Threads, a fake tree and a process whose
//! clock cannot be read are read from `stat`.

use std::collections::HashMap;
use std::path::PathBuf;

use qosd_core::sys::stat::Stat;
use qosd_core::sys::{Root, SysError};

/// Reads CPU time under a root prefix (`/` on a real machine).
#[derive(Debug, Clone)]
pub struct Procfs {
    root: Root,
    ticks_per_s: f64,
}

/// The kernel's largest pid (`PID_MAX_LIMIT` on 64-bit): a CPU clock id
/// holds a pid in 29 bits, so a larger one would name another process's
/// clock (`1 << 29` more than this process's pid names its own).
const PID_MAX_LIMIT: i32 = 1 << 22;

/// CPU seconds on the scheduler clock of process `pid` (of this pid
/// namespace); `None` when it cannot be read (gone, or no pid).
fn process_clock_s(pid: i32) -> Option<f64> {
    if !(1..=PID_MAX_LIMIT).contains(&pid) {
        return None;
    }
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `clock` is a valid clockid_t to write.
    if unsafe { libc::clock_getcpuclockid(pid, &mut clock) } != 0 {
        return None;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; a gone pid is an error.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

/// The node's CPU time since boot, in seconds summed over every CPU.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct NodeCpu {
    /// Time not idle (user, nice, system, irq, softirq, steal).
    pub busy_s: f64,
    /// Busy plus idle and iowait.
    pub total_s: f64,
}

impl NodeCpu {
    /// Fraction of the node's CPU time that was busy between two readings
    /// (0.0..=1.0); 0 when no time passed.
    pub fn utilisation_since(&self, earlier: &NodeCpu) -> f64 {
        let total = self.total_s - earlier.total_s;
        if total <= 0.0 {
            return 0.0;
        }
        ((self.busy_s - earlier.busy_s) / total).clamp(0.0, 1.0)
    }
}

impl Procfs {
    /// `root` is the prefix of `/proc` (normally `/`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        // SAFETY: sysconf has no preconditions and only reads a constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        Procfs {
            root: Root::new(root),
            ticks_per_s: if hz > 0 { hz as f64 } else { 100.0 },
        }
    }

    pub fn root(&self) -> &Root {
        &self.root
    }

    /// CPU seconds of one stat file (`task`: one thread's, else the whole
    /// process's). `Ok(None)` when it is gone.
    fn cpu_s(&self, pid: i32, task: Option<i32>) -> Result<Option<f64>, SysError> {
        if self.root.is_real() && task.is_none() {
            if let Some(s) = process_clock_s(pid) {
                return Ok(Some(s));
            }
        }
        let st = match Stat::read(&self.root, pid, task) {
            Ok(s) => s,
            Err(e) if e.is_gone() => return Ok(None),
            Err(e) => return Err(e),
        };
        let ticks = st.cpu_ticks.ok_or_else(|| SysError::Parse {
            path: self.root.path(format!("/proc/{pid}/stat")),
            what: "utime/stime fields".into(),
        })?;
        Ok(Some(ticks as f64 / self.ticks_per_s))
    }

    /// CPU seconds used so far by every thread of `pid` (its CPU clock on
    /// the real root, else utime + stime). `Ok(None)` when the process is
    /// gone.
    pub fn process_cpu_s(&self, pid: i32) -> Result<Option<f64>, SysError> {
        self.cpu_s(pid, None)
    }

    /// CPU seconds used so far by each thread of `pid`
    /// (`/proc/PID/task/TID/stat`), as (tid, seconds); empty when the
    /// process is gone. Threads that exit while being read are skipped.
    pub fn thread_cpu_s(&self, pid: i32) -> Vec<(i32, f64)> {
        let mut out: Vec<(i32, f64)> = (self.root.numbered(format!("/proc/{pid}/task")))
            .into_iter()
            .filter_map(|tid| Some((tid, self.cpu_s(pid, Some(tid)).ok()??)))
            .collect();
        out.sort_by_key(|(t, _)| *t);
        out
    }

    /// The node's CPU time from the first line of `/proc/stat`.
    pub fn node_cpu(&self) -> Result<NodeCpu, SysError> {
        let s = self.root.read("/proc/stat")?;
        parse_proc_stat(&s)
            .map(|(busy, total)| NodeCpu {
                busy_s: busy as f64 / self.ticks_per_s,
                total_s: total as f64 / self.ticks_per_s,
            })
            .ok_or_else(|| SysError::Parse {
                path: self.root.path("/proc/stat"),
                what: "a `cpu` line".into(),
            })
    }

    /// The node's 1-minute load average (`/proc/loadavg`'s first field):
    /// how many tasks wanted a CPU, on average.
    pub fn loadavg_1m(&self) -> Result<f64, SysError> {
        let s = self.root.read("/proc/loadavg")?;
        s.split_whitespace()
            .next()
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| SysError::Parse {
                path: self.root.path("/proc/loadavg"),
                what: format!("a load average in {s:?}"),
            })
    }
}

/// (busy, total) ticks of the aggregate `cpu` line of `/proc/stat`.
pub fn parse_proc_stat(s: &str) -> Option<(u64, u64)> {
    let line = s.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal (guest time is
    // already inside user and nice).
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    let idle = at(3) + at(4);
    (v.len() >= 4).then_some((busy, busy + idle))
}

/// CPU time used by a changing set of processes between calls: each pid's
/// own delta, so a process that appears or exits does not count its whole
/// past as one interval's use.
#[derive(Debug, Default)]
pub struct CpuMeter {
    last: HashMap<i32, f64>,
}

impl CpuMeter {
    /// CPU seconds `pids` used since the previous call (a pid seen for the
    /// first time counts from now on). Pids no longer listed are forgotten.
    pub fn delta_s(&mut self, procfs: &Procfs, pids: &[i32]) -> f64 {
        self.delta_by_pid(procfs, pids).iter().map(|(_, d)| d).sum()
    }

    /// The same, per pid: the pids that could be read and had been seen
    /// before, each with its CPU seconds since the previous call.
    pub fn delta_by_pid(&mut self, procfs: &Procfs, pids: &[i32]) -> Vec<(i32, f64)> {
        let mut used = Vec::with_capacity(pids.len());
        let mut next = HashMap::with_capacity(pids.len());
        for &pid in pids {
            // A process that cannot be read (gone, raced) adds nothing.
            let Ok(Some(now)) = procfs.process_cpu_s(pid) else {
                continue;
            };
            if let Some(before) = self.last.get(&pid) {
                used.push((pid, (now - before).max(0.0)));
            }
            next.insert(pid, now);
        }
        self.last = next;
        used
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn threads_of_this_process_are_read() {
        let me = std::process::id() as i32;
        let t = Procfs::new("/").thread_cpu_s(me);
        assert!(t.iter().any(|(tid, _)| *tid == me), "{t:?}");
        assert!(t.iter().all(|(_, s)| *s >= 0.0));
        assert!(Procfs::new("/").thread_cpu_s(i32::MAX).is_empty());
    }

    use super::*;

    fn put(root: &std::path::Path, abs: &str, text: &str) {
        let p = root.join(abs.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn loadavg_reads_the_first_field() {
        let d = tempfile::tempdir().unwrap();
        put(d.path(), "/proc/loadavg", "9.41 7.02 3.10 4/170 5222\n");
        assert_eq!(Procfs::new(d.path()).loadavg_1m().unwrap(), 9.41);
        put(d.path(), "/proc/loadavg", "x\n");
        assert!(Procfs::new(d.path()).loadavg_1m().is_err());
        assert!(Procfs::new("/").loadavg_1m().unwrap() >= 0.0);
    }

    fn stat_line(pid: i32, comm: &str, utime: u64, stime: u64) -> String {
        format!(
            "{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 {utime} {stime} 0 0 20 0 4 0 12345 1000 100\n"
        )
    }

    #[test]
    fn cpu_time_after_a_tricky_comm_and_a_short_line() {
        let d = tempfile::tempdir().unwrap();
        let pf = Procfs::new(d.path());
        put(d.path(), "/proc/7/stat", &stat_line(7, "a) b (c", 150, 50));
        let s = pf.process_cpu_s(7).unwrap().unwrap();
        assert!((s - 200.0 / pf.ticks_per_s).abs() < 1e-9);
        put(d.path(), "/proc/8/stat", "8 (x) S 1");
        let e = pf.process_cpu_s(8).unwrap_err().to_string();
        assert!(e.contains("cannot parse utime/stime"), "{e}");
    }

    #[test]
    fn node_utilisation_from_proc_stat() {
        let a = "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 50 0 50 400 0 0 0 0 0 0\n";
        let b = "cpu  250 0 150 900 100 0 0 0 0 0\n";
        let (busy_a, tot_a) = parse_proc_stat(a).unwrap();
        assert_eq!((busy_a, tot_a), (200, 1000));
        let (busy_b, tot_b) = parse_proc_stat(b).unwrap();
        let na = NodeCpu {
            busy_s: busy_a as f64,
            total_s: tot_a as f64,
        };
        let nb = NodeCpu {
            busy_s: busy_b as f64,
            total_s: tot_b as f64,
        };
        // 200 busy of 400 ticks.
        assert!((nb.utilisation_since(&na) - 0.5).abs() < 1e-9);
        assert_eq!(na.utilisation_since(&na), 0.0);
    }

    #[test]
    fn meter_counts_each_pid_from_its_first_sight() {
        let d = tempfile::tempdir().unwrap();
        let pf = Procfs {
            root: Root::new(d.path()),
            ticks_per_s: 100.0,
        };
        put(d.path(), "/proc/10/stat", &stat_line(10, "srv", 100, 0));
        let mut m = CpuMeter::default();
        assert_eq!(m.delta_s(&pf, &[10]), 0.0);
        put(d.path(), "/proc/10/stat", &stat_line(10, "srv", 130, 20));
        put(d.path(), "/proc/11/stat", &stat_line(11, "srv", 5000, 0));
        // pid 10: +50 ticks; pid 11 is new: nothing yet.
        assert!((m.delta_s(&pf, &[10, 11]) - 0.5).abs() < 1e-9);
        std::fs::remove_file(d.path().join("proc/10/stat")).unwrap();
        put(d.path(), "/proc/11/stat", &stat_line(11, "srv", 5010, 0));
        assert!((m.delta_s(&pf, &[10, 11]) - 0.1).abs() < 1e-9);
        assert_eq!(pf.process_cpu_s(10).unwrap(), None);
    }

    /// Reads `CLOCK_PROCESS_CPUTIME_ID`: this process's own CPU clock.
    fn own_clock() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to write, a clock every Linux has.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0);
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }

    /// This process's CPU time read as any process's is its scheduler
    /// clock: between two readings of its own clock, never a clock tick's
    /// truncation below (`stat` is, up to 2 ticks).
    #[test]
    fn a_process_cpu_time_is_its_clock_not_clock_ticks() {
        let pf = Procfs::new("/");
        let me = std::process::id() as i32;
        let mut off_tick = false;
        for _ in 0..20 {
            let (a, b, c) = (
                own_clock(),
                pf.process_cpu_s(me).unwrap().unwrap(),
                own_clock(),
            );
            assert!(a <= b && b <= c, "{a} <= {b} <= {c}");
            off_tick |= (b * pf.ticks_per_s).fract() > 1e-6;
            // Some CPU time between readings.
            std::hint::black_box((0..100_000u64).sum::<u64>());
        }
        assert!(off_tick, "every reading a whole number of ticks");
    }

    /// A gone process reads `None`, as from `stat`; so does a pid past the
    /// kernel's limit, whose clock id would name this process's clock.
    #[test]
    fn a_gone_or_impossible_pid_reads_none() {
        let pf = Procfs::new("/");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id() as i32;
        child.wait().unwrap();
        assert_eq!(pf.process_cpu_s(gone).unwrap(), None);
        let me = std::process::id() as i32;
        for pid in [me + (1 << 29), i32::MAX, 0, -1] {
            assert_eq!(pf.process_cpu_s(pid).unwrap(), None, "pid {pid}");
        }
    }

    #[test]
    fn this_machine_is_readable() {
        let pf = Procfs::new("/");
        let me = std::process::id() as i32;
        assert!(pf.process_cpu_s(me).unwrap().is_some());
        let n = pf.node_cpu().unwrap();
        assert!(n.total_s >= n.busy_s && n.total_s > 0.0);
    }
}
