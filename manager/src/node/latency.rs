//! An app's latency as the policy and the API see it, the same for both
//! feedback sources: every latency of the last few monitoring ticks (one
//! histogram per tick, merged), so the figure follows the load within a
//! decision interval and an app that served nothing in that time is idle
//! (no latency: the policy's `idle_slack` applies). A window of the last N
//! requests would instead keep a stopped load's tail for as long as no new
//! request pushes it out.
//!
//! A low-rate app's few ticks hold too few requests for its percentile (a
//! p99 of 20 requests is their largest): the policy's windows widen, tick
//! by tick over what was measured since the last plan, until they hold
//! enough or reach their bound ([`Recent::widening`]).
//!
//! Where the latencies come from is the sensors' business
//! ([`qosd_sensors::sensor`]); [`crate::node::sensing`] feeds them in.

use std::collections::VecDeque;

use qosd_core::LatencySummary;
use qosd_sensors::ebpf::{Figure, RequestTracer};
use qosd_sensors::stats::LogHistogram;

/// Latencies of the last `nr_slots` ticks, ns; a widening window
/// ([`Recent::widening`]) reaches further back, tick by tick, until its
/// figure rests on enough requests.
#[derive(Debug)]
pub struct Recent {
    /// The ticks kept, oldest first: at most `max_slots`.
    slots: VecDeque<(LogHistogram, f64)>,
    /// The plain window: the last `nr_slots` ticks.
    nr_slots: usize,
    /// Requests the percentile should rest on (0: never widen).
    min_samples: u64,
    /// The widest window, ticks (>= `nr_slots`).
    max_slots: usize,
    /// The ticks behind the figures (the last `nr_used`), merged.
    merged: LogHistogram,
    nr_used: usize,
    latest_ns: Option<u64>,
    requests_total: u64,
    latency_sum_s: f64,
}

impl Recent {
    /// Keeps `nr_slots` ticks (at least one).
    pub fn new(nr_slots: usize) -> Self {
        Self::widening(nr_slots, 0, nr_slots)
    }

    /// A window of `nr_slots` ticks that, while it holds fewer than
    /// `min_samples` requests, takes in older ticks (measured since the
    /// last restart) until it does or it spans `max_slots` ticks. An app
    /// that served nothing in the plain window stays idle: widening never
    /// brings a stopped load's tail back.
    pub fn widening(nr_slots: usize, min_samples: u64, max_slots: usize) -> Self {
        let nr_slots = nr_slots.max(1);
        let max_slots = max_slots.max(nr_slots);
        Recent {
            slots: VecDeque::with_capacity(max_slots),
            nr_slots,
            min_samples,
            max_slots,
            merged: LogHistogram::new(),
            nr_used: 0,
            latest_ns: None,
            requests_total: 0,
            latency_sum_s: 0.0,
        }
    }

    /// One tick: the latencies it saw (ns), how long it lasted (s) and the
    /// latency of its last request.
    pub fn push(&mut self, hist: LogHistogram, dur_s: f64, latest_ns: Option<u64>) {
        self.requests_total += hist.len();
        if let Some(m) = hist.mean() {
            self.latency_sum_s += m * hist.len() as f64 / 1e9;
        }
        if latest_ns.is_some() {
            self.latest_ns = latest_ns;
        }
        let mut changed = !hist.is_empty() || !self.merged.is_empty();
        if self.slots.len() == self.max_slots {
            changed |= self.slots.pop_front().is_some_and(|(h, _)| !h.is_empty());
        }
        self.slots.push_back((hist, dur_s.max(0.0)));
        let nr_used = self.ticks_needed();
        changed |= nr_used != self.nr_used;
        self.nr_used = nr_used;
        // A few thousand counters per slot: cheaper than keeping every
        // request's latency to subtract when a slot leaves. An idle app's
        // ticks change nothing.
        if changed {
            self.merged.clear();
            let skip = self.slots.len() - self.nr_used;
            for (h, _) in self.slots.iter().skip(skip) {
                self.merged.merge(h);
            }
        }
    }

    /// How many of the newest ticks the figures rest on: the plain window,
    /// widened over the ticks since the restart while it holds fewer than
    /// `min_samples` requests (never for an idle plain window).
    fn ticks_needed(&self) -> usize {
        // The kept ticks are all since the last restart: the window never
        // reaches back across a plan.
        let plain = self.nr_slots.min(self.slots.len());
        let count =
            |k: usize| -> u64 { self.slots.iter().rev().take(k).map(|(h, _)| h.len()).sum() };
        let mut k = plain;
        let mut n = count(k);
        if n == 0 {
            return k;
        }
        while n < self.min_samples && k < self.slots.len() {
            k += 1;
            n += self.slots[self.slots.len() - k].0.len();
        }
        k
    }

    /// The ticks behind the figures, newest last.
    fn used(&self) -> impl Iterator<Item = &(LogHistogram, f64)> {
        self.slots.iter().skip(self.slots.len() - self.nr_used)
    }

    /// Forgets the kept ticks (not the totals): after a plan is applied,
    /// the figures cover only what was measured under it.
    pub fn restart(&mut self) {
        self.slots.clear();
        self.nr_used = 0;
        self.merged.clear();
    }

    /// Requests behind the percentile (the widened window's).
    pub fn requests(&self) -> u64 {
        self.merged.len()
    }

    /// Seconds the ticks behind the figures cover.
    pub fn span_s(&self) -> f64 {
        self.used().map(|(_, d)| d).sum()
    }

    /// Ticks behind the figures (more than the plain window: widened).
    pub fn nr_ticks(&self) -> usize {
        self.nr_used
    }

    /// Requests per second over the plain window (a widened one would
    /// lag a change of load by its width).
    pub fn rps(&self) -> f64 {
        let k = self.nr_slots.min(self.slots.len());
        let (n, span) = self
            .slots
            .iter()
            .rev()
            .take(k)
            .fold((0u64, 0.0), |(n, s), (h, d)| (n + h.len(), s + d));
        if span > 0.0 {
            n as f64 / span
        } else {
            0.0
        }
    }

    /// Latency percentile `p` (0..=100) over the kept ticks, µs.
    pub fn percentile_us(&self, p: f64) -> Option<f64> {
        self.merged.percentile(p).map(|v| v as f64 / 1e3)
    }

    /// Mean latency over the kept ticks, µs.
    pub fn mean_us(&self) -> Option<f64> {
        self.merged.mean().map(|m| m / 1e3)
    }

    /// Latency of the most recent request ever seen, µs.
    pub fn latest_us(&self) -> Option<f64> {
        self.latest_ns.map(|v| v as f64 / 1e3)
    }

    /// Requests counted since the daemon started.
    pub fn requests_total(&self) -> u64 {
        self.requests_total
    }

    /// Sum of every latency counted since the daemon started, seconds.
    pub fn latency_sum_s(&self) -> f64 {
        self.latency_sum_s
    }

    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            rps: self.rps(),
            requests: self.requests(),
            latest_us: self.latest_us(),
            mean_us: self.mean_us(),
            p50_us: self.percentile_us(50.0),
            p95_us: self.percentile_us(95.0),
            p99_us: self.percentile_us(99.0),
        }
    }
}

/// The tracer's latencies (`fig`: from arrival or service) of `pids` since
/// the last call, merged, and the latest request's among them (ns).
pub fn from_tracer(
    tracer: &RequestTracer,
    pids: &[i32],
    fig: Figure,
) -> (LogHistogram, Option<u64>) {
    let [latency, service] = qosd_sensors::sensor::ebpf::figures(tracer, pids);
    let t = match fig {
        Figure::Latency => latency,
        Figure::Service => service,
    };
    (t.hist, t.latest_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(values_us: &[u64]) -> LogHistogram {
        let mut h = LogHistogram::new();
        for v in values_us {
            h.record(v * 1000);
        }
        h
    }

    #[test]
    fn keeps_only_the_last_ticks() {
        let mut r = Recent::new(3);
        r.push(hist(&[10_000; 100]), 0.1, Some(10_000_000));
        assert_eq!(r.requests(), 100);
        assert!((r.rps() - 1000.0).abs() < 1e-6);
        let p99 = r.percentile_us(99.0).unwrap();
        assert!((p99 - 10_000.0).abs() < 50.0, "{p99}");
        // Three quiet ticks push the slow one out: idle, no latency.
        for _ in 0..3 {
            r.push(LogHistogram::new(), 0.1, None);
        }
        assert_eq!(r.requests(), 0);
        assert_eq!(r.percentile_us(99.0), None);
        assert_eq!(r.rps(), 0.0);
        // The totals and the latest request stay.
        assert_eq!(r.requests_total(), 100);
        assert!((r.latency_sum_s() - 1.0).abs() < 0.01);
        assert_eq!(r.latest_us(), Some(10_000.0));
    }

    #[test]
    fn merges_ticks_for_percentiles() {
        let mut r = Recent::new(5);
        r.push(hist(&[100; 98]), 0.1, None);
        r.push(hist(&[5000, 5000]), 0.1, Some(5_000_000));
        let s = r.summary();
        assert_eq!(s.requests, 100);
        assert!((s.p50_us.unwrap() - 100.0).abs() < 1.0);
        assert!((s.p99_us.unwrap() - 5000.0).abs() < 25.0);
        assert!((s.rps - 500.0).abs() < 1e-6);
        assert_eq!(s.latest_us, Some(5000.0));
    }

    #[test]
    fn a_low_rate_window_widens_until_it_holds_enough_and_no_further() {
        // 5 ticks a window, 100 requests wanted, 20 ticks at most.
        let mut r = Recent::widening(5, 100, 20);
        // 4 requests a tick: 25 ticks would hold 100, the bound stops at 20.
        for k in 0..30 {
            r.push(hist(&[100; 4]), 0.1, None);
            assert_eq!(r.nr_ticks(), (k + 1).min(20), "tick {k}");
        }
        assert_eq!(r.requests(), 80);
        assert!((r.span_s() - 2.0).abs() < 1e-9);
        // The rate is the plain window's: 4 per 0.1 s.
        assert!((r.rps() - 40.0).abs() < 1e-6);
        // 25 a tick: four ticks hold 100, but the window is never
        // narrower than the plain one.
        for _ in 0..20 {
            r.push(hist(&[100; 25]), 0.1, None);
        }
        assert_eq!((r.nr_ticks(), r.requests()), (5, 125));
        // One slow request among 19 fast ones decides a plain p99; in the
        // widened window it is one of 100, the p99 is the fast ones'.
        let mut plain = Recent::new(5);
        let mut wide = Recent::widening(5, 100, 40);
        for k in 0..30 {
            let h = if k == 29 {
                hist(&[5000])
            } else {
                hist(&[100; 4])
            };
            plain.push(h.clone(), 0.1, None);
            wide.push(h, 0.1, None);
        }
        assert!(plain.percentile_us(99.0).unwrap() > 4000.0);
        assert!(wide.percentile_us(99.0).unwrap() < 200.0);
        assert_eq!(wide.requests(), 101);
    }

    #[test]
    fn widening_stops_at_a_restart_and_at_an_idle_plain_window() {
        let mut r = Recent::widening(2, 100, 10);
        for _ in 0..10 {
            r.push(hist(&[100; 5]), 0.1, None);
        }
        assert_eq!(r.nr_ticks(), 10);
        // After a plan: only what was measured under it.
        r.restart();
        r.push(hist(&[200; 5]), 0.1, None);
        assert_eq!((r.nr_ticks(), r.requests()), (1, 5));
        r.push(hist(&[200; 5]), 0.1, None);
        r.push(hist(&[200; 5]), 0.1, None);
        assert_eq!((r.nr_ticks(), r.requests()), (3, 15));
        // The load stops: two quiet ticks make it idle, not a widened tail.
        r.push(LogHistogram::new(), 0.1, None);
        r.push(LogHistogram::new(), 0.1, None);
        assert_eq!((r.requests(), r.percentile_us(99.0)), (0, None));
        assert_eq!(r.rps(), 0.0);
    }
}
