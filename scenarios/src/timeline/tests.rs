use super::*;

fn row(t: f64, app: &str, lat: f64, cores: u32) -> Row {
    Row {
        t_s: t,
        app: app.into(),
        offered_rps: 100.0,
        achieved_rps: 100.0,
        client_p99_ms: Some(lat + 1.0),
        ebpf_p99_ms: Some(lat),
        target_ms: Some(10.0),
        violation: Some(lat + 1.0 > 10.0),
        cores: Some(cores),
        freq_mhz: None,
        llc_ways: None,
        mb_percent: None,
        power_w: Some(2.0),
        ebpf_target_ms: Some(10.0),
        fed_violation: Some(lat > 10.0),
        cpu_quota_milli: None,
        be_ops_per_s: None,
        client_slack: Some((10.0 - lat - 1.0) / 10.0),
        ebpf_slack: Some((10.0 - lat) / 10.0),
        ebpf_target_from: Some("calibrated_gap".into()),
        util: Some(0.25),
        headroom: Some(0.75),
        demand_ms: Some(2.5),
        x_sat_rps: Some(400.0),
    }
}

#[test]
fn summary_counts_violations_episodes_and_core_seconds() {
    // a: good, bad, bad, good, bad (unrecovered); b: always good.
    let lat_a = [5.0, 12.0, 15.0, 8.0, 11.0];
    let mut rows = Vec::new();
    for (i, l) in lat_a.iter().enumerate() {
        let t = (i + 1) as f64 * 0.5;
        rows.push(row(t, "a", *l, 2));
        rows.push(row(t, "b", 9.5, 1));
    }
    let tl = Timeline {
        apps: vec!["a".into(), "b".into()],
        rows,
        interval_s: 0.5,
        feedback: "ebpf".into(),
        node_power_w: vec![10.0; 5],
        ..Default::default()
    };
    let s = tl.summary();
    let a = &s.apps["a"];
    // a's client latency (lat + 1) is over in the same intervals.
    assert!((a.violation_fraction - 0.6).abs() < 1e-12);
    assert!((a.violation_fraction_fed - 0.6).abs() < 1e-12);
    assert_eq!(a.time_to_recover_s, vec![1.0]);
    assert!((a.core_seconds - 5.0).abs() < 1e-12 && (a.mean_cores - 2.0).abs() < 1e-12);
    assert_eq!(a.p99_max_ms, Some(15.0));
    // b's client latency (10.5) is over the target, its eBPF one is not.
    assert_eq!(s.apps["b"].violation_fraction_client, Some(1.0));
    assert_eq!(s.apps["b"].violation_fraction_ebpf, Some(0.0));
    // One yardstick: b is violated as its users see it, not as its
    // eBPF-fed policy saw it.
    assert_eq!(s.apps["b"].violation_fraction, 1.0);
    assert_eq!(s.apps["b"].violation_fraction_fed, 0.0);
    assert!((s.total.violation_fraction - 1.0).abs() < 1e-12);
    assert!((s.total.violation_fraction_fed - 0.6).abs() < 1e-12);
    assert!((s.total.core_seconds - 7.5).abs() < 1e-12 && (s.total.mean_cores - 3.0).abs() < 1e-12);
    assert!((s.total.energy_j.unwrap() - 25.0).abs() < 1e-12);
    assert_eq!(s.total.be_ops_per_s_mean, None, "no batch job ran");
    // CSV round trip, and a row written before the operational
    // columns still reads (without them).
    let r = &tl.rows[0];
    assert_eq!(Row::parse(&r.csv()).as_ref(), Some(r));
    let csv = r.csv();
    let old: Vec<&str> = csv.split(',').take(COLUMNS_BEFORE_OA).collect();
    let old = Row::parse(&old.join(",")).unwrap();
    assert_eq!(
        (old.util, old.x_sat_rps, old.app.as_str()),
        (None, None, "a")
    );
}

#[test]
fn best_effort_throughput_is_averaged_per_interval_and_round_trips() {
    let mut rows = Vec::new();
    for (i, (b1, b2)) in [(1000.0, Some(500.0)), (3000.0, None), (2000.0, Some(100.0))]
        .into_iter()
        .enumerate()
    {
        let t = (i + 1) as f64 * 0.5;
        rows.push(row(t, "lc", 5.0, 1));
        for (name, v) in [("be1", Some(b1)), ("be2", b2)] {
            rows.push(Row {
                target_ms: None,
                violation: None,
                cpu_quota_milli: Some(700),
                be_ops_per_s: v,
                ..row(t, name, 0.0, 1)
            });
        }
    }
    let tl = Timeline {
        apps: vec!["lc".into(), "be1".into(), "be2".into()],
        rows,
        interval_s: 0.5,
        feedback: "client".into(),
        ..Default::default()
    };
    let s = tl.summary();
    assert_eq!(s.apps["lc"].be_ops_per_s_mean, None);
    assert_eq!(s.apps["be1"].be_ops_per_s_mean, Some(2000.0));
    assert_eq!(s.apps["be2"].be_ops_per_s_mean, Some(300.0));
    // Node: (1500 + 3000 + 2100) / 3 intervals.
    assert_eq!(s.total.be_ops_per_s_mean, Some(2200.0));
    let r = &tl.rows[1];
    assert_eq!(r.csv().split(',').count(), COLUMNS.split(',').count());
    assert_eq!(Row::parse(&r.csv()).as_ref(), Some(r));
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains("\"be_ops_per_s_mean\":2200.0"), "{json}");
}
