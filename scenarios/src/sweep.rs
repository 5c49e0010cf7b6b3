//! Real calibration: sweep the offered load on a running server with the
//! open-loop generator, rising geometrically until it saturates, then
//! fill in the last stretch linearly, and find capacity and knee. The
//! knee is made repeatable: every step holds enough requests for its
//! percentile, the base latency pools the light steps, the knee load is
//! interpolated, and the knee latency pools repeated steps at that load
//! (their spread goes into the calibration). A step the server fell
//! behind in is followed by a pause while it serves its backlog
//! ([`settle_time`]), so the next step measures only its own requests.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use qosd_sensors::stats::LogHistogram;

use crate::calibrate::{
    from_points, knee_load, AppCalibration, BusyRates, CapacityFit, KneeSpread, Point, BASE_LOAD,
    KNEE_FLAT_FACTOR, SATURATED_FACTOR,
};
use crate::load::{self, LoadSpec, Rate};
use crate::scenario::AppSpec;

mod passes;
use passes::Load;

/// How a sweep proceeds.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// Length of each load step, s.
    pub step_s: f64,
    /// First rate, rps.
    pub start_rps: f64,
    /// Each step offers this many times the previous one.
    pub factor: f64,
    /// Highest rate tried, rps.
    pub max_rps: f64,
    /// Steps added between the last good rate and the saturating one.
    pub refine_steps: usize,
    pub seed: u64,
    /// How long a step waits for replies after its last send, s: they
    /// count in its achieved rate, so a saturated step's rate is inflated
    /// by up to (step + drain) / step.
    pub drain_s: f64,
    /// A step lasts long enough to hold about this many requests (at most
    /// MAX_STEP_STRETCH × `step_s`): a p99 over 1000 requests rests on 10
    /// of them, over a 2 s step at 100 rps on 2. 0: `step_s` always.
    pub min_samples: u64,
    /// Steps measured at the knee load once it is found; their requests,
    /// pooled, give the knee latency, and their spread is reported. 0: the
    /// knee's latency is read off the sweep's curve.
    pub knee_repeats: usize,
    /// Put the knee on the curve fitted over every step
    /// ([`crate::calibrate::CurveFit`]) rather than reading it off the
    /// steps (false: `--knee steps`, the method before).
    pub fit_knee: bool,
    /// With `fit_knee`: how many times the steps the fit rests on are
    /// measured ([`knee_passes`]); their requests are pooled per load, and
    /// each pass's own knee goes into `knee_spread`. 1: once, as before.
    pub knee_passes: usize,
    /// When the knee check still warns after its retries, measure every
    /// fitted load once more and fit the knee over all passes pooled.
    pub repeat_on_warning: bool,
    /// Append each fitted load's passes to this file in the test
    /// fixture's format (`calibrate/passes_s8.txt`).
    pub record_passes: Option<std::path::PathBuf>,
}

/// The longest a step grows to reach `min_samples`, × `step_s`.
const MAX_STEP_STRETCH: f64 = 4.0;

/// Passes over the fitted steps by default. Measured on six recorded
/// calibrations of the demo (near-quiet; `calibrate/passes_s8.txt`): the
/// knee spread −14 / +17 % around its median with one pass, −12 / +9 %
/// with two, −6 / +14 % with three; two cost ~14 s (41 s against 27 s),
/// three ~28 s and bought nothing more there. docs/calibration.md, "Knee
/// passes".
pub const KNEE_PASSES: usize = 2;

/// What a measured step is for: the progress callback sees it with the
/// step's point and answers with the server side's latencies of the step
/// (ns) where it measures them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// The sweep up the loads: the first pass of the fitted steps.
    Sweep,
    /// A later pass over the fitted steps (its number, from 2).
    Pass(usize),
    /// A load measured once more because its passes disagreed.
    Retry,
    /// One of `--knee-repeats`' steps at the knee load.
    Repeat,
}

/// The progress callback of a sweep (see [`StepKind`]).
pub type Progress<'a> = dyn FnMut(StepKind, &Point) -> Option<LogHistogram> + 'a;

impl Default for SweepOptions {
    fn default() -> Self {
        Self {
            step_s: 2.0,
            start_rps: 100.0,
            factor: 1.4,
            max_rps: 500_000.0,
            refine_steps: 4,
            seed: 1,
            drain_s: 1.0,
            // Both off by default until a quiet machine shows they repeat
            // better: on a loaded one the repeats did worse (docs/sharing.md).
            min_samples: 0,
            knee_repeats: 0,
            fit_knee: true,
            knee_passes: KNEE_PASSES,
            repeat_on_warning: false,
            record_passes: None,
        }
    }
}

/// The load spec of one app at a constant rate.
pub fn spec_for(
    app: &AppSpec,
    addr: &str,
    rps: f64,
    secs: f64,
    seed: u64,
) -> Result<LoadSpec, load::LoadError> {
    let mut s = LoadSpec::new(
        addr,
        app.protocol(),
        Rate::Constant(rps),
        Duration::from_secs_f64(secs),
    )?;
    s.keepalive = app.keepalive;
    s.connections = app.connections;
    s.arrival = app.arrival;
    s.seed = seed;
    s.http_path = app.http_path.clone();
    if let Some(m) = &app.mix {
        s.memcache = m.to_load();
    }
    s.drain = Duration::from_secs(1);
    Ok(s)
}

/// One constant-rate step: the point, and the fraction of requests that
/// failed.
pub fn measure(
    app: &AppSpec,
    addr: &str,
    rps: f64,
    o: &SweepOptions,
    pct: f64,
) -> Result<(Point, f64), load::LoadError> {
    measure_hist(app, addr, rps, o, pct).map(|(p, e, _, _)| (p, e))
}

/// One step's figures: its point, the share of failed requests, every
/// latency (ns) and the completion rates of its busy intervals.
type Step = (Point, f64, LogHistogram, BusyRates);

/// [`measure`], with every latency of the step and its busy intervals.
fn measure_hist(
    app: &AppSpec,
    addr: &str,
    rps: f64,
    o: &SweepOptions,
    pct: f64,
) -> Result<Step, load::LoadError> {
    let secs = (o.min_samples as f64 / rps.max(1e-9)).clamp(o.step_s, MAX_STEP_STRETCH * o.step_s);
    let mut spec = spec_for(app, addr, rps, secs, o.seed)?;
    spec.drain = Duration::from_secs_f64(o.drain_s);
    let mut hist = LogHistogram::new();
    let mut busy = BusyRates::default();
    let r = load::run(&spec, &AtomicBool::new(false), &mut |iv| {
        hist.merge(&iv.histogram);
        busy.interval(
            iv.scheduled,
            iv.completed + iv.errors,
            iv.completed,
            iv.interval_s,
        );
    })?;
    // The percentile of the whole step, from the per-interval summaries'
    // p99 when asked for p99 (the common case), else the run's own figures.
    let lat = match pct {
        p if (p - 99.0).abs() < 1e-9 => r.latency_us.p99,
        p if (p - 95.0).abs() < 1e-9 => r.latency_us.p95,
        p if (p - 90.0).abs() < 1e-9 => r.latency_us.p90,
        p if (p - 50.0).abs() < 1e-9 => r.latency_us.p50,
        _ => r.latency_us.p999,
    }
    .unwrap_or(f64::INFINITY);
    let err_frac = r.errors.total() as f64 / r.scheduled.max(1) as f64;
    std::thread::sleep(settle_time(r.offered_rps, r.achieved_rps, r.duration_s));
    Ok((
        Point {
            offered_rps: r.offered_rps,
            achieved_rps: r.achieved_rps,
            latency_us: lat,
        },
        err_frac,
        hist,
        busy,
    ))
}

/// The longest a step waits for the server to work off its backlog, s.
const MAX_SETTLE_S: f64 = 5.0;

/// How long the server needs, after a step it fell behind in, to serve
/// what it still holds: the requests the client gave up on (sent but not
/// answered by the end of the drain) at the rate it answered them. Left
/// unserved, they are answered during the next step, and a server-side
/// (eBPF) percentile of that step counts their queueing (765 ms read at
/// the knee where the client saw 11 ms). A step that kept up waits 0.
pub fn settle_time(offered_rps: f64, achieved_rps: f64, secs: f64) -> Duration {
    let left = (offered_rps - achieved_rps).max(0.0) * secs;
    if left < 1.0 || achieved_rps <= 0.0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64((left / achieved_rps).min(MAX_SETTLE_S))
}

/// The arrival seed of the `k`-th load a sweep measures: its own for each
/// load, the same in each of its passes. One seed for every load (as
/// before) scaled one arrival sequence to every rate, so a burst in it
/// raised every step of a pass at once: the sweep's pass (seed 1) fitted
/// 20–40 % above the next (seed 1001) in 4 of 5 quiet calibrations, as a
/// FIFO queue fed by those two sequences does (`seed_tests`). With each
/// load's passes on the same arrivals, what sets them apart is the
/// machine, which is what [`crate::calibrate::check`] looks for.
pub fn load_seed(seed: u64, k: usize) -> u64 {
    seed.wrapping_add(1000 * k as u64)
}

/// Sweeps one app's server at `addr`; `progress` sees each step.
pub fn sweep(
    app: &AppSpec,
    addr: &str,
    o: &SweepOptions,
    progress: &mut Progress,
) -> Result<AppCalibration, load::LoadError> {
    let pct = app.target.as_ref().map_or(99.0, |t| t.percentile);
    let saturated = |p: &Point, err: f64, base: f64, busy: &BusyRates| {
        p.achieved_rps < 0.9 * p.offered_rps
            || err > 0.01
            || p.latency_us > SATURATED_FACTOR * base
            || busy.mostly_busy()
    };
    // Each step: the rate asked for, its point, its latencies and the
    // server side's.
    let mut steps: Vec<Load> = Vec::new();
    let mut busy: Vec<f64> = Vec::new();
    let mut rps = o.start_rps;
    let mut base = f64::INFINITY;
    while rps <= o.max_rps {
        let seed = load_seed(o.seed, steps.len());
        let os = SweepOptions { seed, ..o.clone() };
        let (mut p, mut err, mut h, mut b) = measure_hist(app, addr, rps, &os, pct)?;
        busy.extend(b.rates.iter().copied());
        let mut s = progress(StepKind::Sweep, &p);
        if saturated(&p, err, base.min(p.latency_us), &b) {
            // One stall of a busy machine must not end the sweep (and set
            // capacity) early: a step that looks saturated is measured
            // again, and the better of the two stands.
            let (p2, err2, h2, b2) = measure_hist(app, addr, rps, &os, pct)?;
            busy.extend(b2.rates.iter().copied());
            let s2 = progress(StepKind::Sweep, &p2);
            if !saturated(&p2, err2, base.min(p2.latency_us), &b2) || p2.latency_us < p.latency_us {
                (p, err, h, b, s) = (p2, err2, h2, b2, s2);
            }
        }
        base = base.min(p.latency_us);
        let stop = saturated(&p, err, base, &b);
        steps.push(Load::first(rps, seed, p, h, s));
        if stop {
            break;
        }
        rps *= o.factor;
    }
    // Fill in between the last good rate and the first saturated one,
    // where the knee is.
    if steps.len() >= 2 {
        let lo = steps[steps.len() - 2].point().offered_rps;
        let hi = steps[steps.len() - 1].point().offered_rps;
        for k in 1..=o.refine_steps {
            let r = lo + (hi - lo) * k as f64 / (o.refine_steps + 1) as f64;
            let seed = load_seed(o.seed, steps.len());
            let os = SweepOptions { seed, ..o.clone() };
            let (p, _, h, b) = measure_hist(app, addr, r, &os, pct)?;
            busy.extend(b.rates);
            let s = progress(StepKind::Sweep, &p);
            steps.push(Load::first(r, seed, p, h, s));
        }
    }
    steps.sort_by(|a, b| a.point().offered_rps.total_cmp(&b.point().offered_rps));
    let points = steps.iter().map(|l| *l.point()).collect();
    let mut c = from_points(points, pct)
        .ok_or_else(|| load::LoadError::BadSpec(format!("{}: no calibration point", app.name)))?;
    if let Some(cf) = CapacityFit::of(&busy) {
        c.capacity_rps = cf.rps;
        c.capacity_fit = Some(cf);
    }
    if o.fit_knee {
        let m = &mut |rps: f64, seed: u64, kind: StepKind| -> Result<_, load::LoadError> {
            let oi = SweepOptions { seed, ..o.clone() };
            let (p, _, h, _) = measure_hist(app, addr, rps, &oi, pct)?;
            let s = progress(kind, &p);
            Ok((p, h, s))
        };
        passes::knee_passes(&mut steps, &mut c, o, m)?;
    }
    if o.knee_repeats > 0 {
        let first: Vec<(Point, LogHistogram)> = steps.iter().map(|l| l.client[0].clone()).collect();
        repeat_knee(&mut c, &first, app, addr, o, progress)?;
    }
    if steps.iter().any(|l| l.server.iter().any(Option::is_some)) {
        (c.ebpf_knee_latency_us, c.gap) = passes::server_side(&steps, &c);
    }
    Ok(c)
}

/// Makes the knee repeatable: the base latency from the light steps'
/// requests pooled (one short step's p99 rests on a handful of requests),
/// the knee load interpolated against it, and the knee latency the median
/// of `knee_repeats` steps at that load, with their spread. A step the
/// machine stalled in (another process took the CPU) only raises latency:
/// light steps above KNEE_FLAT_FACTOR × the lowest are left out of the
/// base, and the median ignores a stalled repeat where a pool would not.
fn repeat_knee(
    c: &mut AppCalibration,
    steps: &[(Point, LogHistogram)],
    app: &AppSpec,
    addr: &str,
    o: &SweepOptions,
    progress: &mut Progress,
) -> Result<(), load::LoadError> {
    let pct = c.percentile;
    let kept = |p: &Point| p.achieved_rps >= 0.95 * p.offered_rps;
    let light: Vec<&(Point, LogHistogram)> = {
        let l: Vec<_> = steps
            .iter()
            .filter(|(p, _)| kept(p) && p.offered_rps <= BASE_LOAD * c.capacity_rps)
            .collect();
        match l.is_empty() {
            true => steps.iter().filter(|(p, _)| kept(p)).take(1).collect(),
            false => l,
        }
    };
    let lowest = light
        .iter()
        .map(|(p, _)| p.latency_us)
        .fold(f64::INFINITY, f64::min);
    let mut pool = LogHistogram::new();
    for (_, h) in light
        .iter()
        .filter(|(p, _)| p.latency_us <= KNEE_FLAT_FACTOR * lowest)
    {
        pool.merge(h);
    }
    let Some(base) = pool.percentile(pct).map(|v| v as f64 / 1e3) else {
        return Ok(());
    };
    // The fitted knee's load where there is one; else where the steps
    // cross 2 × the pooled base.
    let fitted = c.knee_fit.map(|_| c.knee_rps);
    let Some(knee_rps) = fitted.or_else(|| knee_load(&c.points, base)) else {
        return Ok(());
    };
    let mut samples = 0;
    let mut each = Vec::with_capacity(o.knee_repeats);
    for i in 0..o.knee_repeats {
        // A fresh arrival sequence each time, so the repeats are samples.
        let oi = SweepOptions {
            seed: o.seed.wrapping_add(1 + i as u64),
            ..o.clone()
        };
        let (p, _, h, _) = measure_hist(app, addr, knee_rps, &oi, pct)?;
        progress(StepKind::Repeat, &p);
        each.push(p.latency_us);
        samples += h.len();
    }
    let Some(spread) = KneeSpread::of(each, samples, pool.len()) else {
        return Ok(());
    };
    c.base_latency_us = base;
    c.knee_rps = knee_rps;
    c.knee_latency_us = spread.median_us;
    c.knee_spread = Some(spread);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_that_fell_behind_waits_for_its_backlog() {
        // Kept up (achieved within one request): no pause.
        assert_eq!(settle_time(500.0, 500.0, 2.0), Duration::ZERO);
        assert_eq!(settle_time(500.0, 499.8, 2.0), Duration::ZERO);
        // The fit's saturated step on 2 CPUs (recorded): 590 requests left
        // at 2032 rps.
        let t = settle_time(2622.0, 2032.0, 1.0).as_secs_f64();
        assert!((t - 590.0 / 2032.0).abs() < 1e-9, "{t}");
        // A stalled server: bounded.
        assert_eq!(settle_time(1000.0, 10.0, 4.0), Duration::from_secs(5));
        assert_eq!(settle_time(1000.0, 0.0, 4.0), Duration::ZERO);
    }
}
