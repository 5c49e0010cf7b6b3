//! Real-server tests of the eBPF request sensor through `qosd trace`
//! (root, real eBPF, nginx and memcached from Debian's packages).
//! Run alone: `cargo test --release -p qosd-manager --test trace_real`.

mod support;

use support::*;

#[test]
fn nginx_connection_close_counts_every_request() {
    let srv = nginx();
    let trace = Trace::start(&[srv.pid()], &[]);
    let lat = http_load(srv.port, 2000, 16, false);
    let lines = trace.stop();
    let s = summary(&lines, srv.pid());
    assert_eq!(s["requests"], 2000, "{s}");
    assert_eq!(s["mode"], "connection", "{s}");
    assert_server_le_client("nginx connection-close", &s, &lat);
}

#[test]
fn nginx_keepalive_counts_every_request_in_turn_mode() {
    let srv = nginx();
    let trace = Trace::start(&[srv.pid()], &[]);
    let lat = http_load(srv.port, 4000, 8, true);
    let lines = trace.stop();
    let s = summary(&lines, srv.pid());
    assert_eq!(s["requests"], 4000, "{s}");
    assert_eq!(s["mode"], "turn", "{s}");
    assert_server_le_client("nginx keep-alive", &s, &lat);
}

#[test]
fn memcached_multithreaded_persistent_connections() {
    let srv = memcached(4);
    let trace = Trace::start(&[srv.pid()], &[]);
    // How the benches find a tracer's programs (and their BPF cost): by
    // the tracer's pid.
    let progs = qosd_sensors::bpfstats::held_by(trace.pid());
    assert!(
        progs.iter().any(|p| p.name.starts_with("qosd_")),
        "{progs:?}"
    );
    let lat = memcache_load(srv.port, 8, 1000, None);
    let lines = trace.stop();
    let s = summary(&lines, srv.pid());
    assert_eq!(s["requests"], 8000, "{s}");
    assert_eq!(s["mode"], "turn", "{s}");
    assert_server_le_client("memcached -t 4", &s, &lat);
}

#[test]
fn memcached_32_connections_with_fd_reuse() {
    let srv = memcached(4);
    let trace = Trace::start(&[srv.pid()], &["--mode", "turn"]);
    // 40 concurrent clients, each reconnecting every 10 requests: fds are
    // closed and reused by other connections all the time.
    let lat = memcache_load(srv.port, 40, 200, Some(10));
    let lines = trace.stop();
    let s = summary(&lines, srv.pid());
    assert_eq!(s["requests"], 8000, "{s}");
    assert_server_le_client("memcached fd reuse", &s, &lat);
}

#[test]
fn connections_open_before_tracing_are_followed() {
    let srv = memcached(2);
    // Connect first, then trace: the connections must be found in /proc.
    use std::io::{BufRead, BufReader, Write};
    let conns: Vec<_> = (0..4)
        .map(|_| BufReader::new(std::net::TcpStream::connect(("127.0.0.1", srv.port)).unwrap()))
        .collect();
    let trace = Trace::start(&[srv.pid()], &["--mode", "turn"]);
    let mut line = String::new();
    for mut c in conns {
        for i in 0..50 {
            c.get_mut()
                .write_all(format!("set a{i} 0 0 1\r\nx\r\n").as_bytes())
                .unwrap();
            line.clear();
            c.read_line(&mut line).unwrap();
            assert_eq!(line, "STORED\r\n");
        }
    }
    let lines = trace.stop();
    assert_eq!(summary(&lines, srv.pid())["requests"], 200);
}

#[test]
fn two_pids_at_once_are_kept_apart() {
    let a = memcached(2);
    let b = nginx();
    let trace = Trace::start(&[a.pid(), b.pid()], &[]);
    let ha = std::thread::spawn({
        let port = a.port;
        move || memcache_load(port, 4, 300, None)
    });
    http_load(b.port, 500, 5, false);
    ha.join().unwrap();
    let lines = trace.stop();
    assert_eq!(summary(&lines, a.pid())["requests"], 1200);
    assert_eq!(summary(&lines, b.pid())["requests"], 500);
}

#[test]
fn summary_is_printed_when_the_target_exits() {
    let mut srv = memcached(2);
    let trace = Trace::start(&[srv.pid()], &[]);
    memcache_load(srv.port, 2, 100, None);
    srv.child.kill().unwrap();
    srv.child.wait().unwrap();
    let lines = trace.wait();
    let s = summary(&lines, srv.pid());
    assert_eq!(s["requests"], 200, "{s}");
}

#[test]
fn interval_lines_have_the_documented_keys() {
    let srv = memcached(1);
    let trace = Trace::start(&[srv.pid()], &[]);
    memcache_load(srv.port, 2, 50, None);
    let lines = trace.stop();
    for key in [
        "t_s",
        "pid",
        "mode",
        "requests",
        "rps",
        "latest_us",
        "mean_us",
        "p50_us",
        "p95_us",
        "p99_us",
        "dropped",
    ] {
        assert!(
            lines.iter().all(|l| l.get(key).is_some()),
            "key {key} missing: {lines:?}"
        );
    }
    let total: u64 = lines
        .iter()
        .filter(|l| l.get("summary").is_none())
        .map(|l| l["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 100, "interval counts add up to the total");
    assert_eq!(summary(&lines, srv.pid())["dropped"], 0);
}

/// With one connection there is no queueing in front of the server, so the
/// gap between client and server latency is the loopback stack and the
/// client itself. (Under concurrency the gap also holds the time requests
/// wait in the socket queue, which no syscall hook can see.)
#[test]
fn single_connection_gap_is_the_network_stack() {
    let mc = memcached(1);
    let trace = Trace::start(&[mc.pid()], &[]);
    let lat = memcache_load(mc.port, 1, 2000, None);
    let lines = trace.stop();
    let s = summary(&lines, mc.pid());
    assert_eq!(s["requests"], 2000, "{s}");
    assert_server_le_client("memcached, 1 connection", &s, &lat);

    let ngx = nginx();
    let trace = Trace::start(&[ngx.pid()], &[]);
    let lat = http_load(ngx.port, 2000, 1, true);
    let lines = trace.stop();
    let s = summary(&lines, ngx.pid());
    assert_eq!(s["requests"], 2000, "{s}");
    assert_server_le_client("nginx keep-alive, 1 connection", &s, &lat);
}

/// `--power` adds the process's attributed power and energy per request;
/// on a machine without RAPL every figure is flagged as an estimate.
#[test]
fn power_columns_are_present_and_labelled() {
    let mc = memcached(1);
    let trace = Trace::start(&[mc.pid()], &["--power"]);
    memcache_load(mc.port, 2, 2000, None);
    let lines = trace.stop();
    let intervals: Vec<_> = lines
        .iter()
        .filter(|l| l.get("summary").is_none())
        .collect();
    assert!(
        intervals
            .iter()
            .all(|l| l["power_w"].as_f64().is_some_and(|w| w >= 0.0)),
        "{lines:?}"
    );
    let rapl = std::path::Path::new("/sys/class/powercap/intel-rapl:0/energy_uj").exists();
    assert!(
        intervals.iter().all(|l| l["energy_is_estimate"] == !rapl),
        "{lines:?}"
    );
    assert!(
        intervals
            .iter()
            .any(|l| l["power_w"].as_f64().unwrap() > 0.0
                && l["energy_per_request_j"].as_f64().is_some_and(|j| j > 0.0)),
        "some interval with requests has energy per request: {lines:?}"
    );
}
