//! The real-time gate (issue 20, docs/sharing-rt.md): a latency-critical
//! app configured to want real time (`cpu_priority: 3`) gets
//! [`PRIORITY_REALTIME`] only while its measured CPU use is well below the
//! CPUs it holds (its cores, its quota, or the node's online CPUs when
//! neither: [`cpus_held`]), and [`PRIORITY_NORMAL`] at once above, or
//! while the reading is missing: an RT app near saturation would starve
//! every fair task on its CPUs and hit its group's RT budget. The loop runs
//! it on each decision's plan, after the policy (whose range of the knob
//! stops at normal), and between decisions asks it whether an app that has
//! real time must lose it now ([`RtGate::wants_off`]: the last monitoring
//! tick's reading), so a rise is acted on within a tick, not a decision
//! interval. Each transition is a [`Decision`] of the plan, so every driver
//! logs and records it, and the level is the knob's
//! (`qosd_app_cpu_priority`, the timeline's shares).

use std::collections::BTreeSet;

use crate::knobs::{PRIORITY_NORMAL, PRIORITY_REALTIME};
use crate::oa::cpus_held;
use crate::plan::{Decision, DecisionKind, Plan};
use crate::policy::{Allocations, NodeCaps, Snapshot};
use crate::resources::{Resource, Share};

/// Real time is turned on below this share of the app's CPUs in use.
/// The bench's fixture spends 1 ms of CPU per request: at 50 % of a
/// 2-CPU node's capacity (~1000 rps) it uses ~1 CPU of 2 (0.5), at 80 %
/// ~1.6 (0.8); on at 50 %, off at 80 % (docs/sharing-rt.md, "The gate").
/// The daemon's `realtime.on_below` (the one default).
pub const RT_ON_BELOW: f64 = 0.6;
/// ... and off above this one (the hysteresis between the two keeps a
/// reading near one bound from flapping the class). Per 100 ms tick the
/// fixture at 50 % read 1.02 ± 0.08 CPUs, at most 1.19 (0.6 of 2) in 79
/// ticks; at 80 % 1.61 ± 0.15, above 1.4 in 98 of 103: one tick above
/// decides, no filter (docs/sharing-rt.md, "The gate").
/// The daemon's `realtime.off_above`.
pub const RT_OFF_ABOVE: f64 = 0.7;

/// The gate's state: which apps want real time, and which have it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RtGate {
    on_below: f64,
    off_above: f64,
    wants: BTreeSet<String>,
    on: BTreeSet<String>,
}

impl RtGate {
    /// A gate for the apps named in `wants`, with the default bounds.
    pub fn new(wants: impl IntoIterator<Item = String>) -> RtGate {
        RtGate::with_bounds(wants, RT_ON_BELOW, RT_OFF_ABOVE)
    }

    /// A gate with its own bounds (`on_below` <= `off_above`, both shares
    /// of the app's CPUs).
    pub fn with_bounds(
        wants: impl IntoIterator<Item = String>,
        on_below: f64,
        off_above: f64,
    ) -> RtGate {
        RtGate {
            on_below,
            off_above: off_above.max(on_below),
            wants: wants.into_iter().collect(),
            on: BTreeSet::new(),
        }
    }

    /// True when no app wants real time (the gate does nothing).
    pub fn is_empty(&self) -> bool {
        self.wants.is_empty()
    }

    /// The CPU use the gate judges `app` by, as a share of the CPUs it
    /// holds under `share`: the higher of the last tick's and the last
    /// decision interval's reading, and only with a reading of this tick
    /// (a node that kept an old figure while its reads fail gives none).
    /// `None`: no reading or no size to divide by.
    fn reading(snap: &Snapshot, app: &str, share: &Share, caps: &NodeCaps) -> Reading {
        // A reading of -0.00 (clock noise) is 0.
        let a = snap.app(app);
        let used = a
            .and_then(|a| Some(a.cpus_used_tick?.max(a.cpus_used.unwrap_or(0.0))))
            .map(|u| u.max(0.0));
        let held = cpus_held(Some(share), caps).filter(|h| *h > 0.0);
        Reading { used, held }
    }

    /// True when an app that has real time reads above the off bound, or
    /// has no reading, now: the loop then makes a decision at this
    /// monitoring tick instead of waiting for the next interval.
    pub fn wants_off(&self, snap: &Snapshot, current: &Allocations, caps: &NodeCaps) -> bool {
        caps.cpu_priority
            && self.on.iter().any(|name| {
                current.get(name).is_some_and(|share| {
                    Self::reading(snap, name, share, caps)
                        .ratio()
                        .is_none_or(|r| r > self.off_above)
                })
            })
    }

    /// Sets the CPU priority of every app that wants real time in `plan`:
    /// realtime or normal by its CPU use in `snap`; a change is added to
    /// the plan's decisions. A node without the priority knob is left
    /// alone.
    pub fn gate(&mut self, snap: &Snapshot, plan: &mut Plan, caps: &NodeCaps) {
        if !caps.cpu_priority {
            return;
        }
        self.on.retain(|a| plan.allocations.contains_key(a));
        for name in &self.wants {
            let Some(share) = plan.allocations.get_mut(name) else {
                continue;
            };
            let reading = Self::reading(snap, name, share, caps);
            let was = self.on.contains(name);
            let now = match reading.ratio() {
                None => false,
                Some(r) if was => r <= self.off_above,
                Some(r) => r < self.on_below,
            };
            let level = if now {
                PRIORITY_REALTIME
            } else {
                PRIORITY_NORMAL
            };
            let from = share.cpu_priority;
            share.cpu_priority = level;
            if now {
                self.on.insert(name.clone());
            } else {
                self.on.remove(name);
            }
            if from == level {
                continue;
            }
            let reason = match (reading.used, reading.held, reading.ratio()) {
                (Some(u), Some(h), Some(r)) => format!(
                    "CPU use {u:.2} of {h:.2} CPUs = {r:.2} ({} {})",
                    if now { "<" } else { ">" },
                    if now { self.on_below } else { self.off_above }
                ),
                _ => "no CPU-use reading: never real time without one".to_owned(),
            };
            plan.decisions.push(Decision {
                app: name.clone(),
                resource: Resource::CpuPriority,
                kind: if now {
                    DecisionKind::Upsize
                } else {
                    DecisionKind::Downsize
                },
                from,
                to: level,
                reason: format!("realtime gate: {reason}"),
            });
        }
    }
}

/// An app's CPU use and the CPUs it holds, as the gate reads them.
struct Reading {
    used: Option<f64>,
    held: Option<f64>,
}

impl Reading {
    fn ratio(&self) -> Option<f64> {
        Some(self.used? / self.held?)
    }
}

#[cfg(test)]
mod tests;
