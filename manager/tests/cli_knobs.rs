//! `qosd caps`, `qosd set`, `qosd restore` end to end: the binary on this
//! machine and on fake trees, exit codes, and the SIGTERM and SIGKILL
//! paths of a `qosd set --hold` child.

mod support;

use std::path::Path;
use std::process::Command;

use support::*;

#[test]
fn caps_json_tells_what_this_machine_has() {
    let out = qosd(&["caps", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in [
        "cores",
        "frequency",
        "cache_ways",
        "memory_bandwidth",
        "cpu_quota",
    ] {
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
    // CFS bandwidth: v1 `cpu` hierarchy here, or cgroup2 that has cpu (qosd
    // enables it for its groups).
    assert_eq!(
        v["cpu_quota"]["available"].as_bool().unwrap(),
        cpu_mount().is_some()
    );
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
    for (q, msg) in [
        ("0.3x", "is not a number of CPUs"),
        ("0", "is not a positive number of CPUs"),
        ("0.0001", "is not a positive number of CPUs"),
        ("4096", "is not in (0,"),
    ] {
        let out = qosd(&[
            "set",
            "--state-file",
            s,
            "quota",
            "--pid",
            &me,
            "--quota",
            q,
        ]);
        assert_eq!(out.status.code(), Some(2), "{q}");
        assert!(
            text(&out.stderr).contains(msg),
            "{q}: {}",
            text(&out.stderr)
        );
    }
    for p in ["999", "1000001"] {
        let out = qosd(&[
            "set",
            "--state-file",
            s,
            "quota",
            "--pid",
            &me,
            "--quota",
            "0.5",
            "--period-us",
            p,
        ]);
        assert_eq!(out.status.code(), Some(2), "--period-us {p}");
        let err = text(&out.stderr);
        assert!(
            err.contains("--period-us: ") && err.contains("is not in 1000-1000000"),
            "{p}: {err}"
        );
    }
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

/// The quota of the cgroup `pid` is in, as `qosd` reads it: (cgroup path,
/// quota in µs: v1 `cpu.cfs_quota_us`, or the first field of v2 `cpu.max`).
fn cpu_group(pid: &str) -> (String, String) {
    let v2 = cpu_mount().expect("a cpu controller").1;
    let (path, q) = cpu_file_of(pid, if v2 { "cpu.max" } else { "cpu.cfs_quota_us" });
    (
        path,
        q.split_whitespace().next().unwrap_or_default().to_owned(),
    )
}

#[test]
fn real_quota_set_restore_and_sigkill_then_restore_are_exact() {
    let Some((mount, _)) = cpu_mount() else {
        panic!("this test needs a cpu controller: the v1 cpu hierarchy or cgroup2 with cpu");
    };
    let spin = Killed::busy();
    let pid = spin.pid().to_string();
    let before = cpu_group(&pid);
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s.json");
    let st = s.to_str().unwrap();
    let group = format!("{mount}/qosd-pid{pid}");

    // Dry run: says what it would do, does nothing.
    let out = qosd(&[
        "set",
        "--state-file",
        st,
        "--dry-run",
        "quota",
        "--pid",
        &pid,
        "--quota",
        "0.3",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("would change cpu_quota"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(cpu_group(&pid), before);
    assert!(!Path::new(&group).exists() && !s.exists());

    // One-shot set, then `qosd restore`.
    let out = qosd(&[
        "set",
        "--state-file",
        st,
        "quota",
        "--pid",
        &pid,
        "--quota",
        "0.3",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        cpu_group(&pid),
        (format!("/qosd-pid{pid}"), "30000".to_owned()),
        "0.3 CPU of the default 100 ms period"
    );
    let out = qosd(&["restore", "--state-file", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("cpu_quota"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(cpu_group(&pid), before);
    assert!(!Path::new(&group).exists() && !s.exists());

    // Over a period of its own: the quota is 0.3 CPU of that period.
    let out = qosd(&[
        "set",
        "--state-file",
        st,
        "quota",
        "--pid",
        &pid,
        "--quota",
        "0.3",
        "--period-us",
        "10000",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(cpu_group(&pid).1, "3000", "0.3 CPU of a 10 ms period");
    let v2 = cpu_mount().unwrap().1;
    let period = if v2 {
        std::fs::read_to_string(format!("{group}/cpu.max")).unwrap()
    } else {
        std::fs::read_to_string(format!("{group}/cpu.cfs_period_us")).unwrap()
    };
    assert_eq!(
        period.split_whitespace().last(),
        Some("10000"),
        "{period:?}"
    );
    let out = qosd(&["restore", "--state-file", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(cpu_group(&pid), before);
    assert!(!Path::new(&group).exists() && !s.exists());

    // --hold, SIGKILL: the cap stays, the state file has the originals.
    let (mut child, _out) = hold(&[
        "set",
        "--state-file",
        st,
        "--hold",
        "quota",
        "--pid",
        &pid,
        "--quota",
        "0.5",
    ]);
    assert_eq!(cpu_group(&pid).1, "50000");
    kill(&child, nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    assert_eq!(
        cpu_group(&pid).1,
        "50000",
        "a killed qosd restores nothing itself"
    );
    assert!(s.exists());
    let out = qosd(&["restore", "--state-file", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(cpu_group(&pid), before);
    assert!(!Path::new(&group).exists() && !s.exists());

    // --hold, SIGTERM: qosd restores on its own.
    let (mut child, _out) = hold(&[
        "set",
        "--state-file",
        st,
        "--hold",
        "quota",
        "--pid",
        &pid,
        "--quota",
        "1.2",
    ]);
    assert_eq!(cpu_group(&pid).1, "120000");
    kill(&child, nix::sys::signal::Signal::SIGTERM);
    assert!(child.wait().unwrap().success());
    assert_eq!(cpu_group(&pid), before);
    assert!(!Path::new(&group).exists() && !s.exists());
}
