//! The control loop on a fake tree (no root, deterministic): an app is
//! found and admitted on one core, reported latencies over its target get
//! it a second core at the next decision, silence gives it back, and its
//! exit removes its cpuset group. Plus the `/metrics` exposition.

use std::path::Path;

use qosd_actuators::Actuators;
use qosd_core::{Feedback, Resource};

use super::control::{live_entry, Controller};
use super::state::{KnobInfo, RunInfo, Shared, SharedState};
use crate::config::Config;
use crate::node::actuate::Actuation;
use crate::policy::{Parties, PartiesParams};

fn put(root: &Path, abs: &str, text: &str) {
    let p = root.join(abs.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn get(root: &Path, abs: &str) -> String {
    std::fs::read_to_string(root.join(abs.trim_start_matches('/'))).unwrap_or_default()
}

/// 4 CPUs, a v1 cpuset hierarchy, process 4242 `srv`.
fn tree(root: &Path) {
    put(root, "/sys/devices/system/cpu/online", "0-3\n");
    for c in 0..4 {
        let p = format!("/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list");
        put(root, &p, &format!("{c}\n"));
    }
    let cg = "/sys/fs/cgroup/cpuset";
    put(root, &format!("{cg}/cpuset.cpus"), "0-3\n");
    put(root, &format!("{cg}/cpuset.mems"), "0\n");
    put(root, &format!("{cg}/cgroup.procs"), "4242\n");
    put(
        root,
        "/proc/self/mounts",
        "cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n",
    );
    put(root, "/proc/stat", "cpu  100 0 100 800 0 0 0 0 0 0\n");
    put(root, "/proc/4242/comm", "srv\n");
    put(
        root,
        "/proc/4242/stat",
        "4242 (srv) S 1 4242 4242 0 -1 4194560 100 0 0 0 10 5 0 0 20 0 1 0 12345 1000 100\n",
    );
    put(
        root,
        "/proc/4242/status",
        "Name:\tsrv\nCpus_allowed_list:\t0-3\n",
    );
    put(root, "/proc/4242/cgroup", "5:cpuset:/\n");
    std::fs::create_dir_all(root.join("proc/4242/task/4242")).unwrap();
}

const CONFIG: &str = "\
apps:
  - name: web
    match: { pid: 4242 }
    class: lc
    target: { p99: 1ms }
    feedback: client
    resources: { initial: { nr_cores: 1 }, max: { nr_cores: 2 } }
";

fn info() -> RunInfo {
    RunInfo {
        version: "test",
        policy: "parties".into(),
        config: "config.yaml".into(),
        monitor_interval_ms: 100,
        decide_interval_ms: 500,
        latency_window_ms: 500,
        dry_run: false,
        knobs: vec![KnobInfo {
            resource: Resource::Cores,
            in_use: true,
            backend: Some("cgroup1".into()),
            reason: String::new(),
        }],
        ebpf: false,
        power: "none".into(),
        started_unix_ms: 0,
    }
}

#[test]
fn control_loop_on_a_fake_tree() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    tree(&root);
    let cfg = Config::parse(Path::new("config.yaml"), CONFIG).unwrap();
    let act_cfg = qosd_actuators::Config {
        root: root.clone(),
        state_file: Some(d.path().join("state.json")),
        ..Default::default()
    };
    let act = Actuation::new(Actuators::new(&act_cfg).unwrap(), &cfg.actuators.enabled).unwrap();
    assert_eq!(act.node().nr_cores, 4);
    let mut shared = Shared::new(info());
    shared
        .apps
        .insert("web".into(), live_entry(&cfg.apps[0], Feedback::Client, 5));
    let shared = SharedState::new(shared);
    let policy = Box::new(Parties::new("parties", PartiesParams::default(), 0));
    let mut ctl = Controller::new(
        &cfg.apps,
        None,
        policy,
        act,
        None,
        shared.clone(),
        &root,
        false,
    );
    let group = "/sys/fs/cgroup/cpuset/qosd-web";

    let ev = ctl.tick(0, 0.0, true, false);
    assert!(
        ev.iter().any(|e| e.contains("starts with 1 core (CPU 0)")),
        "{ev:?}"
    );
    assert_eq!(get(&root, &format!("{group}/cpuset.cpus")), "0");
    assert_eq!(get(&root, &format!("{group}/cgroup.procs")).trim(), "4242");

    // 5 ms latencies against a 1 ms target: the next decision upsizes.
    let mut t = 0;
    let mut step = |ctl: &mut Controller, report: bool| {
        if report {
            let mut sh = shared.lock();
            sh.apps
                .get_mut("web")
                .unwrap()
                .inbox
                .record_us(&[5000.0; 50])
                .unwrap();
        }
        t += 100;
        ctl.tick(t, 0.1, t % 500 == 0, t % 500 == 0)
    };
    let mut evs = Vec::new();
    for _ in 0..5 {
        evs.extend(step(&mut ctl, true));
    }
    assert!(
        evs.iter().any(|e| e.contains("Upsize cores: 1 -> 2")),
        "{evs:?}"
    );
    assert_eq!(get(&root, &format!("{group}/cpuset.cpus")), "0-1");
    {
        let sh = shared.lock();
        let web = &sh.apps["web"];
        assert_eq!(web.share.unwrap().nr_cores, 2);
        assert_eq!(web.recent.requests_total(), 250);
        assert!(
            (web.recent.rps() - 500.0).abs() < 1e-6,
            "{}",
            web.recent.rps()
        );
        let d = sh.decisions.back().unwrap();
        assert!(d.applied && d.reason.contains("slack"), "{d:?}");
    }
    // At its max of 2: more violations change nothing.
    for _ in 0..5 {
        step(&mut ctl, true);
    }
    assert_eq!(get(&root, &format!("{group}/cpuset.cpus")), "0-1");
    // No reports for a decision interval: idle, one core back.
    let mut evs = Vec::new();
    for _ in 0..10 {
        evs.extend(step(&mut ctl, false));
    }
    assert!(
        evs.iter().any(|e| e.contains("Downsize cores: 2 -> 1")),
        "{evs:?}"
    );
    assert_eq!(get(&root, &format!("{group}/cpuset.cpus")), "0");

    // The process exits: released, its group removed.
    std::fs::remove_dir_all(root.join("proc/4242")).unwrap();
    let evs = step(&mut ctl, false);
    assert!(
        evs.iter()
            .any(|e| e.contains("exited") && e.contains("released")),
        "{evs:?}"
    );
    assert!(!root.join(group.trim_start_matches('/')).exists());
    let sh = shared.lock();
    assert_eq!(sh.apps["web"].share, None);
    assert_eq!(sh.apps["web"].note.as_deref(), Some("not running"));
    let text = super::metrics::render(&sh, Some(7));
    for needle in [
        "qosd_decisions_total{app=\"web\",resource=\"cores\",kind=\"upsize\"} 1",
        "qosd_decisions_total{app=\"web\",resource=\"cores\",kind=\"downsize\"} 1",
        "qosd_app_requests_total{app=\"web\"} 500",
        "qosd_app_client_latencies_total{app=\"web\"} 500",
        "qosd_app_latency_seconds{app=\"web\",quantile=\"0.99\"} NaN",
        "qosd_app_latency_seconds_count{app=\"web\"} 500",
        "qosd_app_latency_target_seconds{app=\"web\",quantile=\"0.99\"} 0.001",
        "qosd_app_managed{app=\"web\"} 0",
        "qosd_ebpf_dropped_records_total 7",
        "qosd_knob_in_use{resource=\"cores\",backend=\"cgroup1\"} 1",
        "qosd_ticks_total{kind=\"decide\"} 4",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
    // Every family is declared once, before its samples.
    let mut declared = std::collections::BTreeSet::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap();
            assert!(declared.insert(name.to_owned()), "{name} declared twice");
        } else if !l.starts_with('#') {
            let name = l.split(['{', ' ']).next().unwrap();
            let base = name
                .strip_suffix("_sum")
                .or_else(|| name.strip_suffix("_count"))
                .filter(|b| declared.contains(*b))
                .unwrap_or(name);
            assert!(declared.contains(base), "{name} has no # TYPE");
        }
    }
}
