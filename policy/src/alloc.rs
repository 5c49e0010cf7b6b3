//! Moving units of resources between apps while a plan is built: bounds
//! (node range ∩ app limits), the free pool of cores and ways, victims to
//! take from and best-effort apps to give to. Shared by PARTIES and the
//! rule engine so that both keep every plan within the node and the limits.
//!
//! CPU quota follows the rule of `qosd_core::quota`: an app's quota is at
//! most its cores (its bound here, and a cores decrease lowers a quota
//! above the new cores in the same plan); where apps share CPUs (the node
//! has a quota knob but no cores knob) the quotas are a pool of the node's
//! CPUs, so a quota upsize takes from the free pool, then the victims
//! (best-effort apps first) and a downsize's freed quota goes to
//! best-effort apps, as cores and ways do. An app without a quota (0)
//! counts as holding all its cores. With `quota_be_first` the best-effort
//! cap moves first on such a node ([`shared`]).

use std::collections::BTreeMap;

use qosd_core::{
    Allocations, AppClass, Decision, DecisionKind, Limits, NodeCaps, Plan, Resource, Share,
    Snapshot,
};
use serde::{Deserialize, Serialize};

/// Where an upsize of a pooled resource (cores, ways) may take a unit from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Victim {
    /// Units no app holds.
    FreePool,
    /// The best-effort app holding the most units above its minimum.
    BestEffort,
    /// The other latency-critical app with the most slack.
    MostSlackLc,
}

/// How pooled units move: where upsizes take them, where downsizes put them.
#[derive(Debug, Clone, Copy)]
pub struct Moves<'p> {
    pub victims: &'p [Victim],
    /// A latency-critical victim must have more slack than this.
    pub victim_min_slack: f64,
    pub freed_to_best_effort: bool,
}

/// A done upsize: who paid for it (`None`: the free pool or a level).
#[derive(Debug, Clone, PartialEq)]
pub struct Upsized {
    pub victim: Option<String>,
}

/// Where a unit for an upsize comes from, once chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    Pool,
    App(String),
}

/// A plan under construction over the current allocation.
pub struct Editor<'a> {
    pub node: &'a NodeCaps,
    pub snap: &'a Snapshot,
    pub plan: Plan,
    /// Class and limits by app name (the snapshot is a list).
    apps: BTreeMap<&'a str, (AppClass, Limits)>,
    /// Where apps share CPUs, move best-effort caps before any
    /// latency-critical app's own quota ([`shared`]).
    pub quota_be_first: bool,
}

mod shared;

impl<'a> Editor<'a> {
    pub fn new(node: &'a NodeCaps, snap: &'a Snapshot, current: &Allocations) -> Editor<'a> {
        Editor {
            node,
            snap,
            plan: Plan::keep(current),
            apps: snap
                .apps
                .iter()
                .map(|a| (a.name.as_str(), (a.class, a.limits)))
                .collect(),
            quota_be_first: false,
        }
    }

    pub fn finish(self) -> Plan {
        self.plan
    }

    fn limits(&self, app: &str) -> Limits {
        self.apps.get(app).map(|a| a.1).unwrap_or_default()
    }

    fn class(&self, app: &str) -> Option<AppClass> {
        self.apps.get(app).map(|a| a.0)
    }

    pub fn alloc(&self, app: &str) -> Share {
        self.plan.allocations.get(app).copied().unwrap_or_default()
    }

    /// True when `r` is shared out of a node-wide total: cores and ways,
    /// and CPU quota where apps share CPUs (quota rule 2).
    pub fn pooled(&self, r: Resource) -> bool {
        r.is_pooled() || (r == Resource::CpuQuota && self.shared_quota())
    }

    /// Quota knob but no cores knob: every app runs on every CPU, and the
    /// sum of quotas is bounded by the node's CPUs.
    fn shared_quota(&self) -> bool {
        self.node.has(Resource::CpuQuota) && !self.node.has(Resource::Cores)
    }

    /// The allowed [lo, hi] of `r` for `app`: the node's range narrowed by
    /// the app's limits (and for quota, by its cores: quota rule 1).
    /// `None` when the node lacks `r`.
    pub fn bounds(&self, app: &str, r: Resource) -> Option<(u32, u32)> {
        let (nlo, mut nhi) = self.node.range(r)?;
        if r == Resource::CpuQuota {
            if let Some(c) = qosd_core::quota::ceiling_milli(&self.alloc(app), self.node) {
                nhi = nhi.min(c);
            }
        }
        let l = self.limits(app);
        let lo = nlo.max(l.min.get(r)).min(nhi);
        let hi = nhi.min(l.max.get(r)).max(lo);
        Some((lo, hi))
    }

    /// The app's value of `r`. A level never set (0) counts as the node's
    /// maximum: an unmanaged core runs at full speed, unthrottled; an app
    /// without a quota holds all its cores' worth; but a lever that is off
    /// until turned on (hedging) counts as its lowest.
    pub fn value(&self, app: &str, r: Resource) -> u32 {
        let a = self.alloc(app);
        let v = a.get(r);
        if v == 0 && r == Resource::CpuQuota {
            return qosd_core::quota::ceiling_milli(&a, self.node).unwrap_or(0);
        }
        if v == 0 && !r.is_pooled() {
            let found_at_max = qosd_core::knob(r).found_at_max;
            return self
                .node
                .range(r)
                .map_or(0, |(lo, hi)| if found_at_max { hi } else { lo });
        }
        v
    }

    /// Units of a pooled resource that no app holds.
    pub fn free(&self, r: Resource) -> u32 {
        let total = match (r, self.node.quota) {
            (Resource::CpuQuota, Some(q)) if self.shared_quota() => q.max_milli,
            _ => match self.node.pool(r) {
                Some(t) => t,
                None => return 0,
            },
        };
        let used: u32 = self
            .plan
            .allocations
            .keys()
            .filter(|n| !self.be_first(r) || self.capped(n))
            .map(|n| self.value(n, r))
            .fold(0u32, u32::saturating_add);
        total.saturating_sub(used)
    }

    /// The value `app` would have after raising `r` by `step`, if that is
    /// a change within bounds (ignoring where pooled units come from).
    pub fn raised(&self, app: &str, r: Resource, step: u32) -> Option<u32> {
        let (_, hi) = self.bounds(app, r)?;
        let cur = self.value(app, r);
        let to = cur.saturating_add(step).min(hi);
        (to > cur).then_some(to)
    }

    /// The value `app` would have after lowering `r` by `step`, if within bounds.
    pub fn lowered(&self, app: &str, r: Resource, step: u32) -> Option<u32> {
        let (lo, _) = self.bounds(app, r)?;
        let cur = self.value(app, r);
        let to = cur.saturating_sub(step).max(lo);
        (to < cur).then_some(to)
    }

    /// Finds who can give `amount` units of pooled `r` to `taker`, trying
    /// `order` in turn. `slack` gives an LC app's slack (None: unknown);
    /// LC victims must have slack above `lc_min_slack`.
    pub fn find_source(
        &self,
        taker: &str,
        r: Resource,
        amount: u32,
        order: &[Victim],
        slack: &dyn Fn(&str) -> Option<f64>,
        lc_min_slack: f64,
    ) -> Option<Source> {
        for v in order {
            match v {
                Victim::FreePool if self.free(r) >= amount => return Some(Source::Pool),
                Victim::FreePool => {}
                Victim::BestEffort => {
                    // Most units above its own minimum; ties go to the first name.
                    let best = self
                        .plan
                        .allocations
                        .keys()
                        .filter(|n| n.as_str() != taker && self.class(n) == Some(AppClass::Be))
                        .filter(|n| self.lowered_by(n, r, amount))
                        .max_by_key(|n| {
                            let lo = self.bounds(n, r).map_or(0, |b| b.0);
                            (self.value(n, r) - lo, std::cmp::Reverse((*n).clone()))
                        });
                    if let Some(n) = best {
                        return Some(Source::App(n.clone()));
                    }
                }
                Victim::MostSlackLc => {
                    let mut best: Option<(&String, f64)> = None;
                    for n in self.plan.allocations.keys() {
                        if n == taker || self.class(n) != Some(AppClass::Lc) {
                            continue;
                        }
                        let Some(s) = slack(n) else { continue };
                        if s > lc_min_slack
                            && self.lowered_by(n, r, amount)
                            && best.is_none_or(|(_, b)| s > b)
                        {
                            best = Some((n, s));
                        }
                    }
                    if let Some((n, _)) = best {
                        return Some(Source::App(n.clone()));
                    }
                }
            }
        }
        None
    }

    /// True if `app` can give exactly `amount` units of `r`.
    fn lowered_by(&self, app: &str, r: Resource, amount: u32) -> bool {
        self.lowered(app, r, amount)
            .is_some_and(|to| self.value(app, r) - to == amount)
    }

    /// The best-effort app (other than `giver`) that should receive
    /// `amount` freed units of `r`: the one holding the fewest.
    pub fn best_effort_taker(&self, giver: &str, r: Resource, amount: u32) -> Option<String> {
        self.plan
            .allocations
            .keys()
            .filter(|n| n.as_str() != giver && self.class(n) == Some(AppClass::Be))
            .filter(|n| {
                self.raised(n, r, amount)
                    .is_some_and(|to| to - self.value(n, r) == amount)
            })
            .min_by_key(|n| (self.value(n, r), (*n).clone()))
            .cloned()
    }

    /// Raises `app`'s `r` by one `step`, taking pooled units (cores, ways)
    /// from the first source in `moves.victims` that can give them.
    /// `None` when nothing can be done (at the bound, no source).
    pub fn upsize(
        &mut self,
        app: &str,
        r: Resource,
        step: u32,
        moves: &Moves<'_>,
        slack: &dyn Fn(&str) -> Option<f64>,
        reason: String,
    ) -> Option<Upsized> {
        if self.be_first(r) {
            return self.upsize_be_first(app, step, moves, slack, reason);
        }
        self.upsize_pooled(app, r, step, moves, slack, reason)
    }

    /// [`Editor::upsize`] by the common rule: the app's own value grows,
    /// pooled units come from the first victim that can give them.
    fn upsize_pooled(
        &mut self,
        app: &str,
        r: Resource,
        step: u32,
        moves: &Moves<'_>,
        slack: &dyn Fn(&str) -> Option<f64>,
        reason: String,
    ) -> Option<Upsized> {
        let to = self.raised(app, r, step)?;
        let amount = to - self.value(app, r);
        let mut victim = None;
        if self.pooled(r) {
            let src =
                self.find_source(app, r, amount, moves.victims, slack, moves.victim_min_slack)?;
            if let Source::App(v) = src {
                let vto = self.value(&v, r) - amount;
                self.set(
                    &v,
                    r,
                    vto,
                    DecisionKind::Reclaim,
                    format!("taken for {app}"),
                );
                victim = Some(v);
            }
        }
        self.set(app, r, to, DecisionKind::Upsize, reason);
        Some(Upsized { victim })
    }

    /// Lowers `app`'s `r` by one `step`; freed pooled units go to the
    /// best-effort app holding the fewest if `moves.freed_to_best_effort`.
    /// False when `app` is already at its bound.
    pub fn downsize(
        &mut self,
        app: &str,
        r: Resource,
        step: u32,
        moves: &Moves<'_>,
        reason: String,
    ) -> bool {
        if self.be_first(r) {
            return self.downsize_be_first(app, step, moves, reason);
        }
        self.downsize_pooled(app, r, step, moves, reason)
    }

    /// [`Editor::downsize`] by the common rule: the app's own value falls.
    fn downsize_pooled(
        &mut self,
        app: &str,
        r: Resource,
        step: u32,
        moves: &Moves<'_>,
        reason: String,
    ) -> bool {
        let Some(to) = self.lowered(app, r, step) else {
            return false;
        };
        let amount = self.value(app, r) - to;
        self.set(app, r, to, DecisionKind::Downsize, reason);
        if self.pooled(r) && moves.freed_to_best_effort {
            if let Some(be) = self.best_effort_taker(app, r, amount) {
                let bto = self.value(&be, r) + amount;
                self.set(&be, r, bto, DecisionKind::Grant, format!("freed by {app}"));
            }
        }
        true
    }

    /// Sets `app`'s `r` to `to` and records the decision. Fewer cores
    /// lower a quota above them to them (quota rule 1), in the same plan.
    pub fn set(&mut self, app: &str, r: Resource, to: u32, kind: DecisionKind, reason: String) {
        let from = self.value(app, r);
        if let Some(a) = self.plan.allocations.get_mut(app) {
            a.set(r, to);
        }
        self.plan.decisions.push(Decision {
            app: app.to_owned(),
            resource: r,
            kind,
            from,
            to,
            reason,
        });
        if r == Resource::Cores && to < from {
            let s = self.alloc(app);
            let ceiling = qosd_core::quota::ceiling_milli(&s, self.node);
            if let Some(c) = ceiling.filter(|c| s.cpu_quota_milli > *c) {
                self.set(
                    app,
                    Resource::CpuQuota,
                    c,
                    kind,
                    format!("quota at most the {to} core(s) held"),
                );
            }
        }
    }
}

/// A latency in µs for people: "850 µs", "24.31 ms".
pub fn fmt_us(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}
