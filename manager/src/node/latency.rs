//! An app's latency as the policy and the API see it, the same for both
//! feedback sources: every latency of the last few monitoring ticks (one
//! histogram per tick, merged), so the figure follows the load within a
//! decision interval and an app that served nothing in that time is idle
//! (no latency: the policy's `idle_slack` applies). A window of the last N
//! requests would instead keep a stopped load's tail for as long as no new
//! request pushes it out.
//!
//! Where the latencies come from: the eBPF request tracer's per-interval
//! histograms of the app's processes ([`from_tracer`]), or a load
//! generator's reports pushed to the API ([`Inbox`]).

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

/// Latencies a load generator reported for one app since the last tick.
#[derive(Debug, Default)]
pub struct Inbox {
    hist: LogHistogram,
    latest_ns: Option<u64>,
    /// Reports accepted since the daemon started.
    pub accepted_total: u64,
}

/// Most latencies one report may carry.
pub const MAX_REPORT: usize = 1_000_000;

/// Largest latency a report may carry, µs: one hour. A request slower than
/// that is a client bug or a unit mistake (ns sent as µs), not a latency a
/// QoS target can be compared with; refusing it keeps every figure exact
/// (the histogram holds values up to about 73 minutes at 0.4 %).
pub const MAX_LATENCY_US: f64 = 3_600_000_000.0;

impl Inbox {
    /// Adds reported latencies (µs, in the order they completed). Rejects
    /// the whole report if any value is negative, not a number, or above
    /// [`MAX_LATENCY_US`].
    pub fn record_us(&mut self, latencies_us: &[f64]) -> Result<usize, String> {
        if latencies_us.len() > MAX_REPORT {
            return Err(format!(
                "{} latencies in one report: at most {MAX_REPORT}",
                latencies_us.len()
            ));
        }
        if let Some((i, v)) = latencies_us
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && (0.0..=MAX_LATENCY_US).contains(*v)))
        {
            return Err(format!(
                "latencies_us[{i}] = {v}: a latency is a number of microseconds \
                 from 0 to {MAX_LATENCY_US:.0} (one hour)"
            ));
        }
        for &v in latencies_us {
            self.hist.record((v * 1e3).round() as u64);
        }
        if let Some(&v) = latencies_us.last() {
            self.latest_ns = Some((v * 1e3).round() as u64);
        }
        self.accepted_total += latencies_us.len() as u64;
        Ok(latencies_us.len())
    }

    /// What arrived since the last call, for [`Recent::push`].
    pub fn take(&mut self) -> (LogHistogram, Option<u64>) {
        (std::mem::take(&mut self.hist), self.latest_ns.take())
    }
}

/// One figure's latencies since the last call, merged over processes,
/// and the latest request's among them (ns).
pub type FigureTick = (LogHistogram, Option<u64>);

/// The tracer's latencies of `pids` since the last call, merged, for both
/// figures: `[latency (from arrival), service (from the first read)]`.
/// One report is taken per pid, so both come from the same requests.
pub fn figures_from_tracer(tracer: &RequestTracer, pids: &[i32]) -> [FigureTick; 2] {
    let mut out: [(Option<LogHistogram>, Option<u64>); 2] = Default::default();
    for &pid in pids {
        let Some(r) = tracer.take_report(pid as u32) else {
            continue;
        };
        let parts = [
            (r.interval.latest_us, r.histogram),
            (r.service_interval.latest_us, r.service_histogram),
        ];
        for ((hist, latest), (l, h)) in out.iter_mut().zip(parts) {
            if let Some(l) = l {
                *latest = Some((l * 1e3).round() as u64);
            }
            match hist.as_mut() {
                None => *hist = Some(h),
                Some(m) => m.merge(&h),
            }
        }
    }
    out.map(|(h, l)| (h.unwrap_or_default(), l))
}

/// The tracer's latencies (`fig`: from arrival or service) of `pids` since
/// the last call, merged, and the latest request's among them.
pub fn from_tracer(tracer: &RequestTracer, pids: &[i32], fig: Figure) -> FigureTick {
    let [latency, service] = figures_from_tracer(tracer, pids);
    match fig {
        Figure::Latency => latency,
        Figure::Service => service,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any report: refused whole (nothing recorded) if a value is out
        /// of [0, one hour] or not a number, else recorded with the exact
        /// mean, and never a figure above the largest value reported.
        #[test]
        fn inbox_takes_a_report_whole_or_not_at_all(
            values in prop::collection::vec(
                prop_oneof![
                    0.0f64..=MAX_LATENCY_US,
                    any::<f64>(),
                    Just(MAX_LATENCY_US),
                    Just(1e16),
                ],
                1..50,
            ),
        ) {
            let mut i = Inbox::default();
            let ok = values.iter().all(|v| (0.0..=MAX_LATENCY_US).contains(v));
            prop_assert_eq!(i.record_us(&values).is_ok(), ok);
            let (h, latest) = i.take();
            if !ok {
                prop_assert!(h.is_empty() && latest.is_none());
                prop_assert_eq!(i.accepted_total, 0);
                return Ok(());
            }
            let ns: Vec<f64> = values.iter().map(|v| (v * 1e3).round()).collect();
            let mean = ns.iter().sum::<f64>() / ns.len() as f64;
            prop_assert!((h.mean().unwrap() - mean).abs() <= 1e-9 * mean.max(1.0));
            let max = ns.iter().cloned().fold(0.0, f64::max);
            prop_assert!(h.percentile(100.0).unwrap() as f64 <= max * (1.0 + 1.0 / 128.0) + 1.0);
        }
    }

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
    fn inbox_validates_and_hands_over() {
        let mut i = Inbox::default();
        assert_eq!(i.record_us(&[100.0, 250.5]).unwrap(), 2);
        let e = i.record_us(&[1.0, -3.0]).unwrap_err();
        assert!(e.contains("latencies_us[1]"), "{e}");
        assert!(i.record_us(&[f64::NAN]).is_err());
        // The reproduction (1e16 µs) and anything above an hour are
        // refused whole; an hour is fine.
        let e = i.record_us(&[5.0, 1e16, 1e16]).unwrap_err();
        assert!(
            e.contains("latencies_us[1]") && e.contains("one hour"),
            "{e}"
        );
        assert!(i.record_us(&[MAX_LATENCY_US + 1.0]).is_err());
        assert!(i.record_us(&[f64::INFINITY]).is_err());
        let (h, latest) = i.take();
        assert_eq!(h.len(), 2);
        assert_eq!(latest, Some(250_500));
        assert_eq!(i.accepted_total, 2);
        assert_eq!(i.record_us(&[MAX_LATENCY_US, MAX_LATENCY_US]).unwrap(), 2);
        let (h, _) = i.take();
        assert_eq!(h.mean(), Some(MAX_LATENCY_US * 1e3));
        let (h, latest) = i.take();
        assert!(h.is_empty() && latest.is_none());
    }
}
