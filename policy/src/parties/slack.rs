//! How PARTIES reads an app's slack from a snapshot: (target − latency) /
//! target of latency-critical apps, `idle_slack` for one that served
//! nothing, and the lower of it and its moving average where the preset
//! asks for one (`average_samples`, as PARTIES' code checks both).

use qosd_core::{AppClass, Snapshot};

use super::Parties;
use crate::alloc::fmt_us;

impl Parties {
    /// Slack of an LC app, with `idle_slack` standing in when it served
    /// nothing; `None` for BE apps and LC apps without a usable figure.
    pub(super) fn slack(&self, snap: &Snapshot, app: &str) -> Option<f64> {
        let now = self.sample_slack(snap, app)?;
        // Beside the moving average of its last samples, the lower counts.
        let avg = self.apps.get(app).and_then(|m| {
            (self.p.average_samples > 0 && !m.slacks.is_empty())
                .then(|| m.slacks.iter().sum::<f64>() / m.slacks.len() as f64)
        });
        Some(avg.map_or(now, |v| v.min(now)))
    }

    /// The slack of this sample alone (no average), for the average.
    pub(super) fn sample_slack(&self, snap: &Snapshot, app: &str) -> Option<f64> {
        let a = snap.app(app)?;
        if a.class != AppClass::Lc || a.target.is_none() {
            return None;
        }
        a.slack().or(if a.latency_us.is_none() {
            self.p.idle_slack
        } else {
            None
        })
    }

    /// The slack and the figures behind it, for a decision's reason.
    pub(super) fn describe(&self, snap: &Snapshot, app: &str) -> String {
        let Some(a) = snap.app(app) else {
            return String::new();
        };
        let s = self.slack(snap, app).unwrap_or(f64::NAN);
        match (a.target, a.latency_us) {
            (Some(t), Some(l)) => format!(
                "slack {s:.3} (p{} {} vs target {})",
                t.percentile,
                fmt_us(l),
                fmt_us(t.value_us)
            ),
            _ => format!("slack {s:.3} (no requests in the window)"),
        }
    }
}
