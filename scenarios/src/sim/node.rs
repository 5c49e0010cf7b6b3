//! The simulated node as a [`Node`]: each app's queueing model
//! ([`super::model`]) advanced one monitoring tick per `sense`, plans put
//! in force at once by `apply` when they fit the node. Time is the loop's:
//! the node never looks at a clock. A best-effort batch job runs on the
//! CPUs its allocation gives it; where apps share the node's CPUs, on what
//! the latency-critical apps leave when it runs in the idle class
//! (`node.be_idle`, qosd's default), or at normal weight beside them, when
//! the latency-critical apps get only their fair part of the CPUs it runs
//! on ([`SimulatedNode::be_slowdown`]).

use qosd_core::admit::{admit, even_share, Peers};
use qosd_core::control::{AppInterval, Applied, Node, Sensed, Tick};
use qosd_core::slo::{Load, SloSide};
use qosd_core::{Allocations, AppState, Limits, NodeCaps, Plan, QosTarget, Resource, Share};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::model::{Sample, Shifts, SimModel};
use super::sampling::{normal, sampled_percentiles};
use super::{node_caps, MAX_BACKLOG_S};
use crate::calibrate::{network_load, network_queue_ms, Calibration};
use crate::scenario::{AppSpec, Scenario, SimNode};

struct AppSim {
    spec: AppSpec,
    model: SimModel,
    target_us: Option<f64>,
    /// The eBPF side of the app's SLO (client target − calibrated gap).
    slo: Option<SloSide>,
    percentile: f64,
    capacity_rps: f64,
    backlog: f64,
    net_q_ms: f64,
    rng: ChaCha8Rng,
    samples: Vec<Sample>,
    offered: f64,
    served: f64,
    busy_core_s: f64,
    energy_j: f64,
    /// A batch job's operations since the interval began.
    ops: f64,
}

/// A scenario's apps on the simulated node.
pub struct SimulatedNode {
    node: SimNode,
    caps: NodeCaps,
    apps: Vec<AppSim>,
    allocs: Allocations,
    client_feedback: bool,
    /// Scenario seconds per run second (`--duration` stretches the axis).
    scale: f64,
    /// Node energy since the interval began, J.
    node_energy_j: f64,
    /// Start of the current interval, ms.
    interval_start_ms: u64,
}

/// The starting allocation of a replay, real or simulated: every app
/// admitted in scenario order with its even share, by the daemon's rule.
pub fn start_allocations(sc: &Scenario, caps: &NodeCaps) -> Allocations {
    let mut current = Allocations::new();
    let mut peers = Peers::new();
    for (i, a) in sc.apps.iter().enumerate() {
        let want =
            qosd_core::knobs::with_class_defaults(even_share(caps, sc.apps.len(), i), a.class);
        // An even share always fits beside earlier even shares; a node too
        // small for one core each leaves the app out of the plan.
        if let Ok((share, _)) = admit(caps, &mut current, &peers, &a.name, want, Limits::default())
        {
            current.insert(a.name.clone(), share);
            peers.insert(a.name.clone(), (a.class, Limits::default()));
        }
    }
    current
}

impl SimulatedNode {
    pub fn new(
        sc: &Scenario,
        cal: &Calibration,
        client_feedback: bool,
        seed: u64,
        scale: f64,
    ) -> Self {
        let caps = node_caps(&sc.node);
        let apps = sc
            .apps
            .iter()
            .enumerate()
            .map(|(i, a)| AppSim {
                spec: a.clone(),
                model: SimModel::of(a),
                target_us: cal.target_us(a),
                slo: cal.slo(a),
                percentile: a.target.as_ref().map_or(99.0, |t| t.percentile),
                capacity_rps: cal.apps.get(&a.name).map_or(1.0, |c| c.capacity_rps),
                backlog: 0.0,
                net_q_ms: 0.0,
                rng: ChaCha8Rng::seed_from_u64(
                    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64 + 1),
                ),
                samples: Vec::new(),
                offered: 0.0,
                served: 0.0,
                busy_core_s: 0.0,
                energy_j: 0.0,
                ops: 0.0,
            })
            .collect();
        SimulatedNode {
            node: sc.node.clone(),
            allocs: start_allocations(sc, &caps),
            caps,
            apps,
            client_feedback,
            scale,
            node_energy_j: 0.0,
            interval_start_ms: 0,
        }
    }

    /// Whether a plan stays within the node (the knobs it has, the quota
    /// rule of `qosd_core::quota`).
    fn fits(&self, plan: &Plan) -> bool {
        let (a, node, caps) = (&plan.allocations, &self.node, &self.caps);
        let same_apps =
            a.len() == self.allocs.len() && self.allocs.keys().all(|k| a.contains_key(k));
        let cores: u32 = a.values().map(|x| x.nr_cores).sum();
        let ways: u32 = a.values().map(|x| x.nr_ways).sum();
        same_apps
            && (!caps.has(Resource::Cores)
                || (cores <= node.nr_cores && a.values().all(|x| x.nr_cores >= 1)))
            && (node.nr_ways == 0 || (ways <= node.nr_ways && a.values().all(|x| x.nr_ways >= 1)))
            && (!caps.has(Resource::Frequency)
                || a.values()
                    .all(|x| (node.freq_min_mhz..=node.freq_max_mhz).contains(&x.freq_mhz)))
            && qosd_core::quota::check(a, caps).is_ok()
    }

    /// Advances every app by one tick; returns each app's state.
    fn step(&mut self, tick: &Tick) -> Vec<AppState> {
        let node = &self.node;
        let dt = tick.dt_s;
        let t0 = tick.now_ms as f64 / 1000.0 - dt;
        self.node_energy_j += node.idle_w * dt;
        let mut states = Vec::with_capacity(self.apps.len());
        // CPUs the latency-critical apps keep busy: what a batch job on
        // shared CPUs cannot have. Servers first, then jobs.
        let mut lc_busy = 0.0;
        let slow = self.be_slowdown();
        for st in self.apps.iter_mut().filter(|st| st.spec.job.is_none()) {
            let Some(&a) = self.allocs.get(&st.spec.name) else {
                continue;
            };
            let lambda = st.spec.load.level_at((t0 + dt / 2.0) * self.scale) * st.capacity_rps;
            let s_us = st.model.service_time_us(&a, node);
            let cap = st.model.effective_cpus(&a, node) * 1e6 / (s_us * slow);
            let before = st.backlog;
            let served = (st.backlog + lambda * dt).min(cap * dt);
            // Clients give up on requests older than MAX_BACKLOG_S: the
            // backlog (and so the modelled wait) is bounded like a real
            // server's queue, and the excess is lost, not served late.
            st.backlog = (st.backlog + lambda * dt - served).min(cap * MAX_BACKLOG_S);
            let wait_us = 0.5 * (before + st.backlog) / cap * 1e6;
            let target_net = network_queue_ms(&st.model, network_load(&st.model, lambda, node));
            let tau = st.model.network_tau_s.max(1e-6);
            st.net_q_ms += (target_net - st.net_q_ms) * (1.0 - (-dt / tau).exp());
            let sigma = st.model.noise;
            let noise = (sigma * normal(&mut st.rng) - sigma * sigma / 2.0).exp();
            let at = Shifts {
                shift_us: st.model.fixed_us + wait_us,
                network_us: (st.model.network_ms + st.net_q_ms) * 1000.0,
                noise,
                weight: served.max(1e-9),
            };
            let sample = st.model.sample(&a, node, lambda, slow, at);
            st.samples.push(sample);
            st.offered += lambda * dt;
            st.served += served;
            // CPUs busy: CPU time served (sharing stretches holding
            // times, not CPU time).
            let busy = (served / dt) * s_us * 1e-6;
            let c = st.model.servers(&a, node);
            lc_busy += busy;
            st.busy_core_s += busy * dt;
            let p = app_power(node, &a, busy.min(c as f64));
            st.energy_j += p * dt;
            self.node_energy_j += p * dt;
            let seen = sampled_percentiles(&[sample], st.percentile, &mut st.rng);
            let held = st.model.effective_cpus(&a, node);
            let load = Load {
                rps: served / dt,
                cpus: Some(held),
            };
            states.push(state(
                st,
                seen,
                self.client_feedback,
                load,
                (busy / held.max(1e-9), busy),
                p,
            ));
        }
        for st in self.apps.iter_mut().filter(|st| st.spec.job.is_some()) {
            let Some(&a) = self.allocs.get(&st.spec.name) else {
                continue;
            };
            // In the idle class the job runs on what the LC apps leave; at
            // normal weight it also keeps a fair half where it wants one.
            let mut free = node.nr_cores as f64 - lc_busy;
            if !node.be_idle {
                free = free.max(0.5 * node.nr_cores as f64);
            }
            let (cpus, ops_per_s) = st.model.job_ops_per_s(&a, node, free);
            st.ops += ops_per_s * dt;
            st.busy_core_s += cpus * dt;
            let p = app_power(node, &a, cpus);
            st.energy_j += p * dt;
            self.node_energy_j += p * dt;
            let util = cpus / st.model.effective_cpus(&a, node).max(1e-9);
            states.push(state(
                st,
                (None, None, 0),
                self.client_feedback,
                Load::default(),
                (util, cpus),
                p,
            ));
        }
        states
    }

    /// How much longer LC requests take on CPUs shared with best-effort
    /// jobs at normal weight (1 in the idle class, or with cores apart):
    /// the jobs run on up to `want` CPUs (their threads, within their
    /// quota); the LC apps' threads get the CPUs the jobs leave, and at
    /// least a fair half of the node, so their service stretches by the
    /// CPUs they may use over what is left to them. A wake-up's wait for
    /// a running job's slice is not modelled.
    fn be_slowdown(&self) -> f64 {
        let node = &self.node;
        if node.be_idle || !node.shared_cpus {
            return 1.0;
        }
        let n = node.nr_cores as f64;
        let want: f64 = self
            .apps
            .iter()
            .filter(|st| st.spec.job.is_some())
            .filter_map(|st| {
                Some(
                    st.model
                        .effective_cpus(self.allocs.get(&st.spec.name)?, node),
                )
            })
            .sum();
        if want <= 0.0 {
            return 1.0;
        }
        let left = (n - want).max(0.5 * n);
        (n / left).max(1.0)
    }

    /// The interval that ends at this decision tick: rows and the
    /// snapshot over the whole interval; the accumulators start again.
    fn close_interval(&mut self, tick: &Tick) -> (Vec<AppInterval>, Vec<AppState>, f64) {
        let iv_s = (tick.now_ms - self.interval_start_ms) as f64 / 1000.0;
        let iv_s = iv_s.max(1e-9);
        let mut rows = Vec::with_capacity(self.apps.len());
        let mut states = Vec::with_capacity(self.apps.len());
        for st in &mut self.apps {
            let Some(&a) = self.allocs.get(&st.spec.name) else {
                continue;
            };
            let power = st.energy_j / iv_s;
            let job = st.spec.job.is_some();
            // The eBPF-side target at the interval's load, as the policy
            // would derive it from what eBPF counts.
            let held = st.model.effective_cpus(&a, &self.node);
            let load = Load {
                rps: st.served / iv_s,
                cpus: Some(held),
            };
            let ebpf_target = st.slo.as_ref().map(|s| s.ebpf_target_us(load));
            // What the sensors saw of the interval's requests: the
            // timeline and the policy get the same figures.
            let samples = std::mem::take(&mut st.samples);
            let seen = sampled_percentiles(&samples, st.percentile, &mut st.rng);
            rows.push(AppInterval {
                app: st.spec.name.clone(),
                offered_rps: (!job).then_some(st.offered / iv_s),
                achieved_rps: st.served / iv_s,
                client_us: seen.0,
                ebpf_us: seen.1,
                client_target_us: st.target_us,
                ebpf_target_us: ebpf_target.map(|t| t.0),
                ebpf_target_from: ebpf_target.map(|t| t.1),
                power_w: Some(power),
                be_ops_per_s: job.then_some(st.ops / iv_s),
                cpus_used: Some(st.busy_core_s / iv_s),
            });
            let busy = st.busy_core_s / iv_s;
            let util = busy / held.max(1e-9);
            states.push(state(
                st,
                seen,
                self.client_feedback,
                load,
                (util, busy),
                power,
            ));
            (st.offered, st.served, st.busy_core_s, st.energy_j, st.ops) =
                (0.0, 0.0, 0.0, 0.0, 0.0);
        }
        let node_w = self.node_energy_j / iv_s;
        self.node_energy_j = 0.0;
        self.interval_start_ms = tick.now_ms;
        (rows, states, node_w)
    }
}

impl Node for SimulatedNode {
    fn caps(&self) -> NodeCaps {
        self.caps
    }

    fn current(&self) -> &Allocations {
        &self.allocs
    }

    fn sense(&mut self, tick: &Tick) -> Sensed {
        let since_ms = tick.now_ms - (tick.dt_s * 1000.0).round() as u64;
        let mut states = self.step(tick);
        let mut sensed = Sensed::default();
        sensed.snapshot.since_ms = Some(since_ms);
        if tick.decide {
            // The decision sees the whole interval: every sample since the
            // last decision (and so since the last plan was applied).
            sensed.snapshot.since_ms = Some(self.interval_start_ms);
            let (rows, iv_states, node_w) = self.close_interval(tick);
            sensed.interval = rows;
            states = iv_states;
            sensed.snapshot.node_power_w = Some(node_w);
        }
        states.sort_by(|x, y| x.name.cmp(&y.name));
        sensed.snapshot.apps = states;
        sensed
    }

    fn apply(&mut self, _tick: &Tick, plan: &Plan) -> Applied {
        if self.fits(plan) {
            self.allocs = plan.allocations.clone();
            Applied {
                in_force: self.allocs.clone(),
                ..Default::default()
            }
        } else {
            Applied {
                in_force: self.allocs.clone(),
                errors: vec!["plan outside the simulated node: not applied".into()],
                ..Default::default()
            }
        }
    }
}

/// Power of an app's CPUs: its cores idle (where it holds cores) plus
/// the CPUs it keeps busy, at its frequency (0: the highest).
fn app_power(node: &SimNode, a: &Share, busy_cpus: f64) -> f64 {
    let fmax = node.freq_max_mhz.max(1) as f64;
    let fr = if a.freq_mhz == 0 {
        1.0
    } else {
        a.freq_mhz as f64 / fmax
    };
    let held = if node.shared_cpus {
        0.0
    } else {
        a.nr_cores as f64
    };
    held * node.core_idle_w * fr + busy_cpus * node.core_busy_w * fr.powi(3)
}

/// An app's state for the policy: `seen` is what the sensors reported
/// (client and server percentile, requests behind them), `cpu` its
/// utilisation and the CPUs it kept busy.
fn state(
    st: &AppSim,
    seen: (Option<f64>, Option<f64>, u64),
    client: bool,
    load: Load,
    cpu: (f64, f64),
    power_w: f64,
) -> AppState {
    AppState {
        // The target on the same side as the latency the policy is fed:
        // on the eBPF side the client's less the gap at the load eBPF
        // counts, slack still a fraction of the client's.
        target: if client {
            st.target_us.map(|v| QosTarget::new(st.percentile, v))
        } else {
            st.slo.as_ref().map(|s| QosTarget {
                slo_us: Some(s.client_target_us),
                ..QosTarget::new(st.percentile, s.ebpf_target_us(load).0)
            })
        },
        latency_us: if client { seen.0 } else { seen.1 },
        rps: load.rps,
        nr_samples: seen.2,
        cpu_util: cpu.0.clamp(0.0, 1.0),
        cpus_used: Some(cpu.1),
        power_w: Some(power_w),
        ..AppState::new(st.spec.name.clone(), st.spec.class)
    }
}
