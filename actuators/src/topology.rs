//! CPU topology (online CPUs grouped into physical cores by their
//! hyperthread siblings, as `qosd_core::sys::cpus` reads them) and the core allocator, which hands out whole
//! physical cores so two apps never share a core's hyperthreads.

use crate::error::{Error, Result};
use crate::root::Root;
use qosd_core::{cpulist, sys};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Online logical CPUs, sorted.
    pub cpus: Vec<u32>,
    /// Physical cores: each the sorted list of its hyperthread siblings,
    /// ordered by their first CPU.
    pub cores: Vec<Vec<u32>>,
}

impl Topology {
    /// Reads the online CPUs and each one's hyperthread siblings under
    /// `root` (`qosd_core::sys::cpus`). A CPU without a siblings file is
    /// its own core.
    pub fn read(root: &Root) -> Result<Self> {
        let cpus = sys::cpus::list(root, sys::cpus::CpuSet::Online)?;
        let groups = cpus
            .iter()
            .map(|&c| sys::cpus::siblings(root, c).unwrap_or_else(|_| vec![c]))
            .collect();
        Ok(Self::from_groups(&cpus, groups))
    }

    /// Builds a topology from sibling groups (tests, the simulator).
    /// Siblings that are not online are dropped.
    pub fn from_groups(cpus: &[u32], groups: Vec<Vec<u32>>) -> Self {
        let mut cpus = cpus.to_vec();
        cpus.sort_unstable();
        cpus.dedup();
        let mut cores: Vec<Vec<u32>> = Vec::new();
        for mut g in groups {
            g.retain(|c| cpus.contains(c));
            g.sort_unstable();
            g.dedup();
            if !g.is_empty() && !cores.contains(&g) {
                cores.push(g);
            }
        }
        // Online CPUs no group mentions are their own core.
        for &c in &cpus {
            if !cores.iter().any(|g| g.contains(&c)) {
                cores.push(vec![c]);
            }
        }
        cores.sort();
        Topology { cpus, cores }
    }

    /// Index of the physical core holding `cpu`.
    pub fn core_of(&self, cpu: u32) -> Option<usize> {
        self.cores.iter().position(|g| g.contains(&cpu))
    }

    /// Fails unless every CPU is online; names the first that is not.
    pub fn check_cpus(&self, cpus: &[u32]) -> Result<()> {
        if cpus.is_empty() {
            return Err(Error::Invalid("empty CPU list".into()));
        }
        match cpus.iter().find(|c| !self.cpus.contains(c)) {
            Some(c) => Err(Error::Invalid(format!(
                "CPU {c} is not online (online CPUs: {})",
                cpulist::format(&self.cpus)
            ))),
            None => Ok(()),
        }
    }

    /// The physical cores two CPU lists share (by core index).
    pub fn shared_cores(&self, a: &[u32], b: &[u32]) -> Vec<usize> {
        let mut v: Vec<usize> = a
            .iter()
            .filter_map(|&c| self.core_of(c))
            .filter(|i| b.iter().any(|&d| self.core_of(d) == Some(*i)))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Gives each request its number of whole physical cores, in order, from
/// the lowest core up. Fails when they do not all fit.
pub fn allocate_cores<K: Clone>(
    topo: &Topology,
    requests: &[(K, usize)],
) -> Result<Vec<(K, Vec<u32>)>> {
    let want: usize = requests.iter().map(|(_, n)| n).sum();
    if want > topo.cores.len() {
        return Err(Error::Invalid(format!(
            "{want} cores asked for, the machine has {} physical cores",
            topo.cores.len()
        )));
    }
    let mut next = 0;
    Ok(requests
        .iter()
        .map(|(k, n)| {
            let mut cpus: Vec<u32> = topo.cores[next..next + n].concat();
            cpus.sort_unstable();
            next += n;
            (k.clone(), cpus)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn smt_topology(nr_cores: u32, smt: u32, interleaved: bool) -> Topology {
        let n = nr_cores * smt;
        let cpus: Vec<u32> = (0..n).collect();
        let groups = (0..nr_cores)
            .map(|c| {
                (0..smt)
                    .map(|t| {
                        if interleaved {
                            c + t * nr_cores
                        } else {
                            c * smt + t
                        }
                    })
                    .collect()
            })
            .collect();
        Topology::from_groups(&cpus, groups)
    }

    #[test]
    fn reads_fake_sysfs() {
        let d = tempfile::tempdir().unwrap();
        let r = Root::new(d.path());
        std::fs::create_dir_all(r.path("/sys/devices/system/cpu")).unwrap();
        std::fs::write(r.path("/sys/devices/system/cpu/online"), "0-3\n").unwrap();
        for (c, s) in [(0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")] {
            let dir = r.path(format!("/sys/devices/system/cpu/cpu{c}/topology"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("thread_siblings_list"), format!("{s}\n")).unwrap();
        }
        let t = Topology::read(&r).unwrap();
        assert_eq!(t.cores, vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(t.shared_cores(&[0], &[2]), vec![0]);
        assert!(t.shared_cores(&[0, 2], &[1]).is_empty());
        assert!(t
            .check_cpus(&[4])
            .unwrap_err()
            .to_string()
            .contains("CPU 4 is not online"));
    }

    #[test]
    fn this_machine_topology_is_readable() {
        let t = Topology::read(&Root::default()).unwrap();
        assert!(!t.cpus.is_empty());
        assert_eq!(t.cores.concat().len(), t.cpus.len());
    }

    proptest! {
        #[test]
        fn allocator_never_shares_a_core(
            nr_cores in 1u32..16, smt in 1u32..4, interleaved: bool,
            reqs in proptest::collection::vec(0usize..6, 0..6),
        ) {
            let topo = smt_topology(nr_cores, smt, interleaved);
            let requests: Vec<(usize, usize)> = reqs.iter().copied().enumerate().collect();
            let total: usize = reqs.iter().sum();
            match allocate_cores(&topo, &requests) {
                Err(_) => prop_assert!(total > nr_cores as usize),
                Ok(got) => {
                    prop_assert!(total <= nr_cores as usize);
                    let mut seen = Vec::new();
                    for (i, (k, cpus)) in got.iter().enumerate() {
                        prop_assert_eq!(*k, i);
                        prop_assert_eq!(cpus.len(), reqs[i] * smt as usize);
                        for c in cpus {
                            prop_assert!(topo.cpus.contains(c));
                            prop_assert!(!seen.contains(c), "CPU {} given twice", c);
                            seen.push(*c);
                        }
                        for (j, (_, other)) in got.iter().enumerate() {
                            if i != j {
                                prop_assert!(topo.shared_cores(cpus, other).is_empty());
                            }
                        }
                    }
                }
            }
        }
    }
}
