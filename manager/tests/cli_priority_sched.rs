//! The CPU priority knob's `SCHED_IDLE` backend through the CLI, on this
//! machine's real scheduler (root): with the cgroup backends made to look
//! missing (`QOSD_PRETEND_NO_PRIORITY_CGROUP=1`; this machine has cpu
//! groups), `qosd caps` names `sched_idle`, `qosd set priority` puts every
//! thread of a `memcached -t 2` in `SCHED_IDLE`, and `qosd restore`, SIGTERM
//! of `--hold`, and SIGKILL then `qosd restore` put every thread's policy
//! back exactly.

mod support;

use nix::sys::signal::Signal;
use support::*;

/// `SCHED_IDLE` in /proc's stat.
const IDLE: u32 = 5;

fn set(st: &str, extra: &[&str], pid: &str, class: &str) -> Vec<String> {
    let mut v: Vec<String> = ["set", "--state-file", st].map(String::from).to_vec();
    v.extend(extra.iter().map(|s| s.to_string()));
    v.extend(["priority", "--pid", pid, "--class", class].map(String::from));
    v
}

fn all_idle(pid: u32) -> bool {
    let p = thread_policies(pid);
    p.len() >= 3 && p.iter().all(|(_, x)| *x == IDLE)
}

#[test]
fn real_priority_sched_idle_set_restore_and_sigkill_then_restore_are_exact() {
    // The only test of this binary: every qosd it starts inherits this.
    std::env::set_var("QOSD_PRETEND_NO_PRIORITY_CGROUP", "1");
    let caps = qosd(&["caps", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&caps.stdout).unwrap();
    assert_eq!(
        v["cpu_priority"]["backend"], "sched_idle",
        "{}",
        v["cpu_priority"]
    );
    let mc = memcached(2);
    let pid = mc.pid();
    let before = thread_policies(pid);
    assert!(before.len() >= 3 && !all_idle(pid), "{before:?}");
    let group = cgroups(pid);
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s.json");
    let st = s.to_str().unwrap();
    let p = pid.to_string();

    // Dry run: says what it would do, does nothing.
    let out = qosd(&set(st, &["--dry-run"], &p, "idle"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("would change cpu_priority"));
    assert_eq!(thread_policies(pid), before);

    // One-shot set, then `qosd restore`; no group is made or joined.
    let out = qosd(&set(st, &[], &p, "idle"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(all_idle(pid), "{:?}", thread_policies(pid));
    assert_eq!(cgroups(pid), group);
    let out = qosd(&["restore", "--state-file", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("cpu_priority"));
    assert_eq!(thread_policies(pid), before);
    assert!(!s.exists());

    // --hold, SIGKILL: the policy stays, the state file has the originals.
    let args = set(st, &["--hold"], &p, "idle");
    let (mut child, _out) = hold(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(all_idle(pid));
    kill(&child, Signal::SIGKILL);
    child.wait().unwrap();
    assert!(all_idle(pid), "a killed qosd restores nothing itself");
    let out = qosd(&["restore", "--state-file", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(thread_policies(pid), before);
    assert!(!s.exists());

    // --hold, SIGTERM: qosd restores on its own.
    let (mut child, _out) = hold(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(all_idle(pid));
    kill(&child, Signal::SIGTERM);
    assert!(child.wait().unwrap().success());
    assert_eq!(thread_policies(pid), before);
    assert!(!s.exists());
}
