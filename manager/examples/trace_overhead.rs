//! Benchmark: what `qosd trace` costs a saturated memcached on loopback.
//!
//! Interleaved A/B rounds (A: no tracing, B: `qosd trace` attached as a
//! separate process), each a closed-loop get load from N connections for a
//! fixed time; prints a markdown section with the median throughput ratio
//! and the median client p50 difference. Run by `make bench`.
//!
//! Usage: trace_overhead [ROUNDS] [SECS_PER_RUN] [CONNECTIONS]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use qosd_sensors::stats::LogHistogram;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One closed-loop run: (requests per second, client p50 µs).
fn run_load(port: u16, conns: usize, secs: f64) -> (f64, f64) {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let threads: Vec<_> = (0..conns)
        .map(|c| {
            std::thread::spawn(move || {
                let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                s.set_nodelay(true).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut r = BufReader::new(s);
                let key = format!("bench{c}");
                r.get_mut()
                    .write_all(format!("set {key} 0 0 32\r\n{}\r\n", "x".repeat(32)).as_bytes())
                    .unwrap();
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                let get = format!("get {key}\r\n");
                let mut h = LogHistogram::new();
                let mut n = 0u64;
                // Bounded by time and by count.
                while Instant::now() < deadline && n < 50_000_000 {
                    let t0 = Instant::now();
                    r.get_mut().write_all(get.as_bytes()).unwrap();
                    loop {
                        line.clear();
                        r.read_line(&mut line).unwrap();
                        if line == "END\r\n" {
                            break;
                        }
                    }
                    h.record(t0.elapsed().as_nanos() as u64);
                    n += 1;
                }
                (n, h)
            })
        })
        .collect();
    let mut total = 0;
    let mut all = LogHistogram::new();
    for t in threads {
        let (n, h) = t.join().unwrap();
        total += n;
        all.merge(&h);
    }
    (
        total as f64 / secs,
        all.percentile(50.0).unwrap_or(0) as f64 / 1e3,
    )
}

/// The server goes away with the benchmark, even when it panics.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn start_trace(qosd: &str, pid: u32) -> Child {
    let mut c = Command::new(qosd)
        .args([
            "trace",
            "--pid",
            &pid.to_string(),
            "--interval",
            "1",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("running qosd");
    // Wait for the first line: the programs are attached by then.
    let mut first = String::new();
    BufReader::new(c.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    c
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let secs: f64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(4.0);
    let conns: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(8);
    let qosd = std::env::var("QOSD").unwrap_or_else(|_| "target/release/qosd".into());
    let port = free_port();
    let mc = Command::new("memcached")
        .args([
            "-u",
            "nobody",
            "-l",
            "127.0.0.1",
            "-t",
            "2",
            "-p",
            &port.to_string(),
        ])
        .spawn()
        .expect("memcached");
    let mc = KillOnDrop(mc);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(20));
    }
    run_load(port, conns, 1.0); // warm-up
    let (mut ratios, mut p50_deltas, mut base_rps, mut traced_rps) =
        (vec![], vec![], vec![], vec![]);
    let (mut base_p50, mut traced_p50) = (vec![], vec![]);
    for round in 0..rounds {
        // Alternate which goes first so drift hits both sides alike.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let mut res = [(0.0, 0.0); 2];
        for traced in order {
            let mut t = traced.then(|| start_trace(&qosd, mc.0.id()));
            res[usize::from(traced)] = run_load(port, conns, secs);
            if let Some(c) = t.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let ((a_rps, a_p50), (b_rps, b_p50)) = (res[0], res[1]);
        eprintln!("round {round}: off {a_rps:.0} rps p50 {a_p50:.1} µs | on {b_rps:.0} rps p50 {b_p50:.1} µs");
        ratios.push(b_rps / a_rps);
        p50_deltas.push(b_p50 - a_p50);
        base_rps.push(a_rps);
        traced_rps.push(b_rps);
        base_p50.push(a_p50);
        traced_p50.push(b_p50);
    }
    drop(mc);
    println!("## Request tracing overhead (memcached at saturation)\n");
    println!(
        "Command: `cargo run --release -p qosd-manager --example trace_overhead -- {rounds} {secs} {conns}`\n"
    );
    println!(
        "memcached -t 2 on loopback, closed-loop `get` from {conns} connections, {rounds} interleaved \
         rounds of {secs} s without / with `qosd trace --pid` attached (alternating order).\n"
    );
    println!("| | without | with `qosd trace` | ratio / delta |");
    println!("|---|---|---|---|");
    println!(
        "| throughput, median (req/s) | {:.0} | {:.0} | **{:.3}** (median of per-round ratios) |",
        median(&mut base_rps),
        median(&mut traced_rps),
        median(&mut ratios)
    );
    println!(
        "| client p50, median (µs) | {:.1} | {:.1} | **{:+.1} µs** (median of per-round deltas) |",
        median(&mut base_p50),
        median(&mut traced_p50),
        median(&mut p50_deltas)
    );
    println!("\nGoal: ratio >= 0.99 and <= +1 µs p50 (the paper reports +8 µs on memcached).\n");
}
