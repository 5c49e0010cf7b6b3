//! An app's latency as the policy and the API see it, the same for both
//! feedback sources: every latency of the last few monitoring ticks (one
//! histogram per tick, merged), so the figure follows the load within a
//! decision interval and an app that served nothing in that time is idle
//! (no latency: the policy's `idle_slack` applies). A window of the last N
//! requests would instead keep a stopped load's tail for as long as no new
//! request pushes it out.
//!
//! Where the latencies come from is the sensors' business
//! ([`qosd_sensors::sensor`]); [`crate::node::sensing`] feeds them in.

use std::collections::VecDeque;

use qosd_core::LatencySummary;
use qosd_sensors::ebpf::{Figure, RequestTracer};
use qosd_sensors::stats::LogHistogram;

/// Latencies of the last `nr_slots` ticks, ns.
#[derive(Debug)]
pub struct Recent {
    slots: VecDeque<(LogHistogram, f64)>,
    nr_slots: usize,
    merged: LogHistogram,
    latest_ns: Option<u64>,
    requests_total: u64,
    latency_sum_s: f64,
}

impl Recent {
    /// Keeps `nr_slots` ticks (at least one).
    pub fn new(nr_slots: usize) -> Self {
        Recent {
            slots: VecDeque::with_capacity(nr_slots.max(1)),
            nr_slots: nr_slots.max(1),
            merged: LogHistogram::new(),
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
        let mut changed = !hist.is_empty();
        if self.slots.len() == self.nr_slots {
            changed |= self.slots.pop_front().is_some_and(|(h, _)| !h.is_empty());
        }
        self.slots.push_back((hist, dur_s.max(0.0)));
        // A few thousand counters per slot: cheaper than keeping every
        // request's latency to subtract when a slot leaves. An idle app's
        // ticks change nothing.
        if changed {
            self.merged.clear();
            for (h, _) in &self.slots {
                self.merged.merge(h);
            }
        }
    }

    /// Forgets the kept ticks (not the totals): after a plan is applied,
    /// the figures cover only what was measured under it.
    pub fn restart(&mut self) {
        self.slots.clear();
        self.merged.clear();
    }

    /// Requests in the kept ticks.
    pub fn requests(&self) -> u64 {
        self.merged.len()
    }

    /// Seconds the kept ticks cover.
    pub fn span_s(&self) -> f64 {
        self.slots.iter().map(|(_, d)| d).sum()
    }

    /// Requests per second over the kept ticks.
    pub fn rps(&self) -> f64 {
        let span = self.span_s();
        if span > 0.0 {
            self.requests() as f64 / span
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
}
