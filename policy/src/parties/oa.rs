//! Operational analysis in PARTIES' choices (`max_util`): a downsize whose
//! predicted utilisation on the smaller allocation exceeds the bound is not
//! tried (the plan's `skipped` says so), and an app already past the bound
//! is upsized before anything is given back. Utilisation is measured
//! (requests counted by the sensor, the app's CPU time), so this acts
//! before the tail latency does: a queue near saturation is a latency
//! spike waiting for the next burst, whatever the last window's p99 said.

use qosd_core::oa::Oa;
use qosd_core::{DecisionKind, NodeCaps, Resource, Share, Skipped, Snapshot};

use super::Parties;
use crate::alloc::{fmt_us, Editor};

impl Parties {
    /// `app`'s allocation in the plan so far, levels never set (0) read
    /// as what they mean (no quota: all its cores' worth).
    fn share_in(ed: &Editor<'_>, app: &str) -> Option<Share> {
        let mut s = *ed.plan.allocations.get(app)?;
        if s.cpu_quota_milli == 0 && ed.node.has(Resource::CpuQuota) {
            s.cpu_quota_milli = ed.value(app, Resource::CpuQuota);
        }
        Some(s)
    }

    /// `app`'s operational figures under its allocation in the plan.
    pub(super) fn oa(ed: &Editor<'_>, app: &str) -> Option<Oa> {
        Oa::of_app(ed.snap.app(app)?, &Self::share_in(ed, app)?, ed.node)
    }

    /// Whether a downsize of `app`'s `r` by `step` is barred by
    /// `max_util` or `min_predicted_slack`; if so it is recorded in the
    /// plan's `skipped`, with the figures of the prediction.
    pub(super) fn barred(&self, ed: &mut Editor<'_>, app: &str, r: Resource, step: u32) -> bool {
        if self.p.max_util.is_none() && self.p.min_predicted_slack.is_none() {
            return false;
        }
        let (Some(to), Some(before), Some(oa)) = (
            ed.lowered(app, r, step),
            Self::share_in(ed, app),
            Self::oa(ed, app),
        ) else {
            return false;
        };
        let mut after = before;
        after.set(r, to);
        let Some(why) = self.bar(ed.snap, app, &oa, &before, &after, ed.node) else {
            return false;
        };
        ed.plan.skipped.push(Skipped {
            app: app.to_owned(),
            resource: r,
            kind: DecisionKind::Downsize,
            reason: format!(
                "{} {} -> {to} {}: {why} (X {:.0} req/s, D {} CPU/request, U now {:.2})",
                r,
                before.get(r),
                r.unit(),
                oa.x_rps,
                fmt_us(oa.demand_s * 1e6),
                oa.util,
            ),
        });
        true
    }

    /// Why `app` may not go from `before` to `after`, if it may not: the
    /// predicted utilisation past `max_util`, or the slack predicted from
    /// the growth of its percentile's M/M/c wait below
    /// `min_predicted_slack` (the downsize would make the app violate, or
    /// come near enough that the next burst does).
    fn bar(
        &self,
        snap: &Snapshot,
        app: &str,
        oa: &Oa,
        before: &Share,
        after: &Share,
        node: &NodeCaps,
    ) -> Option<String> {
        let u = oa.util_on(before, after, node);
        if let Some(bound) = self.p.max_util.filter(|b| u > *b) {
            return Some(format!("predicted utilisation {u:.2} > max_util {bound}"));
        }
        let bound = self.p.min_predicted_slack?;
        let a = snap.app(app)?;
        let t = a.target?;
        let slack = a.slack()?;
        let slo_us = t.slo_us.unwrap_or(t.value_us);
        let predicted = match oa.wait_growth_on(before, after, node, t.percentile) {
            Some(grow_s) => slack - grow_s * 1e6 / slo_us,
            None => f64::NEG_INFINITY,
        };
        (predicted < bound).then(|| {
            format!(
                "predicted slack {predicted:.2} < min_predicted_slack {bound} \
                 (slack now {slack:.2}, p{} queueing wait on {:.1} CPUs, M/M/c)",
                t.percentile,
                qosd_core::oa::cpus_of(after, node).unwrap_or(oa.cpus),
            )
        })
    }

    /// Latency-critical apps whose utilisation is past `max_util` (their
    /// headroom gone), most utilised first.
    pub(super) fn saturated(&self, ed: &Editor<'_>, snap: &Snapshot) -> Vec<(String, f64)> {
        let Some(bound) = self.p.max_util else {
            return Vec::new();
        };
        let mut v: Vec<(String, f64)> = snap
            .apps
            .iter()
            .filter(|a| a.target.is_some())
            .filter_map(|a| Some((a.name.clone(), Self::oa(ed, &a.name)?.util)))
            .filter(|(_, u)| *u > bound)
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v
    }
}

impl Parties {
    /// Upsizes the most utilised app of `saturated` that can grow; false
    /// when none could.
    pub(super) fn headroom_upsize(
        &mut self,
        ed: &mut Editor<'_>,
        snap: &Snapshot,
        saturated: &[(String, f64)],
        note: &str,
    ) -> bool {
        let Some(bound) = self.p.max_util else {
            return false;
        };
        for (app, u) in saturated {
            let why = format!(
                "{note}{}; utilisation {u:.2} > max_util {bound} (headroom gone)",
                self.describe(snap, app)
            );
            if self.upsize(ed, app, why) {
                return true;
            }
        }
        false
    }
}

impl Parties {
    /// `downsize_below_util`: the least utilised app in the hysteresis
    /// band (not cooling down) whose CPUs would stay under the bound with
    /// one unit fewer gives that unit back. After PARTIES' own downsizes
    /// found nothing to give.
    pub(super) fn idle_cpu_downsize(
        &mut self,
        ed: &mut Editor<'_>,
        snap: &Snapshot,
        slacks: &[(String, f64)],
        now_ms: u64,
        note: &str,
    ) -> bool {
        let Some(bound) = self.p.downsize_below_util else {
            return false;
        };
        let cpu = |r: Resource| matches!(r, Resource::Cores | Resource::CpuQuota);
        let mut idle: Vec<(String, f64, Resource, f64)> = slacks
            .iter()
            .filter(|(n, s)| {
                *s >= self.p.upsize_below_slack
                    && self
                        .apps
                        .get(n)
                        .is_none_or(|m| now_ms >= m.no_downsize_until_ms)
            })
            .filter_map(|(n, _)| {
                let oa = Self::oa(ed, n)?;
                let before = Self::share_in(ed, n)?;
                // The first CPU resource of its cycle that can shrink, and
                // the utilisation it would leave.
                self.p
                    .cycle
                    .iter()
                    .copied()
                    .filter(|r| cpu(*r))
                    .find_map(|r| {
                        let to = ed.lowered(n, r, self.p.step.on(r, ed.node))?;
                        let mut after = before;
                        after.set(r, to);
                        let u = oa.util_on(&before, &after, ed.node);
                        (u < bound).then(|| (n.clone(), oa.util, r, u))
                    })
            })
            .collect();
        idle.sort_by(|a, b| a.1.total_cmp(&b.1));
        for (app, u, r, after) in idle {
            let why = format!(
                "{note}{}; utilisation {u:.2}, {after:.2} with one unit of {r} fewer \
                 < downsize_below_util {bound}",
                self.describe(snap, &app)
            );
            if self.downsize(ed, &app, why, &|x| x == r) {
                return true;
            }
        }
        false
    }
}
