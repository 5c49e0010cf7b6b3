//! PARTIES moving CPU quota under the quota-and-cores rule
//! (`qosd_core::quota`): at most the cores held; where apps share CPUs,
//! the quotas are a pool of the node's CPUs, taken from best-effort apps
//! first and freed to them.

use qosd_core::{quota, DecisionKind, NodeCaps, Plan, Policy, Resource, Snapshot};

use super::*;
use crate::testkit::*;

const QUOTA: Resource = Resource::CpuQuota;
const CORES: Resource = Resource::Cores;

fn with_cycle(cycle: &[Resource]) -> PartiesParams {
    PartiesParams {
        cycle: cycle.to_vec(),
        ..PartiesParams::default()
    }
}

fn changes(plan: &Plan) -> Vec<(String, Resource, DecisionKind, u32, u32)> {
    plan.decisions
        .iter()
        .map(|d| (d.app.clone(), d.resource, d.kind, d.from, d.to))
        .collect()
}

/// Decides once and checks the plan keeps the quota rule.
fn decide(p: &mut Parties, s: &Snapshot, cur: &Allocations, n: &NodeCaps) -> Plan {
    let plan = p.decide(0, s, cur, n);
    quota::check(&plan.allocations, n).unwrap_or_else(|e| panic!("{e}: {plan:?}"));
    plan
}

fn row(
    app: &str,
    r: Resource,
    k: DecisionKind,
    from: u32,
    to: u32,
) -> (String, Resource, DecisionKind, u32, u32) {
    (app.to_owned(), r, k, from, to)
}

/// 2 shared CPUs, all quota held: search's upsize takes one unit (the
/// node's 0.1 CPU, as the step is left at 0) from the best-effort app.
#[test]
fn shared_cpus_upsize_takes_quota_from_best_effort_first() {
    let mut p = Parties::new("parties", with_cycle(&[QUOTA]), 0);
    let s = snap(vec![
        lc("search", Some(-0.2)),
        lc("other", Some(0.6)),
        be("batch"),
    ]);
    let cur = quota_allocs(&[("search", 0, 800), ("other", 0, 400), ("batch", 0, 800)]);
    let plan = decide(&mut p, &s, &cur, &quota_node(0, 2, 100));
    assert_eq!(
        changes(&plan),
        vec![
            row("batch", QUOTA, DecisionKind::Reclaim, 800, 700),
            row("search", QUOTA, DecisionKind::Upsize, 800, 900),
        ]
    );
}

/// Free quota (the sum below the node's CPUs) is used before any victim.
#[test]
fn shared_cpus_upsize_uses_free_quota_before_victims() {
    let mut p = Parties::new("parties", with_cycle(&[QUOTA]), 0);
    let s = snap(vec![lc("search", Some(-0.2)), be("batch")]);
    let cur = quota_allocs(&[("search", 0, 700), ("batch", 0, 1000)]);
    let plan = decide(&mut p, &s, &cur, &quota_node(0, 2, 250));
    assert_eq!(
        changes(&plan),
        vec![row("search", QUOTA, DecisionKind::Upsize, 700, 950)]
    );
    // 200 free is less than a unit: the best-effort app pays.
    let cur = quota_allocs(&[("search", 0, 800), ("batch", 0, 1000)]);
    let plan = decide(&mut p.clone(), &s, &cur, &quota_node(0, 2, 250));
    assert_eq!(
        changes(&plan),
        vec![
            row("batch", QUOTA, DecisionKind::Reclaim, 1000, 750),
            row("search", QUOTA, DecisionKind::Upsize, 800, 1050),
        ]
    );
}

/// Without a best-effort app to take from, only an LC app with slack
/// above victim_min_slack gives; none here, so search cannot be met.
#[test]
fn shared_cpus_full_and_no_victim_is_cannot_meet() {
    let mut p = Parties::new("parties", with_cycle(&[QUOTA]), 0);
    let s = snap(vec![lc("search", Some(-0.2)), lc("kv", Some(0.1))]);
    let cur = quota_allocs(&[("search", 0, 1000), ("kv", 0, 1000)]);
    let plan = decide(&mut p, &s, &cur, &quota_node(0, 2, 100));
    assert!(plan.decisions.is_empty(), "{plan:?}");
    assert_eq!(plan.cannot_meet.len(), 1);
    assert_eq!(plan.cannot_meet[0].app, "search");
}

/// A downsize's freed quota goes to the best-effort app.
#[test]
fn shared_cpus_downsize_frees_quota_to_best_effort() {
    let mut p = Parties::new("parties", with_cycle(&[QUOTA]), 0);
    let s = snap(vec![lc("search", Some(0.6)), be("batch")]);
    let cur = quota_allocs(&[("search", 0, 1500), ("batch", 0, 500)]);
    let plan = decide(&mut p, &s, &cur, &quota_node(0, 2, 100));
    assert_eq!(
        changes(&plan),
        vec![
            row("search", QUOTA, DecisionKind::Downsize, 1500, 1400),
            row("batch", QUOTA, DecisionKind::Grant, 500, 600),
        ]
    );
}

/// Quota at most the cores held: an app whose quota is its cores (or
/// unset) cannot grow it, and grows cores instead.
#[test]
fn quota_never_exceeds_cores_held() {
    let mut p = Parties::new("parties", with_cycle(&[QUOTA, CORES]), 0);
    while p.next_resource("search") != QUOTA {
        p.advance("search");
    }
    let s = snap(vec![lc("search", Some(-0.2)), be("batch")]);
    for q in [1000, 0] {
        let mut p = p.clone();
        let cur = quota_allocs(&[("search", 1, q), ("batch", 2, 0)]);
        let plan = decide(&mut p, &s, &cur, &quota_node(4, 4, 100));
        let c = changes(&plan);
        assert!(
            c.contains(&row("search", CORES, DecisionKind::Upsize, 1, 2)),
            "quota {q}: {c:?}"
        );
        assert!(!c.iter().any(|d| d.0 == "search" && d.1 == QUOTA), "{c:?}");
    }
}

/// Taking a core away lowers a quota above the cores left, in the same
/// plan: the victim's and the downsized app's alike.
#[test]
fn fewer_cores_lower_the_quota_in_the_same_plan() {
    let mut p = Parties::new("parties", with_cycle(&[CORES]), 0);
    // search needs a core; batch (BE) pays for it, its quota 2.0 > 1 core.
    let s = snap(vec![lc("search", Some(-0.2)), be("batch")]);
    let cur = quota_allocs(&[("search", 2, 1500), ("batch", 2, 2000)]);
    let plan = decide(&mut p, &s, &cur, &quota_node(4, 4, 100));
    assert_eq!(
        changes(&plan),
        vec![
            row("batch", CORES, DecisionKind::Reclaim, 2, 1),
            row("batch", QUOTA, DecisionKind::Reclaim, 2000, 1000),
            row("search", CORES, DecisionKind::Upsize, 2, 3),
        ]
    );
    // search with slack gives a core back: its quota 1.5 fits 2 cores
    // still... but not 1: a second downsize lowers it.
    let mut p = Parties::new("parties", with_cycle(&[CORES]), 0);
    let s = snap(vec![lc("search", Some(0.6)), be("batch")]);
    let cur = quota_allocs(&[("search", 2, 1500), ("batch", 2, 0)]);
    let plan = decide(&mut p, &s, &cur, &quota_node(4, 4, 100));
    assert_eq!(
        changes(&plan),
        vec![
            row("search", CORES, DecisionKind::Downsize, 2, 1),
            row("search", QUOTA, DecisionKind::Downsize, 1500, 1000),
            row("batch", CORES, DecisionKind::Grant, 2, 3),
        ]
    );
}

/// A step set in the policy wins over the node's unit.
#[test]
fn configured_quota_step_is_used() {
    let mut params = with_cycle(&[QUOTA]);
    params.step.cpu_quota_milli = 300;
    let mut p = Parties::new("parties", params, 0);
    let s = snap(vec![lc("search", Some(0.6)), be("batch")]);
    let cur = quota_allocs(&[("search", 0, 1500), ("batch", 0, 500)]);
    let plan = decide(&mut p, &s, &cur, &quota_node(0, 2, 100));
    assert_eq!(
        changes(&plan),
        vec![
            row("search", QUOTA, DecisionKind::Downsize, 1500, 1200),
            row("batch", QUOTA, DecisionKind::Grant, 500, 800),
        ]
    );
}
