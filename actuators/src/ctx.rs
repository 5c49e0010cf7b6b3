//! The context every actuator changes the machine through: the root
//! prefix, dry-run, the journal of originals and the undo log of the
//! change in progress (so a change that fails midway is rolled back).

use std::path::{Path, PathBuf};

use qosd_core::Resource;

use crate::error::{Error, Result};
use crate::journal::{Entry, Journal};
use crate::root::{read_file, write_file, Root};
use crate::{proc, Change};

mod commands;
pub(crate) mod dry;
pub use dry::Dry;

/// How [`Ctx::each_thread`] reads and writes one per-thread setting.
struct ThreadOps<'a> {
    /// Named in the change log.
    what: &'static str,
    get: &'a dyn Fn(i32) -> Result<String>,
    set: &'a dyn Fn(i32) -> Result<()>,
    /// A thread whose current value says leave it alone.
    skip: &'a dyn Fn(&str) -> bool,
    /// The scheduling policy: a dry run reads and keeps it ([`Dry`]).
    sched: bool,
}

pub struct Ctx {
    pub root: Root,
    pub dry_run: bool,
    journal: Journal,
    /// Undo log of the current change: the value before each step.
    txn: Vec<Entry>,
    /// Journal length when the current change began.
    txn_journal_len: usize,
    /// Directories created so far (files in them need no journal entry:
    /// removing the directory restores them).
    created: Vec<PathBuf>,
    changes: Vec<Change>,
    /// What this dry run has done, as a real run would find it.
    dry: Dry,
}

impl Ctx {
    pub fn new(root: Root, dry_run: bool, journal: Journal) -> Self {
        let created = journal
            .entries()
            .iter()
            .filter_map(|e| match e {
                Entry::CreatedDir { path, .. } => Some(path.clone()),
                _ => None,
            })
            .collect();
        Ctx {
            root,
            dry_run,
            journal,
            txn: Vec::new(),
            txn_journal_len: 0,
            created,
            changes: Vec::new(),
            dry: Dry::default(),
        }
    }

    /// Reads a file (already prefixed) as a real run would find it now:
    /// in a dry run, with what the run has written, made and removed.
    pub fn read(&self, p: &Path) -> Result<String> {
        match self.dry_run {
            true => self.dry.read(p),
            false => read_file(p),
        }
    }

    /// Whether a directory is there, as [`Ctx::read`] would find it.
    pub fn is_dir(&self, p: &Path) -> bool {
        match self.dry_run {
            true => self.dry.is_dir(p),
            false => p.is_dir(),
        }
    }

    /// Thread `tid`'s scheduling policy, as [`Ctx::read`] would find it.
    pub fn sched_of(&self, tid: i32) -> Result<String> {
        match self.dry_run {
            true => self.dry.sched(tid),
            false => crate::schedpolicy::get(tid),
        }
    }

    /// The group (directory under `mount`) `pid` is in, as [`Ctx::read`]
    /// would find it; `controller` names the v1 hierarchy.
    pub fn group_of(&self, pid: i32, mount: &Path, controller: Option<&str>) -> Result<PathBuf> {
        if let Some(g) = self
            .dry_run
            .then(|| self.dry.group_of(pid, mount))
            .flatten()
        {
            return Ok(g.clone());
        }
        let current = proc::cgroup_of(&self.root, pid, controller)?;
        Ok(mount.join(current.trim_start_matches('/')))
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn journal_mut(&mut self) -> &mut Journal {
        &mut self.journal
    }

    /// Starts a change that is applied whole or not at all.
    pub fn begin(&mut self) {
        self.txn.clear();
        self.changes.clear();
        self.txn_journal_len = self.journal.entries().len();
    }

    /// Ends the change; returns what it did.
    pub fn commit(&mut self) -> Vec<Change> {
        self.txn.clear();
        std::mem::take(&mut self.changes)
    }

    /// Undoes every step of the current change, newest first, drops the
    /// journal entries it added, and returns `err` (or both errors when the
    /// undo fails too).
    pub fn rollback(&mut self, err: Error) -> Error {
        let mut failures = Vec::new();
        let undone = self.txn.len();
        for e in std::mem::take(&mut self.txn).into_iter().rev() {
            let dry = self.dry_run.then_some(&mut self.dry);
            if let Err(u) = e.undo(&self.root, dry) {
                failures.push(u.to_string());
            }
        }
        self.changes.clear();
        let len = self.txn_journal_len;
        let created = std::mem::take(&mut self.created);
        self.created = created.into_iter().filter(|p| self.is_dir(p)).collect();
        if let Err(e) = self.journal.truncate(len) {
            failures.push(e.to_string());
        }
        if failures.is_empty() {
            if undone > 0 {
                tracing::warn!("rolled back {undone} steps after: {err}");
            }
            err
        } else {
            Error::RollbackFailed {
                error: Box::new(err),
                rollback: failures.join("; "),
            }
        }
    }

    /// Notes a step done outside `ctx` (e.g. a lowering of inherited real
    /// time, which needs no journal entry) among the change's steps.
    pub fn noted(&mut self, c: Change) {
        self.note(c)
    }

    fn note(&mut self, c: Change) {
        if self.dry_run {
            tracing::info!("dry run: would change {c}");
        } else {
            tracing::info!("changed {c}");
        }
        self.changes.push(c);
    }

    fn in_created_dir(&self, p: &Path) -> bool {
        self.created.iter().any(|d| p.starts_with(d))
    }

    /// Writes `value` to an already-prefixed path, recording the original
    /// first. `best_effort`: see [`Entry::File`].
    pub fn write(
        &mut self,
        resource: Resource,
        path: &Path,
        value: &str,
        best_effort: bool,
    ) -> Result<()> {
        let own = self.in_created_dir(path);
        let prior = match self.read(path) {
            Ok(s) => s,
            // Inside a group qosd just made (not made at all in a dry run).
            Err(_) if own => String::new(),
            Err(e) => return Err(e),
        };
        // Re-applying the same allocation every tick writes nothing.
        if prior.trim() == value.trim() && !(own && prior.is_empty()) {
            return Ok(());
        }
        let entry = Entry::File {
            resource,
            path: path.to_owned(),
            original: prior.clone(),
            best_effort,
        };
        if !own {
            self.journal.record(entry.clone())?;
        }
        match self.dry_run {
            true => self.dry.wrote(path, value),
            false => write_file(path, value, own)?,
        }
        // A file of a group made by this change goes with the group.
        if !(own && prior.is_empty()) {
            self.txn.push(entry);
        }
        self.note(Change::new(resource, self.root.show(path), prior, value));
        Ok(())
    }

    /// Creates a group directory (cgroup or resctrl) unless it exists.
    /// Returns whether it was created.
    pub fn mkdir(&mut self, resource: Resource, path: &Path) -> Result<bool> {
        if self.is_dir(path) {
            return Ok(false);
        }
        let entry = Entry::CreatedDir {
            resource,
            path: path.to_owned(),
        };
        let first = self.journal.record(entry.clone())?;
        if self.dry_run {
            self.dry.made(path, true);
        } else {
            std::fs::create_dir(path).map_err(|e| Error::io("creating", path, e))?;
            if !first {
                // Made before and gone now: someone else removed it.
                tracing::warn!(
                    "{} was removed while qosd managed it: made again, and its processes are \
                     moved back into it",
                    self.root.show(path)
                );
            }
        }
        self.created.push(path.to_owned());
        self.txn.push(entry);
        self.note(Change::new(resource, self.root.show(path), "", "created"));
        Ok(true)
    }

    /// Enables `controller` in the cgroup2 `cgroup.subtree_control` file
    /// `path` unless it is on already (journalled: restore disables it).
    pub fn enable_controller(
        &mut self,
        resource: Resource,
        path: &Path,
        controller: &str,
    ) -> Result<()> {
        let now = read_file(path)?;
        if now.split_whitespace().any(|c| c == controller) {
            return Ok(());
        }
        let entry = Entry::EnabledController {
            resource,
            path: path.to_owned(),
            controller: controller.to_owned(),
        };
        self.journal.record(entry.clone())?;
        if !self.dry_run {
            write_file(path, &format!("+{controller}"), false)?;
        }
        self.txn.push(entry);
        self.note(Change::new(
            resource,
            self.root.show(path),
            now.trim(),
            format!("+{controller}"),
        ));
        Ok(())
    }

    /// Sets the affinity of every thread of `pid` to `cpus` (see
    /// [`Ctx::each_thread`]).
    pub fn set_affinity(&mut self, resource: Resource, pid: i32, cpus: &[u32]) -> Result<()> {
        let want = qosd_core::cpulist::format(cpus);
        let entry = |pid, start_time, threads| Entry::Affinity {
            resource,
            pid,
            start_time,
            threads,
        };
        let ops = ThreadOps {
            what: "affinity",
            get: &|tid| proc::get_affinity(tid).map(|c| qosd_core::cpulist::format(&c)),
            set: &|tid| proc::set_affinity(tid, cpus),
            skip: &|_| false,
            sched: false,
        };
        self.each_thread(resource, pid, &want, &ops, &entry)
    }

    /// Sets the scheduling policy of every thread of `pid` to `policy`
    /// ([`crate::schedpolicy`] text, no nice part: the nice value is kept
    /// and journalled); real-time threads are left alone unless they have
    /// `policy` already (qosd's own, at a reassert).
    pub fn set_sched_policy(&mut self, resource: Resource, pid: i32, policy: &str) -> Result<()> {
        let entry = |pid, start_time, threads| Entry::Sched {
            resource,
            pid,
            start_time,
            threads,
        };
        let ops = ThreadOps {
            what: "scheduling policy",
            get: &crate::schedpolicy::get,
            set: &|tid| crate::schedpolicy::set(tid, policy),
            skip: &|before: &str| {
                if crate::schedpolicy::policy_part(before) == policy {
                    return true;
                }
                let rt = crate::schedpolicy::is_realtime(before);
                if rt {
                    tracing::warn!("pid {pid}: a {before} thread is real-time: left as it is");
                }
                rt
            },
            sched: true,
        };
        self.each_thread(resource, pid, policy, &ops, &entry)
    }

    /// Sets one per-thread setting on every thread of `pid` to `want`,
    /// repeating until no new thread shows up (threads created meanwhile
    /// inherit from a thread already changed or are caught by the next
    /// pass, or by the next reassert). The first journal entry of a pid
    /// holds the originals; later threads restore to the main thread's.
    fn each_thread(
        &mut self,
        resource: Resource,
        pid: i32,
        want: &str,
        ops: &ThreadOps<'_>,
        entry: &dyn Fn(i32, u64, Vec<(i32, String)>) -> Entry,
    ) -> Result<()> {
        let start_time = proc::start_time(&self.root, pid)?;
        let gone = |e: &Error| {
            matches!(
                e,
                Error::Sys {
                    source: nix::Error::ESRCH,
                    ..
                }
            )
        };
        let mut done: Vec<i32> = Vec::new();
        for _pass in 0..8 {
            let fresh: Vec<i32> = proc::tids(&self.root, pid)?
                .into_iter()
                .filter(|t| !done.contains(t))
                .collect();
            if fresh.is_empty() {
                break;
            }
            let mut prior = Vec::new();
            for &tid in &fresh {
                let got = match ops.sched {
                    true => self.sched_of(tid),
                    false => (ops.get)(tid),
                };
                match got {
                    Ok(c) => prior.push((tid, c)),
                    Err(e) if gone(&e) => {}
                    Err(e) => return Err(e),
                }
            }
            let e = entry(pid, start_time, prior.clone());
            self.journal.record(e.clone())?;
            self.txn.push(e);
            for (tid, before) in prior {
                done.push(tid);
                if before == want || (ops.skip)(&before) {
                    continue;
                }
                if self.dry_run {
                    if ops.sched {
                        self.dry.set_sched(tid, &before, want);
                    }
                } else {
                    match (ops.set)(tid) {
                        Ok(()) => {}
                        Err(e) if gone(&e) => continue,
                        Err(e) => return Err(e),
                    }
                }
                self.note(Change::new(
                    resource,
                    format!("pid {pid} thread {tid} {}", ops.what),
                    before,
                    want,
                ));
            }
        }
        Ok(())
    }

    /// Moves `pid` into the cgroup whose `cgroup.procs` is `into`,
    /// recording `back_to` (the `cgroup.procs` of its current group).
    /// `mount` is the hierarchy both are in: a process has one group per
    /// hierarchy (cgroup v1 `cpuset` and `cpu` are two), so each keeps its
    /// own first origin.
    pub fn move_pid(
        &mut self,
        resource: Resource,
        pid: i32,
        mount: &Path,
        into: &Path,
        back_to: &Path,
    ) -> Result<()> {
        let start_time = proc::start_time(&self.root, pid)?;
        let entry = Entry::Moved {
            resource,
            pid,
            start_time,
            back_to: back_to.to_owned(),
        };
        // A pid already moved by qosd in this hierarchy keeps its first
        // origin there (a later move starts from qosd's own group).
        let first = !self.journal.entries().iter().any(|e| {
            matches!(e, Entry::Moved { pid: p, start_time: s, back_to: b, .. }
                if *p == pid && *s == start_time && b.starts_with(mount))
        });
        if first {
            self.journal.record(entry.clone())?;
        }
        if self.dry_run {
            self.dry.moved(pid, mount, into.parent().unwrap_or(into));
        } else {
            write_file(into, &format!("{pid}\n"), self.in_created_dir(into)).map_err(
                |e| match e {
                    Error::Io { ref source, .. } if source.raw_os_error() == Some(libc::ESRCH) => {
                        Error::NoSuchPid(pid)
                    }
                    e => e,
                },
            )?;
        }
        self.txn.push(entry);
        self.note(Change::new(
            resource,
            format!("pid {pid} cgroup"),
            self.root.show(back_to.parent().unwrap_or(back_to)),
            self.root.show(into.parent().unwrap_or(into)),
        ));
        Ok(())
    }

    /// Writes into a group qosd made (a task id into `tasks`): nothing to
    /// record, removing the group undoes it.
    pub fn assign(&mut self, resource: Resource, path: &Path, value: &str) -> Result<()> {
        if !self.dry_run {
            write_file(path, value, self.in_created_dir(path))?;
        }
        self.note(Change::new(resource, self.root.show(path), "", value));
        Ok(())
    }

    /// Restores the entries of one resource (or all with `None`).
    pub fn restore(&mut self, resource: Option<Resource>) -> (Vec<Change>, Vec<Error>) {
        self.restore_where(|e| match resource {
            Some(r) => e.resource() == Some(r),
            None => true,
        })
    }

    /// Within a change: puts back what the entries `which` selects
    /// recorded (consuming them, newest first) and notes it among the
    /// change's steps; the first failure is returned. What is put back
    /// stays put back if the change fails later (it is the original).
    pub fn undo_where(&mut self, which: impl Fn(&Entry) -> bool) -> Result<()> {
        let (changes, errors) = self.restore_where(which);
        for c in changes {
            self.note(c);
        }
        errors.into_iter().next().map_or(Ok(()), Err)
    }

    /// Restores the entries `which` selects, newest first.
    pub fn restore_where(&mut self, which: impl Fn(&Entry) -> bool) -> (Vec<Change>, Vec<Error>) {
        let r = self.journal.restore_with(which, &mut self.dry);
        let created = std::mem::take(&mut self.created);
        self.created = created.into_iter().filter(|p| self.is_dir(p)).collect();
        r
    }
}
