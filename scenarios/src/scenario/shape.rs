//! Load shapes over time, as fractions of an app's calibrated capacity:
//! constant, ramp (up, hold, back down), steps, diurnal, spike, CSV trace.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// One step of a `steps` load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Time the step starts, seconds from the start of the scenario.
    pub at_s: f64,
    /// Load from then on, fraction of capacity.
    pub level: f64,
}

/// Offered load of one app over time. Every `level`, `from`, `to`, `min`,
/// `max`, `base`, `peak` is a fraction of the app's capacity (1.0 = the
/// throughput at which it saturates on the whole node).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Shape {
    /// The same load all along.
    Constant { level: f64 },
    /// `from` until `start_s`, linearly to `to` over `over_s`, held for
    /// `hold_s`, then back to `from` over `back_s` (no way back if absent).
    Ramp {
        from: f64,
        to: f64,
        #[serde(default)]
        start_s: f64,
        over_s: f64,
        #[serde(default)]
        hold_s: f64,
        #[serde(default)]
        back_s: Option<f64>,
    },
    /// Piecewise constant: each step's level from its `at_s` on (0 before
    /// the first step).
    Steps { steps: Vec<Step> },
    /// A day compressed into `period_s`: a sine between `min` and `max`,
    /// at `min` at t = `phase_s`.
    Diurnal {
        min: f64,
        max: f64,
        period_s: f64,
        #[serde(default)]
        phase_s: f64,
    },
    /// `base`, rising linearly to `peak` over `rise_s` from `at_s`, held for
    /// `width_s`, and falling back over `rise_s`.
    Spike {
        base: f64,
        peak: f64,
        at_s: f64,
        width_s: f64,
        #[serde(default = "default_rise_s")]
        rise_s: f64,
    },
    /// A CSV file of `t_s,level` rows (a header line is allowed), linearly
    /// interpolated; relative paths are relative to the scenario file.
    Trace {
        file: String,
        #[serde(skip)]
        points: Vec<(f64, f64)>,
    },
}

fn default_rise_s() -> f64 {
    1.0
}

fn lerp(a: f64, b: f64, x: f64) -> f64 {
    if x >= 1.0 {
        return b; // exact at the end of a segment
    }
    a + (b - a) * x.max(0.0)
}

impl Shape {
    /// Load at `t_s` seconds, fraction of capacity (never negative).
    pub fn level_at(&self, t: f64) -> f64 {
        let v = match self {
            Shape::Constant { level } => *level,
            Shape::Ramp {
                from,
                to,
                start_s,
                over_s,
                hold_s,
                back_s,
            } => {
                let t1 = start_s + over_s;
                let t2 = t1 + hold_s;
                if t < *start_s {
                    *from
                } else if t < t1 {
                    lerp(*from, *to, (t - start_s) / over_s.max(1e-9))
                } else if t < t2 {
                    *to
                } else {
                    match back_s {
                        Some(b) => lerp(*to, *from, (t - t2) / b.max(1e-9)),
                        None => *to,
                    }
                }
            }
            Shape::Steps { steps } => steps
                .iter()
                .take_while(|s| s.at_s <= t)
                .last()
                .map_or(0.0, |s| s.level),
            Shape::Diurnal {
                min,
                max,
                period_s,
                phase_s,
            } => {
                let x = (t - phase_s) / period_s.max(1e-9) * std::f64::consts::TAU;
                min + (max - min) * (1.0 - x.cos()) / 2.0
            }
            Shape::Spike {
                base,
                peak,
                at_s,
                width_s,
                rise_s,
            } => {
                let r = rise_s.max(1e-9);
                if t < *at_s {
                    *base
                } else if t < at_s + r {
                    lerp(*base, *peak, (t - at_s) / r)
                } else if t < at_s + r + width_s {
                    *peak
                } else {
                    lerp(*peak, *base, (t - at_s - r - width_s) / r)
                }
            }
            Shape::Trace { points, .. } => interpolate(points, t),
        };
        v.max(0.0)
    }

    /// The highest level the shape reaches (for validation and plots).
    pub fn peak(&self) -> f64 {
        match self {
            Shape::Constant { level } => *level,
            Shape::Ramp { from, to, .. } => from.max(*to),
            Shape::Steps { steps } => steps.iter().map(|s| s.level).fold(0.0, f64::max),
            Shape::Diurnal { max, .. } => *max,
            Shape::Spike { base, peak, .. } => base.max(*peak),
            Shape::Trace { points, .. } => points.iter().map(|p| p.1).fold(0.0, f64::max),
        }
    }

    /// Reads the CSV of a `trace` shape (relative to `dir`).
    pub fn load_trace(&mut self, dir: &Path) -> Result<(), String> {
        let Shape::Trace { file, points } = self else {
            return Ok(());
        };
        let path = dir.join(&*file);
        let text = qosd_core::yamlfile::read_kind(&path, qosd_core::yamlfile::Kind::Trace)
            .map_err(|e| format!("trace {e}"))?;
        *points = parse_trace(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(())
    }
}

/// Parses `t_s,level` rows; the first line may be a header.
pub fn parse_trace(text: &str) -> Result<Vec<(f64, f64)>, String> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut f = line.split(',').map(str::trim);
        let (a, b) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
        match (a.parse::<f64>(), b.parse::<f64>()) {
            (Ok(t), Ok(l)) => {
                if !t.is_finite() || t < 0.0 || !l.is_finite() || l < 0.0 {
                    return Err(format!(
                        "line {}: need a finite time >= 0 and a level >= 0",
                        i + 1
                    ));
                }
                if out.last().is_some_and(|p| p.0 >= t) {
                    return Err(format!("line {}: times must increase", i + 1));
                }
                out.push((t, l));
            }
            _ if out.is_empty() && i == 0 => {} // header
            _ => return Err(format!("line {}: expected `t_s,level`", i + 1)),
        }
    }
    if out.is_empty() {
        return Err("no rows".into());
    }
    Ok(out)
}

fn interpolate(points: &[(f64, f64)], t: f64) -> f64 {
    let Some(first) = points.first() else {
        return 0.0;
    };
    if t <= first.0 {
        return first.1;
    }
    match points.windows(2).find(|w| t < w[1].0) {
        Some(w) => lerp(w[0].1, w[1].1, (t - w[0].0) / (w[1].0 - w[0].0)),
        None => points.last().map_or(0.0, |p| p.1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ramp_up_hold_back() {
        let s = Shape::Ramp {
            from: 0.07,
            to: 1.0,
            start_s: 10.0,
            over_s: 100.0,
            hold_s: 10.0,
            back_s: Some(100.0),
        };
        assert_eq!(s.level_at(0.0), 0.07);
        assert!((s.level_at(60.0) - 0.535).abs() < 1e-9);
        assert_eq!(s.level_at(115.0), 1.0);
        assert!((s.level_at(170.0) - 0.535).abs() < 1e-9);
        assert!((s.level_at(500.0) - 0.07).abs() < 1e-12);
    }

    #[test]
    fn steps_diurnal_spike_trace() {
        let s = Shape::Steps {
            steps: vec![
                Step {
                    at_s: 5.0,
                    level: 0.3,
                },
                Step {
                    at_s: 10.0,
                    level: 0.6,
                },
            ],
        };
        assert_eq!(
            (s.level_at(1.0), s.level_at(5.0), s.level_at(99.0)),
            (0.0, 0.3, 0.6)
        );
        let d = Shape::Diurnal {
            min: 0.1,
            max: 0.9,
            period_s: 100.0,
            phase_s: 0.0,
        };
        assert!((d.level_at(0.0) - 0.1).abs() < 1e-9 && (d.level_at(50.0) - 0.9).abs() < 1e-9);
        let p = Shape::Spike {
            base: 0.2,
            peak: 0.8,
            at_s: 10.0,
            width_s: 5.0,
            rise_s: 1.0,
        };
        assert_eq!(
            (p.level_at(9.0), p.level_at(12.0), p.level_at(30.0)),
            (0.2, 0.8, 0.2)
        );
        let pts = parse_trace("t_s,level\n0,0.1\n10,0.5\n").unwrap();
        let t = Shape::Trace {
            file: String::new(),
            points: pts,
        };
        assert!((t.level_at(5.0) - 0.3).abs() < 1e-9);
        assert!(parse_trace("0,1\n0,2\n").is_err());
    }
}
