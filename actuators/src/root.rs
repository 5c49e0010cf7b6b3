//! The one root prefix every `/sys`, `/proc`, cgroup and resctrl path goes
//! through, so that tests run the very same code on a fake tree in a tempdir.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

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
    pub fn read(&self, abs: impl AsRef<Path>) -> Result<String> {
        read_file(&self.path(abs))
    }

    /// Reads a file and trims the trailing newline.
    pub fn read_trim(&self, abs: impl AsRef<Path>) -> Result<String> {
        Ok(self.read(abs)?.trim().to_owned())
    }

    pub fn exists(&self, abs: impl AsRef<Path>) -> bool {
        self.path(abs).exists()
    }
}

/// Reads a file at an already-prefixed path.
pub fn read_file(p: &Path) -> Result<String> {
    std::fs::read_to_string(p).map_err(|e| Error::io("reading", p, e))
}

/// Writes `value` in a single write(2), as sysfs, cgroupfs and resctrl
/// require. `create` is only for files inside a directory qosd made itself:
/// the kernel populates those on mkdir, a fake tree does not.
pub fn write_file(p: &Path, value: &str, create: bool) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .create(create)
        .open(p)
        .map_err(|e| Error::io("opening for write", p, e))?;
    f.write_all(value.as_bytes())
        .map_err(|e| Error::io("writing", p, e))
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
}
