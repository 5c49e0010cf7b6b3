//! PARTIES on a node whose apps share the CPUs, best-effort quota first
//! (`quota_be_first`): the BE cap moves, the LC app stays uncapped, and an
//! LC app is capped only for another LC app.

use qosd_core::{quota, DecisionKind, NodeCaps, Plan, Policy, Resource, Snapshot};

use super::*;
use crate::testkit::*;

const QUOTA: Resource = Resource::CpuQuota;
type Row = (String, Resource, DecisionKind, u32, u32);

fn be_first() -> Parties {
    let params = PartiesParams {
        cycle: vec![QUOTA],
        quota_be_first: true,
        ..PartiesParams::default()
    };
    Parties::new("parties", params, 0)
}

/// 2 shared CPUs, 0.1 CPU steps.
fn shared() -> NodeCaps {
    quota_node(0, 2, 100)
}

fn decide(p: &mut Parties, s: &Snapshot, cur: &Allocations) -> Vec<Row> {
    let plan: Plan = p.decide(0, s, cur, &shared());
    quota::check(&plan.allocations, &shared()).unwrap_or_else(|e| panic!("{e}: {plan:?}"));
    plan.decisions
        .iter()
        .map(|d| (d.app.clone(), d.resource, d.kind, d.from, d.to))
        .collect()
}

fn row(app: &str, k: DecisionKind, from: u32, to: u32) -> Row {
    (app.to_owned(), QUOTA, k, from, to)
}

/// An uncapped LC app short of slack: the BE cap falls a step, the LC
/// app's own quota is not touched.
#[test]
fn upsize_lowers_the_best_effort_cap() {
    let s = snap(vec![lc("search", Some(-0.2)), be("batch")]);
    let cur = quota_allocs(&[("search", 0, 2000), ("batch", 0, 1500)]);
    assert_eq!(
        decide(&mut be_first(), &s, &cur),
        vec![row("batch", DecisionKind::Reclaim, 1500, 1400)]
    );
    // An unset BE quota (0) is no cap: it is capped a step below all CPUs.
    let cur = quota_allocs(&[("search", 0, 2000), ("batch", 0, 0)]);
    assert_eq!(
        decide(&mut be_first(), &s, &cur),
        vec![row("batch", DecisionKind::Reclaim, 2000, 1900)]
    );
}

/// An LC app with slack: the BE cap rises a step from the CPUs no cap
/// holds; the LC app is not cut. At the BE ceiling nothing changes.
#[test]
fn downsize_raises_the_best_effort_cap_not_the_lc_quota() {
    let s = snap(vec![lc("search", Some(0.6)), be("batch")]);
    let cur = quota_allocs(&[("search", 0, 2000), ("batch", 0, 1500)]);
    assert_eq!(
        decide(&mut be_first(), &s, &cur),
        vec![row("batch", DecisionKind::Grant, 1500, 1600)]
    );
    let cur = quota_allocs(&[("search", 0, 2000), ("batch", 0, 2000)]);
    assert_eq!(decide(&mut be_first(), &s, &cur), vec![]);
}

/// The even split a replay starts from caps the LC app; with no other LC
/// app to protect, its first quota action lifts the cap (a downsize also
/// hands the best-effort app a step of what the cap held).
#[test]
fn a_lone_lc_app_has_its_cap_lifted() {
    let cur = quota_allocs(&[("search", 0, 1000), ("batch", 0, 1000)]);
    let s = snap(vec![lc("search", Some(-0.2)), be("batch")]);
    assert_eq!(
        decide(&mut be_first(), &s, &cur),
        vec![row("search", DecisionKind::Upsize, 1000, 2000)]
    );
    let s = snap(vec![lc("search", Some(0.6)), be("batch")]);
    assert_eq!(
        decide(&mut be_first(), &s, &cur),
        vec![
            row("search", DecisionKind::Upsize, 1000, 2000),
            row("batch", DecisionKind::Grant, 1000, 1100),
        ]
    );
}

/// Two LC apps and no best-effort cap left (at its floor): the other LC
/// app with slack is capped a step under what it uses (0.2 of 2 CPUs =
/// 0.4 CPU → 0.3), not a step under all CPUs.
#[test]
fn an_lc_app_is_capped_only_for_another_lc_app() {
    let mut s = snap(vec![
        lc("search", Some(-0.2)),
        lc("kv", Some(0.6)),
        be("batch"),
    ]);
    s.apps.iter_mut().find(|a| a.name == "kv").unwrap().cpu_util = 0.2;
    let cur = quota_allocs(&[("search", 0, 2000), ("kv", 0, 2000), ("batch", 0, 100)]);
    assert_eq!(
        decide(&mut be_first(), &s, &cur),
        vec![row("kv", DecisionKind::Reclaim, 2000, 300)]
    );
    // With BE cap to spare, the BE cap goes first even beside a victim.
    let cur = quota_allocs(&[("search", 0, 2000), ("kv", 0, 2000), ("batch", 0, 800)]);
    assert_eq!(
        decide(&mut be_first(), &s, &cur),
        vec![row("batch", DecisionKind::Reclaim, 800, 700)]
    );
    // kv without slack to spare is no victim: search cannot be met.
    let s = with_slack(s, "kv", Some(0.1));
    let cur = quota_allocs(&[("search", 0, 2000), ("kv", 0, 2000), ("batch", 0, 100)]);
    let plan = be_first().decide(0, &s, &cur, &shared());
    assert!(plan.decisions.is_empty(), "{plan:?}");
    assert_eq!(plan.cannot_meet.len(), 1);
}

/// An LC app capped beside another LC app moves by the common rule: its
/// own cap grows (from the CPUs no cap holds) and shrinks.
#[test]
fn a_capped_lc_app_beside_another_moves_its_own_cap() {
    let s = snap(vec![
        lc("kv", Some(-0.2)),
        lc("search", Some(0.1)),
        be("batch"),
    ]);
    let cur = quota_allocs(&[("search", 0, 2000), ("kv", 0, 300), ("batch", 0, 1500)]);
    assert_eq!(
        decide(&mut be_first(), &s, &cur),
        vec![row("kv", DecisionKind::Upsize, 300, 400)]
    );
    let s = snap(vec![
        lc("kv", Some(0.6)),
        lc("search", Some(0.1)),
        be("batch"),
    ]);
    assert_eq!(
        decide(&mut be_first(), &s, &cur),
        vec![
            row("kv", DecisionKind::Downsize, 300, 200),
            row("batch", DecisionKind::Grant, 1500, 1600),
        ]
    );
}

/// Without `quota_be_first` the LC app's own quota moves (the old rule).
#[test]
fn without_be_first_the_lc_quota_is_cut() {
    let mut p = Parties::new(
        "parties",
        PartiesParams {
            cycle: vec![QUOTA],
            ..PartiesParams::default()
        },
        0,
    );
    let s = snap(vec![lc("search", Some(0.6)), be("batch")]);
    let cur = quota_allocs(&[("search", 0, 1000), ("batch", 0, 1000)]);
    assert_eq!(
        decide(&mut p, &s, &cur),
        vec![
            row("search", DecisionKind::Downsize, 1000, 900),
            row("batch", DecisionKind::Grant, 1000, 1100),
        ]
    );
}

/// A lifted cap that hurt is reverted exactly like any downsize.
#[test]
fn a_harmful_be_grant_is_reverted() {
    let mut p = be_first();
    let cur = quota_allocs(&[("search", 0, 2000), ("batch", 0, 1500)]);
    let good = snap(vec![lc("search", Some(0.6)), be("batch")]);
    let plan = p.decide(0, &good, &cur, &shared());
    p.applied(0, &plan, &plan.allocations);
    let bad = snap(vec![lc("search", Some(-0.3)), be("batch")]);
    p.observe(100, &bad);
    let plan2 = p.decide(500, &bad, &plan.allocations, &shared());
    let got: Vec<Row> = plan2
        .decisions
        .iter()
        .map(|d| (d.app.clone(), d.resource, d.kind, d.from, d.to))
        .collect();
    assert_eq!(got, vec![row("batch", DecisionKind::Revert, 1600, 1500)]);
}
