//! The CPU priority knob's realtime value through the CLI, on this
//! machine's real scheduler and v1 `cpu` hierarchy with RT group
//! scheduling (root): `qosd caps` says realtime is available exactly when
//! the kernel lets a thread in a budgeted group be `SCHED_FIFO` (checked
//! here by hand); `qosd set priority --class realtime` puts every thread of
//! a multi-threaded process at `fifo:1` in its group with the RT budget, a
//! thread and a child process made later inherit it; `--class normal` puts
//! the threads and the process back where they were found, lowers what
//! inherited, and removes the group (a crash midway restores exactly);
//! `qosd restore`, SIGTERM
//! of `--hold`, and SIGKILL then `qosd restore` put every thread's policy,
//! priority and nice back exactly (a `batch` thread and a nice-5 thread
//! included), lower the threads and children made meanwhile to
//! `SCHED_OTHER`, and remove the group; a forged state file that would make a
//! thread real-time is refused and changes nothing.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use support::*;

const CPU: &str = "/sys/fs/cgroup/cpu";

/// A python process with two extra threads (one `SCHED_BATCH`, one at
/// nice 5); each line on its stdin makes one more thread, whose id it
/// prints.
struct Threads {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

const SCRIPT: &str = r#"
import os, sys, threading, time
def park(): time.sleep(120)
def start():
    t = threading.Thread(target=park, daemon=True); t.start()
    while t.native_id is None: time.sleep(0.01)
    return t.native_id
a = start(); b = start()
os.sched_setscheduler(a, os.SCHED_BATCH, os.sched_param(0))
os.setpriority(os.PRIO_PROCESS, b, 5)
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "fork":
        child = os.fork()
        if child == 0:
            time.sleep(120)
            os._exit(0)
        print(child, flush=True)
    else:
        print(start(), flush=True)
"#;

impl Threads {
    fn start() -> Self {
        let mut child = Command::new("/usr/bin/python3")
            .args(["-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        assert_eq!(l.trim(), "ready");
        Threads { child, out }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A new thread, made by the (real-time) main thread.
    fn new_thread(&mut self) -> u32 {
        self.ask("")
    }

    /// A child process (a sleeping fork of the main thread), killed by
    /// the caller.
    fn fork(&mut self) -> Killed {
        Killed(self.ask("fork"))
    }

    fn ask(&mut self, line: &str) -> u32 {
        writeln!(self.child.stdin.as_mut().unwrap(), "{line}").unwrap();
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        l.trim().parse().unwrap()
    }
}

/// A child process of the app, killed when dropped.
struct Killed(u32);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0 as i32), Signal::SIGKILL);
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (tid, policy, rt priority, nice) of every thread, from /proc's stat.
fn sched_state(pid: u32) -> Vec<(u32, u32, u32, i32)> {
    let mut v = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let f: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        // Fields 19 (nice), 40 (rt_priority), 41 (policy), counted from 1;
        // `f` starts at field 3.
        let tid = t.file_name().to_str().unwrap().parse().unwrap();
        v.push((
            tid,
            f[38].parse().unwrap(),
            f[37].parse().unwrap(),
            f[16].parse().unwrap(),
        ));
    }
    v.sort_unstable();
    v
}

/// `chrt -p TID`'s policy line (it names `SCHED_RESET_ON_FORK`).
fn chrt(tid: u32) -> String {
    let o = Command::new("chrt")
        .args(["-p", &tid.to_string()])
        .output()
        .unwrap();
    text(&o.stdout)
}

/// At qosd's policy: `SCHED_FIFO` 1, no reset-on-fork (children inherit).
fn is_ours(tid: u32) -> bool {
    let c = chrt(tid);
    c.contains("SCHED_FIFO\n") && c.contains("priority: 1")
}

fn is_rt(tid: u32) -> bool {
    let c = chrt(tid);
    c.contains("SCHED_FIFO") || c.contains("SCHED_RR")
}

/// The process's group in the v1 `cpu` hierarchy.
fn cpu_group(pid: u32) -> String {
    cgroups(pid)
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once(':')?;
            let (ctl, path) = rest.split_once(':')?;
            ctl.split(',').any(|c| c == "cpu").then(|| path.to_owned())
        })
        .unwrap()
}

fn set(st: &str, extra: &[&str], pid: &str, class: &str) -> Vec<String> {
    let mut v: Vec<String> = ["set", "--state-file", st].map(String::from).to_vec();
    v.extend(extra.iter().map(|s| s.to_string()));
    v.extend(["priority", "--pid", pid, "--class", class].map(String::from));
    v
}

/// What the kernel allows here, by hand: a `sleep` in a fresh group is
/// refused `SCHED_FIFO` with no budget, allowed with one.
fn kernel_allows_rt_in_a_group() -> bool {
    let g = format!("{CPU}/qosd-rtprobe-test");
    let _ = std::fs::create_dir(&g);
    let mut sleep = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = sleep.id().to_string();
    std::fs::write(format!("{g}/cgroup.procs"), &pid).unwrap();
    let fifo = || {
        Command::new("chrt")
            .args(["-f", "-p", "1", &pid])
            .status()
            .unwrap()
            .success()
    };
    let without = fifo();
    std::fs::write(format!("{g}/cpu.rt_runtime_us"), "10000").unwrap();
    let with = fifo();
    Command::new("chrt")
        .args(["-o", "-p", "0", &pid])
        .status()
        .unwrap();
    std::fs::write(format!("{CPU}/cgroup.procs"), &pid).unwrap();
    let _ = sleep.kill();
    let _ = sleep.wait();
    std::fs::remove_dir(&g).unwrap();
    assert!(
        !without,
        "a group with no RT budget took a SCHED_FIFO thread"
    );
    with
}

/// A group's RT budget, `None` once the group is gone.
fn budget_of(group: &str) -> Option<String> {
    let b = std::fs::read_to_string(format!("{CPU}{group}/cpu.rt_runtime_us"));
    b.ok().map(|b| b.trim().to_owned())
}

/// One realtime test at a time: each gives a group an RT budget, and two
/// budgets do not fit under the root's 950 000 µs.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn real_priority_realtime_set_restore_sigterm_sigkill_and_forged_state() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let caps = qosd(&["caps", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&caps.stdout).unwrap();
    let reason = v["cpu_priority"]["reason"].as_str().unwrap().to_owned();
    let allows = std::path::Path::new(&format!("{CPU}/cpu.rt_runtime_us")).exists()
        && kernel_allows_rt_in_a_group();
    assert_eq!(reason.contains("realtime: available"), allows, "{reason}");
    assert!(
        allows,
        "this machine has RT group scheduling in v1 cpu: {reason}"
    );

    let mut app = Threads::start();
    let pid = app.pid();
    let before = sched_state(pid);
    assert!(before.len() >= 3, "{before:?}");
    assert!(
        before.iter().any(|t| t.1 == 3) && before.iter().any(|t| t.3 == 5),
        "{before:?}"
    );
    let group0 = cpu_group(pid);
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s.json");
    let st = s.to_str().unwrap();
    let p = pid.to_string();

    // A budget above the parent's: the kernel refuses it (EINVAL), the
    // set fails naming the file, and nothing is left changed. The old
    // environment variable, set, is refused rather than ignored; a budget
    // out of range, or given to another class, is a usage error.
    let refused = |extra: &[&str], env: Option<&str>, code, msg: &str| {
        let mut cmd = Command::new(QOSD);
        cmd.args(set(st, extra, &p, "realtime"));
        if let Some(v) = env {
            cmd.env("QOSD_RT_BUDGET_US", v);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains(msg), "{}", text(&out.stderr));
        assert_eq!(sched_state(pid), before);
        assert_eq!(cpu_group(pid), group0);
        assert!(!s.exists());
    };
    refused(&["--rt-budget-us", "960000"], None, 1, "cpu.rt_runtime_us");
    refused(&[], Some("800000"), 1, "no longer read");
    refused(&["--rt-budget-us", "0"], None, 2, "1..=1000000");
    let out = qosd(&set(st, &["--rt-budget-us", "800000"], &p, "idle"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(cpu_group(pid), group0);

    // One-shot set: every thread ours, the group's budget set; a thread
    // and a child process made afterwards inherit the policy (in the
    // group, so the budget bounds them too).
    let out = qosd(&set(st, &[], &p, "realtime"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    for (tid, ..) in &before {
        assert!(is_ours(*tid), "thread {tid}: {}", chrt(*tid));
    }
    let group = cpu_group(pid);
    assert!(group.starts_with("/qosd-"), "{group}");
    assert_eq!(budget_of(&group).as_deref(), Some("900000"));
    let late = app.new_thread();
    assert!(is_ours(late), "{}", chrt(late));
    let child = app.fork();
    assert!(is_ours(child.0), "{}", chrt(child.0));
    assert_eq!(cpu_group(child.0), group);
    let out = qosd(&["caps"]);
    assert!(text(&out.stdout).contains("realtime: available"));

    // Normal on the realtime app: each thread back to its original (the
    // late one to the main thread's), the budget to 0, the process back in
    // the group it was found in and qosd's group removed; the journal's
    // entries for all that are consumed.
    let journalled = std::fs::read_to_string(&s).unwrap();
    let out = qosd(&set(st, &[], &p, "normal"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        before.iter().all(|b| sched_state(pid).contains(b)),
        "{:?}",
        sched_state(pid)
    );
    assert!(!is_rt(late), "{}", chrt(late));
    assert!(!is_rt(child.0), "{}", chrt(child.0));
    assert!(chrt(child.0).contains("SCHED_OTHER"), "{}", chrt(child.0));
    assert_eq!(cpu_group(pid), group0);
    assert!(!std::path::Path::new(&format!("{CPU}{group}")).exists());
    assert!(!s.exists(), "{:?}", std::fs::read_to_string(&s));

    // A crash in the middle of that (the state file as it was before
    // normal: nothing consumed yet), then `qosd restore`: every undo
    // repeats harmlessly, nothing moves.
    let now = sched_state(pid);
    std::fs::write(&s, &journalled).unwrap();
    let out = qosd(&["restore", "--state-file", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(sched_state(pid), now);
    assert_eq!(cpu_group(pid), group0);
    assert!(!s.exists());

    // Realtime again with a budget of 800 000 µs, then `qosd restore`:
    // policy, priority, nice back on every thread; the group gone.
    let out = qosd(&set(st, &["--rt-budget-us", "800000"], &p, "realtime"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(is_ours(pid), "{}", chrt(pid));
    assert_eq!(cpu_group(pid), group);
    assert_eq!(budget_of(&group).as_deref(), Some("800000"));
    let out = qosd(&["restore", "--state-file", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let restored = |now: Vec<(u32, u32, u32, i32)>| before.iter().all(|b| now.contains(b));
    assert!(
        restored(sched_state(pid)),
        "{before:?} vs {:?}",
        sched_state(pid)
    );
    assert_eq!(cpu_group(pid), group0);
    assert!(!std::path::Path::new(&format!("{CPU}{group}")).exists());
    assert!(!s.exists());

    // --hold, SIGKILL: stays real-time; keep the state file for a forgery;
    // then `qosd restore`.
    let args = set(st, &["--hold"], &p, "realtime");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut child, _out) = hold(&args);
    assert!(is_ours(pid));
    let late = app.new_thread();
    let forked = app.fork();
    assert!(is_ours(late) && is_ours(forked.0), "{}", chrt(forked.0));
    kill(&child, Signal::SIGKILL);
    child.wait().unwrap();
    assert!(is_ours(pid), "a killed qosd restores nothing itself");
    let honest = std::fs::read_to_string(&s).unwrap();
    let out = qosd(&["restore", "--state-file", st]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(restored(sched_state(pid)), "{:?}", sched_state(pid));
    assert!(!is_rt(late), "{}", chrt(late));
    assert!(!is_rt(forked.0), "{}", chrt(forked.0));
    assert!(!std::path::Path::new(&format!("{CPU}{group}")).exists());

    // The same state file with the originals forged to real-time: the
    // threads are SCHED_OTHER/batch now, so restoring it would raise them.
    let forged = honest
        .replace("\"other", "\"fifo:50")
        .replace("\"batch", "\"rr:50");
    assert_ne!(forged, honest, "{honest}");
    std::fs::write(&s, &forged).unwrap();
    let now = sched_state(pid);
    let out = qosd(&["restore", "--state-file", st]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("refused"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(sched_state(pid), now);
    std::fs::remove_file(&s).unwrap();

    // --hold, SIGTERM: qosd restores on its own.
    let (mut child, _out) = hold(&args);
    assert!(is_ours(pid));
    let late = app.new_thread();
    let forked = app.fork();
    kill(&child, Signal::SIGTERM);
    assert!(child.wait().unwrap().success());
    assert!(restored(sched_state(pid)), "{:?}", sched_state(pid));
    assert!(!is_rt(late) && !is_rt(forked.0), "{}", chrt(forked.0));
    assert_eq!(cpu_group(pid), group0);
    assert!(!std::path::Path::new(&format!("{CPU}{group}")).exists());
    assert!(!s.exists());
}

/// A daemon config in `dir` managing `pid` as an LC app that asks for
/// real time, with `realtime: { budget_us: BUDGET }` (line 13), its API
/// on `port`, its journal `dir/state.json`.
fn daemon_config(dir: &std::path::Path, pid: u32, port: u16, budget: &str) -> std::path::PathBuf {
    let y = format!(
        "apps:\n  - name: rtbudget\n    match: {{ pid: {pid} }}\n    class: lc\n    \
         target: {{ p99: 50ms }}\n    feedback: client\n    \
         resources: {{ initial: {{ cpu_priority: 3 }} }}\npolicy: {}\n\
         actuators: {{ enabled: [cpu_priority] }}\nsensors: {{ power: false }}\n\
         api: {{ listen: \"127.0.0.1:{port}\", token_file: {} }}\nstate_file: {}\n\
         realtime: {{ budget_us: {budget} }}\n",
        support::daemon::parties().display(),
        dir.join("api.token").display(),
        dir.join("state.json").display(),
    );
    let p = dir.join("qosd.yaml");
    std::fs::write(&p, y).unwrap();
    p
}

#[test]
fn real_daemon_realtime_budget_from_the_config_restored_after_sigterm_and_sigkill() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let app = Threads::start();
    let pid = app.pid();
    let before = sched_state(pid);
    let group0 = cpu_group(pid);
    let group = "/qosd-rtbudget";
    let d = tempfile::tempdir().unwrap();
    let st = d.path().join("state.json");
    let restored = || {
        let now = sched_state(pid);
        assert!(
            before.iter().all(|b| now.contains(b)),
            "{before:?} vs {now:?}"
        );
        assert_eq!(cpu_group(pid), group0);
        assert_eq!(budget_of(group), None, "the group is removed");
    };

    // Bad budgets: refused at file:line:col with the key (line 13), before
    // anything changes. 960 000 is above this machine's root group's
    // 950 000 (read from the hierarchy, named in the message).
    for (budget, msg) in [
        ("0", "1..=1000000"),
        ("1000001", "1..=1000000"),
        ("960000", "root cpu group's RT budget"),
    ] {
        let cfg = daemon_config(d.path(), pid, free_port(), budget);
        for cmd in [&["check"][..], &["run", "--config"]] {
            let out = Command::new(QOSD).args(cmd).arg(&cfg).output().unwrap();
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd:?} {budget}: {err}");
            assert!(
                err.contains("qosd.yaml:13:") && err.contains("realtime.budget_us"),
                "{cmd:?} {budget}: {err}"
            );
            assert!(err.contains(msg), "{cmd:?} {budget}: {err}");
        }
        assert_eq!(sched_state(pid), before);
        assert_eq!(cpu_group(pid), group0);
        assert!(!st.exists());
    }

    // The gate makes the idle app real-time (its CPU use is ~0 of the
    // node's CPUs, below 0.6) within a decision or two; 20 s (times the
    // kernel matrix's patience) covers a loaded machine's start-up.
    let port = free_port();
    let cfg = daemon_config(d.path(), pid, port, "800000");
    let realtime = || wait_for(patience(Duration::from_secs(20)), || is_ours(pid));
    let daemon = support::daemon::Daemon::start(&cfg, port, &[]);
    assert!(realtime(), "not real-time: {:?}", daemon.output());
    assert_eq!(budget_of(group).as_deref(), Some("800000"));
    let out = daemon.output();
    assert!(
        out.iter()
            .any(|l| l.starts_with("realtime: rtbudget") && l.contains("budget 800000 µs")),
        "{out:?}"
    );
    assert!(
        out.iter().any(|l| l.contains("group RT budget 800000 µs")),
        "the knobs table (caps) names the budget: {out:?}"
    );
    let (status, _) = daemon.stop();
    assert!(status.success(), "{status}");
    restored();
    assert!(!st.exists());

    // SIGKILL: the budget stays with the group; `qosd restore` puts the
    // threads and the process back and removes the group.
    let daemon = support::daemon::Daemon::start(&cfg, port, &[]);
    assert!(realtime(), "not real-time: {:?}", daemon.output());
    assert_eq!(budget_of(group).as_deref(), Some("800000"));
    kill(&daemon.child, Signal::SIGKILL);
    drop(daemon);
    assert!(is_ours(pid), "a killed qosd restores nothing itself");
    assert_eq!(budget_of(group).as_deref(), Some("800000"));
    let out = qosd(&["restore", "--state-file", st.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    restored();
    assert!(!st.exists());
}
