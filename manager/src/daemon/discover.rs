//! Finding each app's processes: by pid, by command name (`/proc/PID/comm`)
//! or by cgroup (`cgroup.procs`), through the root prefix. A process once
//! found stays the app's until it exits, even if it leaves the matched
//! cgroup (qosd's own cpuset group may move it) or renames itself; a pod's
//! process while its container still matches ([`crate::kube::select`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use qosd_core::sys::stat::Stat;
use qosd_core::sys::{Root, SysError};

use crate::config::Match;
use crate::kube::select::PodSource;
use crate::kube::PodRef;

pub use qosd_sensors::sensor::ebpf::topmost;

/// Reads `/proc` and cgroup files under a root prefix.
#[derive(Debug, Clone)]
pub struct Finder {
    root: Root,
    own_pid: i32,
    /// The node's pods, for `match: { pod: ... }`.
    pods: Option<PodSource>,
}

impl Finder {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Finder {
            root: Root::new(root),
            own_pid: std::process::id() as i32,
            pods: None,
        }
    }

    /// Resolves pod matchers from `pods` from now on.
    pub fn with_pods(mut self, pods: PodSource) -> Self {
        self.pods = Some(pods);
        self
    }

    pub fn pods(&self) -> Option<&PodSource> {
        self.pods.as_ref()
    }

    /// The containers a pod matcher selects now (none for other matchers).
    pub fn containers_of(&self, m: &Match) -> Vec<PodRef> {
        match (&m.pod, &self.pods) {
            (Some(pm), Some(src)) => src.select(self.root.dir(), pm, |_| Vec::new()).containers,
            _ => Vec::new(),
        }
    }

    /// True while `pid` exists, is not a zombie (an exited process its
    /// parent has not reaped yet serves nothing) and is not a kernel thread
    /// (a `pid:` or `comm:` naming one never makes it an app: qosd would
    /// change the kernel's own threads). Only "no such file" or "no such
    /// process" means gone: any other error (out of descriptors, out of
    /// memory) says nothing about the process, so it is kept — releasing a
    /// running app because qosd could not open a file would hand its
    /// resources away.
    pub fn alive(&self, pid: i32) -> bool {
        match Stat::read(&self.root, pid, None) {
            Ok(s) if s.kernel_thread() => {
                tracing::debug!("pid {pid} ({}) is a kernel thread: not an app", s.comm);
                false
            }
            Ok(s) => !s.exited(),
            Err(e @ SysError::Io { .. }) => !e.is_gone(),
            Err(SysError::Parse { .. }) => false,
        }
    }

    /// The processes of every matcher, in one pass over `/proc` for all the
    /// `comm` matchers. `known[i]` are the pids app `i` had: those still
    /// alive stay. Each result is sorted; the daemon itself never matches.
    pub fn find_all(&self, matchers: &[&Match], known: &[&[i32]]) -> Vec<Vec<i32>> {
        let mut found: Vec<BTreeSet<i32>> = vec![BTreeSet::new(); matchers.len()];
        let comms: Vec<(usize, &str)> = matchers
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.comm.as_deref().map(|c| (i, c)))
            .collect();
        if !comms.is_empty() {
            for (pid, comm) in self.processes() {
                for &(i, c) in &comms {
                    if comm == c {
                        found[i].insert(pid);
                    }
                }
            }
        }
        for (i, m) in matchers.iter().enumerate() {
            if let Some(pid) = m.pid {
                found[i].insert(pid);
            }
            if let Some(cg) = &m.cgroup {
                found[i].extend(self.cgroup_procs(cg));
            }
            let known = known.get(i).copied().unwrap_or_default();
            match (&m.pod, &self.pods) {
                (Some(pm), Some(src)) => {
                    let sel = src.select(self.root.dir(), pm, |d| self.cgroup_procs(d));
                    found[i].extend(&sel.pids);
                    let kept = known.iter().filter(|&&p| src.still_selected(p, &sel));
                    found[i].extend(kept);
                }
                _ => found[i].extend(known.iter().copied()),
            }
        }
        let found: Vec<Vec<i32>> = found
            .into_iter()
            .map(|s| {
                s.into_iter()
                    .filter(|&p| p != self.own_pid && self.alive(p))
                    .collect()
            })
            .collect();
        if let Some(src) = &self.pods {
            let live: BTreeSet<i32> = found.iter().flatten().copied().collect();
            let gone = known
                .iter()
                .flat_map(|k| k.iter())
                .filter(|p| !live.contains(p));
            src.forget(gone.copied());
        }
        found
    }

    /// Every process's (pid, comm).
    fn processes(&self) -> Vec<(i32, String)> {
        // The process may exit between readdir and read: skip it.
        (self.root.numbered("/proc").into_iter())
            .filter_map(|pid| {
                let c = self.root.read(format!("/proc/{pid}/comm")).ok()?;
                Some((pid, c.trim_end_matches('\n').to_owned()))
            })
            .collect()
    }

    /// The pids in a cgroup directory (`cgroup.procs`); none if it is gone.
    fn cgroup_procs(&self, cg: &Path) -> Vec<i32> {
        std::fs::read_to_string(self.root.path(cg.join("cgroup.procs")))
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(root: &Path, abs: &str, text: &str) {
        let p = root.join(abs.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn proc(root: &Path, pid: i32, comm: &str, state: &str) {
        put(root, &format!("/proc/{pid}/comm"), &format!("{comm}\n"));
        put(
            root,
            &format!("/proc/{pid}/stat"),
            &format!("{pid} ({comm}) {state} 1 1 1 0 -1 0\n"),
        );
    }

    fn m(pid: Option<i32>, comm: Option<&str>, cgroup: Option<&str>) -> Match {
        Match {
            pid,
            comm: comm.map(str::to_owned),
            cgroup: cgroup.map(PathBuf::from),
            pod: None,
            force: false,
        }
    }

    #[test]
    fn finds_by_pid_comm_and_cgroup_on_a_fake_tree() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        proc(r, 100, "memcached", "S");
        proc(r, 101, "memcached", "Z"); // exited, not reaped
        proc(r, 200, "nginx", "S");
        proc(r, 201, "nginx", "R");
        proc(r, 300, "redis-server", "S");
        put(r, "/sys/fs/cgroup/web.service/cgroup.procs", "200\n201\n");
        let f = Finder::new(r);
        let by_comm = m(None, Some("memcached"), None);
        let by_pid = m(Some(300), None, None);
        let gone = m(Some(999), None, None);
        let by_cg = m(None, None, Some("/sys/fs/cgroup/web.service"));
        let got = f.find_all(&[&by_comm, &by_pid, &gone, &by_cg], &[]);
        assert_eq!(got, vec![vec![100], vec![300], vec![], vec![200, 201]]);

        // A process qosd moved out of the matched cgroup stays the app's
        // while it lives; one that exited goes.
        put(r, "/sys/fs/cgroup/web.service/cgroup.procs", "201\n");
        let got = f.find_all(&[&by_cg], &[&[200, 201]]);
        assert_eq!(got, vec![vec![200, 201]]);
        std::fs::remove_dir_all(r.join("proc/200")).unwrap();
        let got = f.find_all(&[&by_cg], &[&[200, 201]]);
        assert_eq!(got, vec![vec![201]]);
        // A process started later is picked up.
        proc(r, 102, "memcached", "S");
        assert_eq!(f.find_all(&[&by_comm], &[]), vec![vec![100, 102]]);
    }

    /// A read that fails for another reason than "gone" (here EISDIR, as
    /// EMFILE would when descriptors run out) keeps the process: the
    /// issue's daemon released running apps on "Too many open files".
    #[test]
    fn an_io_error_is_not_an_exit() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        proc(r, 100, "memcached", "S");
        std::fs::remove_file(r.join("proc/100/stat")).unwrap();
        std::fs::create_dir(r.join("proc/100/stat")).unwrap();
        let f = Finder::new(r);
        assert!(f.alive(100));
        assert_eq!(
            f.find_all(&[&m(None, Some("memcached"), None)], &[&[100]]),
            vec![vec![100]]
        );
        assert!(!f.alive(101), "a missing process is gone");
    }

    #[test]
    fn topmost_keeps_the_roots_of_process_trees() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let (me, c) = (std::process::id() as i32, child.id() as i32);
        let top = topmost(&[c, me]);
        let alone = topmost(&[c]);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!((top, alone), (vec![me], vec![c]));
    }

    #[test]
    fn finds_this_test_process_by_pid_but_never_itself() {
        let f = Finder::new("/");
        let me = std::process::id() as i32;
        assert!(f.alive(me));
        let by_pid = m(Some(me), None, None);
        assert_eq!(f.find_all(&[&by_pid], &[]), vec![Vec::<i32>::new()]);
        let init = m(Some(1), None, None);
        assert_eq!(f.find_all(&[&init], &[]), vec![vec![1]]);
        // Kernel threads never: by pid (kthreadd) or by comm.
        let kthreadd = m(Some(2), Some("kthreadd"), None);
        assert_eq!(f.find_all(&[&kthreadd], &[&[2]]), vec![Vec::<i32>::new()]);
    }
}
