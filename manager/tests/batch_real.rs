//! The best-effort batch job as a real process: `qosd batch` started by
//! `BatchJob`, a live ops/s figure every interval, the job gone when the
//! thread that started it ends (PR_SET_PDEATHSIG), and its throughput
//! falling with its CPU quota (cgroup v1 `cpu` here) — what a controller
//! taking CPU from a best-effort app makes visible. Root.

mod support;

use std::time::{Duration, Instant};

use qosd_actuators::{Actuators, Allocation, AppTarget, Config};
use qosd_scenarios::batch::{BatchArgs, BatchJob};
use support::QOSD;

fn cmd() -> Vec<String> {
    vec![QOSD.to_owned(), "batch".to_owned()]
}

fn args(threads: u32) -> BatchArgs {
    BatchArgs {
        threads,
        op_kib: 16,
        report_ms: 50,
        exit_after_s: 60,
    }
}

/// CPU seconds of `pid` (its CPU clock: qosd's own reader).
fn cpu_s(pid: u32) -> f64 {
    qosd_sensors::procfs::Procfs::new("/")
        .process_cpu_s(pid as i32)
        .unwrap()
        .expect("the job is running")
}

/// (ops/s by the job's reports, CPUs used by /proc) over `d`.
fn measure(job: &mut BatchJob, d: Duration) -> (f64, f64) {
    let _ = job.ops_per_s(); // start a fresh window
    let (c0, t0) = (cpu_s(job.pid), Instant::now());
    std::thread::sleep(d);
    let ops = job.ops_per_s().expect("progress during the window");
    (ops, (cpu_s(job.pid) - c0) / t0.elapsed().as_secs_f64())
}

#[test]
fn batch_job_reports_ops_every_interval() {
    let mut job = BatchJob::start("be", &cmd(), &args(1)).unwrap();
    assert!(job.running());
    let mut rates = Vec::new();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(200));
        rates.push(job.ops_per_s().expect("a report in every 200 ms interval"));
    }
    eprintln!("ops/s per 200 ms interval: {rates:.0?}");
    assert!(rates.iter().all(|r| *r > 0.0), "{rates:?}");
    // Cumulative and monotonic.
    let (c1, t1) = job.progress().unwrap();
    std::thread::sleep(Duration::from_millis(120));
    let (c2, t2) = job.progress().unwrap();
    assert!(c2 > c1 && t2 > t1);
    // Bad arguments are refused before anything starts.
    let e = BatchJob::start(
        "be",
        &cmd(),
        &BatchArgs {
            threads: 0,
            ..args(1)
        },
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("--threads 0"), "{e}");
    let out = std::process::Command::new(QOSD)
        .args(["batch", "--op-kib", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn batch_job_dies_with_the_thread_that_started_it() {
    let pid = std::thread::spawn(|| {
        let job = BatchJob::start("orphan", &cmd(), &args(1)).unwrap();
        let pid = job.pid;
        // No Drop: only the parent's death may stop it.
        std::mem::forget(job);
        pid
    })
    .join()
    .unwrap();
    let gone = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
            .unwrap_or(true)
    };
    let t0 = Instant::now();
    while !gone() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone(), "pid {pid} still runs after its parent thread ended");
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None);
}

#[test]
fn batch_throughput_follows_its_cpu_quota() {
    let d = tempfile::tempdir().unwrap();
    let cfg = Config {
        state_file: Some(d.path().join("state.json")),
        ..Config::default()
    };
    let mut act = Actuators::new(&cfg).unwrap();
    assert!(
        act.caps().get(qosd_actuators::Resource::CpuQuota).available,
        "{:?}",
        act.caps().get(qosd_actuators::Resource::CpuQuota)
    );
    let mut job = BatchJob::start("be-quota", &cmd(), &args(1)).unwrap();
    let (free_ops, free_cpu) = measure(&mut job, Duration::from_millis(1000));
    // Ops per CPU-second: what the job does with the CPU it gets, whatever
    // else this shared machine runs meanwhile.
    let per_cpu_s = free_ops / free_cpu.max(0.05);
    let app = AppTarget::new("be-quota", vec![job.pid as i32]);
    act.apply(
        &app,
        &Allocation {
            cpu_quota_milli: Some(200),
            ..Default::default()
        },
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200)); // the first period settles
    let (capped_ops, capped_cpu) = measure(&mut job, Duration::from_millis(1500));
    eprintln!(
        "free: {free_ops:.0} ops/s on {free_cpu:.2} CPU; quota 0.2: {capped_ops:.0} ops/s on {capped_cpu:.2} CPU"
    );
    assert!(
        capped_cpu <= 0.2 * 1.25,
        "CPU use {capped_cpu:.3} under a 0.2 quota"
    );
    assert!(
        capped_ops <= 0.2 * 1.3 * per_cpu_s,
        "{capped_ops:.0} ops/s under 0.2 CPU, {per_cpu_s:.0} ops per CPU-second"
    );
    assert!(capped_ops > 0.0);
    // The kernel did throttle it (on a busy machine the job may get less
    // than 0.2 CPU anyway; this is what shows the quota at work).
    let stat = std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/{}/cpu.stat", app.group_name()))
        .unwrap();
    let throttled: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("nr_throttled "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(throttled > 0, "{stat}");
    act.restore_all().unwrap();
}
