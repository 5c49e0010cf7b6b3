//! Synthetic nodes, snapshots and allocations for policy unit tests.

use qosd_core::{
    Allocations, AppClass, AppState, FreqRange, MbRange, NodeCaps, QosTarget, Share, Snapshot,
};

/// Target used by every synthetic LC app: p99 ≤ 1000 µs.
pub const TARGET_US: f64 = 1000.0;

/// A node with `cores` cores, `ways` ways and optionally DVFS and MBA.
pub fn node(cores: u32, ways: u32, freq: bool, mb: bool) -> NodeCaps {
    NodeCaps {
        nr_cores: cores,
        nr_ways: ways,
        freq: freq.then_some(FreqRange {
            min_mhz: 1000,
            max_mhz: 3000,
            step_mhz: 100,
        }),
        mb: mb.then_some(MbRange {
            min_percent: 10,
            step_percent: 10,
        }),
        ..NodeCaps::default()
    }
}

/// A latency-critical app whose slack is `slack` (None: no requests).
pub fn lc(name: &str, slack: Option<f64>) -> AppState {
    AppState {
        target: Some(QosTarget::new(99.0, TARGET_US)),
        latency_us: slack.map(|s| TARGET_US * (1.0 - s)),
        rps: 1000.0,
        nr_samples: 1000,
        cpu_util: 0.5,
        ..AppState::new(name, AppClass::Lc)
    }
}

/// A best-effort app.
pub fn be(name: &str) -> AppState {
    AppState {
        cpu_util: 1.0,
        ..AppState::new(name, AppClass::Be)
    }
}

pub fn snap(apps: Vec<AppState>) -> Snapshot {
    let mut apps = apps;
    apps.sort_by(|a, b| a.name.cmp(&b.name));
    Snapshot {
        apps,
        node_power_w: None,
        since_ms: None,
    }
}

/// `(name, cores, ways, MHz, MB%)` rows.
pub fn allocs(rows: &[(&str, u32, u32, u32, u32)]) -> Allocations {
    rows.iter()
        .map(|&(n, c, w, f, m)| {
            (
                n.to_owned(),
                Share {
                    nr_cores: c,
                    nr_ways: w,
                    freq_mhz: f,
                    mb_percent: m,
                    ..Share::default()
                },
            )
        })
        .collect()
}

/// Sets the slack of one app in a snapshot.
pub fn with_slack(mut s: Snapshot, app: &str, slack: Option<f64>) -> Snapshot {
    for a in &mut s.apps {
        if a.name == app {
            a.latency_us = slack.map(|x| TARGET_US * (1.0 - x));
        }
    }
    s
}

/// A node whose CPU quota moves in `step` milli-CPUs over `cpus` CPUs,
/// with `cores` handed out by the cores knob (0: apps share the CPUs).
pub fn quota_node(cores: u32, cpus: u32, step: u32) -> NodeCaps {
    NodeCaps {
        quota: Some(qosd_core::QuotaRange {
            step_milli: step,
            max_milli: cpus * 1000,
        }),
        ..node(cores, 0, false, false)
    }
}

/// `(name, cores, quota milli-CPUs)` rows.
pub fn quota_allocs(rows: &[(&str, u32, u32)]) -> Allocations {
    rows.iter()
        .map(|&(n, c, q)| {
            (
                n.to_owned(),
                Share {
                    nr_cores: c,
                    cpu_quota_milli: q,
                    ..Share::default()
                },
            )
        })
        .collect()
}

/// A plan's changes of one kind: `(app, resource, from, to)`.
pub fn kinds(
    plan: &qosd_core::Plan,
    kind: qosd_core::DecisionKind,
) -> Vec<(String, qosd_core::Resource, u32, u32)> {
    plan.decisions
        .iter()
        .filter(|d| d.kind == kind)
        .map(|d| (d.app.clone(), d.resource, d.from, d.to))
        .collect()
}
