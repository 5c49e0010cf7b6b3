//! The knee's passes: the steps the fitted curve rests on, measured again
//! after the sweep, each load's requests pooled over its passes
//! ([`crate::calibrate::PassFit`]); and the record of those passes in the
//! test fixture's format (`calibrate/passes_s8.txt`).

use std::fmt::Write as _;
use std::io::Write as _;

use qosd_sensors::stats::LogHistogram;

use super::{StepKind, SweepOptions};
use qosd_core::slo::GapPoint;

use crate::calibrate::knee::{pool, slowest};
use crate::calibrate::{check, AppCalibration, CurveFit, KneeCheck, PassFit, Passes, Point};
use crate::load::LoadError;

/// One load of a sweep: the rate asked for; each pass's client point and
/// latencies (ns), and the server side's latencies where measured.
#[derive(Debug, Clone)]
pub struct Load {
    pub asked_rps: f64,
    /// Its arrivals' seed, the same in every pass ([`super::load_seed`]).
    pub seed: u64,
    pub client: Passes,
    pub server: Vec<Option<LogHistogram>>,
}

impl Load {
    /// A load measured once.
    pub fn first(
        asked_rps: f64,
        seed: u64,
        p: Point,
        h: LogHistogram,
        s: Option<LogHistogram>,
    ) -> Load {
        Load {
            asked_rps,
            seed,
            client: vec![(p, h)],
            server: vec![s],
        }
    }

    /// The first pass's point (the sweep's).
    pub fn point(&self) -> &Point {
        &self.client[0].0
    }
}

/// Measures one step: rate, seed, what for → its client point and
/// latencies, and the server side's.
pub type Measure<'a> = dyn FnMut(f64, u64, StepKind) -> Result<(Point, LogHistogram, Option<LogHistogram>), LoadError>
    + 'a;

/// Measures the steps the knee's curve rests on (those
/// [`CurveFit::fits`] keeps at the calibrated capacity) again, until each
/// holds `o.knee_passes` passes, and puts the knee on the curve fitted over
/// them. The later passes run after the sweep, alternately down and up the
/// loads, each on its load's arrivals ([`super::load_seed`]): a load's
/// passes lie apart in time, so one slow spell of the machine falls into
/// one pass of a few loads, not into every pass of one; and a light load's
/// p99, which rests on a few requests per pass, rests on all its passes'.
pub fn knee_passes(
    steps: &mut [Load],
    c: &mut AppCalibration,
    o: &SweepOptions,
    measure: &mut Measure,
) -> Result<(), LoadError> {
    let fitted: Vec<usize> = (0..steps.len())
        .filter(|&i| CurveFit::fits(steps[i].point(), c.capacity_rps))
        .collect();
    for n in 1..o.knee_passes {
        one_pass(steps, &fitted, n, measure)?;
    }
    let mut client: Vec<Passes> = steps.iter().map(|l| l.client.clone()).collect();
    c.fit_knee_passes(&client);
    if let Some(fit) = c.knee_fit {
        // A load whose passes disagree is measured once more, its new pass
        // pooled with the others; what still stands goes into a warning.
        let retry = check::to_retry(&client, c.percentile, fit.pole_rps);
        for &i in &retry {
            let (p, h, s) = measure(steps[i].asked_rps, steps[i].seed, StepKind::Retry)?;
            steps[i].client.push((p, h));
            steps[i].server.push(s);
            client[i] = steps[i].client.clone();
        }
        if !retry.is_empty() {
            c.fit_knee_passes(&client);
        }
        let mut warnings = fit_warnings(c, &client, o.knee_passes);
        // Still warned: every fitted load once more, the knee fitted over
        // all passes pooled (`repeat_on_warning`).
        let mut before_us = None;
        if o.repeat_on_warning && !warnings.is_empty() {
            before_us = Some(c.knee_latency_us);
            one_pass(steps, &fitted, o.knee_passes, measure)?;
            client = steps.iter().map(|l| l.client.clone()).collect();
            c.fit_knee_passes(&client);
            warnings = fit_warnings(c, &client, o.knee_passes + 1);
        }
        if !(retry.is_empty() && warnings.is_empty() && before_us.is_none()) {
            c.knee_check = Some(KneeCheck {
                retried_rps: retry
                    .iter()
                    .map(|&i| steps[i].point().offered_rps)
                    .collect(),
                warnings,
                repeated_from_us: before_us,
            });
        }
    }
    if let Some(path) = &o.record_passes {
        let fitted: Vec<&Load> = fitted.iter().map(|&i| &steps[i]).collect();
        if let Err(e) = record(path, c.capacity_rps, &fitted) {
            eprintln!("  warning: recording the passes in {}: {e}", path.display());
        }
    }
    Ok(())
}

/// Measures pass `n` (0-based) of the `fitted` loads, alternately down
/// and up the loads, each on its load's arrivals, as each load's `n`-th
/// pass (before a retry it may hold).
fn one_pass(
    steps: &mut [Load],
    fitted: &[usize],
    n: usize,
    measure: &mut Measure,
) -> Result<(), LoadError> {
    let down = n % 2 == 1;
    for k in 0..fitted.len() {
        let i = fitted[if down { fitted.len() - 1 - k } else { k }];
        let (p, h, s) = measure(steps[i].asked_rps, steps[i].seed, StepKind::Pass(n + 1))?;
        let at = n.min(steps[i].client.len());
        steps[i].client.insert(at, (p, h));
        steps[i].server.insert(at, s);
    }
    Ok(())
}

/// What stands against the knee fitted over `client`: a poor fit, loads
/// whose passes disagree, passes' knees further apart than sampling allows
/// or too few of `nr_passes` fitting alone.
fn fit_warnings(c: &AppCalibration, client: &[Passes], nr_passes: usize) -> Vec<String> {
    let mut w = c
        .knee_fit
        .map(|f| check::warnings(&f, client, c.percentile))
        .unwrap_or_default();
    let se = c.knee_fit.and_then(|f| f.knee_se_us);
    w.extend(match &c.knee_spread {
        Some(k) => check::spread_warning(k, se),
        // The pool fitted, the passes alone did not all (seen beside
        // two spinners): the knee stands, its spread is unknown.
        None if nr_passes > 1 => Some(format!(
            "no spread: fewer than 2 of the {nr_passes} passes fit a curve alone (a busy machine?)"
        )),
        None => None,
    });
    w
}

/// The server side's figures, from its latencies pooled per load over the
/// passes the way the client's are ([`PassFit`]): its percentile at the
/// knee load, on the curve fitted to them where the client's knee is on a
/// fitted curve (else at the load measured nearest the knee), and the
/// client/server gap at each load the server kept up with (the same
/// requests seen from both sides). `None` and no gap without a server side.
pub fn server_side(loads: &[Load], c: &AppCalibration) -> (Option<f64>, Vec<GapPoint>) {
    let pct = c.percentile;
    // Each load's server-side passes, on its client points.
    let server: Vec<Passes> = loads
        .iter()
        .map(|l| {
            l.client
                .iter()
                .zip(&l.server)
                .filter_map(|((p, _), s)| {
                    let h = s.as_ref()?;
                    let latency_us = h.percentile(pct)? as f64 / 1e3;
                    Some((Point { latency_us, ..*p }, h.clone()))
                })
                .collect()
        })
        .collect();
    let fitted = c.knee_fit.and_then(|f| {
        let curve = PassFit::of(&server, pct, f.pole_rps)?.fit;
        Some(curve.latency_us(c.knee_rps)).filter(|v| v.is_finite())
    });
    // Each load's client and server side, pooled over its passes.
    let pooled: Vec<_> = loads
        .iter()
        .zip(&server)
        .filter_map(|(l, s)| Some((pool(&l.client, pct)?, pool(s, pct)?)))
        .collect();
    let nearest = || {
        pooled
            .iter()
            .min_by(|a, b| {
                (a.0 .0.offered_rps - c.knee_rps)
                    .abs()
                    .total_cmp(&(b.0 .0.offered_rps - c.knee_rps).abs())
            })
            .map(|(_, (s, _))| s.latency_us)
    };
    let gap = pooled
        .iter()
        .filter(|((p, _), _)| p.achieved_rps >= 0.9 * p.offered_rps)
        .map(|((p, _), (s, _))| GapPoint {
            rps: p.achieved_rps,
            gap_us: p.latency_us - s.latency_us,
        })
        .collect();
    (fitted.or_else(nearest), gap)
}

/// Slowest requests of each pass kept in a record: a p99 pooled over
/// three passes of ~190 requests rests on the 6 slowest, over 1500 on the
/// 46 slowest.
const RECORD_TOP: u64 = 40;

/// Appends `loads` as one more run of the fixture: `cap RUN RPS`, then per
/// pass `RUN asked offered achieved requests p99_ms` and its slowest
/// latencies in ms (from the histogram: within 0.4 %).
fn record(path: &std::path::Path, pole_rps: f64, loads: &[&Load]) -> std::io::Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let run = old.lines().filter(|l| l.starts_with("cap ")).count();
    let mut out = format!("cap {run} {pole_rps:.0}\n");
    for l in loads {
        for (p, h) in &l.client {
            let n = h.len();
            let _ = write!(
                out,
                "{run} {:.1} {:.0} {:.0} {n} {:.3}",
                l.asked_rps,
                p.offered_rps,
                p.achieved_rps,
                p.latency_us / 1e3
            );
            for k in 1..=RECORD_TOP.min(n) {
                let v = slowest(h, k).unwrap_or(0);
                let _ = write!(out, " {:.3}", v as f64 / 1e6);
            }
            out.push('\n');
        }
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(out.as_bytes())
}

#[cfg(test)]
#[path = "seed_tests.rs"]
mod seed_tests;

#[cfg(test)]
#[path = "doubt_tests.rs"]
mod doubt_tests;
