//! The resource vocabulary shared by actuators, policies and the manager:
//! which knobs exist and what one app is given of each.

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
}

impl Resource {
    pub const ALL: [Resource; 5] = [
        Resource::Cores,
        Resource::Frequency,
        Resource::CacheWays,
        Resource::MemoryBandwidth,
        Resource::CpuQuota,
    ];

    /// The snake_case name used in JSON, YAML and messages.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Cores => "cores",
            Resource::Frequency => "frequency",
            Resource::CacheWays => "cache_ways",
            Resource::MemoryBandwidth => "memory_bandwidth",
            Resource::CpuQuota => "cpu_quota",
        }
    }
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
}

impl Allocation {
    /// True when no resource is set.
    pub fn is_empty(&self) -> bool {
        self.cpus.is_none()
            && self.freq_mhz.is_none()
            && self.llc_ways.is_none()
            && self.mb_percent.is_none()
            && self.cpu_quota_milli.is_none()
    }

    /// The resources this allocation sets.
    pub fn resources(&self) -> Vec<Resource> {
        let mut v = Vec::new();
        if self.cpus.is_some() {
            v.push(Resource::Cores);
        }
        if self.freq_mhz.is_some() {
            v.push(Resource::Frequency);
        }
        if self.llc_ways.is_some() {
            v.push(Resource::CacheWays);
        }
        if self.mb_percent.is_some() {
            v.push(Resource::MemoryBandwidth);
        }
        if self.cpu_quota_milli.is_some() {
            v.push(Resource::CpuQuota);
        }
        v
    }
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
}
