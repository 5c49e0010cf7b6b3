//! Process trees: a process's descendants, from the parent pid of every
//! process in `/proc/*/stat` (works on every kernel, unlike
//! `/proc/PID/task/TID/children`, which needs CONFIG_PROC_CHILDREN).

use std::collections::HashMap;

use super::stat::Stat;
use super::Root;

/// Every live descendant of `pid` (children, their children, ...),
/// sorted; `pid` itself is not among them.
pub fn descendants(root: &Root, pid: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for p in root.numbered("/proc") {
        if let Ok(s) = Stat::read(root, p, None) {
            children.entry(s.ppid).or_default().push(p);
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            if c != pid && !out.contains(&c) {
                out.push(c);
                todo.push(c);
            }
        }
    }
    out.sort_unstable();
    out
}

/// `pid` followed by its descendants: the processes of an app started as
/// one process (a server that forks workers).
pub fn process_tree(root: &Root, pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    out.extend(descendants(root, pid));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_parents_on_a_fake_tree() {
        let d = tempfile::tempdir().unwrap();
        let r = Root::new(d.path());
        for (pid, ppid) in [(10, 1), (11, 10), (12, 11), (13, 1), (14, 10)] {
            std::fs::create_dir_all(r.path(format!("/proc/{pid}"))).unwrap();
            let line = format!("{pid} (w k) S {ppid} 0 0 0 -1 0\n");
            std::fs::write(r.path(format!("/proc/{pid}/stat")), line).unwrap();
        }
        assert_eq!(descendants(&r, 10), vec![11, 12, 14]);
        assert_eq!(process_tree(&r, 11), vec![11, 12]);
        assert_eq!(descendants(&r, 99), Vec::<i32>::new());
    }

    #[test]
    fn finds_a_real_child() {
        let mut c = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let found = descendants(&Root::default(), me);
        let _ = c.kill();
        let _ = c.wait();
        assert!(found.contains(&(c.id() as i32)), "{found:?}");
    }
}
