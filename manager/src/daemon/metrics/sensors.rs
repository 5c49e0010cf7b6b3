//! Sensor families: the eBPF tracer (lost records, per-pid figures) and
//! power (per app and node; `estimate="true"` from the model, not RAPL).

use super::Exposition;
use crate::daemon::state::Shared;

pub(super) fn build(o: &mut Exposition, sh: &Shared, dropped: Option<u64>) {
    if let Some(d) = dropped {
        o.counter(
            "qosd_ebpf_dropped_records_total",
            "Request records lost because the eBPF ring buffer was full.",
        )
        .sample(&[], d as f64);
    }
    power(o, sh);
}

fn power(o: &mut Exposition, sh: &Shared) {
    let source = sh.info.power.as_str();
    if source == "none" {
        return;
    }
    let est = if source == "model" { "true" } else { "false" };
    let fam = o.gauge(
        "qosd_app_power_watts",
        "Power attributed to the app; estimate=\"true\" when it comes from a model, not RAPL.",
    );
    for a in sh.apps.values() {
        if let Some(w) = a.power_w {
            fam.app(&a.name, &[("estimate", est)], w);
        }
    }
    if let Some(w) = sh.node_power_w {
        o.gauge("qosd_node_power_watts", "Power of the node.")
            .sample(&[("estimate", est)], w);
    }
}

/// Per traced pid, both eBPF figures over the tracer's window: `latency`
/// (from each request's arrival in the socket) and `service` (from the
/// server's first read), and which hooks measured them.
pub(super) fn traced(
    o: &mut Exposition,
    t: &qosd_sensors::ebpf::RequestTracer,
    apps: &[(String, Vec<i32>)],
) {
    use qosd_sensors::ebpf::Figure;
    let fam = o.gauge(
        "qosd_ebpf_request_seconds",
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
                            ("pid", ps.as_str()),
                            ("figure", f.as_str()),
                            ("hooks", hooks),
                            ("quantile", q),
                        ];
                        fam.app(app, &labels, us / 1e6);
                    }
                }
            }
        }
    }
}
