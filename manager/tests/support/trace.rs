//! `qosd trace --json` as a child for the real tests, and the checks of
//! its figures against what the client saw.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{percentile, QOSD};

/// `qosd trace --json` running as a child; lines are collected as they come.
pub struct Trace {
    /// The first line: which hooks are in use (`hooks`, `banner`).
    pub banner: serde_json::Value,
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<serde_json::Value>,
}

impl Trace {
    /// Starts tracing and returns once the first interval line is out (the
    /// programs are attached by then).
    pub fn start(pids: &[u32], extra: &[&str]) -> Trace {
        Trace::start_env(pids, extra, &[])
    }

    /// `start` with environment variables for qosd alone (never
    /// `std::env::set_var`: the process-wide environment leaks into the
    /// qosd of every test running alongside).
    pub fn start_env(pids: &[u32], extra: &[&str], env: &[(&str, &str)]) -> Trace {
        let mut cmd = Command::new(QOSD);
        cmd.envs(env.iter().copied());
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
        let first = rx
            .recv_timeout(super::patience(Duration::from_secs(20)))
            .expect("qosd trace printed nothing in time (20 s, x4 in the kernel matrix)");
        let banner: serde_json::Value = serde_json::from_str(&first).expect("JSON line");
        assert!(banner["hooks"].is_string(), "first line: {banner}");
        // The banner comes once the programs are attached; wait for the
        // first interval line too, as before.
        let mut t = Trace {
            banner,
            child,
            lines: rx,
            seen: Vec::new(),
        };
        let first = t
            .lines
            .recv_timeout(super::patience(Duration::from_secs(20)))
            .expect("qosd trace printed no interval line in time (20 s, x4 in the kernel matrix)");
        t.seen
            .push(serde_json::from_str(&first).expect("JSON line"));
        t
    }

    /// The `qosd trace` process.
    pub fn pid(&self) -> u32 {
        self.child.id()
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
    let v: Vec<f64> = lat.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    percentile(&v, p)
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
