//! What the power sensor reports each interval: node and socket power, and
//! power per thread and per process, every figure carrying whether it is a
//! measurement (RAPL) or an estimate (model).

use qosd_core::{AppPower, PowerSource};
use serde::Serialize;

use super::sched::SchedCounters;

/// How threads are weighed in eq. (1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Weight {
    /// Unhalted cycles from a hardware PMU.
    Cycles,
    /// On-CPU time (no PMU).
    Time,
}

impl std::fmt::Display for Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Weight::Cycles => "cycles",
            Weight::Time => "time",
        })
    }
}

/// One socket over the interval, W.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SocketPower {
    /// `physical_package_id`.
    pub socket: u32,
    /// Package power (RAPL), or idle + dynamic terms (model).
    pub package_w: f64,
    /// RAPL core (PP0) domain, where it exists.
    pub core_w: Option<f64>,
    /// RAPL DRAM domain, where it exists.
    pub dram_w: Option<f64>,
    /// Power attributed to threads (eq. (2)): the core domain where RAPL has
    /// one, else package × the socket's busy fraction; the dynamic terms of
    /// the model. 0 when no thread ran on the socket.
    pub active_w: f64,
    /// package + DRAM − active: idle, uncore and memory power.
    pub idle_w: f64,
    /// Mean busy fraction of the socket's online CPUs, 0..=1.
    pub busy_fraction: f64,
}

/// The whole node over the interval, W.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NodePower {
    /// Σ package + Σ DRAM.
    pub total_w: f64,
    /// Σ socket active power = Σ per-thread power.
    pub active_w: f64,
    /// total − active.
    pub idle_w: f64,
    /// Σ DRAM where RAPL has the domain.
    pub dram_w: Option<f64>,
}

/// One thread over the interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadPower {
    pub tid: u32,
    pub tgid: u32,
    /// Time on any CPU during the interval, ns.
    pub on_cpu_ns: u64,
    /// on_cpu_ns ÷ interval: the thread's duty cycle, 0..=1.
    pub cpu_fraction: f64,
    /// Part of on_cpu_ns while its core's SMT sibling was busy, ns.
    pub sib_busy_ns: u64,
    /// Cycles, where a PMU exists.
    pub cycles: Option<u64>,
    /// Σ_s W_i(s) of eq. (1), in cycles or ns (see [`PowerSample::weight`]).
    pub weighted: f64,
    /// power_w ÷ node active power, 0..=1.
    pub share: f64,
    pub power_w: f64,
    pub energy_j: f64,
    /// The thread exited during the interval (its last figures).
    pub exited: bool,
}

/// One process (all its threads) over the interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessPower {
    pub tgid: u32,
    /// Threads that ran during the interval.
    pub nr_threads: usize,
    pub on_cpu_ns: u64,
    /// on_cpu_ns ÷ interval: CPUs used (may exceed 1).
    pub cpus_used: f64,
    pub share: f64,
    pub power_w: f64,
    pub energy_j: f64,
}

/// Everything the sensor measured (or estimated) over one interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PowerSample {
    pub interval_s: f64,
    pub source: PowerSource,
    /// True when `source` is the model: every power and energy figure in
    /// this sample is an estimate.
    pub energy_is_estimate: bool,
    pub weight: Weight,
    pub ht_ratio: f64,
    pub node: NodePower,
    pub sockets: Vec<SocketPower>,
    /// Threads that ran during the interval, by power, highest first.
    pub threads: Vec<ThreadPower>,
    /// Processes that ran during the interval, by power, highest first.
    pub processes: Vec<ProcessPower>,
    /// Program events during the interval (switches, table full, ...).
    pub counters: SchedCounters,
}

/// Energy per request, J: power ÷ requests per second; `None` without
/// requests (or a non-finite rate).
pub fn energy_per_request_j(power_w: f64, rps: f64) -> Option<f64> {
    (rps.is_finite() && rps > 0.0).then(|| power_w / rps)
}

impl PowerSample {
    /// Power of an app made of the processes `tgids` (threads of other
    /// processes are not counted), with energy per request from the app's
    /// `rps` (from the request sensor) when given.
    pub fn app(&self, tgids: &[u32], rps: Option<f64>) -> AppPower {
        let mut power_w = 0.0;
        let mut on_ns = 0u64;
        for p in self.processes.iter().filter(|p| tgids.contains(&p.tgid)) {
            power_w += p.power_w;
            on_ns += p.on_cpu_ns;
        }
        AppPower {
            power_w,
            energy_j: power_w * self.interval_s,
            energy_per_request_j: rps.and_then(|r| energy_per_request_j(power_w, r)),
            share: if self.node.active_w > 0.0 {
                power_w / self.node.active_w
            } else {
                0.0
            },
            cpus_used: on_ns as f64 / (self.interval_s * 1e9),
            source: self.source,
            energy_is_estimate: self.energy_is_estimate,
        }
    }

    /// The process entry of `tgid`, if it ran during the interval.
    pub fn process(&self, tgid: u32) -> Option<&ProcessPower> {
        self.processes.iter().find(|p| p.tgid == tgid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn energy_per_request() {
        assert_eq!(energy_per_request_j(10.0, 1000.0), Some(0.01));
        assert_eq!(energy_per_request_j(10.0, 0.0), None);
        assert_eq!(energy_per_request_j(10.0, f64::NAN), None);
    }
}
