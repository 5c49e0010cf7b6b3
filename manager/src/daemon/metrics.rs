//! `/metrics` in the Prometheus text format (version 0.0.4), following its
//! naming conventions: base units (seconds, hertz, watts), `_total` for
//! counters, `_ratio` for 0..1 fractions, one `app` label per managed app
//! (and `namespace`, `pod`, `container` when the app is one pod's
//! container, Kepler's and Beyla's names, so a cluster Prometheus can
//! aggregate by them; `qosd_app_pod_info` lists every container of apps
//! that span several).
//! Latency is a summary: quantiles over the last decision interval (what
//! the policy sees), `_sum` and `_count` since the daemon started.

use std::collections::BTreeMap;
use std::fmt::Write;

use qosd_core::{AppClass, Resource};

use super::state::Shared;

/// The content type Prometheus expects for this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Quantiles exported for every app (besides its target's own).
const QUANTILES: [f64; 3] = [0.5, 0.95, 0.99];

/// The text, and the pod labels of each app that is one container.
struct Out(String, BTreeMap<String, [String; 3]>);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape(val));
            }
            // Series that name their pod themselves keep theirs.
            let pod = match labels.first() {
                Some(("app", app)) if !labels.iter().any(|(k, _)| *k == "pod") => self.1.get(*app),
                _ => None,
            };
            for (k, val) in ["namespace", "pod", "container"]
                .iter()
                .zip(pod.into_iter().flatten())
            {
                let _ = write!(self.0, ",{k}=\"{}\"", escape(val));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {}", number(v));
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// What this process uses, under the standard `process_` names.
fn process_metrics(o: &mut Out) {
    let me = std::process::id() as i32;
    if let Ok(Some(cpu_s)) = qosd_sensors::procfs::Procfs::new("/").process_cpu_s(me) {
        o.family(
            "process_cpu_seconds_total",
            "counter",
            "CPU time qosd used (user and system), seconds.",
        );
        o.sample("process_cpu_seconds_total", &[], cpu_s);
    }
    // statm: size resident ... in pages.
    let rss_pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok());
    if let Some(p) = rss_pages {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as f64;
        o.family(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory of qosd, bytes.",
        );
        o.sample("process_resident_memory_bytes", &[], p * page);
    }
}

/// Per traced pid, both eBPF figures over the tracer's window: `latency`
/// (from each request's arrival in the socket) and `service` (from the
/// server's first read), and which hooks measured them.
pub fn render_traced(t: &qosd_sensors::ebpf::RequestTracer, apps: &[(String, Vec<i32>)]) -> String {
    use qosd_sensors::ebpf::Figure;
    let mut o = Out(String::with_capacity(1024), BTreeMap::new());
    let name = "qosd_ebpf_request_seconds";
    o.family(
        name,
        "gauge",
        "eBPF per-request time of a traced pid over the tracer's window: figure=latency \
         from the request's arrival in the socket, figure=service from the server's first read.",
    );
    let hooks = t.hooks().as_str();
    for (app, pids) in apps {
        for &pid in pids {
            let ps = pid.to_string();
            for f in [Figure::Latency, Figure::Service] {
                let Some(s) = t.summary_of(pid as u32, f) else {
                    continue;
                };
                for (q, v) in [("0.5", s.p50_us), ("0.95", s.p95_us), ("0.99", s.p99_us)] {
                    if let Some(us) = v {
                        let labels = [
                            ("app", app.as_str()),
                            ("pid", ps.as_str()),
                            ("figure", f.as_str()),
                            ("hooks", hooks),
                            ("quantile", q),
                        ];
                        o.sample(name, &labels, us / 1e6);
                    }
                }
            }
        }
    }
    o.0
}

/// The whole exposition. `dropped`: records the eBPF ring buffer lost
/// (`None` when the tracer does not run).
pub fn render(sh: &Shared, dropped: Option<u64>) -> String {
    let one_pod = sh.apps.values().filter_map(|a| match a.pods.as_slice() {
        [p] => Some((
            a.name.clone(),
            [p.namespace.clone(), p.pod.clone(), p.container.clone()],
        )),
        _ => None,
    });
    let mut o = Out(String::with_capacity(8192), one_pod.collect());
    let info = &sh.info;
    o.family(
        "qosd_build_info",
        "gauge",
        "qosd's version and policy (value 1).",
    );
    o.sample(
        "qosd_build_info",
        &[("version", info.version), ("policy", &info.policy)],
        1.0,
    );
    o.family(
        "qosd_knob_in_use",
        "gauge",
        "1 when the policy turns this knob, 0 when the node lacks it or the config disables it.",
    );
    for k in &info.knobs {
        let backend = k.backend.as_deref().unwrap_or("none");
        o.sample(
            "qosd_knob_in_use",
            &[("resource", k.resource.name()), ("backend", backend)],
            f64::from(u8::from(k.in_use)),
        );
    }
    let in_use = |r: Resource| info.knobs.iter().any(|k| k.resource == r && k.in_use);

    let apps = || sh.apps.values();
    o.family(
        "qosd_app_info",
        "gauge",
        "A configured app: its class and feedback source (value 1).",
    );
    for a in apps() {
        let class = match a.class {
            AppClass::Lc => "lc",
            AppClass::Be => "be",
        };
        let fb = a.feedback.to_string();
        o.sample(
            "qosd_app_info",
            &[("app", &a.name), ("class", class), ("feedback", &fb)],
            1.0,
        );
    }
    o.family(
        "qosd_app_pod_info",
        "gauge",
        "A pod's container that the app is (value 1), with the pod's uid.",
    );
    for a in apps() {
        for p in &a.pods {
            let labels = [
                ("app", a.name.as_str()),
                ("namespace", &p.namespace),
                ("pod", &p.pod),
                ("container", &p.container),
                ("uid", &p.uid),
            ];
            o.sample("qosd_app_pod_info", &labels, 1.0);
        }
    }
    o.family(
        "qosd_app_processes",
        "gauge",
        "Processes found for the app.",
    );
    for a in apps() {
        o.sample(
            "qosd_app_processes",
            &[("app", &a.name)],
            a.pids.len() as f64,
        );
    }
    o.family(
        "qosd_app_managed",
        "gauge",
        "1 while qosd manages the app's resources.",
    );
    for a in apps() {
        let v = f64::from(u8::from(a.share.is_some()));
        o.sample("qosd_app_managed", &[("app", &a.name)], v);
    }

    o.family(
        "qosd_app_latency_seconds",
        "summary",
        "Request latency from the app's feedback source: quantiles over the last decision interval, sum and count since start.",
    );
    for a in apps() {
        let mut qs: Vec<f64> = QUANTILES.to_vec();
        if let Some(t) = a.target {
            let q = t.percentile / 100.0;
            if !qs.iter().any(|x| (x - q).abs() < 1e-9) {
                qs.push(q);
            }
        }
        for q in qs {
            let v = a
                .recent
                .percentile_us(q * 100.0)
                .map_or(f64::NAN, |us| us / 1e6);
            let qs = format!("{q}");
            o.sample(
                "qosd_app_latency_seconds",
                &[("app", &a.name), ("quantile", &qs)],
                v,
            );
        }
        let n = &[("app", a.name.as_str())];
        o.sample("qosd_app_latency_seconds_sum", n, a.recent.latency_sum_s());
        o.sample(
            "qosd_app_latency_seconds_count",
            n,
            a.recent.requests_total() as f64,
        );
    }
    o.family(
        "qosd_app_latency_target_seconds",
        "gauge",
        "QoS target of a latency-critical app at its quantile.",
    );
    for a in apps() {
        if let Some(t) = a.target {
            let q = format!("{}", t.percentile / 100.0);
            let labels = [("app", a.name.as_str()), ("quantile", q.as_str())];
            o.sample("qosd_app_latency_target_seconds", &labels, t.value_us / 1e6);
        }
    }
    o.family(
        "qosd_app_slack_ratio",
        "gauge",
        "PARTIES slack (target - latency) / target; negative when the target is missed.",
    );
    for a in apps() {
        if let Some(s) = a.slack() {
            o.sample("qosd_app_slack_ratio", &[("app", &a.name)], s);
        }
    }
    o.family(
        "qosd_app_requests_per_second",
        "gauge",
        "Requests completed per second over the last decision interval.",
    );
    for a in apps() {
        o.sample(
            "qosd_app_requests_per_second",
            &[("app", &a.name)],
            a.recent.rps(),
        );
    }
    o.family(
        "qosd_app_requests_total",
        "counter",
        "Requests counted by the app's feedback source since qosd started.",
    );
    for a in apps() {
        let v = a.recent.requests_total() as f64;
        o.sample("qosd_app_requests_total", &[("app", &a.name)], v);
    }
    o.family(
        "qosd_app_client_latencies_total",
        "counter",
        "Latencies load generators reported through the API.",
    );
    for a in apps() {
        let v = a.inbox.accepted_total as f64;
        o.sample("qosd_app_client_latencies_total", &[("app", &a.name)], v);
    }
    o.family(
        "qosd_app_cpu_utilization_ratio",
        "gauge",
        "Share of the app's CPUs it used over the last decision interval (0..1).",
    );
    for a in apps() {
        o.sample(
            "qosd_app_cpu_utilization_ratio",
            &[("app", &a.name)],
            a.cpu_util,
        );
    }
    o.family(
        "qosd_app_cpu_seconds_total",
        "counter",
        "CPU time the app's processes used while qosd watched them (rate: the CPUs it got).",
    );
    for a in apps() {
        let v = a.cpu_seconds_total;
        o.sample("qosd_app_cpu_seconds_total", &[("app", &a.name)], v);
    }
    o.family(
        "qosd_app_be_ops_per_second",
        "gauge",
        "Throughput of a best-effort app's batch job (config job:) over the last decision interval, operations per second; 0 while the job is not running.",
    );
    for a in apps() {
        if let Some(v) = a.be_ops_per_s {
            o.sample("qosd_app_be_ops_per_second", &[("app", &a.name)], v);
        }
    }

    // Allocations: only knobs in use, only managed apps, only values set.
    for k in &qosd_core::KNOBS {
        if !in_use(k.resource) {
            continue;
        }
        let m = &k.metric;
        o.family(m.name, "gauge", m.help);
        for a in apps() {
            if let Some(v) = a.share.as_ref().map(k.share).filter(|v| *v > 0) {
                o.sample(m.name, &[("app", &a.name)], f64::from(v) * m.scale);
            }
        }
    }
    o.family(
        "qosd_app_apply_errors_total",
        "counter",
        "Allocations that could not be put in force (the app kept its previous one).",
    );
    for a in apps() {
        let v = a.apply_errors_total as f64;
        o.sample("qosd_app_apply_errors_total", &[("app", &a.name)], v);
    }
    if info.power != "none" {
        let est = if info.power == "model" {
            "true"
        } else {
            "false"
        };
        o.family(
            "qosd_app_power_watts",
            "gauge",
            "Power attributed to the app; estimate=\"true\" when it comes from a model, not RAPL.",
        );
        for a in apps() {
            if let Some(w) = a.power_w {
                o.sample(
                    "qosd_app_power_watts",
                    &[("app", &a.name), ("estimate", est)],
                    w,
                );
            }
        }
        if let Some(w) = sh.node_power_w {
            o.family("qosd_node_power_watts", "gauge", "Power of the node.");
            o.sample("qosd_node_power_watts", &[("estimate", est)], w);
        }
    }

    o.family(
        "qosd_decisions_total",
        "counter",
        "Policy decisions by app, resource and kind (upsize, downsize, revert, reclaim, grant).",
    );
    for ((app, r, kind), n) in &sh.decisions_total {
        let k = serde_json::to_value(kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let labels = [
            ("app", app.as_str()),
            ("resource", r.name()),
            ("kind", k.as_str()),
        ];
        o.sample("qosd_decisions_total", &labels, *n as f64);
    }
    if let Some(d) = dropped {
        o.family(
            "qosd_ebpf_dropped_records_total",
            "counter",
            "Request records lost because the eBPF ring buffer was full.",
        );
        o.sample("qosd_ebpf_dropped_records_total", &[], d as f64);
    }
    if let Some(u) = sh.node_cpu_util {
        o.family(
            "qosd_node_cpu_utilization_ratio",
            "gauge",
            "Busy share of all the node's CPUs over the last decision interval (0..1).",
        );
        o.sample("qosd_node_cpu_utilization_ratio", &[], u);
    }
    o.family(
        "qosd_cannot_meet_total",
        "counter",
        "Decisions at which a violating app could be given nothing (QoS cannot be met).",
    );
    for a in sh.apps.values() {
        o.sample(
            "qosd_cannot_meet_total",
            &[("app", a.name.as_str())],
            a.cannot_meet_total as f64,
        );
    }
    o.family(
        "qosd_reverts_total",
        "counter",
        "Changes the policy reverted (a downsize that hurt an app).",
    );
    o.sample("qosd_reverts_total", &[], sh.loop_counters.reverts as f64);
    o.family("qosd_ticks_total", "counter", "Control-loop ticks by kind.");
    o.sample(
        "qosd_ticks_total",
        &[("kind", "monitor")],
        sh.monitor_ticks_total as f64,
    );
    o.sample(
        "qosd_ticks_total",
        &[("kind", "decide")],
        sh.decide_ticks_total as f64,
    );
    o.family(
        "qosd_missed_ticks_total",
        "counter",
        "Monitoring ticks skipped because the previous one overran.",
    );
    o.sample("qosd_missed_ticks_total", &[], sh.missed_ticks_total as f64);
    process_metrics(&mut o);
    o.0
}
