//! What the sensing layer keeps of one app (its latency windows, CPU and
//! power figures) and what the policy sees of it: the fed latency, the
//! throughput, the target of the fed side and the [`AppState`].

use qosd_core::slo::{Load, TargetFrom};
use qosd_core::{AppPower, AppState, Feedback, QosTarget};
use qosd_sensors::ebpf::Figure;
use qosd_sensors::stats::LogHistogram;

use super::gaps::GapWindows;
use super::{SenseApp, WIDEST_INTERVALS};
use crate::node::latency::Recent;

/// What the layer keeps of one app.
pub(super) struct Meter {
    pub(super) pids: Vec<i32>,
    /// The client's and both server-side figures' windows, restarted when
    /// a plan is applied: what the policy sees was measured under it.
    pub(super) client: Recent,
    pub(super) server: [Recent; 2],
    /// The decision interval so far: latencies (ns) and replies.
    pub(super) iv_client: LogHistogram,
    pub(super) iv_server: LogHistogram,
    pub(super) iv_completed: u64,
    /// The last decision intervals' client and server latencies, for the
    /// client/server gap.
    pub(super) gap: GapWindows,
    pub(super) offered_rps: Option<f64>,
    /// Seconds since its CPU time was last read.
    pub(super) cpu_span_s: f64,
    pub(super) cpu_util: f64,
    /// CPUs' worth of time its processes used over the last reading.
    pub(super) cpus_used: Option<f64>,
    /// CPUs' worth its allocation gives it (the gap is read at the same
    /// utilisation as calibrated).
    pub(super) cpus_held: Option<f64>,
    pub(super) cpu_total_s: f64,
    pub(super) power: Option<AppPower>,
}

impl Meter {
    /// `nr_slots` monitoring ticks per decision interval; `percentile`:
    /// the one the app is judged at (its windows widen for it).
    pub(super) fn new(nr_slots: usize, percentile: f64) -> Meter {
        let enough = qosd_core::measure::samples_for_percentile(percentile);
        let window = || Recent::widening(nr_slots, enough, nr_slots * WIDEST_INTERVALS);
        Meter {
            pids: Vec::new(),
            client: window(),
            server: std::array::from_fn(|_| window()),
            iv_client: LogHistogram::new(),
            iv_server: LogHistogram::new(),
            iv_completed: 0,
            gap: GapWindows::new(enough),
            offered_rps: None,
            cpu_span_s: 0.0,
            cpu_util: 0.0,
            cpus_used: None,
            cpus_held: None,
            cpu_total_s: 0.0,
            power: None,
        }
    }

    /// The window that feeds the policy.
    pub(super) fn fed(&self, a: &SenseApp) -> &Recent {
        match a.feedback {
            Feedback::Client => &self.client,
            Feedback::Ebpf => &self.server[usize::from(a.figure == Figure::Service)],
        }
    }

    /// Its throughput: the client's where a load generator of ours drives
    /// it, else the fed side's.
    pub(super) fn rps(&self, a: &SenseApp) -> f64 {
        if a.driven {
            self.client.rps()
        } else {
            self.fed(a).rps()
        }
    }

    /// App `a`'s eBPF-side target at `rps` (the load eBPF counts) on the
    /// CPUs it holds, and where it came from.
    pub(super) fn ebpf_target(&self, a: &SenseApp, rps: f64) -> Option<(f64, TargetFrom)> {
        let load = Load {
            rps,
            cpus: self.cpus_held,
        };
        match &a.slo {
            Some(s) => Some(s.ebpf_target_us(load)),
            None => a.client_target_us.map(|v| (v, TargetFrom::Client)),
        }
    }

    /// The target of the side that feeds the policy; an eBPF-side one at
    /// the load eBPF counts, its slack a fraction of the client's.
    fn target(&self, a: &SenseApp) -> Option<QosTarget> {
        match a.feedback {
            Feedback::Client => a.client_target_us.map(|v| QosTarget::new(a.percentile, v)),
            Feedback::Ebpf => {
                let (v, _) = self.ebpf_target(a, self.fed(a).rps())?;
                Some(QosTarget {
                    slo_us: a.slo.as_ref().map(|s| s.client_target_us),
                    ..QosTarget::new(a.percentile, v)
                })
            }
        }
    }

    /// App `a` as the policy sees it.
    pub(super) fn state(&self, a: &SenseApp) -> AppState {
        AppState {
            name: a.name.clone(),
            class: a.class,
            target: self.target(a),
            latency_us: self.fed(a).percentile_us(a.percentile),
            rps: self.rps(a),
            nr_samples: self.fed(a).requests(),
            cpu_util: self.cpu_util,
            cpus_used: self.cpus_used,
            power_w: self.power.as_ref().map(|p| p.power_w),
            limits: a.limits,
        }
    }
}
