//! The rules that keep PARTIES from starving on a real node (issue 13):
//! each test fails on the controller before them.

use qosd_core::{DecisionKind, Limits, Policy, Resource, Share};

use super::*;
use crate::testkit::*;

const CORES: Resource = Resource::Cores;
const WAYS: Resource = Resource::CacheWays;

fn cores_only() -> PartiesParams {
    PartiesParams {
        cycle: vec![CORES],
        ..PartiesParams::default()
    }
}

/// An idle app at its floor is "the most slack" forever; the next
/// most-slack app must still give its spare core back.
#[test]
fn downsize_that_cannot_happen_tries_the_next_most_slack_app() {
    let mut p = Parties::new("parties", cores_only(), 3);
    // idle: no requests (idle_slack 1.0), 1 core (its floor); a: slack 0.5.
    let s = snap(vec![lc("idle", None), lc("a", Some(0.5))]);
    let cur = allocs(&[("a", 3, 0, 0, 0), ("idle", 1, 0, 0, 0)]);
    let plan = p.decide(0, &s, &cur, &node(8, 0, false, false));
    assert_eq!(
        kinds(&plan, DecisionKind::Downsize),
        vec![("a".to_owned(), CORES, 3, 2)]
    );
}

/// The least-slack app at its maximum cannot be helped; the next
/// violating app is, and the first is reported as "cannot meet".
#[test]
fn upsize_that_cannot_happen_tries_the_next_violating_app() {
    let mut p = Parties::new("parties", cores_only(), 3);
    let mut capped = lc("a", Some(-0.5));
    capped.limits = Limits {
        max: Share {
            nr_cores: 2,
            ..Limits::default().max
        },
        ..Limits::default()
    };
    let s = snap(vec![capped, lc("b", Some(-0.1))]);
    let cur = allocs(&[("a", 2, 0, 0, 0), ("b", 1, 0, 0, 0)]);
    let plan = p.decide(0, &s, &cur, &node(8, 0, false, false));
    assert_eq!(
        kinds(&plan, DecisionKind::Upsize),
        vec![("b".to_owned(), CORES, 1, 2)]
    );
    assert_eq!(plan.cannot_meet.len(), 1, "{:?}", plan.cannot_meet);
    assert_eq!(plan.cannot_meet[0].app, "a");
}

/// A violating app on a full node with no victim: "cannot meet QoS".
#[test]
fn violating_app_with_nothing_to_give_is_reported() {
    let mut p = Parties::new("parties", cores_only(), 3);
    let s = snap(vec![lc("a", Some(-0.5)), lc("b", Some(0.1))]);
    let cur = allocs(&[("a", 3, 0, 0, 0), ("b", 1, 0, 0, 0)]);
    let plan = p.decide(0, &s, &cur, &node(4, 0, false, false));
    assert!(plan.decisions.is_empty(), "{:?}", plan.decisions);
    assert_eq!(plan.cannot_meet.len(), 1);
    assert_eq!(plan.cannot_meet[0].app, "a");
    assert!(plan.cannot_meet[0].reason.contains("slack -0.500"));
}

/// A latency-critical victim needs slack above the downsize threshold
/// (0.20): one at 0.15 would want the unit back at once.
#[test]
fn lc_victim_needs_slack_above_the_downsize_threshold() {
    assert_eq!(PartiesParams::default().victim_min_slack, 0.20);
    let mut p = Parties::new("parties", cores_only(), 3);
    let s = snap(vec![lc("a", Some(-0.2)), lc("c", Some(0.15))]);
    let cur = allocs(&[("a", 1, 0, 0, 0), ("c", 3, 0, 0, 0)]);
    let plan = p.decide(0, &s, &cur, &node(4, 0, false, false));
    assert!(kinds(&plan, DecisionKind::Reclaim).is_empty(), "{plan:?}");
    assert_eq!(plan.cannot_meet.len(), 1);
    // Above it, c pays.
    let s = snap(vec![lc("a", Some(-0.2)), lc("c", Some(0.3))]);
    let plan = p.decide(500, &s, &cur, &node(4, 0, false, false));
    assert_eq!(
        kinds(&plan, DecisionKind::Reclaim),
        vec![("c".to_owned(), CORES, 3, 2)]
    );
}

/// After an upsize at 500 ms, samples whose window still starts before
/// it say nothing about it: not counted, so the upsize did not "help".
#[test]
fn judging_counts_only_samples_taken_after_the_action() {
    let params = PartiesParams {
        cycle: vec![CORES, WAYS],
        ..PartiesParams::default()
    };
    let seed = (0..10_000)
        .find(|&s| Parties::new("x", params.clone(), s).next_resource("a") == CORES)
        .unwrap();
    let mut p = Parties::new("x", params, seed);
    let n = node(4, 8, false, false);
    let cur = allocs(&[("a", 1, 2, 0, 0)]);
    let plan = p.decide(500, &snap(vec![lc("a", Some(-0.5))]), &cur, &n);
    assert_eq!(kinds(&plan, DecisionKind::Upsize)[0].1, CORES);
    p.applied(500, &plan, &plan.allocations);
    // Lower latency in every sample, but each window began at 100 ms.
    for t in [600, 700, 800, 900, 1000] {
        let mut s = snap(vec![lc("a", Some(-0.3))]);
        s.since_ms = Some(100);
        p.observe(t, &s);
    }
    let mut s = snap(vec![lc("a", Some(-0.3))]);
    s.since_ms = Some(100);
    let plan = p.decide(1000, &s, &plan.allocations, &n);
    let up = &plan.decisions[0];
    assert!(
        up.reason.contains("did not help") && up.reason.contains("0/0"),
        "{}",
        up.reason
    );
    assert_eq!(up.resource, WAYS);
}

/// A plan that was not applied does not advance the controller: the
/// next decision tries the same resource, not the next one.
#[test]
fn failed_apply_does_not_advance_the_policy() {
    let params = PartiesParams {
        cycle: vec![CORES, WAYS],
        ..PartiesParams::default()
    };
    let seed = (0..10_000)
        .find(|&s| Parties::new("x", params.clone(), s).next_resource("a") == CORES)
        .unwrap();
    let mut p = Parties::new("x", params, seed);
    let n = node(4, 8, false, false);
    let cur = allocs(&[("a", 1, 2, 0, 0)]);
    let s = snap(vec![lc("a", Some(-0.5))]);
    let plan = p.decide(500, &s, &cur, &n);
    assert_eq!(kinds(&plan, DecisionKind::Upsize)[0].1, CORES);
    // Nothing went through: the allocation in force is the old one.
    p.applied(500, &plan, &cur);
    for t in [600, 700, 800, 900, 1000] {
        p.observe(t, &s);
    }
    let plan = p.decide(1000, &s, &cur, &n);
    assert_eq!(
        kinds(&plan, DecisionKind::Upsize),
        vec![("a".to_owned(), CORES, 1, 2)],
        "{:?}",
        plan.decisions
    );
    assert!(!plan.decisions[0].reason.contains("did not help"));
}

/// `parties-original.yaml`: a downsize is reverted only when most samples
/// after it find an app short of slack, not at the first one.
#[test]
fn majority_vote_revert_ignores_one_bad_sample() {
    let p = PartiesParams {
        cycle: vec![CORES],
        revert_vote: RevertVote::Majority,
        ..PartiesParams::default()
    };
    let mut c = Parties::new("x", p, 1);
    let n = node(8, 0, false, false);
    let cur = allocs(&[("a", 3, 0, 0, 0)]);
    let plan = c.decide(0, &snap(vec![lc("a", Some(0.5))]), &cur, &n);
    assert_eq!(kinds(&plan, DecisionKind::Downsize).len(), 1);
    c.applied(0, &plan, &plan.allocations);
    for (t, s) in [(100, 0.01), (200, 0.3), (300, 0.3), (400, 0.3), (500, 0.3)] {
        c.observe(t, &snap(vec![lc("a", Some(s))]));
    }
    let plan = c.decide(500, &snap(vec![lc("a", Some(0.3))]), &plan.allocations, &n);
    assert!(
        kinds(&plan, DecisionKind::Revert).is_empty(),
        "{:?}",
        plan.decisions
    );
}

/// `parties-original.yaml`: the moving average of the slack counts beside
/// the current one (the lower wins): a single good sample is no downsize.
#[test]
fn average_slack_holds_back_a_downsize_on_one_good_sample() {
    let p = PartiesParams {
        cycle: vec![CORES],
        average_samples: 5,
        ..PartiesParams::default()
    };
    let mut c = Parties::new("x", p, 1);
    for t in [100, 200, 300, 400] {
        c.observe(t, &snap(vec![lc("a", Some(0.0))]));
    }
    let cur = allocs(&[("a", 3, 0, 0, 0)]);
    let plan = c.decide(
        500,
        &snap(vec![lc("a", Some(0.9))]),
        &cur,
        &node(8, 0, false, false),
    );
    assert!(plan.decisions.is_empty(), "{:?}", plan.decisions);
}

/// `parties-original.yaml`: while nothing is pending the policy asks for a
/// decision every `idle_decide_ms`, not only at the interval.
#[test]
fn idle_decisions_come_between_intervals() {
    let p = PartiesParams {
        idle_decide_ms: 100,
        ..PartiesParams::default()
    };
    let mut c = Parties::new("x", p, 1);
    let cur = allocs(&[("a", 2, 0, 0, 0)]);
    // Hysteresis band: nothing pending after this decision.
    let plan = c.decide(
        500,
        &snap(vec![lc("a", Some(0.1))]),
        &cur,
        &node(8, 0, false, false),
    );
    assert!(plan.decisions.is_empty());
    assert!(!c.wants_decision(550));
    assert!(c.wants_decision(600));
    assert!(!Parties::new("y", PartiesParams::default(), 1).wants_decision(600));
}

/// `parties-original.yaml`: an app that turns (downsize after upsize)
/// restarts its wheel at a seeded place; same seed, same place.
#[test]
fn wheel_restarts_on_a_turn_seeded() {
    let p = PartiesParams {
        cycle: vec![CORES, WAYS, Resource::Frequency],
        restart_wheel_on_turn: true,
        ..PartiesParams::default()
    };
    let run = |seed: u64| {
        let mut c = Parties::new("x", p.clone(), seed);
        let n = node(8, 8, true, false);
        let cur = allocs(&[("a", 2, 2, 2000, 0)]);
        let up = c.decide(0, &snap(vec![lc("a", Some(-0.5))]), &cur, &n);
        c.applied(0, &up, &up.allocations);
        let down = c.decide(500, &snap(vec![lc("a", Some(0.9))]), &up.allocations, &n);
        (up.decisions[0].resource, down.decisions[0].resource)
    };
    assert_eq!(run(3), run(3));
    let starts: std::collections::BTreeSet<_> = (0..40).map(|s| run(s).1).collect();
    assert!(
        starts.len() > 1,
        "the restart is drawn, not fixed: {starts:?}"
    );
}
