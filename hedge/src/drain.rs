//! Turning hedging off without letting a duplicate through. A hedge sent
//! before the off still has two answers on their way (the replica's and
//! the service's); removing every program at once lets the second one
//! reach the app. So the off comes in two steps: new hedges stop at once
//! (the egress filter, the delay line and its thread go), while the answer
//! filters and their scoreboard stay until every hedge sent has settled
//! (its second answer came and was dropped: `hedges_sent ==
//! hedges_settled`) or `T_hedge` + [`DRAIN_RTT`] passed, whichever is
//! first. [`Hedges::reap`] finishes the drains that are done (the daemon
//! calls it at every decision through the knob's check); exit and
//! `qosd set --hold` wait for them (bounded by the same timeout).

use std::time::{Duration, Instant};

use qosd_actuators::journal::Entry;
use qosd_actuators::{Change, Ctx, Error};

use crate::actuator::{key_prefix, Active, Draining, Hedges};

/// The longest a hedged request's answers are waited for past `T_hedge`
/// before the answer filters go anyway (answers lost, or an id reused by
/// the app before its hedge settled).
pub const DRAIN_RTT: Duration = Duration::from_secs(1);

type Outcome = (Vec<Change>, Vec<Error>);

fn join(into: &mut Outcome, (c, e): Outcome) {
    into.0.extend(c);
    into.1.extend(e);
}

impl Active {
    /// Hedges sent whose second answer has not come (0: nothing to wait
    /// for, also in a dry run or when the counters cannot be read).
    pub(crate) fn in_flight(&self) -> u64 {
        let Some(w) = self.wired.as_ref() else {
            return 0;
        };
        match w.programs.counters() {
            Ok(c) => c.hedges_sent.saturating_sub(c.hedges_settled),
            Err(e) => {
                tracing::warn!("hedge: reading the counters to drain: {e:#}");
                0
            }
        }
    }
}

impl Hedges {
    /// Turns hedging off for `app`: new hedges stop now; its answer
    /// filters go once its hedges in flight settle (see the module doc).
    /// Without an app hedged, removes whatever the journal holds for it.
    pub fn disable(&mut self, ctx: &mut Ctx, app: &str) -> Outcome {
        let Some(mut active) = self.apps.remove(app) else {
            if self.draining.contains_key(app) {
                return Outcome::default();
            }
            let pre = key_prefix(app);
            return ctx
                .restore_where(|e| matches!(e, Entry::Net { key, .. } if key.starts_with(&pre)));
        };
        // The thread first: it writes clones back into the line.
        if let Some(w) = active.wired.as_mut() {
            w.thread = None;
        }
        let (egress, delay) = (
            format!("{}filter:", key_prefix(app)),
            key_prefix(app) + "delay",
        );
        let mut out = ctx.restore_where(|e| {
            matches!(e, Entry::Net { key, .. }
                if *key == delay || (key.starts_with(&egress) && key.ends_with(":egress")))
        });
        let deadline = Instant::now() + Duration::from_micros(active.spec.t_hedge_us) + DRAIN_RTT;
        self.draining
            .insert(app.to_owned(), Draining { active, deadline });
        join(&mut out, self.reap(ctx));
        out
    }

    /// Turns hedging off for every app and waits for their drains (exit,
    /// signal; at most `T_hedge` + [`DRAIN_RTT`]).
    pub fn disable_all(&mut self, ctx: &mut Ctx) -> Outcome {
        let mut out = Outcome::default();
        let apps: Vec<String> = self.apps.keys().cloned().collect();
        for app in apps {
            join(&mut out, self.disable(ctx, &app));
        }
        join(&mut out, self.wait_drained(ctx, None));
        join(
            &mut out,
            ctx.restore_where(|e| matches!(e, Entry::Net { key, .. } if key.starts_with("hedge:"))),
        );
        out
    }

    /// Finishes the drains that are done: nothing in flight, or past
    /// their deadline (said in the log: a late answer may then reach the
    /// app twice).
    pub fn reap(&mut self, ctx: &mut Ctx) -> Outcome {
        let now = Instant::now();
        let done: Vec<(String, u64)> = self
            .draining
            .iter()
            .map(|(app, d)| (app.clone(), d.active.in_flight(), d.deadline))
            .filter(|(_, left, deadline)| *left == 0 || now >= *deadline)
            .map(|(app, left, _)| (app, left))
            .collect();
        let mut out = Outcome::default();
        for (app, left) in done {
            if left > 0 {
                tracing::warn!(
                    "hedge for {app}: {left} hedges still unsettled after the drain's timeout; \
                     their late answers may reach the app twice"
                );
            }
            if let Some(d) = self.draining.remove(&app) {
                if let Some(c) = d
                    .active
                    .wired
                    .as_ref()
                    .and_then(|w| w.programs.counters().ok())
                {
                    self.last.insert(app.clone(), c);
                }
            }
            let pre = key_prefix(&app);
            join(
                &mut out,
                ctx.restore_where(|e| matches!(e, Entry::Net { key, .. } if key.starts_with(&pre))),
            );
        }
        out
    }

    /// Waits until `app`'s drain (every drain with `None`) is finished.
    pub fn wait_drained(&mut self, ctx: &mut Ctx, app: Option<&str>) -> Outcome {
        let mut out = Outcome::default();
        loop {
            join(&mut out, self.reap(ctx));
            let left = match app {
                Some(a) => self.draining.contains_key(a),
                None => !self.draining.is_empty(),
            };
            if !left {
                return out;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The apps whose hedging is being turned off.
    pub fn draining(&self) -> impl Iterator<Item = &str> {
        self.draining.keys().map(String::as_str)
    }
}
