//! From a `match: { pod: ... }` to processes: the pods of the node that
//! match, their chosen containers, each container's cgroup directory (by
//! the kubelet's layouts, [`super::cgroup`]) and the pids in it. A pid
//! stays its container's while it lives and the container still matches
//! (qosd's own cpuset or quota group may move it out of the kubelet's
//! directory); one whose pod left the match, or was deleted, goes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::{cgroup, PodRef, PodSet};
use crate::config::PodMatch;

/// The watch's pods and where the kubelet puts cgroups.
#[derive(Debug, Clone)]
pub struct PodSource {
    pub set: PodSet,
    /// The kubelet's `--cgroup-root`.
    pub cgroup_root: PathBuf,
    /// Which container each pid was found in.
    owners: Arc<Mutex<BTreeMap<i32, PodRef>>>,
}

/// What one pod matcher selects now.
#[derive(Debug, Default)]
pub struct Selected {
    /// Pids in the matched containers' cgroups.
    pub pids: BTreeSet<i32>,
    /// The matched containers (running or not).
    pub containers: Vec<PodRef>,
    /// False until the watch's first list: nothing can be said to be gone.
    pub synced: bool,
}

impl PodSource {
    pub fn new(set: PodSet, cgroup_root: PathBuf) -> PodSource {
        PodSource {
            set,
            cgroup_root,
            owners: Arc::default(),
        }
    }

    /// The containers and pids `m` selects; `procs` reads a cgroup's pids.
    pub fn select(&self, root: &Path, m: &PodMatch, procs: impl Fn(&Path) -> Vec<i32>) -> Selected {
        let mut out = Selected::default();
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        let g = self.set.lock();
        out.synced = g.synced;
        for pod in g.by_uid.values().filter(|p| p.matches(m)) {
            for c in pod.containers_named(m.container.as_deref()) {
                let r = pod.pod_ref(c);
                if let Some(id) = &c.id {
                    let dir = cgroup::find(root, &self.cgroup_root, &pod.uid, pod.qos, id);
                    for p in dir.map(|d| procs(&d)).unwrap_or_default() {
                        owners.insert(p, r.clone());
                        out.pids.insert(p);
                    }
                }
                out.containers.push(r);
            }
        }
        out.containers.sort();
        out
    }

    /// Whether a pid found earlier still belongs to a container in `sel`.
    pub fn still_selected(&self, pid: i32, sel: &Selected) -> bool {
        if !sel.synced {
            return true;
        }
        let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        owners.get(&pid).is_some_and(|r| sel.containers.contains(r))
    }

    /// Forgets pids that exited.
    pub fn forget(&self, gone: impl Iterator<Item = i32>) {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        for p in gone {
            owners.remove(&p);
        }
    }
}
