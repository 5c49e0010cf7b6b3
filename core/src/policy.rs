//! The policy interface: what a policy sees (a [`Snapshot`] of measurements,
//! the current [`Allocations`], the node's [`NodeCaps`]) and what it returns
//! (a [`Plan`]). Both the daemon and the simulator drive a [`Policy`] through
//! this interface, so a policy is unit-testable without root or hardware.
//!
//! Allocations are counts and levels (2 cores, 4 ways, 1800 MHz, 50 % MB);
//! which physical CPUs or which way mask is the actuators' business.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::plan::{Decision, DecisionKind, Plan, Skipped, Unmet};
use crate::resources::Resource;
pub use crate::resources::{FreqRange, MbRange, NodeCaps, Share};

/// The PARTIES order of the knobs a policy moves.
impl Resource {
    /// The PARTIES order: cores → cache ways → frequency → memory
    /// bandwidth, then CPU quota (the knob every Linux node has; policies
    /// move it under the quota-and-cores rule of [`crate::quota`]).
    pub const CYCLE: [Resource; 5] = [
        Resource::Cores,
        Resource::CacheWays,
        Resource::Frequency,
        Resource::MemoryBandwidth,
        Resource::CpuQuota,
    ];
}

/// How an app is treated: latency-critical apps have a QoS target that the
/// policy defends; best-effort apps get what is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AppClass {
    /// Latency-critical: has a QoS target.
    Lc,
    /// Best-effort: receives freed resources, is the first victim.
    Be,
}

/// A QoS target: the latency at `percentile` must stay at or below
/// `value_us`. Example: `p99: 25ms` is `{ percentile: 99.0, value_us: 25000.0 }`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QosTarget {
    /// Percentile in (0, 100], e.g. 99.0 or 99.9.
    pub percentile: f64,
    /// Latency bound in microseconds, > 0.
    pub value_us: f64,
    /// The user's (client-side) SLO that slack is a fraction of, µs,
    /// where this target is another side's translation of it (an
    /// eBPF-side target: the SLO less the client/server gap,
    /// [`crate::slo`]); `None`: `value_us` itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_us: Option<f64>,
}

impl QosTarget {
    /// A target as the user wrote it (slack relative to itself).
    pub fn new(percentile: f64, value_us: f64) -> QosTarget {
        QosTarget {
            percentile,
            value_us,
            slo_us: None,
        }
    }
}

/// The share of every managed app, by app name (ordered, so that
/// iteration and therefore every policy is deterministic).
pub type Allocations = BTreeMap<String, Share>;

/// The range an app's allocation must stay in (from the config's min/max).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Lowest allowed value per resource.
    pub min: Share,
    /// Highest allowed value per resource (`u32::MAX`: no limit but the node's).
    pub max: Share,
}

impl Default for Limits {
    /// At least one core, otherwise only the node's own ranges apply.
    fn default() -> Self {
        Limits {
            min: Share {
                nr_cores: 1,
                nr_ways: 1,
                ..Share::default()
            },
            max: Share::filled(u32::MAX),
        }
    }
}

/// What is known about one app at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppState {
    /// The app's name from the config (key of [`Allocations`]).
    pub name: String,
    pub class: AppClass,
    /// QoS target; `None` for best-effort apps.
    pub target: Option<QosTarget>,
    /// Measured latency at the target's percentile, in µs, over the sensor
    /// window; `None` when no request was seen.
    pub latency_us: Option<f64>,
    /// Requests completed per second.
    pub rps: f64,
    /// Requests behind `latency_us` (its window's sample count): a p99 of
    /// 100 requests is their second largest, so a judge weighs it so.
    #[serde(default)]
    pub nr_samples: u64,
    /// CPU utilisation of the app's allocated cores, 0.0..=1.0.
    pub cpu_util: f64,
    /// CPU time the app used per second of the window (CPUs busy), from
    /// its processes' CPU time; `None` where not measured. With `rps` it
    /// gives the service demand of operational analysis ([`crate::oa`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_used: Option<f64>,
    /// The same over the last monitoring tick alone (noisy; what the
    /// real-time gate reads between decisions, [`crate::control::RtGate`]);
    /// `None` where not measured per tick, or when this tick's read failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_used_tick: Option<f64>,
    /// Power attributed to the app, in watts, if a power sensor runs.
    pub power_w: Option<f64>,
    /// The range the policy must keep this app's allocation in.
    pub limits: Limits,
}

impl AppState {
    /// An app with nothing measured yet: no target, no latency, no
    /// throughput, the widest limits. Snapshots built by hand (the
    /// simulator's, the examples', tests') start from it, so a quantity a
    /// new sensor adds stays `None` there until they model it.
    pub fn new(name: impl Into<String>, class: AppClass) -> AppState {
        AppState {
            name: name.into(),
            class,
            target: None,
            latency_us: None,
            rps: 0.0,
            nr_samples: 0,
            cpu_util: 0.0,
            cpus_used: None,
            cpus_used_tick: None,
            power_w: None,
            limits: Limits::default(),
        }
    }

    /// PARTIES slack: (target − latency) / SLO, the SLO being the target
    /// itself or, for a translated target, the user's ([`QosTarget::slo_us`]),
    /// so that the same headroom gives the same slack on either side.
    /// `None` without a target or without a measurement. Negative when
    /// the target is violated.
    pub fn slack(&self) -> Option<f64> {
        let t = self.target?;
        let l = self.latency_us?;
        let slo = t.slo_us.unwrap_or(t.value_us);
        (slo > 0.0).then(|| (t.value_us - l) / slo)
    }
}

/// The measurements of every managed app at one instant.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// Apps in a stable order (the daemon sorts them by name).
    pub apps: Vec<AppState>,
    /// Node power in watts, if known (measured or estimated).
    pub node_power_w: Option<f64>,
    /// The latency figures cover only samples taken after this instant
    /// (ms, the driver's clock). A policy judging an action applied at `t`
    /// counts a snapshot only when `since_ms >= t`: a window that still
    /// holds samples from before the action says nothing about it.
    /// `None`: the driver does not say (every snapshot counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
}

impl Snapshot {
    /// The state of the app with this name.
    pub fn app(&self, name: &str) -> Option<&AppState> {
        self.apps.iter().find(|a| a.name == name)
    }
}

/// A controller. It may keep state between calls (what it did last, whether
/// that helped, cool-downs); it does no I/O, so the same inputs in the same
/// order give the same plans.
///
/// The driver (daemon or simulator) calls [`Policy::observe`] on every
/// monitoring tick and [`Policy::decide`] on every decision tick (after that
/// tick's `observe`). Time is the driver's: milliseconds since its start.
pub trait Policy {
    /// A short name for logs ("parties", "power-saver").
    fn name(&self) -> &str;

    /// Chooses the next allocation. `current` has an entry for every app in
    /// `snapshot`; the plan must too, and stay within `node` and each app's
    /// [`Limits`].
    fn decide(
        &mut self,
        now_ms: u64,
        snapshot: &Snapshot,
        current: &Allocations,
        node: &NodeCaps,
    ) -> Plan;

    /// One monitoring sample between decisions, for "did the last action
    /// help" bookkeeping. The default ignores it; a policy that needs it
    /// also counts the snapshot passed to `decide`.
    fn observe(&mut self, now_ms: u64, snapshot: &Snapshot) {
        let _ = (now_ms, snapshot);
    }

    /// What the node put in force after `plan` (decided at `now_ms`): the
    /// driver calls it after every apply. `in_force` differs from
    /// `plan.allocations` where applying failed; a policy that remembers
    /// its action (to judge it, to move its resource cycle on) must forget
    /// an action that did not happen. The default ignores it.
    fn applied(&mut self, now_ms: u64, plan: &Plan, in_force: &Allocations) {
        let _ = (now_ms, plan, in_force);
    }

    /// True when the policy wants to decide at this monitoring tick,
    /// between the decision intervals (PARTIES' code decides 0.1 s apart
    /// while nothing is pending). The default: only at the interval.
    fn wants_decision(&self, now_ms: u64) -> bool {
        let _ = now_ms;
        false
    }
}

/// A borrowed or boxed policy is a policy (the loop takes either).
macro_rules! forward_policy {
    ($($t:ty),*) => {$(
        impl<P: Policy + ?Sized> Policy for $t {
            fn name(&self) -> &str {
                (**self).name()
            }
            fn decide(&mut self, now_ms: u64, s: &Snapshot, c: &Allocations, n: &NodeCaps) -> Plan {
                (**self).decide(now_ms, s, c, n)
            }
            fn observe(&mut self, now_ms: u64, s: &Snapshot) {
                (**self).observe(now_ms, s)
            }
            fn applied(&mut self, now_ms: u64, plan: &Plan, in_force: &Allocations) {
                (**self).applied(now_ms, plan, in_force)
            }
            fn wants_decision(&self, now_ms: u64) -> bool {
                (**self).wants_decision(now_ms)
            }
        }
    )*};
}
forward_policy!(&mut P, Box<P>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slack_is_relative_headroom() {
        let mut a = AppState {
            target: Some(QosTarget::new(99.0, 1000.0)),
            latency_us: Some(900.0),
            nr_samples: 100,
            ..AppState::new("m", AppClass::Lc)
        };
        assert!((a.slack().unwrap() - 0.1).abs() < 1e-9);
        a.latency_us = Some(1500.0);
        assert!((a.slack().unwrap() + 0.5).abs() < 1e-9);
        // An eBPF-side target 300 µs under a 1000 µs SLO: the headroom is
        // a fraction of the SLO.
        a.target = Some(QosTarget {
            slo_us: Some(1000.0),
            ..QosTarget::new(99.0, 700.0)
        });
        a.latency_us = Some(500.0);
        assert!((a.slack().unwrap() - 0.2).abs() < 1e-9);
        a.latency_us = None;
        assert_eq!(a.slack(), None);
    }

    #[test]
    fn missing_resources_are_reported_absent() {
        let node = NodeCaps {
            nr_cores: 2,
            nr_ways: 0,
            freq: None,
            mb: None,
            quota: None,
            ..Default::default()
        };
        assert!(node.has(Resource::Cores));
        assert!(!node.has(Resource::CpuQuota));
        assert!(!node.has(Resource::CacheWays));
        assert!(!node.has(Resource::Frequency));
        assert_eq!(node.range(Resource::Cores), Some((1, 2)));
        assert_eq!(node.range(Resource::Frequency), None);
    }

    #[test]
    fn resource_names_round_trip_with_aliases() {
        for r in Resource::ALL {
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{}\"", r.name()));
            assert_eq!(serde_json::from_str::<Resource>(&json).unwrap(), r);
        }
        for (alias, r) in [
            ("ways", Resource::CacheWays),
            ("freq", Resource::Frequency),
            ("mb", Resource::MemoryBandwidth),
            ("quota", Resource::CpuQuota),
        ] {
            let parsed: Resource = serde_json::from_str(&format!("\"{alias}\"")).unwrap();
            assert_eq!(parsed, r);
        }
        let mut a = Share::default();
        for (i, r) in Resource::ALL.into_iter().enumerate() {
            a.set(r, i as u32 + 7);
            assert_eq!(a.get(r), i as u32 + 7);
        }
    }
}
