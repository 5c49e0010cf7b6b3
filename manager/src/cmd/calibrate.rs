//! `qosd calibrate`: each app's load–latency curve, capacity and knee, on
//! this machine (real servers swept with the open-loop generator) or on the
//! simulated node. Scenario loads are fractions of these capacities.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args as ClapArgs, ValueEnum};
use qosd_scenarios::calibrate;
use qosd_scenarios::sweep::{self, SweepOptions};

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
    Capacity = the server's completion rate while it had a backlog. The knee (--knee fitted, the\n\
    default) is on the curve base + growth * x / (capacity - x) fitted over every step the\n\
    server kept up with (robust least squares, steps weighted by their requests), where\n\
    rps / latency peaks; the fit goes into the output (knee_fit). Those steps are measured\n\
    --knee-passes times (each load's requests pooled, every pass of a load on the same arrivals;\n\
    each pass's own knee in knee_spread). A load whose passes disagree is measured once more\n\
    (at most 2); a fit still poor (median error > 10 %) or still disagreeing is taken with a\n\
    warning, and knee_check in the output says why. --knee steps reads it off\n\
    the steps instead: where the curve bends (Kneedle) or first passes twice the base latency.\n\
    With --knee-repeats N its latency is the median of N steps at the knee load, whose\n\
    spread goes into the output (knee_spread). Targets with knee_factor sit there;\n\
    `target: {ms: N}` in a scenario pins a target for comparisons instead.")]
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
          value_parser = crate::node::setup::parse_resource)]
    pub resources: Option<Vec<qosd_core::Resource>>,
    /// Length of each load step, seconds.
    #[arg(long, default_value_t = 2.0)]
    pub step_s: f64,
    /// Highest rate tried, requests/s.
    #[arg(long, default_value_t = 500_000.0)]
    pub max_rps: f64,
    /// Steps measured at the knee load; the knee latency is their median
    /// p99. 0 (the default until it is shown to repeat better on a quiet
    /// machine): read it off the sweep's curve (one step).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=50))]
    pub knee_repeats: u32,
    /// With --knee fitted: how many times the steps the fit rests on are
    /// measured (the later passes after the sweep, down and up the loads);
    /// each load's requests are pooled over its passes, and each pass's own
    /// knee goes into the output (knee_spread). 1: once.
    #[arg(long, default_value_t = sweep::KNEE_PASSES as u32,
          value_parser = clap::value_parser!(u32).range(1..=10))]
    pub knee_passes: u32,
    /// When the knee check still warns after its retries (passes apart,
    /// a poor fit): measure every fitted load once more (one more pass,
    /// ~14 s on the demo) and fit the knee over all passes pooled.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub repeat_on_warning: bool,
    /// Requests a step holds at least (it grows up to 4 × --step-s); e.g.
    /// 1000 for a p99 that rests on 10 requests. 0: every step --step-s.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub min_samples: u64,
    /// Where the knee is put: on the curve fitted over every step
    /// (repeats within ~±10 % on a shared 2-CPU machine, docs/calibration.md),
    /// or read off single steps (the method before; moves with one step's
    /// luck).
    #[arg(long, value_enum, default_value_t = Knee::Fitted)]
    pub knee: Knee,
    /// Append each fitted load's passes (their slowest requests) to FILE,
    /// in the format of the calibration tests' recorded runs.
    #[arg(long, value_name = "FILE")]
    pub record_passes: Option<PathBuf>,
    /// Output file. Default: out/calibration-<scenario>.json.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `--knee`: how the knee is found on a real sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Knee {
    Fitted,
    Steps,
}

/// The highest `--max-rps`: far above what one machine's loopback serves.
const MAX_RPS: f64 = 10_000_000.0;

pub fn run(args: Args) -> anyhow::Result<()> {
    let sc = crate::node::setup::read_scenario(&args.scenario)?;
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
    crate::secs::secs("--step-s", args.step_s, 0.0, 60.0)?;
    if !(args.max_rps > 0.0 && args.max_rps <= MAX_RPS) {
        return Err(usage!(
            "--max-rps {}: expected requests/s in (0, {MAX_RPS}]",
            args.max_rps
        ));
    }
    if let Some(file) = &args.model {
        // The knobs the scenario's real replays turn (`--resources`, then
        // the scenario's `resources:`, then all), so the fit measures them.
        let res = crate::node::setup::resources(&sc, args.resources.as_deref())?;
        return crate::node::fit::run(&sc, args.app.as_deref(), args.step_s, &res, file);
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
            fit_knee: args.knee == Knee::Fitted,
            knee_passes: args.knee_passes as usize,
            repeat_on_warning: args.repeat_on_warning,
            record_passes: args.record_passes.clone(),
            ..Default::default()
        };
        crate::node::sweep::calibrate(&sc, args.app.as_deref(), &o)?
    };
    if let Some(n) = &args.app {
        cal.apps.retain(|k, _| k == n);
    }
    crate::outln!(
        "{:<12} {:>14} {:>12} {:>14} {:>10} {:>14} {:>14}",
        "app",
        "capacity rps",
        "knee rps",
        "knee p99 ms",
        "spread",
        "knee eBPF ms",
        "base p99 ms"
    )?;
    for (n, c) in &cal.apps {
        crate::outln!(
            "{:<12} {:>14.0} {:>12.0} {:>14.3} {:>10} {:>14} {:>14.3}",
            n,
            c.capacity_rps,
            c.knee_rps,
            c.knee_latency_us / 1000.0,
            c.knee_spread
                .as_ref()
                .map_or("-".into(), |k| format!("±{:.0} %", k.spread_pct)),
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
