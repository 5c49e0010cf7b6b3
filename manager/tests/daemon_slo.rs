//! One SLO in the daemon (root, real eBPF): an eBPF-fed app whose clients
//! also POST their latencies to `qosd run`. Its eBPF side is judged
//! against the client target as written until client samples measure the
//! client/server gap; then against the target less that gap, which the
//! API shows with its source. The test's client times each request on
//! loopback and reports it 20 ms later than it saw it (a network share
//! the server cannot see), so the gap the daemon must find is 20 ms plus
//! loopback's own (the client's p99 over the server's, at least 0).
//! Run alone: `cargo test --release -p qosd-manager --test daemon_slo`.

mod support;

use std::io::{BufReader, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

/// What the client adds to every latency it reports, µs.
const NETWORK_US: f64 = 20_000.0;
/// The client-side target, µs.
const TARGET_US: f64 = 100_000.0;

fn config(dir: &Path, port: u16, name: &str, pid: u32) -> std::path::PathBuf {
    // min = max = initial: nothing moves; the SLO is what is looked at.
    let q = "{ cpu_quota_milli: 1000 }";
    let y = format!(
        "apps:\n  - name: {name}\n    match: {{ pid: {pid} }}\n    class: lc\n    \
         target: {{ p99: 100ms }}\n    feedback: ebpf\n    \
         resources: {{ initial: {q}, min: {q}, max: {q} }}\n\
         policy: {policy}\nmonitor_interval_ms: 100\ndecide_interval_ms: 500\n\
         actuators:\n  enabled: [cpu_quota]\n\
         api:\n  listen: 127.0.0.1:{port}\n  token_file: {d}/api.token\n\
         state_file: {d}/state.json\n",
        policy = parties().display(),
        d = dir.display(),
    );
    let p = dir.join("config.yaml");
    std::fs::write(&p, y).unwrap();
    p
}

/// Paced requests to the fixture on one keep-alive connection (`rps` for
/// `secs`), each timed and POSTed every 100 ms, `NETWORK_US` later than
/// seen. Returns the requests answered and the longest loopback time one
/// took as the client saw it, µs.
fn load_and_report(d: &Daemon, app: &str, port: u16, rps: f64, secs: f64) -> (usize, f64) {
    let mut r = BufReader::new(connect(port));
    let path = format!("/v1/apps/{app}/latency");
    let (t0, n_max) = (Instant::now(), (rps * secs) as usize);
    let (mut batch, mut last_post, mut n) = (Vec::new(), Instant::now(), 0);
    let mut longest: f64 = 0.0;
    while n < n_max && t0.elapsed().as_secs_f64() < secs + 5.0 {
        let due = t0 + Duration::from_secs_f64(n as f64 / rps);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let sent = Instant::now();
        r.get_mut()
            .write_all(b"GET / HTTP/1.1\r\nHost: qosd\r\n\r\n")
            .unwrap();
        read_http_response(&mut r);
        let seen = sent.elapsed().as_secs_f64() * 1e6;
        longest = longest.max(seen);
        batch.push(seen + NETWORK_US);
        n += 1;
        if last_post.elapsed() >= Duration::from_millis(100) || n == n_max {
            let body = serde_json::json!({ "latencies_us": batch }).to_string();
            let (st, v) = d.post(&path, &body);
            assert_eq!(st, 200, "{v}");
            batch.clear();
            last_post = Instant::now();
        }
    }
    (n, longest)
}

fn slo(d: &Daemon, app: &str) -> Value {
    d.get(&format!("/v1/apps/{app}"))["slo"].clone()
}

#[test]
fn posted_client_latencies_set_the_gap_the_ebpf_side_is_judged_against() {
    let (server, server_port) = fixture(100);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let app = format!("slo-c19-{}", std::process::id());
    let cfg = config(dir.path(), port, &app, server.pid());
    let d = Daemon::start(&cfg, port, &[]);
    assert!(
        wait_for(Duration::from_secs(10), || slo(&d, &app).is_object()),
        "no SLO in the API: {:?}",
        d.output()
    );
    // No client sample yet: the target as written, no gap.
    let before = slo(&d, &app);
    eprintln!("before: {before}");
    assert_eq!(before["ebpf_target_from"], "client", "{before}");
    assert_eq!(before["ebpf_target_us"].as_f64(), Some(TARGET_US));
    assert_eq!(before["gap_us"].as_f64(), Some(0.0));
    // 400 requests/s: 200 an interval, so a p99's 1000 requests take the
    // window five intervals (2.5 s) on both sides.
    let (n, longest) = load_and_report(&d, &app, server_port, 400.0, 5.0);
    assert!(
        wait_for(Duration::from_secs(3), || slo(&d, &app)["nr_refreshes"]
            .as_u64()
            .is_some_and(|r| r > 0)),
        "the gap was never measured ({n} requests): {} {:?}",
        slo(&d, &app),
        d.output()
    );
    let after = slo(&d, &app);
    eprintln!("after {n} requests: {after}");
    assert_eq!(after["ebpf_target_from"], "refreshed_gap", "{after}");
    let gap = after["gap_us"].as_f64().unwrap();
    // The added 20 ms, plus loopback's share of the client's p99: never
    // less than what was added, never more than that plus the longest
    // loopback time the client saw (a window's p99 cannot pass its max;
    // the histogram's 1 % buckets either way). A stall of the client on a
    // loaded machine widens the upper bound, not the test's luck.
    let most = 1.01 * (NETWORK_US + longest);
    assert!(
        (0.99 * NETWORK_US..most).contains(&gap),
        "gap {gap} µs against the {NETWORK_US} µs added (at most {most:.0} µs: \
         the client's longest loopback time {longest:.0} µs): {after}"
    );
    let t = after["ebpf_target_us"].as_f64().unwrap();
    assert!((t - (TARGET_US - gap)).abs() < 1.0, "{after}");
    // The slack the API shows for the app is read against that target.
    let a = d.get(&format!("/v1/apps/{app}"));
    if let (Some(s), Some(l)) = (
        a["slack"].as_f64(),
        a["latency"]["target_percentile_us"].as_f64(),
    ) {
        assert!((s - (t - l) / TARGET_US).abs() < 0.02, "{a}");
    }
    let (st, _) = d.stop();
    assert!(st.success(), "qosd run: {st}");
}
