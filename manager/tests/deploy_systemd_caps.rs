//! The systemd unit's own command lines, read from the installed file, run
//! with only the unit's capabilities: the daemon starts and traces, a
//! crash is put right by `ExecStopPost`'s restore, and each capability the
//! unit lists is needed. Needs root (mount namespace, other users'
//! processes) and the Debian packages `systemd`, `make`, `memcached`.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use support::*;

/// Starts `argv` (a `qosd set --hold ...`) in the unit's namespace and
/// waits until it holds the change. The caller kills and waits for it.
#[allow(clippy::zombie_processes)]
fn hold_in_ns(ns: &UnitNs, argv: &[String]) -> std::process::Child {
    let mut child = ns
        .command(argv)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            let st = child.wait().unwrap();
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            panic!("{argv:?} exited ({st}) before holding: {err}");
        }
        if line.starts_with("holding") {
            return child;
        }
    }
}

/// The unit's ExecStartPre and ExecStopPost, exactly as written in the
/// installed file, with its CapabilityBoundingSet and NoNewPrivileges: a
/// `qosd` holding a knob of a memcached run as `nobody` is SIGKILLed (a
/// crash), and ExecStopPost puts the knob back from the state file under
/// /run/qosd. Every cores backend this machine has is exercised (cgroup
/// writes need CAP_DAC_OVERRIDE, affinity of another user's threads
/// CAP_SYS_NICE).
#[test]
fn unit_command_lines_restore_after_a_crash_with_only_the_unit_caps() {
    let d = tempfile::tempdir().unwrap();
    make_install(d.path(), &[]);
    let unit = d.path().join("usr/local/lib/systemd/system/qosd.service");
    let s = unit_settings(&unit);
    let ns = UnitNs::new(d.path(), &s);

    let pre = ns.command(&exec_argv(&s, "ExecStartPre")).output().unwrap();
    assert!(pre.status.success(), "ExecStartPre: {}", text(&pre.stderr));
    assert!(text(&pre.stdout).starts_with("ok: /etc/qosd/config.yaml"));

    let caps = Command::new(QOSD)
        .args(["caps", "--json"])
        .output()
        .unwrap();
    let caps: serde_json::Value = serde_json::from_slice(&caps.stdout).unwrap();
    let backends: Vec<String> = caps["cores"]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["available"] == true)
        .map(|b| b["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(backends.contains(&"affinity".to_owned()));

    let stop_post = exec_argv(&s, "ExecStopPost");
    let bin = exec_argv(&s, "ExecStart")[0].clone();
    let state = d.path().join("run/qosd/state.json");
    for backend in &backends {
        let mc = memcached(2);
        let pid = mc.pid();
        let (cpus0, cg0) = (cpus_allowed(pid), cgroups(pid));
        assert_eq!(cpus0, "0-1", "this test needs 2 CPUs");
        let argv: Vec<String> = [
            bin.as_str(),
            "set",
            "--hold",
            "cores",
            "--pid",
            &pid.to_string(),
            "--cpus",
            "1",
            "--backend",
            backend,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut held = hold_in_ns(&ns, &argv);
        assert_eq!(cpus_allowed(pid), "1", "{backend}: change made");
        assert!(state.is_file(), "{backend}: journal in /run/qosd");
        held.kill().unwrap(); // SIGKILL: no chance to restore itself
        held.wait().unwrap();
        assert_eq!(
            cpus_allowed(pid),
            "1",
            "{backend}: still changed after the crash"
        );

        let post = ns.command(&stop_post).output().unwrap();
        assert!(
            post.status.success(),
            "{backend}: ExecStopPost: {}",
            text(&post.stderr)
        );
        assert!(
            text(&post.stdout).contains("restored cores"),
            "{}",
            text(&post.stdout)
        );
        assert_eq!(cpus_allowed(pid), cpus0, "{backend}: affinity back");
        assert_eq!(cgroups(pid), cg0, "{backend}: cgroup back");
        assert!(!state.exists(), "{backend}: state file consumed");
    }
    // ExecStopPost with nothing to restore (a clean stop) succeeds too.
    let post = ns.command(&stop_post).output().unwrap();
    assert!(post.status.success());
    assert!(text(&post.stdout).contains("nothing to restore"));
    assert!(Path::new(&d.path().join("run/qosd")).is_dir());
}

/// GET `path` on the daemon's API; None until it answers 200.
fn api(port: u16, path: &str) -> Option<serde_json::Value> {
    let mut r = agent()
        .get(&format!("http://127.0.0.1:{port}{path}"))
        .call()
        .ok()
        .filter(|r| r.status() == 200)?;
    r.body_mut().read_json().ok()
}

/// ExecStart (`qosd run`, the real daemon with eBPF feedback) with only the
/// unit's capabilities manages a memcached run as `nobody`; SIGTERM (what
/// `systemctl stop` sends) restores its cores and exits 0; after SIGKILL
/// the cores stay changed until ExecStopPost restores them.
#[test]
fn unit_exec_start_runs_the_daemon_with_only_the_unit_caps() {
    let d = tempfile::tempdir().unwrap();
    make_install(d.path(), &[]);
    let unit = d.path().join("usr/local/lib/systemd/system/qosd.service");
    let s = unit_settings(&unit);
    let start = exec_argv(&s, "ExecStart");
    assert_eq!(start[1..], ["run", "--config", "/etc/qosd/config.yaml"]);
    let ns = UnitNs::new(d.path(), &s);
    for kill in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGKILL,
    ] {
        let mc = memcached(2);
        let pid = mc.pid();
        let cpus0 = cpus_allowed(pid);
        let port = free_port();
        // The installed config, pointed at this memcached and a free port.
        let conf = d.path().join("etc/qosd/config.yaml");
        let shipped = std::fs::read_to_string(repo().join("config.yaml")).unwrap();
        let edited = shipped
            .replace(
                "match: { comm: memcached }",
                &format!("match: {{ pid: {pid} }}"),
            )
            .replace(
                "listen: 127.0.0.1:9477",
                &format!("listen: 127.0.0.1:{port}"),
            );
        assert_ne!(edited, shipped);
        std::fs::write(&conf, edited).unwrap();

        let mut daemon = ns
            .command(&start)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let managed = wait_for(std::time::Duration::from_secs(30), || {
            api(port, "/v1/apps/memcached").is_some_and(|v| v["managed"] == true)
                && cpus_allowed(pid) != cpus0
        });
        if !managed {
            let _ = daemon.kill();
            let _ = daemon.wait();
            panic!("qosd run did not take memcached's cores within 30 s ({kill})");
        }
        let status = api(port, "/v1/status").unwrap();
        assert!(
            status["ebpf_dropped_records"].is_u64(),
            "the eBPF tracer runs: {status}"
        );
        // The unit's LimitNOFILE is in force and leaves the API its
        // configured connections (qosd caps them at half the limit).
        let nofile: u64 = s["LimitNOFILE"].last().unwrap().parse().unwrap();
        assert!(
            nofile / 2 >= 256,
            "LimitNOFILE={nofile} caps the API below 256"
        );
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", daemon.id())).unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap();
        assert_eq!(
            line.split_whitespace().nth(3),
            Some(nofile.to_string().as_str()),
            "{line}"
        );
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon.id() as i32), kill).unwrap();
        let st = daemon.wait().unwrap();
        let post = ns.command(&exec_argv(&s, "ExecStopPost")).output().unwrap();
        assert!(post.status.success(), "{}", text(&post.stderr));
        if kill == nix::sys::signal::Signal::SIGTERM {
            assert!(st.success(), "SIGTERM: {st}");
            assert!(text(&post.stdout).contains("nothing to restore"));
        } else {
            assert!(
                text(&post.stdout).contains("restored cores"),
                "{}",
                text(&post.stdout)
            );
        }
        assert_eq!(cpus_allowed(pid), cpus0, "{kill}: cores back");
    }
}

/// `argv` as root limited to `caps` (setpriv bounding set syntax).
fn with_caps(caps: &str, argv: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--no-new-privs", "--inh-caps=-all"])
        .arg(format!("--bounding-set={caps}"))
        .arg("--")
        .arg(QOSD)
        .args(argv)
        .output()
        .expect("setpriv (util-linux)")
}

/// `qosd trace` of a memcached (user nobody) on a connection opened before
/// the trace started, under `caps`: the requests it counted.
fn traced_on_an_old_connection(caps: &str, mc: &Server) -> (bool, u64, String) {
    use std::io::{BufRead, Write};
    let s = std::net::TcpStream::connect(("127.0.0.1", mc.port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let pid = mc.pid().to_string();
    let caps = caps.to_owned();
    let tracer = std::thread::spawn(move || {
        with_caps(
            &caps,
            &["trace", "--pid", &pid, "--duration", "4", "--json"],
        )
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut r = std::io::BufReader::new(s);
    let mut line = String::new();
    for i in 0..300 {
        r.get_mut()
            .write_all(format!("set k{i} 0 0 1\r\nx\r\n").as_bytes())
            .unwrap();
        line.clear();
        r.read_line(&mut line).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(3));
    }
    let out = tracer.join().unwrap();
    let summary = text(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["summary"] == true);
    let n = summary.and_then(|v| v["requests"].as_u64()).unwrap_or(0);
    (out.status.success(), n, text(&out.stderr))
}

/// Each capability of the unit is needed: with the unit's set the part of
/// qosd that uses it works, without that one capability it fails.
#[test]
fn each_unit_capability_is_needed() {
    let s = unit_settings(&repo().join("deploy/systemd/qosd.service"));
    let all = bounding_set(&s);
    let without = |cap: &str| {
        let c = all.replace(&format!(",+{cap}"), "");
        assert_ne!(c, all, "{cap} is in the unit");
        c
    };
    let mc = memcached(2);
    let pid = mc.pid().to_string();

    // CAP_BPF, CAP_PERFMON: loading and attaching the eBPF programs.
    let ok = with_caps(&all, &["trace", "--pid", &pid, "--duration", "1"]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    for cap in ["bpf", "perfmon"] {
        let out = with_caps(&without(cap), &["trace", "--pid", &pid, "--duration", "1"]);
        assert_eq!(out.status.code(), Some(1), "without {cap}");
        assert!(
            text(&out.stderr).contains("CAP_BPF and CAP_PERFMON"),
            "{}",
            text(&out.stderr)
        );
    }

    // CAP_SYS_PTRACE: the connections a process accepted before qosd
    // started are found through /proc/PID/fd.
    let (ok, n, err) = traced_on_an_old_connection(&all, &mc);
    assert!(ok && n >= 50, "with the unit's caps: {n} requests; {err}");
    let (ok, n, err) = traced_on_an_old_connection(&without("sys_ptrace"), &mc);
    assert!(ok && n == 0, "without CAP_SYS_PTRACE: {n} requests; {err}");

    // CAP_SYS_NICE: affinity of another user's threads; CAP_DAC_OVERRIDE:
    // a group in a cgroup root (mode 0555), where this machine has one.
    let caps = Command::new(QOSD)
        .args(["caps", "--json"])
        .output()
        .unwrap();
    let caps: serde_json::Value = serde_json::from_slice(&caps.stdout).unwrap();
    let cgroup = caps["cores"]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["available"] == true && b["name"].as_str().unwrap().starts_with("cgroup"))
        .map(|b| b["name"].as_str().unwrap().to_owned());
    let mut cases = vec![("sys_nice", "affinity".to_owned())];
    match cgroup {
        Some(b) => cases.push(("dac_override", b)),
        None => eprintln!("CAP_DAC_OVERRIDE not checked: no cgroup cpuset on this machine"),
    }
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("state.json");
    let st = state.to_str().unwrap();
    for (cap, backend) in cases {
        let set = [
            "set",
            "--state-file",
            st,
            "cores",
            "--pid",
            &pid,
            "--cpus",
            "1",
            "--backend",
            &backend,
        ];
        let ok = with_caps(&all, &set);
        assert!(ok.status.success(), "{backend}: {}", text(&ok.stderr));
        let back = Command::new(QOSD)
            .args(["restore", "--state-file", st])
            .output()
            .unwrap();
        assert!(back.status.success());
        let out = with_caps(&without(cap), &set);
        assert_eq!(out.status.code(), Some(1), "{backend} without {cap}");
        assert!(
            text(&out.stderr).contains("EPERM") || text(&out.stderr).contains("Permission denied"),
            "{}",
            text(&out.stderr)
        );
        let _ = Command::new(QOSD)
            .args(["restore", "--state-file", st])
            .output();
        assert_eq!(cpus_allowed(mc.pid()), "0-1");
    }
}
