//! Sensor families: the eBPF tracer (lost records, per-pid figures),
//! power (per app and node; `estimate="true"` from the model, not RAPL)
//! and traffic (per app and top-N peers; `sensors.net`).

use qosd_sensors::net::{proto_name, Direction, Figures};

use super::Exposition;
use crate::daemon::state::{AppNet, Shared};

pub(super) fn build(o: &mut Exposition, sh: &Shared, dropped: Option<u64>) {
    if let Some(d) = dropped {
        o.counter(
            "qosd_ebpf_dropped_records_total",
            "Request records lost because the eBPF ring buffer was full.",
        )
        .sample(&[], d as f64);
    }
    power(o, sh);
    net(o, sh);
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

/// Per app (its ports) and per peer of the last complete 1 s window: the
/// top N per direction and the rest as `peer="other"`, so the series stay
/// bounded whatever the traffic.
fn net(o: &mut Exposition, sh: &Shared) {
    let Some(node) = &sh.net else {
        return;
    };
    type Field = fn(&AppNet, usize) -> f64;
    let per_app: [(&'static str, bool, &'static str, Field); 3] = [
        (
            "qosd_app_net_packets_total",
            true,
            "Packets on the app's ports (sensors.net) since the net sensor started.",
            |n, d| n.packets_total[d] as f64,
        ),
        (
            "qosd_app_net_bytes_total",
            true,
            "Bytes on the wire (headers included) on the app's ports since the net sensor started.",
            |n, d| n.bytes_total[d] as f64,
        ),
        (
            "qosd_app_net_peak_bytes_per_second",
            false,
            "The fullest bin of the last complete 1 s window on the app's ports, as a rate.",
            |n, d| n.peak_bytes_per_second[d],
        ),
    ];
    for (name, counter, help, field) in per_app {
        let fam = if counter {
            o.counter(name, help)
        } else {
            o.gauge(name, help)
        };
        for a in sh.apps.values() {
            let Some(n) = &a.net else { continue };
            for (d, dir) in Direction::BOTH.iter().enumerate() {
                fam.app(&a.name, &[("direction", dir.as_str())], field(n, d));
            }
        }
    }
    let rows = |fam: &mut super::Family, f: fn(&Figures, u32) -> f64| {
        for r in &node.peers {
            let (peer, proto) = match &r.peer {
                Some(k) => (k.addr.to_string(), proto_name(k.proto)),
                None => ("other".to_owned(), "any".to_owned()),
            };
            let labels = [
                ("peer", peer.as_str()),
                ("proto", proto.as_str()),
                ("direction", r.dir.as_str()),
            ];
            fam.sample(&labels, f(&r.figures, node.bin_ms));
        }
    };
    rows(
        o.gauge(
            "qosd_net_peer_bytes_per_second",
            "Bytes on the wire to or from a peer in the last complete 1 s window: the top N per direction, the rest as peer=\"other\".",
        ),
        |f, _| f.bytes as f64,
    );
    rows(
        o.gauge(
            "qosd_net_peer_peak_bytes_per_second",
            "The fullest bin of a peer's last complete 1 s window, as a rate (top N per direction, the rest summed as peer=\"other\").",
        ),
        |f, bin_ms| f.peak_bps(bin_ms) / 8.0,
    );
    o.counter(
        "qosd_net_evicted_peers_total",
        "Peer entries the net sensor's LRU map evicted (more peers than it holds).",
    )
    .sample(&[], node.evicted_peers as f64);
}
