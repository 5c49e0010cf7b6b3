//! What the actuator registry is built from: the `actuators:` section of
//! the config (which knobs, which backend of each, the root prefix, the
//! state file), its defaults and its validation.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::Root;

/// Burst, as % of the quota (the kernel caps it at the quota): one
/// period's quota may be banked. Measured best (`scenarios/bench/cfs_period.sh`).
pub const DEFAULT_BURST_PCT: u32 = 100;

/// Which cores backend to use. `auto` takes the first available of
/// cgroup2, cgroup1, affinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CoresBackend {
    #[default]
    Auto,
    Cgroup2,
    Cgroup1,
    Affinity,
}

/// Which frequency backend: `auto` is cpufreq sysfs, then cpupower.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FreqBackend {
    #[default]
    Auto,
    Cpufreq,
    Cpupower,
}

/// Which cache-ways backend: `auto` is resctrl, then pqos.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WaysBackend {
    #[default]
    Auto,
    Resctrl,
    Pqos,
}

/// Which quota backend: `auto` is cgroup2, then cgroup1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuotaBackend {
    #[default]
    Auto,
    Cgroup2,
    Cgroup1,
}

/// The kernel's range of CFS periods: 1 ms to 1 s.
pub const PERIOD_RANGE_US: std::ops::RangeInclusive<u64> = 1_000..=1_000_000;

pub(crate) fn allowed<T: Serialize + PartialEq + Default>(pref: T, name: &str) -> bool {
    pref == T::default()
        || serde_json::to_value(&pref)
            .ok()
            .and_then(|v| v.as_str().map(|s| s == name))
            == Some(true)
}

/// How the actuators are set up (the `actuators:` section of the config).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Root prefix for every /sys, /proc, cgroup and resctrl path.
    pub root: PathBuf,
    /// Log each change instead of making it.
    pub dry_run: bool,
    /// Where originals are recorded before the first change; default
    /// `<root>/run/qosd/state.json`.
    pub state_file: Option<PathBuf>,
    pub cores_backend: CoresBackend,
    pub frequency_backend: FreqBackend,
    pub cache_ways_backend: WaysBackend,
    /// Width of the L3 bitmask for the pqos backend, in ways; default the
    /// L3's ways_of_associativity.
    pub pqos_cbm_bits: Option<u32>,
    pub cpu_quota_backend: QuotaBackend,
    /// One unit of a CPU-quota decision, in milli-CPUs (100 = 0.1 CPU).
    pub cpu_quota_unit_milli: u32,
    /// The CFS period quotas are enforced over, µs (1000-1000000); `None`
    /// leaves each group's own (the kernel's 100 ms).
    pub cpu_quota_period_us: Option<u64>,
    /// CFS burst, % of the quota (0-100): how much of a period's quota
    /// that went unused may be spent later (`cpu.max.burst`,
    /// `cpu.cfs_burst_us`; kernels without them: none).
    pub cpu_quota_burst_pct: u32,
    /// Restore every change when the set is dropped (the daemon, replays);
    /// `qosd set` turns it off to leave its one-shot change in place.
    pub restore_on_drop: bool,
    /// What hedging means per app name (the hedge knob hedges only these).
    pub hedge: std::collections::BTreeMap<String, qosd_core::hedge::HedgeSpec>,
    /// The RT budget of a realtime app's group, µs per `cpu.rt_period_us`
    /// (1 s) per CPU, 1..=1000000 (the daemon's `realtime.budget_us`,
    /// `qosd set --rt-budget-us`; default [`crate::realtime::DEFAULT_BUDGET_US`]).
    pub rt_budget_us: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            root: PathBuf::from("/"),
            dry_run: false,
            state_file: None,
            cores_backend: CoresBackend::Auto,
            frequency_backend: FreqBackend::Auto,
            cache_ways_backend: WaysBackend::Auto,
            pqos_cbm_bits: None,
            cpu_quota_backend: QuotaBackend::Auto,
            cpu_quota_unit_milli: DEFAULT_QUOTA_UNIT_MILLI,
            cpu_quota_period_us: None,
            cpu_quota_burst_pct: DEFAULT_BURST_PCT,
            restore_on_drop: true,
            hedge: Default::default(),
            rt_budget_us: crate::realtime::DEFAULT_BUDGET_US,
        }
    }
}

/// 0.1 CPU: fine enough to track a ramp on a 2-CPU machine in tens of
/// steps, coarse enough that one step changes latency measurably.
pub const DEFAULT_QUOTA_UNIT_MILLI: u32 = 100;

impl Config {
    pub fn validate(&self) -> Result<()> {
        if !(10..=1000).contains(&self.cpu_quota_unit_milli) {
            return Err(Error::Invalid(format!(
                "actuators.cpu_quota_unit_milli: {} is not in 10-1000 (0.01 to 1 CPU)",
                self.cpu_quota_unit_milli
            )));
        }
        if let Some(p) = self.cpu_quota_period_us {
            if !PERIOD_RANGE_US.contains(&p) {
                return Err(Error::Invalid(format!(
                    "actuators.cpu_quota_period_us: {p} is not in 1000-1000000 (1 ms to 1 s)"
                )));
            }
        }
        if self.cpu_quota_burst_pct > 100 {
            return Err(Error::Invalid(format!(
                "actuators.cpu_quota_burst_pct: {} is not in 0-100 (% of the quota)",
                self.cpu_quota_burst_pct
            )));
        }
        if !self.root.is_absolute() || !self.root.is_dir() {
            return Err(Error::Invalid(format!(
                "actuators.root: {} is not an existing absolute directory",
                self.root.display()
            )));
        }
        crate::realtime::check_budget(self.rt_budget_us)
            .map_err(|m| Error::Invalid(format!("realtime.budget_us: {m}")))?;
        if let Some(b) = self.pqos_cbm_bits {
            if !(1..=64).contains(&b) {
                return Err(Error::Invalid(format!(
                    "actuators.pqos_cbm_bits: {b} is not in 1-64"
                )));
            }
        }
        Ok(())
    }

    /// The state file path in use.
    pub fn state_path(&self) -> PathBuf {
        self.state_file
            .clone()
            .unwrap_or_else(|| Root::new(&self.root).path("/run/qosd/state.json"))
    }
}
