//! `qosd calibrate`: each app's load–latency curve, capacity and knee, on
//! this machine (real servers swept with the open-loop generator) or on the
//! simulated node. Scenario loads are fractions of these capacities.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args as ClapArgs;
use qosd_core::slo::GapPoint;
use qosd_scenarios::calibrate::{self, Calibration};
use qosd_scenarios::sweep::{self, SweepOptions};
use qosd_scenarios::{load::LoadError, servers};

use qosd_sensors::ebpf::{Mode, RequestTracer, TargetOptions, TracerOptions};

use crate::node::latency::from_tracer;
use crate::node::replay::server_pids;
use crate::usage;

#[derive(ClapArgs, Debug)]
#[command(after_help = "Examples:\n  \
    qosd calibrate scenarios/ramp.yaml                   sweep each app's server on this machine\n  \
    qosd calibrate scenarios/ramp.yaml --app memcached   one app only\n  \
    qosd calibrate scenarios/ramp.yaml --sim             the simulated node's model\n  \
    qosd calibrate scenarios/ramp.yaml --model out/model.yaml --step-s 1   fit the sim to this machine\n  \
    qosd replay scenarios/ramp.yaml --sim --model out/model.yaml\n  \
    qosd replay scenarios/ramp.yaml --calibration out/calibration-ramp.json\n\n\
    Each server runs on the CPUs it can hold in a replay beside the scenario's other apps\n\
    (all but one per other app), so capacity is what it can reach there.\n\
    A sweep offers rising open-loop load (x1.4 per step) until the server saturates\n\
    (achieved < 90% of offered, >1% errors, or p99 50x the lowest; such a step is measured\n\
    twice, so one stall does not end the sweep), then fills in the last stretch.\n\
    Capacity = the highest rate the server kept up with; the knee is where the latency\n\
    curve bends (Kneedle) or first passes twice the base latency (the light steps' requests\n\
    pooled), interpolated between steps; its latency is the median of --knee-repeats steps\n\
    at that load, whose spread goes into the output (knee_spread). Targets with knee_factor\n\
    sit there; `target: {ms: N}` in a scenario pins a target for comparisons instead.")]
pub struct Args {
    /// Scenario whose apps to calibrate.
    pub scenario: PathBuf,
    /// Only this app.
    #[arg(long)]
    pub app: Option<String>,
    /// Calibrate the simulated node's model instead of real servers.
    #[arg(long, conflicts_with = "model")]
    pub sim: bool,
    /// Fit each app's sim model on this machine (load steps at 1 CPU, 2
    /// CPUs and half a CPU of quota; a batch job's ops per CPU-second) and
    /// write it to FILE for `qosd replay --sim --model FILE`.
    #[arg(long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// With --model: the knobs the fitted node offers, comma-separated
    /// (as a real replay's `--resources`; without `cores` its apps share
    /// the CPUs). Default: every knob this machine has.
    #[arg(long, value_name = "LIST", value_delimiter = ',', requires = "model",
          value_parser = crate::cmd::replay::parse_resource)]
    pub resources: Option<Vec<qosd_core::Resource>>,
    /// Length of each load step, seconds.
    #[arg(long, default_value_t = 2.0)]
    pub step_s: f64,
    /// Highest rate tried, requests/s.
    #[arg(long, default_value_t = 500_000.0)]
    pub max_rps: f64,
    /// Steps measured at the knee load; the knee latency is their median
    /// p99. 0: read it off the sweep's curve (one step).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=50))]
    pub knee_repeats: u32,
    /// Requests a step holds at least (it grows up to 4 × --step-s).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub min_samples: u64,
    /// Output file. Default: out/calibration-<scenario>.json.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// A knee whose repeated steps are further apart than this (% of their
/// median) is flagged as not repeatable.
const KNEE_SPREAD_WARN_PCT: f64 = 10.0;

/// The highest `--max-rps`: far above what one machine's loopback serves.
const MAX_RPS: f64 = 10_000_000.0;

/// The command that starts the fixture server: this binary's hidden
/// `fixture` subcommand.
pub fn fixture_cmd() -> anyhow::Result<Vec<String>> {
    let exe = std::env::current_exe().context("locating the qosd binary")?;
    Ok(vec![exe.display().to_string(), "fixture".into()])
}

/// Calibrates on this machine, printing each point.
pub fn real(
    sc: &qosd_scenarios::scenario::Scenario,
    only: Option<&str>,
    o: &SweepOptions,
) -> anyhow::Result<Calibration> {
    let fixture = fixture_cmd()?;
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
    let mut cal = Calibration {
        source: format!(
            "real ({}, {} CPUs; each app on the {nr_cpus} it can hold beside the others)",
            host.trim(),
            allowed.len()
        ),
        ..Default::default()
    };
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
        let srv = servers::start_on(app, &fixture, Some(cpus))?;
        eprintln!(
            "calibrating {} ({}, pid {}, CPUs {cpus:?})",
            app.name, srv.addr, srv.pid
        );
        let tree = server_pids(srv.pid);
        if let Some(t) = &tracer {
            for &pid in &tree {
                let opts = TargetOptions {
                    mode: Mode::Auto,
                    ports: vec![srv.port],
                    // Every pid of the tree is its own target, merged below.
                    follow_children: false,
                };
                if let Err(e) = t.add_target(pid as u32, opts) {
                    eprintln!("  eBPF: tracing pid {pid}: {e}");
                }
            }
        }
        let pct = app.target.as_ref().map_or(99.0, |t| t.percentile);
        let mut ebpf: Vec<(f64, Option<f64>)> = Vec::new();
        let c = sweep::sweep(app, &srv.addr, o, &mut |p| {
            // The server-side latencies of this step (the tracer's since
            // the previous step), all of the server's pids merged.
            let e = tracer.as_ref().and_then(|t| {
                let (h, _) = from_tracer(t, &tree, crate::config::figure_of(app.latency));
                h.percentile(pct).map(|v| v as f64 / 1e3)
            });
            ebpf.push((p.offered_rps, e));
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
        eprintln!(
            "  -> capacity {:.0} rps, knee {:.0} rps at p99 {:.3} ms",
            c.capacity_rps,
            c.knee_rps,
            c.knee_latency_us / 1000.0
        );
        if let Some(k) = &c.knee_spread {
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
            if k.spread_pct > KNEE_SPREAD_WARN_PCT {
                eprintln!(
                    "  warning: the knee latency moved ±{:.0} % between steps at one load (a busy \
                     machine?): targets from this calibration will not repeat; a scenario can pin \
                     one with `target: {{ ms: N }}`",
                    k.spread_pct
                );
            }
        }
        if let Some(t) = &tracer {
            for &pid in &tree {
                let _ = t.remove_target(pid as u32);
            }
        }
        // The step measured nearest the knee load.
        let ebpf_knee = ebpf
            .iter()
            .filter(|(_, e)| e.is_some())
            .min_by(|a, b| {
                (a.0 - c.knee_rps)
                    .abs()
                    .total_cmp(&(b.0 - c.knee_rps).abs())
            })
            .and_then(|(_, e)| *e);
        if let Some(e) = ebpf_knee {
            eprintln!("  -> eBPF p99 at the knee {:.3} ms", e / 1000.0);
        }
        // The client/server gap at each step the server kept up with
        // (the same requests seen from both sides).
        let gap: Vec<GapPoint> = c
            .points
            .iter()
            .filter(|p| p.achieved_rps >= 0.9 * p.offered_rps)
            .filter_map(|p| {
                let (_, e) = ebpf.iter().find(|(o, _)| *o == p.offered_rps)?;
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
        cal.apps.insert(
            app.name.clone(),
            calibrate::AppCalibration {
                nr_cpus: Some(nr_cpus),
                ebpf_knee_latency_us: ebpf_knee,
                gap,
                ..c
            },
        );
    }
    Ok(cal)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let sc = crate::cmd::replay::read_scenario(&args.scenario)?;
    if let Some(n) = &args.app {
        match sc.apps.iter().find(|a| &a.name == n) {
            None => {
                return Err(usage!(
                    "--app {n}: not an app of {}",
                    args.scenario.display()
                ))
            }
            // A job has no capacity or knee; its sim model (ops per CPU)
            // is fitted by --model.
            Some(a) if a.job.is_some() && args.model.is_none() => {
                return Err(usage!(
                    "--app {n}: a batch job takes no requests; there is nothing to calibrate \
                     (--model fits its sim model)"
                ))
            }
            Some(_) => {}
        }
    }
    crate::cmd::secs::secs("--step-s", args.step_s, 0.0, 60.0)?;
    if !(args.max_rps > 0.0 && args.max_rps <= MAX_RPS) {
        return Err(usage!(
            "--max-rps {}: expected requests/s in (0, {MAX_RPS}]",
            args.max_rps
        ));
    }
    if let Some(file) = &args.model {
        // The knobs the scenario's real replays turn (`--resources`, then
        // the scenario's `resources:`, then all), so the fit measures them.
        let res = crate::cmd::replay::resources(&sc, args.resources.as_deref())?;
        return crate::cmd::calibrate_model::run(&sc, args.app.as_deref(), args.step_s, &res, file);
    }
    let mut cal = if args.sim {
        calibrate::sim(&sc)
    } else {
        let o = SweepOptions {
            step_s: args.step_s,
            max_rps: args.max_rps,
            seed: sc.seed,
            knee_repeats: args.knee_repeats as usize,
            min_samples: args.min_samples,
            ..Default::default()
        };
        real(&sc, args.app.as_deref(), &o)?
    };
    if let Some(n) = &args.app {
        cal.apps.retain(|k, _| k == n);
    }
    crate::outln!(
        "{:<12} {:>14} {:>12} {:>14} {:>14} {:>14}",
        "app",
        "capacity rps",
        "knee rps",
        "knee p99 ms",
        "knee eBPF ms",
        "base p99 ms"
    )?;
    for (n, c) in &cal.apps {
        crate::outln!(
            "{:<12} {:>14.0} {:>12.0} {:>14.3} {:>14} {:>14.3}",
            n,
            c.capacity_rps,
            c.knee_rps,
            c.knee_latency_us / 1000.0,
            c.ebpf_knee_latency_us
                .map_or("-".into(), |v| format!("{:.3}", v / 1000.0)),
            c.base_latency_us / 1000.0
        )?;
    }
    let out = args
        .out
        .unwrap_or_else(|| PathBuf::from(format!("out/calibration-{}.json", sc.name)));
    if let Some(d) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    cal.write(&out)
        .with_context(|| format!("writing {}", out.display()))?;
    crate::outln!("wrote {} ({})", out.display(), cal.source)?;
    Ok(())
}
