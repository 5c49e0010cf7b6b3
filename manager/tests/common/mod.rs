//! Helpers shared by the CLI tests: the qosd binary, fake trees, snapshots.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const QOSD: &str = env!("CARGO_BIN_EXE_qosd");

pub fn qosd(args: &[&str]) -> Output {
    Command::new(QOSD).args(args).output().unwrap()
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn put(root: &Path, abs: &str, content: &str) {
    let p = root.join(abs.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

pub fn get(root: &Path, abs: &str) -> String {
    std::fs::read_to_string(root.join(abs.trim_start_matches('/'))).unwrap()
}

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

/// A two-CPU cpufreq tree: acpi-cpufreq style (`setspeed`) or
/// intel_pstate style (only `scaling_max_freq`).
pub fn cpufreq_tree(root: &Path, setspeed: bool) {
    put(root, "/sys/devices/system/cpu/online", "0-1\n");
    for c in 0..2 {
        put(
            root,
            &format!("/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list"),
            &format!("{c}\n"),
        );
        let d = format!("/sys/devices/system/cpu/cpu{c}/cpufreq");
        put(root, &format!("{d}/cpuinfo_min_freq"), "800000\n");
        put(root, &format!("{d}/cpuinfo_max_freq"), "2400000\n");
        put(root, &format!("{d}/scaling_max_freq"), "2400000\n");
        if setspeed {
            put(
                root,
                &format!("{d}/scaling_available_frequencies"),
                "2400000 2000000 1600000 1200000 800000 \n",
            );
            put(
                root,
                &format!("{d}/scaling_available_governors"),
                "ondemand userspace performance\n",
            );
            put(root, &format!("{d}/scaling_governor"), "ondemand\n");
            put(root, &format!("{d}/scaling_setspeed"), "<unsupported>\n");
        } else {
            put(
                root,
                &format!("{d}/scaling_available_governors"),
                "performance powersave\n",
            );
            put(root, &format!("{d}/scaling_governor"), "powersave\n");
        }
    }
}
