//! One qosd per group on a node. A daemon names its cgroup and resctrl
//! groups `qosd-<app>` whatever its state file, so a second daemon with the
//! same app names (another port, another state file) would write the very
//! groups the first one manages. Each group name is guarded by a `flock`
//! on `/run/qosd/groups/<group>.lock` (under the root prefix), held for the
//! daemon's life and released by the kernel when it exits, even on SIGKILL.
//! Replays name their groups `qosd-replay<PID>-<app>`, so they never clash.
//!
//! Two daemons with *different* app names can still match the same process.
//! Group names cannot tell then (a daemon using only the affinity backend
//! puts the process in no group at all), so each daemon also claims every
//! process it manages: a `flock` on `/run/qosd/pids/<pid>.lock` holding
//! `<daemon pid> <app>`, taken when it starts managing the process and
//! dropped when it stops. A second claim of a held pid names the holder.

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

/// Where the per-process claims live (under the root prefix).
pub const PID_DIR: &str = "/run/qosd/pids";

/// Another running qosd that manages a process this one wants to manage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub pid: i32,
    /// The other daemon's pid and its app's name, as it wrote them.
    pub holder: String,
}

/// The processes this daemon manages, each claimed by a held lock.
#[derive(Debug)]
pub struct PidClaims {
    root: Root,
    /// The process's start time with the lock, so a reused pid is a new claim.
    held: std::collections::HashMap<i32, (u64, Flock<File>)>,
}

impl PidClaims {
    pub fn new(root: Root) -> PidClaims {
        PidClaims {
            root,
            held: Default::default(),
        }
    }

    fn path(&self, pid: i32) -> PathBuf {
        self.root.path(PID_DIR).join(format!("{pid}.lock"))
    }

    /// Claims `pids` for `app`; the ones another running qosd holds (it
    /// keeps them: both would undo each other's changes, so the caller
    /// says so). A claim that cannot be made (no `/run`) is skipped: this
    /// is a warning, never a reason not to manage.
    pub fn claim(&mut self, app: &str, pids: &[i32]) -> Vec<Claimed> {
        let mut others = Vec::new();
        for &pid in pids {
            let start = crate::proc::start_time(&self.root, pid).unwrap_or(0);
            if self.held.get(&pid).is_some_and(|(t, _)| *t == start) {
                continue;
            }
            let path = self.path(pid);
            let Ok(f) = statefile::check_dir(&path).and_then(|()| statefile::open_lock(&path))
            else {
                continue;
            };
            match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Ok(mut lock) => {
                    let me = std::process::id();
                    let _ = lock
                        .set_len(0)
                        .and_then(|()| lock.rewind())
                        .and_then(|()| writeln!(lock, "{me} {app}"));
                    self.held.insert(pid, (start, lock));
                }
                Err((_, nix::Error::EWOULDBLOCK)) => others.push(Claimed {
                    pid,
                    holder: std::fs::read_to_string(&path)
                        .unwrap_or_default()
                        .trim()
                        .to_owned(),
                }),
                Err(_) => {}
            }
        }
        others
    }

    /// Drops the claims of `pids` (released or exited): the file goes
    /// first, then the lock, so a claim file left behind is never held.
    pub fn release(&mut self, pids: &[i32]) {
        for pid in pids {
            if let Some((_, lock)) = self.held.remove(pid) {
                let _ = std::fs::remove_file(self.path(*pid));
                drop(lock);
            }
        }
    }
}

impl Drop for PidClaims {
    /// A daemon that stops leaves no claim file (one per process would
    /// pile up in `/run` otherwise); after a SIGKILL the kernel drops the
    /// locks and a file nobody holds counts for nothing.
    fn drop(&mut self) {
        let pids: Vec<i32> = self.held.keys().copied().collect();
        self.release(&pids);
    }
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

    #[test]
    fn a_process_is_claimed_by_one_daemon_at_a_time() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let me = std::process::id() as i32;
        let (mut first, mut second) = (PidClaims::new(root.clone()), PidClaims::new(root));
        assert!(first.claim("web", &[me]).is_empty());
        // Claiming again what one holds is no conflict.
        assert!(first.claim("web", &[me]).is_empty());
        let others = second.claim("api", &[me]);
        assert_eq!(
            others,
            vec![Claimed {
                pid: me,
                holder: format!("{me} web")
            }]
        );
        first.release(&[me]);
        assert!(second.claim("api", &[me]).is_empty());
    }
}
