//! TLS servers counted exactly (root, real eBPF, nginx over HTTPS with a
//! self-signed certificate made by the test, curl as the client): the
//! handshake's turns are no requests and its time is in no request's
//! latency, keep-alive and connection per request, TLS 1.3 and 1.2.
//! The syscall fallback too. Run alone: `cargo test --release -p qosd-manager --test trace_tls`.

mod support;

use support::*;

#[test]
fn https_keepalive_is_exact() {
    let srv = nginx_tls();
    for tls_max in [None, Some("1.2")] {
        let trace = Trace::start(&[srv.pid()], &[]);
        let lat = curl_https(srv.port, 8, 125, false, tls_max);
        let lines = trace.stop();
        let s = summary(&lines, srv.pid());
        assert_eq!(s["requests"], 1000, "TLS max {tls_max:?}: {s}");
        assert_eq!(s["mode"], "turn", "{s}");
        assert_server_le_client(&format!("HTTPS keep-alive, TLS max {tls_max:?}"), &s, &lat);
    }
}

#[test]
fn https_connection_per_request_is_exact() {
    let srv = nginx_tls();
    for tls_max in [None, Some("1.2")] {
        let trace = Trace::start(&[srv.pid()], &[]);
        let lat = curl_https(srv.port, 4, 100, true, tls_max);
        let lines = trace.stop();
        let s = summary(&lines, srv.pid());
        assert_eq!(s["requests"], 400, "TLS max {tls_max:?}: {s}");
        assert_eq!(s["mode"], "connection", "{s}");
        assert_server_le_client(&format!("HTTPS close, TLS max {tls_max:?}"), &s, &lat);
    }
}

/// The syscall fallback (what 6.1 runs: no socket tracepoints) tells TLS
/// records apart as the socket path does. nginx peeks at a connection's
/// first byte (TLS or plain HTTP?); a peek consumes nothing and is no read,
/// else the connection's first bytes looked like one unknown byte.
#[test]
fn https_on_the_syscall_fallback_is_exact() {
    let srv = nginx_tls();
    let env = [("QOSD_PRETEND_MISSING_TRACEPOINTS", "all")];
    for (close, tls_max) in [
        (false, None),
        (true, None),
        (false, Some("1.2")),
        (true, Some("1.2")),
    ] {
        let trace = Trace::start_env(&[srv.pid()], &[], &env);
        assert_eq!(trace.banner["hooks"], "syscalls", "{}", trace.banner);
        let lat = curl_https(srv.port, 4, 50, close, tls_max);
        let lines = trace.stop();
        let s = summary(&lines, srv.pid());
        let what = format!("syscalls, close {close}, TLS max {tls_max:?}");
        assert_eq!(s["requests"], 200, "{what}: {s}");
        assert_eq!(
            s["mode"],
            if close { "connection" } else { "turn" },
            "{what}: {s}"
        );
        assert_server_le_client(&what, &s, &lat);
    }
}
