//! qosd's fixture under an open-loop load near its capacity, traced in
//! both aggregation modes (`trace_loaded.rs`, `trace_saturated.rs`): the
//! fixture pinned to one CPU, its capacity measured from its CPU time per
//! request at a light load (operational analysis: X_sat = 1 / D), then
//! `qosd load` on another CPU with requests pipelined on 8 keep-alive
//! connections, as a calibration or a replay loads it.

use super::{fixture_lasting, summary, text, Killed, Trace, QOSD};

/// The fixture's CPU work per request, µs.
pub const WORK_US: u64 = 1000;

/// CPU seconds `pid` has used: qosd's own reader (its CPU clock, to the
/// nanosecond; `stat`'s truncated clock ticks are ±2 ticks a reading).
fn cpu_s(pid: u32) -> f64 {
    qosd_sensors::procfs::Procfs::new("/")
        .process_cpu_s(pid as i32)
        .expect("reading the fixture's CPU time")
        .expect("the fixture is running")
}

/// `qosd load` on CPU `cpu` (HTTP keep-alive, 8 connections, Poisson):
/// its final report.
fn load(port: u16, rps: f64, secs: u32, cpu: usize) -> serde_json::Value {
    let o = std::process::Command::new("taskset")
        .args(["-c", &cpu.to_string(), QOSD, "load", "--protocol", "http"])
        .args(["--target", &format!("127.0.0.1:{port}")])
        .args([
            "--rps",
            &format!("{rps:.0}"),
            "--duration",
            &secs.to_string(),
        ])
        .args(["--keepalive", "--connections", "8", "--json"])
        .output()
        .expect("running qosd load under taskset");
    assert!(o.status.success(), "qosd load: {}", text(&o.stderr));
    let last = text(&o.stdout)
        .lines()
        .rev()
        .find(|l| l.contains("achieved_rps"))
        .map(str::to_owned)
        .expect("a load report");
    serde_json::from_str(&last).expect("JSON report")
}

/// The CPUs this process may use.
fn allowed_cpus() -> Vec<usize> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).expect("affinity");
    (0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect()
}

/// One traced load: the aggregation mode, the load's report and the
/// trace's summary line.
pub struct LoadedRun {
    pub aggregate: &'static str,
    pub load: serde_json::Value,
    pub summary: serde_json::Value,
}

impl LoadedRun {
    /// The client's p99 and the eBPF p99 over the same requests, µs.
    pub fn p99s(&self) -> (f64, f64) {
        (
            self.load["latency_us"]["p99"].as_f64().unwrap(),
            self.summary["p99_us"].as_f64().unwrap(),
        )
    }
}

/// The fixture at `share` of its measured capacity for 6 s, traced in
/// each aggregation mode. A run whose client gave up on some requests (the
/// server fell behind: something else took its CPU) is run again a fifth
/// lighter, down to half of `share`.
pub fn loaded_runs(share: f64) -> Vec<LoadedRun> {
    let cpus = allowed_cpus();
    assert!(cpus.len() >= 2, "needs 2 CPUs (server and client apart)");
    let (server_cpu, client_cpu) = (cpus[cpus.len() - 1], cpus[0]);
    // Long enough for both modes with their retries and drains.
    let (fx, port): (Killed, u16) = fixture_lasting(WORK_US, 180);
    let pid = fx.0.id();
    let pinned = std::process::Command::new("taskset")
        .args(["-pc", &server_cpu.to_string(), &pid.to_string()])
        .output()
        .expect("taskset");
    assert!(pinned.status.success(), "{}", text(&pinned.stderr));
    let before = cpu_s(pid);
    let light = load(port, 200.0, 3, client_cpu);
    let done = light["completed"].as_f64().unwrap();
    let demand_s = (cpu_s(pid) - before) / done;
    let capacity = 1.0 / demand_s;
    eprintln!(
        "fixture: {:.0} us CPU per request, capacity {capacity:.0} rps; load {:.0} rps",
        demand_s * 1e6,
        share * capacity
    );
    assert!(
        (0.5..2.0).contains(&(demand_s * 1e6 / WORK_US as f64)),
        "CPU per request {demand_s} s for {WORK_US} us of work"
    );
    let mut runs = Vec::new();
    for aggregate in ["records", "kernel"] {
        let mut rps = share * capacity;
        let run = loop {
            let trace = Trace::start(&[pid], &["--aggregate", aggregate]);
            let r = load(port, rps, 6, client_cpu);
            let s = summary(&trace.stop(), pid);
            let errors = r["scheduled"].as_u64().unwrap() - r["completed"].as_u64().unwrap();
            if errors == 0 || rps < 0.5 * share * capacity {
                break LoadedRun {
                    aggregate,
                    load: r,
                    summary: s,
                };
            }
            eprintln!("{aggregate}: {errors} requests unanswered at {rps:.0} rps (a busy machine); again lighter");
            rps *= 0.8;
            drain(errors, demand_s);
        };
        let (client, ebpf) = run.p99s();
        eprintln!(
            "{aggregate}: {rps:.0} rps, p99 eBPF {ebpf:.0} us, client {client:.0} us ({} requests)",
            run.load["completed"]
        );
        assert_eq!(
            run.summary["requests"], run.load["completed"],
            "{aggregate}: {}",
            run.summary
        );
        assert_eq!(
            run.load["completed"], run.load["scheduled"],
            "{aggregate}: the server fell behind: {}",
            run.load
        );
        runs.push(run);
        drain(0, demand_s);
    }
    runs
}

/// Waits for a run's backlog to drain before the next (it waits in the
/// fixture's queue, not in the socket): `unanswered` requests at
/// `demand_s` each and a margin, at most 10 s.
fn drain(unanswered: u64, demand_s: f64) {
    let s = (1.0 + 2.0 * unanswered as f64 * demand_s).min(10.0);
    std::thread::sleep(std::time::Duration::from_secs_f64(s));
}
