//! `qosd load`: the open-loop load generator on its own. Requests leave on
//! schedule whatever the replies do; latency counts from the scheduled time.

use std::time::Duration;

use clap::Args as ClapArgs;
use qosd_scenarios::load::{
    self, Arrival, IntervalReport, LoadError, LoadReport, LoadSpec, Protocol, Rate,
};

use crate::secs::secs;
use crate::usage;

#[derive(ClapArgs, Debug)]
#[command(after_help = "Examples:\n  \
    qosd load --target 127.0.0.1:11211 --protocol memcache --rps 20000 --duration 10 --keepalive\n  \
    qosd load --target 127.0.0.1:8080 --protocol http --rps 2000 --duration 30 --json\n  \
    qosd load --target 127.0.0.1:8080 --protocol http --rps 500 --duration 5 --arrival uniform --intervals\n  \
    qosd load --target 127.0.0.1:50051 --protocol grpc --rps 5000 --duration 10 --keepalive --max-in-flight 64\n  \
    qosd load --target 127.0.0.1:50051 --protocol grpc --rps 500 --duration 10 --work-us 200\n\n\
    gRPC calls the unary method --grpc-method with a google.protobuf.UInt64Value request\n\
    (the fixture server's /qosd.fixture.Fixture/Work; the value is its CPU work per call).\n\
    With --keepalive the calls are HTTP/2 streams multiplexed on --connections (default 1)\n\
    connections; without it every call opens its own connection.\n\n\
    Latency is measured from each request's scheduled send time, so a server stall shows\n\
    in the tail instead of slowing the sender (no coordinated omission). Only loopback\n\
    targets are accepted.")]
pub struct Args {
    /// Server to load, HOST:PORT (loopback only).
    #[arg(long)]
    pub target: String,
    /// Wire protocol: http, memcache or grpc.
    #[arg(long, value_parser = |s: &str| s.parse::<Protocol>())]
    pub protocol: Protocol,
    /// Offered load, requests per second.
    #[arg(long, allow_negative_numbers = true)]
    pub rps: f64,
    /// Length of the run, seconds.
    #[arg(long, allow_negative_numbers = true, default_value_t = 10.0)]
    pub duration: f64,
    /// Keep-alive: number of connections (requests are pipelined on them;
    /// gRPC calls are multiplexed on them). Otherwise: most connections open
    /// at once. Default 8 with --keepalive (gRPC: 1), 256 without.
    #[arg(long)]
    pub connections: Option<usize>,
    /// Persistent connections; without it, one connection per request.
    #[arg(long)]
    pub keepalive: bool,
    /// Keep-alive: most unanswered requests (gRPC: open streams) on one
    /// connection; requests beyond it are counted as `overflow` errors.
    #[arg(long, default_value_t = 100_000)]
    pub max_in_flight: usize,
    /// Arrival process: poisson or uniform.
    #[arg(long, default_value = "poisson", value_parser = |s: &str| s.parse::<Arrival>())]
    pub arrival: Arrival,
    /// Seed of the arrival times and the request mix.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// HTTP path; `{seq}` becomes the request number.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// memcached: fraction of requests that are `set`.
    #[arg(long, default_value_t = 0.1)]
    pub set_ratio: f64,
    /// memcached: number of distinct keys.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u32,
    /// memcached: value size, bytes.
    #[arg(long, default_value_t = 64)]
    pub value_bytes: usize,
    /// memcached: do not write every key before the run.
    #[arg(long)]
    pub no_preload: bool,
    /// gRPC: full name of the unary method to call.
    #[arg(long, default_value = load::FIXTURE_METHOD)]
    pub grpc_method: String,
    /// gRPC: the request's value, the fixture's CPU work per call in µs
    /// (0: the server's own -work-us).
    #[arg(long, default_value_t = 0)]
    pub work_us: u64,
    /// Print one line per interval while running.
    #[arg(long)]
    pub intervals: bool,
    /// Interval length for --intervals, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// Print JSON (one object per interval line, then the report).
    #[arg(long)]
    pub json: bool,
}

/// The longest `--interval-ms`: an hour.
const MAX_INTERVAL_MS: u64 = 3_600_000;

pub fn spec_from(a: &Args) -> anyhow::Result<LoadSpec> {
    let duration = secs(
        "--duration",
        a.duration,
        0.0,
        load::MAX_DURATION.as_secs_f64(),
    )?;
    let mut s = LoadSpec::new(&a.target, a.protocol, Rate::Constant(a.rps), duration)
        .map_err(|e| usage!("{e}"))?;
    s.keepalive = a.keepalive;
    s.connections = a.connections.unwrap_or(match (a.keepalive, a.protocol) {
        (true, Protocol::Grpc) => 1,
        (true, _) => 8,
        (false, _) => 256,
    });
    s.max_in_flight = a.max_in_flight;
    s.grpc.method = a.grpc_method.clone();
    s.grpc.work_us = a.work_us;
    s.arrival = a.arrival;
    s.seed = a.seed;
    s.http_path = a.path.clone();
    s.memcache.set_ratio = a.set_ratio;
    s.memcache.nr_keys = a.keys;
    s.memcache.value_bytes = a.value_bytes;
    s.memcache.preload = !a.no_preload;
    // In ns the engine's interval must fit a u64: u64::MAX ms wrapped to a
    // zero interval that reported forever and sent nothing.
    if !(1..=MAX_INTERVAL_MS).contains(&a.interval_ms) {
        return Err(usage!(
            "--interval-ms {}: expected 1 to {MAX_INTERVAL_MS} ms",
            a.interval_ms
        ));
    }
    s.interval = Duration::from_millis(a.interval_ms);
    s.validate().map_err(|e| usage!("{e}"))?;
    Ok(s)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let spec = spec_from(&args)?;
    crate::signals::install()?;
    let json = args.json;
    let show = args.intervals;
    // A failed write (stdout closed) stops the printing; the run ends on
    // its schedule and the error is returned then.
    let mut closed: Option<anyhow::Error> = None;
    let mut on_interval = |r: &IntervalReport| {
        if !show || closed.is_some() {
            return;
        }
        let print = || -> anyhow::Result<()> {
            if json {
                if let Ok(line) = serde_json::to_string(r) {
                    crate::outln!("{line}")?;
                }
            } else {
                let f = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.0}"));
                crate::outln!(
                    "t={:>6.1}s sent {:>7} done {:>7} err {:>4}  p50 {:>7} µs  p99 {:>8} µs",
                    r.t_s,
                    r.sent,
                    r.completed,
                    r.errors,
                    f(r.latency.p50_us),
                    f(r.latency.p99_us)
                )?;
            }
            Ok(())
        };
        if let Err(e) = print() {
            closed = Some(e);
        }
    };
    let report =
        load::run(&spec, crate::signals::flag(), &mut on_interval).map_err(|e| match e {
            LoadError::NotLoopback(_) | LoadError::BadTarget(..) | LoadError::BadSpec(_) => {
                usage!("{e}")
            }
            // No listener is the user's target, whatever the protocol
            // (gRPC finds it out when it connects, memcache when it
            // preloads, a keep-alive run when it opens its connections).
            LoadError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                usage!("target {}: nothing listens there ({io})", args.target)
            }
            e => anyhow::Error::new(e).context(format!("loading {}", args.target)),
        })?;
    if let Some(e) = closed {
        return Err(e);
    }
    if report.completed == 0 && report.errors.connect > 0 {
        return Err(usage!(
            "target {}: nothing listens there ({} connections refused, no request completed)",
            args.target,
            report.errors.connect
        ));
    }
    if json {
        crate::outln!("{}", serde_json::to_string(&report)?)?;
    } else {
        print_report(&report)?;
    }
    Ok(())
}

fn print_report(r: &LoadReport) -> anyhow::Result<()> {
    let f = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.1}"));
    let mode = match (r.keepalive, r.protocol.as_str()) {
        (true, "grpc") => "streams multiplexed",
        (true, _) => "keep-alive",
        (false, "grpc") => "connection per call",
        (false, _) => "connection per request",
    };
    crate::outln!(
        "target {} ({}, {mode}, {} connections), {:.1} s",
        r.target,
        r.protocol,
        r.connections,
        r.duration_s
    )?;
    crate::outln!(
        "requests   scheduled {}  sent {}  completed {}  errors {}{}",
        r.scheduled,
        r.sent,
        r.completed,
        r.errors.total(),
        if r.stopped { "  (stopped early)" } else { "" }
    )?;
    if r.errors.total() > 0 {
        let e = &r.errors;
        crate::outln!(
            "errors     connect {}  io {}  protocol {}  status {}  timeout {}  overflow {}",
            e.connect,
            e.io,
            e.protocol,
            e.status,
            e.timeout,
            e.overflow
        )?;
    }
    crate::outln!(
        "rate /s    offered {:.1}  sent {:.1}  achieved {:.1}",
        r.offered_rps,
        r.send_rps,
        r.achieved_rps
    )?;
    let l = &r.latency_us;
    crate::outln!(
        "latency µs mean {}  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
        f(l.mean),
        f(l.p50),
        f(l.p90),
        f(l.p99),
        f(l.p999),
        f(l.max)
    )?;
    let s = &r.send_lag_us;
    crate::outln!(
        "send lag µs p50 {}  p99 {}  max {}",
        f(s.p50),
        f(s.p99),
        f(s.max)
    )?;
    if r.misses > 0 || r.reconnects > 0 {
        crate::outln!("misses {}  reconnects {}", r.misses, r.reconnects)?;
    }
    Ok(())
}
