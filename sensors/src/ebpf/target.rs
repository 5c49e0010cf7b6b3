//! Per-target statistics: each record kind's windows and histograms, and
//! the reports taken from them (the `auto` choice between boundary modes
//! is in `auto.rs`).
//!
//! The kernel sends TURN, CONN and (with the gRPC uprobes) GRPC records side
//! by side (for `auto`); each kind has its own window, interval and total,
//! so whichever mode is chosen covers every request since tracing began,
//! and a late decision loses nothing.

use qosd_core::LatencySummary;
use serde::Serialize;

use super::agg::Delta;
use super::Mode;
use crate::filed::Ended;
use crate::stats::{bucket_of, bucket_value, LogHistogram, Window};

/// Which of a request's two durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Figure {
    /// Arrival in the server's socket -> last reply bytes: what the node
    /// adds to what a client sees, waiting for the CPU included (the
    /// policies' default). Equal to `Service` on the syscall path.
    #[default]
    Latency,
    /// The server's first read -> last reply bytes.
    Service,
}

impl Figure {
    pub fn as_str(self) -> &'static str {
        match self {
            Figure::Latency => "latency",
            Figure::Service => "service",
        }
    }
}

/// One duration of one record kind: its window and histograms.
#[derive(Debug)]
pub(crate) struct Figures {
    pub window: Window,
    pub interval: LogHistogram,
    pub total: LogHistogram,
    pub interval_latest: Option<u64>,
    /// The interval's requests with their end instants (to file them by).
    pub ended: Ended,
}

impl Figures {
    fn new(window: usize) -> Self {
        Self {
            window: Window::new(window),
            interval: LogHistogram::new(),
            total: LogHistogram::new(),
            interval_latest: None,
            ended: Ended::default(),
        }
    }

    #[inline]
    fn record(&mut self, end_ns: u64, ns: u64) {
        self.window.push(end_ns, ns);
        self.interval.record(ns);
        self.total.record(ns);
        self.interval_latest = Some(ns);
        self.ended.push(end_ns, ns);
    }

    /// Requests counted in the kernel (bpf/agg.h): each as its bucket's
    /// midpoint, the latest one exact and last, all ending at `end_ns`.
    fn record_buckets(&mut self, end_ns: u64, d: &Delta) {
        let latest_at = d.latest.map(bucket_of);
        let mut held = None;
        for &(b, n) in d.buckets.iter() {
            let mut n = n;
            if held.is_none() && latest_at == Some(b) {
                n -= 1;
                held = d.latest;
            }
            let v = bucket_value(b);
            for _ in 0..n {
                self.record(end_ns, v);
            }
        }
        if let Some(v) = held {
            self.record(end_ns, v);
        }
    }

    fn clear_interval(&mut self) {
        self.interval.clear();
        self.interval_latest = None;
        self.ended.clear();
    }
}

/// The latencies of a turn's `nreq` requests (arrival in the socket -> the
/// turn's last reply bytes), in order. The first arrived with the turn
/// (`arrive_ns`); the later ones came while it waited in the socket, by
/// the first read (`start_ns`): an open-loop client's requests queue on a
/// connection one by one while the server is busy. Their arrivals are
/// taken at the middle of that wait (W = start − arrive): each is timed
/// L − W/2, where timing every one as the whole turn (L) would put the
/// first request's wait on all of them, the tail a stall makes counted
/// `nreq` times (replay_real saw eBPF p99s above the client's). A batch
/// sent in one write (arrivals together, W ≈ 0) stays exact. bpf/agg.h
/// aggregates the same two figures in the kernel.
pub fn turn_latencies(
    arrive_ns: u64,
    start_ns: u64,
    end_ns: u64,
    nreq: u16,
) -> impl Iterator<Item = u64> {
    let arrive = arrive_ns.min(start_ns);
    let latency = end_ns.saturating_sub(arrive);
    let later = latency.saturating_sub((start_ns - arrive) / 2);
    (0..nreq).map(move |i| if i == 0 { latency } else { later })
}

/// Figures of one record kind.
#[derive(Debug)]
pub(crate) struct KindStats {
    pub lat: Figures,
    pub svc: Figures,
    pub interval_count: u64,
    pub total_count: u64,
}

impl KindStats {
    fn new(window: usize) -> Self {
        Self {
            lat: Figures::new(window),
            svc: Figures::new(window),
            interval_count: 0,
            total_count: 0,
        }
    }

    #[inline]
    pub fn record(&mut self, end_ns: u64, latency_ns: u64, service_ns: u64) {
        self.lat.record(end_ns, latency_ns);
        self.svc.record(end_ns, service_ns);
        self.interval_count += 1;
        self.total_count += 1;
    }

    /// A TURN record's `nreq` requests, read together (pipelined) and
    /// answered by the turn's replies: see [`turn_latencies`].
    pub fn record_turn(&mut self, arrive_ns: u64, start_ns: u64, end_ns: u64, nreq: u16) {
        let service = end_ns.saturating_sub(start_ns);
        for latency in turn_latencies(arrive_ns, start_ns, end_ns, nreq) {
            self.record(end_ns, latency, service);
        }
    }

    /// One figure's requests counted in the kernel; the latency figure
    /// carries the count.
    fn add_aggregated(&mut self, service: bool, end_ns: u64, d: &Delta) {
        if service {
            self.svc.record_buckets(end_ns, d);
        } else {
            self.lat.record_buckets(end_ns, d);
            self.interval_count += d.count();
            self.total_count += d.count();
        }
    }

    pub fn fig(&self, f: Figure) -> &Figures {
        match f {
            Figure::Latency => &self.lat,
            Figure::Service => &self.svc,
        }
    }
}

#[derive(Debug)]
pub(crate) struct TargetStats {
    pub requested: Mode,
    pub turn: KindStats,
    pub conn: KindStats,
    pub grpc: KindStats,
    /// TURN records that were the first turn of their connection: the
    /// number of connections seen through turns.
    pub first_turns: u64,
    /// Connections that opened with the HTTP/2 preface (H2 records).
    pub h2_conns: u64,
    /// The gRPC library probed for this target, if any.
    pub probes: Option<String>,
    /// Why gRPC calls cannot be traced here, and what is done instead.
    pub warning: Option<String>,
    pub exited: bool,
    /// The target's port filter (empty: all its listening ports).
    pub ports: Vec<u16>,
    pub started_ns: u64,
    pub interval_start_ns: u64,
}

impl TargetStats {
    pub fn new(requested: Mode, window: usize, now_ns: u64) -> Self {
        Self {
            requested,
            turn: KindStats::new(window),
            conn: KindStats::new(window),
            grpc: KindStats::new(window),
            first_turns: 0,
            h2_conns: 0,
            probes: None,
            warning: None,
            exited: false,
            ports: Vec::new(),
            started_ns: now_ns,
            interval_start_ns: now_ns,
        }
    }

    /// What the kernel counted for one record kind and figure since the
    /// last read (kernel aggregation).
    pub fn add_aggregated(&mut self, kind: u8, service: bool, end_ns: u64, d: &Delta) {
        let k = match kind {
            super::abi::REC_TURN => {
                if !service {
                    self.first_turns += d.first_turns;
                }
                &mut self.turn
            }
            super::abi::REC_CONN => &mut self.conn,
            _ => return,
        };
        k.add_aggregated(service, end_ns, d);
    }

    /// The statistics of the mode in use (turns while undecided).
    pub fn chosen(&self) -> &KindStats {
        self.kind(self.effective_mode())
    }

    fn kind(&self, mode: Mode) -> &KindStats {
        pick(mode, &self.turn, &self.conn, &self.grpc)
    }

    fn kind_mut(&mut self, mode: Mode) -> &mut KindStats {
        pick(mode, &mut self.turn, &mut self.conn, &mut self.grpc)
    }

    /// Connections seen accepted (or used, for ones open before tracing).
    pub fn connections(&self) -> u64 {
        self.first_turns
            .max(self.conn.total_count)
            .max(self.h2_conns)
    }

    pub fn window_summary(&self, now_ns: u64, f: Figure) -> LatencySummary {
        let w = &self.chosen().fig(f).window;
        let us = |v: u64| v as f64 / 1e3;
        LatencySummary {
            rps: w.rps(now_ns),
            requests: w.len() as u64,
            latest_us: w.latest().map(us),
            mean_us: w.mean().map(|m| m / 1e3),
            p50_us: w.percentile(50.0).map(us),
            p95_us: w.percentile(95.0).map(us),
            p99_us: w.percentile(99.0).map(us),
        }
    }

    pub fn take_report(&mut self) -> TargetReport {
        let now = qosd_core::clock::monotonic_ns();
        let mode = self.effective_mode();
        let secs = (now.saturating_sub(self.interval_start_ns)) as f64 / 1e9;
        let total_secs = (now.saturating_sub(self.started_ns)) as f64 / 1e9;
        tracing::debug!(
            %mode,
            turns = self.turn.total_count,
            first_turns = self.first_turns,
            conns = self.conn.total_count,
            h2_conns = self.h2_conns,
            grpc_calls = self.grpc.total_count,
            "boundary evidence"
        );
        let k = self.kind(mode);
        let rep =
            |f: &Figures, n, secs, latest| KindReport::from_hist(&f.interval, n, secs, latest);
        let tot = |f: &Figures| {
            KindReport::from_hist(&f.total, k.total_count, total_secs, f.window.latest())
        };
        let mut report = TargetReport {
            mode,
            interval: rep(&k.lat, k.interval_count, secs, k.lat.interval_latest),
            total: tot(&k.lat),
            service_interval: rep(&k.svc, k.interval_count, secs, k.svc.interval_latest),
            service_total: tot(&k.svc),
            histogram: LogHistogram::default(),
            service_histogram: LogHistogram::default(),
            ended: Ended::default(),
            service_ended: Ended::default(),
            connections: self.connections(),
            exited: self.exited,
            probes: self.probes.clone(),
            warning: self.warning.clone(),
        };
        // The interval's durations go to the caller whole (the daemon merges
        // them over its own time horizon and across a process group).
        let k = self.kind_mut(mode);
        report.histogram = std::mem::take(&mut k.lat.interval);
        report.service_histogram = std::mem::take(&mut k.svc.interval);
        report.ended = std::mem::take(&mut k.lat.ended);
        report.service_ended = std::mem::take(&mut k.svc.ended);
        for k in [&mut self.turn, &mut self.conn, &mut self.grpc] {
            k.lat.clear_interval();
            k.svc.clear_interval();
            k.interval_count = 0;
        }
        self.interval_start_ns = now;
        report
    }
}

/// Of the stats of each record kind (turn, conn, grpc), the one that serves
/// `mode` (turns while undecided): the one place modes map to record kinds,
/// for shared and mutable borrows alike.
fn pick<T>(mode: Mode, turn: T, conn: T, grpc: T) -> T {
    match mode {
        Mode::Connection => conn,
        Mode::Grpc => grpc,
        Mode::Auto | Mode::Turn => turn,
    }
}

/// Figures over a span of time (an interval or the whole trace).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KindReport {
    pub requests: u64,
    pub rps: f64,
    pub latest_us: Option<f64>,
    pub mean_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p95_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub max_us: Option<f64>,
}

impl KindReport {
    fn from_hist(h: &LogHistogram, count: u64, secs: f64, latest: Option<u64>) -> Self {
        let us = |v: u64| v as f64 / 1e3;
        Self {
            requests: count,
            rps: if secs > 0.0 { count as f64 / secs } else { 0.0 },
            latest_us: latest.map(us),
            mean_us: h.mean().map(|m| m / 1e3),
            p50_us: h.percentile(50.0).map(us),
            p95_us: h.percentile(95.0).map(us),
            p99_us: h.percentile(99.0).map(us),
            max_us: h.percentile(100.0).map(us),
        }
    }
}

/// What [`super::RequestTracer::take_report`] returns. `interval`,
/// `total` and `histogram` are latencies (from arrival); the `service_*`
/// ones the same requests from the server's first read.
#[derive(Debug, Clone)]
pub struct TargetReport {
    pub mode: Mode,
    pub interval: KindReport,
    pub total: KindReport,
    pub service_interval: KindReport,
    pub service_total: KindReport,
    /// Every latency of the interval, ns (of the mode in use).
    pub histogram: LogHistogram,
    /// Every service time of the interval, ns.
    pub service_histogram: LogHistogram,
    /// The interval's requests with the instant each ended (its last
    /// reply bytes, CLOCK_MONOTONIC) and latency: [`crate::filed`].
    pub ended: Ended,
    /// The same with their service times.
    pub service_ended: Ended,
    /// Connections seen since tracing began.
    pub connections: u64,
    pub exited: bool,
    /// The gRPC library whose uprobes delimit calls, e.g. "grpc-go v1.79.3
    /// (handleStream .. writeStatus)".
    pub probes: Option<String>,
    /// Why per-call gRPC tracing is not possible, and the mode used instead.
    pub warning: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turns_later_requests_are_timed_from_the_middle_of_its_wait() {
        // One request: the turn, arrival to last reply.
        assert_eq!(turn_latencies(100, 400, 1000, 1).collect::<Vec<_>>(), [900]);
        // Four read together after the first waited 300 ns: the first is
        // the turn, the three that came during its wait 150 ns less.
        assert_eq!(
            turn_latencies(100, 400, 1000, 4).collect::<Vec<_>>(),
            [900, 750, 750, 750]
        );
        // A batch that arrived at the read (no wait): all exact.
        assert_eq!(
            turn_latencies(400, 400, 1000, 3).collect::<Vec<_>>(),
            [600, 600, 600]
        );
        // An arrival stamped after the read counts from the read; a
        // handshake turn stands for no request.
        assert_eq!(
            turn_latencies(500, 400, 1000, 2).collect::<Vec<_>>(),
            [600, 600]
        );
        assert_eq!(turn_latencies(100, 400, 1000, 0).count(), 0);
        let mut k = KindStats::new(16);
        k.record_turn(100, 400, 1000, 4);
        assert_eq!(
            (k.interval_count, k.lat.interval.len(), k.svc.interval.len()),
            (4, 4, 4)
        );
        // Service is the turn's for each; the latencies' mean (exact).
        assert_eq!(k.svc.interval.mean(), Some(600.0));
        assert_eq!(k.lat.interval.mean(), Some(787.5));
    }
}
