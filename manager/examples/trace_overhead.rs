//! Benchmark: what `qosd trace` costs a saturated memcached on loopback.
//!
//! Interleaved A/B rounds (A: no tracing, B: `qosd trace` attached as a
//! separate process), each a closed-loop get load from N connections for a
//! fixed time; prints a markdown section with the median throughput ratio,
//! the median client p50 difference and the median ratio of CPU time per
//! request (server + client threads, from schedstat: less disturbed than
//! throughput by other load on a shared machine). Then BPF_STATS traced
//! runs (default 1; 0: none) with the kernel's BPF run-time statistics on
//! give each program's run time per invocation and per request (medians
//! over the runs: less disturbed by other load than one run). ROUNDS 0
//! measures the statistics alone. Run by `make bench`.
//!
//! Usage: trace_overhead [ROUNDS] [SECS_PER_RUN] [CONNECTIONS]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use qosd_sensors::bpfstats::{self, RunStat, StatsOn};
use qosd_sensors::stats::LogHistogram;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// CPU time of every thread of `pid` so far (ns), from schedstat (exact,
/// unlike the tick-rounded utime/stime).
fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// CPU time of the calling thread so far (ns).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// One closed-loop run.
struct Run {
    rps: f64,
    p50_us: f64,
    /// Server + client CPU time per request (µs).
    cpu_us: f64,
    /// The tracer process's CPU time per request (µs; 0 untraced).
    tracer_us: f64,
    requests: u64,
}

/// A closed-loop run; `tracer`: the pid of the `qosd trace` attached.
fn run_load(port: u16, conns: usize, secs: f64, server: u32, tracer: Option<u32>) -> Run {
    let server_cpu0 = process_cpu_ns(server);
    let tracer_cpu0 = tracer.map_or(0, process_cpu_ns);
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
                // A new thread: its CPU time is this run's.
                (n, h, thread_cpu_ns())
            })
        })
        .collect();
    let mut total = 0;
    let mut cpu_ns = 0;
    let mut all = LogHistogram::new();
    for t in threads {
        let (n, h, cpu) = t.join().unwrap();
        total += n;
        cpu_ns += cpu;
        all.merge(&h);
    }
    cpu_ns += process_cpu_ns(server).saturating_sub(server_cpu0);
    let tracer_ns = tracer.map_or(0, |t| process_cpu_ns(t).saturating_sub(tracer_cpu0));
    Run {
        tracer_us: tracer_ns as f64 / 1e3 / total.max(1) as f64,
        rps: total as f64 / secs,
        p50_us: all.percentile(50.0).unwrap_or(0) as f64 / 1e3,
        cpu_us: cpu_ns as f64 / 1e3 / total.max(1) as f64,
        requests: total,
    }
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
    let server = mc.0.id();
    let found_on = stats_off();
    let mut timed_rounds = 0;
    run_load(port, conns, 1.0, server, None); // warm-up
    let mut r = Rounds::default();
    for round in 0..rounds {
        // Alternate which goes first so drift hits both sides alike.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let mut res: [Option<Run>; 2] = [None, None];
        for traced in order {
            let mut t = traced.then(|| start_trace(&qosd, server));
            let pid = t.as_ref().map(Child::id);
            res[usize::from(traced)] = Some(run_load(port, conns, secs, server, pid));
            if pid.is_some_and(|p| bpfstats::timed(&bpfstats::held_by(p))) {
                timed_rounds += 1;
            }
            if let Some(c) = t.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let [Some(a), Some(b)] = res else {
            unreachable!("both sides ran")
        };
        eprintln!(
            "round {round}: off {:.0} rps p50 {:.1} µs cpu {:.2} µs/req | on {:.0} rps p50 {:.1} µs cpu {:.2} µs/req, tracer {:.2} µs/req",
            a.rps, a.p50_us, a.cpu_us, b.rps, b.p50_us, b.cpu_us, b.tracer_us
        );
        r.push(&a, &b);
    }
    let stats_runs: usize = std::env::var("BPF_STATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let stats = (stats_runs > 0).then(|| bpf_stats(&qosd, port, conns, secs, server, stats_runs));
    drop(mc);
    if rounds > 0 {
        r.print_table(rounds, secs, conns);
        println!("{}\n", stats_note(found_on, timed_rounds));
    }
    match stats {
        Some(Ok(text)) => println!("{text}"),
        Some(Err(e)) => println!("BPF run-time statistics not measured: {e}\n"),
        None => {}
    }
}

/// BPF statistics off for the A/B rounds: on, they add two clock reads to
/// every run of every program (~0.4 µs per traced get, server and client,
/// in a profile here), so a sysctl left at 1 by another bench turns into
/// tracing overhead. The sysctl's own reference is dropped here; one held
/// by a process (BPF_ENABLE_STATS) cannot be, and does not show in the
/// sysctl: each traced round checks whether its programs were timed.
fn stats_off() -> &'static str {
    if !bpfstats::clear_leftover_sysctl() {
        return "";
    }
    " (kernel.bpf_stats_enabled was found at 1, left on by another bench: set to 0)"
}

/// The sentence on BPF statistics during the rounds, for the output.
fn stats_note(found_on: &str, timed_rounds: usize) -> String {
    if timed_rounds == 0 {
        return format!("BPF statistics were off during the rounds{found_on}.");
    }
    format!(
        "**BPF statistics were on in {timed_rounds} traced round(s)** (held by another \
         process): every BPF run paid two clock reads there; the figures overstate the \
         overhead{found_on}."
    )
}

/// Per-round figures of both sides.
#[derive(Default)]
struct Rounds {
    ratios: Vec<f64>,
    p50_deltas: Vec<f64>,
    cpu_ratios: Vec<f64>,
    base_rps: Vec<f64>,
    traced_rps: Vec<f64>,
    base_p50: Vec<f64>,
    traced_p50: Vec<f64>,
    base_cpu: Vec<f64>,
    traced_cpu: Vec<f64>,
    tracer_cpu: Vec<f64>,
    tracer_ratios: Vec<f64>,
}

impl Rounds {
    /// The markdown table of BENCHMARKS.md, from the rounds' figures.
    fn print_table(&mut self, rounds: usize, secs: f64, conns: usize) {
        println!("## Request tracing overhead (memcached at saturation)\n");
        println!(
            "Command: `cargo run --release -p qosd-manager --example trace_overhead -- {rounds} {secs} {conns}`\n"
        );
        println!(
            "memcached -t 2 on loopback, closed-loop `get` from {conns} connections, {rounds} interleaved \
             rounds of {secs} s without / with `qosd trace --pid` attached (alternating order). \
             CPU per request is the CPU time (schedstat) of memcached's threads and the client's \
             threads over the run, divided by the requests: unlike throughput it does not count \
             time lost to other load on this shared 2-CPU machine.\n"
        );
        println!("| | without | with `qosd trace` | ratio / delta |");
        println!("|---|---|---|---|");
        println!(
            "| throughput, median (req/s) | {:.0} | {:.0} | **{:.3}** [{:.3}, {:.3}] (median [q1, q3] of per-round ratios) |",
            median(&mut self.base_rps),
            median(&mut self.traced_rps),
            median(&mut self.ratios),
            quantile(&mut self.ratios, 0.25),
            quantile(&mut self.ratios, 0.75),
        );
        println!(
            "| client p50, median (µs) | {:.1} | {:.1} | **{:+.1} µs** (median of per-round deltas) |",
            median(&mut self.base_p50),
            median(&mut self.traced_p50),
            median(&mut self.p50_deltas)
        );
        println!(
            "| CPU per request, server + client, median (µs) | {:.2} | {:.2} | **{:.3}** [{:.3}, {:.3}] (median [q1, q3] of per-round ratios) |",
            median(&mut self.base_cpu),
            median(&mut self.traced_cpu),
            median(&mut self.cpu_ratios),
            quantile(&mut self.cpu_ratios, 0.25),
            quantile(&mut self.cpu_ratios, 0.75),
        );
        println!(
            "| CPU per request of the `qosd trace` process (ring buffer reader, statistics), median (µs) | - | {:.2} | **{:.3}** of the untraced server + client's (median of per-round ratios; not in the row above, which carries the BPF programs' time) |",
            median(&mut self.tracer_cpu),
            median(&mut self.tracer_ratios),
        );
        println!(
            "\nGoal: ratio >= 0.99 and <= +1 µs p50 (the paper reports +8 µs on memcached).\n"
        );
    }

    fn push(&mut self, a: &Run, b: &Run) {
        self.ratios.push(b.rps / a.rps);
        self.p50_deltas.push(b.p50_us - a.p50_us);
        self.cpu_ratios.push(b.cpu_us / a.cpu_us);
        self.base_rps.push(a.rps);
        self.traced_rps.push(b.rps);
        self.base_p50.push(a.p50_us);
        self.traced_p50.push(b.p50_us);
        self.base_cpu.push(a.cpu_us);
        self.traced_cpu.push(b.cpu_us);
        self.tracer_cpu.push(b.tracer_us);
        self.tracer_ratios.push(b.tracer_us / a.cpu_us);
    }
}

/// The p-quantile of v (linear interpolation).
fn quantile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let x = p * (v.len() - 1) as f64;
    let (i, f) = (x.floor() as usize, x - x.floor());
    v[i] + f * (v.get(i + 1).unwrap_or(&v[i]) - v[i])
}

/// One traced run with kernel.bpf_stats_enabled on: the tracer's
/// programs' run counts and times, and the requests served.
fn bpf_stats_run(
    qosd: &str,
    port: u16,
    conns: usize,
    secs: f64,
    server: u32,
) -> Result<(Vec<RunStat>, u64), String> {
    let mut t = start_trace(qosd, server);
    let run = run_load(port, conns, secs, server, None);
    let progs = qosd_sensors::bpfstats::held_by(t.id());
    let _ = t.kill();
    let _ = t.wait();
    let rows: Vec<RunStat> = progs.into_iter().filter(|r| r.runs > 0).collect();
    if rows.is_empty() {
        return Err("no run counts for the tracer's programs".into());
    }
    Ok((rows, run.requests.max(1)))
}

/// `runs` traced runs with kernel.bpf_stats_enabled on: each program's
/// median run count and run time per request, as a markdown table.
fn bpf_stats(
    qosd: &str,
    port: u16,
    conns: usize,
    secs: f64,
    server: u32,
    runs: usize,
) -> Result<String, String> {
    let on = StatsOn::take().map_err(|e| format!("turning BPF statistics on: {e}"))?;
    let results: Vec<_> = (0..runs)
        .map(|_| bpf_stats_run(qosd, port, conns, secs, server))
        .collect();
    drop(on);
    let results = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    // Per program, per run: (runs per request, ns per request).
    let mut per: std::collections::BTreeMap<String, (Vec<f64>, Vec<f64>)> = Default::default();
    let (mut total_runs, mut total_ns, mut requests) = (vec![], vec![], vec![]);
    for (rows, req) in &results {
        let req = *req as f64;
        requests.push(req);
        total_runs.push(rows.iter().map(|r| r.runs).sum::<u64>() as f64 / req);
        total_ns.push(rows.iter().map(|r| r.run_time_ns).sum::<u64>() as f64 / req);
        for r in rows {
            let e = per.entry(r.name.clone()).or_default();
            e.0.push(r.runs as f64 / req);
            e.1.push(r.run_time_ns as f64 / req);
        }
    }
    let mut rows: Vec<(String, f64, f64)> = per
        .into_iter()
        .map(|(name, (mut r, mut n))| (name, median(&mut r), median(&mut n)))
        .collect();
    rows.sort_by(|a, b| b.2.partial_cmp(&a.2).unwrap_or(std::cmp::Ordering::Equal));
    let mut s = format!(
        "BPF run time with kernel.bpf_stats_enabled (median of {runs} traced run(s) of {secs} s, \
         {:.0} requests each (median); the statistics' own clock reads add to the figures; the \
         client's socket events (or, on the syscall hooks, syscalls) run the programs too):\n\n\
         | program | runs per request | ns per run | ns per request |\n|---|---|---|---|\n",
        median(&mut requests)
    );
    let per_run = |runs: f64, ns: f64| if runs > 0.0 { ns / runs } else { 0.0 };
    for (name, r, n) in &rows {
        s += &format!("| {name} | {r:.2} | {:.0} | {n:.0} |\n", per_run(*r, *n));
    }
    let (r, n) = (median(&mut total_runs), median(&mut total_ns));
    let mut sorted = total_ns.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    s += &format!(
        "| **all** | {r:.2} | {:.0} | **{n:.0}** (runs: {}) |\n",
        per_run(r, n),
        sorted
            .iter()
            .map(|v| format!("{v:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(s)
}
