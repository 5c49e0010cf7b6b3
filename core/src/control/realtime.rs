//! The loop on the real clock, once for the daemon and the real replay:
//! ticks on the monitoring grid `start + k · monitor_ms` (a late tick
//! skips grid points, never bunches them, and decision ticks stay every
//! `interval_ms / monitor_ms`-th grid point whatever was skipped). What
//! wakes a driver between ticks (signals, a changed config file) and what
//! it does after each tick (publish, log) is its own: [`RealTime`].

use std::future::Future;
use std::time::{Duration, Instant};

use super::{Cadence, ControlLoop, DecisionEntry, LoopCounters, Node, Recorder, Sensed, Tick};
use crate::policy::Policy;

/// What ended a driver's wait between two ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// The next tick is due.
    Due,
    /// The driver handled something else (a config reload): the loop
    /// waits again for the same tick.
    Again,
    /// Stop the loop, for this reason ("SIGTERM", "the run is over").
    Stop(String),
}

/// One tick as the driver sees it afterwards.
#[derive(Debug)]
pub struct Ticked {
    pub tick: Tick,
    pub sensed: Sensed,
    pub decision: Option<DecisionEntry>,
    /// Grid points skipped before this tick (the previous one was late).
    pub missed: u64,
    pub counters: LoopCounters,
}

/// A driver of [`ControlLoop::run_realtime`]: the node and the recorder
/// it lends to each tick, how it waits, and what it does after a tick.
pub trait RealTime {
    /// The node and the recorder of the next tick.
    fn parts(&mut self) -> (&mut dyn Node, &mut dyn Recorder);

    /// Waits until `due`, unless something else needs the driver first
    /// (then [`Wake::Again`] or [`Wake::Stop`]).
    fn wait(&mut self, due: Instant) -> impl Future<Output = Wake>;

    /// After each tick (events to log, state to publish). Nothing by
    /// default.
    fn ticked(&mut self, t: Ticked) {
        let _ = t;
    }
}

/// The monitoring grid of the real clock: which grid point a tick falls
/// on, whether it decides, and how long since the previous tick.
#[derive(Debug, Clone, Copy)]
pub struct Grid {
    start: Instant,
    period: Duration,
    cadence: Cadence,
    /// The grid point of the last tick (0: the start) and when it ran.
    last: (u64, Instant),
}

impl Grid {
    /// The grid from `start`, whose point 0 counts as ticked.
    pub fn new(start: Instant, cadence: Cadence) -> Grid {
        Grid {
            start,
            period: Duration::from_millis(cadence.monitor_ms.max(1)),
            cadence,
            last: (0, start),
        }
    }

    /// The grid point after the last tick: when the next tick is due.
    pub fn due(&self) -> Instant {
        self.start + self.period * (self.last.0 + 1) as u32
    }

    /// The grid point of the last tick.
    pub fn index(&self) -> u64 {
        self.last.0
    }

    /// The tick that runs at `now` (at or after [`Self::due`]) and the
    /// grid points skipped since the last one.
    pub fn tick_at(&mut self, now: Instant) -> (Tick, u64) {
        let per = self.cadence.ticks_per_decision();
        let elapsed = now.saturating_duration_since(self.start);
        let idx = ((elapsed.as_nanos() / self.period.as_nanos()) as u64).max(self.last.0 + 1);
        let tick = Tick {
            now_ms: idx * self.cadence.monitor_ms,
            dt_s: now.saturating_duration_since(self.last.1).as_secs_f64(),
            decide: idx / per > self.last.0 / per,
        };
        let missed = idx - self.last.0 - 1;
        self.last = (idx, now);
        (tick, missed)
    }
}

impl<P: Policy> ControlLoop<P> {
    /// Runs on the real clock from `start` (whose own tick, if any, the
    /// caller has run) until the driver says stop or, with `end`, the grid
    /// reaches point `end`; returns why it stopped.
    pub async fn run_realtime(
        &mut self,
        driver: &mut impl RealTime,
        cadence: Cadence,
        start: Instant,
        end: Option<u64>,
    ) -> String {
        let mut grid = Grid::new(start, cadence);
        loop {
            if end.is_some_and(|e| grid.index() >= e) {
                return "the run is over".into();
            }
            match driver.wait(grid.due()).await {
                Wake::Due => {}
                Wake::Again => continue,
                Wake::Stop(why) => return why,
            }
            let (tick, missed) = grid.tick_at(Instant::now());
            let (node, rec) = driver.parts();
            let (sensed, decision) = self.tick(node, rec, tick);
            driver.ticked(Ticked {
                tick,
                sensed,
                decision,
                missed,
                counters: self.counters,
            });
        }
    }
}

#[cfg(test)]
mod tests;
