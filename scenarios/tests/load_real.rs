//! The load generator against real servers started here on loopback
//! (fixture server, memcached, nginx). Run alone with
//! `cargo test -p qosd-scenarios --test load_real`.

mod common;

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use qosd_scenarios::load::{self, Arrival, IntervalReport, LoadReport, LoadSpec, Protocol, Rate};

fn spec(addr: &str, protocol: Protocol, rps: f64, secs: f64, keepalive: bool) -> LoadSpec {
    let mut s = LoadSpec::new(
        addr,
        protocol,
        Rate::Constant(rps),
        Duration::from_secs_f64(secs),
    )
    .unwrap();
    s.arrival = Arrival::Uniform;
    s.keepalive = keepalive;
    s.connections = if keepalive { 4 } else { 256 };
    s
}

fn run(s: &LoadSpec) -> (LoadReport, Vec<IntervalReport>) {
    let mut iv = Vec::new();
    let r = load::run(s, &AtomicBool::new(false), &mut |x| iv.push(x.clone())).unwrap();
    (r, iv)
}

/// Count exactly as scheduled, every reply in, achieved rate within 1%.
fn assert_on_schedule(r: &LoadReport, rps: f64, secs: f64) {
    let want = (rps * secs).round() as u64;
    assert_eq!(r.scheduled, want, "{r:#?}");
    assert_eq!(r.sent, r.scheduled, "{r:#?}");
    assert_eq!(r.errors.total(), 0, "{r:#?}");
    assert_eq!(r.completed, r.sent, "{r:#?}");
    assert!((r.send_rps - rps).abs() / rps < 0.01, "{r:#?}");
    assert!((r.achieved_rps - rps).abs() / rps < 0.01, "{r:#?}");
}

#[test]
fn real_fixture_rate_count_and_injected_delay() {
    let _serial = common::serial();
    let srv = common::fixture(&["--delay-us", "5000"]);
    let s = spec(&srv.addr, Protocol::Http, 1000.0, 4.0, true);
    let (r, iv) = run(&s);
    assert_on_schedule(&r, 1000.0, 4.0);
    // Every reply is at least the injected 5 ms late; the median adds only
    // loopback and scheduling overhead.
    let p50 = r.latency_us.p50.unwrap();
    assert!(
        (5000.0..7000.0).contains(&p50),
        "p50 {p50} µs for a 5000 µs delay: {r:#?}"
    );
    assert!(r.latency_us.mean.unwrap() >= 5000.0);
    // 40 intervals of 100 ms, about 100 requests each.
    assert!(iv.len() >= 39, "{}", iv.len());
    let sent: u64 = iv.iter().map(|i| i.sent).sum();
    assert!(sent >= 3950, "{sent}");
    assert!(iv[5].latency.p50_us.unwrap() >= 5000.0);
}

#[test]
fn real_fixture_connection_per_request() {
    let _serial = common::serial();
    let srv = common::fixture(&["--delay-us", "1000"]);
    let s = spec(&srv.addr, Protocol::Http, 500.0, 3.0, false);
    let (r, _) = run(&s);
    assert_on_schedule(&r, 500.0, 3.0);
    assert!(r.latency_us.p50.unwrap() >= 1000.0);
}

/// A 1 s server-wide stall in a 6 s run at 1000 rps: the ~1000 requests
/// scheduled during it wait until its end, so their latencies spread
/// uniformly over (0, 1 s]: p90 ≈ 0.4 s, p99 ≈ 0.94 s. The sender keeps its
/// pace through the stall. A closed-loop client would instead stop sending
/// and record only a handful of slow requests.
#[test]
fn real_fixture_stall_shows_in_tail_not_in_send_rate() {
    let _serial = common::serial();
    let srv = common::fixture(&[
        "--delay-us",
        "500",
        "--stall-at-ms",
        "2500",
        "--stall-ms",
        "1000",
    ]);
    let s = spec(&srv.addr, Protocol::Http, 1000.0, 6.0, true);
    let (r, iv) = run(&s);
    assert_on_schedule(&r, 1000.0, 6.0);
    let p90 = r.latency_us.p90.unwrap() / 1000.0;
    let p99 = r.latency_us.p99.unwrap() / 1000.0;
    assert!((250.0..600.0).contains(&p90), "p90 {p90} ms: {r:#?}");
    assert!((850.0..1100.0).contains(&p99), "p99 {p99} ms: {r:#?}");
    // Intervals whose requests stalled (p99 over 300 ms) still sent their
    // full share: the send rate does not drop during the stall.
    let stalled: Vec<&IntervalReport> = iv
        .iter()
        .filter(|i| i.latency.p99_us.is_some_and(|p| p > 300_000.0))
        .collect();
    assert!(!stalled.is_empty());
    // Any 0.5 s (5 intervals) sent its ~500 requests; a closed-loop client
    // would have sent next to nothing during the stall. (Windows rather than
    // single intervals: a descheduled sender shifts a few requests across an
    // interval boundary without sending fewer.)
    let min_sent = iv
        .windows(5)
        .map(|w| w.iter().map(|i| i.sent).sum::<u64>())
        .min()
        .unwrap();
    assert!(
        min_sent >= 480,
        "a 0.5 s window sent only {min_sent} of 500: the sender was held back"
    );
}

/// Paper 003's deterministic chaos: every 50th request (by id) is 20 ms
/// slow, so exactly 2% are slow whatever the run, and p99 shows them.
#[test]
fn real_fixture_deterministic_slow_requests_by_id() {
    let _serial = common::serial();
    let srv = common::fixture(&[
        "--delay-us",
        "200",
        "--slow-every",
        "50",
        "--slow-us",
        "20000",
    ]);
    // One connection per request: a slow reply does not hold others back.
    let mut s = spec(&srv.addr, Protocol::Http, 1000.0, 3.0, false);
    s.http_path = "/r/{seq}".into();
    let (r, _) = run(&s);
    assert_on_schedule(&r, 1000.0, 3.0);
    let p95 = r.latency_us.p95.unwrap();
    let p99 = r.latency_us.p99.unwrap();
    // The slow 2% take >= 20 ms; p95 must stay below that (the margin is
    // for a busy machine, whose scheduling delays reach a few ms).
    assert!(p95 < 20_000.0, "p95 {p95} µs: only 2% are slow");
    assert!(
        p99 >= 20_000.0,
        "p99 {p99} µs must include the 2% slow requests"
    );
}

#[test]
fn real_memcached_get_set_keepalive() {
    let _serial = common::serial();
    let srv = common::memcached(2);
    let mut s = spec(&srv.addr, Protocol::Memcache, 5000.0, 3.0, true);
    s.memcache.set_ratio = 0.2;
    let (r, _) = run(&s);
    assert_on_schedule(&r, 5000.0, 3.0);
    assert_eq!(r.misses, 0, "keys were preloaded");
    assert!(r.latency_us.p50.unwrap() < 5000.0);
}

#[test]
fn real_memcached_connection_per_request() {
    let _serial = common::serial();
    let srv = common::memcached(1);
    let s = spec(&srv.addr, Protocol::Memcache, 500.0, 2.0, false);
    let (r, _) = run(&s);
    assert_on_schedule(&r, 500.0, 2.0);
}

#[test]
fn real_nginx_keepalive_and_per_request() {
    let _serial = common::serial();
    let srv = common::nginx(100_000);
    let (r, _) = run(&spec(&srv.addr, Protocol::Http, 2000.0, 3.0, true));
    assert_on_schedule(&r, 2000.0, 3.0);
    let (r, _) = run(&spec(&srv.addr, Protocol::Http, 500.0, 2.0, false));
    assert_on_schedule(&r, 500.0, 2.0);
}

/// nginx closes a keep-alive connection after 50 requests; the generator
/// reopens it and sends again what was unanswered, losing nothing.
#[test]
fn real_nginx_reconnects_after_keepalive_requests() {
    let _serial = common::serial();
    let srv = common::nginx(50);
    let (r, _) = run(&spec(&srv.addr, Protocol::Http, 1000.0, 2.0, true));
    assert_on_schedule(&r, 1000.0, 2.0);
    assert!(r.reconnects >= 30, "{r:#?}");
}

#[test]
fn refuses_a_closed_port_with_errors_not_a_hang() {
    let _serial = common::serial();
    let port = common::free_port();
    let s = spec(
        &format!("127.0.0.1:{port}"),
        Protocol::Http,
        100.0,
        0.5,
        false,
    );
    let (r, _) = run(&s);
    assert_eq!(r.scheduled, 50);
    assert_eq!(r.errors.connect, 50, "{r:#?}");
    assert_eq!(r.completed, 0);
}

/// The daemon's client-feedback path: a spawned run sends one report per
/// interval over a channel, and its stop flag ends it early.
#[test]
fn real_spawned_run_streams_intervals_and_stops() {
    let _serial = common::serial();
    use std::sync::atomic::Ordering;
    use std::sync::{mpsc, Arc};
    let srv = common::fixture(&["--delay-us", "1000"]);
    let mut s = spec(&srv.addr, Protocol::Http, 500.0, 30.0, true);
    s.interval = Duration::from_millis(200);
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let h = load::spawn(s, Some(tx), stop.clone());
    let first: Vec<IntervalReport> = (0..5)
        .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap())
        .collect();
    stop.store(true, Ordering::Relaxed);
    let r = h.join().unwrap().unwrap();
    assert!(r.stopped);
    assert!(
        r.scheduled < 15_000 / 2,
        "stopped long before the 30 s schedule: {}",
        r.scheduled
    );
    for (i, iv) in first.iter().enumerate() {
        assert!((iv.t_s - 0.2 * (i + 1) as f64).abs() < 1e-9, "{}", iv.t_s);
        assert!(iv.latency.p99_us.unwrap() >= 1000.0);
        assert!((iv.offered_rps - 500.0).abs() < 1e-9);
    }
    assert!(
        first[1..].iter().all(|iv| iv.sent >= 95 && iv.sent <= 105),
        "{:?}",
        first.iter().map(|i| i.sent).collect::<Vec<_>>()
    );
}
