//! Servers and clients for the exact-count tests of pipelined, pre-fork
//! and TLS servers: redis, a pre-fork perl server, nginx over HTTPS with a
//! self-signed certificate made by `openssl`, and clients that pipeline
//! HTTP/1.1 requests and memcached batches (bounded in count and time).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{connect, free_port, read_http_response, wait_listening, Server};

/// redis-server on 127.0.0.1, no persistence.
pub fn redis() -> Server {
    let port = free_port();
    let mut child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .stdout(Stdio::null())
        .stdin(Stdio::null())
        .spawn()
        .expect("starting redis-server (apt-get install redis-server)");
    wait_listening(port, &mut child, "redis-server");
    Server {
        child,
        port,
        _dir: None,
    }
}

/// One counter of redis's `INFO stats` (read on a connection of its own).
pub fn redis_stat(port: u16, key: &str) -> u64 {
    let mut c = BufReader::new(connect(port));
    c.get_mut().write_all(b"INFO stats\r\n").unwrap();
    let mut line = String::new();
    c.read_line(&mut line).unwrap();
    let len: usize = line.trim_start_matches('$').trim().parse().unwrap();
    let mut body = vec![0; len + 2];
    c.read_exact(&mut body).unwrap();
    let text = String::from_utf8_lossy(&body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in INFO stats: {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// The pre-fork server of `support/prefork.pl`: `workers` processes that
/// answer one request per connection and close it, each replaced by a
/// fresh fork after `per_child` connections.
pub fn prefork(workers: u32, per_child: u32) -> Server {
    let port = free_port();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/prefork.pl");
    let mut child = Command::new("perl")
        .arg(script)
        .args([port.to_string(), workers.to_string(), per_child.to_string()])
        .stdin(Stdio::null())
        // Its own process group: Server's drop takes the workers too.
        .process_group(0)
        .spawn()
        .expect("starting perl");
    wait_listening(port, &mut child, "prefork.pl");
    Server {
        child,
        port,
        _dir: None,
    }
}

/// The HTTP/1.1 server of `support/replies.pl`: replies by path that the
/// request sensor follows (a 1xx before the reply, a 304 with a
/// Content-Length) or gives up on (chunked).
pub fn replies_server() -> Server {
    let port = free_port();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/replies.pl");
    let mut child = Command::new("perl")
        .arg(script)
        .arg(port.to_string())
        .stdin(Stdio::null())
        .spawn()
        .expect("starting perl");
    wait_listening(port, &mut child, "replies.pl");
    Server {
        child,
        port,
        _dir: None,
    }
}

use std::os::unix::process::CommandExt;

/// nginx (one process) serving HTTPS on 127.0.0.1 with a self-signed
/// P-256 certificate made here with `openssl`.
pub fn nginx_tls() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let d = dir.path().display();
    let ok = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=localhost"])
        .arg("-keyout")
        .arg(dir.path().join("key.pem"))
        .arg("-out")
        .arg(dir.path().join("cert.pem"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("running openssl");
    assert!(ok.success(), "openssl req failed");
    let conf = format!(
        "daemon off; master_process off; worker_processes 1;\n\
         error_log {d}/error.log; pid {d}/nginx.pid;\n\
         events {{ worker_connections 4096; }}\n\
         http {{ access_log off; keepalive_requests 1000000;\n\
           client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};\n\
           uwsgi_temp_path {d}; scgi_temp_path {d};\n\
           server {{ listen 127.0.0.1:{port} ssl;\n\
             ssl_certificate {d}/cert.pem; ssl_certificate_key {d}/key.pem;\n\
             ssl_protocols TLSv1.2 TLSv1.3;\n\
             location / {{ return 200 \"hello from nginx over TLS\\n\"; }} }} }}\n"
    );
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let mut child = Command::new("nginx")
        .arg("-c")
        .arg(&path)
        .arg("-p")
        .arg(dir.path())
        .stdin(Stdio::null())
        .spawn()
        .expect("starting nginx (apt-get install nginx-light)");
    wait_listening(port, &mut child, "nginx (TLS)");
    Server {
        child,
        port,
        _dir: Some(dir),
    }
}

/// HTTPS GETs with curl: `conns` curl processes at once, each doing
/// `per_conn` requests, on one keep-alive connection or (with `close`) a
/// connection per request; `tls_max` caps the version ("1.2"). Returns
/// each request's latency as curl saw it (from the request's start, TLS
/// handshake included for a new connection).
pub fn curl_https(
    port: u16,
    conns: usize,
    per_conn: usize,
    close: bool,
    tls_max: Option<&str>,
) -> Vec<Duration> {
    let url = format!("https://127.0.0.1:{port}/");
    let kids: Vec<_> = (0..conns)
        .map(|_| {
            let mut cmd = Command::new("curl");
            cmd.args(["-s", "-k", "--http1.1", "--max-time", "60"])
                .args(["-w", "%{http_code} %{time_total}\\n"]);
            if close {
                cmd.args(["-H", "Connection: close"]);
            }
            if let Some(v) = tls_max {
                cmd.args(["--tls-max", v]);
            }
            for _ in 0..per_conn {
                cmd.args(["-o", "/dev/null", &url]);
            }
            cmd.stdout(Stdio::piped())
                .spawn()
                .expect("running curl (apt-get install curl)")
        })
        .collect();
    let mut lat = Vec::with_capacity(conns * per_conn);
    for k in kids {
        let out = k.wait_with_output().unwrap();
        assert!(out.status.success(), "curl failed: {}", out.status);
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            let (code, secs) = l.split_once(' ').expect("curl -w line");
            assert_eq!(code, "200", "{l}");
            lat.push(Duration::from_secs_f64(secs.parse().unwrap()));
        }
    }
    assert_eq!(lat.len(), conns * per_conn, "every request answered");
    lat
}

/// HTTP/1.1 pipelining: `conns` threads, each writing `batches` batches of
/// `depth` requests in one write (a GET, and every third a POST with a
/// body, to walk past bodies) and then reading the `depth` responses.
/// Returns the latency of each batch.
pub fn http_pipelined(port: u16, conns: usize, batches: usize, depth: usize) -> Vec<Duration> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let threads: Vec<_> = (0..conns)
        .map(|_| {
            std::thread::spawn(move || {
                let mut r = BufReader::new(connect(port));
                let mut lat = Vec::with_capacity(batches);
                for _ in 0..batches {
                    assert!(Instant::now() < deadline, "pipelined load too slow");
                    let mut batch = Vec::new();
                    for i in 0..depth {
                        if i % 3 == 2 {
                            batch.extend_from_slice(
                                b"POST / HTTP/1.1\r\nHost: qosd\r\ncontent-length: 11\r\n\r\nhello\r\nGET ",
                            );
                        } else {
                            batch.extend_from_slice(b"GET / HTTP/1.1\r\nHost: qosd\r\n\r\n");
                        }
                    }
                    let t0 = Instant::now();
                    r.get_mut().write_all(&batch).unwrap();
                    for _ in 0..depth {
                        read_http_response(&mut r);
                    }
                    lat.push(t0.elapsed());
                }
                lat
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

/// memcached batches: `conns` threads, each writing `batches` batches in
/// one write: a set (its data block holding "get" and CRLFs, to be passed
/// over unread), a multi-key get, a single get, a delete; then reading the
/// four replies. Returns the latency of each batch (4 requests).
pub fn memcache_batches(port: u16, conns: usize, batches: usize) -> Vec<Duration> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let threads: Vec<_> = (0..conns)
        .map(|c| {
            std::thread::spawn(move || {
                let mut r = BufReader::new(connect(port));
                let mut lat = Vec::with_capacity(batches);
                let mut line = String::new();
                for b in 0..batches {
                    assert!(Instant::now() < deadline, "memcached batches too slow");
                    let k = format!("q{c}_{b}");
                    let value = "get x\r\nget y\r\n";
                    let batch = format!(
                        "set {k} 0 0 {}\r\n{value}\r\nget {k} {k}a {k}b\r\nget {k}\r\ndelete {k}\r\n",
                        value.len()
                    );
                    let t0 = Instant::now();
                    r.get_mut().write_all(batch.as_bytes()).unwrap();
                    let mut want = ["STORED", "END", "END", "DELETED"].into_iter();
                    let mut next = want.next();
                    while let Some(w) = next {
                        line.clear();
                        assert!(r.read_line(&mut line).unwrap() > 0, "closed");
                        if line.trim_end() == w {
                            next = want.next();
                        }
                    }
                    lat.push(t0.elapsed());
                }
                lat
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}
