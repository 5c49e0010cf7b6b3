//! Fake /sys and /proc trees for the actuator tests, laid out as the
//! kernel documents them, and a byte-level snapshot to compare before and
//! after a restore.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use qosd_actuators::Config;

pub mod memcached;

/// Every directory (None) and file (its bytes) under `dir`.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_owned();
            if p.is_dir() {
                out.insert(rel, None);
                stack.push(p);
            } else {
                out.insert(rel, Some(std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// Writes `content` at the machine path `abs` under `root`, making dirs.
pub fn put(root: &Path, abs: &str, content: &str) {
    let p = root.join(abs.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

pub fn get(root: &Path, abs: &str) -> String {
    std::fs::read_to_string(root.join(abs.trim_start_matches('/'))).unwrap()
}

/// `n` online CPUs; with `smt`, CPU i and i + n/2 are siblings (the
/// x86 numbering).
pub fn cpus(root: &Path, n: u32, smt: bool) {
    put(
        root,
        "/sys/devices/system/cpu/online",
        &format!("0-{}\n", n - 1),
    );
    for c in 0..n {
        let sib = if smt {
            let h = n / 2;
            let (a, b) = if c < h { (c, c + h) } else { (c - h, c) };
            format!("{a},{b}\n")
        } else {
            format!("{c}\n")
        };
        put(
            root,
            &format!("/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list"),
            &sib,
        );
    }
}

/// A fake process: stat (start time 12345), status, task/ dirs, cgroup.
pub fn process(root: &Path, pid: i32, tids: &[i32], cpus_allowed: &str, cgroup: &str) {
    put(
        root,
        &format!("/proc/{pid}/stat"),
        &format!("{pid} (fake app) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 {} 0 12345 1000 100\n", tids.len()),
    );
    put(
        root,
        &format!("/proc/{pid}/status"),
        &format!("Name:\tfake\nTgid:\t{pid}\nCpus_allowed_list:\t{cpus_allowed}\n"),
    );
    for t in tids {
        std::fs::create_dir_all(root.join(format!("proc/{pid}/task/{t}"))).unwrap();
    }
    put(root, &format!("/proc/{pid}/cgroup"), cgroup);
}

pub fn config(root: &Path, state: &Path) -> Config {
    Config {
        root: root.to_owned(),
        state_file: Some(state.to_owned()),
        ..Config::default()
    }
}
