//! How PARTIES judges its last action from the samples taken after it:
//! whether an upsize helped (latency fell in most samples), and whether a
//! downsize hurt. A harmful downsize is reverted and its app cools down;
//! what counts as harm is `revert_vote`: the first sample below the upsize
//! threshold (the paper's words), a majority of samples (the published
//! code), or `evidence`: most of the requests measured since the action,
//! and enough of them for the percentile, in samples below it — so one
//! noisy sample of a hundred requests never reverts anything. The
//! cool-down doubles with each harm in a row, up to a ceiling, and starts
//! over when a downsize holds: give-back is never frozen for long.

use std::collections::BTreeMap;

use qosd_core::measure::samples_for_percentile;
use qosd_core::{DecisionKind, Snapshot};

use super::{Judged, Parties, RevertVote, Verdict};
use crate::alloc::{fmt_us, Editor};

impl Parties {
    /// Counts one sample toward the pending action's verdict. Only
    /// samples taken after the action count: a window that still holds
    /// latencies from before it says nothing about it.
    pub(super) fn tally(&mut self, now_ms: u64, snap: &Snapshot) {
        let Some(pend) = self.pending.as_ref() else {
            return;
        };
        if now_ms <= pend.at_ms || snap.since_ms.is_some_and(|s| s < pend.at_ms) {
            return;
        }
        let (app, threshold) = (pend.app.clone(), self.p.upsize_below_slack);
        // Every LC app's slack now: below the threshold or not, and the
        // requests that figure rests on.
        let seen: Vec<(String, f64, u64)> = snap
            .apps
            .iter()
            .filter_map(|a| Some((a.name.clone(), self.slack(snap, &a.name)?, a.nr_samples)))
            .collect();
        let first_hurt = seen
            .iter()
            .find(|(_, s, _)| *s < threshold)
            .map(|(n, s, _)| (n.clone(), *s));
        let lat = snap.app(&app).and_then(|a| a.latency_us);
        let Some(pend) = self.pending.as_mut() else {
            return;
        };
        match &mut pend.judged {
            Judged::Up {
                before_us,
                fell,
                counted,
            } => {
                if let Some(l) = lat {
                    *counted += 1;
                    if l < *before_us {
                        *fell += 1;
                    }
                }
            }
            Judged::Down {
                hurt,
                below,
                counted,
                requests,
            } => {
                *counted += 1;
                *below += u32::from(first_hurt.is_some());
                if hurt.is_none() {
                    *hurt = first_hurt;
                }
                for (name, s, n) in seen {
                    let e = requests.entry(name).or_default();
                    e.1 += n;
                    if s < threshold {
                        e.0 += n;
                    }
                }
            }
        }
    }

    /// Whether a downsize hurt, by the preset's `revert_vote`, given that
    /// some sample after it found an app below the threshold.
    fn harmful(
        &self,
        snap: &Snapshot,
        below: u32,
        counted: u32,
        requests: &BTreeMap<String, (u64, u64)>,
    ) -> bool {
        match self.p.revert_vote {
            RevertVote::First => true,
            RevertVote::Majority => 2 * below > counted,
            RevertVote::Evidence => requests.iter().any(|(app, &(bad, all))| {
                let pct = snap
                    .app(app)
                    .and_then(|a| a.target)
                    .map_or(99.0, |t| t.percentile);
                all >= samples_for_percentile(pct) && 2 * bad > all
            }),
        }
    }

    /// The cool-down after one more harm of `app`'s downsizes, ms: the
    /// base doubled per harm in a row, up to the ceiling.
    pub(super) fn cooldown_ms(&mut self, app: &str) -> u64 {
        let (base, max) = (
            self.p.downsize_cooldown_ms,
            self.p
                .downsize_cooldown_max_ms
                .max(self.p.downsize_cooldown_ms),
        );
        let m = self.mem(app);
        m.harms = m.harms.saturating_add(1);
        base.saturating_mul(1u64 << (m.harms - 1).min(20)).min(max)
    }

    /// Judges the pending action: reverts a harmful downsize (returns
    /// `Verdict::Reverted`), or notes whether an upsize helped.
    pub(super) fn judge(&mut self, now_ms: u64, ed: &mut Editor<'_>) -> Verdict {
        let Some(pend) = self.pending.take() else {
            return Verdict::None;
        };
        if !ed.plan.allocations.contains_key(&pend.app) {
            return Verdict::None;
        }
        match pend.judged {
            Judged::Down {
                hurt: Some((victim, s)),
                below,
                counted,
                ref requests,
            } if self.harmful(ed.snap, below, counted, requests) => {
                let cool = self.cooldown_ms(&pend.app);
                self.mem(&pend.app).no_downsize_until_ms = now_ms + cool;
                self.advance(&pend.app);
                let reason = format!(
                    "downsize of {}'s {} pushed {victim} to slack {s:.3} < {} ({}): reverted, {} not downsized for {cool} ms",
                    pend.app, pend.resource, self.p.upsize_below_slack,
                    self.evidence(below, counted, requests),
                    pend.app,
                );
                for d in pend.changes.iter().rev() {
                    if ed.plan.allocations.contains_key(&d.app)
                        && ed.value(&d.app, d.resource) == d.to
                    {
                        ed.set(
                            &d.app,
                            d.resource,
                            d.from,
                            DecisionKind::Revert,
                            reason.clone(),
                        );
                    }
                }
                Verdict::Reverted
            }
            Judged::Down { .. } => {
                // It held: the next harm starts the cool-down over.
                self.mem(&pend.app).harms = 0;
                Verdict::None
            }
            Judged::Up {
                before_us,
                fell,
                counted,
            } => {
                let helped =
                    counted > 0 && f64::from(fell) > self.p.helped_fraction * f64::from(counted);
                let what = format!(
                    "last +{} for {} {} (latency below {} in {fell}/{counted} samples)",
                    pend.resource,
                    pend.app,
                    if helped { "helped" } else { "did not help" },
                    fmt_us(before_us),
                );
                if !helped {
                    self.advance(&pend.app);
                }
                Verdict::Note(what)
            }
        }
    }

    /// The evidence behind a revert, for its reason.
    fn evidence(
        &self,
        below: u32,
        counted: u32,
        requests: &BTreeMap<String, (u64, u64)>,
    ) -> String {
        let per_app: Vec<String> = requests
            .iter()
            .filter(|(_, (bad, _))| *bad > 0)
            .map(|(a, (bad, all))| format!("{a}: {bad}/{all} requests"))
            .collect();
        format!(
            "{below}/{counted} samples below; {}",
            if per_app.is_empty() {
                "no requests".to_owned()
            } else {
                per_app.join(", ")
            }
        )
    }
}
