//! The one sensing layer of the real nodes (the daemon's and a real
//! replay's): it samples the node's [`Sensors`] on every tick, keeps each
//! app's latency windows, CPU and power figures (one `Meter` per app,
//! `meter.rs`), and builds the policy's snapshot and, on decision ticks,
//! the interval's timeline rows.
//! What differs between nodes is only which plugins they hold and what
//! they do with the tick's raw readings (the daemon publishes them to its
//! API).

use std::path::Path;

use qosd_core::control::{AppInterval, Sensed, Tick};
use qosd_core::slo::SloSide;
use qosd_core::{AppClass, AppPower, Feedback, Limits};
use qosd_sensors::ebpf::Figure;
use qosd_sensors::power::PowerSensor;
use qosd_sensors::sensor::ebpf::EbpfSensor;
use qosd_sensors::sensor::procfs::ProcfsSensor;
use qosd_sensors::sensor::{
    AppReading, BoxedSensor, LatencyTick, Measurements, Quantity, Sensors, Target,
};
use qosd_sensors::stats::LogHistogram;

use super::actuate::Actuation;
use super::latency::Recent;

mod gaps;
mod meter;
use meter::Meter;

/// The sensors of a real node, in one list: the client's reports
/// (`client`, fed by the node's own channels), CPU time from `root`'s
/// /proc, and where the node has them the eBPF request sensor and the
/// power sensor. A plugin every real node runs joins here.
pub fn plugins(
    client: BoxedSensor,
    root: &Path,
    ebpf: Option<EbpfSensor>,
    power: Option<PowerSensor>,
) -> Sensors {
    let mut list: Vec<BoxedSensor> = vec![client, Box::new(ProcfsSensor::new(root))];
    if let Some(e) = ebpf {
        list.push(Box::new(e));
    }
    if let Some(p) = power {
        list.push(Box::new(p));
    }
    Sensors::new(list)
}

/// What the sensing layer asks of the node's actuation: which apps are
/// managed (they are in the snapshot) and how many CPUs each holds (its
/// CPU utilisation is relative to them).
pub trait Holdings {
    fn managed(&self, app: &str) -> bool;
    fn nr_cpus(&self, app: &str) -> usize;
    /// CPUs' worth the app's allocation gives it, quota included
    /// ([`qosd_core::oa::cpus_held`]); `None` when not known.
    fn cpus_held(&self, app: &str) -> Option<f64>;
}

impl Holdings for Actuation {
    fn managed(&self, app: &str) -> bool {
        self.current().contains_key(app)
    }

    fn nr_cpus(&self, app: &str) -> usize {
        self.cpus(app).map_or(self.nr_online_cpus(), |c| c.len())
    }

    fn cpus_held(&self, app: &str) -> Option<f64> {
        qosd_core::oa::cpus_held(self.current().get(app), self.node())
    }
}

/// One app as the sensing layer needs it.
#[derive(Debug, Clone)]
pub struct SenseApp {
    pub name: String,
    pub class: AppClass,
    /// Which latency feeds the policy.
    pub feedback: Feedback,
    /// Which eBPF figure, when eBPF feeds it.
    pub figure: Figure,
    pub limits: Limits,
    /// The percentile its latency is judged at (99 without a target).
    pub percentile: f64,
    /// The target the client latency is judged against, µs (`None`: no
    /// target, a best-effort app).
    pub client_target_us: Option<f64>,
    /// The eBPF side of its SLO (the client target less the calibrated
    /// client/server gap, refreshed from both sides' samples); `None` with
    /// a client target: the eBPF side is judged against that same number.
    pub slo: Option<SloSide>,
    /// The listening ports its requests arrive on (none: every port).
    pub ports: Vec<u16>,
    /// A load generator of ours drives it (a replay): its throughput and
    /// offered load are the client's.
    pub driven: bool,
    /// It serves requests (not a batch job).
    pub serves: bool,
}

/// How far back a low-rate app's windows reach for enough requests: the
/// policy's, in decision intervals (the gap takes one interval at a time,
/// `gaps.rs`). Eight intervals (4 s at
/// 500 ms) hold a p99's 1000 requests from 250 requests/s up, and stay
/// short beside the 30 s cool-downs and the load changes a controller must
/// follow.
pub const WIDEST_INTERVALS: usize = 8;

/// The sensors of a node and every app's figures.
pub struct Sensing {
    sensors: Sensors,
    apps: Vec<SenseApp>,
    meters: Vec<Meter>,
    /// Monitoring ticks per decision interval (an added app's windows).
    nr_slots: usize,
    node_power_w: Option<f64>,
    node_cpu_util: Option<f64>,
    /// The node's last complete traffic window (the net sensor's).
    net: Option<qosd_sensors::sensor::net::NetNode>,
    interval_start_ms: u64,
    restart_ms: u64,
    /// A load generator ended (its channel closed): a replay is over.
    pub ended: bool,
}

impl Sensing {
    /// `nr_slots`: monitoring ticks per decision interval (the windows).
    pub fn new(sensors: Sensors, apps: Vec<SenseApp>, nr_slots: usize) -> Self {
        let meters = apps
            .iter()
            .map(|a| Meter::new(nr_slots, a.percentile))
            .collect();
        Sensing {
            sensors,
            apps,
            meters,
            nr_slots,
            node_power_w: None,
            node_cpu_util: None,
            net: None,
            interval_start_ms: 0,
            restart_ms: 0,
            ended: false,
        }
    }

    pub fn sensors(&self) -> &Sensors {
        &self.sensors
    }

    /// The node's last complete traffic window, if the net sensor runs.
    pub fn net(&self) -> Option<&qosd_sensors::sensor::net::NetNode> {
        self.net.as_ref()
    }

    pub fn app(&self, i: usize) -> &SenseApp {
        &self.apps[i]
    }

    /// App `i`'s processes, followed already by whoever started them.
    pub fn take_pids(&mut self, i: usize, pids: Vec<i32>) {
        self.meters[i].pids = pids;
    }

    pub fn app_mut(&mut self, i: usize) -> &mut SenseApp {
        &mut self.apps[i]
    }

    /// Adds a sensor (e.g. one that could only start later).
    pub fn add_sensor(&mut self, s: qosd_sensors::sensor::BoxedSensor) {
        self.sensors.push(s);
    }

    /// App `i`'s processes are now `pids`: the sensors follow them.
    pub fn set_pids(&mut self, i: usize, pids: Vec<i32>) -> Vec<String> {
        let old = std::mem::replace(&mut self.meters[i].pids, pids);
        let t = Self::target_of(&self.apps[i], &self.meters[i]);
        self.sensors.follow(&t, &old)
    }

    /// Adds an app (while the node runs: a reloaded config, a pod); it is
    /// last, with no processes until [`Self::set_pids`].
    pub fn add_app(&mut self, app: SenseApp) {
        self.meters.push(Meter::new(self.nr_slots, app.percentile));
        self.apps.push(app);
    }

    /// Removes app `i` (the sensors stop following its processes); the
    /// apps after it move down one.
    pub fn remove_app(&mut self, i: usize) -> Vec<String> {
        let lines = self.set_pids(i, Vec::new());
        self.apps.remove(i);
        self.meters.remove(i);
        lines
    }

    fn target_of<'a>(a: &'a SenseApp, m: &'a Meter) -> Target<'a> {
        Target {
            name: &a.name,
            pids: &m.pids,
            ports: &a.ports,
            serves: a.serves,
        }
    }

    /// Samples every sensor over the tick, feeds the windows and returns
    /// the policy's snapshot of the apps `act` manages (sorted by name),
    /// the interval's rows on decision ticks (`be_ops_per_s` is left to the
    /// node), and the tick's raw readings per app.
    pub fn sense(&mut self, tick: &Tick, act: &dyn Holdings) -> (Sensed, Vec<AppReading>) {
        let targets: Vec<Target<'_>> = self
            .apps
            .iter()
            .zip(&self.meters)
            .map(|(a, m)| Self::target_of(a, m))
            .collect();
        let mut got = self.sensors.sample(tick, &targets);
        drop(targets);
        self.absorb_node(&got);
        // A decision without a power figure (gone, or the sample failed)
        // keeps none rather than a stale one.
        let power = tick.decide && self.sensors.measures(Quantity::Power);
        for ((a, m), r) in self.apps.iter().zip(&mut self.meters).zip(&mut got.apps) {
            m.feed(a, tick, r, act, power);
        }
        let mut sensed = Sensed::default();
        for (i, a) in self.apps.iter().enumerate() {
            if act.managed(&a.name) {
                sensed
                    .snapshot
                    .apps
                    .push(self.meters[i].state(&self.apps[i]));
            }
        }
        sensed.snapshot.apps.sort_by(|x, y| x.name.cmp(&y.name));
        sensed.snapshot.node_power_w = self.node_power_w;
        // The oldest tick any app's figure holds: the windows restart when a
        // plan is applied.
        let span_s = self
            .meters
            .iter()
            .map(|m| m.client.span_s().max(m.server[0].span_s()))
            .fold(0.0, f64::max);
        let oldest = tick.now_ms.saturating_sub((span_s * 1000.0).round() as u64);
        sensed.snapshot.since_ms = Some(oldest.max(self.restart_ms));
        if tick.decide {
            let lag_ns = meter::FILE_LAG_MS * 1_000_000;
            let cut_ns = qosd_core::clock::monotonic_ns().saturating_sub(lag_ns);
            self.meters.iter_mut().for_each(|m| m.close_files(cut_ns));
            self.refresh_gaps(tick.now_ms);
            sensed.interval = self.interval_rows(tick.now_ms);
            self.interval_start_ms = tick.now_ms;
        }
        (sensed, got.apps)
    }

    fn absorb_node(&mut self, m: &Measurements) {
        self.ended |= m.ended;
        if m.node_power_w.is_some() {
            self.node_power_w = m.node_power_w;
        }
        if m.node_cpu_util.is_some() {
            self.node_cpu_util = m.node_cpu_util;
        }
        if m.net.is_some() {
            self.net.clone_from(&m.net);
        }
        if self.sensors.measures(Quantity::Power) && self.sensors.error("power").is_some() {
            // A failed sample: no figure rather than a stale one.
            self.node_power_w = None;
        }
    }

    /// Every app's figures over the decision interval that ends now.
    fn interval_rows(&mut self, now_ms: u64) -> Vec<AppInterval> {
        let iv_s = (now_ms.saturating_sub(self.interval_start_ms) as f64 / 1000.0).max(1e-9);
        let mut rows = Vec::with_capacity(self.apps.len());
        for (a, m) in self.apps.iter_mut().zip(&mut self.meters) {
            let pct = a.percentile;
            let at = |h: &LogHistogram| h.percentile(pct).map(|v| v as f64 / 1e3);
            let server_rps = m.iv_server.len() as f64 / iv_s;
            let ebpf_target = m.ebpf_target(a, server_rps);
            rows.push(AppInterval {
                app: a.name.clone(),
                offered_rps: a.driven.then(|| m.offered_rps.unwrap_or(0.0)),
                achieved_rps: m.iv_completed as f64 / iv_s,
                client_us: at(&m.iv_client),
                ebpf_us: at(&m.iv_server),
                client_target_us: a.client_target_us,
                ebpf_target_us: ebpf_target.map(|t| t.0),
                ebpf_target_from: ebpf_target.map(|t| t.1),
                power_w: m.power.as_ref().map(|p| p.power_w),
                be_ops_per_s: None,
                cpus_used: m.cpus_used,
            });
            m.iv_client.clear();
            m.iv_server.clear();
            m.iv_completed = 0;
        }
        rows
    }

    /// Forgets the windows' ticks: after a plan is applied, the figures
    /// cover only what was measured under it.
    pub fn restart(&mut self, now_ms: u64) {
        for m in &mut self.meters {
            m.client.restart();
            m.server.iter_mut().for_each(Recent::restart);
        }
        self.restart_ms = now_ms;
    }

    /// CPU seconds app `i`'s processes used while sensed.
    pub fn cpu_total_s(&self, i: usize) -> f64 {
        self.meters[i].cpu_total_s
    }

    pub fn cpu_util(&self, i: usize) -> f64 {
        self.meters[i].cpu_util
    }

    /// CPUs' worth of time app `i`'s processes used over the last interval.
    pub fn cpus_used(&self, i: usize) -> Option<f64> {
        self.meters[i].cpus_used
    }

    /// App `i`'s power over the last decision interval, if measured.
    pub fn power(&self, i: usize) -> Option<&AppPower> {
        self.meters[i].power.as_ref()
    }

    pub fn node_power_w(&self) -> Option<f64> {
        self.node_power_w
    }

    pub fn node_cpu_util(&self) -> Option<f64> {
        self.node_cpu_util
    }
}

/// The latencies that feed app `a`'s policy in a tick's reading.
pub fn fed_tick(a: &SenseApp, r: &AppReading) -> LatencyTick {
    match a.feedback {
        Feedback::Client => r.client.clone().unwrap_or_default().latency,
        Feedback::Ebpf => r
            .server
            .clone()
            .map(|[l, s]| if a.figure == Figure::Service { s } else { l })
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests;
