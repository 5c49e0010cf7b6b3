//! The simulated node: replays a scenario against per-app queueing models
//! ([`model`]) and drives any [`Policy`] through the same interface as the
//! daemon: a snapshot every monitoring tick (`observe`), a decision every
//! interval (`decide`), plans applied at once. Deterministic for a seed and
//! much faster than real time (no sleeping, closed-form queues).

pub mod model;

use qosd_core::{
    Allocations, AppClass, AppState, Feedback, FreqRange, Limits, NodeCaps, Plan, Policy,
    QosTarget, Share, Snapshot,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::calibrate::{network_queue_ms, Calibration};
use crate::scenario::{Scenario, SimNode};
use crate::timeline::{Row, Timeline};
use model::{percentile, Queue, Sample, SimModel};

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

/// What the node offers a policy.
pub fn node_caps(node: &SimNode) -> NodeCaps {
    NodeCaps {
        nr_cores: node.nr_cores,
        nr_ways: node.nr_ways,
        freq: Some(FreqRange {
            min_mhz: node.freq_min_mhz,
            max_mhz: node.freq_max_mhz,
            step_mhz: node.freq_step_mhz,
        }),
        mb: None,
        quota: None,
    }
}

/// The starting allocation (also the static baseline): cores and ways split
/// evenly, every core at the highest frequency.
pub fn initial_allocations(sc: &Scenario) -> Allocations {
    let n = sc.apps.len() as u32;
    let share = |total: u32, i: u32| total / n + u32::from(i < total % n);
    sc.apps
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let i = i as u32;
            let alloc = Share {
                nr_cores: share(sc.node.nr_cores, i),
                nr_ways: share(sc.node.nr_ways, i),
                freq_mhz: sc.node.freq_max_mhz,
                mb_percent: 0,
                cpu_quota_milli: 0,
            };
            (a.name.clone(), alloc)
        })
        .collect()
}

struct AppSim {
    model: SimModel,
    target_us: Option<f64>,
    percentile: f64,
    backlog: f64,
    net_q_ms: f64,
    rng: ChaCha8Rng,
    samples: Vec<Sample>,
    offered: f64,
    served: f64,
    busy_core_s: f64,
    energy_j: f64,
}

/// Whether a plan stays within the node.
fn plan_ok(plan: &Plan, current: &Allocations, node: &SimNode) -> bool {
    let a = &plan.allocations;
    let same_apps = a.len() == current.len() && current.keys().all(|k| a.contains_key(k));
    let cores: u32 = a.values().map(|x| x.nr_cores).sum();
    let ways: u32 = a.values().map(|x| x.nr_ways).sum();
    same_apps
        && cores <= node.nr_cores
        && a.values().all(|x| x.nr_cores >= 1)
        && (node.nr_ways == 0 || (ways <= node.nr_ways && a.values().all(|x| x.nr_ways >= 1)))
        && a.values()
            .all(|x| (node.freq_min_mhz..=node.freq_max_mhz).contains(&x.freq_mhz))
}

/// A standard normal sample (Box–Muller), from the app's own stream.
fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Replays `sc` on the simulated node under `policy`.
pub fn run(
    sc: &Scenario,
    cal: &Calibration,
    policy: &mut dyn Policy,
    opts: &SimOptions,
) -> Timeline {
    let node = &sc.node;
    let caps = node_caps(node);
    let duration = opts.duration_s.unwrap_or(sc.duration_s);
    let scale = sc.duration_s / duration; // scenario seconds per run second
    let dt = sc.monitor_ms as f64 / 1000.0;
    let ticks_per_iv = (sc.interval_ms / sc.monitor_ms) as usize;
    let nr_iv = ((duration * 1000.0) / sc.interval_ms as f64).round() as usize;
    let client = opts.feedback == Feedback::Client;
    let mut allocs = initial_allocations(sc);
    let mut apps: Vec<AppSim> = sc
        .apps
        .iter()
        .enumerate()
        .map(|(i, a)| AppSim {
            model: SimModel::of(a),
            target_us: cal.target_us(a),
            percentile: a.target.as_ref().map_or(99.0, |t| t.percentile),
            backlog: 0.0,
            net_q_ms: 0.0,
            rng: ChaCha8Rng::seed_from_u64(
                opts.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64 + 1),
            ),
            samples: Vec::with_capacity(ticks_per_iv),
            offered: 0.0,
            served: 0.0,
            busy_core_s: 0.0,
            energy_j: 0.0,
        })
        .collect();
    let mut tl = Timeline {
        scenario: sc.name.clone(),
        mode: "sim".into(),
        feedback: opts.feedback.to_string(),
        policy: policy.name().to_owned(),
        seed: opts.seed,
        interval_s: sc.interval_ms as f64 / 1000.0,
        apps: sc.apps.iter().map(|a| a.name.clone()).collect(),
        energy_is_estimate: true,
        ..Default::default()
    };
    let fmax = node.freq_max_mhz as f64;
    for iv in 0..nr_iv {
        let mut node_energy = 0.0;
        for k in 0..ticks_per_iv {
            let t0 = (iv * ticks_per_iv + k) as f64 * dt;
            let mut snap = Snapshot::default();
            node_energy += node.idle_w * dt;
            for (spec, st) in sc.apps.iter().zip(apps.iter_mut()) {
                let a = allocs[&spec.name];
                let full_cap = cal.apps.get(&spec.name).map_or(1.0, |c| c.capacity_rps);
                let lambda = cal.offered_rps(spec, (t0 + dt / 2.0) * scale);
                let s_us = st.model.service_time_us(&a, node);
                let c = st.model.servers(&a);
                let cap = c as f64 * 1e6 / s_us;
                let before = st.backlog;
                let served = (st.backlog + lambda * dt).min(cap * dt);
                // Clients give up on requests older than MAX_BACKLOG_S: the
                // backlog (and so the modelled wait) is bounded like a real
                // server's queue, and the excess is lost, not served late.
                st.backlog = (st.backlog + lambda * dt - served).min(cap * MAX_BACKLOG_S);
                let wait_us = 0.5 * (before + st.backlog) / cap * 1e6;
                let target_net = network_queue_ms(&st.model, lambda / full_cap);
                let tau = st.model.network_tau_s.max(1e-6);
                st.net_q_ms += (target_net - st.net_q_ms) * (1.0 - (-dt / tau).exp());
                let sigma = st.model.noise;
                let noise = (sigma * normal(&mut st.rng) - sigma * sigma / 2.0).exp();
                let sample = Sample {
                    queue: Queue::new(c, s_us, st.model.service_cv, lambda.min(cap) * 1e-6),
                    shift_us: st.model.fixed_us + wait_us,
                    network_us: (st.model.network_ms + st.net_q_ms) * 1000.0,
                    noise,
                    weight: served.max(1e-9),
                };
                st.samples.push(sample);
                st.offered += lambda * dt;
                st.served += served;
                let busy = (served / dt) * s_us * 1e-6; // cores busy
                st.busy_core_s += busy * dt;
                let fr = a.freq_mhz as f64 / fmax;
                let p = a.nr_cores as f64 * node.core_idle_w * fr
                    + busy.min(c as f64) * node.core_busy_w * fr.powi(3);
                st.energy_j += p * dt;
                node_energy += p * dt;
                snap.apps.push(state(
                    spec.name.clone(),
                    spec.class,
                    st,
                    &[sample],
                    client,
                    served / dt,
                    busy / c as f64,
                    p,
                ));
            }
            snap.apps.sort_by(|x, y| x.name.cmp(&y.name));
            let now_ms = ((t0 + dt) * 1000.0).round() as u64;
            // Every sample, the decision tick's too (decide() follows it).
            policy.observe(now_ms, &snap);
        }
        // Decision: the interval's percentiles, rows, then the plan.
        let iv_s = tl.interval_s;
        let t_end = (iv + 1) as f64 * iv_s;
        let mut snap = Snapshot {
            node_power_w: Some(node_energy / iv_s),
            ..Default::default()
        };
        for (spec, st) in sc.apps.iter().zip(apps.iter_mut()) {
            let a = allocs[&spec.name];
            let server = percentile(&st.samples, st.percentile, false).map(|x| x / 1000.0);
            let client_ms = percentile(&st.samples, st.percentile, true).map(|x| x / 1000.0);
            let fed = if client { client_ms } else { server };
            let target_ms = st.target_us.map(|t| t / 1000.0);
            let power = st.energy_j / iv_s;
            tl.rows.push(Row {
                t_s: t_end,
                app: spec.name.clone(),
                offered_rps: st.offered / iv_s,
                achieved_rps: st.served / iv_s,
                client_p99_ms: client_ms,
                ebpf_p99_ms: server,
                target_ms,
                violation: target_ms.and_then(|t| fed.map(|l| l > t)),
                cores: Some(a.nr_cores),
                freq_mhz: Some(a.freq_mhz),
                llc_ways: (node.nr_ways > 0).then_some(a.nr_ways),
                mb_percent: None,
                power_w: Some(power),
                cpu_quota_milli: None,
                be_ops_per_s: None,
            });
            let util = st.busy_core_s / iv_s / st.model.servers(&a) as f64;
            let samples = std::mem::take(&mut st.samples);
            snap.apps.push(state(
                spec.name.clone(),
                spec.class,
                st,
                &samples,
                client,
                st.served / iv_s,
                util,
                power,
            ));
            (st.offered, st.served, st.busy_core_s, st.energy_j) = (0.0, 0.0, 0.0, 0.0);
        }
        tl.node_power_w.push(node_energy / iv_s);
        snap.apps.sort_by(|x, y| x.name.cmp(&y.name));
        let plan = policy.decide((t_end * 1000.0).round() as u64, &snap, &allocs, &caps);
        if plan_ok(&plan, &allocs, node) {
            allocs = plan.allocations;
        } else {
            tl.rejected_plans += 1;
        }
    }
    tl
}

#[allow(clippy::too_many_arguments)]
fn state(
    name: String,
    class: AppClass,
    st: &AppSim,
    samples: &[Sample],
    client: bool,
    rps: f64,
    util: f64,
    power_w: f64,
) -> AppState {
    AppState {
        name,
        class,
        target: st.target_us.map(|v| QosTarget {
            percentile: st.percentile,
            value_us: v,
        }),
        latency_us: percentile(samples, st.percentile, client),
        rps,
        cpu_util: util.clamp(0.0, 1.0),
        power_w: Some(power_w),
        limits: Limits::default(),
    }
}
