//! `realtime:`: when the loop's real-time gate gives real time to the
//! latency-critical apps that ask for it (`resources: { initial: {
//! cpu_priority: 3 } }`) and takes it back (docs/sharing-rt.md, "The
//! gate"). Node-wide, not per app: the bounds guard what the node's fair
//! class keeps (the batch job, qosd, sshd) and the node's one RT budget.

use qosd_core::control::rtgate::{RT_OFF_ABOVE, RT_ON_BELOW};
use serde::{Deserialize, Serialize};

use crate::yamlfile::{Invalid, KeyPath};

/// `realtime:` (every key optional).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RealtimeConfig {
    /// Real time is given while the app's CPU use is below this share of
    /// the CPUs it holds (its cores, its quota, else the node's), judged
    /// on decisions; in (0, 1), below `off_above` (default 0.6).
    #[serde(default = "default_on_below")]
    pub on_below: f64,
    /// ... and taken back within a monitoring tick once a tick's use is
    /// above this share, or a tick gives no reading; in (0, 1], above
    /// `on_below` (default 0.7).
    #[serde(default = "default_off_above")]
    pub off_above: f64,
}

fn default_on_below() -> f64 {
    RT_ON_BELOW
}
fn default_off_above() -> f64 {
    RT_OFF_ABOVE
}

impl Default for RealtimeConfig {
    fn default() -> Self {
        RealtimeConfig {
            on_below: RT_ON_BELOW,
            off_above: RT_OFF_ABOVE,
        }
    }
}

impl RealtimeConfig {
    /// Both bounds shares of a CPU count, `on_below` < `off_above` (the
    /// hysteresis that keeps one noisy reading from flapping the class).
    pub fn validate(&self, at: &KeyPath) -> Result<(), Invalid> {
        for (key, v) in [("on_below", self.on_below), ("off_above", self.off_above)] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(Invalid::new(
                    at.key(key),
                    format!("{v} is not a share of the app's CPUs in (0, 1]"),
                ));
            }
        }
        if self.on_below >= self.off_above {
            return Err(Invalid::new(
                at.key("on_below"),
                format!(
                    "{} must be below off_above ({}): real time is given below one \
                     bound and taken back above the other",
                    self.on_below, self.off_above
                ),
            ));
        }
        Ok(())
    }

    /// The gate for the apps named in `wants` with these bounds.
    pub fn gate(&self, wants: impl IntoIterator<Item = String>) -> qosd_core::control::RtGate {
        qosd_core::control::RtGate::with_bounds(wants, self.on_below, self.off_above)
    }
}
