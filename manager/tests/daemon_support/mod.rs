//! Shared by the `qosd run` tests: the daemon as a child process with its
//! stdout collected, HTTP through ureq, a time- and count-bounded
//! memcached load that can report its latencies to the daemon, and
//! readers of a process's CPU affinity and cpuset.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

pub const QOSD: &str = env!("CARGO_BIN_EXE_qosd");

pub fn parties() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/parties.yaml")
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `qosd run` as a child: stdout lines kept, SIGTERM + wait on drop.
pub struct Daemon {
    pub child: Child,
    pub port: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// Starts `qosd run --config CONFIG EXTRA...` and waits (20 s at most)
    /// for its API to answer.
    pub fn start(config: &Path, port: u16, extra: &[&str]) -> Daemon {
        let mut child = Command::new(QOSD)
            .arg("run")
            .arg("--config")
            .arg(config)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("running qosd run");
        let out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l2 = lines.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                eprintln!("qosd| {l}");
                l2.lock().unwrap().push(l);
            }
        });
        let mut d = Daemon { child, port, lines };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if d.try_get("/v1/status").is_some() {
                break;
            }
            if let Some(st) = d.child.try_wait().unwrap() {
                panic!("qosd run exited at start: {st}; output: {:?}", d.output());
            }
            assert!(Instant::now() < deadline, "qosd API not up in 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    pub fn output(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn try_get(&self, path: &str) -> Option<Value> {
        let mut r = agent().get(&self.url(path)).call().ok()?;
        r.body_mut().read_json().ok()
    }

    /// GET, expecting `status`; the JSON body.
    pub fn get_status(&self, path: &str, status: u16) -> Value {
        let mut r = agent().get(&self.url(path)).call().expect("GET");
        assert_eq!(r.status().as_u16(), status, "GET {path}");
        r.body_mut().read_json().expect("JSON body")
    }

    pub fn get(&self, path: &str) -> Value {
        self.get_status(path, 200)
    }

    pub fn get_text(&self, path: &str) -> (String, String) {
        let mut r = agent().get(&self.url(path)).call().expect("GET");
        assert_eq!(r.status().as_u16(), 200, "GET {path}");
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        (ct, r.body_mut().read_to_string().unwrap())
    }

    pub fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let mut r = agent()
            .post(&self.url(path))
            .header("content-type", "application/json")
            .send(body)
            .expect("POST");
        (
            r.status().as_u16(),
            r.body_mut().read_json().expect("JSON body"),
        )
    }

    /// SIGTERM, then the exit status (30 s at most).
    pub fn stop(mut self) -> (std::process::ExitStatus, Vec<String>) {
        signal(self.child.id(), nix::sys::signal::Signal::SIGTERM);
        let st = wait(&mut self.child, Duration::from_secs(30));
        // Let the reader thread drain the last lines.
        std::thread::sleep(Duration::from_millis(200));
        (st, self.output())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            signal(self.child.id(), nix::sys::signal::Signal::SIGTERM);
            let _ = wait_opt(&mut self.child, Duration::from_secs(20));
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn signal(pid: u32, s: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), s);
}

fn wait_opt(c: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn wait(c: &mut Child, limit: Duration) -> std::process::ExitStatus {
    wait_opt(c, limit).expect("qosd did not exit after SIGTERM")
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .http_status_as_error(false)
        .build()
        .into()
}

/// `Cpus_allowed_list` of every thread of `pid`.
pub fn thread_cpus(pid: u32) -> Vec<String> {
    let mut v = Vec::new();
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return v;
    };
    for t in rd.flatten() {
        let s = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        if let Some(l) = s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")) {
            v.push(l.trim().to_owned());
        }
    }
    v
}

/// True once every thread of `pid` may run on exactly `cpus` (a list like "0-1").
pub fn all_threads_on(pid: u32, cpus: &str) -> bool {
    let v = thread_cpus(pid);
    !v.is_empty() && v.iter().all(|c| c == cpus)
}

/// Polls `f` every 50 ms for at most `limit`.
pub fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// Number of CPUs in a list like "0-1,3".
pub fn count_cpus(list: &str) -> usize {
    list.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// The process's cgroup lines (`/proc/PID/cgroup`).
pub fn cgroups(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default()
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

pub fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// A closed-loop memcached load on loopback: `threads` connections doing
/// `get` back to back until stopped, for at most `limit` and at most
/// 2 million requests a thread. With `report_to` (the daemon's port and an
/// app), the client latencies are POSTed to the daemon every 100 ms.
pub struct Load {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<u64>>,
}

impl Load {
    pub fn start(
        port: u16,
        threads: usize,
        limit: Duration,
        report_to: Option<(u16, String)>,
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
        if let Some((dport, app)) = report_to {
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

/// A config for one app in a temp dir: returns its path.
pub struct AppSpec<'a> {
    pub name: &'a str,
    pub matcher: String,
    pub target_us: Option<f64>,
    pub feedback: &'a str,
    pub resources: &'a str,
}

pub fn write_config(dir: &Path, port: u16, apps: &[AppSpec<'_>]) -> PathBuf {
    let mut y = String::from("apps:\n");
    for a in apps {
        y += &format!("  - name: {}\n    match: {}\n", a.name, a.matcher);
        match a.target_us {
            Some(t) => y += &format!("    class: lc\n    target: {{ p99: {t:.0}us }}\n"),
            None => y += "    class: be\n",
        }
        y += &format!(
            "    feedback: {}\n    resources: {}\n",
            a.feedback, a.resources
        );
    }
    y += &format!(
        "policy: {}\napi:\n  listen: 127.0.0.1:{port}\nstate_file: {}\n",
        parties().display(),
        dir.join("state.json").display()
    );
    let p = dir.join("config.yaml");
    std::fs::write(&p, y).unwrap();
    p
}
