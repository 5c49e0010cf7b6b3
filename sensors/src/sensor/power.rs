//! The power sensor as a plugin: node power (RAPL, or the model's
//! estimate) and each target's share of it, over the decision interval
//! (sampled on decision ticks only: RAPL's ~1 ms granularity and the
//! sched program's table read want intervals of about a second).

use qosd_core::control::Tick;

use super::{Measurements, Quantity, Sensor, Target};
use crate::power::PowerSensor;

impl Sensor for PowerSensor {
    fn name(&self) -> &str {
        "power"
    }

    fn measures(&self) -> &'static [Quantity] {
        &[Quantity::Power]
    }

    fn decision_ticks_only(&self) -> bool {
        true
    }

    fn sample(&mut self, _tick: &Tick, targets: &[Target<'_>]) -> anyhow::Result<Measurements> {
        let s = PowerSensor::sample(self)?;
        let mut m = Measurements::empty(targets.len());
        m.node_power_w = Some(s.node.total_w);
        for (r, t) in m.apps.iter_mut().zip(targets) {
            if t.pids.is_empty() {
                continue;
            }
            let tgids: Vec<u32> = t.pids.iter().map(|&p| p as u32).collect();
            r.power = Some(s.app(&tgids, None));
        }
        Ok(m)
    }
}
