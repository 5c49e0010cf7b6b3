//! `--aggregate kernel` against `--aggregate records` on the very same
//! requests (root, real eBPF, memcached from Debian): two `qosd trace` run
//! side by side on one server, each with its own programs and maps, and
//! their counts and figures are compared.
//! Run alone: `cargo test --release -p qosd-manager --test trace_aggregate`.
//! Every other trace test runs in kernel mode with QOSD_AGGREGATE=kernel
//! (`make test` does both).

mod support;

use support::*;

/// The kernel histograms' bucket error (bpf/agg.h: width <= 1/128 of the
/// value, reported as the midpoint) on each side, plus the two tracers'
/// own clock reads: each program reads the clock itself, the second one
/// a few hundred ns after the first at both ends of a request.
fn close(kernel: f64, records: f64) -> bool {
    (kernel - records).abs() <= 0.008 * records + 3.0
}

#[test]
fn kernel_figures_match_records_on_memcached() {
    let srv = memcached(2);
    let rec = Trace::start(&[srv.pid()], &["--aggregate", "records"]);
    let ker = Trace::start(&[srv.pid()], &["--aggregate", "kernel"]);
    assert_eq!(rec.banner["aggregate"], "records", "{}", rec.banner);
    assert_eq!(ker.banner["aggregate"], "kernel", "{}", ker.banner);
    let lat = memcache_load(srv.port, 4, 1000, None);
    let (rec, ker) = (rec.stop(), ker.stop());
    let (r, k) = (summary(&rec, srv.pid()), summary(&ker, srv.pid()));
    assert_eq!(r["requests"], lat.len(), "records: {r}");
    assert_eq!(k["requests"], lat.len(), "kernel: {k}");
    assert_eq!(k["mode"], "turn", "{k}");
    for key in [
        "mean_us",
        "p50_us",
        "p95_us",
        "p99_us",
        "svc_mean_us",
        "svc_p50_us",
        "svc_p95_us",
        "svc_p99_us",
    ] {
        let (kv, rv) = (k[key].as_f64(), r[key].as_f64());
        let (Some(kv), Some(rv)) = (kv, rv) else {
            panic!("{key} missing: kernel {k}, records {r}");
        };
        assert!(close(kv, rv), "{key}: kernel {kv} µs, records {rv} µs");
    }
    assert_server_le_client("memcached, kernel aggregation", &k, &lat);
}
