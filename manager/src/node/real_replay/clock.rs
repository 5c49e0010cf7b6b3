//! The real replay on the real clock: its driver of the one real-time
//! loop ([`ControlLoop::run_realtime`]) and its progress lines.

use std::time::Instant;

use qosd_core::control::{Cadence, ControlLoop, Node, RealTime, Recorder, Wake};
use qosd_core::Policy;
use qosd_scenarios::record::RunRecorder;
use qosd_scenarios::timeline::Timeline;

use crate::node::replay::ReplayNode;

/// The real replay's driver of the one real-time loop
/// ([`ControlLoop::run_realtime`]): it sleeps to each tick unless a load
/// generator ended or a signal asked to stop.
struct Clocked<'a> {
    node: &'a mut ReplayNode,
    rec: &'a mut RunRecorder,
}

impl RealTime for Clocked<'_> {
    fn parts(&mut self) -> (&mut dyn Node, &mut dyn Recorder) {
        (&mut *self.node, &mut *self.rec)
    }

    async fn wait(&mut self, due: Instant) -> Wake {
        if self.node.ended || crate::signals::stop_requested() {
            return Wake::Stop("stopped".into());
        }
        tokio::time::sleep_until(due.into()).await;
        Wake::Due
    }
}

/// Runs the loop on the real clock for `nr_intervals` decision intervals
/// or until it is stopped.
pub(super) fn drive(
    clock: &tokio::runtime::Runtime,
    ctl: &mut ControlLoop<&mut dyn Policy>,
    node: &mut ReplayNode,
    rec: &mut RunRecorder,
    cadence: Cadence,
    nr_intervals: u64,
) {
    let end = nr_intervals * cadence.ticks_per_decision();
    let mut d = Clocked { node, rec };
    clock.block_on(ctl.run_realtime(&mut d, cadence, Instant::now(), Some(end)));
}

/// A progress line every 10 decision intervals.
pub(super) fn progress(tl: &Timeline, nr_apps: usize, duration: f64) {
    let n = tl.rows.len() / nr_apps.max(1);
    if n == 0 || !n.is_multiple_of(10) {
        return;
    }
    let last: Vec<String> = tl.rows[tl.rows.len() - nr_apps..]
        .iter()
        .map(|r| match r.be_ops_per_s {
            // A batch job: its throughput and the quota it ran under.
            Some(ops) => format!(
                "{} {ops:.0} ops/s quota {}",
                r.app,
                r.cpu_quota_milli
                    .map_or("-".into(), |q| format!("{:.1}", f64::from(q) / 1000.0))
            ),
            None => format!(
                "{} {:.0} rps p99 {}{}",
                r.app,
                r.achieved_rps,
                r.client_p99_ms.map_or("-".into(), |v| format!("{v:.2} ms")),
                r.cpu_quota_milli.map_or(String::new(), |q| format!(
                    " quota {:.1}",
                    f64::from(q) / 1000.0
                ))
            ),
        })
        .collect();
    eprintln!(
        "[{:>5.0}/{duration:.0} s] {}",
        n as f64 * tl.interval_s,
        last.join(" | ")
    );
}
