//! The one reader of the machine's `/proc` and `/sys`: the root prefix
//! every path goes through ([`Root`]: `/` on a real machine, a tempdir in
//! tests, so the very same code reads a fake tree), `/proc/PID/stat`
//! ([`stat`]), process trees ([`tree`]) and the CPU topology files
//! ([`cpus`]). Sensors and actuators build their own views on these.

pub mod cpus;
pub mod sockets;
pub mod stat;
pub mod tree;

use std::path::{Path, PathBuf};

/// A failed read under the root, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `what` names what could not be parsed ("package id \"x\"").
    #[error("{}: cannot parse {what}", path.display())]
    Parse { path: PathBuf, what: String },
}

impl SysError {
    /// The process (or file) is gone: "no such file" or "no such process".
    /// Any other error (out of descriptors, out of memory) says nothing
    /// about whether it exists.
    pub fn is_gone(&self) -> bool {
        matches!(self, SysError::Io { source, .. } if gone(source))
    }
}

/// This process's effective capabilities (`CapEff` of /proc/self/status,
/// a bit per `CAP_*` number); `None` when unreadable. Always the real
/// process's, not a [`Root`]'s: it is what the kernel checks.
pub fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// True for the errors a vanished process's `/proc` files give.
pub fn gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// A filesystem root: `/` on a real machine, a tempdir in tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root(PathBuf);

impl Default for Root {
    fn default() -> Self {
        Root(PathBuf::from("/"))
    }
}

impl Root {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Root(dir.into())
    }

    /// The directory itself.
    pub fn dir(&self) -> &Path {
        &self.0
    }

    /// True for the real machine root.
    pub fn is_real(&self) -> bool {
        self.0 == Path::new("/")
    }

    /// Maps an absolute machine path ("/sys/...") under this root.
    pub fn path(&self, abs: impl AsRef<Path>) -> PathBuf {
        let abs = abs.as_ref();
        self.0.join(abs.strip_prefix("/").unwrap_or(abs))
    }

    /// Shows a prefixed path as the machine path it stands for, for messages
    /// that should read the same on a fake tree ("/sys/..." not "/tmp/x/sys/...").
    pub fn show(&self, p: &Path) -> String {
        match p.strip_prefix(&self.0) {
            Ok(rel) if !self.is_real() => format!("/{}", rel.display()),
            _ => p.display().to_string(),
        }
    }

    /// Reads a (small) file under the root, naming the path on failure.
    pub fn read(&self, abs: impl AsRef<Path>) -> Result<String, SysError> {
        let p = self.path(abs);
        std::fs::read_to_string(&p).map_err(|source| SysError::Io {
            op: "reading",
            path: p,
            source,
        })
    }

    /// Reads a file and trims the trailing newline.
    pub fn read_trim(&self, abs: impl AsRef<Path>) -> Result<String, SysError> {
        Ok(self.read(abs)?.trim().to_owned())
    }

    pub fn exists(&self, abs: impl AsRef<Path>) -> bool {
        self.path(abs).exists()
    }

    /// The numeric entries of a `/proc` directory (`/proc` itself: pids;
    /// `/proc/PID/task`: tids), unsorted; empty when it cannot be listed.
    pub fn numbered(&self, abs: impl AsRef<Path>) -> Vec<i32> {
        let Ok(rd) = std::fs::read_dir(self.path(abs)) else {
            return Vec::new();
        };
        rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_absolute_paths() {
        let r = Root::new("/tmp/fake");
        assert_eq!(
            r.path("/sys/fs/cgroup"),
            PathBuf::from("/tmp/fake/sys/fs/cgroup")
        );
        assert_eq!(r.show(&r.path("/sys/x")), "/sys/x");
        assert_eq!(Root::default().path("/proc/1"), PathBuf::from("/proc/1"));
    }

    #[test]
    fn a_missing_file_is_gone_and_named() {
        let d = tempfile::tempdir().unwrap();
        let e = Root::new(d.path()).read("/proc/1/stat").unwrap_err();
        assert!(e.is_gone());
        assert!(e.to_string().contains("proc/1/stat"), "{e}");
        let me = std::process::id() as i32;
        assert!(Root::default().numbered("/proc").contains(&me));
    }
}
