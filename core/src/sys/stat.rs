//! `/proc/PID/stat` (and `/proc/PID/task/TID/stat`), parsed once for
//! everyone who needs a process's state, parent, flags, CPU time or start
//! time. The command name (field 2) may hold spaces and parentheses, so
//! fields are counted after the last `)`.

use super::{Root, SysError};

/// The fields of a stat line that qosd uses (numbering of proc(5)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// Field 1.
    pub pid: i32,
    /// Field 2, without its parentheses.
    pub comm: String,
    /// Field 3: R, S, D, Z, X, ...
    pub state: char,
    /// Field 4.
    pub ppid: i32,
    /// Field 9: PF_* flags.
    pub flags: u64,
    /// Fields 14 + 15: user and system CPU time, in clock ticks (`None`
    /// on a line cut short: never read as "no CPU used").
    pub cpu_ticks: Option<u64>,
    /// Field 22: clock ticks since boot when the process started.
    pub start_ticks: Option<u64>,
}

/// PF_KTHREAD, in the flags field (include/linux/sched.h).
const PF_KTHREAD: u64 = 0x0020_0000;

impl Stat {
    /// Parses one stat line; `None` when it is not one. The state and the
    /// parent must be there; fake trees write short lines, so the flags
    /// read as 0 when missing and the times as `None`.
    pub fn parse(line: &str) -> Option<Stat> {
        let (head, rest) = line.rsplit_once(')')?;
        let (pid, comm) = head.split_once(" (")?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        // f[0] is field 3.
        let num = |field: usize| -> Option<u64> { f.get(field - 3)?.parse().ok() };
        Some(Stat {
            pid: pid.trim().parse().ok()?,
            comm: comm.to_owned(),
            state: f.first()?.chars().next()?,
            ppid: f.get(1)?.parse().ok()?,
            flags: num(9).unwrap_or(0),
            cpu_ticks: num(14).zip(num(15)).map(|(u, s)| u + s),
            start_ticks: num(22),
        })
    }

    /// Reads `/proc/PID/stat` under `root` (`task` = `Some(tid)` for one
    /// thread's). `SysError::is_gone` tells a vanished process apart.
    pub fn read(root: &Root, pid: i32, task: Option<i32>) -> Result<Stat, SysError> {
        let abs = match task {
            Some(tid) => format!("/proc/{pid}/task/{tid}/stat"),
            None => format!("/proc/{pid}/stat"),
        };
        let line = root.read(&abs)?;
        Stat::parse(&line).ok_or_else(|| SysError::Parse {
            path: root.path(&abs),
            what: "a stat line".into(),
        })
    }

    /// A zombie (exited, not reaped yet) or a dead task: it serves nothing.
    pub fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }

    /// True for a kernel thread: the PF_KTHREAD flag, or kthreadd (pid 2)
    /// and its children where the flag is absent (a fake tree). Changing
    /// their affinity or cgroup breaks the kernel's own work (kthreadd's
    /// affinity is inherited by new kthreads).
    pub fn kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0 || self.pid == 2 || self.ppid == 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_real_and_odd_lines() {
        let me = Stat::read(&Root::default(), std::process::id() as i32, None).unwrap();
        assert_eq!(me.pid, std::process::id() as i32);
        assert!(!me.kernel_thread() && !me.exited());
        assert!(me.start_ticks.is_some_and(|t| t > 0));
        let init = Stat::read(&Root::default(), 1, None).unwrap();
        assert!(!init.kernel_thread());
        assert!(Stat::read(&Root::default(), 2, None)
            .unwrap()
            .kernel_thread());
        // The flag alone, whatever the parent; a name with ") (" in it.
        let odd = Stat::parse("77 (odd) (name) S 1 0 0 0 -1 2129984 0 0").unwrap();
        assert_eq!(odd.comm, "odd) (name");
        assert!(odd.kernel_thread());
        assert!(!Stat::parse("77 (user) S 1 0 0 0 -1 4194560 0 0")
            .unwrap()
            .kernel_thread());
        assert_eq!(Stat::parse("garbage"), None);
        let z = Stat::parse("9 (a b) Z 4 0 0 0 0 0 0 0 0 0 7 3 0 0 0 0 0 0 55").unwrap();
        assert!(z.exited());
        assert_eq!(
            (z.ppid, z.cpu_ticks, z.start_ticks),
            (4, Some(10), Some(55))
        );
        let short = Stat::parse("9 (a) S 4 0 0 0").unwrap();
        assert_eq!((short.cpu_ticks, short.start_ticks), (None, None));
    }
}
