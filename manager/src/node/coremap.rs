//! Which physical cores each app holds, changed a few at a time. The
//! policy speaks in counts ("memcached: 2 cores"); this map turns counts
//! into CPU lists so that one decision moves one core: an app that keeps
//! its count keeps its CPUs, one that shrinks gives up its highest cores,
//! one that grows takes the lowest free ones. (The actuators'
//! `allocate_cores` lays every app out afresh from core 0, which would
//! move other apps' threads on every change.) Cores are whole physical
//! cores from the [`Topology`], so two apps never share hyperthreads.

use std::collections::BTreeMap;

use qosd_actuators::Topology;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoreMap {
    nr_cores: usize,
    /// Indices into `Topology::cores`, sorted, per app.
    held: BTreeMap<String, Vec<usize>>,
}

impl CoreMap {
    pub fn new(nr_cores: usize) -> Self {
        CoreMap {
            nr_cores,
            held: BTreeMap::new(),
        }
    }

    /// Gives each app in `want` that many cores, keeping what it holds
    /// where it can. Apps not in `want` (or wanting 0) hold none. Fails,
    /// changing nothing, when the counts exceed the node.
    pub fn assign(&mut self, want: &BTreeMap<String, u32>) -> Result<(), String> {
        let total: usize = want.values().map(|&n| n as usize).sum();
        if total > self.nr_cores {
            return Err(format!(
                "{total} cores asked for, the node has {} physical cores",
                self.nr_cores
            ));
        }
        let mut next: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (app, &n) in want {
            if n == 0 {
                continue;
            }
            let mut mine = self.held.get(app).cloned().unwrap_or_default();
            mine.truncate(n as usize); // shrink: the highest go
            next.insert(app.clone(), mine);
        }
        let mut free: Vec<usize> = (0..self.nr_cores)
            .filter(|c| !next.values().any(|v| v.contains(c)))
            .collect();
        free.reverse(); // pop() gives the lowest
        for (app, &n) in want {
            if let Some(mine) = next.get_mut(app) {
                while mine.len() < n as usize {
                    // `total` fits, so a free core is always left.
                    let Some(c) = free.pop() else { break };
                    mine.push(c);
                }
                mine.sort_unstable();
            }
        }
        self.held = next;
        Ok(())
    }

    /// Puts an app back on the cores it held (after a failed apply).
    pub fn set(&mut self, app: &str, cores: Vec<usize>) {
        if cores.is_empty() {
            self.held.remove(app);
        } else {
            self.held.insert(app.to_owned(), cores);
        }
    }

    /// The core indices `app` holds.
    pub fn cores(&self, app: &str) -> Vec<usize> {
        self.held.get(app).cloned().unwrap_or_default()
    }

    /// The logical CPUs of `app`'s cores, sorted.
    pub fn cpus(&self, topo: &Topology, app: &str) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .cores(app)
            .iter()
            .filter_map(|&i| topo.cores.get(i))
            .flatten()
            .copied()
            .collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn want(v: &[(&str, u32)]) -> BTreeMap<String, u32> {
        v.iter().map(|(a, n)| (a.to_string(), *n)).collect()
    }

    #[test]
    fn one_decision_moves_one_core() {
        let mut m = CoreMap::new(4);
        m.assign(&want(&[("a", 1), ("b", 2)])).unwrap();
        assert_eq!((m.cores("a"), m.cores("b")), (vec![0], vec![1, 2]));
        // a grows: b keeps its cores, a takes the lowest free one.
        m.assign(&want(&[("a", 2), ("b", 2)])).unwrap();
        assert_eq!((m.cores("a"), m.cores("b")), (vec![0, 3], vec![1, 2]));
        // b shrinks: gives up its highest.
        m.assign(&want(&[("a", 2), ("b", 1)])).unwrap();
        assert_eq!(m.cores("b"), vec![1]);
        assert!(m.assign(&want(&[("a", 4), ("b", 1)])).is_err());
        assert_eq!(m.cores("b"), vec![1], "a failed assign changes nothing");
        // SMT: a core is both its hyperthreads.
        let topo = Topology::from_groups(&[0, 1, 2, 3], vec![vec![0, 2], vec![1, 3]]);
        let mut m = CoreMap::new(2);
        m.assign(&want(&[("a", 1), ("b", 1)])).unwrap();
        assert_eq!(
            (m.cpus(&topo, "a"), m.cpus(&topo, "b")),
            (vec![0, 2], vec![1, 3])
        );
    }

    proptest! {
        #[test]
        fn disjoint_exact_and_sticky(
            nr in 1usize..8,
            steps in proptest::collection::vec(proptest::collection::vec(0u32..4, 3), 1..12),
        ) {
            let mut m = CoreMap::new(nr);
            let names = ["a", "b", "c"];
            for step in steps {
                let w: BTreeMap<String, u32> =
                    names.iter().zip(&step).map(|(a, n)| (a.to_string(), *n)).collect();
                let before = m.clone();
                let total: u32 = step.iter().sum();
                match m.assign(&w) {
                    Err(_) => {
                        prop_assert!(total as usize > nr);
                        prop_assert_eq!(&m, &before);
                    }
                    Ok(()) => {
                        let mut seen = Vec::new();
                        for (a, &n) in &w {
                            let c = m.cores(a);
                            prop_assert_eq!(c.len(), n as usize);
                            for x in &c {
                                prop_assert!(*x < nr && !seen.contains(x));
                                seen.push(*x);
                            }
                            // Kept cores: all of the old ones if it did not
                            // shrink, else a subset of them.
                            let old = before.cores(a);
                            let kept = old.iter().filter(|x| c.contains(x)).count();
                            prop_assert_eq!(kept, old.len().min(n as usize));
                        }
                    }
                }
            }
        }
    }
}
