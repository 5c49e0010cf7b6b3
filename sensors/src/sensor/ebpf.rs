//! The eBPF request sensor as a plugin: each serving target's server-side
//! latencies since the previous tick, both figures (from arrival, from the
//! first read) merged over the app's processes, and the processes it
//! traces kept in step with the app's (its topmost processes, each with
//! its descendants followed in the kernel).

use std::collections::BTreeSet;
use std::sync::Arc;

use qosd_core::control::Tick;

use super::{LatencyTick, Measurements, Quantity, Sensor, Target};
use crate::ebpf::{RequestTracer, TargetOptions};
use crate::filed::Ended;
use crate::stats::LogHistogram;

/// The topmost of `pids`: those with no ancestor among them. Tracing these
/// with their descendants followed (present and forked later) covers them
/// all, each request counted once under its tree's root: how `qosd trace
/// --pid/--comm/--cgroup` and the daemon's `match:` both select what to
/// trace.
pub fn topmost(pids: &[i32]) -> Vec<i32> {
    let below: BTreeSet<i32> = pids
        .iter()
        .filter_map(|&p| u32::try_from(p).ok())
        .flat_map(crate::ebpf::descendants)
        .filter_map(|p| i32::try_from(p).ok())
        .collect();
    pids.iter()
        .copied()
        .filter(|p| !below.contains(p))
        .collect()
}

/// The tracer's latencies of `pids` since the last call, merged, for both
/// figures: `[latency (from arrival), service (from the first read)]`.
/// One report is taken per pid, so both come from the same requests.
pub fn figures(tracer: &RequestTracer, pids: &[i32]) -> [LatencyTick; 2] {
    let mut out: [(Option<LogHistogram>, Option<u64>, Ended); 2] = Default::default();
    for &pid in pids {
        let Some(r) = tracer.take_report(pid as u32) else {
            continue;
        };
        let parts = [
            (r.interval.latest_us, r.histogram, r.ended),
            (
                r.service_interval.latest_us,
                r.service_histogram,
                r.service_ended,
            ),
        ];
        for ((hist, latest, ended), (l, h, mut e)) in out.iter_mut().zip(parts) {
            if let Some(l) = l {
                *latest = Some((l * 1e3).round() as u64);
            }
            match hist.as_mut() {
                None => *hist = Some(h),
                Some(m) => m.merge(&h),
            }
            ended.append(&mut e);
        }
    }
    out.map(|(h, l, ended)| LatencyTick {
        hist: h.unwrap_or_default(),
        latest_ns: l,
        ended,
    })
}

/// Server-side request latency from the eBPF tracer.
pub struct EbpfSensor {
    tracer: Arc<RequestTracer>,
}

impl EbpfSensor {
    pub fn new(tracer: Arc<RequestTracer>) -> Self {
        EbpfSensor { tracer }
    }
}

impl Sensor for EbpfSensor {
    fn name(&self) -> &str {
        "ebpf"
    }

    fn measures(&self) -> &'static [Quantity] {
        &[Quantity::ServerLatency]
    }

    fn sample(&mut self, _tick: &Tick, targets: &[Target<'_>]) -> anyhow::Result<Measurements> {
        let mut m = Measurements::empty(targets.len());
        for (r, t) in m.apps.iter_mut().zip(targets) {
            if t.serves {
                r.server = Some(figures(&self.tracer, t.pids));
            }
        }
        Ok(m)
    }

    /// Adds and removes the target's pids in the tracer: the topmost of
    /// its processes, each with its descendants followed under it, so a
    /// matched pre-fork master and its matched workers count each request
    /// once, under the master.
    fn follow(&mut self, target: &Target<'_>, old: &[i32]) -> Vec<String> {
        // A batch job serves no requests.
        if !target.serves {
            return Vec::new();
        }
        let t = &self.tracer;
        let new = target.pids;
        let traced = t.pids();
        let old: BTreeSet<i32> = old
            .iter()
            .copied()
            .filter(|&p| traced.contains(&(p as u32)))
            .collect();
        let roots: BTreeSet<i32> = topmost(new).into_iter().collect();
        for p in old.difference(&roots) {
            // Gone, not merely followed under a newly matched ancestor.
            if !new.contains(p) && t.connections(*p as u32) == Some(0) {
                tracing::warn!(
                    "app {}: pid {p} left having served no connection while traced \
                     (check its match: and ports:)",
                    target.name
                );
            }
            let _ = t.remove_target(*p as u32);
        }
        for p in roots.difference(&old) {
            let opts = TargetOptions {
                ports: target.ports.to_vec(),
                // A matched pre-fork master brings its workers.
                follow_children: true,
                ..Default::default()
            };
            if let Err(e) = t.add_target(*p as u32, opts) {
                tracing::warn!("app {}: tracing pid {p}: {e}", target.name);
            }
        }
        Vec::new()
    }
}
