//! Calibrating real servers on this machine: each app's server swept with
//! rising open-loop load (its load–latency curve, capacity and knee), the
//! eBPF request sensor measuring the server side of every step beside the
//! client's, so the knee gets both figures and the client/server gap.

use qosd_scenarios::calibrate::{check, AppCalibration, Calibration};
use qosd_scenarios::scenario::AppSpec;
use qosd_scenarios::sweep::{self, StepKind, SweepOptions};
use qosd_scenarios::{load::LoadError, servers};
use qosd_sensors::ebpf::{RequestTracer, TracerOptions};

use super::latency::from_tracer;
use super::replay::trace_server;
use super::setup::fixture_cmd;
use crate::usage;

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
    let c = sweep::sweep(app, &srv.addr, o, &mut |kind, p| {
        // The server-side latencies of this step (the tracer's since
        // the previous step), all of the server's pids merged.
        let fig = crate::config::figure_of(app.latency);
        let h = tracer.map(|t| from_tracer(t, &tree, fig).0);
        let e = h
            .as_ref()
            .and_then(|h| h.percentile(pct))
            .map(|v| v as f64 / 1e3);
        eprintln!(
            "  {:<7} offered {:>9.0} rps  achieved {:>9.0} rps  p99 {:>9.3} ms  eBPF p99 {}",
            step_label(kind),
            p.offered_rps,
            p.achieved_rps,
            p.latency_us / 1000.0,
            e.map_or("-".into(), |v| format!("{:.3} ms", v / 1000.0))
        );
        h
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
    print_server_side(&c);
    Ok(AppCalibration {
        nr_cpus: Some(cpus.len()),
        ..c
    })
}

/// How a step is shown: what it was measured for.
fn step_label(kind: StepKind) -> String {
    match kind {
        StepKind::Sweep => "sweep".into(),
        StepKind::Pass(n) => format!("pass {n}"),
        StepKind::Retry => "retry".into(),
        StepKind::Repeat => "repeat".into(),
    }
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
    if let Some(k) = &c.knee_check {
        if !k.retried_rps.is_empty() {
            let at: Vec<String> = k.retried_rps.iter().map(|r| format!("{r:.0}")).collect();
            eprintln!(
                "  -> passes disagreed at {} rps: measured once more, pooled with the others",
                at.join(", ")
            );
        }
        if let Some(b) = k.repeated_from_us {
            eprintln!(
                "  -> the check warned at a knee of {:.3} ms: every fitted load measured once \
                 more, the knee fitted over all passes",
                b / 1000.0
            );
        }
        for w in &k.warnings {
            eprintln!("  WARNING: knee taken anyway (calibration.json: knee_check): {w}");
        }
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
            let se = c.knee_fit.and_then(|f| f.knee_se_us);
            eprintln!(
                "  -> knee p99 of each of {} passes fitted alone: {} ms (±{:.0} % around their \
                 median; their sampling error allows ±{:.0} %); the knee above is the fit over \
                 all of them",
                k.repeats_us.len(),
                each.join(", "),
                k.spread_pct,
                check::allowed_spread_pct(k, se)
            );
        }
        // The passes' spread is judged with the fit (knee_check's warnings,
        // above); the repeated steps' here, by the same rule.
        if let Some(w) = steps.then(|| check::spread_warning(k, None)).flatten() {
            eprintln!("  warning: {w}");
        }
    }
}

/// The server side's p99 at the knee and the client/server gap the sweep
/// found ([`qosd_scenarios::sweep`] pools them per load as the client's).
fn print_server_side(c: &AppCalibration) {
    if let Some(e) = c.ebpf_knee_latency_us {
        let how = if c.knee_fit.is_some() {
            "on the eBPF curve fitted over the passes"
        } else {
            "at the load nearest the knee"
        };
        eprintln!("  -> eBPF p99 at the knee {:.3} ms ({how})", e / 1000.0);
    }
    if let Some(m) = qosd_core::slo::GapModel::fit(c.gap.clone()) {
        eprintln!(
            "  -> client/server gap {:.3} ms at the lightest load, {:.3} ms at the knee",
            m.gap_us(0.0) / 1000.0,
            m.gap_us(c.knee_rps) / 1000.0
        );
    }
}
