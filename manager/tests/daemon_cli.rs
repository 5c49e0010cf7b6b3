//! `qosd run` and `qosd metrics` at their edges: malformed or mistyped
//! config and policy files exit 2 with FILE:LINE:COL: KEY and change
//! nothing (no state file, no cgroup, the process untouched); a busy API
//! port exits 1 before touching anything; `qosd metrics` against no daemon
//! (exit 1), an unknown app (exit 2), and its table and JSON against a
//! dry-run daemon. Run alone: `cargo test -p qosd-manager --test daemon_cli`.

mod support;

use std::path::Path;
use std::time::Duration;

use support::*;

fn config_text(pid: u32, target: &str, extra: &str, state: &Path, port: u16) -> String {
    format!(
        "apps:\n  - name: bad-{pid}\n    match: {{ pid: {pid} }}\n    class: lc\n    {target}\n\
         policy: {}\nstate_file: {}\napi: {{ listen: 127.0.0.1:{port} }}\n{extra}",
        parties().display(),
        state.display()
    )
}

#[test]
fn daemon_cli_bad_input_exits_2_names_the_spot_and_applies_nothing() {
    let sleeper = Killed::sleeper(60);
    let pid = sleeper.pid();
    let before = (thread_cpus(pid), cgroups(pid));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let cfg = dir.path().join("config.yaml");
    let port = free_port();
    let group = format!("/sys/fs/cgroup/cpuset/qosd-bad-{pid}");
    let cases = [
        (
            "targt: { p99: 1ms }",
            "",
            "5:5: apps[0].targt: unknown field",
        ),
        (
            "target: { p99: 5parsecs }",
            "",
            "5:15: apps[0].target.p99: `5parsecs`: unknown unit",
        ),
        (
            "target: { p99: 0ms }",
            "",
            "5:15: apps[0].target.p99: `0ms`: a target must be greater than 0",
        ),
        (
            "target: { p99: 1ms }",
            "actuators:\n  enabled: [cores, gpus]\n",
            "10:20: actuators.enabled[1]: unknown variant `gpus`",
        ),
        (
            "target: { p99: 1ms }",
            "monitor_interval_ms: 100\ndecide_interval_ms: 250\n",
            "10:1: decide_interval_ms: must be a multiple",
        ),
        (
            "target: { p99: 1ms }",
            "power:\n  ht_ratio: 5\n",
            "10:3: power.ht_ratio: 5 is outside 1..=2",
        ),
    ];
    for (target, extra, want) in cases {
        std::fs::write(&cfg, config_text(pid, target, extra, &state, port)).unwrap();
        let out = qosd(&["run", "--config", cfg.to_str().unwrap()]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{target} {extra}: {err}");
        let expect = format!("{}:{want}", cfg.display());
        assert!(err.contains(&expect), "want {expect:?} in {err:?}");
        assert!(
            text(&out.stdout).is_empty(),
            "printed before failing: {}",
            text(&out.stdout)
        );
    }
    // A mistyped policy given on the command line.
    std::fs::write(
        &cfg,
        config_text(pid, "target: { p99: 1ms }", "", &state, port),
    )
    .unwrap();
    let pol = dir.path().join("policy.yaml");
    std::fs::write(&pol, "name: p\nparties:\n  upsize_below_slak: 0.1\n").unwrap();
    let out = qosd(&[
        "run",
        "--config",
        cfg.to_str().unwrap(),
        "--policy",
        pol.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let want = format!("{}:3:3: parties.upsize_below_slak", pol.display());
    assert!(text(&out.stderr).contains(&want), "{}", text(&out.stderr));
    // A config file that does not exist.
    let out = qosd(&["run", "--config", "/nonexistent/qosd.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("/nonexistent/qosd.yaml"));

    // Nothing was applied.
    assert!(
        !state.exists() && !state.with_extension("lock").exists(),
        "state file made"
    );
    assert!(!Path::new(&group).exists(), "{group} made");
    assert_eq!((thread_cpus(pid), cgroups(pid)), before);
}

#[test]
fn daemon_cli_busy_port_exits_1_before_touching_anything() {
    let sleeper = Killed::sleeper(60);
    let pid = sleeper.pid();
    let before = (thread_cpus(pid), cgroups(pid));
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        config_text(pid, "target: { p99: 1ms }", "", &state, port),
    )
    .unwrap();
    let out = qosd(&["run", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("binding the API to 127.0.0.1:{port}")));
    assert!(!state.exists());
    assert_eq!((thread_cpus(pid), cgroups(pid)), before);
}

#[test]
fn daemon_cli_metrics_against_no_daemon_and_a_dry_run_daemon() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let out = qosd(&["metrics", "--addr", &addr]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no qosd daemon answering"),
        "{}",
        text(&out.stderr)
    );

    let sleeper = Killed::sleeper(60);
    let pid = sleeper.pid();
    let dir = tempfile::tempdir().unwrap();
    let name = format!("cli-{pid}");
    let cfg = write_config(
        dir.path(),
        port,
        &[AppSpec {
            name: &name,
            matcher: format!("{{ pid: {pid} }}"),
            target_us: Some(2000.0),
            feedback: "client",
            resources: "{ initial: { nr_cores: 1 } }",
        }],
    );
    let d = Daemon::start(&cfg, port, &["--dry-run"]);
    let (code, _) = d.post(
        &format!("/v1/apps/{name}/latency"),
        r#"{"latencies_us":[1500,900,1200]}"#,
    );
    assert_eq!(code, 200);
    // The next tick takes the reports in.
    assert!(wait_for(Duration::from_secs(5), || {
        d.get(&format!("/v1/apps/{name}"))["requests_total"] == 3
    }));

    let out = qosd(&["metrics", "--addr", &addr]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let head = s.lines().next().unwrap();
    assert!(
        head.starts_with("app") && head.contains("latency") && head.contains("allocation"),
        "{s}"
    );
    let row = s
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("{s}"));
    assert!(
        row.contains("client") && row.contains(&pid.to_string()) && row.contains("2.00 ms"),
        "{row}"
    );
    assert!(
        row.contains("1 core (0)") || row.contains("1 core (1)"),
        "{row}"
    );

    let out = qosd(&[
        "metrics", "--addr", &addr, "--app", &name, "--p", "50", "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["name"], name.as_str());
    let p50 = v["latency"]["p50_us"].as_f64().unwrap();
    assert!((p50 - 1200.0).abs() < 10.0, "{v}");

    let out = qosd(&["metrics", "--addr", &addr, "--app", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no app named nope"),
        "{}",
        text(&out.stderr)
    );
    let out = qosd(&["metrics", "--addr", &addr, "--p", "120"]);
    assert_eq!(out.status.code(), Some(2));
    let (st, _) = d.stop();
    assert!(st.success());
}
