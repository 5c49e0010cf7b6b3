//! A knee that repeats. A real sweep's steps each give a p99 that rests
//! on a few requests and on what else the machine ran at that moment, so a
//! knee read off single steps (the first step past 2 × the lightest one)
//! moves with the luckiest and unluckiest step. Here the whole curve is
//! fitted as a queue (`base + growth · x / (pole − x)`) over every step the
//! server kept up with, and the knee is where the fitted curve's power
//! `x / latency(x)` peaks. Also: [`KneeSpread`], repeated steps at the knee.

use qosd_sensors::stats::LogHistogram;
use serde::{Deserialize, Serialize};

use super::{AppCalibration, Point};

/// A step the fit leaves out: the server fell behind (achieved below this
/// share of the offered rate) ...
const KEPT_SHARE: f64 = 0.95;
/// ... or it ran above this share of the pole: near the pole a step of a
/// few seconds never reaches its steady state, its p99 is the most
/// variable of all, and x / (pole − x) turns the pole's own uncertainty
/// (capacity is read off a grid of steps) into a large error, so one such
/// step would decide the fit.
const FIT_MAX_LOAD: f64 = 0.8;
/// Huber's constant (in robust standard deviations): steps further from
/// the fit than this are down-weighted, so one stalled step (another
/// process took the CPU) cannot drag the curve.
const HUBER_K: f64 = 1.5;

/// The load–latency curve of a real sweep, fitted:
/// `latency(x) = base_us + growth_us · x / (pole_rps − x)` (an M/M/1-like
/// wait, growing as ρ / (1 − ρ), over a floor: service time, network,
/// the machine's wake-up delays).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CurveFit {
    /// The floor, µs: the fitted latency at no load.
    pub base_us: f64,
    /// The queueing part's scale, µs (latency at half the pole is
    /// `base_us + growth_us`).
    pub growth_us: f64,
    /// The load at which latency grows without bound (the calibrated
    /// capacity), rps.
    pub pole_rps: f64,
    /// Steps the fit used and the requests behind them.
    pub nr_steps: usize,
    pub samples: u64,
    /// Median |fit − step| / step over those steps, %: how well the shape
    /// holds on this server.
    pub median_err_pct: f64,
    /// The knee latency's standard error, µs, from the steps' sampling
    /// errors alone (a fit weighted by each step's [`precision`]; none for
    /// a fit weighted by request counts, whose weights are no variances).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub knee_se_us: Option<f64>,
}

impl CurveFit {
    /// The fitted latency at `rps` (µs; infinite at or past the pole).
    pub fn latency_us(&self, rps: f64) -> f64 {
        if rps >= self.pole_rps {
            return f64::INFINITY;
        }
        self.base_us + self.growth_us * rps / (self.pole_rps - rps)
    }

    /// The knee, (rps, µs): where throughput per unit of latency,
    /// x / latency(x), is highest (Kleinrock's optimal operating point:
    /// the tangent to the curve from the origin). For this curve it is at
    /// x = pole · √base / (√base + √growth), latency base + √(base · growth).
    /// A noisy floor moves it by the square root of its error, and the
    /// growth part, measured at loads where many requests queue, is the
    /// steadier of the two.
    pub fn knee(&self) -> (f64, f64) {
        let (a, b) = (self.base_us.sqrt(), self.growth_us.sqrt());
        (self.pole_rps * a / (a + b), self.base_us + a * b)
    }

    /// Whether the fit uses a step: the server kept up with it, and it ran
    /// at most FIT_MAX_LOAD × `pole_rps`.
    pub fn fits(p: &Point, pole_rps: f64) -> bool {
        p.achieved_rps >= KEPT_SHARE * p.offered_rps && p.offered_rps <= FIT_MAX_LOAD * pole_rps
    }

    /// Fits the curve to `steps` (each step's point and how many requests
    /// it measured), each step weighted by its request count: for steps
    /// without their latencies (the single-pass `fit_knee`). Where the
    /// latencies are at hand [`PassFit`] weights each step by its
    /// percentile's precision instead ([`precision`]).
    pub fn of(steps: &[(Point, u64)], pole_rps: f64) -> Option<CurveFit> {
        let w: Vec<(Point, u64, f64)> = steps.iter().map(|&(p, n)| (p, n, n as f64)).collect();
        let f = Self::of_weighted(&w, pole_rps)?;
        Some(CurveFit {
            knee_se_us: None,
            ..f
        })
    }

    /// Fits the curve to `steps` (each step's point, its request count and
    /// its weight) up to FIT_MAX_LOAD × `pole_rps`: weighted least squares
    /// made robust by Huber's weights. `None` with fewer than 3 usable
    /// steps, or a fit without a floor or without growth (no knee on such a
    /// curve).
    pub fn of_weighted(steps: &[(Point, u64, f64)], pole_rps: f64) -> Option<CurveFit> {
        let kept: Vec<&(Point, u64, f64)> = steps
            .iter()
            .filter(|(p, n, w)| {
                *n > 0 && *w > 0.0 && p.latency_us.is_finite() && Self::fits(p, pole_rps)
            })
            .collect();
        let used: Vec<(f64, f64, f64)> = kept
            .iter()
            .map(|(p, _, w)| (p.offered_rps / (pole_rps - p.offered_rps), p.latency_us, *w))
            .collect();
        let samples = kept.iter().map(|s| s.1).sum();
        if used.len() < 3 {
            return None;
        }
        let mut w: Vec<f64> = used.iter().map(|u| u.2).collect();
        let mut ab = (0.0, 0.0);
        for _ in 0..50 {
            ab = weighted_line(&used, &w)?;
            let res: Vec<f64> = used.iter().map(|u| u.1 - ab.0 - ab.1 * u.0).collect();
            let scale = 1.4826 * median(res.iter().map(|r| r.abs()).collect());
            if scale <= 0.0 {
                break;
            }
            let next: Vec<f64> = used
                .iter()
                .zip(&res)
                .map(|(u, r)| u.2 * (HUBER_K * scale / r.abs().max(1e-12)).min(1.0))
                .collect();
            let moved = next.iter().zip(&w).any(|(a, b)| (a - b).abs() > 1e-9 * b);
            w = next;
            if !moved {
                break;
            }
        }
        let (base_us, growth_us) = ab;
        if !(base_us > 0.0 && growth_us > 0.0) {
            return None;
        }
        let errs = used
            .iter()
            .map(|u| 100.0 * (base_us + growth_us * u.0 - u.1).abs() / u.1.max(1e-9))
            .collect();
        Some(CurveFit {
            base_us,
            growth_us,
            pole_rps,
            nr_steps: used.len(),
            samples,
            median_err_pct: median(errs),
            knee_se_us: knee_se(&used, base_us, growth_us),
        })
    }
}

/// The standard error of the knee latency `base + √(base · growth)` of a
/// line fitted through `used` (x, y, weight) whose weights are the inverse
/// variances of the y: the line's covariance (XᵀWX)⁻¹, carried to the
/// knee by its gradient. `None` when the x are all alike.
fn knee_se(used: &[(f64, f64, f64)], base: f64, growth: f64) -> Option<f64> {
    let (mut s0, mut s1, mut s2) = (0.0, 0.0, 0.0);
    for &(x, _, w) in used {
        (s0, s1, s2) = (s0 + w, s1 + w * x, s2 + w * x * x);
    }
    let det = s0 * s2 - s1 * s1;
    (det > 0.0).then_some(())?;
    let (var_b, var_g, cov) = (s2 / det, s0 / det, -s1 / det);
    let db = 1.0 + 0.5 * (growth / base).sqrt();
    let dg = 0.5 * (base / growth).sqrt();
    let var = db * db * var_b + dg * dg * var_g + 2.0 * db * dg * cov;
    Some(var.max(0.0).sqrt())
}

/// One load of a real sweep measured in one or more passes: each pass's
/// point and the latencies (ns) it measured.
pub type Passes = Vec<(Point, LogHistogram)>;

/// The fit over steps measured in several passes, and each pass's knee.
#[derive(Debug, Clone, PartialEq)]
pub struct PassFit {
    /// The curve over every pass's requests, each load's pooled.
    pub fit: CurveFit,
    /// The knee latency of each pass fitted alone, µs (passes whose steps
    /// do not fit are left out).
    pub knees_us: Vec<f64>,
}

impl PassFit {
    /// Fits the curve to `steps` (each load with its passes, in order),
    /// percentile `pct`: a load's requests are pooled over its passes and
    /// its percentile read off the pool, so a p99 rests on every pass's
    /// requests (a load measured once keeps its own point), and weighted by
    /// its precision ([`precision`]); and each pass is fitted alone, for
    /// the spread. `None` where the pool does not fit.
    pub fn of(steps: &[Passes], pct: f64, pole_rps: f64) -> Option<PassFit> {
        let weighted = |s: &[(Point, LogHistogram)]| {
            let (p, n) = pool(s, pct)?;
            Some((p, n, precision(&merged(s), pct)?))
        };
        let pooled: Vec<(Point, u64, f64)> = steps.iter().filter_map(|s| weighted(s)).collect();
        let fit = CurveFit::of_weighted(&pooled, pole_rps)?;
        let nr_passes = steps.iter().map(Vec::len).max().unwrap_or(0);
        let knees_us = (0..nr_passes)
            .filter_map(|i| {
                let pass: Vec<(Point, u64, f64)> = steps
                    .iter()
                    .filter_map(|s| weighted(std::slice::from_ref(s.get(i)?)))
                    .collect();
                Some(CurveFit::of_weighted(&pass, pole_rps)?.knee().1)
            })
            .collect();
        Some(PassFit { fit, knees_us })
    }
}

/// The smallest relative standard error a step's percentile is given.
/// Two passes of a load on the same arrivals, quiet, differ by a median
/// 4–6 % at the light loads (`passes_s9.txt`, `passes_s10.txt`): the
/// machine moves a p99 by ~3 % whatever its tail says, and a tail squeezed
/// into a few histogram buckets (the demo's 138 rps load: 5 requests
/// within 0.1 ms) would otherwise read as exact and take 80 % of the fit.
const MIN_REL_ERR: f64 = 0.03;

/// A step's weight in the fit: the inverse of its percentile's sampling
/// variance, 1/µs². A p99 rests on the `k` requests above it, and where
/// they lie matters as much as how many: above the percentile a tail is
/// near exponential, so its standard error is about the tail's scale over
/// √k, and that scale's estimate is the mean excess of those k over the
/// percentile (peaks over a threshold). Weighting by the request count
/// instead took a light load's p99 (5 requests above it within 0.3 ms, on
/// the demo) for a sixth of a heavy one's (30 within 3 ms), where it is as
/// precise or more. `None` for no requests.
pub fn precision(h: &LogHistogram, pct: f64) -> Option<f64> {
    let q = h.percentile(pct)?;
    let k = h.count_above(q).max(1);
    let excess = (1..=k)
        .map(|r| slowest(h, r).unwrap_or(q).saturating_sub(q) as f64)
        .sum::<f64>()
        / k as f64;
    let se_us = (excess / (k as f64).sqrt()).max(MIN_REL_ERR * q as f64) / 1e3;
    Some(1.0 / (se_us * se_us))
}

/// The `r`-th slowest latency of `h` (1: the slowest), ns: nearest rank
/// n − r + 1, within a bucket.
pub(crate) fn slowest(h: &LogHistogram, r: u64) -> Option<u64> {
    let n = h.len();
    (r >= 1 && r <= n).then_some(())?;
    h.percentile(100.0 * ((n - r) as f64 + 0.5) / n as f64)
}

/// Every latency of a load's passes in one histogram.
fn merged(passes: &[(Point, LogHistogram)]) -> LogHistogram {
    let mut all = LogHistogram::new();
    for (_, h) in passes {
        all.merge(h);
    }
    all
}

/// One load's passes as one step: mean offered and achieved rates, the
/// percentile of every request of every pass, and their count.
pub(crate) fn pool(passes: &[(Point, LogHistogram)], pct: f64) -> Option<(Point, u64)> {
    match passes {
        [] => None,
        [(p, h)] => Some((*p, h.len())),
        _ => {
            let all = merged(passes);
            let n = passes.len() as f64;
            let mean = |f: fn(&Point) -> f64| passes.iter().map(|(p, _)| f(p)).sum::<f64>() / n;
            let p = Point {
                offered_rps: mean(|p| p.offered_rps),
                achieved_rps: mean(|p| p.achieved_rps),
                latency_us: all.percentile(pct)? as f64 / 1e3,
            };
            Some((p, all.len()))
        }
    }
}

/// Weighted least-squares line through (x, y, _) with weights `w`:
/// (intercept, slope); `None` when the x are all alike.
fn weighted_line(pts: &[(f64, f64, f64)], w: &[f64]) -> Option<(f64, f64)> {
    let sw: f64 = w.iter().sum();
    let mx = pts.iter().zip(w).map(|(p, w)| w * p.0).sum::<f64>() / sw;
    let my = pts.iter().zip(w).map(|(p, w)| w * p.1).sum::<f64>() / sw;
    let sxx: f64 = pts.iter().zip(w).map(|(p, w)| w * (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts
        .iter()
        .zip(w)
        .map(|(p, w)| w * (p.0 - mx) * (p.1 - my))
        .sum();
    if !(sxx > 0.0 && sw > 0.0) {
        return None;
    }
    let b = sxy / sxx;
    Some((my - b * mx, b))
}

/// The median of `v`, 0 for none (no step to judge).
fn median(v: Vec<f64>) -> f64 {
    qosd_core::measure::median(v).unwrap_or(0.0)
}

impl AppCalibration {
    /// Puts the knee on the fitted curve (a real sweep's `steps` with their
    /// request counts; the pole is the calibrated capacity). Leaves the
    /// step-read knee where no curve fits, and says so by `knee_fit: None`.
    pub fn fit_knee(&mut self, steps: &[(Point, u64)]) {
        if let Some(f) = CurveFit::of(steps, self.capacity_rps) {
            (self.knee_rps, self.knee_latency_us) = f.knee();
            self.knee_fit = Some(f);
        }
    }

    /// Puts the knee on the curve fitted over steps measured in passes
    /// ([`PassFit`]), and the passes' own knees in `knee_spread` (with more
    /// than one pass). Leaves the step-read knee where no curve fits.
    pub fn fit_knee_passes(&mut self, steps: &[Passes]) {
        let Some(pf) = PassFit::of(steps, self.percentile, self.capacity_rps) else {
            return;
        };
        (self.knee_rps, self.knee_latency_us) = pf.fit.knee();
        if pf.knees_us.len() > 1 {
            self.knee_spread = KneeSpread::of(pf.knees_us, pf.fit.samples, pf.fit.samples);
        }
        self.knee_fit = Some(pf.fit);
    }
}

/// The knee latency's repeatability: with `--knee-repeats`,
/// `knee_latency_us` is the median of the percentiles of
/// `repeats_us.len()` steps at the knee load, and their range is its
/// confidence interval (for 5 steps, ~94 % that the true median lies
/// between the lowest and the highest); with knee passes, `repeats_us` are
/// the passes' knees, each fitted alone, and `knee_latency_us` is the fit
/// over all of them pooled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KneeSpread {
    /// Each repeated step's percentile, or each pass's knee latency, µs.
    pub repeats_us: Vec<f64>,
    /// Their median, lowest and highest, µs.
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    /// Largest distance of one repeat from the median, % of the median.
    pub spread_pct: f64,
    /// Requests measured at the knee, all steps (passes: every request the
    /// pooled fit rests on).
    pub samples: u64,
    /// Requests pooled for `base_latency_us` (the light steps; passes: the
    /// fit's floor rests on every step, so the same as `samples`).
    pub base_samples: u64,
}

impl KneeSpread {
    /// The spread of per-step figures `v` (µs) around their median.
    pub fn of(v: Vec<f64>, samples: u64, base_samples: u64) -> Option<KneeSpread> {
        let s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        if s.is_empty() {
            return None;
        }
        let min = s.iter().copied().fold(f64::INFINITY, f64::min);
        let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let median = median(s);
        let far = (median - min).max(max - median);
        Some(KneeSpread {
            repeats_us: v,
            median_us: median,
            min_us: min,
            max_us: max,
            spread_pct: 100.0 * far / median.max(1e-9),
            samples,
            base_samples,
        })
    }
}

#[cfg(test)]
#[path = "knee_tests.rs"]
mod tests;
