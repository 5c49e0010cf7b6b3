use super::*;
use crate::policy::{AppClass, AppState};
use crate::resources::Share;

/// A 2-core node with the priority knob; `app` holds both cores.
fn node() -> NodeCaps {
    NodeCaps {
        nr_cores: 2,
        cpu_priority: true,
        ..NodeCaps::default()
    }
}

fn plan(prio: u32) -> Plan {
    let share = Share {
        nr_cores: 2,
        cpu_priority: prio,
        ..Share::default()
    };
    Plan {
        allocations: [("app".to_owned(), share)].into(),
        ..Plan::default()
    }
}

/// `used` CPUs busy over the last tick and the last interval alike.
fn snap(used: Option<f64>) -> Snapshot {
    snap2(used, used)
}

/// `tick` CPUs busy over the last tick, `interval` over the last interval.
fn snap2(tick: Option<f64>, interval: Option<f64>) -> Snapshot {
    let mut a = AppState::new("app", AppClass::Lc);
    a.cpus_used_tick = tick;
    a.cpus_used = interval;
    Snapshot {
        apps: vec![a],
        ..Snapshot::default()
    }
}

/// One decision with `used` CPUs busy: the level the gate put in the plan
/// and the decisions it added.
fn step(g: &mut RtGate, used: Option<f64>, prio: u32) -> (u32, Vec<Decision>) {
    let mut p = plan(prio);
    g.gate(&snap(used), &mut p, &node());
    (p.allocations["app"].cpu_priority, p.decisions)
}

#[test]
fn on_below_the_lower_bound_off_above_the_upper() {
    let mut g = RtGate::new(["app".to_owned()]);
    // 0.42 of 2 CPUs = 0.21 < 0.6: real time, one decision saying so.
    let (lvl, d) = step(&mut g, Some(0.42), PRIORITY_NORMAL);
    assert_eq!(lvl, PRIORITY_REALTIME);
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].from, d[0].to), (PRIORITY_NORMAL, PRIORITY_REALTIME));
    assert!(d[0].reason.contains("0.21"), "{}", d[0].reason);
    // 1.5 of 2 = 0.75 > 0.7: normal at once.
    let (lvl, d) = step(&mut g, Some(1.5), PRIORITY_REALTIME);
    assert_eq!(lvl, PRIORITY_NORMAL);
    assert_eq!(d[0].kind, DecisionKind::Downsize);
}

#[test]
fn hysteresis_between_the_bounds_keeps_the_level() {
    let mut g = RtGate::new(["app".to_owned()]);
    // 1.2 of 2 = 0.6: not below 0.6, not above 0.7; off stays off.
    assert_eq!(step(&mut g, Some(1.2), PRIORITY_NORMAL).0, PRIORITY_NORMAL);
    assert_eq!(
        step(&mut g, Some(0.8), PRIORITY_NORMAL).0,
        PRIORITY_REALTIME
    );
    // On stays on at 0.6, with no decision (nothing changed).
    let (lvl, d) = step(&mut g, Some(1.2), PRIORITY_REALTIME);
    assert_eq!(lvl, PRIORITY_REALTIME);
    assert!(d.is_empty());
    assert_eq!(
        step(&mut g, Some(1.45), PRIORITY_REALTIME).0,
        PRIORITY_NORMAL
    );
}

#[test]
fn a_missing_reading_is_never_real_time() {
    let mut g = RtGate::new(["app".to_owned()]);
    assert_eq!(step(&mut g, None, PRIORITY_NORMAL).0, PRIORITY_NORMAL);
    assert_eq!(
        step(&mut g, Some(0.2), PRIORITY_NORMAL).0,
        PRIORITY_REALTIME
    );
    let (lvl, d) = step(&mut g, None, PRIORITY_REALTIME);
    assert_eq!(lvl, PRIORITY_NORMAL);
    assert!(
        d[0].reason.contains("no CPU-use reading"),
        "{}",
        d[0].reason
    );
    // The app gone from the snapshot counts as missing too.
    step(&mut g, Some(0.2), PRIORITY_NORMAL);
    let mut p = plan(PRIORITY_REALTIME);
    g.gate(&Snapshot::default(), &mut p, &node());
    assert_eq!(p.allocations["app"].cpu_priority, PRIORITY_NORMAL);
}

#[test]
fn apps_not_wanting_it_and_nodes_without_the_knob_are_left_alone() {
    let mut g = RtGate::new(["other".to_owned()]);
    assert_eq!(
        step(&mut g, Some(0.1), PRIORITY_NORMAL),
        (PRIORITY_NORMAL, vec![])
    );
    let mut g = RtGate::new(["app".to_owned()]);
    let mut p = plan(0);
    let caps = NodeCaps {
        cpu_priority: false,
        ..node()
    };
    g.gate(&snap(Some(0.1)), &mut p, &caps);
    assert_eq!(p.allocations["app"].cpu_priority, 0);
}

#[test]
fn the_cpus_held_are_the_quota_when_it_is_lower() {
    let mut g = RtGate::new(["app".to_owned()]);
    let mut p = plan(PRIORITY_NORMAL);
    p.allocations.get_mut("app").unwrap().cpu_quota_milli = 500;
    let caps = NodeCaps {
        quota: Some(crate::QuotaRange {
            step_milli: 100,
            max_milli: 2000,
        }),
        ..node()
    };
    // 0.3 CPUs of a 0.5-CPU quota = 0.6: not below 0.6 (2 cores: 0.15).
    g.gate(&snap(Some(0.3)), &mut p, &caps);
    assert_eq!(p.allocations["app"].cpu_priority, PRIORITY_NORMAL);
}

/// With only the priority knob enabled the caps count no cores and the
/// share none: the gate judges by the node's online CPUs
/// (`NodeCaps::nr_cpus`), and without them has no bound, so never real
/// time.
#[test]
fn with_no_cores_knob_the_online_cpus_are_what_the_app_holds() {
    let run = |g: &mut RtGate, used: f64, nr_cpus: u32| {
        let caps = NodeCaps {
            nr_cores: 0,
            nr_cpus,
            ..node()
        };
        let mut p = plan(PRIORITY_NORMAL);
        p.allocations.get_mut("app").unwrap().nr_cores = 0;
        g.gate(&snap(Some(used)), &mut p, &caps);
        p.allocations["app"].cpu_priority
    };
    let mut g = RtGate::new(["app".to_owned()]);
    assert_eq!(run(&mut g, 0.2, 0), PRIORITY_NORMAL);
    // 0.8 of 2 CPUs = 0.4 < 0.6: on; 1.5 of 2 = 0.75 > 0.7: off.
    assert_eq!(run(&mut g, 0.8, 2), PRIORITY_REALTIME);
    assert_eq!(run(&mut g, 1.5, 2), PRIORITY_NORMAL);
    // The same 1.5 CPUs on a 4-CPU node: 0.375, on again.
    assert_eq!(run(&mut g, 1.5, 4), PRIORITY_REALTIME);
}

/// A node measured per tick and per interval: the gate reads the higher,
/// and nothing without this tick's reading (an interval's figure kept
/// while the reads fail is stale).
#[test]
fn the_tick_reading_is_required_and_the_higher_one_counts() {
    let mut g = RtGate::new(["app".to_owned()]);
    let mut run = |tick, iv| {
        let mut p = plan(PRIORITY_NORMAL);
        g.gate(&snap2(tick, iv), &mut p, &node());
        p.allocations["app"].cpu_priority
    };
    // The interval says 0.1 CPU but this tick gave nothing: not on.
    assert_eq!(run(None, Some(0.1)), PRIORITY_NORMAL);
    // A quiet tick in a busy interval: 1.3 of 2 = 0.65, not below 0.6.
    assert_eq!(run(Some(0.2), Some(1.3)), PRIORITY_NORMAL);
    assert_eq!(run(Some(0.2), Some(0.3)), PRIORITY_REALTIME);
    // A busy tick in a quiet interval: 1.5 of 2 = 0.75, off.
    assert_eq!(run(Some(1.5), Some(0.3)), PRIORITY_NORMAL);
}

/// Between decisions the gate asks for one only for an app that has real
/// time and reads above the off bound, or reads nothing.
#[test]
fn wants_off_only_for_an_app_with_real_time_above_the_bound() {
    let mut g = RtGate::new(["app".to_owned()]);
    let cur = |prio| plan(prio).allocations;
    // Not on yet: nothing to take back, whatever it reads.
    assert!(!g.wants_off(&snap(Some(1.9)), &cur(PRIORITY_NORMAL), &node()));
    step(&mut g, Some(0.2), PRIORITY_NORMAL);
    let on = cur(PRIORITY_REALTIME);
    // 1.4 of 2 = 0.7: not above; 1.42: above; no tick reading: off too.
    assert!(!g.wants_off(&snap(Some(1.4)), &on, &node()));
    assert!(g.wants_off(&snap(Some(1.42)), &on, &node()));
    assert!(g.wants_off(&snap2(None, Some(0.2)), &on, &node()));
    let no_knob = NodeCaps {
        cpu_priority: false,
        ..node()
    };
    assert!(!g.wants_off(&snap(Some(1.9)), &on, &no_knob));
}

/// The loop acts on the gate at a monitoring tick: a gate-only plan (the
/// policy is not asked), applied and recorded as a decision.
#[test]
fn the_loop_turns_real_time_off_at_a_monitoring_tick() {
    use crate::control::{Applied, ControlLoop, NoRecorder, Node, Sensed, Tick};
    struct One {
        cur: crate::policy::Allocations,
        used: f64,
    }
    impl Node for One {
        fn caps(&self) -> NodeCaps {
            node()
        }
        fn current(&self) -> &crate::policy::Allocations {
            &self.cur
        }
        fn sense(&mut self, _: &Tick) -> Sensed {
            Sensed {
                snapshot: snap(Some(self.used)),
                ..Sensed::default()
            }
        }
        fn apply(&mut self, _: &Tick, plan: &Plan) -> Applied {
            self.cur = plan.allocations.clone();
            Applied {
                in_force: self.cur.clone(),
                ..Applied::default()
            }
        }
    }
    /// Counts its decisions; keeps everything.
    struct Counting(u32);
    impl crate::policy::Policy for Counting {
        fn name(&self) -> &str {
            "counting"
        }
        fn decide(
            &mut self,
            _: u64,
            _: &Snapshot,
            c: &crate::policy::Allocations,
            _: &NodeCaps,
        ) -> Plan {
            self.0 += 1;
            Plan::keep(c)
        }
    }
    let mut n = One {
        cur: plan(PRIORITY_NORMAL).allocations,
        used: 0.2,
    };
    let mut l = ControlLoop::new(Counting(0));
    l.set_rt_gate(RtGate::new(["app".to_owned()]));
    let t = |now_ms, decide| Tick {
        now_ms,
        dt_s: 0.1,
        decide,
    };
    l.tick(&mut n, &mut NoRecorder, t(500, true));
    assert_eq!(n.cur["app"].cpu_priority, PRIORITY_REALTIME);
    // A quiet monitoring tick: no decision.
    assert!(l.tick(&mut n, &mut NoRecorder, t(600, false)).1.is_none());
    // The load rises: off at this very tick, the policy not asked.
    n.used = 1.6;
    let (_, e) = l.tick(&mut n, &mut NoRecorder, t(700, false));
    let e = e.expect("a decision at the monitoring tick");
    assert_eq!(n.cur["app"].cpu_priority, PRIORITY_NORMAL);
    assert_eq!(e.plan.decisions.len(), 1);
    assert!(e.plan.decisions[0].reason.contains("0.80"), "{:?}", e.plan);
    assert_eq!(l.policy().0, 1);
    // Off stays off between decisions: no more monitoring-tick decisions.
    assert!(l.tick(&mut n, &mut NoRecorder, t(800, false)).1.is_none());
}
