//! What a dry run has done so far, as the machine would show it after a
//! real run: the files it wrote, the groups it made or removed, where it
//! moved each process, the policy it gave each thread. The steps that
//! decide on the machine's state (is the group there, does a knob still
//! hold it, is the app real-time now, which group is a process in) read
//! through this, so a dry run reports the steps a real run makes on the
//! same transitions, not steps judged on a machine it never changed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::root::read_file;

#[derive(Debug, Default)]
pub struct Dry {
    /// Files written: their value now.
    files: HashMap<PathBuf, String>,
    /// Groups made (true) or removed (false).
    dirs: HashMap<PathBuf, bool>,
    /// The group (directory) each moved process is in, per hierarchy
    /// (its mount).
    groups: HashMap<(i32, PathBuf), PathBuf>,
    /// Each thread's scheduling policy ([`crate::schedpolicy`] text).
    sched: HashMap<i32, String>,
}

impl Dry {
    pub fn is_dir(&self, p: &Path) -> bool {
        self.dirs.get(p).copied().unwrap_or_else(|| p.is_dir())
    }

    /// A file as it would read: written, else in a group the dry run made
    /// the value the kernel makes it with ([`crate::cgroup::neutral::fresh_value`]),
    /// else in a group it removed none, else the machine's.
    pub fn read(&self, p: &Path) -> Result<String> {
        if let Some(v) = self.files.get(p) {
            return Ok(v.clone());
        }
        let missing = || Error::io("reading", p, std::io::ErrorKind::NotFound.into());
        match p.parent().and_then(|d| self.dirs.get(d)) {
            Some(true) => crate::cgroup::neutral::fresh_value(p)
                .map(str::to_owned)
                .ok_or_else(missing),
            Some(false) => Err(missing()),
            None => read_file(p),
        }
    }

    pub fn wrote(&mut self, p: &Path, value: &str) {
        self.files.insert(p.to_owned(), value.to_owned());
    }

    /// A group made (`true`) or removed: its files start afresh.
    pub fn made(&mut self, dir: &Path, made: bool) {
        self.files.retain(|f, _| !f.starts_with(dir));
        self.dirs.insert(dir.to_owned(), made);
    }

    /// Thread `tid`'s policy: set by the dry run, else the machine's.
    pub fn sched(&self, tid: i32) -> Result<String> {
        match self.sched.get(&tid) {
            Some(s) => Ok(s.clone()),
            None => crate::schedpolicy::get(tid),
        }
    }

    /// `set` given to a thread at `before`: the nice value stays unless
    /// `set` names one (as [`crate::schedpolicy::set`] does).
    pub fn set_sched(&mut self, tid: i32, before: &str, set: &str) {
        let nice = |t: &str| {
            crate::schedpolicy::parse_full(t)
                .ok()
                .and_then(|(_, _, n)| n)
        };
        let mut now = crate::schedpolicy::policy_part(set).to_owned();
        if let Some(n) = nice(set).or_else(|| nice(before)).filter(|n| *n != 0) {
            now += &format!(" nice:{n}");
        }
        self.sched.insert(tid, now);
    }

    /// The group `pid` was moved to under `mount`, if the dry run moved it.
    pub fn group_of(&self, pid: i32, mount: &Path) -> Option<&PathBuf> {
        self.groups.get(&(pid, mount.to_owned()))
    }

    pub fn moved(&mut self, pid: i32, mount: &Path, group: &Path) {
        self.groups
            .insert((pid, mount.to_owned()), group.to_owned());
    }

    /// `pid` put back in `group` (a journal's undo, which names no mount:
    /// the hierarchy it was moved in under the dry run that holds `group`).
    pub fn moved_back(&mut self, pid: i32, group: &Path) {
        for ((p, mount), g) in self.groups.iter_mut() {
            if *p == pid && group.starts_with(mount) {
                *g = group.to_owned();
            }
        }
    }
}
