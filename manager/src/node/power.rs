//! The power sensor as a replay node uses it: RAPL where the machine has
//! it, else the model (an estimate, flagged in summary.json), and the
//! processes whose power is an app's.

use std::path::Path;

use qosd_core::PowerSource;
use qosd_sensors::power::{PowerConfig, PowerSensor};

/// The power sensor of a real replay: RAPL where the machine has it, else
/// the model (every figure an estimate, flagged in summary.json). A sample
/// that fails makes the run keep no power figure (see
/// `ReplayNode::power_failed`).
pub struct RunPower {
    sensor: PowerSensor,
}

impl RunPower {
    /// `None` (said on stderr) where the sensor cannot run, e.g. not root:
    /// the power column stays empty and energy_j null.
    pub fn start() -> Option<RunPower> {
        match PowerSensor::open(&PowerConfig::default(), Path::new("/")) {
            Ok(sensor) => {
                let c = sensor.caps();
                eprintln!(
                    "power: {} ({}), threads weighed by {}",
                    c.backend,
                    if c.source == PowerSource::Model {
                        "an ESTIMATE from utilisation, no RAPL here"
                    } else {
                        "measured"
                    },
                    c.weight
                );
                Some(RunPower { sensor })
            }
            Err(e) => {
                eprintln!("power: not available ({e}); no power_w, energy_j null");
                None
            }
        }
    }

    pub fn is_estimate(&self) -> bool {
        self.sensor.caps().source == PowerSource::Model
    }

    /// The sensor, for the node's sensing layer.
    pub fn into_sensor(self) -> PowerSensor {
        self.sensor
    }
}
