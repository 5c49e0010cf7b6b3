//! Bounded clients for the real tests: HTTP/1.1 and memcached loads that
//! time every request, and a closed-loop memcached load that can report
//! its latencies to a daemon; the `qosd fixture` server. Every loop is
//! bounded in count and time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::agent;

const IO_TIMEOUT: Duration = Duration::from_secs(5);

pub fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads one HTTP/1.1 response with a Content-Length body.
pub fn read_http_response(r: &mut BufReader<TcpStream>) {
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

/// Client latencies of `n` sequential `get` requests on one connection, µs.
pub fn sequential_latencies(port: u16, n: usize) -> Vec<f64> {
    let mut r = BufReader::new(connect(port));
    let mut line = String::new();
    (0..n)
        .map(|_| {
            let t0 = Instant::now();
            r.get_mut().write_all(b"get qosd-key\r\n").unwrap();
            line.clear();
            r.read_line(&mut line).unwrap();
            assert_eq!(line, "END\r\n");
            t0.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

/// A closed-loop memcached load on loopback: `threads` connections doing
/// `get` back to back until stopped, for at most `limit` and at most
/// 2 million requests a thread. With `report_to` (the daemon's port, an
/// app and the API's write token), the client latencies are POSTed to the
/// daemon every 100 ms.
pub struct Load {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<u64>>,
}

impl Load {
    pub fn start(
        port: u16,
        threads: usize,
        limit: Duration,
        report_to: Option<(u16, String, String)>,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<Vec<f64>>();
        let mut handles = Vec::new();
        for _ in 0..threads {
            let stop = stop.clone();
            let tx = report_to.as_ref().map(|_| tx.clone());
            handles.push(std::thread::spawn(move || {
                let deadline = Instant::now() + limit;
                let mut r = BufReader::new(connect(port));
                let mut line = String::new();
                let mut n = 0u64;
                let mut batch = Vec::with_capacity(256);
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && n < 2_000_000 {
                    let t0 = Instant::now();
                    if r.get_mut().write_all(b"get qosd-key\r\n").is_err() {
                        break;
                    }
                    line.clear();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        break;
                    }
                    n += 1;
                    if let Some(tx) = &tx {
                        batch.push(t0.elapsed().as_secs_f64() * 1e6);
                        if batch.len() == 256 {
                            let _ = tx.send(std::mem::take(&mut batch));
                        }
                    }
                }
                if let Some(tx) = &tx {
                    let _ = tx.send(batch);
                }
                n
            }));
        }
        drop(tx);
        if let Some((dport, app, token)) = report_to {
            let stop = stop.clone();
            handles.push(std::thread::spawn(move || {
                let a = agent();
                let url = format!("http://127.0.0.1:{dport}/v1/apps/{app}/latency");
                let mut sent = 0u64;
                loop {
                    let first = match rx.recv_timeout(Duration::from_millis(100)) {
                        Ok(b) => b,
                        Err(mpsc::RecvTimeoutError::Timeout) if !stop.load(Ordering::Relaxed) => {
                            continue
                        }
                        Err(_) => break,
                    };
                    let mut all = first;
                    while let Ok(b) = rx.try_recv() {
                        all.extend(b);
                    }
                    let body = serde_json::json!({ "latencies_us": all }).to_string();
                    let r = a
                        .post(&url)
                        .header("content-type", "application/json")
                        .header("authorization", &format!("Bearer {token}"))
                        .send(&body);
                    assert_eq!(
                        r.map(|r| r.status().as_u16()).unwrap_or(0),
                        200,
                        "POST {url}"
                    );
                    sent += all.len() as u64;
                    std::thread::sleep(Duration::from_millis(100));
                }
                sent
            }));
        }
        Load { stop, handles }
    }

    /// Stops the load; the request count of each thread (and, last, the
    /// latencies reported).
    pub fn stop(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect()
    }
}

/// `qosd fixture --work-us WORK_US` (CPU time burnt per request) on a free
/// loopback port, gone after 60 s at most: (the process, its port).
pub fn fixture(work_us: u64) -> (super::Killed, u16) {
    fixture_lasting(work_us, 60)
}

/// [`fixture`], gone after `secs` at most.
pub fn fixture_lasting(work_us: u64, secs: u64) -> (super::Killed, u16) {
    let mut k = super::Killed::spawn(
        std::process::Command::new(super::QOSD)
            .args(["fixture", "--work-us", &work_us.to_string()])
            .args(["--exit-after-s", &secs.to_string()])
            .stdout(std::process::Stdio::piped()),
    );
    let mut line = String::new();
    BufReader::new(k.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("fixture said {line:?}"));
    (k, port)
}
