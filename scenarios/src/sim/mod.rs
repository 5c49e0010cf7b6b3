//! The simulated node: replays a scenario against per-app queueing models
//! ([`model`]) as a [`qosd_core::control::Node`] ([`node`]) driven by the
//! one control loop ([`ControlLoop`]) on simulated time: the same
//! observe/decide/apply, starting rule and decision log as `qosd run` and a
//! real replay. Deterministic for a seed and much faster than real time
//! (no sleeping, closed-form queues).

pub mod fit;
pub mod fitted;
pub mod model;
pub mod node;
pub mod oracle;
pub mod sampling;

use qosd_core::control::{Cadence, ControlLoop};
use qosd_core::{Allocations, Feedback, FreqRange, NodeCaps, Plan, Policy, Snapshot};

use std::collections::BTreeMap;

use crate::calibrate::Calibration;
use crate::record::RunRecorder;
use crate::scenario::{Scenario, SimNode};
use crate::timeline::Timeline;
use model::SimModel;
pub use node::{start_allocations, SimulatedNode};

/// Longest wait a request stays queued before its client gives up, s.
pub const MAX_BACKLOG_S: f64 = 2.0;

/// How to run a scenario on the simulated node.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub feedback: Feedback,
    pub seed: u64,
    /// Length of the run, s; the scenario's time axis is stretched or
    /// compressed to it (None: the scenario's own duration).
    pub duration_s: Option<f64>,
}

/// A policy that never changes anything: the static allocation baseline.
#[derive(Debug, Default)]
pub struct StaticPolicy;

impl Policy for StaticPolicy {
    fn name(&self) -> &str {
        "static"
    }
    fn decide(&mut self, _: u64, _: &Snapshot, current: &Allocations, _: &NodeCaps) -> Plan {
        Plan::keep(current)
    }
}

/// What the node offers a policy: cores unless its apps share the CPUs,
/// frequency when its range is not a single value, ways, and a CPU quota
/// over all its CPUs when it has a quota step.
pub fn node_caps(node: &SimNode) -> NodeCaps {
    NodeCaps {
        nr_cores: if node.shared_cpus { 0 } else { node.nr_cores },
        nr_cpus: node.nr_cores,
        nr_ways: node.nr_ways,
        freq: Some(FreqRange {
            min_mhz: node.freq_min_mhz,
            max_mhz: node.freq_max_mhz,
            step_mhz: node.freq_step_mhz,
        }),
        mb: None,
        quota: (node.quota_step_milli > 0).then(|| qosd_core::QuotaRange {
            step_milli: node.quota_step_milli,
            max_milli: node.nr_cores * qosd_core::quota::MILLI_PER_CPU,
        }),
        ..NodeCaps::default()
    }
}

/// Replays `sc` on the simulated node under `policy`.
pub fn run(
    sc: &Scenario,
    cal: &Calibration,
    policy: &mut dyn Policy,
    opts: &SimOptions,
) -> Timeline {
    run_with(sc, cal, policy, opts, None)
}

/// [`run`], writing the decision log to `plans` (one JSON line each).
pub fn run_with(
    sc: &Scenario,
    cal: &Calibration,
    policy: &mut dyn Policy,
    opts: &SimOptions,
    plans: Option<Box<dyn std::io::Write + Send>>,
) -> Timeline {
    let duration = opts.duration_s.unwrap_or(sc.duration_s);
    let scale = sc.duration_s / duration; // scenario seconds per run second
    let nr_iv = ((duration * 1000.0) / sc.interval_ms as f64).round() as u64;
    let client = opts.feedback == Feedback::Client;
    let mut node = SimulatedNode::new(sc, cal, client, opts.seed, scale);
    let mut ctl = ControlLoop::new(policy);
    let tl = Timeline {
        scenario: sc.name.clone(),
        mode: "sim".into(),
        feedback: opts.feedback.to_string(),
        policy: ctl.policy_name().to_owned(),
        seed: opts.seed,
        interval_s: sc.interval_ms as f64 / 1000.0,
        apps: sc.apps.iter().map(|a| a.name.clone()).collect(),
        energy_is_estimate: true,
        ..Default::default()
    };
    let mut tl = tl;
    let models: BTreeMap<&str, SimModel> = sc
        .apps
        .iter()
        .map(|a| (a.name.as_str(), SimModel::of(a)))
        .collect();
    tl.meta.insert(
        "model".into(),
        serde_json::json!({ "node": sc.node, "apps": models }),
    );
    let mut rec = RunRecorder::new(tl, node_caps(&sc.node));
    if let Some(w) = plans {
        rec = rec.with_plans(w);
    }
    let cadence = Cadence {
        monitor_ms: sc.monitor_ms,
        interval_ms: sc.interval_ms,
    };
    ctl.run_simulated(&mut node, &mut rec, cadence, nr_iv);
    rec.finish(ctl.counters());
    let clock = oracle::Clock {
        monitor_ms: cadence.monitor_ms,
        ticks_per_interval: cadence.ticks_per_decision(),
        nr_intervals: nr_iv,
        scale,
    };
    // The oracle counts cores; where apps share the CPUs (no cores knob)
    // there is no core count to bound, so no oracle.
    rec.tl.oracle = (!sc.node.shared_cpus).then(|| oracle::baseline(sc, cal, clock));
    rec.tl
}
