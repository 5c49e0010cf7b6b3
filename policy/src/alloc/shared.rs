//! CPU quota where apps share the CPUs, best-effort first
//! (`quota_be_first`). A quota caps an app's CPU time per CFS period; a
//! latency-critical app held under a cap is throttled for the rest of a
//! period once it has used it, and a request that arrives then waits. So
//! on a shared node the lever is the best-effort apps' cap: an LC app's
//! upsize lowers a BE cap by a step, its downsize raises one. An LC app's
//! own quota stays at its ceiling (all CPUs: no cap, `qosd_core::quota`
//! rule 2 does not count it) and is cut only for another LC app, when no
//! best-effort cap is left to take.

use qosd_core::{quota, AppClass, DecisionKind, Resource};

use super::{Editor, Moves, Source, Upsized, Victim};

const Q: Resource = Resource::CpuQuota;

impl Editor<'_> {
    /// True when `r` is CPU quota on a node whose apps share the CPUs and
    /// the best-effort cap moves first.
    pub fn be_first(&self, r: Resource) -> bool {
        self.quota_be_first && r == Q && self.shared_quota()
    }

    /// True when `app`'s quota caps it below its ceiling.
    pub(super) fn capped(&self, app: &str) -> bool {
        quota::capped(&self.alloc(app), self.node)
    }

    /// True when another latency-critical app shares the node with `app`:
    /// the only reason an LC app's own quota may be cut.
    fn competes(&self, app: &str) -> bool {
        self.plan
            .allocations
            .keys()
            .any(|n| n != app && self.class(n) == Some(AppClass::Lc))
    }

    /// The highest quota `app` may hold: its ceiling within its limits.
    fn top(&self, app: &str) -> Option<u32> {
        self.bounds(app, Q).map(|(_, hi)| hi)
    }

    /// Upsize of `app`'s quota, BE cap first. An LC app capped with no
    /// other LC app beside it has its cap lifted; one capped beside
    /// another LC app grows by the common rule; an uncapped one is helped
    /// by a step off a best-effort cap, else by capping the other LC app
    /// with the most slack just under what it uses.
    pub(super) fn upsize_be_first(
        &mut self,
        app: &str,
        step: u32,
        moves: &Moves<'_>,
        slack: &dyn Fn(&str) -> Option<f64>,
        reason: String,
    ) -> Option<Upsized> {
        if self.class(app) != Some(AppClass::Lc) || (self.capped(app) && self.competes(app)) {
            return self.upsize_pooled(app, Q, step, moves, slack, reason);
        }
        if self.capped(app) {
            let top = self.top(app)?;
            let why = format!(
                "{reason}; cap lifted: on shared CPUs an LC app is capped only for another LC app"
            );
            self.set(app, Q, top, DecisionKind::Upsize, why);
            return Some(Upsized { victim: None });
        }
        for v in moves.victims {
            let found = match v {
                Victim::FreePool => None, // an uncapped app already has every CPU
                Victim::BestEffort => self
                    .find_source(app, Q, step, &[Victim::BestEffort], slack, 0.0)
                    .and_then(|s| match s {
                        Source::App(be) => Some((be.clone(), self.value(&be, Q) - step)),
                        Source::Pool => None,
                    }),
                Victim::MostSlackLc => self.lc_to_cap(app, step, slack, moves.victim_min_slack),
            };
            if let Some((victim, to)) = found {
                let what = if self.class(&victim) == Some(AppClass::Be) {
                    "best-effort cap lowered"
                } else {
                    "capped just under its use"
                };
                self.set(
                    &victim,
                    Q,
                    to,
                    DecisionKind::Reclaim,
                    format!("{what} for {app}: {reason}"),
                );
                return Some(Upsized {
                    victim: Some(victim),
                });
            }
        }
        None
    }

    /// The other LC app with the most slack (above `min_slack`) and the cap
    /// it gets: a step below its cap, or when uncapped, a step below what
    /// it used (its CPU utilisation of the CPUs it may run on), rounded up
    /// to a step.
    fn lc_to_cap(
        &self,
        taker: &str,
        step: u32,
        slack: &dyn Fn(&str) -> Option<f64>,
        min_slack: f64,
    ) -> Option<(String, u32)> {
        let step = step.max(1);
        let mut best: Option<(String, f64, u32)> = None;
        for n in self.plan.allocations.keys() {
            if n == taker || self.class(n) != Some(AppClass::Lc) {
                continue;
            }
            let Some(s) = slack(n).filter(|s| *s > min_slack) else {
                continue;
            };
            let Some((lo, _)) = self.bounds(n, Q) else {
                continue;
            };
            let cur = self.value(n, Q);
            let want = if self.capped(n) {
                cur.saturating_sub(step)
            } else {
                let util = self.snap.app(n).map_or(1.0, |a| a.cpu_util);
                let used = (util.clamp(0.0, 1.0) * f64::from(cur)).ceil() as u32;
                used.div_ceil(step)
                    .saturating_mul(step)
                    .saturating_sub(step)
            };
            let to = want.max(lo);
            if to < cur && best.as_ref().is_none_or(|b| s > b.1) {
                best = Some((n.clone(), s, to));
            }
        }
        best.map(|(n, _, to)| (n, to))
    }

    /// Downsize of `app`'s quota, BE cap first: a best-effort cap grows by
    /// a step from the CPUs no cap holds. An LC app capped with no other
    /// LC app beside it has its cap lifted in the same plan (which frees
    /// what it held); one capped beside another LC app gives by the common
    /// rule. False when nothing changes.
    pub(super) fn downsize_be_first(
        &mut self,
        app: &str,
        step: u32,
        moves: &Moves<'_>,
        reason: String,
    ) -> bool {
        if self.class(app) != Some(AppClass::Lc) || (self.capped(app) && self.competes(app)) {
            return self.downsize_pooled(app, Q, step, moves, reason);
        }
        let lifted = self.capped(app);
        if lifted {
            let Some(top) = self.top(app) else {
                return false;
            };
            let why = format!(
                "{reason}; cap lifted: on shared CPUs an LC app is capped only for another LC app"
            );
            self.set(app, Q, top, DecisionKind::Upsize, why);
        }
        if self.free(Q) >= step {
            if let Some(be) = self.best_effort_taker(app, Q, step) {
                let to = self.value(&be, Q) + step;
                let why = format!("best-effort cap raised, {app} has slack: {reason}");
                self.set(&be, Q, to, DecisionKind::Grant, why);
                return true;
            }
        }
        lifted
    }
}
