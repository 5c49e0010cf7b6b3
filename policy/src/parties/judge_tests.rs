//! The judge that noise cannot fool (`revert_vote: evidence`, cool-downs
//! that back off only on repeated harm) and operational analysis in the
//! choices (`max_util`, `min_predicted_slack`), as `policies/parties.yaml` sets them.

use qosd_core::{AppState, DecisionKind, Policy, Resource};

use super::{Parties, PartiesParams, RevertVote};
use crate::testkit::{allocs, kinds, lc, node, snap};

const CORES: Resource = Resource::Cores;

fn evidence() -> PartiesParams {
    PartiesParams {
        cycle: vec![CORES],
        revert_vote: RevertVote::Evidence,
        downsize_cooldown_ms: 2000,
        downsize_cooldown_max_ms: 16000,
        ..PartiesParams::default()
    }
}

/// An app with `slack` whose figure rests on `n` requests.
fn lc_n(name: &str, slack: f64, n: u64) -> AppState {
    AppState {
        nr_samples: n,
        ..lc(name, Some(slack))
    }
}

/// Downsizes `a` from 3 cores at t = 0, then feeds the samples
/// `(t, slack, requests)` and decides at 500 ms: the plan.
fn after_downsize(c: &mut Parties, samples: &[(u64, f64, u64)]) -> qosd_core::Plan {
    let n = node(8, 0, false, false);
    let cur = allocs(&[("a", 3, 0, 0, 0)]);
    let plan = c.decide(0, &snap(vec![lc("a", Some(0.5))]), &cur, &n);
    assert_eq!(kinds(&plan, DecisionKind::Downsize).len(), 1);
    c.applied(0, &plan, &plan.allocations);
    for &(t, s, k) in samples {
        c.observe(t, &snap(vec![lc_n("a", s, k)]));
    }
    let &(_, s, k) = samples.last().unwrap();
    c.decide(500, &snap(vec![lc_n("a", s, k)]), &plan.allocations, &n)
}

/// The case: one monitoring sample after a downsize reads a slack
/// below the threshold (one bad sample of ~100 requests); the rest are
/// fine. No revert, no cool-down: the app may give back again.
#[test]
fn one_bad_sample_does_not_revert_a_downsize() {
    let mut c = Parties::new("x", evidence(), 1);
    let plan = after_downsize(
        &mut c,
        &[
            (100, 0.032, 100),
            (200, 0.3, 100),
            (300, 0.3, 100),
            (400, 0.3, 100),
            (500, 0.3, 500),
        ],
    );
    assert!(kinds(&plan, DecisionKind::Revert).is_empty(), "{plan:?}");
    // Not cooling down: the next downsize comes at once.
    assert_eq!(kinds(&plan, DecisionKind::Downsize).len(), 1, "{plan:?}");
    // The paper's `first` vote would have reverted on that one sample.
    let mut first = Parties::new(
        "x",
        PartiesParams {
            revert_vote: RevertVote::First,
            ..evidence()
        },
        1,
    );
    let plan = after_downsize(&mut first, &[(100, 0.032, 100), (500, 0.3, 500)]);
    assert_eq!(kinds(&plan, DecisionKind::Revert).len(), 1);
}

/// A sustained violation after a downsize, on enough requests: reverted,
/// with the evidence in the reason and the short cool-down.
#[test]
fn a_sustained_violation_reverts_a_downsize() {
    let mut c = Parties::new("x", evidence(), 1);
    let bad: Vec<(u64, f64, u64)> = (1..=5).map(|i| (i * 100, -0.2, 400)).collect();
    let plan = after_downsize(&mut c, &bad);
    let r = kinds(&plan, DecisionKind::Revert);
    assert_eq!(r, vec![("a".to_owned(), CORES, 2, 3)], "{plan:?}");
    let why = &plan.decisions[0].reason;
    assert!(
        why.contains("2000/2000 requests") && why.contains("for 2000 ms"),
        "{why}"
    );
    // The same violation on too few requests for a p99 (5 × 100 < 1000)
    // is no evidence: not reverted (the upsize path repairs a real one).
    let mut c = Parties::new("x", evidence(), 1);
    let few: Vec<(u64, f64, u64)> = (1..=5).map(|i| (i * 100, -0.2, 100)).collect();
    let plan = after_downsize(&mut c, &few);
    assert!(kinds(&plan, DecisionKind::Revert).is_empty(), "{plan:?}");
    assert_eq!(kinds(&plan, DecisionKind::Upsize).len(), 1, "{plan:?}");
}

/// Harm in a row doubles the cool-down (2, 4, 8, 16, 16 s); a downsize
/// that holds starts it over.
#[test]
fn cool_downs_back_off_only_on_repeated_harm() {
    let mut c = Parties::new("x", evidence(), 1);
    let coolings: Vec<u64> = (0..5).map(|_| c.cooldown_ms("a")).collect();
    assert_eq!(coolings, vec![2000, 4000, 8000, 16000, 16000]);
    c.mem("a").harms = 0;
    assert_eq!(c.cooldown_ms("a"), 2000);
    // Without a ceiling (0) every cool-down is the base: the paper's.
    let mut flat = Parties::new("x", PartiesParams::default(), 1);
    assert_eq!(flat.cooldown_ms("a"), 30_000);
    assert_eq!(flat.cooldown_ms("a"), 30_000);
}

/// `max_util`: with 1.5 of its 2 cores busy (U 0.75), giving one back
/// would put U at 1.5 > 0.8: not tried, and the plan says why.
#[test]
fn a_downsize_predicted_past_the_utilisation_bound_is_skipped() {
    let p = PartiesParams {
        max_util: Some(0.8),
        ..evidence()
    };
    let mut c = Parties::new("x", p, 1);
    let n = node(8, 0, false, false);
    let busy = AppState {
        cpus_used: Some(1.5),
        ..lc("a", Some(0.5))
    };
    let cur = allocs(&[("a", 2, 0, 0, 0)]);
    let plan = c.decide(0, &snap(vec![busy.clone()]), &cur, &n);
    assert!(plan.decisions.is_empty(), "{plan:?}");
    assert_eq!(plan.skipped.len(), 1);
    let s = &plan.skipped[0];
    assert_eq!(
        (s.app.as_str(), s.resource, s.kind),
        ("a", CORES, DecisionKind::Downsize)
    );
    assert!(
        s.reason
            .contains("predicted utilisation 1.50 > max_util 0.8"),
        "{}",
        s.reason
    );
    // The plans.jsonl line carries it.
    let line = serde_json::to_string(&plan).unwrap();
    assert!(
        line.contains("\"skipped\"") && line.contains("max_util"),
        "{line}"
    );
    // With 4 cores, one back leaves U at 0.5: done.
    let cur = allocs(&[("a", 4, 0, 0, 0)]);
    let plan = c.decide(500, &snap(vec![busy]), &cur, &n);
    assert_eq!(kinds(&plan, DecisionKind::Downsize).len(), 1, "{plan:?}");
    assert!(plan.skipped.is_empty());
}

/// `min_predicted_slack`: the sim ramp's case. Slack 0.25 on 4 cores of
/// 1 ms requests at U 0.59: one core fewer is U 0.79, under `max_util`,
/// but M/M/c puts ~4.4 ms on the p99's wait, far past the target: not
/// tried, and `plans.jsonl` says why. On 8 cores the same load barely
/// queues on 7: done.
#[test]
fn a_downsize_predicted_to_queue_past_the_target_is_skipped() {
    let p = PartiesParams {
        max_util: Some(0.8),
        min_predicted_slack: Some(0.05),
        ..evidence()
    };
    let mut c = Parties::new("x", p, 1);
    let n = node(16, 0, false, false);
    let busy = AppState {
        rps: 2360.0,
        cpus_used: Some(2.36),
        ..lc("a", Some(0.25))
    };
    let cur = allocs(&[("a", 4, 0, 0, 0)]);
    let plan = c.decide(0, &snap(vec![busy.clone()]), &cur, &n);
    assert!(plan.decisions.is_empty(), "{plan:?}");
    let s = &plan.skipped[0];
    assert_eq!((s.resource, s.kind), (CORES, DecisionKind::Downsize));
    assert!(
        s.reason.contains("< min_predicted_slack 0.05")
            && s.reason.contains("slack now 0.25")
            && s.reason.contains("on 3.0 CPUs"),
        "{}",
        s.reason
    );
    let line = serde_json::to_string(&plan).unwrap();
    assert!(line.contains("min_predicted_slack"), "{line}");
    // Without the check (null) the same downsize goes ahead.
    let p = PartiesParams {
        max_util: Some(0.8),
        ..evidence()
    };
    let plan = Parties::new("x", p, 1).decide(0, &snap(vec![busy.clone()]), &cur, &n);
    assert_eq!(kinds(&plan, DecisionKind::Downsize).len(), 1, "{plan:?}");
    // On 8 cores (U 0.30) one core fewer adds ~30 µs: done.
    let cur = allocs(&[("a", 8, 0, 0, 0)]);
    let plan = c.decide(500, &snap(vec![busy]), &cur, &n);
    assert_eq!(kinds(&plan, DecisionKind::Downsize).len(), 1, "{plan:?}");
    assert!(plan.skipped.is_empty(), "{plan:?}");
}

/// An app past `max_util` is upsized before another app gives back, and
/// among violating apps the saturated one goes first.
#[test]
fn apps_whose_headroom_is_gone_are_upsized_first() {
    let p = PartiesParams {
        max_util: Some(0.8),
        ..evidence()
    };
    let n = node(8, 0, false, false);
    let hot = AppState {
        cpus_used: Some(1.9),
        ..lc("hot", Some(0.1))
    };
    let cur = allocs(&[("hot", 2, 0, 0, 0), ("spare", 3, 0, 0, 0)]);
    let mut c = Parties::new("x", p.clone(), 1);
    let plan = c.decide(
        0,
        &snap(vec![hot.clone(), lc("spare", Some(0.6))]),
        &cur,
        &n,
    );
    assert_eq!(
        kinds(&plan, DecisionKind::Upsize),
        vec![("hot".to_owned(), CORES, 2, 3)],
        "{plan:?}"
    );
    assert!(plan.decisions[0].reason.contains("headroom gone"));
    // Both violating: the saturated one first, though its slack is higher.
    let mut c = Parties::new("x", p, 1);
    let hot = AppState {
        latency_us: Some(1020.0),
        ..hot
    };
    let plan = c.decide(0, &snap(vec![hot, lc("spare", Some(-0.5))]), &cur, &n);
    assert_eq!(kinds(&plan, DecisionKind::Upsize)[0].0, "hot", "{plan:?}");
}

/// `downsize_below_util`: an app in the hysteresis band (slack 0.1) on 8
/// cores with 0.8 of them busy gives one back (U 0.11 with 7), but not
/// when one fewer would leave it above the bound.
#[test]
fn idle_cpus_are_given_back_from_the_hysteresis_band() {
    let p = PartiesParams {
        max_util: Some(0.8),
        downsize_below_util: Some(0.5),
        ..evidence()
    };
    let n = node(8, 0, false, false);
    let idle = AppState {
        cpus_used: Some(0.8),
        ..lc("a", Some(0.1))
    };
    let mut c = Parties::new("x", p.clone(), 1);
    let plan = c.decide(
        0,
        &snap(vec![idle.clone()]),
        &allocs(&[("a", 8, 0, 0, 0)]),
        &n,
    );
    assert_eq!(
        kinds(&plan, DecisionKind::Downsize),
        vec![("a".to_owned(), CORES, 8, 7)],
        "{plan:?}"
    );
    assert!(plan.decisions[0].reason.contains("downsize_below_util"));
    // On 2 cores, 0.8 busy with one fewer is U 0.8 >= 0.5: kept.
    let mut c = Parties::new("x", p, 1);
    let plan = c.decide(0, &snap(vec![idle]), &allocs(&[("a", 2, 0, 0, 0)]), &n);
    assert!(plan.decisions.is_empty(), "{plan:?}");
}

/// `trend_upsize_intervals`: slack 0.15 (in the band, no action) on 4
/// cores of 0.5 ms requests while X climbs 200 req/s per interval. Once
/// the window holds 4 intervals the next interval's 5800 req/s is
/// predicted to add ~0.18 of the target to the p99's wait (M/M/c):
/// upsized now, and the reason says why. A flat or falling X, or a
/// window not yet full, changes nothing; an app that cannot grow is
/// listed in `skipped`.
#[test]
fn an_upsize_comes_ahead_of_a_load_that_climbs_toward_the_target() {
    let p = PartiesParams {
        trend_upsize_intervals: Some(4),
        ..evidence()
    };
    let at = |rps: f64| AppState {
        rps,
        cpus_used: Some(rps * 0.0005),
        ..lc("a", Some(0.15))
    };
    let run = |rates: &[f64], cores: u32| {
        let mut c = Parties::new("x", p.clone(), 1);
        let n = node(cores, 0, false, false);
        let cur = allocs(&[("a", 4, 0, 0, 0)]);
        let mut plans = Vec::new();
        for (i, r) in rates.iter().enumerate() {
            let plan = c.decide(i as u64 * 500, &snap(vec![at(*r)]), &cur, &n);
            c.applied(i as u64 * 500, &plan, &cur);
            plans.push(plan);
        }
        plans
    };
    let plans = run(&[5000.0, 5200.0, 5400.0, 5600.0], 16);
    for plan in &plans[..3] {
        assert!(plan.decisions.is_empty(), "window not full: {plan:?}");
    }
    let up = kinds(&plans[3], DecisionKind::Upsize);
    assert_eq!(up, vec![("a".to_string(), CORES, 4, 5)], "{:?}", plans[3]);
    let why = &plans[3].decisions[0].reason;
    assert!(
        why.contains("predicted at the next interval's X 5800 req/s")
            && why.contains("trend +200 req/s per interval")
            && why.contains("on 4.0 CPUs"),
        "{why}"
    );
    for flat in [[5600.0; 4], [5600.0, 5400.0, 5200.0, 5000.0]] {
        let plans = run(&flat, 16);
        assert!(plans.iter().all(|p| p.decisions.is_empty()), "{plans:?}");
    }
    // Off (null): the paper's rule, nothing in the band.
    let mut c = Parties::new("x", evidence(), 1);
    let n = node(16, 0, false, false);
    let cur = allocs(&[("a", 4, 0, 0, 0)]);
    for (i, r) in [5000.0, 5200.0, 5400.0, 5600.0].iter().enumerate() {
        let plan = c.decide(i as u64 * 500, &snap(vec![at(*r)]), &cur, &n);
        assert!(plan.decisions.is_empty(), "{plan:?}");
    }
    // No core left on a 4-core node: not made, and said so.
    let plans = run(&[5000.0, 5200.0, 5400.0, 5600.0], 4);
    let last = &plans[3];
    assert!(
        last.decisions.is_empty() && last.cannot_meet.is_empty(),
        "{last:?}"
    );
    let s = &last.skipped[0];
    assert_eq!((s.resource, s.kind), (CORES, DecisionKind::Upsize));
    assert!(s.reason.contains("no resource can grow"), "{}", s.reason);
}
