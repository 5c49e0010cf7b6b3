use super::*;

/// Without CFS burst, so that throttling shows plainly (the burst test
/// turns it on).
fn node() -> SimNode {
    serde_yaml_ng::from_str("{ nr_cores: 4, nr_ways: 0, cfs_burst_pct: 0 }").unwrap()
}

fn share(cores: u32, quota_milli: u32) -> Share {
    Share {
        nr_cores: cores,
        freq_mhz: node().freq_max_mhz,
        cpu_quota_milli: quota_milli,
        ..Default::default()
    }
}

#[test]
fn capacity_scales_with_the_lesser_of_cores_and_quota() {
    let m = SimModel {
        parallelism: 8,
        ..SimModel::generic()
    };
    let n = node();
    let one = m.capacity_rps(&share(1, 0), &n);
    assert!((one - 1e6 / m.service_us).abs() < 1e-6, "{one}");
    // Quota below cores: capacity follows the quota.
    for (cores, q, cpus) in [(1, 300, 0.3), (2, 1500, 1.5), (4, 2000, 2.0), (2, 500, 0.5)] {
        let c = m.capacity_rps(&share(cores, q), &n);
        assert!((c / one - cpus).abs() < 1e-9, "{cores} cores {q} m: {c}");
        assert!((m.effective_cpus(&share(cores, q), &n) - cpus).abs() < 1e-12);
    }
    // Quota above cores buys nothing; 0 means no quota.
    for q in [0, 2000, 3000] {
        let c = m.capacity_rps(&share(2, q), &n);
        assert!((c / one - 2.0).abs() < 1e-9, "quota {q}: {c}");
    }
    // Parallelism bounds it before the quota does.
    let narrow = SimModel {
        parallelism: 1,
        ..SimModel::generic()
    };
    let c = narrow.capacity_rps(&share(4, 2500), &n);
    assert!((c / one - 1.0).abs() < 1e-9, "{c}");
}

fn at() -> Shifts {
    Shifts {
        shift_us: 0.0,
        network_us: 0.0,
        noise: 1.0,
        weight: 1.0,
    }
}

/// An app serving 0.33 CPU of 1 ms requests on 2 cores: a quota near
/// that demand throttles it in some periods, and the tail grows.
fn spinner() -> SimModel {
    SimModel {
        service_us: 1000.0,
        service_cv: 0.3,
        parallelism: 8,
        ..SimModel::generic()
    }
}

#[test]
fn a_lower_quota_raises_the_tail_at_the_same_load() {
    let (m, n) = (spinner(), node());
    let p99 =
        |q: u32| percentile(&[m.sample(&share(2, q), &n, 330.0, 1.0, at())], 99.0, false).unwrap();
    let (full, q5, q4, q35) = (p99(0), p99(500), p99(400), p99(350));
    assert!(full <= q5 && q5 < q4 && q4 < q35, "{full} {q5} {q4} {q35}");
    assert!(q35 > 2.0 * full, "{full} {q35}");
}

/// CFS: a quota well above the demand never throttles; near the
/// demand a throttled request waits for the next period, so a shorter
/// period bounds the tail (the wait is at most one period).
#[test]
fn throttling_grows_with_demand_and_the_period_bounds_the_wait() {
    let (m, mut n) = (spinner(), node());
    let a = share(2, 400); // 0.4 CPU on 2 cores
    let th = |rps: f64, n: &SimNode| m.throttle(&a, n, rps, 1000.0);
    assert_eq!(th(50.0, &n), None, "0.05 CPU of demand under 0.4");
    let (lo, hi) = (th(250.0, &n).unwrap(), th(380.0, &n).unwrap());
    assert!(lo.p < hi.p && hi.p < 0.2, "{lo:?} {hi:?}");
    assert!(hi.span_us <= 100_000.0, "{hi:?}");
    // Over the quota: throttled for about 1 − q/ρ of the time.
    let over = th(800.0, &n).unwrap();
    assert!((over.p - 0.5).abs() < 0.05, "{over:?}");
    // 0.33 CPU under a 0.35 quota: throttled in many periods; the
    // wait is at most the rest of one, so 10 ms beats 100 ms.
    // (The real kernel's per-CPU runtime slices make short periods worse
    // than this on a multi-CPU group; docs/sharing.md.)
    let tail = |period_us: u64, n: &mut SimNode| {
        n.cfs_period_us = period_us;
        let a = share(2, 350);
        percentile(&[m.sample(&a, n, 330.0, 1.0, at())], 99.0, false).unwrap()
    };
    let (p100, p10) = (tail(100_000, &mut n), tail(10_000, &mut n));
    assert!(
        p10 < 0.5 * p100,
        "10 ms period {p10} µs vs 100 ms {p100} µs"
    );
    assert!(p10 < 12_000.0, "{p10}");
    // Burst: one period's quota banked from the periods under it. At 0.33
    // CPU of demand under 0.35 the mean is within a standard deviation,
    // so part of the bank is there, and fewer periods are throttled; at
    // 0.2 CPU under 0.35 the bank is full and throttling is all but gone.
    n.cfs_period_us = 100_000;
    let th_at = |pct: u32, lambda: f64, n: &mut SimNode| {
        n.cfs_burst_pct = pct;
        m.throttle(&share(2, 350), n, lambda, 1000.0)
            .map_or(0.0, |t| t.p)
    };
    let (none, full) = (th_at(0, 330.0, &mut n), th_at(100, 330.0, &mut n));
    assert!(full < none, "burst {full} vs none {none}");
    let (none, full) = (th_at(0, 200.0, &mut n), th_at(100, 200.0, &mut n));
    assert!(
        full < 0.1 * none && none > 0.0,
        "burst {full} vs none {none}"
    );
    // Over the quota the bank is empty: burst changes nothing.
    assert_eq!(th_at(100, 800.0, &mut n), th_at(0, 800.0, &mut n));
    // No quota: no throttling, and the queue alone.
    assert_eq!(m.throttle(&share(2, 0), &n, 380.0, 1000.0), None);
}

/// Sharing CPUs with best-effort work at normal weight stretches the
/// service times (`slow`), and the tail with them.
#[test]
fn sharing_at_normal_weight_slows_the_app() {
    let m = SimModel {
        parallelism: 4,
        ..SimModel::generic()
    };
    let n = node();
    let a = share(2, 0);
    let lambda = 0.4 * m.capacity_rps(&a, &n);
    let p = |slow: f64| percentile(&[m.sample(&a, &n, lambda, slow, at())], 99.0, false).unwrap();
    assert!(p(1.0) * 1.5 < p(2.0), "{} {}", p(1.0), p(2.0));
}

#[test]
fn mm1_matches_closed_form() {
    // M/M/1 (cv = 1): T ~ Exp(μ − λ), p99 = ln(100)/(μ − λ).
    let q = Queue::new(1, 100.0, 1.0, 0.5 / 100.0);
    let s = Sample {
        queue: q,
        throttle: None,
        shift_us: 0.0,
        network_us: 0.0,
        noise: 1.0,
        weight: 1.0,
    };
    let p99 = percentile(&[s], 99.0, false).unwrap();
    let want = 100f64.ln() / (0.5 / 100.0);
    assert!((p99 - want).abs() / want < 0.002, "{p99} vs {want}");
}

#[test]
fn more_servers_less_waiting() {
    let mu = 1.0 / 1000.0;
    let p = |c: u32| {
        let q = Queue::new(c, 1.0 / mu, 0.5, 3.5 * mu);
        percentile(
            &[Sample {
                queue: q,
                throttle: None,
                shift_us: 0.0,
                network_us: 500.0,
                noise: 1.0,
                weight: 1.0,
            }],
            99.0,
            false,
        )
        .unwrap()
    };
    assert!(p(4) > p(6) && p(6) > p(16), "{} {} {}", p(4), p(6), p(16));
    let q = Queue::new(8, 1.0 / mu, 0.5, 3.5 * mu);
    let s = Sample {
        queue: q,
        throttle: None,
        shift_us: 0.0,
        network_us: 500.0,
        noise: 1.0,
        weight: 1.0,
    };
    let (server, client) = (
        percentile(&[s], 99.0, false).unwrap(),
        percentile(&[s], 99.0, true).unwrap(),
    );
    assert!((client - server - 500.0).abs() < 5.0, "{server} {client}");
}
