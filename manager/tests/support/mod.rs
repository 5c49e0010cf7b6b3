//! Shared by the real (root) integration tests: servers from Debian's
//! packages started on loopback, bounded clients that time every request,
//! and `qosd` run as a child process.
#![allow(dead_code)]

pub mod grpc;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const QOSD: &str = env!("CARGO_BIN_EXE_qosd");
const IO_TIMEOUT: Duration = Duration::from_secs(5);

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed (and reaped) on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
    _dir: Option<tempfile::TempDir>,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_listening(port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("{what} exited at start: {st}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not listen on 127.0.0.1:{port} within 10 s");
}

/// nginx (Debian's nginx-light) as one process (no master), serving a fixed
/// body on 127.0.0.1.
pub fn nginx() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let d = dir.path().display();
    let conf = format!(
        "daemon off; master_process off; worker_processes 1;\n\
         error_log {d}/error.log; pid {d}/nginx.pid;\n\
         events {{ worker_connections 4096; }}\n\
         http {{ access_log off; keepalive_requests 1000000;\n\
           client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};\n\
           uwsgi_temp_path {d}; scgi_temp_path {d};\n\
           server {{ listen 127.0.0.1:{port}; location / {{ return 200 \"hello from nginx\\n\"; }} }} }}\n"
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
    wait_listening(port, &mut child, "nginx");
    Server {
        child,
        port,
        _dir: Some(dir),
    }
}

/// memcached with `threads` worker threads on 127.0.0.1.
pub fn memcached(threads: u32) -> Server {
    let port = free_port();
    let mut child = Command::new("memcached")
        .args(["-u", "nobody", "-l", "127.0.0.1", "-U", "0", "-c", "4096"])
        .args(["-p", &port.to_string(), "-t", &threads.to_string()])
        .stdin(Stdio::null())
        .spawn()
        .expect("starting memcached (apt-get install memcached)");
    wait_listening(port, &mut child, "memcached");
    Server {
        child,
        port,
        _dir: None,
    }
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads one HTTP/1.1 response with a Content-Length body.
fn read_http_response(r: &mut BufReader<TcpStream>) {
    let mut len = 0usize;
    let mut line = String::new();
    loop {
        line.clear();
        let n = r.read_line(&mut line).expect("reading response header");
        assert!(n > 0, "connection closed mid-response");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).expect("reading body");
}

/// `n` HTTP GETs over `concurrency` threads. Keep-alive: one connection per
/// thread; otherwise a new connection (Connection: close) per request.
/// Returns every request's latency as the client saw it.
pub fn http_load(port: u16, n: usize, concurrency: usize, keepalive: bool) -> Vec<Duration> {
    let per = n / concurrency;
    assert_eq!(per * concurrency, n, "n must divide by concurrency");
    let threads: Vec<_> = (0..concurrency)
        .map(|_| {
            std::thread::spawn(move || {
                let mut lat = Vec::with_capacity(per);
                let mut conn = keepalive.then(|| BufReader::new(connect(port)));
                for _ in 0..per {
                    let t0 = Instant::now();
                    if let Some(r) = conn.as_mut() {
                        r.get_mut()
                            .write_all(b"GET / HTTP/1.1\r\nHost: qosd\r\n\r\n")
                            .unwrap();
                        read_http_response(r);
                    } else {
                        let mut s = connect(port);
                        s.write_all(b"GET / HTTP/1.1\r\nHost: qosd\r\nConnection: close\r\n\r\n")
                            .unwrap();
                        let mut buf = Vec::new();
                        s.read_to_end(&mut buf).expect("reading to EOF");
                        assert!(buf.starts_with(b"HTTP/1.1 200"), "bad reply");
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

/// memcached text protocol: `conns` threads, each doing `per_conn`
/// requests (alternating set and get); with `reconnect_every`, a thread
/// closes and reopens its connection after that many requests.
pub fn memcache_load(
    port: u16,
    conns: usize,
    per_conn: usize,
    reconnect_every: Option<usize>,
) -> Vec<Duration> {
    let threads: Vec<_> = (0..conns)
        .map(|c| {
            std::thread::spawn(move || {
                let mut lat = Vec::with_capacity(per_conn);
                let mut r = BufReader::new(connect(port));
                let mut line = String::new();
                for i in 0..per_conn {
                    if reconnect_every.is_some_and(|k| i > 0 && i % k == 0) {
                        r = BufReader::new(connect(port));
                    }
                    let key = format!("k{c}_{}", i / 2);
                    let t0 = Instant::now();
                    if i % 2 == 0 {
                        let cmd = format!("set {key} 0 0 5\r\nhello\r\n");
                        r.get_mut().write_all(cmd.as_bytes()).unwrap();
                        line.clear();
                        r.read_line(&mut line).unwrap();
                        assert_eq!(line, "STORED\r\n");
                    } else {
                        r.get_mut()
                            .write_all(format!("get {key}\r\n").as_bytes())
                            .unwrap();
                        loop {
                            line.clear();
                            assert!(r.read_line(&mut line).unwrap() > 0, "closed");
                            if line == "END\r\n" {
                                break;
                            }
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

/// `qosd trace --json` running as a child; lines are collected as they come.
pub struct Trace {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<serde_json::Value>,
}

impl Trace {
    /// Starts tracing and returns once the first interval line is out (the
    /// programs are attached by then).
    pub fn start(pids: &[u32], extra: &[&str]) -> Trace {
        let mut cmd = Command::new(QOSD);
        cmd.args(["trace", "--json", "--interval", "0.2"]);
        for p in pids {
            cmd.args(["--pid", &p.to_string()]);
        }
        cmd.args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("running qosd");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut t = Trace {
            child,
            lines: rx,
            seen: Vec::new(),
        };
        let first = t
            .lines
            .recv_timeout(Duration::from_secs(20))
            .expect("qosd trace printed nothing within 20 s");
        t.seen
            .push(serde_json::from_str(&first).expect("JSON line"));
        t
    }

    /// Ctrl-C, then every line it printed; the last is the summary.
    pub fn stop(self) -> Vec<serde_json::Value> {
        // Let the last replies reach the ring buffer and an interval pass.
        std::thread::sleep(Duration::from_millis(400));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap();
        self.wait()
    }

    /// Waits (at most 30 s) for qosd to end by itself.
    pub fn wait(mut self) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "qosd trace failed: {st}");
                break;
            }
            assert!(Instant::now() < deadline, "qosd trace did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.seen.push(serde_json::from_str(&l).expect("JSON line"));
        }
        std::mem::take(&mut self.seen)
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The summary line of `pid`.
pub fn summary(lines: &[serde_json::Value], pid: u32) -> serde_json::Value {
    lines
        .iter()
        .rev()
        .find(|v| v["summary"] == true && v["pid"] == pid)
        .cloned()
        .unwrap_or_else(|| panic!("no summary line for pid {pid} in {lines:?}"))
}

/// Nearest-rank percentile of client latencies, µs.
pub fn client_pct(lat: &[Duration], p: f64) -> f64 {
    let mut v: Vec<f64> = lat.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Server-side latency can never exceed what the client saw for the same
/// requests: check p50/p95/p99/max (within the histogram's 0.4 % buckets)
/// and report the p50 gap.
pub fn assert_server_le_client(what: &str, s: &serde_json::Value, lat: &[Duration]) {
    let tol = |c: f64| c * 1.004 + 0.001;
    for (key, p) in [
        ("p50_us", 50.0),
        ("p95_us", 95.0),
        ("p99_us", 99.0),
        ("max_us", 100.0),
    ] {
        let server = s[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{what}: no {key} in {s}"));
        let client = client_pct(lat, p);
        assert!(
            server <= tol(client),
            "{what}: eBPF {key} {server:.1} µs > client {client:.1} µs"
        );
    }
    let (sp, cp) = (s["p50_us"].as_f64().unwrap(), client_pct(lat, 50.0));
    eprintln!(
        "{what}: p50 eBPF {sp:.1} µs, client {cp:.1} µs, gap {:.1} µs ({:.0} %)",
        cp - sp,
        100.0 * (cp - sp) / cp
    );
}

pub fn qosd(args: &[&str]) -> std::process::Output {
    Command::new(QOSD)
        .args(args)
        .output()
        .expect("running qosd")
}

pub fn target_dir_bin() -> PathBuf {
    PathBuf::from(QOSD)
}
