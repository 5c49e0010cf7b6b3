//! The daemon's [`Recorder`]: what the one loop decided, put where the API
//! reads it (each decision and "cannot meet QoS" event in the decision
//! log, the apps' failure counters and states) and the lines to log.

use qosd_core::control::{Applied, DecisionEntry, Recorder};
use qosd_core::{Decision, Plan};

use super::super::state::{unix_ms, DecisionRecord, SharedState};
use super::{DaemonNode, Events};
use crate::node::actuate;

/// Feeds the API's state from the loop's decisions (and the node's own:
/// admissions, see [`DaemonNode::record`]).
pub struct ApiRecorder {
    shared: SharedState,
    /// Nothing is changed: decisions are "(dry run)", never applied.
    dry_run: bool,
    /// Log lines since the last [`Self::take_events`].
    events: Events,
}

impl Recorder for ApiRecorder {
    fn decision(&mut self, entry: &DecisionEntry) {
        if let Some(a) = &entry.applied {
            self.outcome(entry.t_ms, &entry.plan.decisions, a);
        }
        if let Some(a) = &entry.reasserted {
            self.outcome(entry.t_ms, &[], a);
        }
        self.cannot_meet(entry.t_ms, &entry.plan);
    }
}

impl ApiRecorder {
    pub fn new(shared: SharedState, dry_run: bool) -> ApiRecorder {
        ApiRecorder {
            shared,
            dry_run,
            events: Events::new(),
        }
    }

    /// The lines recorded since the last call.
    pub fn take_events(&mut self) -> Events {
        std::mem::take(&mut self.events)
    }

    /// Records `decisions` with how applying them went (`applied`): each
    /// one in the decision log, each failed app in its counter.
    pub(super) fn outcome(&mut self, now_ms: u64, decisions: &[Decision], applied: &Applied) {
        let mut sh = self.shared.lock();
        for (app, e) in &applied.failed {
            if let Some(live) = sh.apps.get_mut(app) {
                live.apply_errors_total += 1;
            }
            if !decisions.iter().any(|d| d.app == *app) {
                self.events
                    .push(format!("app {app}: applying its allocation failed: {e}"));
            }
        }
        for d in decisions {
            let failed = applied.failed.get(&d.app);
            let in_force = applied.in_force.get(&d.app).map(|s| s.get(d.resource));
            let ok = applied.refused.is_none() && failed.is_none() && in_force == Some(d.to);
            let error = applied
                .refused
                .clone()
                .or_else(|| failed.cloned())
                .or_else(|| (!ok).then(|| "the app is not managed any more".to_owned()));
            self.events.push(format!(
                "{d}{}",
                match (&error, self.dry_run) {
                    (Some(e), _) => format!(" — NOT APPLIED: {e}"),
                    (None, true) => " (dry run)".to_owned(),
                    _ => String::new(),
                }
            ));
            sh.record(DecisionRecord {
                t_ms: now_ms,
                unix_ms: unix_ms(),
                app: d.app.clone(),
                resource: Some(d.resource),
                kind: d.kind,
                from: d.from,
                to: d.to,
                unit: d.resource.unit(),
                reason: d.reason.clone(),
                applied: ok && !self.dry_run,
                error,
            });
        }
    }

    /// The plan's "cannot meet QoS" events: each app's state for the API,
    /// its counter, a record in the decision log and a log line when the
    /// app enters that state.
    fn cannot_meet(&mut self, now_ms: u64, plan: &Plan) {
        let mut sh = self.shared.lock();
        for live in sh.apps.values_mut() {
            let why = plan.cannot_meet.iter().find(|u| u.app == live.name);
            let entering = why.is_some() && live.cannot_meet.is_none();
            live.cannot_meet = why.map(|u| u.reason.clone());
            if why.is_some() {
                live.cannot_meet_total += 1;
            }
            if entering {
                self.events.push(format!(
                    "app {}: CANNOT MEET QoS: {}",
                    live.name,
                    live.cannot_meet.as_deref().unwrap_or("")
                ));
            }
        }
        for u in &plan.cannot_meet {
            sh.record(DecisionRecord {
                t_ms: now_ms,
                unix_ms: unix_ms(),
                app: u.app.clone(),
                resource: None,
                kind: qosd_core::DecisionKind::CannotMeet,
                from: 0,
                to: 0,
                unit: "",
                reason: u.reason.clone(),
                applied: false,
                error: None,
            });
        }
    }
}

impl DaemonNode {
    /// Each app's note after an apply: its failure, or none.
    pub(super) fn note_outcome(&mut self, applied: &[actuate::Applied]) {
        for a in applied.iter().filter(|a| !a.gone) {
            if let Some(rt) = self.apps.iter_mut().find(|r| r.cfg.name == a.app) {
                rt.note = a
                    .error
                    .clone()
                    .map(|e| format!("applying its allocation failed: {e}"));
            }
        }
    }

    /// Records what the node decided itself (an admission's `decisions`,
    /// new processes given their app's settings) as the loop's recorder
    /// records the policy's; the lines to log.
    pub(super) fn record(
        &mut self,
        now_ms: u64,
        decisions: &[Decision],
        applied: &[actuate::Applied],
    ) -> Events {
        self.note_outcome(applied);
        let out = self.act.outcome(Ok(applied));
        self.log.outcome(now_ms, decisions, &out);
        self.log.take_events()
    }
}
