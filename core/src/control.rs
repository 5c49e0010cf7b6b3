//! The control loop, once for every node. A [`Node`] is what the loop
//! drives: the daemon's real node, a real replay's node (servers and load
//! generators beside the daemon's pieces) or the simulated node. The
//! [`ControlLoop`] senses the node on every monitoring tick and hands the
//! snapshot to the policy (`observe`); on decision ticks it asks for a
//! plan, applies it, tells the policy what was applied, and records the
//! decision and the interval. `qosd run`, `qosd replay` and `qosd replay
//! --sim` differ only in who calls [`ControlLoop::tick`] and when: a timer
//! on the real clock ([`ControlLoop::run_realtime`], in [`realtime`]) or a
//! plain loop on simulated time ([`ControlLoop::run_simulated`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod realtime;
pub mod rtgate;
pub use realtime::{Grid, RealTime, Ticked, Wake};
pub use rtgate::RtGate;

use crate::policy::{Allocations, DecisionKind, NodeCaps, Plan, Policy, Snapshot, Unmet};

/// One tick of the loop's clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tick {
    /// Milliseconds since the loop started (real or simulated).
    pub now_ms: u64,
    /// Seconds since the previous tick.
    pub dt_s: f64,
    /// A decision tick: the policy decides after observing.
    pub decide: bool,
}

/// One app over one decision interval, as a timeline row needs it. Both
/// latencies are kept whatever fed the policy, so that every run is
/// scored against what clients see.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AppInterval {
    pub app: String,
    /// Load offered by the clients, rps; `None` where no load generator
    /// of ours drives the app (the daemon).
    pub offered_rps: Option<f64>,
    /// Requests completed per second.
    pub achieved_rps: f64,
    /// Client-side latency at the target's percentile, µs.
    pub client_us: Option<f64>,
    /// Server-side (eBPF) latency at the target's percentile, µs.
    pub ebpf_us: Option<f64>,
    /// The target the client latency is scored against, µs.
    pub client_target_us: Option<f64>,
    /// The target the eBPF latency is scored against, µs: the client's
    /// less the client/server gap at the interval's load ([`crate::slo`]).
    pub ebpf_target_us: Option<f64>,
    /// Where the eBPF-side target came from.
    pub ebpf_target_from: Option<crate::slo::TargetFrom>,
    /// Power attributed to the app over the interval, W.
    pub power_w: Option<f64>,
    /// A best-effort app's batch job: operations per second over the
    /// interval (`None` for apps without a job).
    pub be_ops_per_s: Option<f64>,
    /// CPUs' worth of time the app's processes used over the interval
    /// (CPU seconds per second): with `achieved_rps`, its operational
    /// figures ([`crate::oa`]).
    pub cpus_used: Option<f64>,
}

/// What sensing a node gave: the policy's snapshot, and on decision ticks
/// the interval's figures for the timeline.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sensed {
    pub snapshot: Snapshot,
    /// Per app, the decision interval that just ended (decision ticks of
    /// nodes that keep a timeline; empty otherwise).
    pub interval: Vec<AppInterval>,
    /// Lines worth logging (an app appeared, exited, ...).
    pub events: Vec<String>,
}

/// What applying a plan put in force.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Applied {
    /// The allocation in force after the apply, every app.
    pub in_force: Allocations,
    /// Failures, one line each ("app: why"); empty when all went through.
    pub errors: Vec<String>,
    /// The same failures by app, for recorders that keep per-app outcomes
    /// (the daemon's API); apps that went away meanwhile are no failure.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failed: BTreeMap<String, String>,
    /// The whole plan was refused, and why (no app's part was tried).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl Applied {
    /// True when everything the plan asked for is in force.
    pub fn complete(&self, plan: &Plan) -> bool {
        self.errors.is_empty() && self.in_force == plan.allocations
    }
}

/// A node the loop can drive. Four required calls; the rest of a node's
/// life (discovery, admission, restoring knobs) is its own business.
pub trait Node {
    /// What the node has: the resources and how much of each.
    fn caps(&self) -> NodeCaps;

    /// The allocation in force, every managed app.
    fn current(&self) -> &Allocations;

    /// Measures the managed apps over the tick that just ended (and, on
    /// decision ticks, the interval). The snapshot's apps are sorted by
    /// name and have an entry in [`Node::current`].
    fn sense(&mut self, tick: &Tick) -> Sensed;

    /// Puts `plan` in force as far as possible and says what is in force.
    fn apply(&mut self, tick: &Tick, plan: &Plan) -> Applied;

    /// A decision changed nothing: a node whose processes can undo an
    /// allocation (threads that reset their own affinity) puts it in force
    /// again and says what it found. By default nothing is done.
    fn reassert(&mut self, tick: &Tick) -> Option<Applied> {
        let _ = tick;
        None
    }
}

/// One decision as the decision log keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionEntry {
    pub t_ms: u64,
    pub policy: String,
    pub plan: Plan,
    /// `None` when the plan changed nothing and was not applied.
    pub applied: Option<Applied>,
    /// When the plan changed nothing: what the node's
    /// [`Node::reassert`] put in force again, if it did anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasserted: Option<Applied>,
}

impl DecisionEntry {
    /// Apps the node cannot meet the QoS of, by the policy's word.
    pub fn cannot_meet(&self) -> &[Unmet] {
        &self.plan.cannot_meet
    }
}

/// Where the loop writes what happened: the timeline of a replay, the
/// daemon's API state, a decision log file. Both calls default to nothing.
pub trait Recorder {
    /// A decision interval ended (decision ticks, before deciding):
    /// `rows` from the node, `in_force` during the interval.
    fn interval(
        &mut self,
        t_ms: u64,
        rows: &[AppInterval],
        in_force: &Allocations,
        sensed: &Sensed,
    ) {
        let _ = (t_ms, rows, in_force, sensed);
    }

    /// A decision was made (and applied, if it changed anything; the
    /// plan's "cannot meet QoS" apps are in [`DecisionEntry::cannot_meet`]).
    fn decision(&mut self, entry: &DecisionEntry) {
        let _ = entry;
    }
}

/// A recorder that keeps nothing.
#[derive(Debug, Default)]
pub struct NoRecorder;
impl Recorder for NoRecorder {}

/// Running totals of a loop (for `/metrics` and `summary.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LoopCounters {
    pub monitor_ticks: u64,
    pub decisions: u64,
    /// Decisions whose plan changed the allocation.
    pub plans_changed: u64,
    /// Plans put in force only in part, or not at all.
    pub plans_failed: u64,
    /// Changes of kind `revert` in the plans.
    pub reverts: u64,
    /// "Cannot meet QoS" events (one per app per decision).
    pub cannot_meet: u64,
}

/// The loop. It owns the policy; the node and the recorder are lent to
/// each tick, so the driver keeps them (to restore knobs, write files).
/// `P` is any policy: `Box<dyn Policy + Send>` in the daemon,
/// `&mut dyn Policy` where the caller keeps the policy.
pub struct ControlLoop<P: Policy> {
    policy: P,
    counters: LoopCounters,
    /// Apps that want real time, and which have it ([`RtGate`]).
    rt_gate: RtGate,
}

impl<P: Policy> ControlLoop<P> {
    pub fn new(policy: P) -> ControlLoop<P> {
        ControlLoop {
            policy,
            counters: LoopCounters::default(),
            rt_gate: RtGate::default(),
        }
    }

    /// The real-time gate every decision's plan passes (none by default).
    pub fn set_rt_gate(&mut self, gate: RtGate) {
        self.rt_gate = gate;
    }

    pub fn policy_name(&self) -> &str {
        self.policy.name()
    }

    pub fn counters(&self) -> LoopCounters {
        self.counters
    }

    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// One tick: sense → observe; on decision ticks also record the
    /// interval, decide, apply a plan that changes anything (or let the
    /// node reassert what is in force), tell the policy what was applied,
    /// and record the decision with its "cannot meet QoS" apps. A policy may ask
    /// for a decision at other ticks too ([`Policy::wants_decision`]), and so
    /// may the real-time gate when an app must lose real time now
    /// ([`RtGate::wants_off`]: then the plan keeps the allocation but for
    /// the gate's change, and the policy is not asked); the interval
    /// (timeline row) stays the node's decision interval.
    pub fn tick(
        &mut self,
        node: &mut dyn Node,
        rec: &mut dyn Recorder,
        tick: Tick,
    ) -> (Sensed, Option<DecisionEntry>) {
        let sensed = node.sense(&tick);
        self.counters.monitor_ticks += 1;
        self.policy.observe(tick.now_ms, &sensed.snapshot);
        let caps = node.caps();
        let policy_decides = tick.decide || self.policy.wants_decision(tick.now_ms);
        if !policy_decides
            && !self
                .rt_gate
                .wants_off(&sensed.snapshot, node.current(), &caps)
        {
            return (sensed, None);
        }
        if tick.decide {
            rec.interval(tick.now_ms, &sensed.interval, node.current(), &sensed);
        }
        let current = node.current().clone();
        let mut plan = if policy_decides {
            self.policy
                .decide(tick.now_ms, &sensed.snapshot, &current, &caps)
        } else {
            Plan::keep(&current)
        };
        self.rt_gate.gate(&sensed.snapshot, &mut plan, &caps);
        self.counters.decisions += 1;
        self.counters.reverts += plan
            .decisions
            .iter()
            .filter(|d| d.kind == DecisionKind::Revert)
            .count() as u64;
        self.counters.cannot_meet += plan.cannot_meet.len() as u64;
        let applied = (plan.allocations != current).then(|| {
            self.counters.plans_changed += 1;
            let a = node.apply(&tick, &plan);
            if !a.complete(&plan) {
                self.counters.plans_failed += 1;
            }
            a
        });
        let in_force = applied.as_ref().map_or(&current, |a| &a.in_force);
        self.policy.applied(tick.now_ms, &plan, in_force);
        let reasserted = match applied {
            None => node.reassert(&tick),
            Some(_) => None,
        };
        let entry = DecisionEntry {
            t_ms: tick.now_ms,
            policy: self.policy.name().to_owned(),
            plan,
            applied,
            reasserted,
        };
        rec.decision(&entry);
        (sensed, Some(entry))
    }

    /// Runs on simulated time: `nr_intervals` decision intervals of
    /// `interval_ms`, sensed every `monitor_ms` (the simulated clock; a
    /// node that follows real time runs [`Self::run_realtime`] instead).
    pub fn run_simulated(
        &mut self,
        node: &mut dyn Node,
        rec: &mut dyn Recorder,
        cadence: Cadence,
        nr_intervals: u64,
    ) {
        let per = cadence.ticks_per_decision();
        for k in 1..=nr_intervals * per {
            let tick = Tick {
                now_ms: k * cadence.monitor_ms,
                dt_s: cadence.monitor_ms as f64 / 1000.0,
                decide: k % per == 0,
            };
            self.tick(node, rec, tick);
        }
    }
}

/// How often the loop senses and decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cadence {
    pub monitor_ms: u64,
    /// A multiple of `monitor_ms` (validated by config and scenario).
    pub interval_ms: u64,
}

impl Cadence {
    /// Monitoring ticks per decision (at least one).
    pub fn ticks_per_decision(&self) -> u64 {
        (self.interval_ms / self.monitor_ms.max(1)).max(1)
    }
}
