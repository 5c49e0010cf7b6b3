//! The daemon on the real clock: the one loop's
//! [`ControlLoop::run_realtime`](qosd_core::control::ControlLoop::run_realtime)
//! drives its node. Between ticks the daemon wakes for signals (stop, or
//! SIGHUP: reload the config) and for a changed config file; after each
//! tick it publishes the node to the API and logs the tick's lines.

use std::sync::Arc;
use std::time::{Duration, Instant};

use qosd_core::control::{Cadence, Node, RealTime, Recorder, Ticked, Wake};
use tokio::time::{Interval, MissedTickBehavior};

use super::{ApiRecorder, Controller, DaemonNode};
use crate::config::Config;
use crate::daemon::{auth, reload, Options};
use crate::signals::{self, Action, Watched};

/// What wakes the daemon between ticks besides the clock.
pub struct Wakeups {
    sigs: Watched,
    /// A signal that arrived during start-up.
    early: Option<i32>,
    /// The config file, checked every second; the config in force.
    config: reload::FileWatch,
    file_check: Interval,
    running: Config,
    /// The API's write token file, checked after each tick.
    token: auth::TokenWatch,
    credential: Arc<auth::Credential>,
}

impl Wakeups {
    pub fn new(
        sigs: Watched,
        early: Option<i32>,
        o: &Options,
        running: Config,
        token: auth::TokenWatch,
        credential: Arc<auth::Credential>,
    ) -> Wakeups {
        let mut file_check = tokio::time::interval(Duration::from_secs(1));
        file_check.set_missed_tick_behavior(MissedTickBehavior::Skip);
        Wakeups {
            sigs,
            early,
            config: reload::FileWatch::new(&o.config),
            file_check,
            running,
            token,
            credential,
        }
    }
}

/// The daemon's driver of the real-time loop.
struct Driver<'a> {
    node: &'a mut DaemonNode,
    rec: &'a mut ApiRecorder,
    w: &'a mut Wakeups,
    o: &'a Options,
    start: Instant,
}

impl RealTime for Driver<'_> {
    fn parts(&mut self) -> (&mut dyn Node, &mut dyn Recorder) {
        (&mut *self.node, &mut *self.rec)
    }

    async fn wait(&mut self, due: Instant) -> Wake {
        // A SIGHUP during start-up needs no reload: the file was just read.
        if let Some(s) = self.w.early.take() {
            if signals::action(s) == Action::Stop {
                return Wake::Stop(signals::name(s));
            }
        }
        let reload_why = tokio::select! {
            _ = tokio::time::sleep_until(due.into()) => return Wake::Due,
            s = self.w.sigs.next() => match s {
                Ok(s) => match signals::action(s) {
                    Action::Stop => return Wake::Stop(signals::name(s)),
                    Action::Reload => "SIGHUP",
                },
                Err(e) => return Wake::Stop(format!("{e:#}")),
            },
            _ = self.w.file_check.tick() => {
                if !self.w.config.changed() {
                    return Wake::Again;
                }
                "the file changed"
            }
        };
        if reload_why == "SIGHUP" {
            // The file as of now: no second reload for the same change.
            self.w.config.changed();
        }
        for e in reload::reload(self.o, &mut self.w.running, self.node, reload_why) {
            println!("[{:>8.1} s] {e}", self.start.elapsed().as_secs_f64());
        }
        Wake::Again
    }

    fn ticked(&mut self, t: Ticked) {
        if t.missed > 0 {
            self.node.shared.lock().missed_ticks_total += t.missed;
        }
        let mut events = self
            .node
            .after_tick(self.rec, t.tick.decide, t.counters, t.sensed.events);
        events.extend(self.w.token.changed(&self.w.credential));
        for e in events {
            println!("[{:>8.1} s] {e}", t.tick.now_ms as f64 / 1000.0);
        }
    }
}

impl Controller {
    /// Runs the loop on the real clock from `start` (its tick at 0 done)
    /// until a signal stops it; returns why.
    pub async fn run(
        &mut self,
        o: &Options,
        w: &mut Wakeups,
        cadence: Cadence,
        start: Instant,
    ) -> String {
        let mut d = Driver {
            node: &mut self.node,
            rec: &mut self.rec,
            w,
            o,
            start,
        };
        self.ctl.run_realtime(&mut d, cadence, start, None).await
    }
}
