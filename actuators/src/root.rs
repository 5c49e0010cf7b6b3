//! Reads and writes of the knob files, at paths already under the root
//! prefix ([`Root`], `qosd_core::sys`'s, which every `/sys`, `/proc`,
//! cgroup and resctrl path goes through, so that tests run the very same
//! code on a fake tree in a tempdir).

use std::path::Path;

pub use qosd_core::sys::Root;

use crate::error::{Error, Result};

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
