//! What a replay keeps of the control loop, real or simulated alike: one
//! timeline row per app per decision interval (from the node's interval
//! figures and the allocation in force during it) and the decision log
//! (`plans.jsonl`, one [`DecisionEntry`] per line).

use std::io::Write;

use qosd_core::control::{AppInterval, DecisionEntry, LoopCounters, Recorder, Sensed};
use qosd_core::{Allocations, NodeCaps, Resource};

use crate::timeline::{Row, Timeline};

/// Called after each interval's rows are in.
pub type OnInterval = Box<dyn FnMut(&Timeline) + Send>;

/// A replay's recorder.
pub struct RunRecorder {
    pub tl: Timeline,
    caps: NodeCaps,
    /// The policy was fed client latency (else eBPF).
    client_fed: bool,
    plans: Option<Box<dyn Write + Send>>,
    /// First error writing the decision log (the run goes on).
    pub plans_error: Option<std::io::Error>,
    /// Called after each interval's rows are in (progress lines).
    on_interval: Option<OnInterval>,
}

impl RunRecorder {
    /// `tl` carries the run's header (scenario, mode, feedback, ...).
    pub fn new(tl: Timeline, caps: NodeCaps) -> Self {
        RunRecorder {
            client_fed: tl.feedback == "client",
            tl,
            caps,
            plans: None,
            plans_error: None,
            on_interval: None,
        }
    }

    /// Writes every decision to `w` as one JSON line.
    pub fn with_plans(mut self, w: Box<dyn Write + Send>) -> Self {
        self.plans = Some(w);
        self
    }

    pub fn on_interval(mut self, f: OnInterval) -> Self {
        self.on_interval = Some(f);
        self
    }

    /// Copies the loop's totals into the timeline, flushes the log.
    pub fn finish(&mut self, c: LoopCounters) {
        self.tl.rejected_plans = c.plans_failed;
        self.tl.reverts = c.reverts;
        self.tl.cannot_meet = c.cannot_meet;
        if let Some(w) = self.plans.as_mut() {
            if let Err(e) = w.flush() {
                self.plans_error.get_or_insert(e);
            }
        }
    }

    fn row(&self, t_ms: u64, r: &AppInterval, in_force: &Allocations) -> Row {
        let level = |res: Resource| {
            self.caps
                .has(res)
                .then(|| in_force.get(&r.app).map(|s| s.get(res)))
                .flatten()
        };
        let ms = |v: Option<f64>| v.map(|x| x / 1000.0);
        let over = |l: Option<f64>, t: Option<f64>| Some(l? > t?);
        let fed = if self.client_fed {
            over(r.client_us, r.client_target_us)
        } else {
            over(r.ebpf_us, r.ebpf_target_us)
        };
        let users = over(r.client_us, r.client_target_us);
        // Both slacks are fractions of the client's target (one SLO).
        let slack = |l: Option<f64>, t: Option<f64>| {
            let slo = r.client_target_us.or(t).filter(|v| *v > 0.0)?;
            Some((t? - l?) / slo)
        };
        Row {
            t_s: t_ms as f64 / 1000.0,
            app: r.app.clone(),
            offered_rps: r.offered_rps.unwrap_or(0.0),
            achieved_rps: r.achieved_rps,
            client_p99_ms: ms(r.client_us),
            ebpf_p99_ms: ms(r.ebpf_us),
            target_ms: ms(r.client_target_us),
            violation: users,
            cores: level(Resource::Cores),
            freq_mhz: level(Resource::Frequency),
            llc_ways: level(Resource::CacheWays),
            mb_percent: level(Resource::MemoryBandwidth),
            power_w: r.power_w,
            ebpf_target_ms: ms(r.ebpf_target_us),
            fed_violation: fed,
            // 0 is "no quota": no figure rather than a ceiling of nothing.
            cpu_quota_milli: level(Resource::CpuQuota).filter(|q| *q > 0),
            be_ops_per_s: r.be_ops_per_s,
            client_slack: slack(r.client_us, r.client_target_us),
            ebpf_slack: slack(r.ebpf_us, r.ebpf_target_us),
            ebpf_target_from: r.ebpf_target_from.map(|f| f.name().to_owned()),
        }
    }
}

impl Recorder for RunRecorder {
    fn interval(
        &mut self,
        t_ms: u64,
        rows: &[AppInterval],
        in_force: &Allocations,
        sensed: &Sensed,
    ) {
        // Rows in the timeline's app order, whatever order the node used.
        for name in self.tl.apps.clone() {
            if let Some(r) = rows.iter().find(|r| r.app == name) {
                let row = self.row(t_ms, r, in_force);
                self.tl.rows.push(row);
            }
        }
        if let Some(w) = sensed.snapshot.node_power_w {
            self.tl.node_power_w.push(w);
        }
        if let Some(f) = self.on_interval.as_mut() {
            f(&self.tl);
        }
    }

    fn decision(&mut self, e: &DecisionEntry) {
        let Some(w) = self.plans.as_mut() else { return };
        let line = serde_json::to_string(e).map_err(std::io::Error::other);
        if let Err(err) = line.and_then(|l| writeln!(w, "{l}")) {
            self.plans_error.get_or_insert(err);
        }
    }
}
