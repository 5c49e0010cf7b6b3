//! Calibrating real servers on this machine: each app's server swept with
//! rising open-loop load (its load–latency curve, capacity and knee), the
//! eBPF request sensor measuring the server side of every step beside the
//! client's, so the knee gets both figures and the client/server gap.

use qosd_core::slo::GapPoint;
use qosd_scenarios::calibrate::{AppCalibration, Calibration, CurveFit, Point};
use qosd_scenarios::scenario::AppSpec;
use qosd_scenarios::sweep::{self, SweepOptions};
use qosd_scenarios::{load::LoadError, servers};
use qosd_sensors::ebpf::{RequestTracer, TracerOptions};

use super::latency::from_tracer;
use super::replay::trace_server;
use super::setup::fixture_cmd;
use crate::usage;

/// A knee whose repeated steps are further apart than this (% of their
/// median) is flagged as not repeatable.
const KNEE_SPREAD_WARN_PCT: f64 = 10.0;

/// Calibrates on this machine, printing each point.
pub fn calibrate(
    sc: &qosd_scenarios::scenario::Scenario,
    only: Option<&str>,
    o: &SweepOptions,
) -> anyhow::Result<Calibration> {
    let fixture = fixture_cmd()?;
    let (cpus, mut cal) = placement(sc)?;
    // The eBPF request sensor measures the server-side latency of each
    // step beside the client's: the knee's eBPF figure is the target an
    // eBPF-fed policy is held to (one knee load, two yardsticks).
    let tracer = match RequestTracer::start(TracerOptions::default()) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("eBPF: not available ({e}); no eBPF-side targets (the client's stand)");
            None
        }
    };
    // Batch jobs (`job:`) take no requests: nothing to calibrate.
    for app in sc
        .apps
        .iter()
        .filter(|a| a.job.is_none() && only.is_none_or(|n| n == a.name))
    {
        let c = calibrate_app(app, &fixture, &cpus, o, tracer.as_ref())?;
        cal.apps.insert(app.name.clone(), c);
    }
    Ok(cal)
}

/// The CPUs every app is calibrated on, and the calibration that will
/// hold the apps (its source line says where it was measured).
fn placement(sc: &qosd_scenarios::scenario::Scenario) -> anyhow::Result<(Vec<usize>, Calibration)> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let allowed = servers::allowed_cpus()?;
    if allowed.is_empty() {
        anyhow::bail!("sched_getaffinity: no CPU allowed");
    }
    // A replay starts every app with its even share and never takes an app below
    // one core, so the most one app can hold is what the others leave it: its
    // capacity is measured there (the last CPUs; the load generator keeps
    // the first). On a 2-CPU machine with two apps that is one CPU.
    let nr_cpus = allowed
        .len()
        .saturating_sub(sc.apps.len().saturating_sub(1))
        .max(1);
    let cpus = &allowed[allowed.len() - nr_cpus..];
    let cal = Calibration {
        source: format!(
            "real ({}, {} CPUs; each app on the {nr_cpus} it can hold beside the others)",
            host.trim(),
            allowed.len()
        ),
        ..Default::default()
    };
    Ok((cpus.to_vec(), cal))
}

/// One app: its server started on `cpus` and swept, the client's and the
/// server side's figures of every step.
fn calibrate_app(
    app: &AppSpec,
    fixture: &[String],
    cpus: &[usize],
    o: &SweepOptions,
    tracer: Option<&RequestTracer>,
) -> anyhow::Result<AppCalibration> {
    let srv = servers::start_on(app, fixture, Some(cpus))?;
    eprintln!(
        "calibrating {} ({}, pid {}, CPUs {cpus:?})",
        app.name, srv.addr, srv.pid
    );
    // Every pid of the tree is its own target, merged below.
    let tree = trace_server(tracer, srv.pid, srv.port);
    let pct = app.target.as_ref().map_or(99.0, |t| t.percentile);
    let mut ebpf: Vec<(Point, Option<f64>, u64)> = Vec::new();
    let c = sweep::sweep(app, &srv.addr, o, &mut |p| {
        // The server-side latencies of this step (the tracer's since
        // the previous step), all of the server's pids merged.
        let fig = crate::config::figure_of(app.latency);
        let (e, n) = tracer.map_or((None, 0), |t| {
            let (h, _) = from_tracer(t, &tree, fig);
            (h.percentile(pct).map(|v| v as f64 / 1e3), h.len())
        });
        ebpf.push((*p, e, n));
        eprintln!(
            "  offered {:>9.0} rps  achieved {:>9.0} rps  p99 {:>9.3} ms  eBPF p99 {}",
            p.offered_rps,
            p.achieved_rps,
            p.latency_us / 1000.0,
            e.map_or("-".into(), |v| format!("{:.3} ms", v / 1000.0))
        )
    })
    .map_err(|e| match e {
        LoadError::Io(_) => anyhow::Error::new(e),
        e => usage!("{e}"),
    })?;
    print_knee(&c, o.knee_repeats > 0);
    if let Some(t) = tracer {
        for &pid in &tree {
            let _ = t.remove_target(pid as u32);
        }
    }
    let (ebpf_knee, gap) = server_side(&ebpf, &c);
    Ok(AppCalibration {
        nr_cpus: Some(cpus.len()),
        ebpf_knee_latency_us: ebpf_knee,
        gap,
        ..c
    })
}

/// The sweep's capacity and knee, and how far the knee's repeats (steps at
/// the knee load with `steps`, else the fit's passes) were apart.
fn print_knee(c: &AppCalibration, steps: bool) {
    eprintln!(
        "  -> capacity {:.0} rps, knee {:.0} rps at p99 {:.3} ms",
        c.capacity_rps,
        c.knee_rps,
        c.knee_latency_us / 1000.0
    );
    if let Some(f) = &c.capacity_fit {
        eprintln!(
            "  -> capacity: completion rate over {} intervals with a backlog, median {:.0} rps \
             (quartiles {:.0}-{:.0})",
            f.nr_intervals, f.rps, f.q1_rps, f.q3_rps
        );
    }
    if let Some(f) = &c.knee_fit {
        eprintln!(
            "  -> knee where rps / p99 peaks on the curve fitted over {} steps ({} requests): \
             p99 = {:.3} + {:.3} x / ({:.0} - x) ms, median error {:.0} %",
            f.nr_steps,
            f.samples,
            f.base_us / 1000.0,
            f.growth_us / 1000.0,
            f.pole_rps,
            f.median_err_pct
        );
    }
    if let Some(k) = &c.knee_spread {
        if steps {
            eprintln!(
                "  -> knee p99 over {} steps: {:.3}-{:.3} ms (median {:.3}, ±{:.0} %); \
                 {} requests there, base from {}",
                k.repeats_us.len(),
                k.min_us / 1000.0,
                k.max_us / 1000.0,
                k.median_us / 1000.0,
                k.spread_pct,
                k.samples,
                k.base_samples
            );
        } else {
            let each: Vec<String> = k
                .repeats_us
                .iter()
                .map(|v| format!("{:.3}", v / 1000.0))
                .collect();
            eprintln!(
                "  -> knee p99 of each of {} passes fitted alone: {} ms (±{:.0} % around their \
                 median); the knee above is the fit over all of them",
                k.repeats_us.len(),
                each.join(", "),
                k.spread_pct
            );
        }
        if k.spread_pct > KNEE_SPREAD_WARN_PCT {
            eprintln!(
                "  warning: the knee latency moved ±{:.0} % between repeats (a busy \
                 machine?): targets from this calibration will not repeat; a scenario can pin \
                 one with `target: {{ ms: N }}`",
                k.spread_pct
            );
        }
    }
}

/// The server side's p99 at the knee and the client/server gap of the
/// steps, from each step's eBPF p99 (`ebpf`: the step's client point, its
/// eBPF p99 in µs and the requests behind it). The knee's figure is read
/// the way the client's was: on a curve fitted to the eBPF steps, at the
/// knee load, where the client's knee is on its fitted curve; else (no
/// fit, or the knee read off steps) at the step measured nearest the knee
/// load. Comparing one step's eBPF p99 with the client's fitted curve put
/// the step's luck, and a step at a higher load than the knee, in the
/// eBPF figure (11.5 against 6.35 ms, where that step's client read
/// 8.3 ms).
fn server_side(
    ebpf: &[(Point, Option<f64>, u64)],
    c: &AppCalibration,
) -> (Option<f64>, Vec<GapPoint>) {
    let fitted = c.knee_fit.and_then(|f| {
        let steps: Vec<(Point, u64)> = ebpf
            .iter()
            .filter_map(|(p, e, n)| {
                Some((
                    Point {
                        latency_us: (*e)?,
                        ..*p
                    },
                    *n,
                ))
            })
            .collect();
        let curve = CurveFit::of(&steps, f.pole_rps)?;
        Some(curve.latency_us(c.knee_rps)).filter(|v| v.is_finite())
    });
    // The step measured nearest the knee load.
    let nearest = || {
        ebpf.iter()
            .filter(|(_, e, _)| e.is_some())
            .min_by(|a, b| {
                (a.0.offered_rps - c.knee_rps)
                    .abs()
                    .total_cmp(&(b.0.offered_rps - c.knee_rps).abs())
            })
            .and_then(|(_, e, _)| *e)
    };
    let ebpf_knee = fitted.or_else(nearest);
    if let Some(e) = ebpf_knee {
        let how = if fitted.is_some() {
            "on the fitted eBPF curve"
        } else {
            "at the nearest step"
        };
        eprintln!("  -> eBPF p99 at the knee {:.3} ms ({how})", e / 1000.0);
    }
    // The client/server gap at each step the server kept up with
    // (the same requests seen from both sides).
    let gap: Vec<GapPoint> = c
        .points
        .iter()
        .filter(|p| p.achieved_rps >= 0.9 * p.offered_rps)
        .filter_map(|p| {
            let (_, e, _) = ebpf
                .iter()
                .find(|(q, _, _)| q.offered_rps == p.offered_rps)?;
            Some(GapPoint {
                rps: p.achieved_rps,
                gap_us: p.latency_us - (*e)?,
            })
        })
        .collect();
    if let Some(m) = qosd_core::slo::GapModel::fit(gap.clone()) {
        eprintln!(
            "  -> client/server gap {:.3} ms at the lightest load, {:.3} ms at the knee",
            m.gap_us(0.0) / 1000.0,
            m.gap_us(c.knee_rps) / 1000.0
        );
    }
    (ebpf_knee, gap)
}
