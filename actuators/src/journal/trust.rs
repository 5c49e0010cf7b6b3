//! Which state file entries root may undo: only what qosd itself changes
//! (its `qosd-` groups under the cgroup and resctrl roots, files under
//! /sys, its own TC filters, the two tools it runs). A state file forged
//! to remove `/tmp/victim` or to write `/etc/passwd` is refused entry by
//! entry, before anything is undone.

use std::ffi::OsStr;
use std::path::{Component, Path};

use super::Entry;
use crate::error::{Error, Result};
use crate::root::Root;

/// The directories under which qosd creates groups (prefixed by the root).
const GROUP_ROOTS: [&str; 2] = ["/sys/fs/cgroup", crate::root::RESCTRL_DIR];

/// Fails unless undoing `e` touches only what qosd itself changes: a group
/// it names (`qosd-…`) under the cgroup or resctrl root, files under /sys,
/// the two tools it runs. A state file forged to remove `/tmp/victim` or
/// to write `/etc/passwd` is refused entry by entry.
pub fn check_entry(root: &Root, e: &Entry) -> Result<()> {
    let clean = |p: &Path| p.is_absolute() && !p.components().any(|c| c == Component::ParentDir);
    let under = |p: &Path, base: &str| clean(p) && p.starts_with(root.path(base));
    let bad = |what: &str, p: &Path| {
        Err(Error::Invalid(format!(
            "state file entry refused: {what} {} is not one qosd manages",
            p.display()
        )))
    };
    match e {
        Entry::CreatedDir { path, .. } => {
            let named = path
                .file_name()
                .and_then(OsStr::to_str)
                .is_some_and(|n| n.starts_with("qosd-"));
            if named && GROUP_ROOTS.iter().any(|b| under(path, b)) {
                Ok(())
            } else {
                bad("directory", path)
            }
        }
        Entry::File { path, .. } if !under(path, "/sys") => bad("file", path),
        Entry::EnabledController { path, .. }
            if !under(path, "/sys/fs/cgroup")
                || path.file_name().and_then(OsStr::to_str) != Some("cgroup.subtree_control") =>
        {
            bad("cgroup file", path)
        }
        Entry::Moved { back_to, .. } if !under(back_to, "/sys/fs/cgroup") => {
            bad("cgroup file", back_to)
        }
        Entry::Net { argv, .. } => crate::netns::check_undo(argv),
        Entry::Sched {
            pid,
            start_time,
            threads,
            ..
        } => match threads.iter().find(|(tid, p)| {
            crate::schedpolicy::parse_full(p).is_err() || raises(root, *pid, *start_time, *tid, p)
        }) {
            Some((tid, p)) => Err(Error::Invalid(format!(
                "state file entry refused: scheduling policy {p:?} for thread {tid} is not one qosd restores"
            ))),
            None => Ok(()),
        },
        Entry::Command { argv, .. } => {
            let prog = argv.first().map(String::as_str).unwrap_or_default();
            if matches!(prog, "pqos" | "cpupower") {
                Ok(())
            } else {
                Err(Error::Invalid(format!(
                    "state file entry refused: command `{prog}` is not one qosd runs"
                )))
            }
        }
        _ => Ok(()),
    }
}

/// Whether restoring `want` on thread `tid` of `pid` would raise it (make
/// it real-time, or lower its nice: [`crate::schedpolicy::raises`]). qosd
/// journals a real-time original only for a thread it left alone (it
/// never changes one), so an honest entry restores such a thread to the
/// policy it has now; one that would make any live thread of the process
/// real-time was not written by qosd. A thread or process that is gone
/// is not touched by the restore, so it cannot be raised.
fn raises(root: &Root, pid: i32, start_time: u64, tid: i32, want: &str) -> bool {
    if !crate::proc::same_process(root, pid, start_time)
        || !crate::proc::tids(root, pid).is_ok_and(|t| t.contains(&tid))
    {
        return false;
    }
    crate::schedpolicy::get(tid).is_ok_and(|now| crate::schedpolicy::raises(&now, want))
}

#[cfg(test)]
mod tests {
    use super::*;
    use qosd_core::Resource;

    #[test]
    fn only_entries_qosd_makes_are_undone() {
        let root = Root::new("/tmp/fake");
        let dir = |p: &str| Entry::CreatedDir {
            resource: Resource::Cores,
            path: root.path(p),
        };
        for ok in [
            "/sys/fs/cgroup/qosd-web",
            "/sys/fs/cgroup/cpuset/qosd-pid12",
            "/sys/fs/resctrl/qosd-web",
        ] {
            check_entry(&root, &dir(ok)).unwrap();
        }
        for bad in [
            "/tmp/victim",
            "/sys/fs/cgroup/system.slice",
            "/sys/fs/cgroup/qosd-a/../../../etc/qosd-x",
            "/sys/fs/resctrlx/qosd-web",
            "/etc/qosd-x",
        ] {
            let e = check_entry(&root, &dir(bad)).unwrap_err();
            assert!(e.to_string().contains("not one qosd manages"), "{bad}: {e}");
        }
        let file = |p: &str| Entry::File {
            resource: Resource::Frequency,
            path: root.path(p),
            original: String::new(),
            best_effort: false,
        };
        check_entry(
            &root,
            &file("/sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq"),
        )
        .unwrap();
        assert!(check_entry(&root, &file("/etc/passwd")).is_err());
        // Under the real root, a fake tree's path is not under /sys.
        assert!(check_entry(&Root::default(), &file("/sys/x")).is_err());
        let cmd = |p: &str| Entry::Command {
            resource: Resource::CacheWays,
            key: "k".into(),
            argv: vec![p.to_owned(), "-R".into()],
        };
        check_entry(&root, &cmd("pqos")).unwrap();
        assert!(check_entry(&root, &cmd("/bin/rm")).is_err());
    }
}
