use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::*;
use crate::control::{Applied, NoRecorder};
use crate::policy::{Allocations, NodeCaps, Plan, Snapshot, Unmet};
use crate::Share;

const CADENCE: Cadence = Cadence {
    monitor_ms: 100,
    interval_ms: 500,
};

/// Drives a future whose awaits are all ready at once (the test driver's
/// waits return at once).
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the test driver never waits"),
    }
}

#[test]
fn grid_ticks_on_time_decide_every_interval() {
    let t0 = Instant::now();
    let mut g = Grid::new(t0, CADENCE);
    let mut decided = Vec::new();
    for k in 1..=10u32 {
        assert_eq!(g.due(), t0 + Duration::from_millis(100) * k);
        let (tick, missed) = g.tick_at(g.due() + Duration::from_millis(3));
        assert_eq!((tick.now_ms, missed), (u64::from(k) * 100, 0));
        if tick.decide {
            decided.push(tick.now_ms);
        }
    }
    assert_eq!(decided, [500, 1000]);
}

#[test]
fn a_late_tick_skips_grid_points_and_still_decides_on_the_grid() {
    let t0 = Instant::now();
    let mut g = Grid::new(t0, CADENCE);
    g.tick_at(t0 + Duration::from_millis(100));
    // 350 ms late: points 2, 3 and 4 are skipped, 5 decides.
    let (tick, missed) = g.tick_at(t0 + Duration::from_millis(550));
    assert_eq!((tick.now_ms, missed, tick.decide), (500, 3, true));
    assert!((tick.dt_s - 0.45).abs() < 1e-9, "{}", tick.dt_s);
    assert_eq!(g.due(), t0 + Duration::from_millis(600));
    // Late past a decision point: the next tick decides at once.
    let (tick, missed) = g.tick_at(t0 + Duration::from_millis(1020));
    assert_eq!((tick.now_ms, missed, tick.decide), (1000, 4, true));
}

#[test]
fn a_tick_woken_early_still_moves_on_one_point() {
    let t0 = Instant::now();
    let mut g = Grid::new(t0, CADENCE);
    let (tick, missed) = g.tick_at(t0 + Duration::from_millis(99));
    assert_eq!((tick.now_ms, missed), (100, 0));
}

/// A node whose apps never change: a policy's plan either keeps them or
/// asks for one more core, and `reassert` counts its calls.
struct Fixed {
    current: Allocations,
    reasserts: u32,
}

impl Node for Fixed {
    fn caps(&self) -> NodeCaps {
        NodeCaps::default()
    }
    fn current(&self) -> &Allocations {
        &self.current
    }
    fn sense(&mut self, _tick: &Tick) -> Sensed {
        Sensed::default()
    }
    fn apply(&mut self, _tick: &Tick, plan: &Plan) -> Applied {
        self.current = plan.allocations.clone();
        Applied {
            in_force: self.current.clone(),
            ..Default::default()
        }
    }
    fn reassert(&mut self, _tick: &Tick) -> Option<Applied> {
        self.reasserts += 1;
        Some(Applied {
            in_force: self.current.clone(),
            ..Default::default()
        })
    }
}

/// Upsizes "a" at its first decision, then keeps it and says it cannot
/// meet its QoS.
struct OnceThenStuck(u32);

impl Policy for OnceThenStuck {
    fn name(&self) -> &str {
        "once"
    }
    fn decide(&mut self, _: u64, _: &Snapshot, current: &Allocations, _: &NodeCaps) -> Plan {
        self.0 += 1;
        let mut plan = Plan {
            allocations: current.clone(),
            ..Default::default()
        };
        if self.0 == 1 {
            plan.allocations.get_mut("a").unwrap().nr_cores += 1;
        } else {
            plan.cannot_meet.push(Unmet {
                app: "a".into(),
                reason: "every resource at its limit".into(),
            });
        }
        plan
    }
}

/// Waits return at once, with a stop after `stop_after` waits.
struct Driver {
    node: Fixed,
    rec: NoRecorder,
    waits: u32,
    stop_after: Option<u32>,
    /// Ticks seen by `ticked`: (now_ms, decided, reasserted, cannot meet).
    seen: VecDeque<(u64, bool, bool, usize)>,
}

impl RealTime for Driver {
    fn parts(&mut self) -> (&mut dyn Node, &mut dyn Recorder) {
        (&mut self.node, &mut self.rec)
    }
    async fn wait(&mut self, _due: Instant) -> Wake {
        self.waits += 1;
        match self.stop_after {
            Some(n) if self.waits > n => Wake::Stop("told to".into()),
            // Every other wait handles something else first.
            _ if self.waits.is_multiple_of(2) => Wake::Again,
            _ => Wake::Due,
        }
    }
    fn ticked(&mut self, t: Ticked) {
        let d = t.decision.as_ref();
        self.seen.push_back((
            t.tick.now_ms,
            d.is_some(),
            d.is_some_and(|d| d.reasserted.is_some()),
            d.map_or(0, |d| d.cannot_meet().len()),
        ));
    }
}

fn driver(stop_after: Option<u32>) -> Driver {
    let current = [("a".to_owned(), Share::default())].into_iter().collect();
    Driver {
        node: Fixed {
            current,
            reasserts: 0,
        },
        rec: NoRecorder,
        waits: 0,
        stop_after,
        seen: VecDeque::new(),
    }
}

#[test]
fn the_loop_runs_to_its_end_reasserting_plans_that_change_nothing() {
    let mut d = driver(None);
    let mut ctl = ControlLoop::new(OnceThenStuck(0));
    // A start in the future: every tick is the next grid point, however
    // slowly this test runs.
    let start = Instant::now() + Duration::from_secs(3600);
    let why = ready(ctl.run_realtime(&mut d, CADENCE, start, Some(15)));
    assert_eq!(why, "the run is over");
    assert_eq!(d.seen.len(), 15);
    let decisions: Vec<_> = d.seen.iter().filter(|s| s.1).collect();
    // At 500 ms the plan changed "a" (applied, no reassert); at 1000 and
    // 1500 it changed nothing: reasserted, and "a" cannot meet its QoS.
    assert_eq!(
        decisions,
        [
            &(500, true, false, 0),
            &(1000, true, true, 1),
            &(1500, true, true, 1)
        ]
    );
    assert_eq!(d.node.reasserts, 2);
    assert_eq!(d.node.current["a"].nr_cores, 1);
    let c = ctl.counters();
    assert_eq!(
        (c.monitor_ticks, c.decisions, c.plans_changed, c.cannot_meet),
        (15, 3, 1, 2)
    );
}

#[test]
fn a_stop_ends_the_loop_between_ticks() {
    let mut d = driver(Some(5));
    let mut ctl = ControlLoop::new(OnceThenStuck(0));
    let start = Instant::now() + Duration::from_secs(3600);
    let why = ready(ctl.run_realtime(&mut d, CADENCE, start, None));
    assert_eq!(why, "told to");
    // Waits 1, 3 and 5 were due; 2 and 4 handled something else.
    let ticks: Vec<u64> = d.seen.iter().map(|s| s.0).collect();
    assert_eq!(ticks, [100, 200, 300]);
}
