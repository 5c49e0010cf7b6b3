//! What the sensing layer keeps of one app (its latency windows, CPU and
//! power figures), how a tick's reading feeds it, and what the policy
//! sees of it: the fed latency, the throughput, the target of the fed
//! side and the [`AppState`]. A new per-app quantity is kept, fed and
//! read here.

use qosd_core::control::Tick;
use qosd_core::slo::{Load, TargetFrom};
use qosd_core::{AppPower, AppState, Feedback, QosTarget};
use qosd_sensors::ebpf::Figure;
use qosd_sensors::sensor::AppReading;
use qosd_sensors::stats::LogHistogram;

use super::gaps::GapWindows;
use super::{Holdings, SenseApp, WIDEST_INTERVALS};
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

    /// Feeds the app's readings of the tick into its windows and figures;
    /// `power`: the tick's power figure (none: none) replaces the last.
    pub(super) fn feed(
        &mut self,
        a: &SenseApp,
        tick: &Tick,
        r: &mut AppReading,
        act: &dyn Holdings,
        power: bool,
    ) {
        let client = r.client.clone().unwrap_or_default();
        let server = r.server.clone().unwrap_or_default();
        let fig = usize::from(a.figure == Figure::Service);
        // Replies of the tick: the client's count where it drives the app
        // or feeds the policy, else the requests the server was seen serve.
        self.iv_completed += match (a.driven, a.feedback) {
            (true, _) | (false, Feedback::Client) => client.completed,
            (false, Feedback::Ebpf) => server[fig].hist.len(),
        };
        self.iv_client.merge(&client.latency.hist);
        self.client
            .push(client.latency.hist, tick.dt_s, client.latency.latest_ns);
        if client.offered_rps.is_some() {
            self.offered_rps = client.offered_rps;
        }
        self.iv_server.merge(&server[fig].hist);
        for (w, t) in self.server.iter_mut().zip(server) {
            w.push(t.hist, tick.dt_s, t.latest_ns);
        }
        self.cpu_span_s += tick.dt_s;
        self.cpus_held = act.cpus_held(&a.name);
        if let Some(used) = r.cpu_s {
            self.cpu_total_s += used;
            let nr_cpus = act.nr_cpus(&a.name);
            let secs = std::mem::take(&mut self.cpu_span_s);
            if secs > 0.0 {
                self.cpu_util = (used / (secs * nr_cpus.max(1) as f64)).clamp(0.0, 1.0);
                self.cpus_used = Some(used / secs);
            }
        }
        if power {
            self.power = r.power.take();
        }
        let rps = self.rps(a);
        if let Some(p) = self.power.as_mut() {
            p.energy_per_request_j = qosd_sensors::power::energy_per_request_j(p.power_w, rps);
            r.power.clone_from(&self.power);
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
