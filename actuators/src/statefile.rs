//! Trusting the state file. Root replays it (`qosd restore`, a restart):
//! it writes recorded originals back and removes recorded groups, so a file
//! another user could write or plant would let them steer root. Here: the
//! file is read only when it is a regular file owned by qosd's user and not
//! writable by group or others; it is written through a fresh temp file
//! (`O_EXCL|O_NOFOLLOW`, mode 0600) in a directory no other user can write
//! (or a sticky one). Which entries it may ask to undo: `journal/trust.rs`.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::error::{Error, Result};

fn refuse(path: &Path, message: String) -> Error {
    Error::State {
        path: path.to_owned(),
        message,
    }
}

/// Owned by root or by the user qosd runs as.
fn owner_ok(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

/// Fails unless `path` (which exists) is a regular file, not a symlink,
/// owned by root (or qosd's user) and not writable by group or others.
pub fn check_trusted(path: &Path) -> Result<()> {
    let m = std::fs::symlink_metadata(path).map_err(|e| Error::io("reading", path, e))?;
    if m.file_type().is_symlink() {
        return Err(refuse(
            path,
            "is a symbolic link: refusing to follow it (a state file is a plain file)".into(),
        ));
    }
    if !m.is_file() {
        return Err(refuse(path, "is not a regular file".into()));
    }
    if !owner_ok(m.uid()) {
        return Err(refuse(
            path,
            format!(
                "owned by uid {}, not root: refusing to trust it (another user could have written it)",
                m.uid()
            ),
        ));
    }
    let mode = m.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(refuse(
            path,
            format!(
                "writable by group or others (mode {mode:04o}): refusing to trust it; \
                 check its content, then `chmod go-w {}`",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// Creates the state file's directory (mode 0755) if needed, and fails
/// unless it is owned by root (or qosd's user) and either writable by no
/// one else or sticky (like /tmp, where others cannot replace our files).
pub fn check_dir(state: &Path) -> Result<()> {
    let Some(dir) = state.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| Error::io("creating", dir, e))?;
    }
    let m = std::fs::metadata(dir).map_err(|e| Error::io("reading", dir, e))?;
    let mode = m.permissions().mode();
    let shared = mode & 0o022 != 0 && mode & 0o1000 == 0;
    if !owner_ok(m.uid()) || shared {
        return Err(refuse(
            state,
            format!(
                "its directory {} is owned by uid {} with mode {:04o}: put the state file in a \
                 directory only root can write (e.g. /run/qosd)",
                dir.display(),
                m.uid(),
                mode & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Opens (creating, mode 0600) the lock file beside the state file without
/// following a symlink planted there.
pub fn open_lock(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io("opening", path, e))
}

/// Writes `text` to `path` atomically: a new temp file beside it, created
/// exclusively without following links (a symlink planted at the temp name
/// is removed, never written through), then renamed over `path`.
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let mut name = path.file_name().unwrap_or(OsStr::new("state")).to_owned();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    // A leftover of a crash, or something planted: unlink removes a link
    // itself, not its target.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(Error::io("removing", &tmp, e))
        }
        _ => {}
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(|e| Error::io("creating", &tmp, e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io("writing", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io("renaming to", path, e))
}
