//! The simulated node: deterministic for a seed, sensible in its response
//! to resources, and fast. (PARTIES itself is exercised in the manager's
//! replay tests, which can see the policy engine.)

use std::path::Path;

use qosd_core::{Allocations, Feedback, NodeCaps, Plan, Policy, Share, Snapshot};
use qosd_scenarios::calibrate;
use qosd_scenarios::scenario::Scenario;
use qosd_scenarios::sim::model::{percentile, Queue, Sample, SimModel};
use qosd_scenarios::sim::{self, SimOptions, StaticPolicy};

fn scenario(name: &str) -> Scenario {
    Scenario::from_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("{name}.yaml")))
        .unwrap()
}

fn csv(sc: &Scenario, seed: u64, policy: &mut dyn Policy) -> String {
    let cal = calibrate::sim(sc);
    let opts = SimOptions {
        feedback: Feedback::Ebpf,
        seed,
        duration_s: None,
    };
    let tl = sim::run(sc, &cal, policy, &opts);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("timeline.csv");
    tl.write_csv(&p).unwrap();
    std::fs::read_to_string(p).unwrap()
}

#[test]
fn same_seed_same_bytes_other_seed_differs() {
    let sc = scenario("ramp");
    let a = csv(&sc, 7, &mut StaticPolicy);
    let b = csv(&sc, 7, &mut StaticPolicy);
    let c = csv(&sc, 8, &mut StaticPolicy);
    assert_eq!(a, b, "same seed: byte-identical timeline.csv");
    assert_ne!(a, c, "a different seed changes the noise");
    assert_eq!(
        a.lines().count(),
        1 + 600 * 2,
        "one row per app per 0.5 s interval over 300 s"
    );
}

#[test]
fn more_cores_and_higher_frequency_lower_latency() {
    let sc = scenario("ramp");
    let m = SimModel::of(&sc.apps[0]);
    let node = &sc.node;
    let p99 = |cores: u32, mhz: u32, ways: u32| {
        let a = Share {
            nr_cores: cores,
            nr_ways: ways,
            freq_mhz: mhz,
            ..Default::default()
        };
        let s = m.service_time_us(&a, node);
        let lambda = 4000.0e-6; // 4000 rps, per µs
        let q = Queue::new(m.servers(&a, node), s, m.service_cv, lambda);
        percentile(
            &[Sample {
                queue: q,
                throttle: None,
                shift_us: 0.0,
                network_us: 0.0,
                noise: 1.0,
                weight: 1.0,
            }],
            99.0,
            false,
        )
        .unwrap()
    };
    assert!(p99(6, 3000, 4) > p99(8, 3000, 4), "more cores");
    assert!(p99(8, 3000, 4) > p99(12, 3000, 4), "more cores");
    assert!(p99(8, 1800, 4) > p99(8, 2400, 4), "higher frequency");
    assert!(p99(8, 2400, 4) > p99(8, 3000, 4), "higher frequency");
    assert!(p99(8, 3000, 1) > p99(8, 3000, 4), "more ways");
}

/// A policy that gives the first app all but one core after 10 s.
struct Grow;
impl Policy for Grow {
    fn name(&self) -> &str {
        "grow"
    }
    fn decide(&mut self, now_ms: u64, _: &Snapshot, cur: &Allocations, node: &NodeCaps) -> Plan {
        let mut p = Plan::keep(cur);
        if now_ms >= 10_000 {
            let names: Vec<String> = cur.keys().cloned().collect();
            for (i, n) in names.iter().enumerate() {
                p.allocations.get_mut(n).unwrap().nr_cores =
                    if i == 0 { node.nr_cores - 1 } else { 1 };
            }
        }
        p
    }
}

#[test]
fn the_policy_drives_the_node() {
    let sc = scenario("constant");
    let text = csv(&sc, 1, &mut Grow);
    let cores = |t: &str, app: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{t},{app},")))
            .unwrap()
            .split(',')
            .nth(8)
            .unwrap()
            .to_owned()
    };
    assert_eq!(cores("5.000", "memcached"), "8");
    // memcached sorts first in the allocation map: it grows, web shrinks.
    assert_eq!(cores("20.000", "memcached"), "15");
    assert_eq!(cores("20.000", "web"), "1");
}

#[test]
fn static_ramp_numbers() {
    let sc = scenario("ramp");
    let cal = calibrate::sim(&sc);
    for (n, c) in &cal.apps {
        println!(
            "{n}: capacity {:.0} rps knee {:.0} rps ({:.2}) knee p99 {:.2} ms base {:.2} ms",
            c.capacity_rps,
            c.knee_rps,
            c.knee_rps / c.capacity_rps,
            c.knee_latency_us / 1000.0,
            c.base_latency_us / 1000.0
        );
    }
    let tl = sim::run(
        &sc,
        &cal,
        &mut StaticPolicy,
        &SimOptions {
            feedback: Feedback::Ebpf,
            seed: 1,
            duration_s: None,
        },
    );
    let s = tl.summary();
    println!("{}", serde_json::to_string_pretty(&s).unwrap());
    for r in tl.rows.iter().filter(|r| r.app == "search").step_by(40) {
        println!("{}", r.csv());
    }
}

/// Moves the batch job's CPU quota: 1.5 CPU for the first 10 s, then 0.5.
struct QuotaSwing;

impl Policy for QuotaSwing {
    fn name(&self) -> &str {
        "quota-swing"
    }
    fn decide(&mut self, now_ms: u64, _: &Snapshot, cur: &Allocations, _: &NodeCaps) -> Plan {
        let mut p = Plan::keep(cur);
        let (job, lc) = if now_ms < 10_000 {
            (1500, 500)
        } else {
            (500, 1500)
        };
        for (name, s) in p.allocations.iter_mut() {
            s.cpu_quota_milli = if name == "batch" { job } else { lc };
        }
        p
    }
}

/// A best-effort job on the sim fills `be_ops_per_s`, in proportion to
/// the CPU quota it holds (on CPUs shared with a lightly loaded server),
/// and a server's rows leave it empty.
#[test]
fn a_batch_job_gains_and_loses_with_its_quota() {
    let text = "name: be\nduration_s: 20\nnode: {nr_cores: 2, freq_min_mhz: 3000, freq_max_mhz: 3000, nr_ways: 0, quota_step_milli: 100, shared_cpus: true}\napps:\n  - name: search\n    class: lc\n    server: {kind: fixture, work_us: 1000}\n    protocol: http\n    target: {ms: 20}\n    load: {kind: constant, level: 0.1}\n  - name: batch\n    class: be\n    job: {kind: hash, threads: 2, op_kib: 16}\n    sim: {ops_per_cpu_s: 1000}\n";
    let sc = Scenario::parse(Path::new("be.yaml"), text).unwrap();
    let cal = calibrate::sim(&sc);
    assert!(!cal.apps.contains_key("batch"), "a job is not calibrated");
    let opts = SimOptions {
        feedback: Feedback::Ebpf,
        seed: 1,
        duration_s: None,
    };
    let tl = sim::run(&sc, &cal, &mut QuotaSwing, &opts);
    let ops = |from: f64, to: f64| {
        let v: Vec<f64> = tl
            .rows
            .iter()
            .filter(|r| r.app == "batch" && r.t_s > from && r.t_s <= to)
            .map(|r| r.be_ops_per_s.expect("a job's row has ops/s"))
            .collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    // The first interval runs on the start allocation (1 CPU each).
    let (high, low) = (ops(1.0, 10.0), ops(11.0, 20.0));
    assert!((high - 1500.0).abs() < 1.0, "1.5 CPU: {high} ops/s");
    assert!((low - 500.0).abs() < 1.0, "0.5 CPU: {low} ops/s");
    for r in tl.rows.iter().filter(|r| r.app == "search") {
        assert_eq!(r.be_ops_per_s, None);
    }
    // Without a quota on shared CPUs, the job gets what the server leaves.
    let mut greedy = sc.clone();
    greedy.node.quota_step_milli = 0;
    let tl = sim::run(&greedy, &cal, &mut StaticPolicy, &opts);
    let last = tl.rows.iter().rev().find(|r| r.app == "batch").unwrap();
    let search = tl.rows.iter().rev().find(|r| r.app == "search").unwrap();
    let left = 2.0 - search.achieved_rps * 1000e-6;
    let got = last.be_ops_per_s.unwrap();
    assert!(
        (got - 1000.0 * left).abs() < 20.0,
        "{got} ops/s, {left} CPUs left"
    );
}
