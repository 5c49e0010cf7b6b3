//! One test per PARTIES rule, on synthetic snapshots.

use qosd_core::{DecisionKind, Plan, Policy, Resource};

use super::*;
use crate::testkit::*;
use qosd_core::yamlfile::KeyPath;

const CORES: Resource = Resource::Cores;
const WAYS: Resource = Resource::CacheWays;
const FREQ: Resource = Resource::Frequency;

/// A controller whose app `app` starts its cycle at `first`.
fn parties_starting(app: &str, first: Resource, p: PartiesParams) -> Parties {
    for seed in 0..10_000 {
        let mut c = Parties::new("parties", p.clone(), seed);
        if c.next_resource(app) == first {
            return Parties::new("parties", p, seed);
        }
    }
    panic!("no seed starts {app} at {first}");
}

fn only(plan: &Plan, kind: DecisionKind) -> Vec<(String, Resource, u32, u32)> {
    plan.decisions
        .iter()
        .filter(|d| d.kind == kind)
        .map(|d| (d.app.clone(), d.resource, d.from, d.to))
        .collect()
}

fn row(app: &str, r: Resource, from: u32, to: u32) -> (String, Resource, u32, u32) {
    (app.to_owned(), r, from, to)
}

#[test]
fn least_slack_app_is_upsized_by_one_unit() {
    let mut p = parties_starting("a", CORES, PartiesParams::default());
    let s = snap(vec![lc("a", Some(-0.3)), lc("b", Some(0.02))]);
    let cur = allocs(&[("a", 1, 2, 2000, 50), ("b", 1, 2, 2000, 50)]);
    let plan = p.decide(0, &s, &cur, &node(4, 8, true, true));
    assert_eq!(
        only(&plan, DecisionKind::Upsize),
        vec![row("a", CORES, 1, 2)]
    );
    assert_eq!(plan.decisions.len(), 1, "from the free pool: no victim");
    assert_eq!(plan.allocations["a"].nr_cores, 2);
    assert_eq!(plan.allocations["b"], cur["b"]);
    assert!(
        plan.decisions[0].reason.contains("slack -0.300"),
        "{}",
        plan.decisions[0].reason
    );
}

#[test]
fn most_slack_app_is_downsized_when_nobody_is_short() {
    let mut p = parties_starting("b", CORES, PartiesParams::default());
    let s = snap(vec![lc("a", Some(0.3)), lc("b", Some(0.6))]);
    let cur = allocs(&[("a", 2, 2, 2000, 50), ("b", 2, 2, 2000, 50)]);
    let plan = p.decide(0, &s, &cur, &node(4, 8, true, true));
    assert_eq!(
        only(&plan, DecisionKind::Downsize),
        vec![row("b", CORES, 2, 1)]
    );
    assert_eq!(plan.decisions.len(), 1);
}

#[test]
fn hysteresis_band_changes_nothing() {
    let mut p = Parties::new("parties", PartiesParams::default(), 7);
    // Least slack 0.05 (not below), most slack 0.20 (not above).
    let s = snap(vec![lc("a", Some(0.05)), lc("b", Some(0.20))]);
    let cur = allocs(&[("a", 2, 2, 2000, 50), ("b", 2, 2, 2000, 50)]);
    let plan = p.decide(0, &s, &cur, &node(4, 8, true, true));
    assert!(plan.decisions.is_empty(), "{:?}", plan.decisions);
    assert_eq!(plan.allocations, cur);
}

/// Upsize at t=0, then samples at 100..=500 ms with the given latencies
/// of "a" relative to its latency at t=0, then the next decision.
fn upsize_then_samples(falls: &[bool]) -> (Parties, Plan) {
    let params = PartiesParams {
        cycle: vec![CORES, WAYS, FREQ],
        ..PartiesParams::default()
    };
    let mut p = parties_starting("a", CORES, params);
    let n = node(4, 8, true, false);
    let s0 = snap(vec![lc("a", Some(-0.5))]);
    let cur = allocs(&[("a", 1, 2, 2000, 0)]);
    let plan = p.decide(0, &s0, &cur, &n);
    assert_eq!(
        only(&plan, DecisionKind::Upsize),
        vec![row("a", CORES, 1, 2)]
    );
    let mut t = 0;
    for &fell in falls {
        t += 100;
        let s = if fell { -0.4 } else { -0.6 };
        p.observe(t, &snap(vec![lc("a", Some(s))]));
    }
    // Still short of slack at the next decision (same tick as the last sample).
    let plan = p.decide(t, &snap(vec![lc("a", Some(-0.45))]), &plan.allocations, &n);
    (p, plan)
}

#[test]
fn resource_that_helped_is_tried_again() {
    let (_, plan) = upsize_then_samples(&[true, true, false, true, true]);
    assert_eq!(
        only(&plan, DecisionKind::Upsize),
        vec![row("a", CORES, 2, 3)]
    );
    assert!(
        plan.decisions[0].reason.contains("helped"),
        "{}",
        plan.decisions[0].reason
    );
}

#[test]
fn upsize_that_did_not_help_is_kept_and_next_resource_tried() {
    // Latency fell in 2 of 5 samples: not the majority.
    let (_, plan) = upsize_then_samples(&[true, false, false, true, false]);
    assert_eq!(
        only(&plan, DecisionKind::Upsize),
        vec![row("a", WAYS, 2, 3)]
    );
    assert_eq!(plan.allocations["a"].nr_cores, 2, "the core is kept");
    assert!(
        plan.decisions[0].reason.contains("did not help"),
        "{}",
        plan.decisions[0].reason
    );
}

#[test]
fn harmful_downsize_is_reverted_and_app_cools_down() {
    let mut p = parties_starting("b", CORES, PartiesParams::default());
    let n = node(4, 8, false, false);
    let cur = allocs(&[("a", 1, 2, 0, 0), ("b", 3, 2, 0, 0)]);
    let calm = snap(vec![lc("a", Some(0.1)), lc("b", Some(0.5))]);
    let plan = p.decide(0, &calm, &cur, &n);
    assert_eq!(
        only(&plan, DecisionKind::Downsize),
        vec![row("b", CORES, 3, 2)]
    );
    // One sample shows b below 0.05: revert at the next decision.
    p.observe(100, &with_slack(calm.clone(), "b", Some(0.01)));
    let plan = p.decide(500, &calm, &plan.allocations, &n);
    assert_eq!(
        only(&plan, DecisionKind::Revert),
        vec![row("b", CORES, 2, 3)]
    );
    assert_eq!(plan.decisions.len(), 1);
    assert!(
        plan.decisions[0].reason.contains("30000 ms"),
        "{}",
        plan.decisions[0].reason
    );
    // b has the most slack but is cooling down: a (0.1) is in the band.
    let plan = p.decide(1000, &calm, &plan.allocations, &n);
    assert!(plan.decisions.is_empty(), "{:?}", plan.decisions);
    let plan = p.decide(29_999, &calm, &plan.allocations, &n);
    assert!(plan.decisions.is_empty(), "{:?}", plan.decisions);
    // After 30 s b may be downsized again (on its next resource: ways).
    let plan = p.decide(30_500, &calm, &plan.allocations, &n);
    assert_eq!(
        only(&plan, DecisionKind::Downsize),
        vec![row("b", WAYS, 2, 1)]
    );
}

#[test]
fn downsize_that_hurts_another_app_is_reverted_too() {
    let mut p = parties_starting("b", CORES, PartiesParams::default());
    let n = node(4, 8, false, false);
    let cur = allocs(&[("a", 1, 2, 0, 0), ("b", 3, 2, 0, 0)]);
    let calm = snap(vec![lc("a", Some(0.1)), lc("b", Some(0.5))]);
    let plan = p.decide(0, &calm, &cur, &n);
    let hurt = with_slack(calm.clone(), "a", Some(0.0));
    let plan = p.decide(500, &hurt, &plan.allocations, &n);
    assert_eq!(
        only(&plan, DecisionKind::Revert),
        vec![row("b", CORES, 2, 3)]
    );
    assert!(
        plan.decisions[0].reason.contains("pushed a"),
        "{}",
        plan.decisions[0].reason
    );
}

#[test]
fn harmless_downsize_repeats_on_the_same_resource() {
    let mut p = parties_starting("b", WAYS, PartiesParams::default());
    let n = node(4, 8, false, false);
    let calm = snap(vec![lc("b", Some(0.5))]);
    let plan = p.decide(0, &calm, &allocs(&[("b", 2, 4, 0, 0)]), &n);
    let plan = p.decide(500, &calm, &plan.allocations, &n);
    assert_eq!(
        only(&plan, DecisionKind::Downsize),
        vec![row("b", WAYS, 3, 2)]
    );
}

#[test]
fn victims_free_pool_then_best_effort_then_most_slack_lc() {
    let params = PartiesParams {
        cycle: vec![CORES],
        ..PartiesParams::default()
    };
    let n = node(4, 8, false, false);
    let short = lc("a", Some(-0.2));
    let apps = [
        short.clone(),
        be("be"),
        lc("c", Some(0.15)),
        lc("d", Some(0.4)),
    ];

    // One core free: nobody loses anything.
    let mut p = Parties::new("parties", params.clone(), 1);
    let cur = allocs(&[("a", 1, 0, 0, 0), ("be", 1, 0, 0, 0), ("c", 1, 0, 0, 0)]);
    let plan = p.decide(0, &snap(apps[..3].to_vec()), &cur, &n);
    assert!(only(&plan, DecisionKind::Reclaim).is_empty());
    assert_eq!(
        only(&plan, DecisionKind::Upsize),
        vec![row("a", CORES, 1, 2)]
    );

    // Pool empty: the best-effort app pays.
    let mut p = Parties::new("parties", params.clone(), 1);
    let cur = allocs(&[("a", 1, 0, 0, 0), ("be", 2, 0, 0, 0), ("c", 1, 0, 0, 0)]);
    let plan = p.decide(0, &snap(apps[..3].to_vec()), &cur, &n);
    assert_eq!(
        only(&plan, DecisionKind::Reclaim),
        vec![row("be", CORES, 2, 1)]
    );

    // No BE app to spare (at its minimum of 1 core): the LC app with most slack.
    let mut p = Parties::new("parties", params, 1);
    let cur = allocs(&[("a", 1, 0, 0, 0), ("c", 1, 0, 0, 0), ("d", 2, 0, 0, 0)]);
    let s = snap(vec![short, lc("c", Some(0.15)), lc("d", Some(0.4))]);
    let plan = p.decide(0, &s, &cur, &node(4, 0, false, false));
    assert_eq!(
        only(&plan, DecisionKind::Reclaim),
        vec![row("d", CORES, 2, 1)]
    );
    assert_eq!(
        plan.allocations.values().map(|a| a.nr_cores).sum::<u32>(),
        4
    );
}

#[test]
fn victim_doing_the_same_moves_to_its_next_resource() {
    let params = PartiesParams {
        cycle: vec![CORES, WAYS],
        ..PartiesParams::default()
    };
    // Find a seed where both a and d start at cores.
    let seed = (0..10_000)
        .find(|&s| {
            let mut p = Parties::new("x", params.clone(), s);
            p.next_resource("a") == CORES && p.next_resource("d") == CORES
        })
        .expect("a seed");
    let mut p = Parties::new("x", params, seed);
    let s = snap(vec![lc("a", Some(-0.2)), lc("d", Some(0.4))]);
    let cur = allocs(&[("a", 1, 1, 0, 0), ("d", 3, 1, 0, 0)]);
    let plan = p.decide(0, &s, &cur, &node(4, 2, false, false));
    assert_eq!(
        only(&plan, DecisionKind::Reclaim),
        vec![row("d", CORES, 3, 2)]
    );
    assert_eq!(p.next_resource("d"), WAYS);
    assert_eq!(p.next_resource("a"), CORES);
}

#[test]
fn freed_units_go_to_best_effort_apps() {
    let mut p = parties_starting("a", CORES, PartiesParams::default());
    let s = snap(vec![lc("a", Some(0.6)), be("x"), be("y")]);
    let cur = allocs(&[("a", 3, 2, 0, 0), ("x", 2, 2, 0, 0), ("y", 1, 2, 0, 0)]);
    let plan = p.decide(0, &s, &cur, &node(6, 8, false, false));
    assert_eq!(
        only(&plan, DecisionKind::Downsize),
        vec![row("a", CORES, 3, 2)]
    );
    // y holds the fewest cores.
    assert_eq!(
        only(&plan, DecisionKind::Grant),
        vec![row("y", CORES, 1, 2)]
    );

    let params = PartiesParams {
        freed_to_best_effort: false,
        ..PartiesParams::default()
    };
    let mut p = parties_starting("a", CORES, params);
    let plan = p.decide(0, &s, &cur, &node(6, 8, false, false));
    assert!(only(&plan, DecisionKind::Grant).is_empty());
}

#[test]
fn resources_the_node_lacks_are_skipped() {
    // Starts at ways, but the node has no CAT (and no MBA): cores next.
    let mut p = parties_starting("a", WAYS, PartiesParams::default());
    let s = snap(vec![lc("a", Some(-0.2))]);
    let cur = allocs(&[("a", 1, 0, 2000, 0)]);
    let plan = p.decide(0, &s, &cur, &node(2, 0, true, false));
    let up = only(&plan, DecisionKind::Upsize);
    assert_eq!(up.len(), 1);
    assert_ne!(up[0].1, WAYS);
    assert_ne!(up[0].1, Resource::MemoryBandwidth);
    // Only cores on the node: every upsize is cores, whatever the start.
    for seed in 0..8 {
        let mut p = Parties::new("parties", PartiesParams::default(), seed);
        let plan = p.decide(0, &s, &cur, &node(2, 0, false, false));
        assert_eq!(
            only(&plan, DecisionKind::Upsize),
            vec![row("a", CORES, 1, 2)]
        );
    }
}

#[test]
fn limits_and_full_levels_move_on_to_the_next_resource() {
    let params = PartiesParams {
        cycle: vec![FREQ, CORES],
        ..PartiesParams::default()
    };
    let mut p = parties_starting("a", FREQ, params);
    let mut a = lc("a", Some(-0.2));
    a.limits.max.nr_cores = 2;
    let s = snap(vec![a]);
    // Frequency unset (0) means full speed: nothing to raise; cores next.
    let plan = p.decide(
        0,
        &s,
        &allocs(&[("a", 1, 0, 0, 0)]),
        &node(4, 0, true, false),
    );
    assert_eq!(
        only(&plan, DecisionKind::Upsize),
        vec![row("a", CORES, 1, 2)]
    );
    // At its max cores and max frequency: no change at all.
    let plan = p.decide(500, &s, &plan.allocations, &node(4, 0, true, false));
    assert!(plan.decisions.is_empty(), "{:?}", plan.decisions);
}

#[test]
fn frequency_moves_by_its_step() {
    let params = PartiesParams {
        cycle: vec![FREQ],
        ..PartiesParams::default()
    };
    let mut p = Parties::new("parties", params, 0);
    let s = snap(vec![lc("a", Some(0.5))]);
    let plan = p.decide(
        0,
        &s,
        &allocs(&[("a", 1, 0, 2000, 0)]),
        &node(2, 0, true, false),
    );
    assert_eq!(
        only(&plan, DecisionKind::Downsize),
        vec![row("a", FREQ, 2000, 1900)]
    );
}

#[test]
fn idle_app_uses_idle_slack() {
    let n = node(4, 0, false, false);
    let cur = allocs(&[("a", 2, 0, 0, 0)]);
    let idle = snap(vec![lc("a", None)]);
    let mut p = Parties::new("parties", PartiesParams::default(), 0);
    let plan = p.decide(0, &idle, &cur, &n);
    assert_eq!(
        only(&plan, DecisionKind::Downsize),
        vec![row("a", CORES, 2, 1)]
    );
    let params = PartiesParams {
        idle_slack: None,
        ..PartiesParams::default()
    };
    let mut p = Parties::new("parties", params, 0);
    assert!(p.decide(0, &idle, &cur, &n).decisions.is_empty());
}

/// A scripted run: a load that rises and falls, reported back to the policy.
fn scripted_run(seed: u64) -> Vec<Plan> {
    let mut p = Parties::new("parties", PartiesParams::default(), seed);
    let n = node(8, 11, true, true);
    let mut cur = allocs(&[
        ("a", 1, 2, 2000, 50),
        ("b", 2, 2, 2000, 50),
        ("be", 2, 2, 2000, 50),
    ]);
    let mut plans = Vec::new();
    for i in 0..60u64 {
        let phase = (i as f64 / 10.0).sin();
        let s = snap(vec![
            lc("a", Some(0.3 * phase - 0.05)),
            lc("b", Some(0.25 - 0.2 * phase)),
            be("be"),
        ]);
        p.observe(i * 500 + 250, &s);
        let plan = p.decide(i * 500 + 500, &s, &cur, &n);
        cur = plan.allocations.clone();
        plans.push(plan);
    }
    plans
}

#[test]
fn same_seed_same_decisions() {
    let a = scripted_run(42);
    assert_eq!(a, scripted_run(42));
    assert!(a.iter().any(|p| !p.decisions.is_empty()));
    // The seed picks the starting resource: some seeds differ.
    let firsts: std::collections::BTreeSet<Resource> = (0..16)
        .map(|s| Parties::new("parties", PartiesParams::default(), s).next_resource("a"))
        .collect();
    assert!(firsts.len() >= 2, "{firsts:?}");
    assert!((0..16).any(|s| scripted_run(s) != a));
}

#[test]
fn plans_stay_within_the_node() {
    for seed in 0..8 {
        for plan in scripted_run(seed) {
            let cores: u32 = plan.allocations.values().map(|a| a.nr_cores).sum();
            let ways: u32 = plan.allocations.values().map(|a| a.nr_ways).sum();
            assert!(cores <= 8 && ways <= 11, "{plan:?}");
            for a in plan.allocations.values() {
                assert!(a.nr_cores >= 1 && a.nr_ways >= 1);
                assert!((1000..=3000).contains(&a.freq_mhz), "{a:?}");
                assert!((10..=100).contains(&a.mb_percent), "{a:?}");
            }
        }
    }
}

#[test]
fn params_are_validated() {
    let root = KeyPath::root().key("parties");
    let bad = PartiesParams {
        upsize_below_slack: 0.3,
        ..PartiesParams::default()
    };
    let e = bad.validate(&root).unwrap_err();
    assert_eq!(e.key.to_string(), "parties.downsize_above_slack");
    let bad = PartiesParams {
        cycle: vec![CORES, CORES],
        ..PartiesParams::default()
    };
    assert_eq!(
        bad.validate(&root).unwrap_err().key.to_string(),
        "parties.cycle[1]"
    );
    assert!(PartiesParams::default().validate(&root).is_ok());
}
