//! Run counts and run time per BPF program, from the kernel's `bpf_stats`
//! (counted only while `kernel.bpf_stats_enabled` is 1): what the benches
//! and the hedge evaluation report as BPF cost. One place for every crate
//! that loads programs (the sensors here, the hedger).
//!
//! The statistics cost every BPF run on the node two clock reads, so they
//! are turned on by a reference ([`StatsOn`], the kernel's
//! `BPF_ENABLE_STATS` fd), never by writing the sysctl: a bench that saved
//! and restored the sysctl could restore another bench's "1" (or die before
//! restoring) and leave every later measurement paying for them.

use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};

/// `kernel.bpf_stats_enabled`: the sysctl's own reference (1: it holds the
/// statistics on). A [`StatsOn`] held anywhere does not show here: the
/// kernel reads back only what was written.
pub const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Run-time statistics held on while this lives (the kernel counts the
/// references; dropped, closed at exit or by a crash alike).
#[derive(Debug)]
pub struct StatsOn(#[allow(dead_code)] OwnedFd);

impl StatsOn {
    /// Takes a reference on the kernel's run-time statistics (needs
    /// CAP_SYS_ADMIN).
    pub fn take() -> std::io::Result<Self> {
        let stats = libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME;
        // SAFETY: a plain bpf(BPF_ENABLE_STATS) wrapper; it returns a new
        // fd or a negative errno.
        let fd = unsafe { libbpf_rs::libbpf_sys::bpf_enable_stats(stats) };
        if fd < 0 {
            return Err(std::io::Error::from_raw_os_error(-fd));
        }
        // SAFETY: fd was just returned by the kernel and is owned by no one.
        Ok(StatsOn(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

/// One program's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunStat {
    pub name: String,
    /// Times it ran since it was loaded.
    pub runs: u64,
    /// Total time it ran, ns.
    pub run_time_ns: u64,
}

/// Whether the sysctl holds the statistics on.
pub fn sysctl_on() -> bool {
    std::fs::read_to_string(SYSCTL).is_ok_and(|s| s.trim() == "1")
}

/// Drops the sysctl's own reference if a bench left it at 1 (it would time
/// every program run on the node); returns whether it was on. A reference
/// held by a process ([`StatsOn`]) cannot be dropped from here and does
/// not show in the sysctl: check [`timed`] on the figures instead.
pub fn clear_leftover_sysctl() -> bool {
    if !sysctl_on() {
        return false;
    }
    std::fs::write(SYSCTL, "0").is_ok()
}

/// Whether any of `stats` was timed: the statistics were on while they ran
/// (by the sysctl or by a reference held anywhere).
pub fn timed(stats: &[RunStat]) -> bool {
    stats.iter().any(|r| r.run_time_ns > 0)
}

/// The figures of the programs behind `progs` (a program the kernel no
/// longer lists is left out).
pub fn run_stats<'a>(progs: impl IntoIterator<Item = BorrowedFd<'a>>) -> Vec<RunStat> {
    let ids: Vec<u32> = progs
        .into_iter()
        .filter_map(|fd| libbpf_rs::Program::id_from_fd(fd).ok())
        .collect();
    of_ids(&ids)
}

/// The figures of every program process `pid` holds (its fds' fdinfo
/// names them, `prog_id:`): how a bench reads the programs of a process
/// it started, e.g. a `qosd trace`. None if its fds cannot be read.
pub fn held_by(pid: u32) -> Vec<RunStat> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return vec![];
    };
    let mut ids: Vec<u32> = dir
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .flat_map(|s| {
            s.lines()
                .filter_map(|l| l.strip_prefix("prog_id:")?.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    of_ids(&ids)
}

fn of_ids(ids: &[u32]) -> Vec<RunStat> {
    libbpf_rs::query::ProgInfoIter::default()
        .filter(|i| ids.contains(&i.id))
        .map(|i| RunStat {
            name: i.name.to_string_lossy().into_owned(),
            runs: i.run_cnt,
            run_time_ns: i.run_time_ns,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Root (as the suite runs): references can be taken side by side, and
    /// taking one does not write the sysctl (which reads back only its own
    /// value: what the benches check before measuring).
    #[test]
    fn stats_references_stack_and_leave_the_sysctl_alone() {
        let before = std::fs::read_to_string(SYSCTL).expect(SYSCTL);
        let on = StatsOn::take().expect("BPF_ENABLE_STATS (needs root)");
        let second = StatsOn::take().expect("a second reference");
        assert_eq!(std::fs::read_to_string(SYSCTL).unwrap(), before);
        drop(on);
        drop(second);
    }

    #[test]
    fn timed_means_some_run_time_was_counted() {
        let stat = |ns| RunStat {
            name: "p".into(),
            runs: 5,
            run_time_ns: ns,
        };
        assert!(!timed(&[stat(0), stat(0)]));
        assert!(timed(&[stat(0), stat(7)]));
    }
}
