//! Operational analysis on a real server (root, real cgroups, real eBPF):
//! two fixture servers (`qosd fixture --work-us 2000`: 2 ms of CPU time
//! burnt per request, measured on the thread's own clock) held at 0.5 and
//! 1.0 CPU of quota by `qosd run`, each under the same paced load. The
//! daemon's service demand D (its CPU time ÷ the requests eBPF counted)
//! must be the fixture's 2 ms, up to 5 % below and 15 % above (the
//! server's own CPU per request, accepting, parsing and writing, comes on
//! top of the burnt 2 ms: 2–10 % measured), X_sat = c / D must scale with
//! the quota, U = X·D / c must follow with X the rate the client saw, in
//! the API per app and per pid and in `/metrics`.
//!
//! Why D may read a little below the work: it is one decision interval's
//! CPU time over the requests eBPF *reported* in that interval's ticks
//! (the ring buffer is read every 20 ms, later under load, and a
//! keep-alive turn's record leaves when the next request comes), not the
//! requests that ended in it, so X is off by a request or a few (152.6
//! counted against 150.0 sent: D 0.993x) and D with it; the truth over
//! 10 s is 1.03x (docs/control.md). Session 9's 0.94x added `stat`'s
//! ±20 ms truncation of the CPU time, gone since it is read on the
//! process's CPU clock. Run alone:
//! `cargo test --release -p qosd-manager --test daemon_oa`.

mod support;

use std::io::{BufReader, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

/// CPU time the fixture burns per request, µs.
const WORK_US: u64 = 2000;

/// One keep-alive connection, one request at a time, paced to `rps`, for
/// `secs`: the requests answered per second.
fn paced(port: u16, rps: f64, secs: f64) -> f64 {
    let mut r = BufReader::new(connect(port));
    let t0 = Instant::now();
    let n_max = (rps * secs) as u32;
    let mut n = 0;
    while n < n_max && t0.elapsed().as_secs_f64() < secs + 5.0 {
        let due = t0 + Duration::from_secs_f64(f64::from(n) / rps);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        r.get_mut()
            .write_all(b"GET / HTTP/1.1\r\nHost: qosd\r\n\r\n")
            .unwrap();
        read_http_response(&mut r);
        n += 1;
    }
    f64::from(n) / t0.elapsed().as_secs_f64()
}

fn config(dir: &Path, port: u16, apps: &[(&str, u32, u32)]) -> std::path::PathBuf {
    let mut y = String::from("apps:\n");
    for (name, pid, milli) in apps {
        // min = max = initial: nothing moves, the allocation is known.
        let q = format!("{{ cpu_quota_milli: {milli} }}");
        y += &format!(
            "  - name: {name}\n    match: {{ pid: {pid} }}\n    class: lc\n    \
             target: {{ p99: 1s }}\n    feedback: ebpf\n    \
             resources: {{ initial: {q}, min: {q}, max: {q} }}\n"
        );
    }
    y += &format!(
        "policy: {}\nmonitor_interval_ms: 100\ndecide_interval_ms: 1000\n\
         actuators:\n  enabled: [cpu_quota]\n\
         api:\n  listen: 127.0.0.1:{port}\n  token_file: {d}/api.token\n\
         state_file: {d}/state.json\n",
        parties().display(),
        d = dir.display(),
    );
    let p = dir.join("config.yaml");
    std::fs::write(&p, y).unwrap();
    p
}

/// D against the fixture's work: the server's own per-request CPU time
/// comes on top of it (`DEMAND_ABOVE`), never below (`DEMAND_BELOW`).
const DEMAND_BELOW: f64 = 0.95;
const DEMAND_ABOVE: f64 = 1.15;

fn demand_ok(what: &str, got: f64, work: f64) {
    assert!(
        (DEMAND_BELOW * work..=DEMAND_ABOVE * work).contains(&got),
        "{what}: {got:.5} against the work {work:.5} (want {DEMAND_BELOW}-{DEMAND_ABOVE} x)"
    );
}

/// X_sat = c / D against c / work: the inverse band of [`demand_ok`].
fn x_sat_ok(what: &str, got: f64, c: f64, work: f64) {
    let want = c / work;
    assert!(
        (want / DEMAND_ABOVE..=want / DEMAND_BELOW).contains(&got),
        "{what}: {got:.1} against c / work {want:.1} (want 1/{DEMAND_ABOVE}-1/{DEMAND_BELOW} x)"
    );
}

fn within(what: &str, got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol * want,
        "{what}: {got:.4} against {want:.4} (± {:.0} %)",
        tol * 100.0
    );
}

/// `NAME{app="APP"} V` in a /metrics text.
fn gauge(metrics: &str, name: &str, app: &str) -> Option<f64> {
    let prefix = format!("{name}{{app=\"{app}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
}

#[test]
fn demand_utilisation_and_saturation_match_the_fixtures_work_at_two_quotas() {
    let (half, half_port) = fixture(WORK_US);
    let (one, one_port) = fixture(WORK_US);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let tag = std::process::id();
    let (a, b) = (format!("oa-c19-half-{tag}"), format!("oa-c19-one-{tag}"));
    let cfg = config(
        dir.path(),
        port,
        &[(&a, half.pid(), 500), (&b, one.pid(), 1000)],
    );
    let d = Daemon::start(&cfg, port, &[]);
    assert!(
        wait_for(Duration::from_secs(10), || [&a, &b]
            .iter()
            .all(|n| d.get(&format!("/v1/apps/{n}"))["managed"] == true)),
        "apps not managed: {:?}",
        d.output()
    );
    // 150 req/s × 2 ms = 0.3 CPU: U 0.6 on 0.5 CPU, 0.3 on 1 CPU. The
    // figures read are the last decision interval's, under load.
    const RPS: f64 = 150.0;
    let loads: Vec<_> = [half_port, one_port]
        .into_iter()
        .map(|p| std::thread::spawn(move || paced(p, RPS, 7.0)))
        .collect();
    // Per-pid figures need a decision interval of the pid's own counts
    // before the one they describe.
    let have = |k: &Killed| !d.get(&format!("/v1/pids/{}", k.pid()))["oa"].is_null();
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        wait_for(Duration::from_secs(3), || have(&half) && have(&one)),
        "no per-pid figures: {:?}",
        d.output()
    );
    let apps: Vec<Value> = [&a, &b]
        .iter()
        .map(|n| d.get(&format!("/v1/apps/{n}")))
        .collect();
    let pids: Vec<Value> = [&half, &one]
        .iter()
        .map(|k| d.get(&format!("/v1/pids/{}", k.pid())))
        .collect();
    let metrics = d.get_text("/metrics").1;
    let achieved: Vec<f64> = loads.into_iter().map(|h| h.join().unwrap()).collect();
    let d_s = WORK_US as f64 * 1e-6;
    for (i, (c, name)) in [(0.5, &a), (1.0, &b)].into_iter().enumerate() {
        let oa = &apps[i]["oa"];
        let f = |k: &str| {
            oa[k]
                .as_f64()
                .unwrap_or_else(|| panic!("{name}: no {k} in {}", apps[i]))
        };
        eprintln!("{name}: client {:.1} req/s, oa {oa}", achieved[i]);
        assert_eq!(f("cpus"), c, "{name}: c is its quota");
        demand_ok(&format!("{name} D"), f("demand_s"), d_s);
        x_sat_ok(&format!("{name} X_sat"), f("x_sat_rps"), c, d_s);
        // U against the fixture's work at the throughput eBPF counted over
        // the interval; that throughput against the client's own count
        // (its mean over the whole load, which a stall of the shared
        // machine can pull down: a wider bound).
        // (U = X·D / c: D's band carries over.)
        demand_ok(&format!("{name} U"), f("util"), f("x_rps") * d_s / c);
        within(&format!("{name} X"), f("x_rps"), achieved[i], 0.15);
        within(
            &format!("{name} headroom"),
            1.0 - f("headroom"),
            f("util"),
            1e-9,
        );
        // Per pid: the app is this one process.
        let p = &pids[i]["oa"];
        demand_ok(
            &format!("{name} pid D"),
            p["demand_s"].as_f64().unwrap_or(0.0),
            d_s,
        );
        let m = gauge(&metrics, "qosd_app_service_demand_seconds", name);
        demand_ok(&format!("{name} /metrics D"), m.unwrap_or(0.0), d_s);
        let m = gauge(&metrics, "qosd_app_saturation_requests_per_second", name);
        x_sat_ok(&format!("{name} /metrics X_sat"), m.unwrap_or(0.0), c, d_s);
    }
    // X_sat scales with c.
    within(
        "X_sat(1.0) / X_sat(0.5)",
        apps[1]["oa"]["x_sat_rps"].as_f64().unwrap() / apps[0]["oa"]["x_sat_rps"].as_f64().unwrap(),
        2.0,
        0.10,
    );
    let (st, _) = d.stop();
    assert!(st.success(), "qosd run: {st}");
}
