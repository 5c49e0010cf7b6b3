//! Benchmark: how close the eBPF latencies come to what clients see, and
//! what the socket hooks cost sockets nobody traces.
//!
//! memcached `-t 1` pinned to CPU 1, clients on CPU 0. First its capacity
//! (closed loop, 8 connections); then paced loads at 50, 80 and 95 % of it,
//! and a closed loop beside a CPU hog (`stress-ng --cpu 1` on CPU 1), each
//! traced by `qosd trace --mode turn`: eBPF p99 from arrival (`latency`)
//! and from the first read (`service`) against the client's p99. The
//! client's own share is measured first: one connection against the idle
//! server, client p50 minus eBPF latency p50; each run also shows that
//! difference under its own load, and the p99 ratio with the idle share
//! taken off the client's p99 (labelled as such). Last, with kernel.bpf_stats
//! on and `qosd trace` attached to an idle process, the run time of each
//! program while an untraced memcached serves load: what every socket event
//! of untraced sockets costs. Prints a markdown section (`make bench`).
//!
//! Usage: trace_accuracy [SECS_PER_RUN] [HOOKS: sockets|syscalls]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use qosd_sensors::stats::LogHistogram;

/// Children go away with the benchmark, even when it panics.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pin_self(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
}

fn memcached(cpu: &str) -> (KillOnDrop, u16) {
    let port = qosd_scenarios::servers::free_port().expect("a free loopback port");
    let c = Command::new("taskset")
        .args(["-c", cpu])
        .args(qosd_scenarios::servers::memcached_argv(port, 1, 64))
        .stdin(Stdio::null())
        .spawn()
        .expect("memcached");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "memcached did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (KillOnDrop(c), port)
}

/// `conns` connections doing gets for `secs`; `rate` (total requests/s)
/// paces them, `None` is a closed loop. Returns (client histogram ns,
/// requests/s).
fn load(port: u16, conns: usize, secs: f64, rate: Option<f64>) -> (LogHistogram, f64) {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let threads: Vec<_> = (0..conns)
        .map(|c| {
            std::thread::spawn(move || {
                pin_self(0);
                let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                s.set_nodelay(true).unwrap();
                let mut r = BufReader::new(s);
                let key = format!("acc{c}");
                r.get_mut()
                    .write_all(format!("set {key} 0 0 8\r\nxxxxxxxx\r\n").as_bytes())
                    .unwrap();
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                let get = format!("get {key}\r\n");
                let gap = rate.map(|r| Duration::from_secs_f64(conns as f64 / r));
                let mut h = LogHistogram::new();
                let mut next = Instant::now();
                while Instant::now() < deadline && h.len() < 10_000_000 {
                    if let Some(g) = gap {
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        }
                        next += g;
                    }
                    let t0 = Instant::now();
                    r.get_mut().write_all(get.as_bytes()).unwrap();
                    loop {
                        line.clear();
                        r.read_line(&mut line).unwrap();
                        if line == "END\r\n" || line.is_empty() {
                            break;
                        }
                    }
                    h.record(t0.elapsed().as_nanos() as u64);
                }
                h
            })
        })
        .collect();
    let mut all = LogHistogram::new();
    for t in threads {
        all.merge(&t.join().unwrap());
    }
    let rps = all.len() as f64 / start.elapsed().as_secs_f64();
    (all, rps)
}

/// `qosd trace` of `pid` around `f`; its summary line.
fn traced<T>(qosd: &str, pid: u32, hooks: &str, f: impl FnOnce() -> T) -> (T, serde_json::Value) {
    let mut c = Command::new(qosd)
        .args(["trace", "--json", "--mode", "turn", "--interval", "5"])
        .args(["--hooks", hooks, "--pid", &pid.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("qosd trace");
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap(); // the banner: attached
    let r = f();
    std::thread::sleep(Duration::from_millis(300));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(c.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let mut summary = serde_json::Value::Null;
    for l in out.lines().map_while(Result::ok) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) {
            if v["summary"] == true {
                summary = v;
            }
        }
    }
    let _ = c.wait();
    (r, summary)
}

fn us(h: &LogHistogram, p: f64) -> f64 {
    h.percentile(p).unwrap_or(0) as f64 / 1e3
}

/// One table row; `idle_own_us`: the client's own share measured against
/// the idle server (client p50 - eBPF latency p50).
fn row(
    what: &str,
    rps: f64,
    client: &LogHistogram,
    s: &serde_json::Value,
    idle_own_us: f64,
) -> String {
    let c99 = us(client, 99.0);
    let a99 = s["p99_us"].as_f64().unwrap_or(f64::NAN);
    let s99 = s["svc_p99_us"].as_f64().unwrap_or(f64::NAN);
    // The client's share in this very run, at the median: what the client
    // saw beyond the server node's latency.
    let own50 = us(client, 50.0) - s["p50_us"].as_f64().unwrap_or(f64::NAN);
    format!(
        "| {what} | {rps:.0} | {c99:.0} | {a99:.0} | {s99:.0} | **{:.2}** | {:.3} | {own50:.0} | {:.2} |\n",
        a99 / c99,
        s99 / c99,
        a99 / (c99 - idle_own_us),
    )
}

/// Per-program run counts and ns per run while an untraced memcached
/// serves a closed loop and `qosd trace` follows an idle process.
fn untraced_cost(qosd: &str, hooks: &str, secs: f64) -> Result<String, String> {
    let idle = KillOnDrop(
        Command::new("sleep")
            .arg("600")
            .spawn()
            .map_err(|e| e.to_string())?,
    );
    let (_srv, port) = memcached("1");
    let mut t = Command::new(qosd)
        .args(["trace", "--json", "--hooks", hooks, "--interval", "5"])
        .args(["--pid", &idle.0.id().to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut first = String::new();
    BufReader::new(t.stdout.as_mut().ok_or("no stdout")?)
        .read_line(&mut first)
        .map_err(|e| e.to_string())?;
    let on = qosd_sensors::bpfstats::StatsOn::take()
        .map_err(|e| format!("turning BPF statistics on: {e}"))?;
    let (h, _) = load(port, 8, secs, None);
    let progs = qosd_sensors::bpfstats::held_by(t.id());
    drop(on);
    let _ = t.kill();
    let _ = t.wait();
    let req = h.len().max(1) as f64;
    let mut s = format!(
        "
BPF run time on **untraced** sockets ({hooks} hooks; kernel.bpf_stats_enabled, \
         `qosd trace` on an idle process, an untraced memcached serving {} gets in {secs} s; \
         the statistics' own clock reads add to the figures):\n\n\
         | program | runs | runs per get | ns per run | ns per get |\n|---|---|---|---|---|\n",
        h.len()
    );
    for p in &progs {
        let (cnt, ns) = (p.runs, p.run_time_ns);
        if cnt > 0 {
            s += &format!(
                "| {} | {cnt} | {:.2} | {:.0} | {:.0} |\n",
                p.name,
                cnt as f64 / req,
                ns as f64 / cnt as f64,
                ns as f64 / req
            );
        }
    }
    Ok(s)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3.0);
    let hooks = args.get(2).cloned().unwrap_or_else(|| "sockets".into());
    let qosd = std::env::var("QOSD").unwrap_or_else(|_| "target/release/qosd".into());
    let (srv, port) = memcached("1");
    let pid = srv.0.id();
    let (_, cap) = load(port, 8, 2.0, None);
    // The client's own share first: one connection, idle server.
    let ((h, _), sum) = traced(&qosd, pid, &hooks, || {
        load(port, 1, secs.min(2.0), Some(2000.0))
    });
    let (idle_c50, idle_e50) = (us(&h, 50.0), sum["p50_us"].as_f64().unwrap_or(f64::NAN));
    let idle_own = idle_c50 - idle_e50;
    let mut s = format!(
        "### eBPF latency against the client's ({hooks} hooks)\n\n\
         memcached -t 1 on CPU 1, clients on CPU 0, {secs} s per run; capacity \
         (closed loop, 8 connections) {cap:.0} gets/s. p99 in µs; ratios to the client's p99.\n\n\
         The client's own share (the client and the loopback stack, outside the server node's \
         latency), measured against the idle server (1 connection, 2000 gets/s): client p50 \
         {idle_c50:.1} µs, eBPF latency p50 {idle_e50:.1} µs: **{idle_own:.1} µs**. Per run, \
         `client - eBPF p50` is the same difference under that run's load (it grows with \
         load: the clients share CPU 0 and wait for it too). The last column subtracts the \
         idle share from the client's p99, a lower bound on the client's share at p99 \
         (labelled as such, not a measured per-request figure).\n\n\
         | load | gets/s | client p99 | eBPF latency p99 | eBPF service p99 | latency/client | service/client | client - eBPF p50 (µs, this run) | latency / (client p99 - idle share) |\n\
         |---|---|---|---|---|---|---|---|---|\n"
    );
    for pct in [50.0, 80.0, 95.0] {
        let ((h, rps), sum) = traced(&qosd, pid, &hooks, || {
            load(port, 8, secs, Some(cap * pct / 100.0))
        });
        s += &row(&format!("{pct:.0} % of capacity"), rps, &h, &sum, idle_own);
    }
    {
        let _hog = KillOnDrop(
            Command::new("stress-ng")
                .args(["--cpu", "1", "--taskset", "1", "--timeout", "300"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("stress-ng"),
        );
        std::thread::sleep(Duration::from_millis(300));
        let ((h, rps), sum) = traced(&qosd, pid, &hooks, || load(port, 16, secs, None));
        s += &row(
            "closed loop, 16 conns, CPU hog on CPU 1",
            rps,
            &h,
            &sum,
            idle_own,
        );
    }
    drop(srv);
    match untraced_cost(&qosd, &hooks, secs) {
        Ok(t) => s += &t,
        Err(e) => s += &format!("\nBPF cost on untraced sockets: not measured ({e}).\n"),
    }
    println!("{s}");
}
