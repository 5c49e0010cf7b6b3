//! The daemon's configuration file (`config.yaml`): which apps to manage
//! and how to find them, their class and QoS target, their resource range,
//! where latency feedback comes from, which actuators to use, the policy
//! file, the intervals and the API address. Parsed with serde
//! (`deny_unknown_fields`), then checked by [`Config::validate`]; every
//! error names `file:line:col` and the key.

pub mod api;
pub mod hedge;
pub mod kube;
pub mod realtime;
pub mod units;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use qosd_actuators::{CoresBackend, FreqBackend, QuotaBackend, WaysBackend};
use qosd_core::{AppClass, Feedback, Limits, QosTarget, Resource, Share};
use serde::{Deserialize, Serialize};

use crate::policy::PolicyFile;
use crate::yamlfile::{self, FileError, Invalid, KeyPath};
pub use api::{ApiConfig, DEFAULT_API_ADDR};
pub use hedge::{HedgeConfig, HedgeStart};
pub use kube::{KubernetesConfig, PodMatch};
pub use realtime::RealtimeConfig;
pub use units::Target;

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The apps to manage (at least one).
    pub apps: Vec<AppConfig>,
    /// Policy file (`policies/*.yaml`); a relative path is relative to the
    /// directory of this config file.
    #[serde(default = "default_policy")]
    pub policy: PathBuf,
    /// Seed of the policy's choices (PARTIES' starting resources).
    #[serde(default)]
    pub seed: u64,
    /// How often sensors are sampled, in ms (≥ 10).
    #[serde(default = "default_monitor_ms")]
    pub monitor_interval_ms: u64,
    /// How often the policy decides, in ms; a multiple of
    /// `monitor_interval_ms`.
    #[serde(default = "default_decide_ms")]
    pub decide_interval_ms: u64,
    /// The HTTP API (four calls per pid and app, allocations, decisions,
    /// client feedback) and Prometheus `/metrics`.
    #[serde(default)]
    pub api: ApiConfig,
    /// Which knobs qosd may turn, and how.
    #[serde(default)]
    pub actuators: ActuatorsConfig,
    /// eBPF request sensor settings.
    #[serde(default)]
    pub sensors: SensorsConfig,
    /// The power sensor (per-app watts: RAPL where the node has it, else a
    /// model, labelled an estimate); on unless `sensors.power` is false.
    #[serde(default)]
    pub power: qosd_sensors::power::PowerConfig,
    /// Journal of every knob's original value, so that the next start
    /// restores them after a SIGKILL (absolute path; default
    /// `<actuators.root>/run/qosd/state.json`).
    #[serde(default)]
    pub state_file: Option<PathBuf>,
    /// Where pods come from, for `match: { pod: ... }` and `qosd.io/*`
    /// annotations (absent: in-cluster credentials, `$NODE_NAME`, and
    /// only if some app matches pods).
    #[serde(default)]
    pub kubernetes: Option<KubernetesConfig>,
    /// When LC apps asking for real time get it (the gate's bounds).
    #[serde(default)]
    pub realtime: RealtimeConfig,
}

fn default_policy() -> PathBuf {
    PathBuf::from("policies/parties.yaml")
}
fn default_monitor_ms() -> u64 {
    100
}
fn default_decide_ms() -> u64 {
    500
}

/// One managed app.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// Unique name (letters, digits, `_`, `-`, `.`): API paths, metric labels.
    pub name: String,
    /// How to find the app's processes: exactly one of `pid`, `comm`,
    /// `cgroup`, `pod` (none for an app with a `job`: the job is its
    /// process).
    #[serde(rename = "match", default)]
    pub matcher: Match,
    /// A best-effort app's batch job, which the daemon runs itself (the
    /// scenarios' `job:`, e.g. `{ kind: hash, threads: 1 }`): started at
    /// start-up, restarted if it dies, stopped on exit; its throughput is
    /// `be_ops_per_s` in the API and `qosd_app_be_ops_per_second`.
    #[serde(default)]
    pub job: Option<JobSpec>,
    /// `lc` (latency-critical, needs a target) or `be` (best-effort).
    pub class: AppClass,
    /// QoS target of an `lc` app: one percentile and a latency with its
    /// unit, e.g. `{ p99: 25ms }` (units: us, ms, s).
    #[serde(default)]
    pub target: Option<Target>,
    /// Where latency comes from: `ebpf` (server-side, default) or `client`
    /// (pushed by a load generator to the API).
    #[serde(default)]
    pub feedback: Feedback,
    /// Only requests on these listening ports count (empty: all the app's
    /// accepted connections).
    #[serde(default)]
    pub ports: Vec<u16>,
    /// Which eBPF figure the policy gets: `arrival` (default: from each
    /// request's arrival in the server's socket, waiting for the CPU
    /// included) or `service` (from the server's first read). The same on
    /// the syscall fallback, which knows no arrival.
    #[serde(default)]
    pub latency: LatencyFrom,
    /// What the app starts with and the range the policy keeps it in.
    #[serde(default)]
    pub resources: Resources,
    /// Kernel-level hedging of the app's UDP requests to a service
    /// (docs/hedging.md); absent: the app is never hedged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<HedgeConfig>,
}

pub use qosd_core::LatencyFrom;
pub use qosd_scenarios::scenario::JobSpec;

/// The tracer's figure for an app's `latency:` setting.
pub fn figure_of(l: LatencyFrom) -> qosd_sensors::ebpf::Figure {
    match l {
        LatencyFrom::Arrival => qosd_sensors::ebpf::Figure::Latency,
        LatencyFrom::Service => qosd_sensors::ebpf::Figure::Service,
    }
}

/// How to find an app. Exactly one field.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// A process id (the app is gone when it exits).
    #[serde(default)]
    pub pid: Option<i32>,
    /// Command name as in `/proc/PID/comm` (at most 15 bytes); every
    /// process with that name, including ones started later.
    #[serde(default)]
    pub comm: Option<String>,
    /// Absolute cgroup directory; every process in it.
    #[serde(default)]
    pub cgroup: Option<PathBuf>,
    /// Pods on this node by namespace, labels and container, learnt from
    /// the API server; every process in their containers' cgroups.
    #[serde(default)]
    pub pod: Option<PodMatch>,
    /// Manage init (`pid: 1`) or a hierarchy's root group (every process
    /// on the node, qosd among them) anyway: refused without it.
    #[serde(default)]
    pub force: bool,
}

/// Per-resource amounts; an absent field means "not set".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Amounts {
    /// CPU cores.
    #[serde(default)]
    pub nr_cores: Option<u32>,
    /// Last-level-cache ways.
    #[serde(default)]
    pub nr_ways: Option<u32>,
    /// Core frequency, MHz.
    #[serde(default)]
    pub freq_mhz: Option<u32>,
    /// Memory-bandwidth throttle, percent (1..=100).
    #[serde(default)]
    pub mb_percent: Option<u32>,
    /// CPU bandwidth (CFS quota), milli-CPUs (300 = 0.3 CPU; at least 10).
    #[serde(default)]
    pub cpu_quota_milli: Option<u32>,
    /// CPU priority: 1 idle class, 2 normal, 3 real time (latency-critical
    /// apps, `initial` only: the loop's gate gives it while the app's CPU
    /// use allows, docs/sharing-rt.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_priority: Option<u32>,
}

impl Amounts {
    /// The amount of `r` (by its [`qosd_core::Knob::share_key`], the same
    /// name as this struct's field); `None` when unset or not sized here.
    fn get(&self, r: Resource) -> Option<u32> {
        let v = serde_json::to_value(self).ok()?;
        v.get(amount_key(r))?.as_u64().map(|x| x as u32)
    }
}

/// Field name of each resource in [`Amounts`].
fn amount_key(r: Resource) -> &'static str {
    qosd_core::knob(r).share_key
}

/// Initial amounts and the range the policy may move them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// Given at start (unset: cores shared as found, knobs as found).
    #[serde(default)]
    pub initial: Amounts,
    /// Never fewer (cores default 1).
    #[serde(default)]
    pub min: Amounts,
    /// Never more (default: what the node has).
    #[serde(default)]
    pub max: Amounts,
}

/// Which knobs qosd may turn. Knobs the machine lacks are detected at
/// start, reported (`qosd caps`) and skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActuatorsConfig {
    /// Resources the policy may change: any of `cores`, `cache_ways`,
    /// `frequency`, `memory_bandwidth`, `cpu_quota`, `cpu_priority`
    /// (default: all; `cpu_priority` puts best-effort apps in the idle
    /// class).
    #[serde(default = "all_resources")]
    pub enabled: Vec<Resource>,
    /// `auto` (cgroup v2 cpuset, then v1, then affinity), `cgroup2`,
    /// `cgroup1` or `affinity`.
    #[serde(default)]
    pub cores_backend: CoresBackend,
    /// `auto` (cpufreq sysfs, then cpupower), `cpufreq` or `cpupower`.
    #[serde(default)]
    pub frequency_backend: FreqBackend,
    /// `auto` (resctrl, then pqos), `resctrl` or `pqos`.
    #[serde(default)]
    pub cache_ways_backend: WaysBackend,
    /// `auto` (cgroup v2 `cpu.max`, then v1 `cpu.cfs_quota_us`),
    /// `cgroup2` or `cgroup1`.
    #[serde(default)]
    pub cpu_quota_backend: QuotaBackend,
    /// One unit of a CPU-quota decision, milli-CPUs (10-1000; default 100
    /// = 0.1 CPU).
    #[serde(default = "default_quota_unit")]
    pub cpu_quota_unit_milli: u32,
    /// The CFS period quotas are enforced over, µs (1000-1000000; unset:
    /// each group's own, the kernel's 100 ms). A group that used its quota
    /// waits for the next period, so a short one bounds that wait.
    #[serde(default)]
    pub cpu_quota_period_us: Option<u64>,
    /// CFS burst, % of the quota (0-100; default 100): how much of a
    /// period's quota that went unused the app may spend later, so a
    /// burst of requests is not throttled (where the kernel has
    /// `cpu.max.burst` / `cpu.cfs_burst_us`; docs/sharing.md).
    #[serde(default = "default_burst_pct")]
    pub cpu_quota_burst_pct: u32,
    /// Root prefix of every /sys, /proc, cgroup and resctrl path (tests
    /// point it at a fake tree).
    #[serde(default = "default_root")]
    pub root: PathBuf,
    /// Log every change instead of making it.
    #[serde(default)]
    pub dry_run: bool,
}

fn all_resources() -> Vec<Resource> {
    Resource::ALL.to_vec()
}
fn default_quota_unit() -> u32 {
    qosd_actuators::config::DEFAULT_QUOTA_UNIT_MILLI
}
fn default_burst_pct() -> u32 {
    qosd_actuators::quota::DEFAULT_BURST_PCT
}
fn default_root() -> PathBuf {
    PathBuf::from("/")
}

impl Default for ActuatorsConfig {
    fn default() -> Self {
        ActuatorsConfig {
            enabled: all_resources(),
            cores_backend: CoresBackend::default(),
            frequency_backend: FreqBackend::default(),
            cache_ways_backend: WaysBackend::default(),
            cpu_quota_backend: QuotaBackend::default(),
            cpu_quota_unit_milli: default_quota_unit(),
            cpu_quota_period_us: None,
            cpu_quota_burst_pct: default_burst_pct(),
            root: default_root(),
            dry_run: false,
        }
    }
}

/// The sensors' settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SensorsConfig {
    /// BPF ring buffer size, KiB: a power of two, at least 4.
    #[serde(default = "default_ringbuf_kib")]
    pub ring_buffer_kib: u32,
    /// Latencies kept per app for percentiles (the window), requests.
    #[serde(default = "default_window")]
    pub window_requests: u32,
    /// Run the power sensor (a `sched_switch` BPF program; settings in
    /// `power:`).
    #[serde(default = "default_true")]
    pub power: bool,
    /// Where requests are aggregated: `records` (a ring-buffer record per
    /// request) or `kernel` (histograms in BPF maps; docs/aggregation.md).
    /// Unset: $QOSD_AGGREGATE, else `records`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate: Option<qosd_sensors::ebpf::Aggregate>,
    /// The net sensor (TC packet counters per app port and per peer,
    /// docs/network.md); absent: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetConfig>,
}

/// `sensors.net`: where and how finely traffic is counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetConfig {
    /// Interfaces to count on; empty: every up, non-loopback Ethernet
    /// interface of the daemon's network namespace.
    #[serde(default)]
    pub ifaces: Vec<String>,
    /// Bin width, ms (divides 1000): the peak rate's resolution.
    #[serde(default = "default_net_bin_ms")]
    pub bin_ms: u32,
    /// Peers exported per direction, most bytes first; the rest are one
    /// `peer="other"` series.
    #[serde(default = "default_net_top_n")]
    pub top_n: u32,
}

fn default_net_bin_ms() -> u32 {
    1
}
fn default_net_top_n() -> u32 {
    10
}

/// Most peers exported per direction: Prometheus series stay bounded.
pub const NET_TOP_N_MAX: u32 = 100;

fn default_true() -> bool {
    true
}

fn default_ringbuf_kib() -> u32 {
    128
}
fn default_window() -> u32 {
    100_000
}

impl Default for SensorsConfig {
    fn default() -> Self {
        SensorsConfig {
            ring_buffer_kib: default_ringbuf_kib(),
            window_requests: default_window(),
            power: true,
            aggregate: None,
            net: None,
        }
    }
}

impl AppConfig {
    /// The QoS target, if any.
    pub fn qos_target(&self) -> Option<QosTarget> {
        self.target.as_ref().and_then(|t| t.parse().ok())
    }

    /// The range the policy keeps this app in (unset: node limits; at
    /// least one core and one way).
    pub fn limits(&self) -> Limits {
        let mut l = Limits::default();
        for r in Resource::ALL {
            if let Some(v) = self.resources.min.get(r) {
                l.min.set(r, v);
            }
            if let Some(v) = self.resources.max.get(r) {
                l.max.set(r, v);
            }
        }
        if self.hedge.is_none() {
            // No spec, nothing to hedge with: a policy may not turn it on.
            l.max.set(Resource::Hedge, qosd_core::knobs::HEDGE_OFF);
        }
        l
    }

    /// Initial amounts; 0 where unset (the policy's "leave as found").
    pub fn initial_share(&self) -> Share {
        let mut s = Share::default();
        for r in Resource::ALL {
            s.set(r, self.resources.initial.get(r).unwrap_or(0));
        }
        if let Some(h) = &self.hedge {
            s.set(Resource::Hedge, h.start_level());
        }
        if self.wants_realtime() {
            // Admitted normal: the loop's real-time gate raises it once a
            // CPU-use reading says the app is well below its CPUs.
            s.set(Resource::CpuPriority, qosd_core::knobs::PRIORITY_NORMAL);
        }
        s
    }

    /// The app asks for real time (`resources: { initial: { cpu_priority:
    /// 3 } }`): the loop's [`qosd_core::control::RtGate`] gives it while
    /// its CPU use allows (docs/sharing-rt.md, "The gate").
    pub fn wants_realtime(&self) -> bool {
        self.class == AppClass::Lc
            && self.resources.initial.get(Resource::CpuPriority)
                == Some(qosd_core::knobs::PRIORITY_REALTIME)
    }
}

mod validate;
pub use validate::MAX_APP_NAME;

impl Config {
    /// The policy file's path, resolved against the config's directory.
    pub fn policy_path(&self, config_path: &Path) -> PathBuf {
        if self.policy.is_absolute() {
            return self.policy.clone();
        }
        config_path
            .parent()
            .unwrap_or_else(|| Path::new("."))
            .join(&self.policy)
    }

    /// Parses and validates a config's text (not its policy file).
    pub fn parse(path: &Path, text: &str) -> Result<Config, FileError> {
        let c: Config = yamlfile::parse_doc(path, text, yamlfile::Doc::Config)?;
        c.validate().map_err(|e| yamlfile::invalid(path, text, e))?;
        Ok(c)
    }

    /// Reads and validates a config and the policy file it names. A
    /// missing policy file is reported at the config's `policy` key; an
    /// invalid one at its own file:line:col.
    pub fn load(path: &Path) -> Result<(Config, PolicyFile), FileError> {
        let text = yamlfile::read(path)?;
        let c = Config::parse(path, &text)?;
        let ppath = c.policy_path(path);
        if !ppath.is_file() {
            let key = KeyPath::root().key("policy");
            let msg = format!("no policy file at {}", ppath.display());
            return Err(yamlfile::invalid(path, &text, Invalid::new(key, msg)));
        }
        let policy = PolicyFile::load_for(&ppath, &c.app_names())?;
        Ok((c, policy))
    }

    /// Whether the daemon needs the API server's pods: some app matches
    /// pods, or the `kubernetes:` section asks for annotated pods.
    pub fn wants_pods(&self) -> bool {
        self.apps.iter().any(|a| a.matcher.pod.is_some())
            || self.kubernetes.as_ref().is_some_and(|k| k.annotations)
    }

    /// The names of all apps, for lookups.
    pub fn app_names(&self) -> BTreeSet<&str> {
        self.apps.iter().map(|a| a.name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests;
