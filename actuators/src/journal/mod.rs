//! The record of originals. Before qosd first changes anything it appends
//! what it found to this journal and writes the journal to the state file,
//! so that after a SIGKILL the next start (or `qosd restore`) can put every
//! knob back. Restoring replays the entries newest first.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::ctx::dry::Dry;
use crate::error::{Error, Result};
use crate::root::Root;
use crate::{statefile, Change};

mod entry;
mod trust;
mod undo;
pub use entry::Entry;

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
        self.restore_with(which, &mut Dry::default())
    }

    /// [`Journal::restore_where`]; a dry run reads and keeps what it has
    /// done in `dry`, and drops the entries it restored from memory only
    /// (the state file is not written), as a real run drops them.
    pub fn restore_with(
        &mut self,
        which: impl Fn(&Entry) -> bool,
        dry: &mut Dry,
    ) -> (Vec<Change>, Vec<Error>) {
        let mut changes = Vec::new();
        let mut errors = Vec::new();
        let all = std::mem::take(&mut self.entries);
        let mut keep = Vec::new();
        for e in all.iter().rev() {
            if !which(e) {
                keep.push(e.clone());
                continue;
            }
            match e.undo(&self.root, self.dry_run.then_some(&mut *dry)) {
                Ok(c) => changes.extend(c),
                Err(err) => {
                    errors.push(err);
                    keep.push(e.clone());
                }
            }
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
    let text =
        qosd_core::yamlfile::read_kind(path, qosd_core::yamlfile::Kind::State).map_err(|e| {
            Error::State {
                path: path.to_owned(),
                message: e.msg,
            }
        })?;
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
