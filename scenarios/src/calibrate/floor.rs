//! What a calibration says no policy can beat: an LC app's client p99 at
//! its scenario's peak load with every CPU of the node, read off its own
//! calibrated curve. Where that is near the target, the peak's per-interval
//! p99s cross the target often whatever the policy does (the app alone
//! sits there: `scenarios/bench/peak.sh`, docs/sharing.md), so a replay
//! says so before it starts instead of leaving it to the bands table.

use super::{AppCalibration, Calibration};
use crate::scenario::AppSpec;

/// The curve's latency at the peak, as a share of the target, from which a
/// replay warns: per-interval p99s of a few hundred requests spread by tens
/// of % around the true p99, so above this share many intervals violate.
pub const FLOOR_WARN_SHARE: f64 = 0.8;

/// An LC app's peak load, the latency its curve gives there on every CPU,
/// and its target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeakFloor {
    /// The scenario's highest offered rate, requests/s.
    pub rps: f64,
    /// The curve's latency there, µs; `None`: past the highest load the
    /// calibration measured (past capacity, even on every CPU).
    pub latency_us: Option<f64>,
    pub target_us: f64,
}

impl PeakFloor {
    /// The latency as a share of the target (infinite past the curve).
    pub fn share(&self) -> f64 {
        self.latency_us
            .map_or(f64::INFINITY, |l| l / self.target_us)
    }
}

impl AppCalibration {
    /// The client latency (µs, at the calibrated percentile) the curve
    /// predicts for `rps` spread over `cpus` CPUs. The curve was measured
    /// with the server on `nr_cpus` CPUs, so it is read at the same load
    /// per CPU, `rps × nr_cpus / cpus` (as the gap curve is read:
    /// `qosd_core::slo::Load`), interpolated between the steps around it;
    /// below the lowest step, that step's latency. `None`: no `nr_cpus`
    /// (the sim's calibration, whose model needs no curve), or past the
    /// highest step.
    pub fn latency_on(&self, rps: f64, cpus: f64) -> Option<f64> {
        let per = rps * self.nr_cpus? as f64 / cpus.max(1e-9);
        let mut pts: Vec<(f64, f64)> = self
            .points
            .iter()
            .map(|p| (p.offered_rps, p.latency_us))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let first = *pts.first()?;
        if per <= first.0 {
            return Some(first.1);
        }
        pts.windows(2).find_map(|w| {
            let ((x0, y0), (x1, y1)) = (w[0], w[1]);
            (per <= x1).then(|| y0 + (y1 - y0) * (per - x0) / (x1 - x0).max(1e-9))
        })
    }
}

impl Calibration {
    /// `app`'s floor at its scenario's peak load on `cpus` CPUs (every CPU
    /// of the node: the most any policy can give it). `None` for an app
    /// without a target, a batch job, or an app not calibrated.
    pub fn peak_floor(&self, app: &AppSpec, cpus: f64) -> Option<PeakFloor> {
        if app.job.is_some() {
            return None;
        }
        let target_us = self.target_us(app)?;
        let c = self.apps.get(&app.name)?;
        c.nr_cpus?;
        let rps = app.load.peak() * c.capacity_rps;
        Some(PeakFloor {
            rps,
            latency_us: c.latency_on(rps, cpus),
            target_us,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::Point;
    use super::*;

    /// The curve `make demo` calibrated (search on 1 CPU, quiet machine).
    fn demo() -> AppCalibration {
        let pts = [
            (95.0, 2564.0),
            (135.0, 3400.0),
            (192.5, 3187.0),
            (274.5, 3727.0),
            (393.0, 5652.0),
            (547.0, 7389.0),
            (754.0, 13402.0),
            (969.5, 59900.0),
            (1031.0, 169345.0),
        ];
        AppCalibration {
            capacity_rps: 969.5,
            knee_rps: 274.5,
            knee_latency_us: 3727.0,
            ebpf_knee_latency_us: None,
            gap: Vec::new(),
            base_latency_us: 2564.0,
            percentile: 99.0,
            knee_spread: None,
            knee_fit: None,
            knee_check: None,
            capacity_fit: None,
            nr_cpus: Some(1),
            points: pts
                .iter()
                .map(|&(r, l)| Point {
                    offered_rps: r,
                    achieved_rps: r,
                    latency_us: l,
                })
                .collect(),
        }
    }

    #[test]
    fn the_curve_is_read_at_the_same_load_per_cpu() {
        let c = demo();
        // 970 req/s on 2 CPUs is 485 per CPU: between the 393 and 547 steps.
        let on2 = c.latency_on(970.0, 2.0).unwrap();
        let want = 5652.0 + (7389.0 - 5652.0) * (485.0 - 393.0) / (547.0 - 393.0);
        assert!((on2 - want).abs() < 1.0, "{on2} vs {want}");
        // On the 1 CPU it was measured on: the 969.5 step itself.
        assert!((c.latency_on(969.5, 1.0).unwrap() - 59900.0).abs() < 1e-6);
        // Below the lowest step: that step; past the highest: unknown.
        assert_eq!(c.latency_on(10.0, 1.0), Some(2564.0));
        assert_eq!(c.latency_on(2000.0, 1.0), None);
        // The sim's calibration has no curve to read.
        let sim = AppCalibration {
            nr_cpus: None,
            ..demo()
        };
        assert_eq!(sim.latency_on(970.0, 2.0), None);
    }

    #[test]
    fn the_demo_peak_sits_at_its_target() {
        let sc = crate::scenario::Scenario::from_file(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/demo.yaml"
        )))
        .unwrap();
        let mut cal = Calibration {
            source: "real (test)".into(),
            apps: Default::default(),
        };
        cal.apps.insert("search".into(), demo());
        let search = sc.apps.iter().find(|a| a.name == "search").unwrap();
        let f = cal.peak_floor(search, 2.0).unwrap();
        assert!((f.rps - 969.5).abs() < 1e-6);
        // Target 2 × 3.727 ms; the curve gives ~6.7 ms at the peak on 2
        // CPUs: 90 % of it, above the warning share.
        assert!((f.target_us - 7454.0).abs() < 1.0);
        assert!(f.share() > FLOOR_WARN_SHARE && f.share() < 1.0, "{f:?}");
        // The batch job has no floor.
        let batch = sc.apps.iter().find(|a| a.job.is_some()).unwrap();
        assert_eq!(cal.peak_floor(batch, 2.0), None);
        // On 4 CPUs the same peak is far below the target.
        assert!(cal.peak_floor(search, 4.0).unwrap().share() < 0.5);
    }
}
