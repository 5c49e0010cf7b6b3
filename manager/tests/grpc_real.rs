//! Real gRPC servers under `qosd trace` (root, real eBPF uprobes): grpc-go
//! before and after the 1.69 rename, a connection per call, a stripped Go
//! binary, gRPC C-core with symbols (Ruby's gem on Debian's libgrpc.so) and
//! without (Python's grpcio wheel from PyPI).
//! Run alone: `cargo test -p qosd-manager --test grpc_real`.

mod support;

use support::grpc::{grpc_load, grpc_server, Conns, Stack};
use support::*;

fn s_str(s: &serde_json::Value, key: &str) -> String {
    s[key].as_str().unwrap_or_default().to_owned()
}

#[test]
fn go_multiplexed_streams_on_one_connection_are_counted_in_grpc_mode() {
    let srv = grpc_server(Stack::Go, 50);
    let trace = Trace::start(&[srv.pid()], &[]);
    let (load, lat) = grpc_load(srv.port, 3000, 32, Conns::Shared);
    assert_eq!(load["connections"], 1, "{load}");
    let s = summary(&trace.stop(), srv.pid());
    assert_eq!(s["requests"], 3000, "{s}");
    assert_eq!(s["mode"], "grpc", "{s}");
    // Start: the transport's hand-off of the stream; end: the >= 1.69 name.
    assert!(
        s_str(&s, "probes").contains("(serveStreams.func2 .. writeStatus)"),
        "{s}"
    );
    assert_server_le_client("grpc-go multiplexed", &s, &lat);
}

#[test]
fn go_before_1_69_is_probed_on_write_status() {
    let srv = grpc_server(Stack::Go168, 50);
    let trace = Trace::start(&[srv.pid()], &[]);
    let (_, lat) = grpc_load(srv.port, 1000, 16, Conns::Shared);
    let s = summary(&trace.stop(), srv.pid());
    assert_eq!(s["requests"], 1000, "{s}");
    assert_eq!(s["mode"], "grpc", "{s}");
    let probes = s_str(&s, "probes");
    assert!(
        probes.contains("v1.68.") && probes.contains("(serveStreams.func2 .. WriteStatus)"),
        "{s}"
    );
    assert_server_le_client("grpc-go 1.68 multiplexed", &s, &lat);
}

#[test]
fn go_connection_per_call_is_counted_in_connection_mode() {
    let srv = grpc_server(Stack::Go, 50);
    let trace = Trace::start(&[srv.pid()], &[]);
    let (load, _) = grpc_load(srv.port, 400, 8, Conns::PerCall);
    assert_eq!(load["connections"], 400, "{load}");
    let s = summary(&trace.stop(), srv.pid());
    assert_eq!(s["mode"], "connection", "{s}");
    assert_eq!(s["requests"], 400, "{s}");
}

#[test]
fn forced_grpc_mode_counts_calls_whatever_the_connections() {
    let srv = grpc_server(Stack::Go, 0);
    let trace = Trace::start(&[srv.pid()], &["--mode", "grpc"]);
    let (_, lat) = grpc_load(srv.port, 300, 8, Conns::PerCall);
    let s = summary(&trace.stop(), srv.pid());
    assert_eq!(s["mode"], "grpc", "{s}");
    assert_eq!(s["requests"], 300, "{s}");
    assert_server_le_client("grpc-go per call, --mode grpc", &s, &lat);
}

#[test]
fn stripped_go_binary_falls_back_to_turn_with_a_clear_warning() {
    let srv = grpc_server(Stack::GoStripped, 0);
    let trace = Trace::start(&[srv.pid()], &["--mode", "grpc"]);
    grpc_load(srv.port, 200, 8, Conns::Shared);
    let s = summary(&trace.stop(), srv.pid());
    assert_eq!(s["mode"], "turn", "{s}");
    let w = s_str(&s, "warning");
    assert!(
        w.contains("grpc-fixture-server-stripped")
            && w.contains("grpc-go v1.")
            && w.contains("is stripped (no symbol table)")
            && w.ends_with("falling back to turn mode"),
        "{s}"
    );
    assert!(s.get("probes").is_none(), "{s}");
}

#[test]
fn stripped_go_binary_in_auto_mode_warns_and_never_claims_grpc() {
    let srv = grpc_server(Stack::GoStripped, 0);
    let trace = Trace::start(&[srv.pid()], &[]);
    grpc_load(srv.port, 200, 8, Conns::Shared);
    let s = summary(&trace.stop(), srv.pid());
    // One multiplexed connection: turns are the best left (see the warning).
    assert_eq!(s["mode"], "turn", "{s}");
    assert!(
        s_str(&s, "warning").contains("auto mode chooses between connection and turn"),
        "{s}"
    );
}

#[test]
fn ccore_server_with_symbols_is_counted_in_grpc_mode() {
    let srv = grpc_server(Stack::RubyCcore, 50);
    let trace = Trace::start(&[srv.pid()], &[]);
    let (_, lat) = grpc_load(srv.port, 1000, 16, Conns::Shared);
    let s = summary(&trace.stop(), srv.pid());
    assert_eq!(s["requests"], 1000, "{s}");
    assert_eq!(s["mode"], "grpc", "{s}");
    assert!(s_str(&s, "probes").starts_with("gRPC C-core in /"), "{s}");
    assert_server_le_client("gRPC C-core (Ruby) multiplexed", &s, &lat);
}

#[test]
fn python_grpcio_wheel_has_no_symbols_so_grpc_mode_falls_back() {
    // grpcio's manylinux wheel links C-core into cygrpc*.so, stripped: the
    // uprobes have nothing to attach to (checked here, not assumed).
    let srv = grpc_server(Stack::PythonWheel, 0);
    let trace = Trace::start(&[srv.pid()], &["--mode", "grpc"]);
    grpc_load(srv.port, 200, 8, Conns::Shared);
    let s = summary(&trace.stop(), srv.pid());
    assert_eq!(s["mode"], "turn", "{s}");
    let w = s_str(&s, "warning");
    assert!(
        w.contains("cygrpc")
            && w.contains("(gRPC C-core) has no symbol")
            && w.contains("stripped")
            && w.ends_with("falling back to turn mode"),
        "{s}"
    );
}

#[test]
fn grpc_mode_on_a_process_without_grpc_says_so() {
    let srv = memcached(1);
    let trace = Trace::start(&[srv.pid()], &["--mode", "grpc"]);
    memcache_load(srv.port, 2, 50, None);
    let s = summary(&trace.stop(), srv.pid());
    assert_eq!(s["mode"], "turn", "{s}");
    assert_eq!(s["requests"], 100, "{s}");
    assert!(
        s_str(&s, "warning").starts_with("no gRPC server library in pid"),
        "{s}"
    );
}
