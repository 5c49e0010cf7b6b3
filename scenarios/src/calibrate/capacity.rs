//! A capacity that repeats. Read as the best rate of a step that "kept
//! up", capacity flipped between steps of the sweep's grid (1031 or 1092
//! rps for one server): the load generator's drain lets a step past
//! capacity still answer its whole offered rate, and whether its p99 passed
//! the "kept up" bar decided which. Here capacity is what the server
//! completes per second while it has a backlog: in an interval that starts
//! and ends with requests waiting, it is never idle, so its completion rate
//! there is its service rate, whatever was offered. Every interval of every
//! step that fell behind (the saturating one, the refine steps above the
//! knee, its drain) is one sample; their median is the capacity and their
//! quartiles its uncertainty.

use serde::{Deserialize, Serialize};

/// Requests waiting (scheduled, not yet answered) beyond which the server
/// is taken to have a backlog: several times the connections' requests in
/// flight, which an open-loop generator below capacity rarely queues (at
/// 80 % load of a 1 ms server, 20 queued is a 1 % event).
pub const BACKLOG_MIN: u64 = 20;

/// Fewer busy intervals than this and capacity is read off the steps as
/// before (a sweep that stopped on errors, a server that never fell
/// behind within the sweep's range).
pub const MIN_BUSY_INTERVALS: usize = 5;

/// Completion rates of the intervals a step's server was busy throughout.
#[derive(Debug, Clone, Default)]
pub struct BusyRates {
    waiting: u64,
    /// Intervals in which requests were due (the step itself, not its
    /// drain), busy or not.
    nr_intervals: usize,
    /// Completions per second of each busy interval.
    pub rates: Vec<f64>,
}

impl BusyRates {
    /// One interval of a step: requests scheduled in it, answered (or
    /// failed) in it, and its length. An interval counts when requests
    /// were waiting at its start and still at its end.
    pub fn interval(&mut self, scheduled: u64, done: u64, completed: u64, secs: f64) {
        let before = self.waiting;
        self.nr_intervals += usize::from(scheduled > 0);
        self.waiting = (self.waiting + scheduled).saturating_sub(done);
        if before > BACKLOG_MIN && self.waiting > BACKLOG_MIN && secs > 0.0 {
            self.rates.push(completed as f64 / secs);
        }
    }

    /// Whether the server had a backlog throughout more intervals than half
    /// the step's: it was offered more than it serves. A sweep stops there
    /// whatever the step's p99 (a p99 under 50 × a lucky light step's let
    /// the sweep run on to 1.5 × capacity, and its refine steps, all past
    /// capacity, added their backlogs' pauses: ~6 s).
    pub fn mostly_busy(&self) -> bool {
        2 * self.rates.len() > self.nr_intervals
    }
}

/// Capacity from the busy intervals of a sweep, with its spread.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CapacityFit {
    /// Median completion rate over the busy intervals, rps.
    pub rps: f64,
    /// Their lower and upper quartiles, rps.
    pub q1_rps: f64,
    pub q3_rps: f64,
    pub nr_intervals: usize,
}

impl CapacityFit {
    /// `None` with fewer than [`MIN_BUSY_INTERVALS`] rates.
    pub fn of(rates: &[f64]) -> Option<CapacityFit> {
        let n = rates.iter().filter(|r| r.is_finite()).count();
        if n < MIN_BUSY_INTERVALS {
            return None;
        }
        let q = |p: f64| qosd_core::measure::quantile(rates, p).unwrap_or(f64::NAN);
        Some(CapacityFit {
            rps: q(0.5),
            q1_rps: q(0.25),
            q3_rps: q(0.75),
            nr_intervals: n,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step at `offered` rps against a server of `cap` rps, in 100 ms
    /// intervals for `secs` then a drain: what the load generator reports.
    fn step(offered: f64, cap: f64, secs: f64, rates: &mut BusyRates) {
        let mut queue = 0.0;
        let n = (secs / 0.1) as usize;
        for i in 0..n + 20 {
            let arrive = if i < n { offered * 0.1 } else { 0.0 };
            let done = (queue + arrive).min(cap * 0.1);
            queue += arrive - done;
            rates.interval(arrive as u64, done as u64, done as u64, 0.1);
        }
    }

    #[test]
    fn a_step_below_capacity_gives_no_sample() {
        let mut r = BusyRates::default();
        step(754.0, 1000.0, 2.0, &mut r);
        assert!(r.rates.is_empty());
        assert!(!r.mostly_busy());
    }

    #[test]
    fn a_step_past_capacity_is_mostly_busy() {
        // The demo's saturating step (1031 against ~960 rps).
        let mut r = BusyRates::default();
        step(1031.0, 960.0, 2.0, &mut r);
        assert!(r.mostly_busy(), "{r:?}");
        // A 500 ms stall at half load: a backlog, but for a few intervals.
        let mut r = BusyRates::default();
        for i in 0..40 {
            let (arrive, done) = match i {
                0..=4 => (50, 0),
                5..=9 => (50, 100),
                _ => (50, 50),
            };
            r.interval(arrive, done, done, 0.1);
        }
        assert!(!r.rates.is_empty() && !r.mostly_busy(), "{r:?}");
    }

    #[test]
    fn steps_past_capacity_give_the_service_rate_whatever_was_offered() {
        for offered in [1031.0, 1092.0, 1400.0] {
            let mut r = BusyRates::default();
            step(offered, 1000.0, 2.0, &mut r);
            let c = CapacityFit::of(&r.rates).unwrap();
            assert!((c.rps - 1000.0).abs() < 1.0, "{offered}: {c:?}");
        }
        assert!(CapacityFit::of(&[1000.0; 4]).is_none());
    }
}
