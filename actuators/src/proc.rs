//! What qosd reads about processes from `/proc` (through the root prefix)
//! and the affinity syscalls it makes on their threads.

use std::path::Path;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

use crate::error::{Error, Result};
use crate::root::Root;
use qosd_core::sys::stat::Stat;

/// A /proc file of `pid` that cannot be read: the process is gone when the
/// file is missing, otherwise an I/O error naming the path.
fn pid_err(pid: i32, what: &'static str, path: &Path, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        Error::NoSuchPid(pid)
    } else {
        Error::io(what, path, e)
    }
}

/// Thread ids of a process, sorted. `NoSuchPid` when it does not exist.
pub fn tids(root: &Root, pid: i32) -> Result<Vec<i32>> {
    let dir = root.path(format!("/proc/{pid}/task"));
    let rd = std::fs::read_dir(&dir).map_err(|e| pid_err(pid, "listing", &dir, e))?;
    let mut v: Vec<i32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// The `/proc/PID/stat` of `pid`: `NoSuchPid` when it is gone.
fn stat(root: &Root, pid: i32) -> Result<Stat> {
    Stat::read(root, pid, None).map_err(|e| {
        if e.is_gone() {
            Error::NoSuchPid(pid)
        } else {
            e.into()
        }
    })
}

/// The process start time (field 22 of `/proc/PID/stat`, clock ticks since
/// boot): with the pid it names a process uniquely, so a restore after a
/// crash never touches a different process that reused the pid.
pub fn start_time(root: &Root, pid: i32) -> Result<u64> {
    stat(root, pid)?.start_ticks.ok_or_else(|| {
        let p = root.path(format!("/proc/{pid}/stat"));
        Error::Invalid(format!("{}: no start time field", p.display()))
    })
}

/// True when `pid` is alive and is the process that started at `start`.
pub fn same_process(root: &Root, pid: i32, start: u64) -> bool {
    start_time(root, pid).is_ok_and(|s| s == start)
}

/// Fails with `NoSuchPid` unless the process exists, and with `Invalid`
/// for a kernel thread ([`Stat::kernel_thread`]): qosd manages user
/// processes only. Every command and the daemon go through here.
pub fn check_pid(root: &Root, pid: i32) -> Result<()> {
    if pid <= 0 {
        return Err(Error::Invalid(format!("pid {pid} is not a process id")));
    }
    match stat(root, pid) {
        Ok(s) if s.kernel_thread() => Err(Error::Invalid(format!(
            "pid {pid} ({}) is a kernel thread: qosd manages user processes only",
            s.comm
        ))),
        // A line that is not a stat line tells nothing against the pid.
        Ok(_) | Err(Error::Invalid(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `Cpus_allowed_list` of a thread or process, from `/proc/PID/status`.
pub fn cpus_allowed(root: &Root, pid: i32) -> Result<Vec<u32>> {
    let p = root.path(format!("/proc/{pid}/status"));
    let s = std::fs::read_to_string(&p).map_err(|e| pid_err(pid, "reading", &p, e))?;
    let line = s
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .ok_or_else(|| Error::Invalid(format!("{}: no Cpus_allowed_list", p.display())))?;
    Ok(qosd_core::cpulist::parse(line)?)
}

/// The cgroup of `pid` in one hierarchy, from `/proc/PID/cgroup`:
/// `controller` is e.g. "cpuset" for a v1 hierarchy, `None` for v2 ("0::").
pub fn cgroup_of(root: &Root, pid: i32, controller: Option<&str>) -> Result<String> {
    let p = root.path(format!("/proc/{pid}/cgroup"));
    let s = std::fs::read_to_string(&p).map_err(|e| pid_err(pid, "reading", &p, e))?;
    for line in s.lines() {
        let mut it = line.splitn(3, ':');
        let (_, ctrls, path) = match (it.next(), it.next(), it.next()) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => continue,
        };
        let hit = match controller {
            None => ctrls.is_empty(),
            Some(c) => ctrls.split(',').any(|x| x == c),
        };
        if hit {
            return Ok(path.to_owned());
        }
    }
    Err(Error::Invalid(format!(
        "{}: pid {pid} is in no {} hierarchy",
        p.display(),
        controller.unwrap_or("cgroup v2")
    )))
}

pub fn get_affinity(tid: i32) -> Result<Vec<u32>> {
    let set = sched_getaffinity(Pid::from_raw(tid)).map_err(|source| Error::Sys {
        op: "sched_getaffinity",
        tid,
        source,
    })?;
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .map(|c| c as u32)
        .collect())
}

pub fn set_affinity(tid: i32, cpus: &[u32]) -> Result<()> {
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c as usize)
            .map_err(|_| Error::Invalid(format!("CPU {c} is beyond the kernel's CPU set size")))?;
    }
    sched_setaffinity(Pid::from_raw(tid), &set).map_err(|source| Error::Sys {
        op: "sched_setaffinity",
        tid,
        source,
    })
}

/// True when a path is on a kernel pseudo filesystem (cgroup, cgroup2,
/// resctrl, sysfs) where rmdir removes a group with its control files.
// fs_type_t is i64 on x86_64 but narrower elsewhere.
#[allow(clippy::unnecessary_cast)]
pub fn on_kernel_fs(p: &Path) -> bool {
    const RDTGROUP_SUPER_MAGIC: i64 = 0x7655821;
    const SYSFS_MAGIC: i64 = 0x62656572;
    match nix::sys::statfs::statfs(p) {
        Ok(s) => {
            let t = s.filesystem_type();
            t == nix::sys::statfs::CGROUP_SUPER_MAGIC
                || t == nix::sys::statfs::CGROUP2_SUPER_MAGIC
                || t.0 as i64 == RDTGROUP_SUPER_MAGIC
                || t.0 as i64 == SYSFS_MAGIC
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_threads_are_refused() {
        let r = Root::default();
        assert!(check_pid(&r, std::process::id() as i32).is_ok());
        let e = check_pid(&r, 2).unwrap_err().to_string();
        assert!(e.contains("kthreadd") && e.contains("kernel thread"), "{e}");
        assert!(matches!(check_pid(&r, i32::MAX), Err(Error::NoSuchPid(_))));
    }

    #[test]
    fn reads_own_process() {
        let r = Root::default();
        let me = std::process::id() as i32;
        assert!(start_time(&r, me).unwrap() > 0);
        assert!(!tids(&r, me).unwrap().is_empty());
        assert!(!cpus_allowed(&r, me).unwrap().is_empty());
        assert_eq!(get_affinity(me).unwrap(), cpus_allowed(&r, me).unwrap());
        assert!(matches!(tids(&r, i32::MAX), Err(Error::NoSuchPid(_))));
    }

    #[test]
    fn parses_cgroup_lines() {
        let d = tempfile::tempdir().unwrap();
        let r = Root::new(d.path());
        std::fs::create_dir_all(r.path("/proc/7")).unwrap();
        std::fs::write(
            r.path("/proc/7/cgroup"),
            "4:cpu,cpuacct:/a\n3:cpuset:/b/c\n0::/user.slice\n",
        )
        .unwrap();
        assert_eq!(cgroup_of(&r, 7, Some("cpuset")).unwrap(), "/b/c");
        assert_eq!(cgroup_of(&r, 7, Some("cpu")).unwrap(), "/a");
        assert_eq!(cgroup_of(&r, 7, None).unwrap(), "/user.slice");
        assert!(cgroup_of(&r, 7, Some("memory")).is_err());
    }
}
