//! CPU topology for attribution: which socket each CPU is on and its SMT
//! sibling, from the topology files as `qosd_core::sys::cpus` reads them
//! under the root prefix, so that tests can describe any machine in a
//! temp dir.

use std::path::Path;

use qosd_core::sys::{cpus, Root};

use super::PowerError;

/// One logical CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cpu {
    /// Index into [`CpuPackages::sockets`].
    pub socket: usize,
    /// The other hardware thread of the same core, if the core has two.
    pub sibling: Option<u32>,
    /// False for possible-but-offline CPUs (no topology directory).
    pub online: bool,
}

/// Logical CPUs 0..n (index = CPU number) and the sockets (packages)
/// they sit on: what power attribution needs. Not the actuators'
/// `Topology`, which groups online CPUs into physical cores for the core
/// allocator; both read `sys/devices/system/cpu` through
/// `qosd_core::sys::cpus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuPackages {
    pub cpus: Vec<Cpu>,
    /// `physical_package_id` of each socket, ascending.
    pub sockets: Vec<u32>,
    /// Cores with more than two hardware threads (eq. (1) assumes two):
    /// their CPUs are treated as having no sibling.
    pub nr_wide_smt_cores: usize,
}

pub(crate) fn read_trimmed(path: &Path) -> Result<String, PowerError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|source| PowerError::Io {
            path: path.to_owned(),
            source,
        })
}

/// A file holding a kernel CPU list (`possible`, `thread_siblings_list`,
/// a PMU's `cpumask`).
pub(crate) fn read_cpu_list(path: &Path) -> Result<Vec<u32>, PowerError> {
    let list = read_trimmed(path)?;
    qosd_core::cpulist::parse(&list).map_err(|e| PowerError::Parse {
        path: path.to_owned(),
        what: e.to_string(),
    })
}

impl CpuPackages {
    /// Reads the possible CPUs and each one's package and siblings under
    /// `root` (`qosd_core::sys::cpus`); a CPU without a `topology/`
    /// directory is offline.
    pub fn read(root: &Root) -> Result<CpuPackages, PowerError> {
        let ids = cpus::list(root, cpus::CpuSet::Possible)?;
        let n = ids.iter().max().map_or(0, |m| *m as usize + 1);
        let mut packages = vec![None; n];
        let mut siblings = vec![None; n];
        let mut wide = 0;
        for cpu in ids {
            if !cpus::has_topology(root, cpu) {
                continue; // offline
            }
            packages[cpu as usize] = Some(cpus::package(root, cpu)?);
            let sibs = cpus::siblings(root, cpu)?;
            match sibs.as_slice() {
                [a, b] => siblings[cpu as usize] = Some(if *a == cpu { *b } else { *a }),
                [_] | [] => {}
                _ => {
                    if sibs.first() == Some(&cpu) {
                        wide += 1;
                    }
                }
            }
        }
        let mut sockets: Vec<u32> = packages.iter().flatten().copied().collect();
        sockets.sort_unstable();
        sockets.dedup();
        if sockets.is_empty() {
            sockets.push(0);
        }
        let cpus = (0..n)
            .map(|i| Cpu {
                socket: packages[i]
                    .and_then(|p| sockets.iter().position(|s| *s == p))
                    .unwrap_or(0),
                sibling: siblings[i].filter(|s| (*s as usize) < n),
                online: packages[i].is_some(),
            })
            .collect();
        Ok(CpuPackages {
            cpus,
            sockets,
            nr_wide_smt_cores: wide,
        })
    }

    /// Index of the socket with this `physical_package_id`.
    pub fn socket_index(&self, package_id: u32) -> Option<usize> {
        self.sockets.iter().position(|s| *s == package_id)
    }

    /// Socket index of a CPU (0 for CPUs beyond the topology).
    pub fn socket_of(&self, cpu: usize) -> usize {
        self.cpus.get(cpu).map_or(0, |c| c.socket)
    }

    /// True when some core has two hardware threads.
    pub fn has_smt(&self) -> bool {
        self.cpus.iter().any(|c| c.sibling.is_some())
    }

    /// Online CPUs on each socket.
    pub fn cpus_per_socket(&self) -> Vec<usize> {
        let mut n = vec![0; self.sockets.len()];
        for c in self.cpus.iter().filter(|c| c.online) {
            n[c.socket] += 1;
        }
        n
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::fs;

    /// Writes a fake `sys/devices/system/cpu` with `per_socket` cores per
    /// socket, each with `smt` hardware threads (Linux numbering: CPU
    /// `t * nr_cores + core`).
    pub fn fake_cpus(root: &Path, sockets: u32, per_socket: u32, smt: u32) {
        let base = root.join("sys/devices/system/cpu");
        let cores = sockets * per_socket;
        let n = cores * smt;
        fs::create_dir_all(&base).unwrap();
        fs::write(base.join("possible"), format!("0-{}\n", n - 1)).unwrap();
        for cpu in 0..n {
            let core = cpu % cores;
            let t = base.join(format!("cpu{cpu}/topology"));
            fs::create_dir_all(&t).unwrap();
            fs::write(
                t.join("physical_package_id"),
                format!("{}\n", core / per_socket),
            )
            .unwrap();
            let sibs: Vec<String> = (0..smt).map(|k| (k * cores + core).to_string()).collect();
            fs::write(t.join("thread_siblings_list"), sibs.join(",") + "\n").unwrap();
        }
    }

    #[test]
    fn two_sockets_with_smt() {
        let d = tempfile::tempdir().unwrap();
        fake_cpus(d.path(), 2, 2, 2);
        let t = CpuPackages::read(&Root::new(d.path())).unwrap();
        assert_eq!(t.cpus.len(), 8);
        assert_eq!(t.sockets, vec![0, 1]);
        assert_eq!(t.cpus[0].sibling, Some(4));
        assert_eq!(t.cpus[4].sibling, Some(0));
        assert_eq!(t.cpus[3].socket, 1);
        assert_eq!(t.cpus[7].socket, 1);
        assert!(t.has_smt());
        assert_eq!(t.cpus_per_socket(), vec![4, 4]);
    }

    #[test]
    fn this_machine_reads() {
        let t = CpuPackages::read(&Root::default()).unwrap();
        assert!(!t.cpus.is_empty());
        assert!(t.cpus.iter().any(|c| c.online));
    }
}
