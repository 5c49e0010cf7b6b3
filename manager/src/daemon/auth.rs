//! Who may write to the API: whoever can read the token file. The daemon
//! creates it at start if missing (a random 256-bit token, hex, mode 0600,
//! owned by root since qosd runs as root) and refuses one it cannot trust
//! (a symlink, not a regular file, another owner, readable or writable by
//! others). Writes carry it as `Authorization: Bearer <token>`; reads need
//! nothing.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A token file qosd cannot use; the message names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("API token file {path}: {msg}")]
    Untrusted { path: PathBuf, msg: String },
    #[error("API token file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The write credential, held in memory for the daemon's life.
#[derive(Clone)]
pub struct Token {
    secret: String,
    pub path: PathBuf,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("Token").field("path", &self.path).finish()
    }
}

/// Bytes of randomness in a new token (hex: twice as many characters).
const TOKEN_BYTES: usize = 32;

impl Token {
    /// Reads the token at `path`, creating the file first if it is missing.
    /// Returns whether it was created.
    pub fn load_or_create(path: &Path) -> Result<(Token, bool), TokenError> {
        let io = |source| TokenError::Io {
            path: path.to_owned(),
            source,
        };
        let created = match std::fs::symlink_metadata(path) {
            Ok(_) => false,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(path).map_err(io)?,
            Err(e) => return Err(io(e)),
        };
        // O_NOFOLLOW: a symlink planted at the path fails here (ELOOP);
        // O_NONBLOCK: a FIFO is refused by the guard, not waited on.
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(io)?;
        check_trusted(path, &f)?;
        let text =
            crate::yamlfile::read_open(path, f, crate::yamlfile::Kind::Token).map_err(|e| {
                TokenError::Untrusted {
                    path: path.to_owned(),
                    msg: e.msg,
                }
            })?;
        let secret = text.trim().to_owned();
        if secret.len() < 16 || !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::Untrusted {
                path: path.to_owned(),
                msg: "does not hold a token (at least 16 printable characters on one line); \
                      delete it and qosd makes a new one"
                    .into(),
            });
        }
        Ok((
            Token {
                secret,
                path: path.to_owned(),
            },
            created,
        ))
    }

    /// True if an `Authorization` header value carries this token. The
    /// comparison takes the same time wherever the first difference is.
    pub fn accepts(&self, authorization: Option<&[u8]>) -> bool {
        let Some(given) = authorization.and_then(|h| h.strip_prefix(b"Bearer ")) else {
            return false;
        };
        let want = self.secret.as_bytes();
        let given = given.trim_ascii();
        given.len() == want.len()
            && given
                .iter()
                .zip(want)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// Writes a new random token to `path`: into a private temporary file
/// first, then hard-linked into place, so a concurrent reader sees either
/// no file or the whole token, and a racing second daemon's token wins
/// cleanly (link fails with EEXIST; both then read the one in place).
fn create(path: &Path) -> std::io::Result<bool> {
    let dir = path.parent().unwrap_or_else(|| Path::new("/"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let mut raw = [0u8; TOKEN_BYTES];
    File::open("/dev/urandom")?.read_exact(&mut raw)?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let name = path
        .file_name()
        .map_or("api.token".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let written = f
        .write_all(format!("{hex}\n").as_bytes())
        .and_then(|()| f.sync_all());
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// The API's write credential while the daemon runs: the token in the
/// file now. A file replaced with a new token is read again (the old token
/// stops working), a deleted file is made again with a new token (as at
/// start), and a file qosd cannot trust any more (another owner, readable
/// by others) refuses every write until it is fixed: fail closed, never the
/// old token silently.
pub struct Credential {
    pub path: PathBuf,
    current: std::sync::RwLock<Result<Token, String>>,
}

impl Credential {
    pub fn new(token: Token) -> Credential {
        Credential {
            path: token.path.clone(),
            current: std::sync::RwLock::new(Ok(token)),
        }
    }

    /// True if an `Authorization` header value carries the current token.
    pub fn accepts(&self, authorization: Option<&[u8]>) -> bool {
        match &*self.current.read().unwrap_or_else(|e| e.into_inner()) {
            Ok(t) => t.accepts(authorization),
            Err(_) => false,
        }
    }

    /// Why writes are refused whatever they carry, if they are.
    pub fn unusable(&self) -> Option<String> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .err()
            .cloned()
    }

    /// Reads the file again (making a new token if it is gone); a line
    /// saying what the API accepts from now on.
    fn reload(&self) -> String {
        let next = Token::load_or_create(&self.path);
        let mut cur = self.current.write().unwrap_or_else(|e| e.into_inner());
        let said = match (&*cur, &next) {
            (_, Err(e)) => format!("writes are refused until it is fixed: {e}"),
            (Ok(old), Ok((new, _))) if old.secret == new.secret => {
                "the token in it is unchanged".to_owned()
            }
            (_, Ok((_, true))) => "qosd made a new token in it; writes need the new one".to_owned(),
            (_, Ok(_)) => "writes need the token now in it; the old one is refused".to_owned(),
        };
        *cur = next.map(|(t, _)| t).map_err(|e| e.to_string());
        said
    }
}

/// Watches the token file while the daemon runs: each change is read into
/// the [`Credential`] and said once.
pub struct TokenWatch {
    path: PathBuf,
    last: Option<(u64, u64, i64, i64, u32, u64)>,
}

fn stamp(path: &Path) -> Option<(u64, u64, i64, i64, u32, u64)> {
    let m = std::fs::symlink_metadata(path).ok()?;
    Some((
        m.dev(),
        m.ino(),
        m.mtime(),
        m.mtime_nsec(),
        m.mode(),
        m.len(),
    ))
}

impl TokenWatch {
    pub fn new(path: &Path) -> TokenWatch {
        TokenWatch {
            path: path.to_owned(),
            last: stamp(path),
        }
    }

    /// A line to log when the file changed since the last call, after the
    /// credential has followed the change.
    pub fn changed(&mut self, cred: &Credential) -> Option<String> {
        let now = stamp(&self.path);
        if now == self.last {
            return None;
        }
        let what = match (&self.last, &now) {
            (_, None) => "deleted",
            (None, Some(_)) => "made again",
            (Some(a), Some(b)) if (a.0, a.1) != (b.0, b.1) => "replaced",
            (Some(a), Some(b)) if a.4 != b.4 => "given another mode",
            _ => "rewritten",
        };
        let said = cred.reload();
        // What the reload itself did (a new file made) is no change to say again.
        self.last = stamp(&self.path);
        Some(format!(
            "api: token file {} was {what} while qosd runs: {said}",
            self.path.display()
        ))
    }
}

/// A token file others could read (steal the token) or write (choose it)
/// is refused, as is one owned by another user.
fn check_trusted(path: &Path, f: &File) -> Result<(), TokenError> {
    let bad = |msg: String| TokenError::Untrusted {
        path: path.to_owned(),
        msg,
    };
    let m = f.metadata().map_err(|source| TokenError::Io {
        path: path.to_owned(),
        source,
    })?;
    if !m.file_type().is_file() {
        return Err(bad("is not a regular file".into()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if m.uid() != me {
        return Err(bad(format!(
            "is owned by uid {}, not by qosd's uid {me}: delete it and qosd makes a new one",
            m.uid()
        )));
    }
    if m.mode() & 0o077 != 0 {
        return Err(bad(format!(
            "has mode {:04o}: others may read or change the token; `chmod 600` it \
             (or delete it and qosd makes a new one)",
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn creates_a_private_token_and_reads_it_back() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/api.token");
        let (t, created) = Token::load_or_create(&p).unwrap();
        assert!(created);
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600);
        assert_eq!(t.secret.len(), 2 * TOKEN_BYTES);
        let (again, created) = Token::load_or_create(&p).unwrap();
        assert!(!created);
        assert_eq!(again.secret, t.secret);
        // No temporary file left beside it.
        assert_eq!(std::fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);

        let h = format!("Bearer {}", t.secret);
        assert!(t.accepts(Some(h.as_bytes())));
        assert!(!t.accepts(None));
        assert!(!t.accepts(Some(t.secret.as_bytes())));
        let mut wrong = h.clone().into_bytes();
        let last = wrong.len() - 1;
        wrong[last] ^= 1;
        assert!(!t.accepts(Some(&wrong)));
        assert!(!t.accepts(Some(&h.as_bytes()[..h.len() - 1])));
        assert!(!format!("{t:?}").contains(&t.secret));
    }

    #[test]
    fn refuses_files_others_could_read_or_plant() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("api.token");
        std::fs::write(&p, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Token::load_or_create(&p).unwrap_err().to_string();
        assert!(e.contains("mode 0644") && e.contains("api.token"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Token::load_or_create(&p).is_ok());

        // A symlink at the path (to a file root may read) is not followed.
        let target = d.path().join("elsewhere");
        std::fs::write(&target, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = d.path().join("link.token");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(Token::load_or_create(&link).is_err());

        // Owned by someone else.
        let theirs = d.path().join("theirs.token");
        std::fs::write(&theirs, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).unwrap();
        if nix::unistd::geteuid().is_root() {
            nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            let e = Token::load_or_create(&theirs).unwrap_err().to_string();
            assert!(e.contains("owned by uid 65534"), "{e}");
        }

        // Empty or junk content.
        let empty = d.path().join("empty.token");
        std::fs::write(&empty, "\n").unwrap();
        std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Token::load_or_create(&empty).is_err());
        // A directory.
        let dir = d.path().join("dir.token");
        std::fs::create_dir(&dir).unwrap();
        assert!(Token::load_or_create(&dir).is_err());
    }
}
