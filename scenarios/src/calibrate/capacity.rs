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
    /// Completions per second of each busy interval.
    pub rates: Vec<f64>,
}

impl BusyRates {
    /// One interval of a step: requests scheduled in it, answered (or
    /// failed) in it, and its length. An interval counts when requests
    /// were waiting at its start and still at its end.
    pub fn interval(&mut self, scheduled: u64, done: u64, completed: u64, secs: f64) {
        let before = self.waiting;
        self.waiting = (self.waiting + scheduled).saturating_sub(done);
        if before > BACKLOG_MIN && self.waiting > BACKLOG_MIN && secs > 0.0 {
            self.rates.push(completed as f64 / secs);
        }
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
