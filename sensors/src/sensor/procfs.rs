//! CPU time from `/proc` as a plugin: the CPU seconds each target's
//! processes used since the previous sample (in all and per pid), and the
//! node's utilisation.
//! Processes are sampled on every monitoring tick (their CPU clocks count
//! in ns: the real-time gate reads a rise within a tick, issue 20); the
//! node's figure only on decision ticks (`/proc/stat` counts in 10 ms
//! ticks, too coarse for a 100 ms tick). A target none of whose processes
//! gave a delta (all unreadable, or all seen for the first time) has no
//! reading, not a reading of 0.

use std::path::PathBuf;

use qosd_core::control::Tick;

use super::{Measurements, Quantity, Sensor, Target};
use crate::procfs::{CpuMeter, NodeCpu, Procfs};

pub struct ProcfsSensor {
    procfs: Procfs,
    /// One per target, created as targets are first seen.
    meters: Vec<CpuMeter>,
    node: Option<NodeCpu>,
}

impl ProcfsSensor {
    /// `root`: the prefix of `/proc` (`/` on a real machine).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ProcfsSensor {
            procfs: Procfs::new(root),
            meters: Vec::new(),
            node: None,
        }
    }
}

impl Sensor for ProcfsSensor {
    fn name(&self) -> &str {
        "procfs"
    }

    fn measures(&self) -> &'static [Quantity] {
        &[Quantity::CpuTime]
    }

    fn sample(&mut self, tick: &Tick, targets: &[Target<'_>]) -> anyhow::Result<Measurements> {
        let mut m = Measurements::empty(targets.len());
        self.meters.resize_with(targets.len(), CpuMeter::default);
        for ((r, t), meter) in m.apps.iter_mut().zip(targets).zip(&mut self.meters) {
            let by_pid = meter.delta_by_pid(&self.procfs, t.pids);
            r.cpu_s = (!by_pid.is_empty()).then(|| by_pid.iter().map(|(_, d)| d).sum());
            r.cpu_by_pid = Some(by_pid);
        }
        // The node's figure is a bonus: a process figure without it is
        // still worth having.
        if !tick.decide {
            return Ok(m);
        }
        if let Ok(n) = self.procfs.node_cpu() {
            if let Some(before) = self.node.replace(n) {
                m.node_cpu_util = Some(n.utilisation_since(&before));
            }
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_uses_cpu_time() {
        let mut s = ProcfsSensor::new("/");
        let me = [std::process::id() as i32];
        let t = [Target {
            name: "me",
            pids: &me,
            ports: &[],
            serves: false,
        }];
        let tick = Tick {
            now_ms: 0,
            dt_s: 0.0,
            decide: true,
        };
        let first = s.sample(&tick, &t).unwrap();
        assert_eq!(
            first.apps[0].cpu_s, None,
            "no delta yet: counts from the first sample on"
        );
        assert_eq!(first.node_cpu_util, None);
        // Burn CPU until the kernel has counted a few ticks of it (bounded:
        // a machine that never runs us fails the assertion below).
        let pf = Procfs::new("/");
        let before = pf.process_cpu_s(me[0]).unwrap().unwrap();
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed().as_secs() < 10
            && pf.process_cpu_s(me[0]).unwrap().unwrap() < before + 0.03
        {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        let m = s.sample(&tick, &t).unwrap();
        assert!(m.apps[0].cpu_s.unwrap() > 0.0, "{m:?}");
        let by_pid = m.apps[0].cpu_by_pid.as_deref().unwrap();
        assert_eq!(by_pid.len(), 1);
        assert_eq!((by_pid[0].0, Some(by_pid[0].1)), (me[0], m.apps[0].cpu_s));
        assert!(m.node_cpu_util.is_some_and(|u| (0.0..=1.0).contains(&u)));
        // A monitoring tick reads the processes, not the node.
        let between = Tick {
            decide: false,
            ..tick
        };
        let m = s.sample(&between, &t).unwrap();
        assert!(m.apps[0].cpu_s.is_some() && m.node_cpu_util.is_none());
        // Processes that cannot be read give no reading, not 0.
        let gone = [Target {
            pids: &[i32::MAX],
            ..t[0]
        }];
        let m = s.sample(&between, &gone).unwrap();
        assert_eq!(m.apps[0].cpu_s, None);
    }
}
