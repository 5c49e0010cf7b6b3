//! The power sensor: per-thread, per-process and per-app power.
//!
//! Node energy comes from RAPL (powercap sysfs, else the perf `power` PMU)
//! or, without RAPL, from a documented model that is labelled an estimate
//! everywhere. It is attributed to threads each interval by their
//! hyperthread-weighted share of cycles (on-CPU time without a PMU) seen by
//! the `sched_switch` BPF program: paper 001 eq. (1)-(2).
//!
//! The manager opens one [`PowerSensor`] and calls [`PowerSensor::sample`]
//! once per interval; [`PowerSample::app`] gives an app's power, energy and
//! energy per request.

mod attrib;
mod compute;
mod config;
pub mod model;
mod perf;
mod rapl;
mod sample;
pub mod sched;
mod sched_abi;
pub mod topology;

use std::path::{Path, PathBuf};

use qosd_core::PowerSource;
use serde::Serialize;

pub use attrib::{attribute, weighted, Attribution, SocketUse};
pub use compute::{advance, compute, Baseline, EnergyInput};
pub use config::{ModelConfig, PowerConfig, SourceChoice};
pub use rapl::{wrap_delta, SocketEnergy};
pub use sample::{
    energy_per_request_j, NodePower, PowerSample, ProcessPower, SocketPower, ThreadPower, Weight,
};
use sched::Sched;
pub use sched::SchedCounters;
use topology::CpuPackages;

/// Errors of the power sensor; each names the path, key or step at fault.
#[derive(Debug, thiserror::Error)]
pub enum PowerError {
    #[error("invalid config: {key}: {reason}")]
    Config { key: String, reason: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: cannot parse {what}", path.display())]
    Parse { path: PathBuf, what: String },
    #[error("sched BPF program: {0}")]
    Bpf(String),
    #[error("energy counters: {0}")]
    Energy(String),
    #[error("power source {0} was asked for but is not available: {1}")]
    Unavailable(&'static str, String),
}

impl From<qosd_core::sys::SysError> for PowerError {
    fn from(e: qosd_core::sys::SysError) -> Self {
        match e {
            qosd_core::sys::SysError::Io { path, source, .. } => PowerError::Io { path, source },
            qosd_core::sys::SysError::Parse { path, what } => PowerError::Parse { path, what },
        }
    }
}

/// What was detected at start: the energy source, the weighting, and
/// everything that is missing on this machine and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PowerCaps {
    pub source: PowerSource,
    /// `powercap`, `perf` or `model`.
    pub backend: &'static str,
    /// RAPL domains read, e.g. `package-0`, `package-0/core`.
    pub domains: Vec<String>,
    pub weight: Weight,
    pub ht_ratio: f64,
    pub nr_sockets: usize,
    pub nr_cpus: usize,
    pub smt: bool,
    /// Human-readable lines: what is not available and what is used instead.
    pub notes: Vec<String>,
}

enum Energy {
    Powercap(rapl::Powercap),
    Perf(perf::PerfEnergy),
    Model { cpufreq: bool },
}

/// The live sensor: the attached sched program plus the energy source.
pub struct PowerSensor {
    cfg: PowerConfig,
    root: PathBuf,
    topo: CpuPackages,
    energy: Energy,
    sched: Sched,
    base: Baseline,
    caps: PowerCaps,
}

fn detect_energy(
    cfg: &PowerConfig,
    root: &Path,
    topo: &CpuPackages,
    notes: &mut Vec<String>,
) -> Result<Energy, PowerError> {
    let want = cfg.source;
    if matches!(want, SourceChoice::Auto | SourceChoice::Powercap) {
        match rapl::Powercap::detect(root, topo)? {
            Some(p) => return Ok(Energy::Powercap(p)),
            None if want == SourceChoice::Powercap => {
                return Err(PowerError::Unavailable(
                    "powercap",
                    format!(
                        "no intel-rapl package zone under {}",
                        root.join("sys/class/powercap").display()
                    ),
                ))
            }
            None => notes.push("RAPL: not available: no powercap intel-rapl package zones".into()),
        }
    }
    if matches!(want, SourceChoice::Auto | SourceChoice::Perf) {
        match perf::PerfEnergy::detect(root, topo) {
            Ok(Some(p)) => return Ok(Energy::Perf(p)),
            Ok(None) if want == SourceChoice::Perf => {
                return Err(PowerError::Unavailable(
                    "perf",
                    "no power/energy-pkg/ event".into(),
                ))
            }
            Ok(None) => notes.push("RAPL: not available: no perf power/energy-pkg/ event".into()),
            Err(e) if want == SourceChoice::Perf => return Err(e),
            Err(e) => notes.push(format!("RAPL via perf: not usable: {e}")),
        }
    }
    let cpufreq = model::freq_ratios(root, topo).iter().any(Option::is_some);
    notes.push(
        "power source: model (an ESTIMATE from CPU utilisation and frequency, \
         coefficients in power.model)"
            .into(),
    );
    if !cpufreq {
        notes.push("frequency: no cpufreq: the model takes every CPU at its maximum".into());
    }
    Ok(Energy::Model { cpufreq })
}

impl PowerSensor {
    /// Detects the energy source under `root` (normally `/`), loads and
    /// attaches the sched program (needs root) and takes the baseline of the
    /// first interval.
    pub fn open(cfg: &PowerConfig, root: &Path) -> Result<PowerSensor, PowerError> {
        cfg.validate()?;
        let topo = CpuPackages::read(&qosd_core::sys::Root::new(root))?;
        let mut notes = Vec::new();
        let energy = detect_energy(cfg, root, &topo, &mut notes)?;
        let mut sched = Sched::open(&topo, cfg.nr_threads_max, cfg.use_cycles)?;
        if let Some(why) = &sched.cycles_note {
            notes.push(format!(
                "cycles: not available: {why}; threads are weighed by on-CPU time"
            ));
        }
        if !topo.has_smt() {
            notes.push("SMT: none: eq. (1) reduces to plain shares (no sibling ever busy)".into());
        }
        if topo.nr_wide_smt_cores > 0 {
            notes.push(format!(
                "SMT: {} cores have more than 2 threads: their CPUs are weighed as if alone",
                topo.nr_wide_smt_cores
            ));
        }
        let (source, backend, domains) = match &energy {
            Energy::Powercap(p) => (PowerSource::Rapl, "powercap", p.domains.clone()),
            Energy::Perf(p) => (PowerSource::Rapl, "perf", p.domains.clone()),
            Energy::Model { .. } => (PowerSource::Model, "model", Vec::new()),
        };
        let caps = PowerCaps {
            source,
            backend,
            domains,
            weight: if sched.uses_cycles() {
                Weight::Cycles
            } else {
                Weight::Time
            },
            ht_ratio: cfg.ht_ratio,
            nr_sockets: topo.sockets.len(),
            nr_cpus: topo.cpus.iter().filter(|c| c.online).count(),
            smt: topo.has_smt(),
            notes,
        };
        let first = sched.read()?;
        let base = advance(&Baseline::default(), &first);
        Ok(PowerSensor {
            cfg: cfg.clone(),
            root: root.to_owned(),
            topo,
            energy,
            sched,
            base,
            caps,
        })
    }

    /// What was detected at start.
    pub fn caps(&self) -> &PowerCaps {
        &self.caps
    }

    /// The CPU topology in use.
    pub fn topology(&self) -> &CpuPackages {
        &self.topo
    }

    /// Power since the previous call (or since `open`). Call it once per
    /// interval; intervals of about a second or more keep RAPL's ~1 ms
    /// update granularity negligible.
    pub fn sample(&mut self) -> Result<PowerSample, PowerError> {
        let energy = match &mut self.energy {
            Energy::Powercap(p) => EnergyInput::Rapl(p.read()?),
            Energy::Perf(p) => EnergyInput::Rapl(p.read()?),
            Energy::Model { cpufreq } => EnergyInput::Model {
                freq: if *cpufreq {
                    model::freq_ratios(&self.root, &self.topo)
                } else {
                    Vec::new()
                },
            },
        };
        let cur = self.sched.read()?;
        let s = compute(
            &self.cfg,
            &self.topo,
            self.caps.weight,
            &self.base,
            &cur,
            &energy,
        );
        self.base = advance(&self.base, &cur);
        Ok(s)
    }

    /// True while the kernel's thread table has an entry for `tid` (exited
    /// threads leave it at the first `sample` after their exit).
    pub fn tracks_thread(&self, tid: u32) -> bool {
        self.sched.has_thread(tid)
    }
}
