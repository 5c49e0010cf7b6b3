//! Run counts and run time per BPF program, from the kernel's `bpf_stats`
//! (counted only while `kernel.bpf_stats_enabled` is 1): what the benches
//! and the hedge evaluation report as BPF cost. One place for every crate
//! that loads programs (the sensors here, the hedger).

use std::os::fd::BorrowedFd;

/// One program's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunStat {
    pub name: String,
    /// Times it ran since it was loaded.
    pub runs: u64,
    /// Total time it ran, ns.
    pub run_time_ns: u64,
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
