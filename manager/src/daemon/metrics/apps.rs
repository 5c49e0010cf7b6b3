//! Per-app families: what each app is, its requests and latency against
//! its target, its CPU use and its operational analysis (paper 001).
//! Latency: quantiles over the last decision interval (what the policy
//! sees), `_sum` and `_count` since the daemon started.

use qosd_core::AppClass;

use super::{Exposition, MetricType};
use crate::daemon::state::{AppLive, Shared};

/// Quantiles exported for every app (besides its target's own).
const QUANTILES: [f64; 3] = [0.5, 0.95, 0.99];

/// A gauge or counter with one value per app (none where `f` gives none).
type PerApp = fn(&AppLive) -> Option<f64>;

/// The families with one plain value per app.
const PER_APP: [(&str, MetricType, &str, PerApp); 13] = [
    (
        "qosd_app_slack_ratio",
        MetricType::Gauge,
        "PARTIES slack (target - latency) / target; negative when the target is missed.",
        AppLive::slack,
    ),
    (
        "qosd_app_requests_per_second",
        MetricType::Gauge,
        "Requests completed per second over the last decision interval.",
        |a| Some(a.recent.rps()),
    ),
    (
        "qosd_app_requests_total",
        MetricType::Counter,
        "Requests counted by the app's feedback source since qosd started.",
        |a| Some(a.recent.requests_total() as f64),
    ),
    (
        "qosd_app_client_latencies_total",
        MetricType::Counter,
        "Latencies load generators reported through the API.",
        |a| Some(a.inbox.accepted_total as f64),
    ),
    (
        "qosd_app_cpu_utilization_ratio",
        MetricType::Gauge,
        "Share of the app's CPUs it used over the last decision interval (0..1).",
        |a| Some(a.cpu_util),
    ),
    (
        "qosd_app_cpu_seconds_total",
        MetricType::Counter,
        "CPU time the app's processes used while qosd watched them (rate: the CPUs it got).",
        |a| Some(a.cpu_seconds_total),
    ),
    (
        "qosd_app_be_ops_per_second",
        MetricType::Gauge,
        "Throughput of a best-effort app's batch job (config job:) over the last decision interval, operations per second; 0 while the job is not running.",
        |a| a.be_ops_per_s,
    ),
    // Operational analysis (docs/control.md): only apps with figures.
    (
        "qosd_app_service_demand_seconds",
        MetricType::Gauge,
        "Service demand D: CPU seconds per request over the last decision interval.",
        |a| a.oa.as_ref().map(|o| o.demand_s),
    ),
    (
        "qosd_app_oa_utilization_ratio",
        MetricType::Gauge,
        "Utilisation U = X·D / c of the CPUs the app holds (can exceed 1 when it is short).",
        |a| a.oa.as_ref().map(|o| o.util),
    ),
    (
        "qosd_app_saturation_requests_per_second",
        MetricType::Gauge,
        "Saturation throughput X_sat = c / D on the CPUs the app holds.",
        |a| a.oa.as_ref().map(|o| o.x_sat_rps),
    ),
    (
        "qosd_app_headroom_ratio",
        MetricType::Gauge,
        "Headroom 1 − X / X_sat on the CPUs the app holds.",
        |a| a.oa.as_ref().map(|o| o.headroom),
    ),
    (
        "qosd_app_apply_errors_total",
        MetricType::Counter,
        "Allocations that could not be put in force (the app kept its previous one).",
        |a| Some(a.apply_errors_total as f64),
    ),
    (
        "qosd_cannot_meet_total",
        MetricType::Counter,
        "Decisions at which a violating app could be given nothing (QoS cannot be met).",
        |a| Some(a.cannot_meet_total as f64),
    ),
];

pub(super) fn build(o: &mut Exposition, sh: &Shared) {
    identity(o, sh);
    latency(o, sh);
    for (name, kind, help, f) in PER_APP {
        let fam = o.family(name, kind, help);
        for a in sh.apps.values() {
            if let Some(v) = f(a) {
                fam.app(&a.name, &[], v);
            }
        }
    }
}

/// What each app is: class, feedback, pods, processes, managed or not.
fn identity(o: &mut Exposition, sh: &Shared) {
    let apps = || sh.apps.values();
    let fam = o.gauge(
        "qosd_app_info",
        "A configured app: its class and feedback source (value 1).",
    );
    for a in apps() {
        let class = match a.class {
            AppClass::Lc => "lc",
            AppClass::Be => "be",
        };
        let fb = a.feedback.to_string();
        fam.app(&a.name, &[("class", class), ("feedback", &fb)], 1.0);
    }
    let fam = o.gauge(
        "qosd_app_pod_info",
        "A pod's container that the app is (value 1), with the pod's uid.",
    );
    for a in apps() {
        for p in &a.pods {
            let labels = [
                ("namespace", p.namespace.as_str()),
                ("pod", &p.pod),
                ("container", &p.container),
                ("uid", &p.uid),
            ];
            fam.app(&a.name, &labels, 1.0);
        }
    }
    let fam = o.gauge("qosd_app_processes", "Processes found for the app.");
    for a in apps() {
        fam.app(&a.name, &[], a.pids.len() as f64);
    }
    let fam = o.gauge(
        "qosd_app_managed",
        "1 while qosd manages the app's resources.",
    );
    for a in apps() {
        fam.app(&a.name, &[], f64::from(u8::from(a.share.is_some())));
    }
}

/// Latency quantiles (the policy's window) with `_sum`/`_count` since
/// start, and each LC app's target. `prometheus-client` has no summary
/// type, so the quantiles are a gauge family and `_sum`/`_count` untyped
/// families of their own: the same series under the same names.
fn latency(o: &mut Exposition, sh: &Shared) {
    let apps = || sh.apps.values();
    let fam = o.gauge(
        "qosd_app_latency_seconds",
        "Request latency from the app's feedback source: quantiles over the last decision interval (sum and count since start in _sum, _count).",
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
            fam.app(&a.name, &[("quantile", &format!("{q}"))], v);
        }
    }
    let fam = o.family(
        "qosd_app_latency_seconds_sum",
        MetricType::Unknown,
        "Sum of the request latencies counted since qosd started, seconds.",
    );
    for a in apps() {
        fam.app(&a.name, &[], a.recent.latency_sum_s());
    }
    let fam = o.family(
        "qosd_app_latency_seconds_count",
        MetricType::Unknown,
        "Request latencies counted since qosd started.",
    );
    for a in apps() {
        fam.app(&a.name, &[], a.recent.requests_total() as f64);
    }
    let fam = o.gauge(
        "qosd_app_latency_target_seconds",
        "QoS target of a latency-critical app at its quantile.",
    );
    for a in apps() {
        if let Some(t) = a.target {
            let q = format!("{}", t.percentile / 100.0);
            fam.app(&a.name, &[("quantile", &q)], t.value_us / 1e6);
        }
    }
}
