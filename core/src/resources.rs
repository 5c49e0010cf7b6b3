//! The resource vocabulary shared by actuators, policies and the manager:
//! which knobs exist ([`Resource`]), what one app is given of each in the
//! policy's counts and levels ([`Share`]) and as concrete settings
//! ([`Allocation`]), and what the node offers ([`NodeCaps`]). Everything
//! that differs from knob to knob beyond these fields is a row of the
//! knob table (`knobs.rs`), which also holds the methods that read it
//! (`Resource::name`, `Share::get`, `NodeCaps::has`, ...): these types
//! stay plain data below it.

use serde::{Deserialize, Serialize};

/// A kind of node resource qosd can hand to an app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    /// CPU cores (a CPU list; hyperthread siblings stay with one app).
    Cores,
    /// CPU frequency (DVFS) of the app's CPUs.
    #[serde(alias = "freq")]
    Frequency,
    /// Last-level-cache ways (Intel CAT / resctrl L3).
    #[serde(alias = "ways")]
    CacheWays,
    /// Memory bandwidth throttling (Intel MBA / resctrl MB).
    #[serde(alias = "mem_bandwidth", alias = "mb")]
    MemoryBandwidth,
    /// CPU bandwidth (CFS quota: cgroup v2 `cpu.max`, v1
    /// `cpu.cfs_quota_us`), in thousandths of a CPU.
    #[serde(alias = "quota")]
    CpuQuota,
    /// CPU scheduling priority of the app's group: best-effort work in the
    /// idle class (`cpu.idle`, else the lowest weight), so that
    /// latency-critical threads preempt it at once.
    #[serde(alias = "priority")]
    CpuPriority,
    /// Kernel-level hedging of the app's outbound UDP requests to a slow
    /// service (paper 003): off or on, with the spec the config gives the
    /// app. The lever left when the tail comes from a slow replica.
    Hedge,
}

impl Resource {
    /// Every knob, in the order of [`crate::knobs::KNOBS`].
    pub const ALL: [Resource; 7] = [
        Resource::Cores,
        Resource::Frequency,
        Resource::CacheWays,
        Resource::MemoryBandwidth,
        Resource::CpuQuota,
        Resource::CpuPriority,
        Resource::Hedge,
    ];
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What one app is given. `None` leaves that resource as it is.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allocation {
    /// Logical CPU ids the app may run on (sorted, no duplicates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Vec<u32>>,
    /// Frequency of the app's CPUs, in MHz.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freq_mhz: Option<u32>,
    /// Number of last-level-cache ways (one contiguous mask, disjoint from other apps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llc_ways: Option<u32>,
    /// Memory bandwidth ceiling, in percent of the link (resctrl MB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mb_percent: Option<u32>,
    /// CPU bandwidth ceiling, in thousandths of a CPU (1000 = one CPU's
    /// worth of time per period, whichever CPUs it runs on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_quota_milli: Option<u32>,
    /// CPU priority class: [`crate::knobs::PRIORITY_IDLE`],
    /// [`crate::knobs::PRIORITY_NORMAL`] or
    /// [`crate::knobs::PRIORITY_REALTIME`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_priority: Option<u32>,
    /// Hedging: [`crate::knobs::HEDGE_OFF`] or [`crate::knobs::HEDGE_ON`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<u32>,
}

/// An app's share of the node as a policy sees it: counts and levels
/// (2 cores, 4 ways, 1800 MHz, 50 % MB). The actuators turn it into a
/// concrete [`Allocation`] (which CPUs, which way mask). A field for
/// a resource the node lacks is 0 and is left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Share {
    /// Number of CPU cores.
    pub nr_cores: u32,
    /// Number of LLC ways.
    pub nr_ways: u32,
    /// Frequency of the app's cores, in MHz.
    pub freq_mhz: u32,
    /// Memory-bandwidth throttle, in percent (1..=100).
    pub mb_percent: u32,
    /// CPU bandwidth ceiling, in milli-CPUs (300 = 0.3 CPU); 0 = no quota.
    /// How it combines with `nr_cores`: [`crate::quota`].
    #[serde(default)]
    pub cpu_quota_milli: u32,
    /// CPU priority class: 1 idle, 2 normal, 0 = as found
    /// ([`crate::knobs::PRIORITY_IDLE`]).
    #[serde(default)]
    pub cpu_priority: u32,
    /// Hedging: 1 off, 2 on, 0 = as found (off)
    /// ([`crate::knobs::HEDGE_ON`]).
    #[serde(default)]
    pub hedge: u32,
}

/// The frequency range of the node's cores (cpufreq).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreqRange {
    pub min_mhz: u32,
    pub max_mhz: u32,
    /// One unit of a frequency decision (100 MHz in PARTIES).
    pub step_mhz: u32,
}

/// The memory-bandwidth throttle range (resctrl `MB:`); the maximum is 100.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MbRange {
    pub min_percent: u32,
    /// Granularity of the throttle (resctrl `info/MB/bandwidth_gran`).
    pub step_percent: u32,
}

/// The quota range of the node: one unit of a decision and the most any
/// app may hold (the node's online CPUs). How quota is bounded:
/// [`crate::quota`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaRange {
    /// One unit of a quota decision, milli-CPUs (default 100 = 0.1 CPU).
    pub step_milli: u32,
    /// The node's online CPUs in milli-CPUs.
    pub max_milli: u32,
}

/// Which resources the node has and how much of each. A policy skips the
/// resources that are absent (`nr_* == 0` or `None`; the default has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeCaps {
    /// Cores the manager may hand out; 0 when no core actuator works.
    pub nr_cores: u32,
    /// The node's online CPUs, whatever knobs work or are enabled (0: not
    /// known): what an app holds when no knob bounds it
    /// ([`crate::oa::cpus_held`]).
    #[serde(default)]
    pub nr_cpus: u32,
    /// LLC ways; 0 when there is no cache allocation (CAT).
    pub nr_ways: u32,
    pub freq: Option<FreqRange>,
    pub mb: Option<MbRange>,
    /// CPU bandwidth (CFS quota); `None` when no cpu controller is usable
    /// or the config leaves it off.
    #[serde(default)]
    pub quota: Option<QuotaRange>,
    /// Groups can be put in the idle class (or at the lowest weight).
    #[serde(default)]
    pub cpu_priority: bool,
    /// Requests can be hedged (TC eBPF; only apps the config gives a
    /// `hedge:` spec are ever hedged).
    #[serde(default)]
    pub hedge: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_lists_only_set_fields() {
        let a = Allocation {
            cpus: Some(vec![0, 1]),
            llc_ways: Some(4),
            ..Default::default()
        };
        assert_eq!(a.resources(), vec![Resource::Cores, Resource::CacheWays]);
        assert!(!a.is_empty());
        assert!(Allocation::default().is_empty());
    }

    #[test]
    fn merged_lays_set_fields_over() {
        let a = Allocation {
            cpus: Some(vec![0]),
            freq_mhz: Some(1000),
            ..Default::default()
        };
        let b = Allocation {
            freq_mhz: Some(2000),
            cpu_quota_milli: Some(300),
            ..Default::default()
        };
        let m = a.merged(&b);
        assert_eq!(m.cpus, Some(vec![0]));
        assert_eq!(m.freq_mhz, Some(2000));
        assert_eq!(m.cpu_quota_milli, Some(300));
    }
}
