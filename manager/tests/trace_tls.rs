//! TLS servers counted exactly (root, real eBPF, nginx over HTTPS with a
//! self-signed certificate made by the test, curl as the client): the
//! handshake's turns are no requests and its time is in no request's
//! latency, keep-alive and connection per request, TLS 1.3 and 1.2.
//! Run alone: `cargo test --release -p qosd-manager --test trace_tls`.

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
