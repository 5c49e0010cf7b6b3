//! Rule engine tests on synthetic snapshots, and the shipped rule policies.

use std::path::Path;

use qosd_core::{DecisionKind, Plan, Policy, Resource};

use crate::testkit::*;
use crate::PolicyFile;

const CORES: Resource = Resource::Cores;
const FREQ: Resource = Resource::Frequency;

fn policy(yaml: &str) -> Box<dyn Policy + Send> {
    PolicyFile::parse(Path::new("t.yaml"), yaml)
        .unwrap_or_else(|e| panic!("{e}"))
        .build(0)
}

fn shipped(name: &str) -> Box<dyn Policy + Send> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../policies")
        .join(name);
    crate::load(&path, 0).unwrap_or_else(|e| panic!("{e}"))
}

fn changes(plan: &Plan) -> Vec<(String, Resource, DecisionKind, u32, u32)> {
    plan.decisions
        .iter()
        .map(|d| (d.app.clone(), d.resource, d.kind, d.from, d.to))
        .collect()
}

fn ch(
    app: &str,
    r: Resource,
    k: DecisionKind,
    from: u32,
    to: u32,
) -> (String, Resource, DecisionKind, u32, u32) {
    (app.to_owned(), r, k, from, to)
}

const TWO_RULES: &str = r#"
name: t
rules:
  - name: low
    priority: 1
    when: ["slack < 0.05"]
    then: [{ resource: frequency, change: +1 }]
  - name: high
    priority: 9
    when: ["slack < 0.05"]
    then: [{ resource: cores, change: +1 }]
    cooldown_ms: 1000
"#;

#[test]
fn higher_priority_rule_fires_first() {
    let mut p = policy(TWO_RULES);
    let s = snap(vec![lc("a", Some(0.0))]);
    let plan = p.decide(
        0,
        &s,
        &allocs(&[("a", 1, 0, 2000, 0)]),
        &node(4, 0, true, false),
    );
    assert_eq!(
        changes(&plan),
        vec![ch("a", CORES, DecisionKind::Upsize, 1, 2)]
    );
    assert!(
        plan.decisions[0]
            .reason
            .starts_with("rule `high`: slack < 0.05 (is 0.000)"),
        "{}",
        plan.decisions[0].reason
    );
}

#[test]
fn cooldown_lets_the_next_rule_through() {
    let mut p = policy(TWO_RULES);
    let n = node(4, 0, true, false);
    let s = snap(vec![lc("a", Some(0.0))]);
    let plan = p.decide(0, &s, &allocs(&[("a", 1, 0, 2000, 0)]), &n);
    // `high` cools down for 1 s: `low` fires meanwhile.
    let plan = p.decide(500, &s, &plan.allocations, &n);
    assert_eq!(
        changes(&plan),
        vec![ch("a", FREQ, DecisionKind::Upsize, 2000, 2100)]
    );
    let plan = p.decide(1000, &s, &plan.allocations, &n);
    assert_eq!(
        changes(&plan),
        vec![ch("a", CORES, DecisionKind::Upsize, 2, 3)]
    );
}

#[test]
fn first_applicable_action_is_taken() {
    let mut p = shipped("power-saver.yaml");
    let n = node(4, 0, true, false);
    let s = snap(vec![lc("a", Some(0.5))]);
    // Frequency above its minimum: lowered first, cores kept.
    let plan = p.decide(0, &s, &allocs(&[("a", 2, 0, 1100, 0)]), &n);
    assert_eq!(
        changes(&plan),
        vec![ch("a", FREQ, DecisionKind::Downsize, 1100, 1000)]
    );
    // At the minimum frequency: the next action takes a core.
    let plan = p.decide(2000, &s, &plan.allocations, &n);
    assert_eq!(
        changes(&plan),
        vec![ch("a", CORES, DecisionKind::Downsize, 2, 1)]
    );
    // Freed cores stay idle in power-saver.
    assert!(plan.decisions.iter().all(|d| d.kind != DecisionKind::Grant));
}

#[test]
fn resources_the_node_lacks_are_skipped() {
    let mut p = shipped("power-saver.yaml");
    let s = snap(vec![lc("a", Some(0.0))]);
    // No cpufreq here: short-of-slack goes straight to cores.
    let plan = p.decide(
        0,
        &s,
        &allocs(&[("a", 1, 0, 0, 0)]),
        &node(2, 0, false, false),
    );
    assert_eq!(
        changes(&plan),
        vec![ch("a", CORES, DecisionKind::Upsize, 1, 2)]
    );
}

#[test]
fn max_actions_bounds_changes_per_decision_least_slack_first() {
    let one = r#"
name: t
rules:
  - name: up
    when: ["slack < 0.05"]
    then: [{ resource: cores, change: +1 }]
"#;
    let s = snap(vec![lc("a", Some(0.01)), lc("b", Some(-0.5))]);
    let cur = allocs(&[("a", 1, 0, 0, 0), ("b", 1, 0, 0, 0)]);
    let n = node(8, 0, false, false);
    let plan = policy(one).decide(0, &s, &cur, &n);
    assert_eq!(
        changes(&plan),
        vec![ch("b", CORES, DecisionKind::Upsize, 1, 2)]
    );
    let two = format!("{one}settings: {{ max_actions: 2 }}\n");
    let plan = policy(&two).decide(0, &s, &cur, &n);
    assert_eq!(changes(&plan).len(), 2);
}

#[test]
fn class_and_app_selectors() {
    let yaml = r#"
name: t
rules:
  - name: be-only
    class: be
    then: [{ resource: cores, change: -1 }]
  - name: named
    class: any
    apps: [b]
    when: ["rps > 10"]
    then: [{ resource: cores, change: +2 }]
settings: { max_actions: 4, freed_to_best_effort: false }
"#;
    let s = snap(vec![lc("a", Some(0.5)), lc("b", Some(0.5)), be("x")]);
    let cur = allocs(&[("a", 1, 0, 0, 0), ("b", 1, 0, 0, 0), ("x", 3, 0, 0, 0)]);
    let plan = policy(yaml).decide(0, &s, &cur, &node(8, 0, false, false));
    let mut got = changes(&plan);
    got.sort();
    assert_eq!(
        got,
        vec![
            ch("b", CORES, DecisionKind::Upsize, 1, 3),
            ch("x", CORES, DecisionKind::Downsize, 3, 2),
        ]
    );
}

#[test]
fn unknown_measurements_do_not_fire() {
    let yaml = r#"
name: t
rules:
  - name: p
    when: ["power_w > 1", "slack < 2"]
    then: [{ resource: cores, change: -1 }]
"#;
    let s = snap(vec![lc("a", Some(0.5))]); // no power sensor
    let plan = policy(yaml).decide(
        0,
        &s,
        &allocs(&[("a", 2, 0, 0, 0)]),
        &node(4, 0, false, false),
    );
    assert!(plan.decisions.is_empty());
}

#[test]
fn raises_take_from_victims_and_rule_victims_override() {
    let yaml = r#"
name: t
rules:
  - name: up
    when: ["slack < 0"]
    then: [{ resource: cores, change: +1 }]
  - name: be-grow
    class: be
    then: [{ resource: cores, change: +1 }]
    victims: [free_pool]
settings: { max_actions: 2 }
"#;
    let s = snap(vec![lc("a", Some(-0.1)), be("x")]);
    // Node full: a takes from the BE app; x cannot grow (no free core).
    let plan = policy(yaml).decide(
        0,
        &s,
        &allocs(&[("a", 1, 0, 0, 0), ("x", 3, 0, 0, 0)]),
        &node(4, 0, false, false),
    );
    assert_eq!(
        changes(&plan),
        vec![
            ch("x", CORES, DecisionKind::Reclaim, 3, 2),
            ch("a", CORES, DecisionKind::Upsize, 1, 2),
        ]
    );
}

#[test]
fn cpu_util_policy_grows_busy_apps_and_guards_the_target() {
    let mut p = shipped("cpu-util.yaml");
    let mut busy = lc("a", Some(0.5));
    busy.cpu_util = 0.95;
    let mut quiet = lc("b", Some(0.6));
    quiet.cpu_util = 0.1;
    let s = snap(vec![busy, quiet]);
    let plan = p.decide(
        0,
        &s,
        &allocs(&[("a", 1, 0, 0, 0), ("b", 3, 0, 0, 0)]),
        &node(4, 0, false, false),
    );
    let mut got = changes(&plan);
    got.sort();
    // a takes b's freed core? No: a grows first from the free pool (4 - 4 = 0
    // free) then from best-effort (none): nothing. b shrinks.
    assert_eq!(got, vec![ch("b", CORES, DecisionKind::Downsize, 3, 2)]);
    // Next decision: a grows into the core b gave back.
    let plan = p.decide(500, &s, &plan.allocations, &node(4, 0, false, false));
    assert_eq!(
        changes(&plan),
        vec![ch("a", CORES, DecisionKind::Upsize, 1, 2)]
    );
}

#[test]
fn bad_rule_files_name_the_key() {
    let e = PolicyFile::parse(
        Path::new("t.yaml"),
        "name: t\nrules:\n  - name: r\n    then: [{ resource: cores, change: 0 }]\n",
    )
    .unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (4, "rules[0].then[0].change"),
        "{e}"
    );

    let e = PolicyFile::parse(
        Path::new("t.yaml"),
        "name: t\nrules:\n  - name: r\n    then:\n      - { resource: gpus, change: 1 }\n",
    )
    .unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (5, "rules[0].then[0].resource"),
        "{e}"
    );
    assert!(e.msg.contains("unknown variant `gpus`"), "{e}");

    let e = PolicyFile::parse(
        Path::new("t.yaml"),
        "name: t\nrules:\n  - name: r\n    when: [\"slack < 0\", \"lat > 3ms\"]\n    then: [{ resource: cores, change: 1 }]\n",
    )
    .unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (4, "rules[0].when[1]"), "{e}");
    assert!(e.msg.contains("unknown metric `lat`"), "{e}");

    let e = PolicyFile::parse(
        Path::new("t.yaml"),
        "name: t\nrules:\n  - name: r\n    then: [{ resource: cores, change: 1 }]\n  - name: r\n    then: [{ resource: cores, change: 1 }]\n",
    )
    .unwrap_err();
    assert_eq!(
        (e.line, e.col, e.key.as_str()),
        (5, 5, "rules[1].name"),
        "{e}"
    );
}

#[test]
fn a_quota_change_moves_the_nodes_unit_by_default() {
    // `step.cpu_quota_milli` defaults to 0: the node's unit (here 0.1 CPU),
    // not a step of nothing.
    let mut p = policy(
        "name: t\nsettings: { victims: [free_pool] }\nrules:\n  - name: shrink\n    class: be\n    \
         when: [\"rps < 1\"]\n    then: [{ resource: cpu_quota, change: -2 }]\n",
    );
    let node = quota_node(0, 2, 100);
    let cur = quota_allocs(&[("a", 0, 1000), ("b", 0, 1000)]);
    let plan = p.decide(500, &snap(vec![lc("a", Some(0.1)), be("b")]), &cur, &node);
    assert_eq!(
        changes(&plan),
        vec![ch(
            "b",
            Resource::CpuQuota,
            DecisionKind::Downsize,
            1000,
            800
        )]
    );
}

/// With no knob bounding the app (the cores knob off, no quota) a rule on
/// operational analysis judges it on the node's online CPUs.
#[test]
fn utilisation_without_a_cpu_knob_is_of_the_nodes_cpus() {
    const BUSY: &str = "name: t\nsettings: { victims: [free_pool] }\nrules:\n  - name: busy\n    \
         when: [\"util > 0.7\"]\n    then: [{ resource: frequency, change: +1 }]\n";
    // 1000 req/s using 1.5 CPUs: U 0.75 on 2 CPUs, 0.375 on 4.
    let mut a = lc("a", Some(0.3));
    a.cpus_used = Some(1.5);
    let s = snap(vec![a]);
    let cur = allocs(&[("a", 0, 0, 2000, 0)]);
    let fired = |nr_cpus: u32| {
        let node = qosd_core::NodeCaps {
            nr_cpus,
            ..node(0, 0, true, false)
        };
        changes(&policy(BUSY).decide(0, &s, &cur, &node))
    };
    assert_eq!(
        fired(2),
        vec![ch("a", FREQ, DecisionKind::Upsize, 2000, 2100)]
    );
    assert!(fired(4).is_empty());
    // The node's size unknown: no utilisation, the rule does not fire.
    assert!(fired(0).is_empty());
}
