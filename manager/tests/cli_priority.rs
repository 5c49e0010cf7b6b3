//! The CPU priority knob on this machine's real cgroups: `qosd set
//! priority` puts a process's group in the idle class and `qosd restore`,
//! SIGTERM of `--hold`, and SIGKILL then `qosd restore` put back exactly
//! what was there.

mod support;

use std::path::Path;

use support::*;

/// The v1 cpu group `pid` is in and that group's `cpu.idle`.
fn cpu_idle_of(pid: &str) -> (String, String) {
    let path = cgroups(pid.parse().unwrap())
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, c, p) = (f.next()?, f.next()?, f.next()?);
            c.split(',').any(|x| x == "cpu").then(|| p.to_owned())
        })
        .expect("in the v1 cpu hierarchy");
    let idle =
        std::fs::read_to_string(format!("/sys/fs/cgroup/cpu{path}/cpu.idle")).unwrap_or_default();
    (path, idle.trim().to_owned())
}

fn set(st: &str, extra: &[&str], pid: &str, class: &str) -> Vec<String> {
    let mut v: Vec<String> = ["set", "--state-file", st].map(String::from).to_vec();
    v.extend(extra.iter().map(|s| s.to_string()));
    v.extend(["priority", "--pid", pid, "--class", class].map(String::from));
    v
}

#[test]
fn real_priority_set_restore_and_sigkill_then_restore_are_exact() {
    if !Path::new("/sys/fs/cgroup/cpu/cpu.idle").exists() {
        panic!("this test needs the cgroup v1 cpu hierarchy with cpu.idle (BUILD-NOTES.md)");
    }
    let caps = qosd(&["caps", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&caps.stdout).unwrap();
    assert_eq!(
        v["cpu_priority"]["backend"], "cgroup1",
        "{}",
        v["cpu_priority"]
    );
    let spin = Killed::busy();
    let pid = spin.pid().to_string();
    let before = cpu_idle_of(&pid);
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s.json");
    let st = s.to_str().unwrap();
    let group = format!("/sys/fs/cgroup/cpu/qosd-pid{pid}");
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

    // --hold, SIGTERM: qosd restores on its own.
    let (mut child, _out) = hold(
        &set(st, &["--hold"], &pid, "normal")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(
        cpu_idle_of(&pid),
        (format!("/qosd-pid{pid}"), "0".to_owned())
    );
    kill(&child, nix::sys::signal::Signal::SIGTERM);
    assert!(child.wait().unwrap().success());
    assert_eq!(cpu_idle_of(&pid), before);
    assert!(!Path::new(&group).exists() && !s.exists());
}
