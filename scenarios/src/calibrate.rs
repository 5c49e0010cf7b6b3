//! Calibration: an app's load–latency curve, its capacity (the throughput at
//! which it saturates) and its knee (where latency leaves the flat part).
//! Scenario loads are fractions of the capacity and targets may sit at the
//! knee, so a scenario means the same thing on any machine. The curve comes
//! from the simulated model (`--sim`) or from a sweep with the load
//! generator against the real server ([`crate::real`]).

use std::collections::BTreeMap;
use std::path::Path;

use qosd_core::slo::{GapModel, GapPoint, SloSide};
use qosd_core::Share;
use serde::{Deserialize, Serialize};

use crate::scenario::{AppSpec, Scenario};
use crate::sim::model::{percentile, Queue, Sample, SimModel};

mod capacity;
pub mod check;
mod floor;
pub(crate) mod knee;
#[cfg(test)]
pub(crate) mod recorded;
pub use capacity::{BusyRates, CapacityFit};
pub use check::{KneeCheck, DISAGREE_P, MAX_FIT_ERR_PCT, MAX_RETRIES};
pub use floor::{PeakFloor, FLOOR_WARN_SHARE};
pub use knee::{CurveFit, KneeSpread, PassFit, Passes};

/// One point of a load–latency curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub offered_rps: f64,
    pub achieved_rps: f64,
    /// Client-side latency at the target percentile, µs.
    pub latency_us: f64,
}

/// What calibration found for one app.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppCalibration {
    /// Highest throughput sustained, requests/s (load level 1.0): on a
    /// real sweep the server's completion rate while it had a backlog
    /// (`capacity_fit`), else the best rate of a step it kept up with.
    pub capacity_rps: f64,
    /// Load at the knee, requests/s.
    pub knee_rps: f64,
    /// Client-side latency at the knee, µs.
    pub knee_latency_us: f64,
    /// Server-side (eBPF) latency at the same knee load, µs, where the
    /// calibration measured it (for the record: an eBPF-fed policy's
    /// target is the client's less the gap below, not this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ebpf_knee_latency_us: Option<f64>,
    /// The client/server gap at the target's percentile over load
    /// (client − eBPF, µs, at each calibrated load where both were
    /// measured): an eBPF-fed policy's target is the client's target less
    /// the gap at the current load ([`qosd_core::slo`]). Empty: no eBPF
    /// figure (the client's target then stands for both).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gap: Vec<GapPoint>,
    /// Client-side latency at the lowest load, µs.
    pub base_latency_us: f64,
    /// Percentile the latencies are at.
    pub percentile: f64,
    /// How much the knee's latency moved over repeated steps at the knee
    /// load (a real calibration; absent for the sim and `--knee-repeats 0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub knee_spread: Option<KneeSpread>,
    /// The fitted curve the knee was put on (a real sweep; absent for the
    /// sim, `--knee steps`, or a curve that does not fit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub knee_fit: Option<CurveFit>,
    /// What the calibration checked of its fit (loads whose passes
    /// disagreed, measured once more; why a poor fit was taken anyway):
    /// absent when there was nothing to say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub knee_check: Option<KneeCheck>,
    /// How capacity was measured on a real sweep: the server's completion
    /// rate in the intervals it had a backlog (median, quartiles); absent
    /// for the sim, or where capacity was read off the steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_fit: Option<CapacityFit>,
    /// CPUs the server was confined to while calibrated on a real node (the
    /// most it can hold beside the other apps); absent for the sim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nr_cpus: Option<usize>,
    pub points: Vec<Point>,
}

/// Calibration of every app of a scenario.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Calibration {
    /// `sim` or `real (<host>, <n> CPUs)`.
    pub source: String,
    pub apps: BTreeMap<String, AppCalibration>,
}

impl Calibration {
    pub fn read(path: &Path) -> anyhow::Result<Calibration> {
        let text = qosd_core::yamlfile::read_kind(path, qosd_core::yamlfile::Kind::Calibration)?;
        Ok(serde_json::from_str(&text)?)
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)? + "\n")?;
        Ok(())
    }

    /// QoS target of an app in µs (fixed, or a multiple of its knee latency).
    pub fn target_us(&self, app: &AppSpec) -> Option<f64> {
        let t = app.target.as_ref()?;
        if let Some(ms) = t.ms {
            return Some(ms * 1000.0);
        }
        let c = self.apps.get(&app.name)?;
        Some(t.knee_factor.unwrap_or(1.0) * c.knee_latency_us)
    }

    /// The eBPF side of `app`'s SLO: its client target and the
    /// calibrated gap (none: the client's target stands for both until
    /// client samples refresh it). `None` for an app without a target.
    pub fn slo(&self, app: &AppSpec) -> Option<SloSide> {
        let model = self.apps.get(&app.name).and_then(|c| {
            let model = GapModel::fit(c.gap.clone())?;
            Some(model.on_cpus(c.nr_cpus.map(|n| n as f64)))
        });
        Some(SloSide::new(self.target_us(app)?, model))
    }

    /// Offered rps of an app at scenario time `t_s`.
    pub fn offered_rps(&self, app: &AppSpec, t_s: f64) -> f64 {
        self.apps
            .get(&app.name)
            .map_or(0.0, |c| app.load.level_at(t_s) * c.capacity_rps)
    }
}

/// Index of the knee of an increasing, convex latency curve (Kneedle):
/// with load and latency scaled to [0, 1], the point farthest below the
/// diagonal, where latency stops being flat.
pub fn knee(points: &[Point]) -> usize {
    if points.len() < 3 {
        return points.len().saturating_sub(1);
    }
    let (x0, x1) = (points[0].offered_rps, points[points.len() - 1].offered_rps);
    let ymin = points
        .iter()
        .map(|p| p.latency_us)
        .fold(f64::INFINITY, f64::min);
    let ymax = points.iter().map(|p| p.latency_us).fold(0.0, f64::max);
    let (dx, dy) = ((x1 - x0).max(1e-9), (ymax - ymin).max(1e-9));
    let mut best = (0, f64::MIN);
    for (i, p) in points.iter().enumerate() {
        let d = (p.offered_rps - x0) / dx - (p.latency_us - ymin) / dy;
        if d > best.1 {
            best = (i, d);
        }
    }
    best.0
}

/// Summarises a measured curve; `points` sorted by offered load.
pub fn from_points(points: Vec<Point>, percentile: f64) -> Option<AppCalibration> {
    // Capacity is the most the server *sustained*: a step it fell behind in
    // (tail latency exploding past SATURATED_FACTOR × the lowest, or under
    // 90 % of the offered rate) still "achieves" its offered rate when the
    // backlog drains afterwards, so it does not count.
    let lowest = points
        .iter()
        .map(|p| p.latency_us)
        .fold(f64::INFINITY, f64::min);
    let sustained = |p: &&Point| {
        p.latency_us <= SATURATED_FACTOR * lowest && p.achieved_rps >= 0.9 * p.offered_rps
    };
    let capacity = points
        .iter()
        .filter(sustained)
        .map(|p| p.achieved_rps)
        .fold(0.0, f64::max);
    let capacity = if capacity > 0.0 {
        capacity
    } else {
        points.iter().map(|p| p.achieved_rps).fold(0.0, f64::max)
    };
    let curve = monotone_curve(&points);
    let base = curve.first()?.latency_us;
    // Kneedle normalises latency by its maximum, so on a curve that rises
    // gently before it explodes it finds the explosion; the flat part also
    // ends where latency first exceeds KNEE_FLAT_FACTOR × the base. The knee
    // is the earlier of the two.
    let flat_end = curve
        .iter()
        .position(|p| p.latency_us > KNEE_FLAT_FACTOR * base)
        .map_or(curve.len() - 1, |i| i.saturating_sub(1));
    let k = curve[knee(&curve).min(flat_end)];
    Some(AppCalibration {
        capacity_rps: capacity,
        knee_rps: k.offered_rps,
        knee_latency_us: k.latency_us,
        ebpf_knee_latency_us: None,
        gap: Vec::new(),
        base_latency_us: base,
        percentile,
        knee_spread: None,
        knee_fit: None,
        knee_check: None,
        capacity_fit: None,
        nr_cpus: None,
        points,
    })
}

/// The curve the knee is looked for on: the points the app still kept up
/// with (all of them if fewer than 3), made monotone (each point takes the
/// lowest latency seen at its load or above: latency can only grow with
/// load, so noise at light load, a descheduled server, is not a knee).
fn monotone_curve(points: &[Point]) -> Vec<Point> {
    let kept: Vec<Point> = points
        .iter()
        .copied()
        .filter(|p| p.achieved_rps >= 0.95 * p.offered_rps)
        .collect();
    let mut curve = if kept.len() >= 3 {
        kept
    } else {
        points.to_vec()
    };
    let mut low = f64::INFINITY;
    for p in curve.iter_mut().rev() {
        low = low.min(p.latency_us);
        p.latency_us = low;
    }
    curve
}

/// The knee load of a measured curve (sorted by load) given a base
/// latency measured on its own (µs): where the monotone curve crosses
/// KNEE_FLAT_FACTOR × `base_us`, interpolated linearly between the two
/// steps around the crossing, or Kneedle's point if that comes first.
/// Interpolating makes the knee move smoothly with the curve instead of
/// jumping from one step of the sweep's grid (1.4× apart) to the next.
pub fn knee_load(points: &[Point], base_us: f64) -> Option<f64> {
    let curve = monotone_curve(points);
    let kneedle = curve.get(knee(&curve))?.offered_rps;
    let limit = KNEE_FLAT_FACTOR * base_us;
    let crossing = match curve.iter().position(|p| p.latency_us > limit) {
        None => curve.last()?.offered_rps,
        Some(0) => curve[0].offered_rps,
        Some(i) => {
            let (a, b) = (curve[i - 1], curve[i]);
            let f =
                ((limit - a.latency_us) / (b.latency_us - a.latency_us).max(1e-9)).clamp(0.0, 1.0);
            a.offered_rps + f * (b.offered_rps - a.offered_rps)
        }
    };
    Some(kneedle.min(crossing))
}

/// Steps at up to this fraction of capacity are pooled for the base
/// latency (the flat part of the curve).
pub const BASE_LOAD: f64 = 0.3;

/// A sweep step whose tail latency is this multiple of the lowest seen is
/// saturated (the sweep stops there; capacity is below it).
pub const SATURATED_FACTOR: f64 = 50.0;

/// The flat part of a load–latency curve ends where latency first exceeds
/// this multiple of its value at the lightest load.
pub const KNEE_FLAT_FACTOR: f64 = 2.0;

/// The allocation an app gets when it has the whole simulated node.
pub fn whole_node(node: &crate::scenario::SimNode) -> Share {
    Share {
        nr_cores: node.nr_cores,
        nr_ways: node.nr_ways,
        freq_mhz: node.freq_max_mhz,
        ..Share::default()
    }
}

/// Calibrates every app of a scenario on the simulated node: the model's
/// curve with the whole node, steady state, no noise.
pub fn sim(sc: &Scenario) -> Calibration {
    let mut apps = BTreeMap::new();
    let all = whole_node(&sc.node);
    // A batch job takes no load: nothing to calibrate.
    for app in sc.apps.iter().filter(|a| a.job.is_none()) {
        let m = SimModel::of(app);
        let cap = m.capacity_rps(&all, &sc.node);
        let s_us = m.service_time_us(&all, &sc.node);
        let pct = app.target.as_ref().map_or(99.0, |t| t.percentile);
        // The steady-state sample at load `x` (fraction of capacity).
        let at = |x: f64| {
            let q = Queue::new(
                m.servers(&all, &sc.node),
                s_us,
                m.service_cv,
                x * cap * 1e-6,
            );
            let net = network_queue_ms(&m, x) * 1000.0 + m.network_ms * 1000.0;
            Sample {
                queue: q,
                throttle: None,
                shift_us: m.fixed_us,
                network_us: net,
                noise: 1.0,
                weight: 1.0,
            }
        };
        let points: Vec<Point> = (1..=98)
            .map(|i| {
                let x = i as f64 / 100.0;
                Point {
                    offered_rps: x * cap,
                    achieved_rps: x * cap,
                    latency_us: percentile(&[at(x)], pct, true).unwrap_or(0.0),
                }
            })
            .collect();
        if let Some(c) = from_points(points, pct) {
            let ebpf = percentile(&[at(c.knee_rps / cap)], pct, false);
            // The client/server gap over the load range, as a real
            // calibration measures it: both percentiles at each load.
            let gap = (1..=20)
                .filter_map(|i| {
                    let x = i as f64 * 0.05;
                    let s = at(x.min(0.98));
                    let d = percentile(&[s], pct, true)? - percentile(&[s], pct, false)?;
                    Some(GapPoint {
                        rps: x.min(0.98) * cap,
                        gap_us: d,
                    })
                })
                .collect();
            apps.insert(
                app.name.clone(),
                AppCalibration {
                    capacity_rps: cap,
                    ebpf_knee_latency_us: ebpf,
                    gap,
                    ..c
                },
            );
        }
    }
    Calibration {
        source: "sim".into(),
        apps,
    }
}

/// The load the network term follows (see [`network_queue_ms`]): `rps`
/// over what the app serves holding the whole node. The fit (at whatever
/// allocation a step ran), the simulated node and the oracle (whatever
/// capacity a real calibration measured, on fewer CPUs) all take it so,
/// so a fitted `network_ms` means the same thing in each: with the
/// calibrated capacity instead, a calibration on 1 of 2 CPUs doubled the
/// sim's network queue at the demo's peak against the fit's.
pub fn network_load(m: &SimModel, rps: f64, node: &crate::scenario::SimNode) -> f64 {
    rps / m.capacity_rps(&whole_node(node), node).max(1e-9)
}

/// Steady-state network queueing delay at `load` (fraction of capacity),
/// ms: an M/M/1-like term that grows as the load nears the network's
/// capacity (`network_capacity_x` × the app's).
pub fn network_queue_ms(m: &SimModel, load: f64) -> f64 {
    let rho = (load / m.network_capacity_x.max(1e-9)).clamp(0.0, 0.95);
    m.network_ms * rho / (1.0 - rho)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knee_of_a_hockey_stick() {
        let pts: Vec<Point> = (0..20)
            .map(|i| {
                let x = i as f64 * 50.0;
                let y = if i < 14 {
                    1000.0 + i as f64
                } else {
                    1000.0 + (i - 13) as f64 * 2000.0
                };
                Point {
                    offered_rps: x,
                    achieved_rps: x,
                    latency_us: y,
                }
            })
            .collect();
        assert_eq!(knee(&pts), 13);
        let c = from_points(pts, 99.0).unwrap();
        assert_eq!(c.knee_rps, 650.0);
        assert_eq!(c.capacity_rps, 950.0);
    }

    /// A noisy measured curve (as on a busy 2-CPU machine): a spike at the
    /// lightest load, a gentle rise, then saturation. The knee is where the
    /// rise starts, not at the saturation Kneedle alone would pick.
    #[test]
    fn knee_of_a_noisy_measured_curve() {
        let raw = [
            (94.0, 94.0, 44.4),
            (131.0, 131.0, 32.6),
            (183.0, 183.0, 25.5),
            (262.0, 262.0, 17.6),
            (377.0, 377.0, 36.8),
            (538.0, 538.0, 128.2),
            (768.0, 768.0, 186.1),
            (851.0, 804.0, 1025.5),
            (910.0, 910.0, 280.0),
            (1030.0, 1030.0, 265.8),
            (1072.0, 721.0, 1304.4),
        ];
        let pts = raw
            .iter()
            .map(|&(o, a, l)| Point {
                offered_rps: o,
                achieved_rps: a,
                latency_us: l * 1000.0,
            })
            .collect();
        let c = from_points(pts, 99.0).unwrap();
        assert_eq!(c.capacity_rps, 1030.0);
        assert_eq!(c.knee_rps, 262.0);
        assert!(
            (c.base_latency_us - 17_600.0).abs() < 1.0
                && (c.knee_latency_us - 17_600.0).abs() < 1.0
        );
    }

    /// The step that overloaded the server drained its backlog afterwards,
    /// so it "achieved" its offered rate with a p99 of a second: it is not
    /// capacity; the fastest step the server kept up with is.
    #[test]
    fn a_step_that_drained_a_backlog_is_not_capacity() {
        let pts = [(100.0, 3.9), (500.0, 7.5), (750.0, 20.9), (1030.0, 1145.0)]
            .iter()
            .map(|&(r, ms)| Point {
                offered_rps: r,
                achieved_rps: r,
                latency_us: ms * 1000.0,
            })
            .collect();
        let c = from_points(pts, 99.0).unwrap();
        assert_eq!(c.capacity_rps, 750.0);
    }

    /// The knee load moves smoothly with the base instead of jumping from
    /// one step of the grid to the next: interpolated at 2 × base.
    #[test]
    fn knee_load_is_interpolated_between_steps() {
        let pts: Vec<Point> = [
            (100.0, 4.0),
            (140.0, 4.2),
            (196.0, 5.0),
            (274.0, 9.0),
            (384.0, 60.0),
        ]
        .iter()
        .map(|&(r, ms)| Point {
            offered_rps: r,
            achieved_rps: r,
            latency_us: ms * 1000.0,
        })
        .collect();
        // 2 × 4 ms = 8 ms lies 3/4 of the way from 5 ms (196) to 9 ms (274).
        let k = knee_load(&pts, 4000.0).unwrap();
        assert!((k - (196.0 + 0.75 * 78.0)).abs() < 1e-6, "{k}");
        // A slightly higher base moves it a little, not a whole step.
        let k2 = knee_load(&pts, 4200.0).unwrap();
        assert!(k2 > k && k2 < 274.0, "{k2}");
        // No crossing: Kneedle's point (the step before the explosion).
        assert_eq!(knee_load(&pts, 40_000.0), Some(274.0));
    }
}
