//! The CPU priority knob on this machine's real cgroups: `qosd set
//! priority` puts a process's group in the idle class and `qosd restore`,
//! SIGTERM of `--hold`, and SIGKILL then `qosd restore` put back exactly
//! what was there.

mod support;

use std::path::Path;

use support::*;

/// The cpu group `pid` is in and that group's `cpu.idle` (v1 here, v2 in
/// the kernel matrix's guests).
fn cpu_idle_of(pid: &str) -> (String, String) {
    cpu_file_of(pid, "cpu.idle")
}

fn set(st: &str, extra: &[&str], pid: &str, class: &str) -> Vec<String> {
    let mut v: Vec<String> = ["set", "--state-file", st].map(String::from).to_vec();
    v.extend(extra.iter().map(|s| s.to_string()));
    v.extend(["priority", "--pid", pid, "--class", class].map(String::from));
    v
}

#[test]
fn real_priority_set_restore_and_sigkill_then_restore_are_exact() {
    let Some((mount, v2)) = cpu_mount() else {
        panic!("this test needs a cpu controller: the v1 cpu hierarchy or cgroup2 with cpu");
    };
    if !Path::new(&mount).join("cpu.idle").exists() && !v2 {
        panic!("this test needs cpu.idle in the v1 cpu hierarchy (BUILD-NOTES.md)");
    }
    let caps = qosd(&["caps", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&caps.stdout).unwrap();
    assert_eq!(
        v["cpu_priority"]["backend"],
        if v2 { "cgroup2" } else { "cgroup1" },
        "{}",
        v["cpu_priority"]
    );
    let spin = Killed::busy();
    let pid = spin.pid().to_string();
    let before = cpu_idle_of(&pid);
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s.json");
    let st = s.to_str().unwrap();
    let group = format!("{mount}/qosd-pid{pid}");
    let idle = (format!("/qosd-pid{pid}"), "1".to_owned());

    // Dry run: says what it would do, does nothing.
    let out = qosd(&set(st, &["--dry-run"], &pid, "idle"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("would change cpu_priority"));
    assert_eq!(cpu_idle_of(&pid), before);
    assert!(!Path::new(&group).exists() && !s.exists());

    // One-shot set, then `qosd restore`.
    let out = qosd(&set(st, &[], &pid, "idle"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(cpu_idle_of(&pid), idle);
    let out = qosd(&["restore", "--state-file", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("cpu_priority"));
    assert_eq!(cpu_idle_of(&pid), before);
    assert!(!Path::new(&group).exists() && !s.exists());

    // --hold, SIGKILL: the class stays, the state file has the originals.
    let (mut child, _out) = hold(
        &set(st, &["--hold"], &pid, "idle")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(cpu_idle_of(&pid), idle);
    kill(&child, nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    assert_eq!(
        cpu_idle_of(&pid),
        idle,
        "a killed qosd restores nothing itself"
    );
    let out = qosd(&["restore", "--state-file", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(cpu_idle_of(&pid), before);
    assert!(!Path::new(&group).exists() && !s.exists());

    // Normal on an app qosd found at normal makes no group; normal after
    // idle puts the process back in the group it was found in and removes
    // qosd's group (the journal's move and group entries consumed: the
    // restore after it has nothing left to move).
    let out = qosd(&set(st, &[], &pid, "normal"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(cpu_idle_of(&pid), before);
    assert!(!Path::new(&group).exists());
    let out = qosd(&set(st, &[], &pid, "idle"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(cpu_idle_of(&pid), idle);
    let out = qosd(&set(st, &[], &pid, "normal"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(cpu_idle_of(&pid), before);
    assert!(!Path::new(&group).exists());
    if s.exists() {
        let left = std::fs::read_to_string(&s).unwrap();
        assert!(
            !left.contains("\"moved\"") && !left.contains("\"created_dir\""),
            "{left}"
        );
    }
    let out = qosd(&["restore", "--state-file", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!s.exists());

    // With a CPU quota in force the quota knob holds the group: normal
    // after idle stays there, at normal; the restore removes it.
    for args in [
        vec![
            "set",
            "--state-file",
            st,
            "quota",
            "--pid",
            &pid,
            "--quota",
            "1.5",
        ],
        set(st, &[], &pid, "idle")
            .iter()
            .map(String::as_str)
            .collect(),
        set(st, &[], &pid, "normal")
            .iter()
            .map(String::as_str)
            .collect(),
    ] {
        let out = qosd(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
    let (in_group, quota) = cpu_file_of(&pid, if v2 { "cpu.max" } else { "cpu.cfs_quota_us" });
    assert_eq!(in_group, format!("/qosd-pid{pid}"));
    assert!(!quota.starts_with("max") && quota != "-1", "{quota}");
    assert_eq!(cpu_idle_of(&pid), (in_group, "0".to_owned()));
    let out = qosd(&["restore", "--state-file", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(cpu_idle_of(&pid), before);
    assert!(!Path::new(&group).exists() && !s.exists());

    // --hold, SIGTERM: qosd restores on its own.
    let (mut child, _out) = hold(
        &set(st, &["--hold"], &pid, "idle")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(cpu_idle_of(&pid), idle);
    kill(&child, nix::sys::signal::Signal::SIGTERM);
    assert!(child.wait().unwrap().success());
    assert_eq!(cpu_idle_of(&pid), before);
    assert!(!Path::new(&group).exists() && !s.exists());
}

/// `qosd set level` sets any knob but cores from the knob table: the CPU
/// priority by its level does what `set priority --class` does, and a
/// knob or level the table refuses is a usage error that changes nothing.
#[test]
fn set_level_sets_a_knob_by_its_name_and_refuses_what_the_table_refuses() {
    let Some((mount, v2)) = cpu_mount() else {
        panic!("this test needs a cpu controller: the v1 cpu hierarchy or cgroup2 with cpu");
    };
    if !Path::new(&mount).join("cpu.idle").exists() && !v2 {
        panic!("this test needs cpu.idle in the v1 cpu hierarchy (BUILD-NOTES.md)");
    }
    let spin = Killed::busy();
    let pid = spin.pid().to_string();
    let before = cpu_idle_of(&pid);
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s.json");
    let st = s.to_str().unwrap();
    let group = format!("{mount}/qosd-pid{pid}");
    let level = |knob: &str, level: &str| {
        qosd(&[
            "set",
            "--state-file",
            st,
            "level",
            knob,
            "--pid",
            &pid,
            "--level",
            level,
        ])
    };

    for (knob, lvl, says) in [
        ("cores", "1", "not set by a level"),
        ("cpu_priority", "4", "1 (idle), 2 (normal) or 3 (realtime)"),
        ("memory_bandwidth", "101", "1 to 100"),
        ("nosuch", "1", "is not a knob"),
    ] {
        let out = level(knob, lvl);
        assert_eq!(out.status.code(), Some(2), "{knob} {lvl}");
        assert!(text(&out.stderr).contains(says), "{}", text(&out.stderr));
        assert_eq!(cpu_idle_of(&pid), before);
        assert!(!Path::new(&group).exists() && !s.exists());
    }

    // By its alias and the idle level, then `qosd restore`.
    let out = level("priority", "1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        cpu_idle_of(&pid),
        (format!("/qosd-pid{pid}"), "1".to_owned())
    );
    let out = qosd(&["restore", "--state-file", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(cpu_idle_of(&pid), before);
    assert!(!Path::new(&group).exists() && !s.exists());
}
