//! Tests of the sim fit: synthetic points of a known model, and steps
//! recorded on this machine.
use super::*;

fn node() -> SimNode {
    SimNode {
        nr_cores: 2,
        freq_min_mhz: 3000,
        freq_max_mhz: 3000,
        nr_ways: 0,
        quota_step_milli: 100,
        ..SimNode::default()
    }
}

/// Points a server with a known model would give: its steady-state
/// percentiles, CPU time and busy threads, at three allocations.
fn synthetic(truth: &SimModel, n: &SimNode) -> Vec<ServerPoint> {
    let mut pts = Vec::new();
    for (cores, quota) in [(1, 0), (2, 0), (1, 500)] {
        let probe = ServerPoint {
            nr_cores: cores,
            quota_milli: quota,
            offered_rps: 0.0,
            achieved_rps: 0.0,
            client_us: 0.0,
            ebpf_us: None,
            cpu_s: 0.0,
            wall_s: 2.0,
            busy_threads: 0,
        };
        let cap = truth.capacity_rps(&probe.share(), n);
        let cpus = truth.effective_cpus(&probe.share(), n);
        for x in [0.2f64, 0.4, 0.6, 0.75, 1.5] {
            let achieved = cap * x.min(1.0);
            let mut p = ServerPoint {
                offered_rps: cap * x,
                achieved_rps: achieved,
                cpu_s: achieved * probe.wall_s * truth.service_us * 1e-6,
                busy_threads: truth.parallelism.min(cores),
                ..probe
            };
            if x < 1.0 {
                let (c, s) = predict(truth, &p, 99.0, n);
                (p.client_us, p.ebpf_us) = (c, Some(s));
            } else {
                (p.client_us, p.ebpf_us) = (1e6, Some(1e6));
                p.cpu_s = cpus * p.wall_s;
            }
            pts.push(p);
        }
    }
    pts
}

#[test]
fn a_server_fit_recovers_a_known_model() {
    let n = node();
    for (s_us, cv, par, net) in [(800.0, 0.4, 4, 0.3), (12.0, 0.7, 1, 0.05)] {
        let truth = SimModel {
            service_us: s_us,
            service_cv: cv,
            parallelism: par,
            network_ms: net,
            ..SimModel::generic()
        };
        let pts = synthetic(&truth, &n);
        let base = SimModel::generic();
        let (fit, checks) = fit_server(&pts, 99.0, &base, &n).unwrap();
        let got = fit.service_us.unwrap();
        assert!((got - s_us).abs() / s_us < 0.01, "service {got} vs {s_us}");
        assert_eq!(fit.parallelism, Some(par.min(2)));
        let got_cv = fit.service_cv.unwrap();
        assert!((got_cv - cv).abs() <= 0.051, "cv {got_cv} vs {cv}");
        let got_net = fit.network_ms.unwrap();
        assert!(
            (got_net / net).ln().abs() < 0.25,
            "network {got_net} vs {net}"
        );
        assert_eq!(checks.len(), 3);
        for c in &checks {
            assert!(
                (c.model - c.measured).abs() / c.measured < 0.02,
                "{c:?}: the synthetic server runs at its model capacity"
            );
        }
    }
}

/// A light step right after a saturated one counts that step's backlog
/// on the server side (eBPF 100 ms where the client saw 2-4 ms, as in
/// the recorded steps below): such figures are left out, and the
/// network term and the spread still come out as the truth's.
#[test]
fn an_ebpf_figure_above_the_clients_is_not_fitted() {
    let n = node();
    let truth = SimModel {
        service_us: 900.0,
        service_cv: 0.4,
        parallelism: 8,
        network_ms: 0.3,
        ..SimModel::generic()
    };
    let mut pts = synthetic(&truth, &n);
    // The first light step of the 2nd and 3rd allocations.
    for i in [5, 10] {
        pts[i].ebpf_us = Some(100_000.0);
    }
    let (fit, _) = fit_server(&pts, 99.0, &SimModel::generic(), &n).unwrap();
    let (cv, net) = (fit.service_cv.unwrap(), fit.network_ms.unwrap());
    assert!((cv - 0.4).abs() <= 0.051, "cv {cv}");
    assert!((net / 0.3).ln().abs() < 0.1, "network {net}");
}

/// Steps recorded by `qosd calibrate scenarios/demo.yaml --model` (the
/// fixture, 1 ms of CPU per request, CPUs shared, quota 2, 1 and 0.5
/// CPU; 2026-11-26, others building at nice 19): (quota, offered,
/// achieved, client p99 ms, eBPF p99 ms). The old joint fit gave
/// `network_ms` 0.294 and `service_cv` 1.0 here, and 4.31 / 1.0 on an
/// earlier run of the same kind: the 100 ms eBPF figures of the light
/// steps after a saturated one drove it. The gaps measured where both
/// figures hold are 0.0-0.44 ms.
#[test]
fn the_network_term_of_recorded_steps_is_their_gap() {
    let raw = [
        (2000, 94.0, 94.0, 2.335, 2.154),
        (2000, 464.0, 464.0, 2.793, 2.351),
        (2000, 946.0, 946.0, 5.521, 5.554),
        (2000, 1438.0, 1438.0, 11.764, 10.191),
        (2000, 2622.0, 2032.0, 376.439, 8.012),
        (1000, 229.0, 229.0, 4.088, 103.023),
        (1000, 434.0, 434.0, 2.941, 2.843),
        (1000, 715.0, 715.0, 4.407, 4.170),
        (1000, 1349.0, 1193.0, 216.531, 59.638),
        (500, 111.0, 111.0, 2.433, 99.877),
        (500, 201.0, 201.0, 2.236, 1.987),
        (500, 337.0, 337.0, 2.499, 2.449),
        (500, 638.0, 592.0, 168.296, 89.391),
    ];
    let pts: Vec<ServerPoint> = raw
        .iter()
        .map(|&(q, o, a, c, e)| ServerPoint {
            nr_cores: 2,
            quota_milli: q,
            offered_rps: o,
            achieved_rps: a,
            client_us: c * 1000.0,
            ebpf_us: Some(e * 1000.0),
            cpu_s: a * 1.05e-3,
            wall_s: 1.0,
            busy_threads: 5,
        })
        .collect();
    let n = SimNode {
        shared_cpus: true,
        ..node()
    };
    let (fit, _) = fit_server(&pts, 99.0, &SimModel::generic(), &n).unwrap();
    let net = fit.network_ms.unwrap();
    assert!((0.05..=0.45).contains(&net), "network {net} ms");
    let cv = fit.service_cv.unwrap();
    assert!(cv < 1.0, "cv {cv}: the fixture's work is a fixed spin");
}

/// Without a saturated step the service time is the CPU time per
/// request; with one whose rate fell short of the CPU accounting (time
/// spent outside the server's threads), capacity wins.
#[test]
fn service_time_from_capacity_else_from_cpu_time() {
    let n = node();
    let truth = SimModel {
        service_us: 500.0,
        parallelism: 4,
        ..SimModel::generic()
    };
    let all = synthetic(&truth, &n);
    let light: Vec<ServerPoint> = all.iter().filter(|p| !p.saturated()).copied().collect();
    let (fit, _) = fit_server(&light, 99.0, &truth, &n).unwrap();
    assert_eq!(fit.service_us, Some(500.0));
    // The saturated steps reach 80 % of the model's rate.
    let slow: Vec<ServerPoint> = all
        .iter()
        .map(|p| {
            let mut p = *p;
            if p.saturated() {
                p.achieved_rps *= 0.8;
            }
            p
        })
        .collect();
    let (fit, _) = fit_server(&slow, 99.0, &truth, &n).unwrap();
    assert_eq!(fit.service_us, Some(625.0));
}

#[test]
fn no_unsaturated_step_no_fit() {
    let n = node();
    let truth = SimModel::generic();
    let pts: Vec<ServerPoint> = synthetic(&truth, &n)
        .into_iter()
        .filter(|p| p.saturated())
        .collect();
    assert!(fit_server(&pts, 99.0, &truth, &n).is_none());
}

#[test]
fn a_job_fit_recovers_ops_per_cpu() {
    let n = node();
    let pts: Vec<JobPoint> = [(1, 0, 1.0), (1, 500, 0.5), (2, 0, 2.0), (2, 300, 0.3)]
        .iter()
        .map(|&(c, q, cpus)| JobPoint {
            nr_cores: c,
            quota_milli: q,
            ops_per_s: 27_000.0 * cpus,
            cpus_used: cpus,
        })
        .collect();
    let (fit, checks) = fit_job(&pts, 2, &n).unwrap();
    assert_eq!(fit.ops_per_cpu_s, Some(27_000.0));
    assert_eq!(fit.parallelism, Some(2));
    for c in checks {
        assert!((c.model - c.measured).abs() < 1e-6, "{c:?}");
    }
    // One thread: two cores buy nothing, as the model has it.
    let (fit1, checks) = fit_job(&pts[..1], 1, &n).unwrap();
    assert_eq!(fit1.parallelism, Some(1));
    assert!((checks[0].model - 27_000.0).abs() < 1e-6);
    assert!(fit_job(&[], 1, &n).is_none());
}

#[test]
fn three_significant_digits() {
    assert_eq!(round3(1234.5), 1230.0);
    assert_eq!(round3(0.012345), 0.0123);
    assert_eq!(round3(0.0), 0.0);
}
