//! The CPU topology files of `/sys/devices/system/cpu`, read in one
//! place: the lists of online and possible CPUs, and each CPU's package
//! and hyperthread siblings. The actuators group online CPUs into physical
//! cores from these; power attribution places CPUs on sockets.

use super::{Root, SysError};
use crate::cpulist;

const BASE: &str = "/sys/devices/system/cpu";

/// Which CPU list of `/sys/devices/system/cpu` to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuSet {
    Online,
    Possible,
}

/// A file holding a kernel CPU list ("0-3,8"), parsed.
pub fn read_list(root: &Root, abs: &str) -> Result<Vec<u32>, SysError> {
    let s = root.read(abs)?;
    cpulist::parse(s.trim()).map_err(|e| SysError::Parse {
        path: root.path(abs),
        what: e.to_string(),
    })
}

/// The online or possible CPUs.
pub fn list(root: &Root, set: CpuSet) -> Result<Vec<u32>, SysError> {
    let name = match set {
        CpuSet::Online => "online",
        CpuSet::Possible => "possible",
    };
    read_list(root, &format!("{BASE}/{name}"))
}

/// True when `cpu` has a `topology/` directory (it is online, or at least
/// was brought up once).
pub fn has_topology(root: &Root, cpu: u32) -> bool {
    root.exists(format!("{BASE}/cpu{cpu}/topology"))
}

/// The hyperthread siblings of `cpu` (itself included), from
/// `topology/thread_siblings_list`.
pub fn siblings(root: &Root, cpu: u32) -> Result<Vec<u32>, SysError> {
    read_list(
        root,
        &format!("{BASE}/cpu{cpu}/topology/thread_siblings_list"),
    )
}

/// The `physical_package_id` of `cpu`; -1 (some virtual machines) reads
/// as package 0.
pub fn package(root: &Root, cpu: u32) -> Result<u32, SysError> {
    let abs = format!("{BASE}/cpu{cpu}/topology/physical_package_id");
    let s = root.read_trim(&abs)?;
    let id: i64 = s.parse().map_err(|_| SysError::Parse {
        path: root.path(&abs),
        what: format!("package id {s:?}"),
    })?;
    Ok(id.max(0) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_machine_and_names_bad_files() {
        let r = Root::default();
        let online = list(&r, CpuSet::Online).unwrap();
        assert!(!online.is_empty());
        assert!(list(&r, CpuSet::Possible).unwrap().len() >= online.len());
        assert!(has_topology(&r, online[0]));
        assert!(siblings(&r, online[0]).unwrap().contains(&online[0]));
        let d = tempfile::tempdir().unwrap();
        let f = Root::new(d.path());
        std::fs::create_dir_all(f.path("/sys/devices/system/cpu/cpu0/topology")).unwrap();
        std::fs::write(f.path("/sys/devices/system/cpu/online"), "0-x\n").unwrap();
        let e = list(&f, CpuSet::Online).unwrap_err().to_string();
        assert!(
            e.contains("system/cpu/online") && e.contains("cannot parse"),
            "{e}"
        );
        std::fs::write(
            f.path("/sys/devices/system/cpu/cpu0/topology/physical_package_id"),
            "-1\n",
        )
        .unwrap();
        assert_eq!(package(&f, 0).unwrap(), 0);
        assert!(siblings(&f, 0).unwrap_err().is_gone());
    }
}
