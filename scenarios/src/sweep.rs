//! Real calibration: sweep the offered load on a running server with the
//! open-loop generator, rising geometrically until it saturates, then
//! fill in the last stretch linearly, and find capacity and knee.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::calibrate::{from_points, AppCalibration, Point, SATURATED_FACTOR};
use crate::load::{self, LoadSpec, Rate};
use crate::scenario::AppSpec;

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
}

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
    let mut spec = spec_for(app, addr, rps, o.step_s, o.seed)?;
    spec.drain = Duration::from_secs_f64(o.drain_s);
    let mut hist = Vec::new();
    let r = load::run(&spec, &AtomicBool::new(false), &mut |iv| {
        hist.push(iv.clone())
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
    Ok((
        Point {
            offered_rps: r.offered_rps,
            achieved_rps: r.achieved_rps,
            latency_us: lat,
        },
        err_frac,
    ))
}

/// Sweeps one app's server at `addr`; `progress` sees each point.
pub fn sweep(
    app: &AppSpec,
    addr: &str,
    o: &SweepOptions,
    progress: &mut dyn FnMut(&Point),
) -> Result<AppCalibration, load::LoadError> {
    let pct = app.target.as_ref().map_or(99.0, |t| t.percentile);
    let saturated = |p: &Point, err: f64, base: f64| {
        p.achieved_rps < 0.9 * p.offered_rps || err > 0.01 || p.latency_us > SATURATED_FACTOR * base
    };
    let mut points: Vec<Point> = Vec::new();
    let mut rps = o.start_rps;
    let mut base = f64::INFINITY;
    while rps <= o.max_rps {
        let (mut p, mut err) = measure(app, addr, rps, o, pct)?;
        progress(&p);
        if saturated(&p, err, base.min(p.latency_us)) {
            // One stall of a busy machine must not end the sweep (and set
            // capacity) early: a step that looks saturated is measured
            // again, and the better of the two stands.
            let (p2, err2) = measure(app, addr, rps, o, pct)?;
            progress(&p2);
            if !saturated(&p2, err2, base.min(p2.latency_us)) || p2.latency_us < p.latency_us {
                (p, err) = (p2, err2);
            }
        }
        base = base.min(p.latency_us);
        let stop = saturated(&p, err, base);
        points.push(p);
        if stop {
            break;
        }
        rps *= o.factor;
    }
    // Fill in between the last good rate and the first saturated one,
    // where the knee is.
    if points.len() >= 2 {
        let lo = points[points.len() - 2].offered_rps;
        let hi = points[points.len() - 1].offered_rps;
        for k in 1..=o.refine_steps {
            let r = lo + (hi - lo) * k as f64 / (o.refine_steps + 1) as f64;
            let (p, _) = measure(app, addr, r, o, pct)?;
            progress(&p);
            points.push(p);
        }
    }
    points.sort_by(|a, b| a.offered_rps.total_cmp(&b.offered_rps));
    from_points(points, pct)
        .ok_or_else(|| load::LoadError::BadSpec(format!("{}: no calibration point", app.name)))
}
