//! Upsizing ahead of a rising load (`trend_upsize_intervals`). PARTIES
//! upsizes once slack is below `upsize_below_slack`, and the unit helps
//! from the next interval on, so on a climbing load the interval in
//! between violates. Here each app's throughput X is followed over its
//! last decision intervals; where it climbs, the slack at the next
//! interval's X is predicted by the M/M/c step the downsize guard uses
//! (the growth of the percentile's queueing wait on the same CPUs at the
//! same demand), and an app predicted below the line is upsized now.

use qosd_core::{DecisionKind, Skipped, Snapshot};

use super::Parties;
use crate::alloc::Editor;

/// An app predicted to fall below the upsize line at the next interval.
pub(super) struct Foreseen {
    app: String,
    predicted: f64,
    why: String,
}

impl Parties {
    /// Records each latency-critical app's X at a decision, for its trend.
    pub(super) fn note_rates(&mut self, snap: &Snapshot) {
        let Some(k) = self.p.trend_upsize_intervals else {
            return;
        };
        for a in snap.apps.iter().filter(|a| a.target.is_some()) {
            let m = self.mem(&a.name);
            m.rates.push_back(a.rps);
            while m.rates.len() > k as usize {
                m.rates.pop_front();
            }
        }
    }

    /// X's least-squares slope over the app's full window, req/s per
    /// interval (`None` until the window is full).
    fn slope(&self, app: &str) -> Option<f64> {
        let k = self.p.trend_upsize_intervals? as usize;
        let r = &self.apps.get(app)?.rates;
        if r.len() < k {
            return None;
        }
        let n = r.len() as f64;
        let mx = (n - 1.0) / 2.0;
        let my = r.iter().sum::<f64>() / n;
        let (mut sxy, mut sxx) = (0.0, 0.0);
        for (i, y) in r.iter().enumerate() {
            let dx = i as f64 - mx;
            sxy += dx * (y - my);
            sxx += dx * dx;
        }
        Some(sxy / sxx)
    }

    /// Apps in `slacks` not below the upsize line now whose slack at the
    /// next interval's X (rising) is predicted below it, lowest first.
    pub(super) fn foreseen(&self, ed: &Editor<'_>, slacks: &[(String, f64)]) -> Vec<Foreseen> {
        let line = self.p.upsize_below_slack;
        let mut v: Vec<Foreseen> = slacks
            .iter()
            .filter(|(_, s)| *s >= line)
            .filter_map(|(app, slack)| {
                let rise = self.slope(app).filter(|d| *d > 0.0)?;
                let a = ed.snap.app(app)?;
                let t = a.target?;
                // Only a measured slack (not `idle_slack`) is worth extending.
                a.slack()?;
                let oa = Self::oa(ed, app)?;
                let next = oa.x_rps + rise;
                let slo_us = t.slo_us.unwrap_or(t.value_us);
                let predicted = match oa.wait_growth_at(next, t.percentile) {
                    Some(grow_s) => slack - grow_s * 1e6 / slo_us,
                    None => f64::NEG_INFINITY,
                };
                (predicted < line).then(|| Foreseen {
                    app: app.clone(),
                    predicted,
                    why: format!(
                        "slack {slack:.3} now, {predicted:.2} predicted at the next interval's \
                         X {next:.0} req/s (trend +{rise:.0} req/s per interval, p{} queueing \
                         wait on {:.1} CPUs, M/M/c) < {line}",
                        t.percentile, oa.cpus
                    ),
                })
            })
            .collect();
        v.sort_by(|a, b| a.predicted.total_cmp(&b.predicted));
        v
    }

    /// Before anything is given back: an upsize where headroom is gone
    /// (`max_util`), else where the trend foresees a violation. True when
    /// one was made.
    pub(super) fn upsize_ahead(
        &mut self,
        ed: &mut Editor<'_>,
        snap: &Snapshot,
        saturated: &[(String, f64)],
        slacks: &[(String, f64)],
        note: &str,
    ) -> bool {
        if self.headroom_upsize(ed, snap, saturated, note) {
            return true;
        }
        let foreseen = self.foreseen(ed, slacks);
        self.trend_upsize(ed, foreseen, note)
    }

    /// Upsizes the first app of `foreseen` that can grow; one that cannot
    /// is listed in the plan's `skipped` (it does not violate yet, so it
    /// is no "cannot meet" event). False when none grew.
    fn trend_upsize(&mut self, ed: &mut Editor<'_>, foreseen: Vec<Foreseen>, note: &str) -> bool {
        for f in foreseen {
            let why = format!("{note}{}; {}", self.describe(ed.snap, &f.app), f.why);
            if self.upsize(ed, &f.app, why) {
                return true;
            }
            let next = self.apps.get(&f.app).map_or(0, |m| m.cursor);
            ed.plan.skipped.push(Skipped {
                app: f.app.clone(),
                resource: self.p.cycle[next],
                kind: DecisionKind::Upsize,
                reason: format!("{}; no resource can grow (limits, node, no victim)", f.why),
            });
        }
        false
    }
}
