//! The power vocabulary shared by the power sensor, the policies and the
//! replays: where a node's power figure comes from, and one app's power.

use serde::{Deserialize, Serialize};

/// Where node power comes from. Only `Rapl` is a measurement; every figure
/// derived from `Model` is an estimate and says so (`is_estimate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerSource {
    /// RAPL energy counters (powercap sysfs or perf `power/`).
    Rapl,
    /// The utilisation/frequency model: an estimate.
    Model,
}

impl PowerSource {
    /// True when figures from this source are estimates, not measurements.
    pub fn is_estimate(self) -> bool {
        matches!(self, PowerSource::Model)
    }
}

impl std::fmt::Display for PowerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PowerSource::Rapl => "rapl",
            PowerSource::Model => "model",
        })
    }
}

/// Power of one app (a set of processes) over one sensor interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AppPower {
    /// Power attributed to the app's threads (eq. (2) of paper 001), W.
    pub power_w: f64,
    /// `power_w` × the interval, J.
    pub energy_j: f64,
    /// `power_w` ÷ the app's requests per second, J; `None` without requests.
    pub energy_per_request_j: Option<f64>,
    /// The app's share of the node's attributable (active) power, 0..=1.
    pub share: f64,
    /// CPU time of the app ÷ the interval (1.0 = one CPU busy all the time).
    pub cpus_used: f64,
    pub source: PowerSource,
    /// True when `source` is the model: every figure above is an estimate.
    pub energy_is_estimate: bool,
}
