//! PARTIES and hedging: turned on only as the last resort, when no
//! resource can grow for a violating app that may be hedged; given back
//! first when there is slack to spare.

use qosd_core::knobs::{HEDGE_OFF, HEDGE_ON};
use qosd_core::{DecisionKind, Policy, Resource};

use super::*;
use crate::testkit::*;

/// One core, nothing else to grow, and hedging.
fn node_with_hedge() -> qosd_core::NodeCaps {
    qosd_core::NodeCaps {
        hedge: true,
        ..node(1, 0, false, false)
    }
}

#[test]
fn hedging_is_the_last_resort_and_only_where_allowed() {
    let mut p = Parties::new("parties", PartiesParams::default(), 1);
    let mut no_spec = lc("b", Some(-0.5));
    no_spec.limits.max.hedge = HEDGE_OFF;
    let s = snap(vec![lc("a", Some(-0.3)), no_spec]);
    let cur = allocs(&[("a", 1, 0, 0, 0), ("b", 0, 0, 0, 0)]);
    let plan = p.decide(0, &s, &cur, &node_with_hedge());
    let up: Vec<_> = plan
        .decisions
        .iter()
        .filter(|d| d.kind == DecisionKind::Upsize)
        .map(|d| (d.app.as_str(), d.resource, d.from, d.to))
        .collect();
    // `b` is first (least slack) but has no spec: it cannot be helped.
    assert_eq!(up, vec![("a", Resource::Hedge, HEDGE_OFF, HEDGE_ON)]);
    assert!(plan.decisions[0].reason.contains("last resort"));
    assert_eq!(plan.allocations["a"].hedge, HEDGE_ON);
    assert_eq!(plan.cannot_meet.len(), 1, "{:?}", plan.cannot_meet);
    assert_eq!(plan.cannot_meet[0].app, "b");

    // Where a resource can still grow, it grows instead.
    let mut p = Parties::new("parties", PartiesParams::default(), 1);
    let two = qosd_core::NodeCaps {
        nr_cores: 2,
        ..node_with_hedge()
    };
    let plan = p.decide(0, &snap(vec![lc("a", Some(-0.3))]), &cur, &two);
    assert_eq!(plan.decisions[0].resource, Resource::Cores);
}

#[test]
fn hedging_is_given_back_first() {
    let mut p = Parties::new("parties", PartiesParams::default(), 1);
    let mut cur = allocs(&[("a", 1, 0, 0, 0)]);
    cur.get_mut("a").unwrap().hedge = HEDGE_ON;
    let two = qosd_core::NodeCaps {
        nr_cores: 2,
        ..node_with_hedge()
    };
    let plan = p.decide(0, &snap(vec![lc("a", Some(0.6))]), &cur, &two);
    let d = &plan.decisions[0];
    assert_eq!(
        (d.kind, d.resource, d.from, d.to),
        (DecisionKind::Downsize, Resource::Hedge, HEDGE_ON, HEDGE_OFF)
    );
}

#[test]
fn an_idle_app_keeps_its_hedging() {
    // `start: on` and no request yet: idle_slack (1.0) says "spare", but
    // an interval without requests is no evidence against hedging.
    let mut p = Parties::new("parties", PartiesParams::default(), 1);
    let mut cur = allocs(&[("a", 1, 0, 0, 0)]);
    cur.get_mut("a").unwrap().hedge = HEDGE_ON;
    let two = qosd_core::NodeCaps {
        nr_cores: 2,
        ..node_with_hedge()
    };
    let plan = p.decide(0, &snap(vec![lc("a", None)]), &cur, &two);
    assert_eq!(
        plan.allocations["a"].hedge, HEDGE_ON,
        "{:?}",
        plan.decisions
    );
    assert!(
        plan.decisions.iter().all(|d| d.resource != Resource::Hedge),
        "{:?}",
        plan.decisions
    );
    // With requests and slack to spare, it is given back as before.
    let plan = p.decide(600, &snap(vec![lc("a", Some(0.6))]), &cur, &two);
    assert_eq!(
        plan.allocations["a"].hedge, HEDGE_OFF,
        "{:?}",
        plan.decisions
    );
}
