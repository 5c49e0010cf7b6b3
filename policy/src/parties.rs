//! PARTIES (Chen et al., ASPLOS'19) as a pure [`Policy`]: slack-driven
//! upsize/downsize of one unit of one resource per decision, a per-app
//! resource cycle with a seeded start, "did it help" judgement over the
//! following samples, revert + cool-down of harmful downsizes, victims
//! (free pool → best-effort → most-slack LC) and freed units to best-effort.

use std::collections::BTreeMap;

use qosd_core::{Allocations, Decision, NodeCaps, Plan, Policy, Resource, Snapshot, Unmet};

use super::alloc::{Editor, Moves};

mod judge;
mod oa;
mod params;
mod slack;
mod trend;
pub(crate) use params::{slack_in_range, validate_victims};
pub use params::{PartiesParams, RevertVote, Steps};

/// Per-app memory of the controller.
#[derive(Debug, Clone)]
struct AppMem {
    /// Index into `cycle` of the resource this app tries next.
    cursor: usize,
    /// Downsizes of this app are barred until then.
    no_downsize_until_ms: u64,
    /// Its downsizes reverted in a row (the cool-down doubles with each,
    /// up to `downsize_cooldown_max_ms`; a downsize that holds resets it).
    harms: u32,
    /// Its last slacks (for `average_samples`), newest last.
    slacks: std::collections::VecDeque<f64>,
    /// Direction of its last action (true: upsize), for `restart_wheel_on_turn`.
    last_up: Option<bool>,
    /// Its X at the last decisions (`trend_upsize_intervals`), newest last.
    rates: std::collections::VecDeque<f64>,
}

#[derive(Debug, Clone)]
enum Judged {
    /// Upsize: latency at decision time, and the tally of later samples.
    Up {
        before_us: f64,
        fell: u32,
        counted: u32,
    },
    /// Downsize: the first app seen below the upsize threshold, if any,
    /// how many of the samples since had an app below it, and per app the
    /// requests behind its samples: (in samples below the threshold, in
    /// all samples) — the evidence `revert_vote: evidence` weighs.
    Down {
        hurt: Option<(String, f64)>,
        below: u32,
        counted: u32,
        requests: BTreeMap<String, (u64, u64)>,
    },
}

enum Verdict {
    None,
    Reverted,
    Note(String),
}

/// The last action, waiting to be judged at the next decision.
#[derive(Debug, Clone)]
struct Pending {
    app: String,
    resource: Resource,
    at_ms: u64,
    changes: Vec<Decision>,
    judged: Judged,
}

/// The PARTIES controller. Build it with [`Parties::new`].
#[derive(Debug, Clone)]
pub struct Parties {
    name: String,
    p: PartiesParams,
    seed: u64,
    apps: BTreeMap<String, AppMem>,
    pending: Option<Pending>,
    last_sample_ms: Option<u64>,
    /// Time of the last decision (for `idle_decide_ms`).
    last_decide_ms: Option<u64>,
    /// Wheel restarts drawn so far (each draw differs, all seeded).
    turns: u64,
    /// The state before the last decision, put back if its plan was not
    /// applied (the controller only learns from what happened).
    before: Option<(BTreeMap<String, AppMem>, Option<Pending>)>,
}

impl Parties {
    /// A controller with validated `params`; `seed` chooses where each
    /// app's resource cycle starts (same seed, same decisions).
    pub fn new(name: &str, params: PartiesParams, seed: u64) -> Parties {
        Parties {
            name: name.to_owned(),
            p: params,
            seed,
            apps: BTreeMap::new(),
            pending: None,
            last_sample_ms: None,
            last_decide_ms: None,
            turns: 0,
            before: None,
        }
    }

    /// The resource `app` will try next (for tests and the API).
    pub fn next_resource(&mut self, app: &str) -> Resource {
        let c = self.mem(app).cursor;
        self.p.cycle[c]
    }

    fn mem(&mut self, app: &str) -> &mut AppMem {
        let n = self.p.cycle.len();
        let seed = self.seed;
        self.apps.entry(app.to_owned()).or_insert_with(|| AppMem {
            cursor: (mix(seed, app) % n as u64) as usize,
            no_downsize_until_ms: 0,
            harms: 0,
            slacks: std::collections::VecDeque::new(),
            last_up: None,
            rates: std::collections::VecDeque::new(),
        })
    }

    fn advance(&mut self, app: &str) {
        let n = self.p.cycle.len();
        let m = self.mem(app);
        m.cursor = (m.cursor + 1) % n;
    }

    fn moves(&self) -> Moves<'_> {
        Moves {
            victims: &self.p.victims,
            victim_min_slack: self.p.victim_min_slack,
            freed_to_best_effort: self.p.freed_to_best_effort,
        }
    }

    /// Upsizes `app` on the first resource of its cycle (from its cursor)
    /// that can grow.
    /// Where `app`'s wheel starts for an action in direction `up`: its
    /// cursor, or a seeded random position when it turns
    /// (`restart_wheel_on_turn`, as PARTIES' code does).
    fn start(&mut self, app: &str, up: bool) -> usize {
        let n = self.p.cycle.len() as u64;
        let restart = self.p.restart_wheel_on_turn;
        self.turns += 1;
        let draw = mix(self.seed ^ self.turns, app);
        let m = self.mem(app);
        if restart && m.last_up == Some(!up) {
            m.cursor = (draw % n) as usize;
        }
        m.cursor
    }

    fn upsize(&mut self, ed: &mut Editor<'_>, app: &str, why: String) -> bool {
        let n = self.p.cycle.len();
        let start = self.start(app, true);
        let before_us = ed
            .snap
            .app(app)
            .and_then(|a| a.latency_us)
            .unwrap_or(f64::INFINITY);
        let reason = why;
        for k in 0..n {
            let idx = (start + k) % n;
            let r = self.p.cycle[idx];
            let done = {
                let slack_of = |name: &str| self.slack(ed.snap, name);
                let moves = self.moves();
                ed.upsize(
                    app,
                    r,
                    self.p.step.on(r, ed.node),
                    &moves,
                    &slack_of,
                    reason.clone(),
                )
            };
            let Some(done) = done else { continue };
            if let Some(v) = done.victim {
                // The victim was heading for this very resource: move it on.
                if self.mem(&v).cursor == idx {
                    self.advance(&v);
                }
            }
            self.mem(app).cursor = idx;
            self.mem(app).last_up = Some(true);
            self.pend_up(ed, app, r, before_us);
            return true;
        }
        false
    }

    /// Remembers an upsize of `r` for `app`, judged at the next decisions.
    fn pend_up(&mut self, ed: &Editor<'_>, app: &str, r: Resource, before_us: f64) {
        self.pend(
            ed,
            app,
            r,
            Judged::Up {
                before_us,
                fell: 0,
                counted: 0,
            },
        );
    }

    /// Remembers a downsize of `r` for `app`, reverted if it hurts.
    fn pend_down(&mut self, ed: &Editor<'_>, app: &str, r: Resource) {
        let judged = Judged::Down {
            hurt: None,
            below: 0,
            counted: 0,
            requests: BTreeMap::new(),
        };
        self.pend(ed, app, r, judged);
    }

    fn pend(&mut self, ed: &Editor<'_>, app: &str, resource: Resource, judged: Judged) {
        self.pending = Some(Pending {
            app: app.to_owned(),
            resource,
            at_ms: 0,
            changes: ed.plan.decisions.clone(),
            judged,
        });
    }

    /// The last resort (paper 003, issue 27): when no resource can grow
    /// for a violating app, the tail may come from a slow replica rather
    /// than this node, so its requests are hedged, where its config gives
    /// a `hedge:` spec (else its limits keep hedging off). Judged like any
    /// upsize.
    fn hedge_on(&mut self, ed: &mut Editor<'_>, app: &str, why: &str) -> bool {
        let before_us = ed.snap.app(app).and_then(|a| a.latency_us);
        let moves = self.moves();
        let reason = format!("{why}; no resource can grow: hedging its requests (last resort)");
        if ed
            .upsize(app, Resource::Hedge, 1, &moves, &|_| None, reason)
            .is_none()
        {
            return false;
        }
        self.mem(app).last_up = Some(true);
        self.pend_up(ed, app, Resource::Hedge, before_us.unwrap_or(f64::INFINITY));
        true
    }

    /// Turns `app`'s hedging off (a downsize, reverted if it hurts).
    fn hedge_off(&mut self, ed: &mut Editor<'_>, app: &str, reason: &str) -> bool {
        let moves = self.moves();
        if !ed.downsize(app, Resource::Hedge, 1, &moves, reason.to_owned()) {
            return false;
        }
        self.mem(app).last_up = Some(false);
        self.pend_down(ed, app, Resource::Hedge);
        true
    }

    /// Downsizes `app` on the first resource of its cycle that can shrink.
    /// `only` says which resources may shrink (all, for PARTIES' own
    /// downsizes); `reason` is the decision's.
    fn downsize(
        &mut self,
        ed: &mut Editor<'_>,
        app: &str,
        reason: String,
        only: &dyn Fn(Resource) -> bool,
    ) -> bool {
        // Hedging, turned on as the last resort, is the first thing given
        // back, but only on evidence: an app that served nothing (its
        // slack is `idle_slack`) hedges nothing, so hedging costs nothing
        // then, and an idle interval says nothing about whether the tail
        // needs it (as a rule's condition on an unknown figure is false).
        // Pooled resources still go back on `idle_slack`: others can use
        // them.
        let evidence = ed.snap.app(app).is_some_and(|a| a.latency_us.is_some());
        if only(Resource::Hedge) && evidence && self.hedge_off(ed, app, &reason) {
            return true;
        }
        let n = self.p.cycle.len();
        let start = self.start(app, false);
        for k in 0..n {
            let idx = (start + k) % n;
            let r = self.p.cycle[idx];
            if !only(r) {
                continue;
            }
            let step = self.p.step.on(r, ed.node);
            if self.barred(ed, app, r, step) {
                continue;
            }
            let moves = self.moves();
            if !ed.downsize(app, r, step, &moves, reason.clone()) {
                continue;
            }
            self.mem(app).cursor = idx;
            self.mem(app).last_up = Some(false);
            self.pend_down(ed, app, r);
            return true;
        }
        false
    }
}

impl Policy for Parties {
    fn name(&self) -> &str {
        &self.name
    }

    fn observe(&mut self, now_ms: u64, snap: &Snapshot) {
        self.last_sample_ms = Some(now_ms);
        let keep = self.p.average_samples as usize;
        if keep > 0 {
            for a in &snap.apps {
                if let Some(s) = self.sample_slack(snap, &a.name) {
                    let m = self.mem(&a.name);
                    m.slacks.push_back(s);
                    while m.slacks.len() > keep {
                        m.slacks.pop_front();
                    }
                }
            }
        }
        self.tally(now_ms, snap);
    }

    fn decide(
        &mut self,
        now_ms: u64,
        snap: &Snapshot,
        current: &Allocations,
        node: &NodeCaps,
    ) -> Plan {
        // The decision tick's snapshot is a sample too (once).
        if self.last_sample_ms != Some(now_ms) {
            self.observe(now_ms, snap);
        }
        // (Rates are what was measured, kept whether or not the plan is.)
        self.note_rates(snap);
        self.before = Some((self.apps.clone(), self.pending.clone()));
        self.last_decide_ms = Some(now_ms);
        let mut ed = Editor::new(node, snap, current);
        ed.quota_be_first = self.p.quota_be_first;
        let note = match self.judge(now_ms, &mut ed) {
            Verdict::Reverted => return ed.finish(),
            Verdict::Note(n) => format!("{n}; "),
            Verdict::None => String::new(),
        };
        // LC apps with a slack, in name order (ties go to the first name).
        let slacks: Vec<(String, f64)> = current
            .keys()
            .filter_map(|n| self.slack(snap, n).map(|s| (n.clone(), s)))
            .collect();
        // Violating apps, least slack first: the first one that can be
        // given a unit is upsized; those before it cannot be helped.
        let mut short: Vec<&(String, f64)> = slacks
            .iter()
            .filter(|(_, s)| *s < self.p.upsize_below_slack)
            .collect();
        short.sort_by(|a, b| a.1.total_cmp(&b.1));
        // Where headroom is gone (utilisation past max_util) first.
        let saturated = self.saturated(&ed, snap);
        short.sort_by_key(|(n, _)| !saturated.iter().any(|(s, _)| s == n));
        if !short.is_empty() {
            let mut unmet = Vec::new();
            for (app, _) in short {
                let why = format!(
                    "{note}{}; least slack < {}",
                    self.describe(snap, app),
                    self.p.upsize_below_slack
                );
                if self.upsize(&mut ed, app, why.clone()) || self.hedge_on(&mut ed, app, &why) {
                    break;
                }
                unmet.push(Unmet {
                    app: app.clone(),
                    reason: format!("{why}; no resource can grow (limits, node, no victim)"),
                });
            }
            ed.plan.cannot_meet = unmet;
        } else if !self.upsize_ahead(&mut ed, snap, &saturated, &slacks, &note) {
            // (An app past max_util, or heading below the upsize line at
            // the next interval's load, gets a unit before anything is
            // given back.) Apps with slack to spare and not cooling down, most slack
            // first: the first that can give a unit is downsized (one at
            // its floor must not hold the others' downsizes back).
            let mut spare: Vec<&(String, f64)> = slacks
                .iter()
                .filter(|(n, s)| {
                    *s > self.p.downsize_above_slack
                        && self
                            .apps
                            .get(n)
                            .is_none_or(|m| now_ms >= m.no_downsize_until_ms)
                })
                .collect();
            spare.sort_by(|a, b| b.1.total_cmp(&a.1));
            let mut gave = false;
            for (app, _) in spare {
                let why = format!(
                    "{note}{}; most slack > {}",
                    self.describe(snap, app),
                    self.p.downsize_above_slack
                );
                if self.downsize(&mut ed, app, why, &|_| true) {
                    gave = true;
                    break;
                }
            }
            if !gave {
                self.idle_cpu_downsize(&mut ed, snap, &slacks, now_ms, &note);
            }
        }
        // judge() took the old pending action: any pending one is new.
        if let Some(p) = self.pending.as_mut() {
            p.at_ms = now_ms;
        }
        ed.finish()
    }

    fn wants_decision(&self, now_ms: u64) -> bool {
        let every = self.p.idle_decide_ms;
        every > 0
            && self.pending.is_none()
            && self.last_decide_ms.is_some_and(|t| now_ms >= t + every)
    }

    fn applied(&mut self, _now_ms: u64, plan: &Plan, in_force: &Allocations) {
        let Some((apps, pending)) = self.before.take() else {
            return;
        };
        // Every change of the plan in force? Then the plan happened.
        let done = plan.decisions.iter().all(|d| {
            in_force
                .get(&d.app)
                .is_some_and(|s| s.get(d.resource) == d.to)
        });
        if !done {
            // It did not (or only in part): forget it, as if this decision
            // had not been made; the old action is judged again next time.
            self.apps = apps;
            self.pending = pending;
        }
    }
}

/// A stable 64-bit mix of the seed and an app name (FNV-1a + splitmix64),
/// so every app has its own seeded starting point in the cycle.
fn mix(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut z = h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fixes_tests;

#[cfg(test)]
mod quota_tests;

#[cfg(test)]
mod judge_tests;

#[cfg(test)]
mod sharing_tests;

#[cfg(test)]
mod hedge_tests;
