//! The controller's bookkeeping: decisions and apply outcomes recorded
//! for the API (and their log lines), descriptions for the banner, and
//! each app's starting entry.

use qosd_core::{AppClass, Decision, Feedback, QosTarget, Share};

use super::super::state::{unix_ms, DecisionRecord};
use super::{DaemonNode, Events};
use crate::config::AppConfig;
use crate::node::actuate::Applied;

impl DaemonNode {
    /// "1 core (CPU 0)", "2 cores (CPUs 0-1), 4 ways", or "as found".
    pub fn describe(&self, app: &str) -> String {
        let Some(s) = self.act.current().get(app) else {
            return "nothing managed".into();
        };
        let mut parts = Vec::new();
        if s.nr_cores > 0 {
            let cpus = self.act.cpus(app).unwrap_or_default();
            let list = qosd_core::cpulist::format(&cpus);
            let (c, p) = if s.nr_cores == 1 {
                ("core", "CPU")
            } else {
                ("cores", "CPUs")
            };
            let p = if cpus.len() == 1 { "CPU" } else { p };
            parts.push(format!("{} {c} ({p} {list})", s.nr_cores));
        }
        if s.nr_ways > 0 {
            parts.push(format!("{} LLC ways", s.nr_ways));
        }
        if s.freq_mhz > 0 {
            parts.push(format!("{} MHz", s.freq_mhz));
        }
        if s.mb_percent > 0 {
            parts.push(format!("{} % memory bandwidth", s.mb_percent));
        }
        if s.cpu_quota_milli > 0 {
            let cpus = f64::from(s.cpu_quota_milli) / 1000.0;
            parts.push(format!("{cpus:.2} CPU of quota"));
        }
        if parts.is_empty() {
            "its resources as found".into()
        } else {
            parts.join(", ")
        }
    }

    /// Records decisions and apply outcomes (for the API) and returns
    /// their log lines. `plan_error`: the whole plan was refused.
    pub(super) fn record(
        &mut self,
        now_ms: u64,
        decisions: &[Decision],
        applied: &[Applied],
        plan_error: Option<&str>,
    ) -> Events {
        let mut ev = Events::new();
        for a in applied.iter().filter(|a| !a.gone) {
            if let Some(rt) = self.apps.iter_mut().find(|r| r.cfg.name == a.app) {
                rt.note = a
                    .error
                    .clone()
                    .map(|e| format!("applying its allocation failed: {e}"));
            }
        }
        let mut sh = self.shared.lock();
        for a in applied.iter().filter(|a| a.error.is_some() && !a.gone) {
            if let Some(live) = sh.apps.get_mut(&a.app) {
                live.apply_errors_total += 1;
            }
            if !decisions.iter().any(|d| d.app == a.app) {
                ev.push(format!(
                    "app {}: applying its allocation failed: {}",
                    a.app,
                    a.error.as_deref().unwrap_or("")
                ));
            }
        }
        for d in decisions {
            let failed = applied.iter().find(|a| a.app == d.app && a.error.is_some());
            let in_force = self.act.current().get(&d.app).map(|s| s.get(d.resource));
            let ok = plan_error.is_none() && failed.is_none() && in_force == Some(d.to);
            let error = plan_error
                .map(str::to_owned)
                .or_else(|| failed.and_then(|a| a.error.clone()))
                .or_else(|| (!ok).then(|| "the app is not managed any more".to_owned()));
            ev.push(format!(
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
        ev
    }
}

impl DaemonNode {
    /// The plan's "cannot meet QoS" events: each app's state for the API,
    /// its counter, a record in the decision log and a log line when the
    /// app enters that state.
    pub(super) fn cannot_meet(&mut self, now_ms: u64, plan: &qosd_core::Plan) -> Events {
        let mut ev = Events::new();
        let mut sh = self.shared.lock();
        for live in sh.apps.values_mut() {
            let why = plan.cannot_meet.iter().find(|u| u.app == live.name);
            let entering = why.is_some() && live.cannot_meet.is_none();
            live.cannot_meet = why.map(|u| u.reason.clone());
            if why.is_some() {
                live.cannot_meet_total += 1;
            }
            if entering {
                ev.push(format!(
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
        ev
    }
}

/// The starting live entry of a configured app.
pub fn live_entry(
    a: &AppConfig,
    feedback: Feedback,
    nr_slots: usize,
) -> crate::daemon::state::AppLive {
    crate::daemon::state::AppLive {
        name: a.name.clone(),
        class: a.class,
        feedback,
        target: a.qos_target().filter(|_| a.class == AppClass::Lc),
        pids: Vec::new(),
        pods: Vec::new(),
        share: None::<Share>,
        cpus: None,
        recent: crate::node::latency::Recent::new(nr_slots),
        figure: crate::config::figure_of(a.latency),
        ebpf: std::array::from_fn(|_| crate::node::latency::Recent::new(nr_slots)),
        inbox: Default::default(),
        cpu_util: 0.0,
        cpu_seconds_total: 0.0,
        be_ops_per_s: None,
        power_w: None,
        power: None,
        note: Some("not running".into()),
        apply_errors_total: 0,
        cannot_meet: None,
        cannot_meet_total: 0,
        oa: None,
        pid_oa: Default::default(),
        net: None,
        slo: None,
    }
}

/// For the start-up banner: "p99 ≤ 1 ms".
pub fn describe_target(t: Option<QosTarget>) -> String {
    match t {
        Some(t) => format!(
            "p{} <= {}",
            t.percentile,
            crate::policy::alloc::fmt_us(t.value_us)
        ),
        None => "no target".into(),
    }
}
