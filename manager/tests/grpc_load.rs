//! `qosd load --protocol grpc` against the real grpc-go fixture server,
//! checked by the server's own count under `qosd trace` (root, real eBPF
//! uprobes): every call the load generator says completed was served, on
//! one multiplexed connection or on a connection per call; and its errors
//! are named (no server, a server that is not gRPC, a full connection).
//! Run alone: `cargo test -p qosd-manager --test grpc_load`.

mod support;

use support::grpc::{grpc_server, Stack};
use support::*;

/// Runs `qosd load --protocol grpc --json` and returns its report.
fn grpc_load_json(port: u16, extra: &[&str]) -> serde_json::Value {
    let target = format!("127.0.0.1:{port}");
    let mut args = vec!["load", "--target", &target, "--protocol", "grpc", "--json"];
    args.extend_from_slice(extra);
    let o = qosd(&args);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "qosd {args:?}: {}\n{out}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_str(out.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn multiplexed_calls_are_all_served_and_traced_in_grpc_mode() {
    let srv = grpc_server(Stack::Go, 50);
    let trace = Trace::start(&[srv.pid()], &[]);
    let r = grpc_load_json(
        srv.port,
        &[
            "--rps",
            "1500",
            "--duration",
            "2",
            "--keepalive",
            "--connections",
            "1",
        ],
    );
    let s = summary(&trace.stop(), srv.pid());
    assert_eq!(r["protocol"], "grpc", "{r}");
    assert_eq!(r["connections"], 1, "{r}");
    let n = r["completed"].as_u64().unwrap();
    assert_eq!(r["errors"]["connect"], 0, "{r}");
    assert_eq!(
        n,
        r["scheduled"].as_u64().unwrap(),
        "every call answered: {r}"
    );
    // Poisson arrivals at 1500/s for 2 s: 3000 ± 4 sigma.
    assert!((2780..=3220).contains(&n), "{n} calls: {r}");
    assert_eq!(s["mode"], "grpc", "{s}");
    assert_eq!(
        s["requests"].as_u64(),
        Some(n),
        "server saw {s}, client {r}"
    );
    // Each call spins 50 µs in the server; the client's p50 includes it.
    let p50 = r["latency_us"]["p50"].as_f64().unwrap();
    assert!(p50 >= 50.0, "client p50 {p50} µs below the server's work");
    let ebpf_p50 = s["p50_us"].as_f64().unwrap();
    assert!(
        ebpf_p50 <= p50,
        "server-side p50 {ebpf_p50} µs above the client's {p50} µs"
    );
}

#[test]
fn a_connection_per_call_is_traced_in_connection_mode() {
    let srv = grpc_server(Stack::Go, 0);
    let trace = Trace::start(&[srv.pid()], &[]);
    let r = grpc_load_json(
        srv.port,
        &["--rps", "200", "--duration", "2", "--connections", "8"],
    );
    let s = summary(&trace.stop(), srv.pid());
    assert_eq!(r["keepalive"], false, "{r}");
    let n = r["completed"].as_u64().unwrap();
    assert_eq!(n, r["scheduled"].as_u64().unwrap(), "{r}");
    assert!(n >= 300, "{r}");
    assert_eq!(s["mode"], "connection", "{s}");
    assert_eq!(
        s["requests"].as_u64(),
        Some(n),
        "server saw {s}, client {r}"
    );
}

#[test]
fn latency_counts_the_servers_work_from_the_scheduled_time() {
    // 5 ms of CPU per call (the request's value), 20 calls/s: no queueing,
    // so every call takes at least the work and the median not much more.
    let srv = grpc_server(Stack::Go, 0);
    let r = grpc_load_json(
        srv.port,
        &[
            "--rps",
            "20",
            "--duration",
            "2",
            "--keepalive",
            "--work-us",
            "5000",
            "--arrival",
            "uniform",
        ],
    );
    assert_eq!(r["completed"], r["scheduled"], "{r}");
    let l = &r["latency_us"];
    let (min_p50, p50) = (5000.0, l["p50"].as_f64().unwrap());
    assert!(p50 >= min_p50, "p50 {p50} µs < the 5 ms of work: {r}");
    assert!(p50 < 50_000.0, "p50 {p50} µs: {r}");
}

#[test]
fn a_full_connection_counts_overflow_instead_of_queueing() {
    // 20 ms per call at 200 calls/s is 4 calls open on average; at most 1
    // may be open on the one connection, so most calls overflow.
    let srv = grpc_server(Stack::Go, 20_000);
    let r = grpc_load_json(
        srv.port,
        &[
            "--rps",
            "200",
            "--duration",
            "1",
            "--keepalive",
            "--max-in-flight",
            "1",
        ],
    );
    let e = &r["errors"];
    let (done, over) = (
        r["completed"].as_u64().unwrap(),
        e["overflow"].as_u64().unwrap(),
    );
    assert!(over > 0 && done > 0, "{r}");
    assert_eq!(
        done + over + e["timeout"].as_u64().unwrap(),
        r["scheduled"].as_u64().unwrap(),
        "{r}"
    );
    assert_eq!(
        r["sent"].as_u64().unwrap(),
        r["scheduled"].as_u64().unwrap() - over,
        "{r}"
    );
}

#[test]
fn no_server_is_a_usage_error_naming_the_target() {
    let port = free_port();
    let target = format!("127.0.0.1:{port}");
    let o = qosd(&[
        "load",
        "--target",
        &target,
        "--protocol",
        "grpc",
        "--rps",
        "10",
        "--duration",
        "1",
        "--keepalive",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&target) && err.contains("cannot open a gRPC connection"),
        "{err}"
    );
}

#[test]
fn a_server_that_is_not_grpc_fails_every_call() {
    // nginx speaks HTTP/1.1 only: the HTTP/2 handshake or the call fails,
    // and each call is counted as an error, none as completed.
    let srv = nginx();
    let r = grpc_load_json(srv.port, &["--rps", "20", "--duration", "1"]);
    let e = &r["errors"];
    assert_eq!(r["completed"], 0, "{r}");
    let failed = e["connect"].as_u64().unwrap()
        + e["io"].as_u64().unwrap()
        + e["protocol"].as_u64().unwrap();
    assert_eq!(failed, r["scheduled"].as_u64().unwrap(), "{r}");
}

#[test]
fn bad_method_is_a_usage_error() {
    let o = qosd(&[
        "load",
        "--target",
        "127.0.0.1:1",
        "--protocol",
        "grpc",
        "--rps",
        "10",
        "--grpc-method",
        "Work",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("/package.Service/Method"), "{err}");
}
