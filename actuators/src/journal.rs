//! The record of originals. Before qosd first changes anything it appends
//! what it found to this journal and writes the journal to the state file,
//! so that after a SIGKILL the next start (or `qosd restore`) can put every
//! knob back. Restoring replays the entries newest first.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use qosd_core::Resource;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::root::{read_file, write_file, Root};
use crate::{proc, statefile, Change};

/// One thing qosd changed, with what puts it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Entry {
    /// A file's content before qosd wrote it. `best_effort`: writing it
    /// back may fail harmlessly (e.g. `scaling_setspeed` reads
    /// `<unsupported>` outside the userspace governor).
    File {
        resource: Resource,
        path: PathBuf,
        original: String,
        #[serde(default)]
        best_effort: bool,
    },
    /// Per-thread CPU affinity of a process. Threads not listed (created
    /// later) get the main thread's original.
    Affinity {
        resource: Resource,
        pid: i32,
        start_time: u64,
        threads: Vec<(i32, String)>,
    },
    /// A directory (cgroup, resctrl group) qosd created: removed on restore.
    CreatedDir { resource: Resource, path: PathBuf },
    /// A process qosd moved to another cgroup; `back_to` is the
    /// `cgroup.procs` of the group it came from.
    Moved {
        resource: Resource,
        pid: i32,
        start_time: u64,
        back_to: PathBuf,
    },
    /// A controller qosd enabled in a cgroup2 `cgroup.subtree_control`
    /// (`path`) so that its groups under it can use it: restoring writes
    /// `-controller` (after the groups are gone).
    EnabledController {
        resource: Resource,
        path: PathBuf,
        controller: String,
    },
    /// An external command that puts a setting back (pqos, cpupower).
    Command {
        resource: Resource,
        key: String,
        argv: Vec<String>,
    },
}

impl Entry {
    /// Only the first entry per key is kept: it holds the true original.
    pub fn key(&self) -> String {
        match self {
            Entry::File { path, .. } => format!("file:{}", path.display()),
            Entry::Affinity { pid, .. } => format!("affinity:{pid}"),
            Entry::CreatedDir { path, .. } => format!("dir:{}", path.display()),
            Entry::Moved { pid, back_to, .. } => format!("moved:{pid}:{}", back_to.display()),
            Entry::EnabledController {
                path, controller, ..
            } => format!("controller:{}:{controller}", path.display()),
            Entry::Command { key, .. } => format!("command:{key}"),
        }
    }

    pub fn resource(&self) -> Resource {
        match self {
            Entry::File { resource, .. }
            | Entry::Affinity { resource, .. }
            | Entry::CreatedDir { resource, .. }
            | Entry::Moved { resource, .. }
            | Entry::EnabledController { resource, .. }
            | Entry::Command { resource, .. } => *resource,
        }
    }

    /// Puts this entry's original back. `dry_run` logs instead.
    pub fn undo(&self, root: &Root, dry_run: bool) -> Result<Vec<Change>> {
        statefile::check_entry(root, self)?;
        let mut out = Vec::new();
        match self {
            Entry::File {
                resource,
                path,
                original,
                best_effort,
            } => {
                let now = read_file(path).unwrap_or_default();
                if !dry_run {
                    match write_file(path, original, false) {
                        Ok(()) => {}
                        Err(e) if *best_effort => {
                            tracing::debug!("restoring {} skipped: {e}", path.display())
                        }
                        Err(e) => return Err(e),
                    }
                }
                out.push(Change::new(*resource, root.show(path), now, original));
            }
            Entry::Affinity {
                resource,
                pid,
                start_time,
                threads,
            } => {
                if !proc::same_process(root, *pid, *start_time) {
                    tracing::info!("pid {pid} is gone: its affinity needs no restore");
                    return Ok(out);
                }
                let main = threads
                    .iter()
                    .find(|(t, _)| t == pid)
                    .or(threads.first())
                    .map(|(_, c)| c.clone())
                    .unwrap_or_default();
                for tid in proc::tids(root, *pid).unwrap_or_default() {
                    let want = threads
                        .iter()
                        .find(|(t, _)| *t == tid)
                        .map(|(_, c)| c.clone())
                        .unwrap_or_else(|| main.clone());
                    let cpus = qosd_core::cpulist::parse(&want)?;
                    let now = proc::get_affinity(tid).map(|c| qosd_core::cpulist::format(&c));
                    if !dry_run {
                        match proc::set_affinity(tid, &cpus) {
                            Ok(()) => {}
                            // The thread exited meanwhile.
                            Err(Error::Sys {
                                source: nix::Error::ESRCH,
                                ..
                            }) => continue,
                            Err(e) => return Err(e),
                        }
                    }
                    out.push(Change::new(
                        *resource,
                        format!("pid {pid} thread {tid} affinity"),
                        now.unwrap_or_default(),
                        want,
                    ));
                }
            }
            Entry::CreatedDir { resource, path } => {
                if !path.exists() {
                    return Ok(out);
                }
                if !dry_run {
                    remove_group_dir(path)?;
                }
                out.push(Change::new(
                    *resource,
                    root.show(path),
                    "created",
                    "removed",
                ));
            }
            Entry::Moved {
                resource,
                pid,
                start_time,
                back_to,
            } => {
                if !proc::same_process(root, *pid, *start_time) {
                    return Ok(out);
                }
                if !dry_run {
                    match write_file(back_to, &format!("{pid}\n"), false) {
                        Ok(()) => {}
                        // Exited between the check and the write.
                        Err(Error::Io { ref source, .. })
                            if source.raw_os_error() == Some(libc::ESRCH) => {}
                        Err(e) => return Err(e),
                    }
                }
                out.push(Change::new(
                    *resource,
                    format!("pid {pid} cgroup"),
                    "qosd group",
                    root.show(back_to.parent().unwrap_or(back_to)),
                ));
            }
            Entry::EnabledController {
                resource,
                path,
                controller,
            } => {
                let now = read_file(path).unwrap_or_default();
                if !now.split_whitespace().any(|c| c == controller) {
                    return Ok(out);
                }
                if !dry_run {
                    match write_file(path, &format!("-{controller}"), false) {
                        Ok(()) => {}
                        // Groups qosd did not make use it now: disabling it
                        // would take it from them, so it stays, and says so.
                        Err(Error::Io { ref source, .. })
                            if source.raw_os_error() == Some(libc::EBUSY) =>
                        {
                            tracing::warn!(
                                "{controller} stays enabled in {}: other groups use it now",
                                root.show(path)
                            );
                            return Ok(out);
                        }
                        Err(e) => return Err(e),
                    }
                }
                out.push(Change::new(
                    *resource,
                    root.show(path),
                    now.trim(),
                    format!("-{controller}"),
                ));
            }
            Entry::Command { resource, argv, .. } => {
                if !dry_run {
                    crate::tool::run(argv)?;
                }
                out.push(Change::new(*resource, argv.join(" "), "", "run"));
            }
        }
        Ok(out)
    }
}

/// Removes a cgroup or resctrl group qosd made. On the kernel's filesystems
/// rmdir removes the control files with it; on a plain directory (a fake
/// tree in tests) the files qosd wrote there are removed first, as the
/// kernel would.
fn remove_group_dir(path: &Path) -> Result<()> {
    match std::fs::remove_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        // A cgroup still holding processes qosd did not move there itself
        // (children the app forked later): they go to the parent group,
        // then the group can go.
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) && path.join("cgroup.procs").exists() => {
            let procs = read_file(&path.join("cgroup.procs"))?;
            let parent = path.parent().unwrap_or(path).join("cgroup.procs");
            for pid in procs.lines().map(str::trim).filter(|l| !l.is_empty()) {
                match write_file(&parent, &format!("{pid}\n"), false) {
                    Err(Error::Io { ref source, .. })
                        if source.raw_os_error() == Some(libc::ESRCH) => {}
                    r => r?,
                }
            }
            std::fs::remove_dir(path).map_err(|e| Error::io("removing", path, e))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) && !proc::on_kernel_fs(path) => {
            std::fs::remove_dir_all(path).map_err(|e| Error::io("removing", path, e))
        }
        Err(e) => Err(Error::io("removing", path, e)),
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    version: u32,
    /// The root prefix the paths were recorded under.
    root: PathBuf,
    entries: Vec<Entry>,
}

/// The in-memory journal, mirrored to the state file after every append.
#[derive(Debug)]
pub struct Journal {
    root: Root,
    state_file: Option<PathBuf>,
    entries: Vec<Entry>,
    dry_run: bool,
    // Held for the journal's life: one qosd per state file.
    _lock: Option<Flock<File>>,
}

impl Journal {
    /// Opens (or starts) the journal at `state_file`, taking its lock.
    /// Entries already there (from `qosd set` or a crashed run) are kept,
    /// so a later restore puts back the very first originals.
    pub fn open(root: Root, state_file: Option<PathBuf>, dry_run: bool) -> Result<Self> {
        let mut j = Journal {
            root,
            state_file,
            entries: Vec::new(),
            dry_run,
            _lock: None,
        };
        let Some(path) = j.state_file.clone() else {
            return Ok(j);
        };
        if !dry_run {
            statefile::check_dir(&path)?;
            j._lock = Some(lock(&path)?);
        }
        if path.exists() {
            statefile::check_trusted(&path)?;
            let sf = load(&path)?;
            if sf.root != j.root.dir() {
                return Err(Error::State {
                    path,
                    message: format!(
                        "recorded for root {}, not {}; run `qosd restore --root {}` first",
                        sf.root.display(),
                        j.root.dir().display(),
                        sf.root.display()
                    ),
                });
            }
            j.entries = sf.entries;
        }
        Ok(j)
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn root(&self) -> &Root {
        &self.root
    }

    pub fn has(&self, key: &str) -> bool {
        self.entries.iter().any(|e| e.key() == key)
    }

    /// Appends `e` unless its key is already recorded, then persists.
    /// Returns whether it was added.
    pub fn record(&mut self, e: Entry) -> Result<bool> {
        if self.has(&e.key()) {
            return Ok(false);
        }
        self.entries.push(e);
        self.persist()?;
        Ok(true)
    }

    /// Drops entries from `len` on (a rolled-back change) and persists.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        self.entries.truncate(len);
        self.persist()
    }

    fn persist(&self) -> Result<()> {
        let Some(path) = &self.state_file else {
            return Ok(());
        };
        if self.dry_run {
            return Ok(());
        }
        if self.entries.is_empty() {
            return match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Error::io("removing", path, e))
                }
                _ => Ok(()),
            };
        }
        let sf = StateFile {
            version: 1,
            root: self.root.dir().to_owned(),
            entries: self.entries.clone(),
        };
        let text = serde_json::to_string_pretty(&sf).map_err(|e| Error::State {
            path: path.clone(),
            message: e.to_string(),
        })?;
        // Write then rename: a crash mid-write never leaves half a file.
        statefile::write_atomic(path, &(text + "\n"))
    }

    /// Restores entries matching `which`, newest first; removes them from
    /// the journal when they succeed. Keeps going past failures and returns
    /// them all.
    pub fn restore_where(&mut self, which: impl Fn(&Entry) -> bool) -> (Vec<Change>, Vec<Error>) {
        let mut changes = Vec::new();
        let mut errors = Vec::new();
        let all = std::mem::take(&mut self.entries);
        let mut keep = Vec::new();
        for e in all.iter().rev() {
            if !which(e) {
                keep.push(e.clone());
                continue;
            }
            match e.undo(&self.root, self.dry_run) {
                Ok(c) => changes.extend(c),
                Err(err) => {
                    errors.push(err);
                    keep.push(e.clone());
                }
            }
        }
        if self.dry_run {
            // Nothing was restored: the journal stays as it was.
            self.entries = all;
            return (changes, errors);
        }
        keep.reverse();
        self.entries = keep;
        if let Err(e) = self.persist() {
            errors.push(e);
        }
        (changes, errors)
    }
}

fn lock(state: &Path) -> Result<Flock<File>> {
    let f = statefile::open_lock(&state.with_extension("lock"))?;
    Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| Error::State {
        path: state.to_owned(),
        message: format!(
            "locked by another running qosd ({errno}); stop it first or use another --state-file"
        ),
    })
}

fn load(path: &Path) -> Result<StateFile> {
    let text = read_file(path)?;
    serde_json::from_str(&text).map_err(|e| Error::State {
        path: path.to_owned(),
        message: format!("not a qosd state file: {e}"),
    })
}

/// `qosd restore`: replays a state file (root recorded in it) and removes
/// it. Missing file: nothing to do. What could not be restored stays in
/// the file and is returned as the error.
pub fn restore_state_file(path: &Path, dry_run: bool) -> Result<Vec<Change>> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(Vec::new());
    }
    statefile::check_trusted(path)?;
    let sf = load(path)?;
    let mut j = Journal::open(Root::new(sf.root), Some(path.to_owned()), dry_run)?;
    let (changes, mut errors) = j.restore_where(|_| true);
    match errors.len() {
        0 => Ok(changes),
        1 => Err(errors.remove(0)),
        n => Err(Error::State {
            path: path.to_owned(),
            message: format!(
                "{n} entries could not be restored: {}",
                errors
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        }),
    }
}
