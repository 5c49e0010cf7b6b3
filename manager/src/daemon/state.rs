//! What the control loop shares with the HTTP API: per app its processes,
//! allocation, latency figures and client-feedback inbox; the last
//! decisions and the counters behind `/metrics`. One mutex, held briefly
//! by the loop once per tick and by each request.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use qosd_core::{AppClass, DecisionKind, Feedback, QosTarget, Resource, Share};
use serde::Serialize;

use qosd_sensors::sensor::client::ClientInbox;

use crate::node::latency::Recent;

/// How many decisions `/v1/decisions` can go back.
pub const DECISIONS_KEPT: usize = 512;

/// Per knob that counts events, its (counter, value) pairs.
pub type KnobCounters = Vec<(Resource, Vec<(&'static str, u64)>)>;

/// One app as the API shows it, plus its live figures.
#[derive(Debug)]
pub struct AppLive {
    pub name: String,
    pub class: AppClass,
    pub feedback: Feedback,
    pub target: Option<QosTarget>,
    pub pids: Vec<i32>,
    /// The pods' containers it is, when it is pods (`namespace`, `pod`,
    /// `container` on its figures).
    pub pods: Vec<crate::kube::PodRef>,
    /// What the policy gave it; `None` while not managed (not running, or
    /// its minimum does not fit).
    pub share: Option<Share>,
    /// The CPUs of its cores, when cores are managed.
    pub cpus: Option<Vec<u32>>,
    pub recent: Recent,
    /// The eBPF figure the policy gets (`latency:` in its config).
    pub figure: qosd_sensors::ebpf::Figure,
    /// Both eBPF figures over the same ticks as `recent`, `[latency,
    /// service]` (eBPF apps only: what `?figure=` of the app calls reads).
    pub ebpf: [Recent; 2],
    /// Where `POST .../latencies` puts the client's reports.
    pub inbox: ClientInbox,
    /// Share of its CPUs it used over the last decision interval, 0..=1.
    pub cpu_util: f64,
    /// CPU time its processes used while qosd watched them, seconds.
    pub cpu_seconds_total: f64,
    /// Its batch job's operations per second over the last decision
    /// interval (apps with a `job:`; 0 while the job is not running).
    pub be_ops_per_s: Option<f64>,
    pub power_w: Option<f64>,
    /// The power sensor's figures of its last interval.
    pub power: Option<qosd_core::AppPower>,
    /// Why it is not managed, or the last failure to apply its allocation.
    pub note: Option<String>,
    pub apply_errors_total: u64,
    /// Why the node cannot meet its QoS, as of the last decision (it
    /// violates its target and nothing could be given to it).
    pub cannot_meet: Option<String>,
    /// Decisions at which it was in that state.
    pub cannot_meet_total: u64,
    /// Operational analysis of the last decision interval (D, U, X_sat,
    /// headroom on what it holds); `None` without requests or CPU time.
    pub oa: Option<qosd_core::oa::Oa>,
    /// The same per traced process, on the app's CPUs.
    pub pid_oa: BTreeMap<i32, qosd_core::oa::Oa>,
    /// Its SLO's eBPF side as of the last decision (apps with a target).
    pub slo: Option<SloView>,
    /// Its ports' traffic (the net sensor, `sensors.net`).
    pub net: Option<AppNet>,
    /// Event counters of the knobs that count (the hedger's: hedges
    /// sent, won, duplicates dropped, ...), as of the last decision.
    pub knob_counters: KnobCounters,
}

/// An app's SLO as the API shows it: the eBPF-side target the policy
/// judges eBPF latency against, the client/server gap behind it and where
/// that came from.
#[derive(Debug, Clone, Serialize)]
pub struct SloView {
    pub client_target_us: f64,
    pub ebpf_target_us: f64,
    /// `client` (no gap measured: the target as written),
    /// `calibrated_gap` or `refreshed_gap` (from client samples).
    pub ebpf_target_from: &'static str,
    /// The client/server gap at the current load, µs.
    pub gap_us: f64,
    /// Decision intervals whose client and eBPF samples corrected the gap.
    pub nr_refreshes: u64,
}

impl SloView {
    /// `slo` under `load` (the rate eBPF counts, the CPUs held).
    pub fn of(slo: &qosd_core::slo::SloSide, load: qosd_core::slo::Load) -> SloView {
        let (t, from) = slo.ebpf_target_us(load);
        SloView {
            client_target_us: slo.client_target_us,
            ebpf_target_us: t,
            ebpf_target_from: from.name(),
            gap_us: slo.gap_us(load),
            nr_refreshes: slo.nr_refreshes,
        }
    }
}

/// An app's traffic, `[ingress, egress]`: totals since the net sensor
/// started, and the fullest bin of the last complete 1 s window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct AppNet {
    pub packets_total: [u64; 2],
    pub bytes_total: [u64; 2],
    pub peak_packets: [u32; 2],
    pub peak_bytes_per_second: [f64; 2],
    /// Bin width of the peaks, ms.
    pub bin_ms: u32,
}

impl AppNet {
    /// Adds one tick's windows.
    pub fn add(&mut self, t: &qosd_sensors::sensor::net::NetTick) {
        for (d, f) in t.dirs.iter().enumerate() {
            self.packets_total[d] += f.packets;
            self.bytes_total[d] += f.bytes;
            self.peak_packets[d] = f.peak_packets;
            self.peak_bytes_per_second[d] = f.peak_bps(t.bin_ms) / 8.0;
        }
        self.bin_ms = t.bin_ms;
    }
}

impl AppLive {
    /// Latency at the target's percentile (p99 without a target), µs.
    pub fn target_latency_us(&self) -> Option<f64> {
        self.recent
            .percentile_us(self.target.map_or(99.0, |t| t.percentile))
    }

    /// PARTIES slack over the recent ticks; an eBPF-fed app's against
    /// its SLO's eBPF side, as a fraction of the client target (the
    /// policy's reading).
    pub fn slack(&self) -> Option<f64> {
        let t = self.target?;
        let l = self.target_latency_us()?;
        let judged_at = match (&self.slo, self.feedback) {
            (Some(s), Feedback::Ebpf) => s.ebpf_target_us,
            _ => t.value_us,
        };
        (t.value_us > 0.0).then(|| (judged_at - l) / t.value_us)
    }
}

/// One decision as `/v1/decisions` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct DecisionRecord {
    /// Milliseconds since the daemon started.
    pub t_ms: u64,
    /// Wall-clock time, ms since the Unix epoch.
    pub unix_ms: u64,
    pub app: String,
    /// `None` for a `cannot_meet` event (no resource could grow).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<Resource>,
    pub kind: DecisionKind,
    pub from: u32,
    pub to: u32,
    /// Unit of `from` and `to` (cores, ways, MHz, %).
    pub unit: &'static str,
    pub reason: String,
    /// Whether the change is in force (false: applying it failed, or a
    /// dry run).
    pub applied: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One knob as the daemon uses it.
#[derive(Debug, Clone, Serialize)]
pub struct KnobInfo {
    pub resource: Resource,
    /// In use by the policy.
    pub in_use: bool,
    pub backend: Option<String>,
    /// Why (backend chosen, unavailable, disabled in the config).
    pub reason: String,
}

/// Fixed facts of this run, for `/v1/status` and `/metrics`.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    pub version: &'static str,
    pub policy: String,
    pub config: String,
    pub monitor_interval_ms: u64,
    pub decide_interval_ms: u64,
    /// Latency figures cover this many ms (the decision interval).
    pub latency_window_ms: u64,
    pub dry_run: bool,
    pub knobs: Vec<KnobInfo>,
    /// The eBPF request tracer runs (per-pid calls work).
    pub ebpf: bool,
    /// Where power figures come from: `rapl`, `model` (estimates) or
    /// `none` (the power sensor does not run).
    pub power: String,
    pub started_unix_ms: u64,
}

#[derive(Debug)]
pub struct Shared {
    pub info: RunInfo,
    pub apps: BTreeMap<String, AppLive>,
    pub decisions: VecDeque<DecisionRecord>,
    pub decisions_total: BTreeMap<(String, Resource, DecisionKind), u64>,
    pub monitor_ticks_total: u64,
    pub decide_ticks_total: u64,
    /// Ticks that came late (the previous one overran): skipped, not burst.
    pub missed_ticks_total: u64,
    /// The control loop's totals (reverts, failed plans, cannot-meet).
    pub loop_counters: qosd_core::control::LoopCounters,
    pub node_cpu_util: Option<f64>,
    pub node_power_w: Option<f64>,
    /// Why the last power sample failed, if it did.
    pub power_error: Option<String>,
    /// The node's last complete traffic window (`sensors.net`).
    pub net: Option<qosd_sensors::sensor::net::NetNode>,
}

impl Shared {
    pub fn new(info: RunInfo) -> Self {
        Shared {
            info,
            apps: BTreeMap::new(),
            decisions: VecDeque::new(),
            decisions_total: BTreeMap::new(),
            monitor_ticks_total: 0,
            decide_ticks_total: 0,
            missed_ticks_total: 0,
            loop_counters: Default::default(),
            node_cpu_util: None,
            node_power_w: None,
            power_error: None,
            net: None,
        }
    }

    pub fn record(&mut self, d: DecisionRecord) {
        if let Some(r) = d.resource {
            *self
                .decisions_total
                .entry((d.app.clone(), r, d.kind))
                .or_default() += 1;
        }
        if self.decisions.len() == DECISIONS_KEPT {
            self.decisions.pop_front();
        }
        self.decisions.push_back(d);
    }

    /// The app holding `pid`.
    pub fn app_of_pid(&self, pid: i32) -> Option<&str> {
        self.apps
            .values()
            .find(|a| a.pids.contains(&pid))
            .map(|a| a.name.as_str())
    }
}

/// The handle both sides hold.
#[derive(Debug, Clone)]
pub struct SharedState(Arc<Mutex<Shared>>);

impl SharedState {
    pub fn new(s: Shared) -> Self {
        SharedState(Arc::new(Mutex::new(s)))
    }

    pub fn lock(&self) -> MutexGuard<'_, Shared> {
        // A panic elsewhere while holding the lock leaves plain figures
        // behind: still fine to read and to update.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
