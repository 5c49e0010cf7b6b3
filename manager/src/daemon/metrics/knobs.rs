//! Knob families: which knobs the policy turns, what each app holds of
//! each (one gauge per row of the knob table), and the decisions that
//! moved them.

use super::Exposition;
use crate::daemon::state::Shared;

pub(super) fn in_use(o: &mut Exposition, sh: &Shared) {
    let fam = o.gauge(
        "qosd_knob_in_use",
        "1 when the policy turns this knob, 0 when the node lacks it or the config disables it.",
    );
    for k in &sh.info.knobs {
        let backend = k.backend.as_deref().unwrap_or("none");
        let labels = [("resource", k.resource.name()), ("backend", backend)];
        fam.sample(&labels, f64::from(u8::from(k.in_use)));
    }
}

/// Only knobs in use, only managed apps, only values set.
pub(super) fn allocations(o: &mut Exposition, sh: &Shared) {
    let info = &sh.info;
    for k in &qosd_core::KNOBS {
        if !info
            .knobs
            .iter()
            .any(|i| i.resource == k.resource && i.in_use)
        {
            continue;
        }
        let fam = o.gauge(k.metric.name, k.metric.help);
        for a in sh.apps.values() {
            if let Some(v) = a.share.as_ref().map(k.share).filter(|v| *v > 0) {
                fam.app(&a.name, &[], f64::from(v) * k.metric.scale);
            }
        }
    }
}

/// Event counters of the knobs that count (the hedger's), per app.
pub(super) fn events(o: &mut Exposition, sh: &Shared) {
    let fam = o.counter(
        "qosd_app_knob_events_total",
        "Events of a knob for the app (hedge: requests, hedges_sent, hedges_won, dups_dropped, budget_refused, csum_fixed, ...).",
    );
    for a in sh.apps.values() {
        for (r, counters) in &a.knob_counters {
            for (event, n) in counters {
                fam.app(
                    &a.name,
                    &[("resource", r.name()), ("event", event)],
                    *n as f64,
                );
            }
        }
    }
}

pub(super) fn decisions(o: &mut Exposition, sh: &Shared) {
    let fam = o.counter(
        "qosd_decisions_total",
        "Policy decisions by app, resource and kind (upsize, downsize, revert, reclaim, grant).",
    );
    for ((app, r, kind), n) in &sh.decisions_total {
        let k = serde_json::to_value(kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let labels = [("resource", r.name()), ("kind", k.as_str())];
        fam.app(app, &labels, *n as f64);
    }
    o.counter(
        "qosd_reverts_total",
        "Changes the policy reverted (a downsize that hurt an app).",
    )
    .sample(&[], sh.loop_counters.reverts as f64);
}
