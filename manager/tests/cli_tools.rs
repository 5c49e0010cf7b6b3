//! The `cpupower` and `pqos` backends: stand-in executables on PATH check
//! each call against the tool's documented syntax and record it, since
//! this machine has neither cpufreq nor CAT.

mod support;

use std::path::Path;
use std::process::Command;

use support::*;

/// A stand-in for a tool: checks its arguments against the tool's
/// documented syntax (exit 1 with usage otherwise, as the tool does) and
/// appends them, one call a line, to `log`.
fn stand_in(dir: &Path, name: &str, check: &str, log: &Path) {
    let script = format!(
        "#!/bin/sh\necho \"$*\" >> '{}'\n{check}\nexit 0\n",
        log.display()
    );
    let p = dir.join(name);
    std::fs::write(&p, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn path_with(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// cpupower(1): `cpupower [-c cpulist] frequency-set [-f FREQ | -u FREQ |
/// -d FREQ | -g GOV]`; FREQ in kHz by default; -f takes no other option.
const CPUPOWER_SYNTAX: &str = r#"[ "$1" = "-c" ] || { echo "usage: cpupower -c LIST ..." >&2; exit 1; }
case "$2" in ""|*[!0-9,-]*) echo "bad cpu list" >&2; exit 1;; esac
[ "$3" = "frequency-set" ] || exit 1
[ $# -eq 5 ] || { echo "one option at a time" >&2; exit 1; }
case "$4" in
  -f|-u|-d) case "$5" in ""|*[!0-9]*) echo "bad frequency" >&2; exit 1;; esac;;
  -g) case "$5" in ""|*[!a-z_]*) exit 1;; esac;;
  *) exit 1;;
esac"#;

#[test]
fn cpupower_backend_builds_documented_command_lines() {
    let d = tempfile::tempdir().unwrap();
    let bin = d.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let log = d.path().join("cpupower.log");
    stand_in(&bin, "cpupower", CPUPOWER_SYNTAX, &log);
    for setspeed in [true, false] {
        let root = d.path().join(format!("root{setspeed}"));
        cpufreq_tree(&root, setspeed);
        let r = root.to_str().unwrap();
        let s = d.path().join(format!("s{setspeed}.json"));
        let s = s.to_str().unwrap();
        let run = |args: &[&str]| {
            Command::new(QOSD)
                .args(args)
                .env("PATH", path_with(&bin))
                .output()
                .unwrap()
        };
        let caps = run(&["caps", "--root", r, "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&caps.stdout).unwrap();
        assert_eq!(v["frequency"]["backends"][1]["available"], true, "{v}");
        let out = run(&[
            "set",
            "--root",
            r,
            "--state-file",
            s,
            "freq",
            "--cpus",
            "0-1",
            "--mhz",
            "1700",
            "--backend",
            "cpupower",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let out = run(&["restore", "--state-file", s]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let calls: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        calls,
        vec![
            // userspace style: -f (rounded down to the 1600 MHz step), then
            // each CPU's governor back.
            "-c 0-1 frequency-set -f 1600000",
            "-c 1 frequency-set -g ondemand",
            "-c 0 frequency-set -g ondemand",
            // capping style: -u, then each CPU's original maximum.
            "-c 0-1 frequency-set -u 1700000",
            "-c 1 frequency-set -u 2400000",
            "-c 0 frequency-set -u 2400000",
        ]
    );
}

/// pqos(8): `-e "llc:COS=MASK"` defines a class, `-a "llc:COS=CORE_LIST"`
/// associates cores with it.
const PQOS_SYNTAX: &str = r#"[ $# -eq 2 ] || { echo "usage" >&2; exit 1; }
case "$1" in
  -e) echo "$2" | grep -Eq '^llc:[0-9]+=0x[0-9a-f]+$' || { echo "bad CLASSDEF $2" >&2; exit 1; };;
  -a) echo "$2" | grep -Eq '^llc:[0-9]+=[0-9][0-9,-]*$' || { echo "bad CLASS2ID $2" >&2; exit 1; };;
  *) exit 1;;
esac"#;

#[test]
fn pqos_backend_builds_documented_command_lines() {
    let d = tempfile::tempdir().unwrap();
    let bin = d.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let log = d.path().join("pqos.log");
    stand_in(&bin, "pqos", PQOS_SYNTAX, &log);
    let root = d.path().join("root");
    put(&root, "/sys/devices/system/cpu/online", "0-3\n");
    put(
        &root,
        "/sys/devices/system/cpu/cpu0/cache/index3/ways_of_associativity",
        "11\n",
    );
    put(
        &root,
        "/proc/cpuinfo",
        "processor\t: 0\nflags\t\t: fpu sse2 cat_l3 cdp_l3\n",
    );
    put(
        &root,
        "/proc/800/stat",
        "800 (app) S 1 800 800 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0\n",
    );
    put(
        &root,
        "/proc/800/status",
        "Name:\tapp\nCpus_allowed_list:\t2-3\n",
    );
    std::fs::create_dir_all(root.join("proc/800/task/800")).unwrap();
    let r = root.to_str().unwrap();
    let s = d.path().join("s.json");
    let s = s.to_str().unwrap();
    let run = |args: &[&str]| {
        Command::new(QOSD)
            .args(args)
            .env("PATH", path_with(&bin))
            .output()
            .unwrap()
    };
    let out = run(&[
        "set",
        "--root",
        r,
        "--state-file",
        s,
        "ways",
        "--pid",
        "800",
        "--ways",
        "4",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(&["restore", "--state-file", s]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let calls: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        calls,
        vec![
            "-e llc:1=0x780", // the top 4 of 11 ways for COS 1
            "-a llc:1=2-3",   // the app's CPUs into COS 1
            "-a llc:0=2-3",   // restore: CPUs back to COS 0,
            "-e llc:1=0x7ff", // and COS 1 back to the full mask
        ]
    );
    let bad = run(&[
        "set",
        "--root",
        r,
        "--state-file",
        s,
        "ways",
        "--pid",
        "800",
        "--ways",
        "12",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("the cache has 11"),
        "{}",
        text(&bad.stderr)
    );
}
