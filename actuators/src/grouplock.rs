//! One qosd per group on a node. A daemon names its cgroup and resctrl
//! groups `qosd-<app>` whatever its state file, so a second daemon with the
//! same app names (another port, another state file) would write the very
//! groups the first one manages. Each group name is guarded by a `flock`
//! on `/run/qosd/groups/<group>.lock` (under the root prefix), held for the
//! daemon's life and released by the kernel when it exits, even on SIGKILL.
//! Replays name their groups `qosd-replay<PID>-<app>`, so they never clash.

use std::fs::File;
use std::io::{Seek, Write};
use std::path::PathBuf;

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, Result};
use crate::root::Root;
use crate::statefile;

/// Where the group locks live (under the root prefix).
pub const LOCK_DIR: &str = "/run/qosd/groups";

/// Locks held; dropping them releases the group names.
#[derive(Debug)]
pub struct GroupLocks {
    _held: Vec<Flock<File>>,
}

/// The lock file of a group name.
pub fn lock_path(root: &Root, group: &str) -> PathBuf {
    root.path(LOCK_DIR).join(format!("{group}.lock"))
}

/// Takes the lock of every group in `groups`, or fails naming the first
/// one another running qosd holds (and its pid). Nothing is held on error.
pub fn lock_groups(root: &Root, groups: &[String]) -> Result<GroupLocks> {
    let mut held = Vec::with_capacity(groups.len());
    for g in groups {
        let path = lock_path(root, g);
        statefile::check_dir(&path)?;
        let f = statefile::open_lock(&path)?;
        let mut lock = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((_, nix::Error::EWOULDBLOCK)) => {
                let pid = std::fs::read_to_string(&path).unwrap_or_default();
                return Err(Error::Invalid(format!(
                    "group {g} is managed by another running qosd (pid {}; lock {}): stop it, \
                     or give this app another name",
                    pid.trim(),
                    path.display()
                )));
            }
            Err((_, e)) => {
                return Err(Error::io("locking", &path, std::io::Error::from(e)));
            }
        };
        // The holder's pid, for the message of the next one.
        let me = std::process::id();
        lock.set_len(0)
            .and_then(|()| lock.rewind())
            .and_then(|()| writeln!(lock, "{me}"))
            .map_err(|e| Error::io("writing", &path, e))?;
        held.push(lock);
    }
    Ok(GroupLocks { _held: held })
}

/// The pid of the running qosd that holds `group`'s lock, if one does (a
/// lock file nobody holds is a leftover: `None`).
pub fn holder(root: &Root, group: &str) -> Option<String> {
    let path = lock_path(root, group);
    let f = std::fs::File::open(&path).ok()?;
    match Flock::lock(f, FlockArg::LockSharedNonblock) {
        Ok(_) => None,
        Err(_) => Some(
            std::fs::read_to_string(&path)
                .unwrap_or_default()
                .trim()
                .to_owned(),
        ),
    }
}

/// The `qosd-*` group of another running qosd that `pid` is in (its
/// `/proc/PID/cgroup`), with that qosd's pid: two daemons managing one
/// process undo each other's changes.
pub fn foreign_group(root: &Root, pid: i32, own: &str) -> Option<(String, String)> {
    let cg = root.read(format!("/proc/{pid}/cgroup")).ok()?;
    cg.lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .filter_map(|p| p.trim_start_matches('/').split('/').next())
        .filter(|g| g.starts_with("qosd-") && *g != own)
        .find_map(|g| holder(root, g).map(|h| (g.to_owned(), h)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_held_by_one_holder_at_a_time() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let names = vec!["qosd-a".to_owned(), "qosd-b".to_owned()];
        let first = lock_groups(&root, &names).unwrap();
        // flock locks belong to the open file: a second open conflicts
        // even in the same process, as a second daemon would.
        let e = lock_groups(&root, &["qosd-b".to_owned()]).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("group qosd-b is managed by another running qosd"),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        lock_groups(&root, &["qosd-c".to_owned()]).unwrap();
        assert_eq!(
            holder(&root, "qosd-a"),
            Some(std::process::id().to_string())
        );
        assert_eq!(holder(&root, "qosd-none"), None);
        drop(first);
        assert_eq!(holder(&root, "qosd-a"), None);
        lock_groups(&root, &names).unwrap();
    }
}
