//! What the sensing layer keeps of one app (its latency windows, CPU and
//! power figures), how a tick's reading feeds it, and what the policy
//! sees of it: the fed latency, the throughput, the target of the fed
//! side and the [`AppState`]. A new per-app quantity is kept, fed and
//! read here.

use qosd_core::control::Tick;
use qosd_core::slo::{Load, TargetFrom};
use qosd_core::{AppPower, AppState, Feedback, QosTarget};
use qosd_sensors::ebpf::Figure;
use qosd_sensors::filed::Ended;
use qosd_sensors::sensor::AppReading;
use qosd_sensors::stats::LogHistogram;

use super::{Holdings, SenseApp, WIDEST_INTERVALS};
use crate::node::latency::Recent;

/// A decision interval's rows (the timeline's client and eBPF p99s, the
/// client/server gap) hold the requests that *ended* in it, on one clock
/// (CLOCK_MONOTONIC) for both sides, cut this long before the decision
/// tick. The sensors learn of a request late, and each differently: the
/// eBPF ring buffer is read every 20 ms (up to 80 ms late on a loaded
/// machine) and a turn's record leaves when the next request comes on its
/// connection; the load generator reports every monitoring tick on its
/// own grid. So a request is filed once both have had time to tell of
/// it; one told of later still goes into the next interval. The policy's
/// windows are fed at once, as the sensors tell.
pub const FILE_LAG_MS: u64 = 200;

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
    /// Both sides' requests not yet in an interval, to be filed by when
    /// they ended ([`FILE_LAG_MS`]).
    filed_client: Ended,
    filed_server: Ended,
    pub(super) iv_completed: u64,
    pub(super) offered_rps: Option<f64>,
    /// Seconds since its CPU time was last read.
    pub(super) cpu_span_s: f64,
    /// CPU seconds read in this decision interval, and over how long.
    iv_cpu_s: f64,
    iv_cpu_span_s: f64,
    pub(super) cpu_util: f64,
    /// CPUs' worth of time its processes used over the last decision
    /// interval; `None` when nothing was read in it.
    pub(super) cpus_used: Option<f64>,
    /// The same over the last monitoring tick alone; `None` when this
    /// tick gave no reading (a stale figure is no figure: the real-time
    /// gate must not trust one).
    pub(super) cpus_used_tick: Option<f64>,
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
            filed_client: Ended::default(),
            filed_server: Ended::default(),
            iv_completed: 0,
            offered_rps: None,
            cpu_span_s: 0.0,
            iv_cpu_s: 0.0,
            iv_cpu_span_s: 0.0,
            cpu_util: 0.0,
            cpus_used: None,
            cpus_used_tick: None,
            cpus_held: None,
            cpu_total_s: 0.0,
            power: None,
        }
    }

    /// A tick's requests into the interval: each side's filed by when
    /// they ended where its sensor says ([`FILE_LAG_MS`]), else into the
    /// interval at once (`ended` empty: a sensor that cannot say).
    pub(super) fn file(
        &mut self,
        client: (&LogHistogram, &mut Ended),
        server: (&LogHistogram, &mut Ended),
    ) {
        for ((hist, ended), iv, filed) in [
            (client, &mut self.iv_client, &mut self.filed_client),
            (server, &mut self.iv_server, &mut self.filed_server),
        ] {
            if ended.is_empty() {
                iv.merge(hist);
            } else {
                filed.append(ended);
            }
        }
    }

    /// Moves the requests filed as ended by `cut_ns` into the interval.
    pub(super) fn close_files(&mut self, cut_ns: u64) {
        self.filed_client.take_until(cut_ns, &mut self.iv_client);
        self.filed_server.take_until(cut_ns, &mut self.iv_server);
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
        let fig = usize::from(a.figure == Figure::Service);
        // The requests with their end instants go to the files, taken out
        // first (the raw reading is cloned below, and kept by the daemon).
        let mut client_ended = r
            .client
            .as_mut()
            .map(|c| std::mem::take(&mut c.latency.ended))
            .unwrap_or_default();
        let mut server_ended = Ended::default();
        if let Some(s) = r.server.as_mut() {
            server_ended = std::mem::take(&mut s[fig].ended);
            s.iter_mut().for_each(|t| t.ended.clear());
        }
        let client = r.client.clone().unwrap_or_default();
        let server = r.server.clone().unwrap_or_default();
        // Replies of the tick: the client's count where it drives the app
        // or feeds the policy, else the requests the server was seen serve.
        self.iv_completed += match (a.driven, a.feedback) {
            (true, _) | (false, Feedback::Client) => client.completed,
            (false, Feedback::Ebpf) => server[fig].hist.len(),
        };
        self.file(
            (&client.latency.hist, &mut client_ended),
            (&server[fig].hist, &mut server_ended),
        );
        self.client
            .push(client.latency.hist, tick.dt_s, client.latency.latest_ns);
        if client.offered_rps.is_some() {
            self.offered_rps = client.offered_rps;
        }
        for (w, t) in self.server.iter_mut().zip(server) {
            w.push(t.hist, tick.dt_s, t.latest_ns);
        }
        self.cpus_held = act.cpus_held(&a.name);
        self.feed_cpu(r.cpu_s, tick, act.nr_cpus(&a.name));
        if power {
            self.power = r.power.take();
        }
        let rps = self.rps(a);
        if let Some(p) = self.power.as_mut() {
            p.energy_per_request_j = qosd_sensors::power::energy_per_request_j(p.power_w, rps);
            r.power.clone_from(&self.power);
        }
    }

    /// A tick's CPU seconds (`None`: no reading) into the tick's figure
    /// and, on decision ticks, the interval's; `nr_cpus`: the CPUs the app
    /// may run on (its utilisation is of them).
    fn feed_cpu(&mut self, used: Option<f64>, tick: &Tick, nr_cpus: usize) {
        self.cpu_span_s += tick.dt_s;
        self.cpus_used_tick = None;
        if let Some(used) = used {
            self.cpu_total_s += used;
            let secs = std::mem::take(&mut self.cpu_span_s);
            if secs > 0.0 {
                self.cpus_used_tick = Some(used / secs);
                self.iv_cpu_s += used;
                self.iv_cpu_span_s += secs;
            }
        }
        if tick.decide {
            let secs = std::mem::take(&mut self.iv_cpu_span_s);
            let used = std::mem::take(&mut self.iv_cpu_s);
            self.cpus_used = (secs > 0.0).then(|| used / secs);
            if let Some(u) = self.cpus_used {
                self.cpu_util = (u / nr_cpus.max(1) as f64).clamp(0.0, 1.0);
            }
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
            cpus_used_tick: self.cpus_used_tick,
            power_w: self.power.as_ref().map(|p| p.power_w),
            limits: a.limits,
        }
    }
}
