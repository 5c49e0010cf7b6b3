//! `qosd caps`, `qosd set`, `qosd restore` end to end: the binary on this
//! machine and on fake trees, stand-in `cpupower`/`pqos` executables that
//! check and record their arguments, and the SIGTERM and SIGKILL paths of a
//! `qosd set --hold` child.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const QOSD: &str = env!("CARGO_BIN_EXE_qosd");

fn qosd(args: &[&str]) -> Output {
    Command::new(QOSD).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn put(root: &Path, abs: &str, content: &str) {
    let p = root.join(abs.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

fn get(root: &Path, abs: &str) -> String {
    std::fs::read_to_string(root.join(abs.trim_start_matches('/'))).unwrap()
}

fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
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
fn cpufreq_tree(root: &Path, setspeed: bool) {
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

#[test]
fn caps_json_tells_what_this_machine_has() {
    let out = qosd(&["caps", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in ["cores", "frequency", "cache_ways", "memory_bandwidth"] {
        let knob = &v[k];
        assert!(knob["available"].is_boolean(), "{k}");
        assert!(
            !knob["reason"].as_str().unwrap().is_empty(),
            "{k} has a reason"
        );
        assert_eq!(
            knob["available"].as_bool().unwrap(),
            knob["backend"].is_string(),
            "{k}"
        );
    }
    // Affinity works on any Linux; cpuset where the cgroup fs has it.
    assert_eq!(v["cores"]["available"], true);
    let names = |k: &str| -> Vec<String> {
        v[k]["backends"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["available"] == true)
            .map(|b| b["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(names("cores").contains(&"affinity".to_owned()));
    assert_eq!(
        names("cores").contains(&"cgroup1".to_owned()),
        Path::new("/sys/fs/cgroup/cpuset/cpuset.cpus").exists()
    );
    assert_eq!(
        v["frequency"]["available"].as_bool().unwrap(),
        Path::new("/sys/devices/system/cpu/cpu0/cpufreq").exists()
    );
    assert_eq!(
        v["cache_ways"]["available"].as_bool().unwrap(),
        Path::new("/sys/fs/resctrl/info/L3").exists()
            || names("cache_ways").contains(&"pqos".to_owned())
    );
    assert_eq!(
        v["memory_bandwidth"]["available"].as_bool().unwrap(),
        Path::new("/sys/fs/resctrl/info/MB").exists()
    );
    if !Path::new("/sys/devices/system/cpu/cpu0/cpufreq").exists() {
        assert!(v["frequency"]["reason"]
            .as_str()
            .unwrap()
            .contains("no /sys/devices/system/cpu/cpu0/cpufreq"));
    }
    let table = qosd(&["caps"]);
    assert!(text(&table.stdout).starts_with("cores"));
}

#[test]
fn bad_input_exits_2_and_names_what_is_wrong() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("s.json");
    let s = state.to_str().unwrap();
    let out = qosd(&[
        "set",
        "--state-file",
        s,
        "cores",
        "--pid",
        "999999999",
        "--cpus",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no process with pid 999999999"),
        "{}",
        text(&out.stderr)
    );
    let me = std::process::id().to_string();
    let out = qosd(&[
        "set",
        "--state-file",
        s,
        "cores",
        "--pid",
        &me,
        "--cpus",
        "4096",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("CPU 4096 is not online"),
        "{}",
        text(&out.stderr)
    );
    let out = qosd(&[
        "set",
        "--state-file",
        s,
        "cores",
        "--pid",
        &me,
        "--cpus",
        "1-x",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--cpus"),
        "{}",
        text(&out.stderr)
    );
    assert!(!state.exists(), "nothing recorded, nothing changed");
    // A fake tree where the knob is missing: a runtime failure, with why.
    let root = d.path().join("root");
    put(&root, "/sys/devices/system/cpu/online", "0-1\n");
    let out = qosd(&[
        "set",
        "--root",
        root.to_str().unwrap(),
        "freq",
        "--cpus",
        "0",
        "--mhz",
        "1000",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr)
            .contains("frequency: unavailable: cpufreq: no /sys/devices/system/cpu/cpu0/cpufreq"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn set_and_restore_on_a_fake_tree_with_dry_run() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    cpufreq_tree(&root, true);
    let before = snapshot(&root);
    let r = root.to_str().unwrap();
    let out = qosd(&[
        "set",
        "--root",
        r,
        "--dry-run",
        "freq",
        "--cpus",
        "0-1",
        "--mhz",
        "1300",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout)
        .contains("would change frequency: /sys/devices/system/cpu/cpu0/cpufreq/scaling_setspeed"));
    assert_eq!(snapshot(&root), before);

    let out = qosd(&["set", "--root", r, "freq", "--cpus", "0-1", "--mhz", "1300"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        get(
            &root,
            "/sys/devices/system/cpu/cpu1/cpufreq/scaling_setspeed"
        ),
        "1200000"
    );
    // The default state file lives under the root.
    assert!(root.join("run/qosd/state.json").exists());
    let out = qosd(&["restore", "--root", r]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::fs::remove_file(root.join("run/qosd/state.lock")).unwrap();
    std::fs::remove_dir_all(root.join("run")).unwrap();
    assert_eq!(snapshot(&root), before);
}

/// Starts `qosd set --hold ...` and waits until the change is made. The
/// caller signals and waits for the returned child.
#[allow(clippy::zombie_processes)]
fn hold(args: &[&str]) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(QOSD)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "qosd exited before holding"
        );
        if line.starts_with("holding") {
            return (child, out);
        }
    }
}

fn kill(child: &Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

#[test]
fn sigterm_restores_and_sigkill_leaves_a_state_file_for_restore() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    cpufreq_tree(&root, false);
    let before = snapshot(&root);
    let r = root.to_str().unwrap();
    let state = d.path().join("s.json");
    let s = state.to_str().unwrap();
    let args = [
        "set",
        "--root",
        r,
        "--state-file",
        s,
        "--hold",
        "freq",
        "--cpus",
        "0-1",
        "--mhz",
        "1500",
    ];

    let (mut child, _out) = hold(&args);
    assert_eq!(
        get(
            &root,
            "/sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq"
        ),
        "1500000"
    );
    kill(&child, nix::sys::signal::Signal::SIGTERM);
    assert!(child.wait().unwrap().success());
    assert_eq!(snapshot(&root), before, "SIGTERM: qosd restored on its own");
    assert!(!state.exists());

    let (mut child, _out) = hold(&args);
    kill(&child, nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    assert_eq!(
        get(
            &root,
            "/sys/devices/system/cpu/cpu1/cpufreq/scaling_max_freq"
        ),
        "1500000"
    );
    assert!(
        state.exists(),
        "SIGKILL: the originals are in the state file"
    );
    let out = qosd(&["restore", "--state-file", s]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("restored frequency"));
    assert_eq!(snapshot(&root), before);
    assert!(!state.exists());
}

#[test]
fn real_sigkill_then_restore_puts_the_affinity_back() {
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = sleeper.id().to_string();
    let status = format!("/proc/{pid}/status");
    let mask = || {
        std::fs::read_to_string(&status)
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix("Cpus_allowed_list:")
                    .map(|s| s.trim().to_owned())
            })
            .unwrap()
    };
    let orig = mask();
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s.json");
    let (mut child, _out) = hold(&[
        "set",
        "--state-file",
        s.to_str().unwrap(),
        "--hold",
        "cores",
        "--pid",
        &pid,
        "--cpus",
        "0",
        "--backend",
        "affinity",
    ]);
    assert_eq!(mask(), "0");
    kill(&child, nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    assert_eq!(mask(), "0", "a killed qosd restores nothing itself");
    let out = qosd(&["restore", "--state-file", s.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(mask(), orig);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

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
