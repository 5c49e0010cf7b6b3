//! The daemon's HTTP API against a real memcached (root, eBPF; `--dry-run`
//! so no knob moves): the paper's four calls per pid and per app with
//! units in the keys, bad requests, client feedback, `/metrics`, and a
//! real Prometheus server scraping it. Run alone:
//! `cargo test -p qosd-manager --test daemon_api`.

mod support;

use std::time::{Duration, Instant};

use support::*;

#[test]
fn daemon_api_four_calls_per_pid_and_app() {
    let mc = support::memcached(2);
    let pid = mc.pid();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let name = format!("api-{pid}");
    let cfg = write_config(
        dir.path(),
        port,
        &[AppSpec {
            name: &name,
            matcher: format!("{{ pid: {pid} }}"),
            target_us: Some(5000.0),
            feedback: "ebpf",
            resources: "{}",
        }],
    );
    let orig = thread_cpus(pid);
    let d = Daemon::start(&cfg, port, &["--dry-run"]);
    // Requests right before the calls, so the last second has some.
    let lat = sequential_latencies(mc.port, 3000);
    assert!(wait_for(Duration::from_secs(5), || {
        d.get(&format!("/v1/pids/{pid}/rps"))["rps"]
            .as_f64()
            .unwrap_or(0.0)
            > 0.0
    }));
    let _ = sequential_latencies(mc.port, 500);

    let rps = d.get(&format!("/v1/pids/{pid}/rps"));
    assert_eq!(rps["pid"].as_u64(), Some(u64::from(pid)));
    assert_eq!(rps["app"], name.as_str());
    assert!(rps["rps"].as_f64().unwrap() > 0.0, "{rps}");
    let latest = d.get(&format!("/v1/pids/{pid}/latest_latency"));
    let avg = d.get(&format!("/v1/pids/{pid}/average_latency"));
    let p99 = d.get(&format!("/v1/pids/{pid}/latency_percentile?p=99"));
    let p50 = d.get(&format!("/v1/pids/{pid}/latency_percentile?p=50"));
    for v in [&latest, &avg, &p99, &p50] {
        let us = v["latency_us"].as_f64().unwrap_or_else(|| panic!("{v}"));
        assert!(us > 0.0, "{v}");
        // Server-side is inside what the client saw.
        assert!(
            us <= lat.iter().cloned().fold(0.0, f64::max) * 1.01 + 1.0,
            "{v}"
        );
    }
    assert_eq!(p99["p"].as_f64(), Some(99.0));
    assert!(
        p99["latency_us"].as_f64() >= p50["latency_us"].as_f64(),
        "{p50} {p99}"
    );
    // Records reach the daemon within one poll of the ring buffer (20 ms).
    assert!(wait_for(Duration::from_secs(2), || {
        d.get(&format!("/v1/pids/{pid}"))["requests_total"]
            .as_u64()
            .unwrap_or(0)
            >= 3500
    }));
    let whole = d.get(&format!("/v1/pids/{pid}"));
    assert_eq!(whole["mode"], "turn", "{whole}");

    // Per app: the same four calls over the last decision interval.
    let _ = sequential_latencies(mc.port, 500);
    let a = d.get(&format!("/v1/apps/{name}/latency_percentile?p=99.9"));
    assert_eq!(
        (a["app"].as_str(), a["p"].as_f64()),
        (Some(name.as_str()), Some(99.9)),
        "{a}"
    );
    assert_eq!(a["window_ms"], 500);
    for call in ["rps", "latest_latency", "average_latency"] {
        let v = d.get(&format!("/v1/apps/{name}/{call}"));
        assert_eq!(v["app"], name.as_str(), "{v}");
    }
    // Either eBPF figure of the app over the same ticks, as for pids: the
    // configured one (latency, from arrival) by default, service on asking.
    assert_eq!(a["figure"], "latency", "{a}");
    let both = || {
        let _ = sequential_latencies(mc.port, 200);
        let f = |fig: &str| {
            d.get(&format!(
                "/v1/apps/{name}/latency_percentile?p=99&figure={fig}"
            ))
        };
        (f("latency"), f("service"))
    };
    assert!(wait_for(Duration::from_secs(5), || {
        let (l, s) = both();
        l["latency_us"].is_f64() && s["latency_us"].is_f64()
    }));
    let (l, s) = both();
    assert_eq!(
        (l["figure"].as_str(), s["figure"].as_str()),
        (Some("latency"), Some("service"))
    );
    let lu = l["latency_us"].as_f64().unwrap_or_else(|| panic!("{l}"));
    let su = s["latency_us"].as_f64().unwrap_or_else(|| panic!("{s}"));
    // Each request's arrival is at or before its first read.
    assert!(lu >= su && su > 0.0, "{l} {s}");
    let e = d.get_status(&format!("/v1/apps/{name}/average_latency?figure=cpu"), 400);
    assert!(e["error"].as_str().unwrap().contains("figure=cpu"), "{e}");
    // The app's figures take in what the tracer has at each 100 ms tick.
    assert!(wait_for(Duration::from_secs(2), || {
        d.get("/v1/apps")[0]["requests_total"].as_u64().unwrap_or(0) >= 3500
    }));
    let list = d.get("/v1/apps");
    assert_eq!(list[0]["name"], name.as_str());
    assert_eq!(list[0]["pids"][0].as_u64(), Some(u64::from(pid)));
    assert!(
        list[0]["requests_total"].as_u64().unwrap() >= 3500,
        "{list}"
    );

    // Bad requests name what is wrong.
    let e = d.get_status(&format!("/v1/pids/{pid}/latency_percentile?p=150"), 400);
    assert!(e["error"].as_str().unwrap().contains("p=150"), "{e}");
    let e = d.get_status("/v1/pids/1/rps", 404);
    assert!(
        e["error"].as_str().unwrap().contains("pid 1 is not traced"),
        "{e}"
    );
    let e = d.get_status("/v1/apps/nope", 404);
    assert!(e["error"].as_str().unwrap().contains(&name), "{e}");
    let e = d.get_status(&format!("/v1/pids/{pid}/throughput"), 404);
    assert!(
        e["error"].as_str().unwrap().contains("latency_percentile"),
        "{e}"
    );

    // Client feedback: accepted (not used: this app's source is eBPF),
    // malformed bodies refused, the config.yaml alias works.
    let (code, v) = d.post(
        &format!("/v1/apps/{name}/latency"),
        r#"{"latencies_us":[120.5,98]}"#,
    );
    assert_eq!(
        (code, v["accepted"].as_u64(), v["used_by_policy"].as_bool()),
        (200, Some(2), Some(false)),
        "{v}"
    );
    let (code, v) = d.post(&format!("/apps/{name}/latency"), r#"{"latencies_us":[1]}"#);
    assert_eq!(code, 200, "{v}");
    let (code, v) = d.post(
        &format!("/v1/apps/{name}/latency"),
        r#"{"latencies_us":[1,-2]}"#,
    );
    assert_eq!(code, 400, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("latencies_us[1]"),
        "{v}"
    );
    let (code, _) = d.post(&format!("/v1/apps/{name}/latency"), r#"{"latency":[1]}"#);
    assert_eq!(code, 400);
    let (code, _) = d.post("/v1/apps/nope/latency", r#"{"latencies_us":[1]}"#);
    assert_eq!(code, 404);

    // Power: the power sensor runs (RAPL, else the model, an estimate).
    let status = d.get("/v1/status");
    let source = status["run"]["power"].as_str().unwrap().to_owned();
    assert!(source == "rapl" || source == "model", "{status}");
    assert!(wait_for(Duration::from_secs(5), || {
        d.get(&format!("/v1/apps/{name}"))["power_w"]
            .as_f64()
            .is_some()
    }));
    let a = d.get(&format!("/v1/apps/{name}"));
    assert!(a["power_w"].as_f64().unwrap() >= 0.0, "{a}");
    assert_eq!(a["power"]["estimate"], source == "model", "{a}");

    // Prometheus text.
    let (ct, m) = d.get_text("/metrics");
    let est = if source == "model" { "true" } else { "false" };
    assert!(
        m.contains(&format!(
            "qosd_app_power_watts{{app=\"{name}\",estimate=\"{est}\"}}"
        )),
        "{m}"
    );
    assert!(
        m.contains(&format!("qosd_node_power_watts{{estimate=\"{est}\"}}")),
        "{m}"
    );
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    for needle in [
        format!("qosd_app_requests_total{{app=\"{name}\"}}"),
        format!("qosd_app_latency_seconds{{app=\"{name}\",quantile=\"0.99\"}}"),
        format!("qosd_app_latency_seconds_count{{app=\"{name}\"}}"),
        format!("qosd_app_latency_target_seconds{{app=\"{name}\",quantile=\"0.99\"}} 0.005"),
        format!("qosd_app_requests_per_second{{app=\"{name}\"}}"),
        // Cores unset in `initial`: the app took every free core.
        format!("qosd_app_cores{{app=\"{name}\"}}"),
        "qosd_ebpf_dropped_records_total ".to_owned(),
        "# TYPE qosd_app_latency_seconds gauge".to_owned(),
        "# TYPE qosd_decisions_total counter".to_owned(),
        "process_resident_memory_bytes ".to_owned(),
    ] {
        assert!(m.contains(&needle), "{needle} missing:\n{m}");
    }
    for l in m.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("{l}"));
        assert!(value == "NaN" || value.parse::<f64>().is_ok(), "{l}");
        assert!(
            series.starts_with("qosd_") || series.starts_with("process_"),
            "{l}"
        );
    }
    let (st, out) = d.stop();
    assert!(st.success(), "{out:?}");
    assert!(out.iter().any(|l| l.contains("DRY RUN")), "{out:?}");
    assert_eq!(thread_cpus(pid), orig, "a dry run changed the affinity");
}

#[test]
fn daemon_api_real_prometheus_scrapes_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let name = format!("prom-{}", std::process::id());
    let cfg = write_config(
        dir.path(),
        port,
        &[AppSpec {
            name: &name,
            matcher: "{ comm: qd-never-runs }".into(),
            target_us: Some(1000.0),
            feedback: "client",
            resources: "{}",
        }],
    );
    let d = Daemon::start(&cfg, port, &["--dry-run"]);
    let (code, _) = d.post(
        &format!("/v1/apps/{name}/latency"),
        r#"{"latencies_us":[100,200,300]}"#,
    );
    assert_eq!(code, 200);

    let prom = Prometheus::start(dir.path(), port);
    let query = |q: &str| -> Option<serde_json::Value> {
        let res = prom.query(q)["data"]["result"].as_array()?.clone();
        (!res.is_empty()).then_some(serde_json::Value::Array(res))
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut got = None;
    while Instant::now() < deadline {
        if let Some(r) = query("qosd_app_requests_total") {
            got = Some(r);
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let r = got.expect("Prometheus returned no qosd_app_requests_total series in 90 s");
    let series = r
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["metric"]["app"] == name.as_str())
        .unwrap_or_else(|| panic!("no series for app {name}: {r}"));
    assert_eq!(series["metric"]["job"], "qosd", "{series}");
    // The three reported latencies were counted by the next tick.
    assert!(wait_for(Duration::from_secs(20), || {
        query(&format!("qosd_app_requests_total{{app=\"{name}\"}}"))
            .and_then(|v| v[0]["value"][1].as_str().map(|s| s == "3"))
            .unwrap_or(false)
    }));
    let up = query("up{job=\"qosd\"}").expect("up series");
    assert_eq!(up[0]["value"][1], "1", "scrape failed: {up}");
    let (st, _) = d.stop();
    assert!(st.success());
}
