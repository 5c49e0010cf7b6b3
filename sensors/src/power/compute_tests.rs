//! Tests of one interval's arithmetic on synthetic sched readings.

use super::*;
use crate::power::topology::{Cpu, CpuPackages};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

/// `sockets` sockets of `cores` cores with `smt` threads each; Linux
/// numbering (CPU = t * nr_cores + core).
fn topo(sockets: usize, cores: usize, smt: usize) -> CpuPackages {
    let nr_cores = sockets * cores;
    let cpus = (0..nr_cores * smt)
        .map(|cpu| {
            let core = cpu % nr_cores;
            Cpu {
                socket: core / cores,
                sibling: (smt == 2).then_some(((cpu + nr_cores) % (2 * nr_cores)) as u32),
                online: true,
            }
        })
        .collect();
    CpuPackages {
        cpus,
        sockets: (0..sockets as u32).collect(),
        nr_wide_smt_cores: 0,
    }
}

fn thread(tgid: u32, slots: &[(u32, u64, u64, u64)]) -> ThreadCum {
    ThreadCum {
        tgid,
        per_cpu: slots
            .iter()
            .map(|&(cpu, on_ns, sib_busy_ns, cycles)| {
                (
                    cpu,
                    CpuCum {
                        on_ns,
                        sib_busy_ns,
                        cycles,
                        nr_switches: 1,
                    },
                )
            })
            .collect(),
        exited: false,
    }
}

fn reading(now_ns: u64, threads: Vec<(u32, ThreadCum)>, cpu_busy_ns: Vec<u64>) -> SchedReading {
    SchedReading {
        now_ns,
        threads: threads.into_iter().collect(),
        cpu_busy_ns,
        counters: SchedCounters::default(),
    }
}

const S: u64 = 1_000_000_000;

#[test]
fn package_only_rapl_splits_busy_share_by_on_cpu_time() {
    // 2 CPUs, one socket, 1 s: thread 10 (pid 10) busy all the time on
    // CPU 0, thread 20 (pid 20) a quarter of the time on CPU 1.
    let t = topo(1, 2, 1);
    let prev = Baseline::default();
    let cur = reading(
        S,
        vec![
            (10, thread(10, &[(0, S, 0, 0)])),
            (20, thread(20, &[(1, S / 4, 0, 0)])),
        ],
        vec![S, S / 4],
    );
    let e = EnergyInput::Rapl(vec![SocketEnergy {
        package_j: 40.0,
        core_j: None,
        dram_j: None,
    }]);
    let cfg = PowerConfig::default();
    let s = compute(&cfg, &t, Weight::Time, &prev, &cur, &e);
    assert_eq!(s.source, PowerSource::Rapl);
    assert!(!s.energy_is_estimate);
    assert!(close(s.interval_s, 1.0));
    // package 40 W × busy fraction (1 + 0.25) / 2 = 25 W active.
    assert!(close(s.sockets[0].busy_fraction, 0.625));
    assert!(close(s.node.active_w, 25.0));
    assert!(close(s.node.idle_w, 15.0));
    assert!(close(s.node.total_w, 40.0));
    let p10 = s.process(10).unwrap();
    let p20 = s.process(20).unwrap();
    assert!(close(p10.power_w, 20.0) && close(p20.power_w, 5.0));
    assert!(close(p10.share, 0.8) && close(p20.share, 0.2));
    assert!(close(s.threads[0].cpu_fraction, 1.0));
    assert!(close(s.threads[1].cpu_fraction, 0.25));
    let sum: f64 = s.threads.iter().map(|t| t.power_w).sum();
    assert!(close(sum, s.node.active_w));
    assert!(close(p10.energy_j, 20.0));
}

#[test]
fn core_domain_is_the_active_power_and_dram_is_reported() {
    let t = topo(2, 1, 1); // CPU 0 on socket 0, CPU 1 on socket 1
    let cur = reading(
        2 * S,
        vec![
            (1, thread(1, &[(0, S, 0, 0), (1, S / 2, 0, 0)])),
            (2, thread(2, &[(1, S / 2, 0, 0)])),
        ],
        vec![S, S],
    );
    let e = EnergyInput::Rapl(vec![
        SocketEnergy {
            package_j: 60.0,
            core_j: Some(40.0),
            dram_j: Some(10.0),
        },
        SocketEnergy {
            package_j: 30.0,
            core_j: Some(20.0),
            dram_j: Some(6.0),
        },
    ]);
    let s = compute(
        &PowerConfig::default(),
        &t,
        Weight::Time,
        &Baseline::default(),
        &cur,
        &e,
    );
    // 2 s: socket 0 core 20 W, socket 1 core 10 W.
    assert!(close(s.node.active_w, 30.0));
    assert!(close(s.node.total_w, 30.0 + 15.0 + 5.0 + 3.0));
    assert_eq!(s.node.dram_w, Some(8.0));
    assert!(close(s.node.idle_w, 53.0 - 30.0));
    // Thread 1: all of socket 0 + half of socket 1.
    assert!(close(s.process(1).unwrap().power_w, 20.0 + 5.0));
    assert!(close(s.process(2).unwrap().power_w, 5.0));
}

#[test]
fn hyperthread_weighting_applies_per_socket() {
    // One socket, one core with two hyperthreads (CPUs 0 and 1). Over 1 s,
    // thread 1 ran on CPU 0 all the time, thread 2 on CPU 1 for the first
    // half (so thread 1 had its sibling busy for 0.5 s). HT_r = 1.1.
    let t = topo(1, 1, 2);
    assert_eq!(t.cpus[0].sibling, Some(1));
    let cur = reading(
        S,
        vec![
            (1, thread(1, &[(0, S, S / 2, 0)])),
            (2, thread(2, &[(1, S / 2, S / 2, 0)])),
        ],
        vec![S, S / 2],
    );
    let e = EnergyInput::Rapl(vec![SocketEnergy {
        package_j: 50.0,
        core_j: Some(31.0),
        dram_j: None,
    }]);
    let s = compute(
        &PowerConfig::default(),
        &t,
        Weight::Time,
        &Baseline::default(),
        &cur,
        &e,
    );
    let w1 = 0.5e9 + 0.55 * 0.5e9;
    let w2 = 0.55 * 0.5e9;
    let p1 = 31.0 * w1 / (w1 + w2);
    let t1 = s.threads.iter().find(|t| t.tid == 1).unwrap();
    assert!(close(t1.weighted, w1));
    assert!(close(t1.power_w, p1), "{} != {p1}", t1.power_w);
    assert_eq!(t1.sib_busy_ns, S / 2);
}

#[test]
fn cycles_are_split_by_the_sibling_busy_fraction_of_time() {
    let t = topo(1, 1, 2);
    let cur = reading(
        S,
        vec![
            (1, thread(1, &[(0, S, S / 4, 4000)])),
            (2, thread(2, &[(1, S / 4, S / 4, 1000)])),
        ],
        vec![S, S / 4],
    );
    let e = EnergyInput::Rapl(vec![SocketEnergy {
        package_j: 10.0,
        core_j: Some(10.0),
        dram_j: None,
    }]);
    let s = compute(
        &PowerConfig::default(),
        &t,
        Weight::Cycles,
        &Baseline::default(),
        &cur,
        &e,
    );
    let w1 = 3000.0 + 0.55 * 1000.0;
    let w2 = 0.55 * 1000.0;
    let t1 = s.threads.iter().find(|t| t.tid == 1).unwrap();
    assert_eq!(t1.cycles, Some(4000));
    assert!(close(t1.weighted, w1));
    assert!(close(t1.power_w, 10.0 * w1 / (w1 + w2)));
}

#[test]
fn model_path_is_flagged_and_follows_the_formula() {
    let t = topo(1, 2, 1);
    let cur = reading(S, vec![(7, thread(7, &[(0, S / 2, 0, 0)]))], vec![S / 2, 0]);
    let cfg = PowerConfig::default(); // base 10, idle 1/cpu, dynamic 5/cpu
    let e = EnergyInput::Model {
        freq: vec![None, None],
    };
    let s = compute(&cfg, &t, Weight::Time, &Baseline::default(), &cur, &e);
    assert_eq!(s.source, PowerSource::Model);
    assert!(s.energy_is_estimate);
    assert!(close(s.node.total_w, 10.0 + 2.0 + 5.0 * 0.5));
    assert!(close(s.node.active_w, 2.5));
    assert!(close(s.node.idle_w, 12.0));
    let app = s.app(&[7], Some(100.0));
    assert!(app.energy_is_estimate);
    assert_eq!(app.source, PowerSource::Model);
    assert!(close(app.power_w, 2.5));
    assert!(close(app.energy_per_request_j.unwrap(), 0.025));
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains("\"energy_is_estimate\":true") && json.contains("\"source\":\"model\""));
}

#[test]
fn intervals_difference_the_counters_and_drop_exited_threads() {
    let t = topo(1, 2, 1);
    let r1 = reading(S, vec![(1, thread(1, &[(0, S, 0, 0)]))], vec![S, 0]);
    let base = advance(&Baseline::default(), &r1);
    let mut gone = thread(1, &[(0, S + S / 2, 0, 0)]);
    gone.exited = true;
    let r2 = reading(
        2 * S,
        vec![(1, gone), (2, thread(2, &[(1, S / 2, 0, 0)]))],
        vec![S + S / 2, S / 2],
    );
    let e = EnergyInput::Rapl(vec![SocketEnergy {
        package_j: 20.0,
        core_j: None,
        dram_j: None,
    }]);
    let s = compute(&PowerConfig::default(), &t, Weight::Time, &base, &r2, &e);
    let t1 = s.threads.iter().find(|t| t.tid == 1).unwrap();
    assert_eq!(t1.on_cpu_ns, S / 2, "only the second interval");
    assert!(t1.exited);
    // 20 W × busy 0.5: 10 W split half and half.
    assert!(close(t1.power_w, 5.0));
    let next = advance(&base, &r2);
    assert!(!next.threads.contains_key(&1), "exited thread dropped");
    assert!(next.threads.contains_key(&2));
}

#[test]
fn a_reading_that_missed_part_of_an_open_slice_is_not_counted_twice() {
    let t = topo(1, 1, 1);
    let r1 = reading(S, vec![(1, thread(1, &[(0, 900, 0, 0)]))], vec![900]);
    let b1 = advance(&Baseline::default(), &r1);
    // The next reading raced with a switch: it shows less than before.
    let r2 = reading(2 * S, vec![(1, thread(1, &[(0, 800, 0, 0)]))], vec![800]);
    let e = EnergyInput::Model { freq: vec![None] };
    let s = compute(&PowerConfig::default(), &t, Weight::Time, &b1, &r2, &e);
    assert!(s.threads.is_empty(), "no negative or double time");
    let b2 = advance(&b1, &r2);
    let r3 = reading(3 * S, vec![(1, thread(1, &[(0, 1000, 0, 0)]))], vec![1000]);
    let s = compute(&PowerConfig::default(), &t, Weight::Time, &b2, &r3, &e);
    assert_eq!(s.threads[0].on_cpu_ns, 100, "900 already counted");
}

#[test]
fn app_sums_its_processes_only() {
    let t = topo(1, 2, 1);
    let cur = reading(
        S,
        vec![
            (1, thread(1, &[(0, S / 2, 0, 0)])),
            (2, thread(1, &[(1, S / 2, 0, 0)])),
            (3, thread(3, &[(1, S / 2, 0, 0)])),
        ],
        vec![S / 2, S],
    );
    let e = EnergyInput::Rapl(vec![SocketEnergy {
        package_j: 12.0,
        core_j: Some(9.0),
        dram_j: None,
    }]);
    let s = compute(
        &PowerConfig::default(),
        &t,
        Weight::Time,
        &Baseline::default(),
        &cur,
        &e,
    );
    let p1 = s.process(1).unwrap();
    assert_eq!(p1.nr_threads, 2);
    assert!(close(p1.cpus_used, 1.0));
    let app = s.app(&[1], Some(0.0));
    assert!(close(app.power_w, 6.0) && close(app.share, 2.0 / 3.0));
    assert_eq!(app.energy_per_request_j, None, "no requests");
    let both = s.app(&[1, 3], None);
    assert!(close(both.power_w, s.node.active_w));
}
