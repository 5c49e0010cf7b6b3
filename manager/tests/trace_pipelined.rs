//! Requests counted exactly where several arrive in one read (root, real
//! eBPF, real servers from Debian): redis-benchmark -P 16, HTTP/1.1
//! pipelining against nginx, memcached batches (a storage command's data
//! block passed over, multi-key gets), on the socket path and on the
//! syscall fallback (`--hooks syscalls`).
//! Run alone: `cargo test --release -p qosd-manager --test trace_pipelined`.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use support::*;

/// redis-benchmark with 16 requests pipelined per client: the count is
/// what redis itself says it processed.
#[test]
fn redis_benchmark_pipelined_is_exact() {
    if socket_hooks_missing() {
        return;
    }
    redis_pipelined_is_exact("sockets");
}

/// The socket-path tests ask for `--hooks sockets`, which a kernel without
/// the socket tracepoints (Debian 12's 6.1, in make test-kernels) refuses;
/// the fallback's own test covers it there. Said, not passed silently.
fn socket_hooks_missing() -> bool {
    let missing =
        !std::path::Path::new("/sys/kernel/tracing/events/sock/sock_recv_length").exists();
    if missing {
        println!("SKIP: no sock:sock_recv_length tracepoint: the socket-path tests need it (the syscall fallback's test runs)");
    }
    missing
}

/// The syscall fallback reads the same bytes (the read's buffer is in the
/// syscall's arguments) and counts them with the same code.
#[test]
fn syscall_fallback_counts_pipelined_requests() {
    redis_pipelined_is_exact("syscalls");
    memcached_batches_exact("syscalls");
}

fn redis_pipelined_is_exact(hooks: &str) {
    let srv = redis();
    let before = redis_stat(srv.port, "total_commands_processed");
    let trace = Trace::start(&[srv.pid()], &["--hooks", hooks]);
    assert_eq!(trace.banner["hooks"], hooks, "{}", trace.banner);
    let ok = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &srv.port.to_string()])
        .args(["-c", "4", "-n", "4000", "-P", "16", "-t", "set,get", "-q"])
        .stdout(Stdio::null())
        .status()
        .expect("running redis-benchmark (apt-get install redis-tools)");
    assert!(ok.success());
    let lines = trace.stop();
    // Our own INFO before and the one here: the commands in between.
    let served = redis_stat(srv.port, "total_commands_processed") - before - 1;
    assert!(served >= 8000, "redis served {served}");
    let s = summary(&lines, srv.pid());
    assert_eq!(s["requests"], served, "{hooks}: {s}");
    assert_eq!(s["mode"], "turn", "{hooks}: {s}");
}

/// Batches of 16 HTTP/1.1 requests in one write (a third of them POSTs
/// whose bodies hold "GET "), nginx answering each in turn.
#[test]
fn nginx_http_pipelining_is_exact() {
    let srv = nginx();
    let trace = Trace::start(&[srv.pid()], &[]);
    let lat = http_pipelined(srv.port, 4, 50, 16);
    let lines = trace.stop();
    let s = summary(&lines, srv.pid());
    assert_eq!(s["requests"], 4 * 50 * 16, "{s}");
    assert_eq!(s["mode"], "turn", "{s}");
    // Every reply was followed (bpf/replies.h): none timed by turns.
    assert_eq!(s["timed_by_turns"], 0, "{s}");
    // A request's latency ends with its turn's last reply: never later
    // than the client's whole batch.
    assert_server_le_client("nginx pipelined x16", &s, &lat);
}

/// A HEAD request's reply has a Content-Length and no body, so a
/// connection that reads one is timed by turns from then on, and said so
/// (`timed_by_turns`); its count stays exact, and other connections keep
/// their per-reply times.
#[test]
fn a_head_request_times_its_connection_by_turns_counted() {
    if socket_hooks_missing() {
        return;
    }
    let srv = nginx();
    let trace = Trace::start(&[srv.pid()], &["--hooks", "sockets"]);
    let get = b"GET / HTTP/1.1\r\nHost: qosd\r\n\r\n";
    let mut plain = BufReader::new(connect(srv.port));
    let mut head = BufReader::new(connect(srv.port));
    for i in 0..20 {
        plain.get_mut().write_all(get).unwrap();
        read_http_response(&mut plain);
        if i == 10 {
            head.get_mut()
                .write_all(b"HEAD / HTTP/1.1\r\nHost: qosd\r\n\r\n")
                .unwrap();
            // The head alone: up to its empty line.
            let mut line = String::new();
            while line != "\r\n" {
                line.clear();
                assert!(head.read_line(&mut line).unwrap() > 0, "closed");
            }
        }
        head.get_mut().write_all(get).unwrap();
        read_http_response(&mut head);
    }
    let lines = trace.stop();
    let s = summary(&lines, srv.pid());
    assert_eq!(s["requests"], 41, "{s}");
    assert_eq!(s["timed_by_turns"], 1, "{s}");
}

/// memcached batches of four commands in one write: a set whose data
/// block looks like two gets, a multi-key get, a get and a delete.
#[test]
fn memcached_batches_are_exact() {
    if socket_hooks_missing() {
        return;
    }
    memcached_batches_exact("sockets");
}

fn memcached_batches_exact(hooks: &str) {
    let srv = memcached(2);
    let trace = Trace::start(&[srv.pid()], &["--hooks", hooks]);
    assert_eq!(trace.banner["hooks"], hooks, "{}", trace.banner);
    let lat = memcache_batches(srv.port, 4, 250);
    let lines = trace.stop();
    let s = summary(&lines, srv.pid());
    assert_eq!(s["requests"], 4 * 250 * 4, "{hooks}: {s}");
    assert_eq!(s["mode"], "turn", "{hooks}: {s}");
    assert_server_le_client(&format!("memcached batches of 4 ({hooks})"), &s, &lat);
}
