//! What every load engine counts, in one place: totals for the final
//! [`LoadReport`] and the running interval behind each [`IntervalReport`].
//! Latencies are in nanoseconds here and microseconds in the reports.

use qosd_core::LatencySummary;
use qosd_sensors::filed::Ended;
use qosd_sensors::stats::LogHistogram;

use super::{IntervalReport, LoadReport, LoadSpec, Percentiles};

pub(super) struct Tally {
    /// Totals of the run; engines add their error kinds to `r.errors`.
    pub r: LoadReport,
    total: LogHistogram,
    lag: LogHistogram,
    /// Latencies and counts since the last interval report.
    iv: LogHistogram,
    iv_ended: Ended,
    iv_sched: u64,
    iv_sent: u64,
    iv_done: u64,
    iv_err: u64,
}

impl Tally {
    pub fn new(spec: &LoadSpec) -> Self {
        Self {
            r: LoadReport {
                target: spec.target.to_string(),
                protocol: format!("{:?}", spec.protocol).to_lowercase(),
                keepalive: spec.keepalive,
                connections: spec.connections,
                duration_s: spec.duration.as_secs_f64(),
                ..Default::default()
            },
            total: LogHistogram::new(),
            lag: LogHistogram::new(),
            iv: LogHistogram::new(),
            iv_ended: Ended::default(),
            iv_sched: 0,
            iv_sent: 0,
            iv_done: 0,
            iv_err: 0,
        }
    }

    /// A request came due.
    pub fn scheduled(&mut self) {
        self.r.scheduled += 1;
        self.iv_sched += 1;
    }

    /// A request due at `sched_ns` left at `now`.
    pub fn sent(&mut self, sched_ns: u64, now: u64) {
        self.r.sent += 1;
        self.iv_sent += 1;
        self.lag.record(now.saturating_sub(sched_ns));
    }

    /// A reply to the request due at `sched_ns` ended at `now`.
    pub fn completed(&mut self, sched_ns: u64, now: u64) {
        let lat = now.saturating_sub(sched_ns);
        self.total.record(lat);
        self.iv.record(lat);
        self.iv_ended.push(now, lat);
        self.r.completed += 1;
        self.iv_done += 1;
    }

    /// `n` requests failed; the caller counts their kind in `r.errors`.
    pub fn failed(&mut self, n: u64) {
        self.iv_err += n;
    }

    /// Reports the interval ending at `at` (ns; the run started at `start`)
    /// and starts the next one.
    pub fn emit(
        &mut self,
        spec: &LoadSpec,
        start: u64,
        at: u64,
        on_interval: &mut dyn FnMut(&IntervalReport),
    ) {
        let iv_ns = spec.interval.as_nanos() as u64;
        let us = |v: Option<u64>| v.map(|x| x as f64 / 1000.0);
        let t_s = at.saturating_sub(start) as f64 / 1e9;
        let rep = IntervalReport {
            t_s,
            interval_s: iv_ns as f64 / 1e9,
            offered_rps: spec.rate.at(t_s),
            scheduled: self.iv_sched,
            sent: self.iv_sent,
            completed: self.iv_done,
            errors: self.iv_err,
            latency: LatencySummary {
                rps: self.iv.len() as f64 * 1e9 / iv_ns as f64,
                requests: self.iv.len(),
                latest_us: None,
                mean_us: self.iv.mean().map(|m| m / 1000.0),
                p50_us: us(self.iv.percentile(50.0)),
                p95_us: us(self.iv.percentile(95.0)),
                p99_us: us(self.iv.percentile(99.0)),
            },
            histogram: std::mem::take(&mut self.iv),
            ended: std::mem::take(&mut self.iv_ended),
        };
        (self.iv_sched, self.iv_sent, self.iv_done, self.iv_err) = (0, 0, 0, 0);
        on_interval(&rep);
    }

    /// The final report; `unanswered` requests still waiting at the end
    /// count as timeouts.
    pub fn finish(mut self, unanswered: u64) -> LoadReport {
        self.r.errors.timeout += unanswered;
        let dur = self.r.duration_s;
        self.r.offered_rps = self.r.scheduled as f64 / dur;
        self.r.send_rps = self.r.sent as f64 / dur;
        self.r.achieved_rps = self.r.completed as f64 / dur;
        self.r.latency_us = percentiles(&self.total);
        self.r.send_lag_us = percentiles(&self.lag);
        self.r
    }
}

fn percentiles(h: &LogHistogram) -> Percentiles {
    let us = |p: f64| h.percentile(p).map(|v| v as f64 / 1000.0);
    Percentiles {
        mean: h.mean().map(|m| m / 1000.0),
        p50: us(50.0),
        p90: us(90.0),
        p95: us(95.0),
        p99: us(99.0),
        p999: us(99.9),
        max: us(100.0),
    }
}
