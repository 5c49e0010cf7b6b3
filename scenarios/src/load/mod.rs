//! The open-loop load generator.
//!
//! Requests leave on a schedule fixed in advance ([`Schedule`]) whatever the
//! replies do: on a keep-alive connection they are pipelined, with
//! connection-per-request each gets a fresh connection. Latency is measured
//! from the *scheduled* send time to the end of the reply, so a server stall
//! shows up as latency of every request scheduled during it (no coordinated
//! omission), never as a lower send rate.
//!
//! gRPC calls are multiplexed as HTTP/2 streams on shared connections (or
//! one connection per call) by a tonic client on a single-threaded tokio
//! runtime; a separate thread wakes at each scheduled time and hands the call
//! over, so gRPC gets the same schedule and the same latency definition.
//!
//! One run is one thread with one epoll loop ([`run`]); the daemon or a replay
//! starts one per app with [`spawn`] and receives an [`IntervalReport`] per
//! interval (the client feedback path) through a callback or a channel.

mod engine;
mod grpc;
pub mod proto;
pub mod schedule;
mod tally;

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use qosd_core::LatencySummary;
use serde::{Deserialize, Serialize};

pub use schedule::{Arrival, Rate, Schedule};

/// Wire protocol of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1 GET.
    Http,
    /// memcached text protocol, `get`/`set`.
    Memcache,
    /// gRPC unary calls over HTTP/2 (see [`GrpcCall`]).
    Grpc,
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "http" => Ok(Protocol::Http),
            "memcache" | "memcached" => Ok(Protocol::Memcache),
            "grpc" => Ok(Protocol::Grpc),
            _ => Err(format!("unknown protocol {s:?} (http, memcache or grpc)")),
        }
    }
}

/// Errors the caller can branch on: the first two are the user's input.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "target {0}: not a loopback address (the load generator only sends to 127.0.0.0/8 or ::1)"
    )]
    NotLoopback(String),
    #[error("target {0}: {1}")]
    BadTarget(String, String),
    #[error("invalid load spec: {0}")]
    BadSpec(String),
    #[error("load generator I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// Resolves `host:port` and refuses anything that is not loopback.
pub fn resolve_loopback(target: &str) -> Result<SocketAddr, LoadError> {
    let addrs: Vec<SocketAddr> = target
        .to_socket_addrs()
        .map_err(|e| LoadError::BadTarget(target.to_owned(), format!("cannot resolve: {e}")))?
        .collect();
    let Some(first) = addrs.first().copied() else {
        return Err(LoadError::BadTarget(target.to_owned(), "no address".into()));
    };
    if addrs.iter().any(|a| !a.ip().is_loopback()) {
        return Err(LoadError::NotLoopback(target.to_owned()));
    }
    Ok(first)
}

/// memcached request mix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemcacheMix {
    /// Number of distinct keys (`key:00000000` ...).
    pub nr_keys: u32,
    /// Size of each value written by `set`, bytes.
    pub value_bytes: usize,
    /// Fraction of requests that are `set` (the rest are `get`), 0..=1.
    pub set_ratio: f64,
    /// Write every key once before the timed run so `get`s hit.
    pub preload: bool,
}

impl Default for MemcacheMix {
    fn default() -> Self {
        Self {
            nr_keys: 10_000,
            value_bytes: 64,
            set_ratio: 0.1,
            preload: true,
        }
    }
}

/// The gRPC call the load makes: a unary method whose request and reply are
/// `google.protobuf.UInt64Value`, like the fixture server's
/// `/qosd.fixture.Fixture/Work` (the request value is the CPU work per call).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrpcCall {
    /// Full method name, `/package.Service/Method`.
    pub method: String,
    /// Request value: the fixture's CPU work per call, µs (0: the server's
    /// own default).
    pub work_us: u64,
}

/// The fixture server's one method.
pub const FIXTURE_METHOD: &str = "/qosd.fixture.Fixture/Work";

impl Default for GrpcCall {
    fn default() -> Self {
        Self {
            method: FIXTURE_METHOD.into(),
            work_us: 0,
        }
    }
}

/// Everything one run needs. Build with [`LoadSpec::new`], then adjust fields.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub target: SocketAddr,
    pub protocol: Protocol,
    /// Offered load over time.
    pub rate: Rate,
    pub arrival: Arrival,
    pub seed: u64,
    pub duration: Duration,
    /// Keep connections open and pipeline requests on them (gRPC: multiplex
    /// calls as HTTP/2 streams on them); otherwise one connection per request.
    pub keepalive: bool,
    /// Keep-alive: number of connections. Per-request: most connections open
    /// at once (requests beyond wait, and their latency still counts from
    /// their scheduled time).
    pub connections: usize,
    /// Keep-alive: most unanswered requests on one connection; more are
    /// counted as `overflow` errors instead of being sent.
    pub max_in_flight: usize,
    /// After the last scheduled request, how long to wait for replies before
    /// counting the rest as timeouts.
    pub drain: Duration,
    /// Period of the [`IntervalReport`]s.
    pub interval: Duration,
    /// HTTP request path; `{seq}` is replaced by the request number.
    pub http_path: String,
    pub memcache: MemcacheMix,
    pub grpc: GrpcCall,
}

/// Longest run accepted (bounded in time).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
/// Most connections accepted.
pub const MAX_CONNECTIONS: usize = 16_384;

impl LoadSpec {
    /// A spec with defaults: Poisson arrivals, seed 1, keep-alive with 8
    /// connections, 100 ms intervals. Fails on a non-loopback target.
    pub fn new(
        target: &str,
        protocol: Protocol,
        rate: Rate,
        duration: Duration,
    ) -> Result<Self, LoadError> {
        Ok(Self {
            target: resolve_loopback(target)?,
            protocol,
            rate,
            arrival: Arrival::Poisson,
            seed: 1,
            duration,
            keepalive: true,
            connections: 8,
            max_in_flight: 100_000,
            drain: Duration::from_secs(2),
            interval: Duration::from_millis(100),
            http_path: "/".into(),
            memcache: MemcacheMix::default(),
            grpc: GrpcCall::default(),
        })
    }

    pub fn validate(&self) -> Result<(), LoadError> {
        let bad = |m: String| Err(LoadError::BadSpec(m));
        if !self.target.ip().is_loopback() {
            return Err(LoadError::NotLoopback(self.target.to_string()));
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            return bad(format!("duration {:?} must be in (0, 24 h]", self.duration));
        }
        if self.connections == 0 || self.connections > MAX_CONNECTIONS {
            return bad(format!(
                "connections {} must be in 1..={MAX_CONNECTIONS}",
                self.connections
            ));
        }
        if let Rate::Constant(r) = self.rate {
            if !(r > 0.0 && r <= schedule::MAX_RPS) {
                return bad(format!("rps {r} must be in (0, {}]", schedule::MAX_RPS));
            }
        }
        if self.interval < Duration::from_millis(1) || self.drain > Duration::from_secs(60) {
            return bad("interval must be >= 1 ms and drain <= 60 s".into());
        }
        if self.max_in_flight == 0 {
            return bad("max_in_flight must be at least 1".into());
        }
        let m = &self.memcache;
        if !(0.0..=1.0).contains(&m.set_ratio) || m.nr_keys == 0 || m.value_bytes > 1 << 20 {
            return bad("memcache: set_ratio in [0,1], nr_keys >= 1, value_bytes <= 1 MiB".into());
        }
        if !self.http_path.starts_with('/') || self.http_path.contains(['\r', '\n', ' ']) {
            return bad(format!(
                "HTTP path {:?} must start with / and hold no spaces",
                self.http_path
            ));
        }
        let m = &self.grpc.method;
        let well_formed = m
            .strip_prefix('/')
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(svc, meth)| !svc.is_empty() && !meth.is_empty() && !meth.contains('/'));
        if !well_formed || m.contains(|c: char| c.is_whitespace()) {
            return bad(format!("gRPC method {m:?} must be /package.Service/Method"));
        }
        Ok(())
    }
}

/// Client-side view of one interval: what the daemon's client sensor gets.
/// Latencies are of the replies that *completed* in the interval.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IntervalReport {
    /// End of the interval, seconds since the start of the run.
    pub t_s: f64,
    /// Length of the interval, seconds.
    pub interval_s: f64,
    /// Offered load the profile asked for at the end of the interval, rps.
    pub offered_rps: f64,
    /// Requests due in the interval and requests handed to a connection.
    pub scheduled: u64,
    pub sent: u64,
    /// Replies completed and failures in the interval.
    pub completed: u64,
    pub errors: u64,
    /// Completed replies: `rps` = completed per second, latencies in µs.
    pub latency: LatencySummary,
    /// The same replies' latencies, ns: a driver that gets several reports
    /// per decision interval merges them for the interval's percentiles.
    #[serde(skip)]
    pub histogram: qosd_sensors::stats::LogHistogram,
    /// The same replies with the instant each ended (CLOCK_MONOTONIC), to
    /// file them by it beside the eBPF side ([`qosd_sensors::filed`]).
    #[serde(skip)]
    pub ended: qosd_sensors::filed::Ended,
}

/// A load generator's report as the client sensor takes it.
impl From<IntervalReport> for qosd_sensors::sensor::client::ClientReport {
    fn from(r: IntervalReport) -> Self {
        qosd_sensors::sensor::client::ClientReport {
            latency: qosd_sensors::sensor::LatencyTick {
                hist: r.histogram,
                latest_ns: None,
                ended: r.ended,
            },
            offered_rps: Some(r.offered_rps),
            completed: r.completed,
        }
    }
}

/// Failures by kind (each a number of requests).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorCounts {
    /// Could not connect, or the connection failed before any reply.
    pub connect: u64,
    /// Connection reset or closed with requests unanswered.
    pub io: u64,
    /// Reply that is not valid for the protocol.
    pub protocol: u64,
    /// HTTP 4xx/5xx, memcached ERROR lines.
    pub status: u64,
    /// No reply by the end of the drain period.
    pub timeout: u64,
    /// Not sent: a connection already had `max_in_flight` unanswered.
    pub overflow: u64,
}

impl ErrorCounts {
    pub fn total(&self) -> u64 {
        self.connect + self.io + self.protocol + self.status + self.timeout + self.overflow
    }
}

/// Percentiles in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
    pub max: Option<f64>,
}

/// Totals of one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    pub target: String,
    pub protocol: String,
    pub keepalive: bool,
    pub connections: usize,
    /// Scheduled length of the run, seconds.
    pub duration_s: f64,
    pub scheduled: u64,
    pub sent: u64,
    pub completed: u64,
    /// memcached `get`s that found no value (counted in `completed`).
    pub misses: u64,
    pub errors: ErrorCounts,
    /// scheduled / duration, sent / duration, completed / duration.
    pub offered_rps: f64,
    pub send_rps: f64,
    pub achieved_rps: f64,
    /// Latency from scheduled send to end of reply, µs.
    pub latency_us: Percentiles,
    /// How late requests were handed to the socket after their scheduled
    /// time, µs: near zero for an open-loop generator that keeps up.
    pub send_lag_us: Percentiles,
    /// Keep-alive connections re-opened after the server closed them
    /// (HTTP and memcached; a gRPC channel reconnects by itself, unseen, so
    /// gRPC reports 0 and counts the calls that failed meanwhile as `io`).
    pub reconnects: u64,
    /// The run was stopped early by its stop flag.
    pub stopped: bool,
}

/// Runs one load on the calling thread until its schedule ends (plus the
/// drain), or `stop` is set. `on_interval` is called after each interval.
pub fn run(
    spec: &LoadSpec,
    stop: &AtomicBool,
    on_interval: &mut dyn FnMut(&IntervalReport),
) -> Result<LoadReport, LoadError> {
    spec.validate()?;
    match spec.protocol {
        Protocol::Grpc => grpc::run(spec, stop, on_interval),
        Protocol::Http | Protocol::Memcache => engine::Engine::new(spec)?.run(stop, on_interval),
    }
}

/// Runs one load on its own thread; interval reports go to `tx` (a closed
/// receiver is ignored). Set `stop` to end it early.
pub fn spawn(
    spec: LoadSpec,
    tx: Option<mpsc::Sender<IntervalReport>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<LoadReport, LoadError>> {
    std::thread::Builder::new()
        .name("qosd-load".into())
        .spawn(move || {
            run(&spec, &stop, &mut |r| {
                if let Some(tx) = &tx {
                    let _ = tx.send(r.clone());
                }
            })
        })
        .unwrap_or_else(|e| std::thread::spawn(move || Err(LoadError::Io(e))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_non_loopback() {
        assert!(matches!(
            resolve_loopback("10.1.2.3:80"),
            Err(LoadError::NotLoopback(_))
        ));
        assert!(matches!(resolve_loopback("[::1]:11211"), Ok(a) if a.port() == 11211));
        assert!(resolve_loopback("127.0.0.2:80").is_ok());
        assert!(matches!(
            resolve_loopback("nonsense"),
            Err(LoadError::BadTarget(..))
        ));
    }

    #[test]
    fn validate_bounds() {
        let mut s = LoadSpec::new(
            "127.0.0.1:1",
            Protocol::Http,
            Rate::Constant(10.0),
            Duration::from_secs(1),
        )
        .unwrap();
        assert!(s.validate().is_ok());
        s.duration = Duration::ZERO;
        assert!(s.validate().is_err());
        s.duration = Duration::from_secs(1);
        s.rate = Rate::Constant(0.0);
        assert!(s.validate().is_err());
        s.rate = Rate::Constant(1.0);
        s.http_path = "x y".into();
        assert!(s.validate().is_err());
        s.http_path = "/".into();
        for bad in ["Work", "/Work", "/svc/", "//Work", "/a/b/c", "/svc/Wo rk"] {
            s.grpc.method = bad.into();
            assert!(s.validate().is_err(), "{bad} accepted");
        }
        s.grpc.method = "/qosd.fixture.Fixture/Work".into();
        assert!(s.validate().is_ok());
    }
}
