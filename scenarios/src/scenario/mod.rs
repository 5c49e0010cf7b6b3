//! Scenario files: which apps run (and how to start their servers), their
//! QoS targets, the load on each over time as fractions of its calibrated
//! capacity, the feedback source, the policy, the duration and the seed.
//! Parsed with serde (`deny_unknown_fields`), then checked by [`validate`];
//! every error names `file:line:col` and the key.

pub mod shape;
pub(crate) mod validate;
pub use validate::{run_size, MAX_ROWS, MAX_WAYS};

use std::path::{Path, PathBuf};

use qosd_core::yamlfile;
use qosd_core::{AppClass, Feedback, Resource};
use serde::{Deserialize, Serialize};

pub use qosd_core::yamlfile::{locate, KeyPath, Seg};
pub use shape::{Shape, Step};

use crate::load::{Arrival, MemcacheMix, Protocol};

/// A scenario as written in its YAML file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name; the default output directory is `out/<name>/`.
    pub name: String,
    /// What the scenario reproduces, for people.
    #[serde(default)]
    pub description: String,
    /// Length of the run, seconds.
    pub duration_s: f64,
    /// Seed of arrivals, request mixes, sim noise and the policy's choices.
    #[serde(default = "one")]
    pub seed: u64,
    /// Decision interval of the policy and period of timeline rows, ms.
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    /// Monitoring period (samples between decisions), ms; divides interval_ms.
    #[serde(default = "default_monitor_ms")]
    pub monitor_ms: u64,
    /// Latency the policy sees: server-side eBPF or the load generator's.
    #[serde(default)]
    pub feedback: Feedback,
    /// Policy file, relative to the scenario file (default: the shipped
    /// PARTIES policy).
    #[serde(default)]
    pub policy: Option<String>,
    /// The knobs a real replay lets the policy turn (`qosd replay
    /// --resources` overrides it), e.g. `[cpu_quota]`: without `cores`
    /// the apps share every CPU and quota is a pool of the node's CPUs.
    /// Knobs the machine lacks stay off. Default: every knob it has.
    #[serde(default)]
    pub resources: Option<Vec<Resource>>,
    /// The simulated node used by `--sim` (real runs use this machine).
    #[serde(default)]
    pub node: SimNode,
    pub apps: Vec<AppSpec>,
    /// Directory of the scenario file (for relative paths).
    #[serde(skip)]
    pub dir: PathBuf,
}

fn one() -> u64 {
    1
}
fn default_interval_ms() -> u64 {
    500
}
fn default_monitor_ms() -> u64 {
    100
}

/// The simulated node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimNode {
    /// Physical cores the policy may hand out.
    pub nr_cores: u32,
    /// Frequency range and step of every core, MHz.
    pub freq_min_mhz: u32,
    pub freq_max_mhz: u32,
    pub freq_step_mhz: u32,
    /// Last-level-cache ways (0: no cache partitioning).
    pub nr_ways: u32,
    /// Power of the node with every core in deep idle, W.
    pub idle_w: f64,
    /// Power of one fully busy core at the highest frequency, W (scales
    /// with frequency cubed).
    pub core_busy_w: f64,
    /// Power of one allocated but idle core at the highest frequency, W.
    pub core_idle_w: f64,
    /// Apps share the node's `nr_cores` CPUs (no cores knob, as on a
    /// machine without a usable cpuset); else each holds its own cores.
    pub shared_cpus: bool,
    /// One unit of the CPU quota knob, milli-CPUs (100 = 0.1 CPU); 0: the
    /// node has no quota knob.
    pub quota_step_milli: u32,
    /// The CFS period quotas are enforced over, µs (1000-1000000): a real
    /// replay writes it into each app's group, the simulator throttles an
    /// app that used its quota until the period ends.
    pub cfs_period_us: u64,
    /// CFS burst, % of the quota (0-100): the share of a period's quota
    /// that went unused which an app may spend later (a real replay writes
    /// it where the kernel has burst; the simulator raises the budget of a
    /// period by it while the app's mean use is under its quota).
    pub cfs_burst_pct: u32,
    /// Best-effort apps run in the idle scheduling class: the simulator
    /// gives them only the CPU time latency-critical apps leave; false:
    /// they compete at normal weight and slow the LC apps down.
    pub be_idle: bool,
}

impl Default for SimNode {
    fn default() -> Self {
        Self {
            nr_cores: 16,
            freq_min_mhz: 1200,
            freq_max_mhz: 3000,
            freq_step_mhz: 100,
            nr_ways: 11,
            idle_w: 40.0,
            core_busy_w: 6.0,
            core_idle_w: 1.0,
            shared_cpus: false,
            quota_step_milli: 0,
            cfs_period_us: 100_000,
            cfs_burst_pct: 100,
            be_idle: true,
        }
    }
}

impl SimNode {
    /// The node with only `resources` as knobs, as a real replay with
    /// that list has them: without `cores` the apps share the CPUs;
    /// without `cpu_quota` there is no quota knob (with it and no unit
    /// given, 0.1 CPU, the actuators' default); without `frequency` every
    /// core stays at the highest; without `cache_ways` no partitioning.
    pub fn only(&self, resources: &[Resource]) -> SimNode {
        let has = |r| resources.contains(&r);
        let mut n = self.clone();
        n.shared_cpus |= !has(Resource::Cores);
        n.quota_step_milli = match (has(Resource::CpuQuota), n.quota_step_milli) {
            (false, _) => 0,
            (true, 0) => 100,
            (true, q) => q,
        };
        if !has(Resource::Frequency) {
            n.freq_min_mhz = n.freq_max_mhz;
        }
        if !has(Resource::CacheWays) {
            n.nr_ways = 0;
        }
        n
    }
}

/// One app of a scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppSpec {
    /// Name, unique in the scenario ([A-Za-z0-9_-]).
    pub name: String,
    /// `lc` (latency-critical, has a target) or `be` (best-effort).
    pub class: AppClass,
    /// How to start its server in real runs (and its default sim model);
    /// exactly one of `server` and `job`.
    #[serde(default)]
    pub server: Option<Server>,
    /// A best-effort app's batch job instead of a server: it takes no
    /// load, and its throughput (ops/s) is what it gains or loses.
    #[serde(default)]
    pub job: Option<JobSpec>,
    /// How the load generator talks to the server (every server needs one;
    /// a job has none).
    #[serde(default)]
    pub protocol: Option<Protocol>,
    /// Persistent connections with pipelining (else one per request).
    #[serde(default = "yes")]
    pub keepalive: bool,
    /// Connections of the load generator (see `qosd load --connections`).
    #[serde(default = "default_connections")]
    pub connections: usize,
    #[serde(default)]
    pub arrival: Arrival,
    /// HTTP path (`{seq}` becomes the request number).
    #[serde(default = "default_path")]
    pub http_path: String,
    /// memcached request mix.
    #[serde(default)]
    pub mix: Option<Mix>,
    /// QoS target of a latency-critical app.
    #[serde(default)]
    pub target: Option<TargetSpec>,
    /// Which eBPF figure a real replay feeds the policy: `arrival` (the
    /// default) or `service` (from the server's first read).
    #[serde(default)]
    pub latency: qosd_core::LatencyFrom,
    /// Offered load over time, fractions of capacity (default: none).
    #[serde(default = "no_load")]
    pub load: Shape,
    /// Overrides of the simulated service model (`--sim`).
    #[serde(default)]
    pub sim: SimModelSpec,
}

fn yes() -> bool {
    true
}
fn no_load() -> Shape {
    Shape::Constant { level: 0.0 }
}

impl AppSpec {
    /// The server's protocol (HTTP where a validated spec has none: a job,
    /// which is never sent load).
    pub fn protocol(&self) -> Protocol {
        self.protocol.unwrap_or(Protocol::Http)
    }
}

/// A best-effort batch job (see [`crate::batch`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum JobSpec {
    /// `qosd batch`: hashing on `threads` threads, progress in ops/s.
    Hash {
        /// Worker threads (each uses up to one CPU).
        #[serde(default = "one_u32")]
        threads: u32,
        /// Bytes hashed per operation, KiB.
        #[serde(default = "default_op_kib")]
        op_kib: u32,
    },
}

fn default_op_kib() -> u32 {
    16
}

impl JobSpec {
    /// Checks the job's own fields (scenarios and the daemon's config
    /// share it): the key at fault (under `job`) and why.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let JobSpec::Hash { threads, op_kib } = self;
        if !(1..=crate::batch::MAX_THREADS).contains(threads) {
            let max = crate::batch::MAX_THREADS;
            return Err(("threads", format!("{threads}: must be in 1..={max}")));
        }
        if !(1..=crate::batch::MAX_OP_KIB).contains(op_kib) {
            let max = crate::batch::MAX_OP_KIB;
            return Err(("op_kib", format!("{op_kib}: must be in 1..={max}")));
        }
        Ok(())
    }

    /// The arguments of the job's process, bounded by the run's length.
    pub fn args(&self, report_ms: u64, exit_after_s: u64) -> crate::batch::BatchArgs {
        match self {
            JobSpec::Hash { threads, op_kib } => crate::batch::BatchArgs {
                threads: *threads,
                op_kib: *op_kib,
                report_ms,
                exit_after_s,
            },
        }
    }
}
fn default_connections() -> usize {
    8
}
fn default_path() -> String {
    "/".into()
}

/// memcached request mix (see [`MemcacheMix`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mix {
    /// Fraction of `set` requests, 0..=1.
    pub set_ratio: f64,
    /// Distinct keys.
    #[serde(default = "default_keys")]
    pub nr_keys: u32,
    /// Value size, bytes.
    #[serde(default = "default_value_bytes")]
    pub value_bytes: usize,
}

fn default_keys() -> u32 {
    10_000
}
fn default_value_bytes() -> usize {
    64
}

impl Mix {
    pub fn to_load(&self) -> MemcacheMix {
        MemcacheMix {
            nr_keys: self.nr_keys,
            value_bytes: self.value_bytes,
            set_ratio: self.set_ratio,
            preload: true,
        }
    }
}

/// How to start a server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Server {
    /// memcached from the distribution.
    Memcached {
        #[serde(default = "default_threads")]
        threads: u32,
        /// Cache memory, MiB.
        #[serde(default = "default_memory_mb")]
        memory_mb: u32,
    },
    /// nginx from the distribution serving a small static page.
    Nginx {
        #[serde(default = "one_u32")]
        workers: u32,
    },
    /// The fixture server of this crate (`qosd fixture`).
    Fixture {
        /// CPU time per request, µs.
        #[serde(default)]
        work_us: u64,
        /// Delay added to every reply, µs.
        #[serde(default)]
        delay_us: u64,
    },
    /// The gRPC fixture server (grpc-go, `grpc-fixture-server`, built by
    /// `make fixtures`): one unary method doing `work_us` of CPU per call.
    Grpc {
        /// CPU time per call, µs.
        #[serde(default)]
        work_us: u64,
    },
    /// Any command; `{port}` in an argument becomes the port.
    Command { argv: Vec<String> },
}

fn default_threads() -> u32 {
    2
}
fn default_memory_mb() -> u32 {
    64
}
fn one_u32() -> u32 {
    1
}

/// A QoS target: a latency bound at a percentile, either in milliseconds
/// or as a multiple of the latency at the calibrated knee.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    /// Percentile in (0, 100].
    #[serde(default = "p99")]
    pub percentile: f64,
    /// Fixed bound, ms.
    #[serde(default)]
    pub ms: Option<f64>,
    /// Bound = this × the latency at the knee of the load–latency curve.
    #[serde(default)]
    pub knee_factor: Option<f64>,
}

fn p99() -> f64 {
    99.0
}

/// Optional overrides of the simulated service model; absent fields take
/// the defaults of the server kind (see [`crate::sim::SimModel`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimModelSpec {
    /// CPU time per request at the highest frequency with enough ways, µs.
    pub service_us: Option<f64>,
    /// Coefficient of variation of the service time, (0, 1] (1: exponential).
    pub service_cv: Option<f64>,
    /// Requests served at once at most (threads); more cores do not help.
    pub parallelism: Option<u32>,
    /// Fraction of the service time that scales with 1/frequency, 0..=1.
    pub freq_sensitivity: Option<f64>,
    /// Extra service time with no cache ways, as a fraction (0.3 = 30 %).
    pub cache_slowdown: Option<f64>,
    /// Ways beyond which more cache does not help.
    pub ways_needed: Option<u32>,
    /// Latency outside the CPU (e.g. a fixed delay), µs.
    pub fixed_us: Option<f64>,
    /// Network round trip seen only by the client, ms.
    pub network_ms: Option<f64>,
    /// Load at which the network saturates, as a multiple of capacity.
    pub network_capacity_x: Option<f64>,
    /// How slowly the network queue follows the load, seconds.
    pub network_tau_s: Option<f64>,
    /// Log-normal sigma of each sample's latency noise.
    pub noise: Option<f64>,
    /// A batch job's operations per CPU-second.
    pub ops_per_cpu_s: Option<f64>,
}

/// Every field of [`SimModelSpec`] (each also a field of the simulator's
/// `SimModel`), named once: `sim_model_fields!(m)` calls `m!(service_us,
/// ...)`. Laying one spec over another (`sim::fitted`) and setting a model
/// from one (`sim::model`) both go over this list, so a new field is
/// added here and in the two structs only.
macro_rules! sim_model_fields {
    ($then:ident) => {
        $then!(
            service_us,
            service_cv,
            parallelism,
            freq_sensitivity,
            cache_slowdown,
            ways_needed,
            fixed_us,
            network_ms,
            network_capacity_x,
            network_tau_s,
            noise,
            ops_per_cpu_s
        )
    };
}
pub(crate) use sim_model_fields;

/// An invalid scenario file: `path:line:col: key: message` (the same
/// reader and message as config and policy files).
pub type ScenarioError = yamlfile::FileError;

impl Scenario {
    /// Reads, parses and validates a scenario file (and its trace files).
    pub fn from_file(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = yamlfile::read(path)?;
        Self::parse(path, &text)
    }

    /// Parses and validates `text`, the contents of `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Scenario, ScenarioError> {
        let mut s: Scenario = yamlfile::parse_doc(path, text, yamlfile::Doc::Scenario)?;
        s.dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        validate::validate(&mut s).map_err(|(key, msg)| {
            yamlfile::invalid(path, text, yamlfile::Invalid::new(KeyPath(key), msg))
        })?;
        Ok(s)
    }

    /// The policy file this scenario asks for, resolved against its folder.
    pub fn policy_path(&self) -> Option<PathBuf> {
        self.policy.as_ref().map(|p| self.dir.join(p))
    }

    /// Number of decision intervals in the run.
    pub fn nr_intervals(&self) -> u64 {
        ((self.duration_s * 1000.0) / self.interval_ms as f64).round() as u64
    }
}

/// Every `*.yaml` file in a folder, sorted.
pub fn shipped(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    v.sort();
    Ok(v)
}
