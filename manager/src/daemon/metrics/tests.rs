//! The exposition of a daemon state that exports every family: Prometheus'
//! own parser (`promtool check metrics`, Debian's `prometheus`) reads it,
//! hostile label values are escaped, and every family the manual's table
//! (docs/daemon.md) lists is declared with the table's type.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use qosd_core::{DecisionKind, Feedback, Resource, Share};

use super::render;
use crate::config::Config;
use crate::daemon::control::live_entry;
use crate::daemon::state::{KnobInfo, RunInfo, Shared};

const CONFIG: &str = "\
apps:
  - name: web
    match: { pid: 4242 }
    class: lc
    target: { p99: 1ms }
    feedback: client
  - name: batch
    match: { comm: batchy }
    class: be
";

/// A state with two apps, every knob in use, power from the model,
/// decisions, operational figures, and a pod whose labels need escaping.
fn state() -> Shared {
    let knobs = qosd_core::KNOBS
        .iter()
        .map(|k| KnobInfo {
            resource: k.resource,
            in_use: true,
            backend: Some("fake".into()),
            reason: String::new(),
        })
        .collect();
    let mut sh = Shared::new(RunInfo {
        version: "test",
        policy: "parties".into(),
        config: "config.yaml".into(),
        monitor_interval_ms: 100,
        decide_interval_ms: 500,
        latency_window_ms: 500,
        dry_run: false,
        knobs,
        ebpf: true,
        power: "model".into(),
        started_unix_ms: 0,
    });
    let cfg = Config::parse(Path::new("config.yaml"), CONFIG).unwrap();
    for a in &cfg.apps {
        let mut live = live_entry(a, Feedback::Client, 5);
        live.pids = vec![4242, 4243];
        live.share = Some(Share {
            nr_cores: 1,
            nr_ways: 2,
            freq_mhz: 2100,
            mb_percent: 50,
            cpu_quota_milli: 1500,
            cpu_priority: 2,
            hedge: qosd_core::knobs::HEDGE_ON,
        });
        let mut h = qosd_sensors::stats::LogHistogram::new();
        for us in [100, 200, 300] {
            h.record(us * 1000);
        }
        live.recent.push(h, 0.5, Some(300_000));
        live.power_w = Some(1.5);
        live.be_ops_per_s = Some(1000.0);
        live.oa = Some(qosd_core::oa::Oa {
            x_rps: 6.0,
            demand_s: 0.01,
            cpus: 1.0,
            util: 0.06,
            x_sat_rps: 100.0,
            headroom: 0.94,
        });
        sh.apps.insert(a.name.clone(), live);
    }
    sh.apps.get_mut("web").unwrap().pods = vec![crate::kube::PodRef {
        namespace: "shop".into(),
        pod: "web-0".into(),
        container: "a \"quoted\" \\ name\nwith a newline".into(),
        uid: "u-1".into(),
    }];
    sh.decisions_total
        .insert(("web".into(), Resource::Cores, DecisionKind::Upsize), 3);
    sh.apps.get_mut("web").unwrap().net = Some(crate::daemon::state::AppNet {
        packets_total: [10, 4],
        bytes_total: [1420, 568],
        peak_packets: [2, 1],
        peak_bytes_per_second: [284_000.0, 142_000.0],
        bin_ms: 1,
    });
    sh.net = Some(qosd_sensors::sensor::net::NetNode {
        window: 9,
        bin_ms: 1,
        peers: vec![qosd_sensors::sensor::net::PeerRow {
            peer: None,
            dir: qosd_sensors::net::Direction::Ingress,
            figures: Default::default(),
        }],
        evicted_peers: 2,
        map_full: 0,
    });
    sh.apps.get_mut("web").unwrap().knob_counters =
        vec![(Resource::Hedge, vec![("hedges_sent", 5), ("hedges_won", 3)])];
    sh.node_cpu_util = Some(0.25);
    sh.node_power_w = Some(20.0);
    sh.decide_ticks_total = 4;
    sh
}

#[test]
fn exposition_parses_escapes_and_matches_the_manual() {
    let text = render(&state(), Some(7));
    for needle in [
        "qosd_ebpf_dropped_records_total 7\n",
        "qosd_decisions_total{app=\"web\",resource=\"cores\",kind=\"upsize\",\
         namespace=\"shop\",pod=\"web-0\",container=\"a \\\"quoted\\\" \\\\ name\\nwith a newline\"} 3\n",
        "qosd_app_latency_seconds_count{app=\"batch\"} 3\n",
        "qosd_app_frequency_hertz{app=\"batch\"} 2100000000\n",
        "qosd_app_memory_bandwidth_ratio{app=\"batch\"} 0.5\n",
        "qosd_ticks_total{kind=\"decide\"} 4\n",
        "qosd_app_knob_events_total{app=\"web\",resource=\"hedge\",event=\"hedges_won\",",
        "qosd_app_hedge_state{app=\"batch\"} 2\n",
        "qosd_net_peer_bytes_per_second{peer=\"other\",proto=\"any\",direction=\"ingress\"} 0\n",
        "qosd_net_evicted_peers_total 2\n",
        "qosd_app_latency_target_seconds{app=\"web\",quantile=\"0.99\",",
        "# TYPE qosd_decisions_total counter\n",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }

    // Prometheus' own parser reads it.
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus, in APT_PKGS)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("error while linting"), "{said}\n{text}");
    // Its linter's one remark: gauges with a `quantile` label (the
    // target's, and the latency quantiles, a summary's series that
    // prometheus-client cannot type as one).
    for l in said.lines().filter(|l| !l.trim().is_empty()) {
        let (name, why) = l.split_once(' ').unwrap();
        assert!(
            why == "non-summary metrics should not have \"quantile\" label"
                && [
                    "qosd_app_latency_seconds",
                    "qosd_app_latency_target_seconds"
                ]
                .contains(&name),
            "promtool: {l}\n{text}"
        );
    }

    // Each family is declared once, with the manual's type.
    let mut declared = BTreeMap::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(
                declared.insert(name.to_owned(), kind.to_owned()).is_none(),
                "{name} declared twice"
            );
        } else if !l.starts_with('#') {
            let name = l.split(['{', ' ']).next().unwrap();
            assert!(declared.contains_key(name), "{name} has no # TYPE");
        }
    }
    let manual =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/daemon.md"))
            .unwrap();
    let table = manual
        .split("### Metrics (`GET /metrics`)")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| !l.starts_with("## ") && !l.starts_with("### Completions"))
        .filter_map(|l| l.strip_prefix("| `"));
    let mut listed = 0;
    for row in table {
        let (name, rest) = row.split_once('`').unwrap();
        let kind = rest.trim_start_matches(" | ").split(' ').next().unwrap();
        // Per-pid eBPF figures come with a running tracer only.
        if name == "qosd_ebpf_request_seconds" {
            continue;
        }
        let got = declared.get(name).map(String::as_str);
        assert_eq!(got, Some(kind), "{name}: /metrics vs docs/daemon.md");
        listed += 1;
    }
    assert!(listed >= 30, "{listed} rows read from docs/daemon.md");
}
