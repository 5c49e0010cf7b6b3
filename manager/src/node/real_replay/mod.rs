//! Real-mode `qosd replay`: starts the scenario's servers on this machine,
//! calibrates them (or reads `--calibration`), drives the open-loop load
//! of every app along its shape, and runs the one control loop
//! ([`ControlLoop`]) on the real clock over a [`ReplayNode`]: the same
//! observe-every-tick, decide, apply and decision log (`plans.jsonl`) as
//! the daemon and `--sim`, and the same outputs as `--sim`.
//!
//! Server-side latency comes from the eBPF request sensor (every process
//! of each server, its listening port), client latency from the load
//! generator; the policy is fed the one `--feedback` names. Each app's
//! power is its server processes' share from the power sensor (RAPL, or
//! the model here: an estimate, flagged `energy_is_estimate`).
//!
//! Plans are put in force through the daemon's actuation
//! ([`crate::node::actuate::Actuation`]), on the knobs this machine has.
//! Everything is put back when the replay ends, is interrupted, or fails.
//! The originals are journalled in the replay's own state file (default
//! `<out>/state.json`), so that a replay runs beside a `qosd run` daemon
//! (which holds `/run/qosd/state.json`) and a SIGKILLed one is undone by
//! `qosd restore --state-file <out>/state.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use qosd_core::control::{Cadence, ControlLoop};
use qosd_core::{Feedback, Policy, Resource};
use qosd_scenarios::calibrate::{Calibration, FLOOR_WARN_SHARE};
use qosd_scenarios::record::RunRecorder;
use qosd_scenarios::scenario::Scenario;
use qosd_scenarios::timeline::Timeline;
use qosd_scenarios::{output, sweep};
use qosd_sensors::procfs::Procfs;

use super::actuate::Actuation;
use super::power::RunPower;
use super::replay::ReplayNode;
use super::setup::{resources, run_meta, start_actuation};
use crate::usage;

mod clock;
mod start;
use clock::{drive, progress};
use start::{admit_all, tracer, Load, Processes};

/// What `qosd replay` on real servers was asked for beside the scenario.
pub struct RealOptions<'a> {
    /// `--resources`: the knobs the policy may turn.
    pub resources: Option<&'a [Resource]>,
    /// `--state-file`; default `<out>/state.json`.
    pub state_file: Option<PathBuf>,
    /// `--calibration`: read instead of calibrating.
    pub calibration: Option<PathBuf>,
    /// `--duration`, seconds.
    pub duration: Option<f64>,
    /// `--policy` as given (recorded in summary.json).
    pub policy: Option<&'a str>,
    /// `--aggregate`: where the request sensor aggregates.
    pub aggregate: qosd_sensors::ebpf::Aggregate,
}

pub fn run(
    sc: &Scenario,
    args: &RealOptions,
    feedback: Feedback,
    seed: u64,
    policy: &mut dyn Policy,
    out: &Path,
) -> anyhow::Result<()> {
    crate::signals::install()?;
    // The loop's clock, made before anything is touched.
    let clock = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .context("starting the clock's runtime")?;
    let enabled = resources(sc, args.resources)?;
    // Before calibrating or starting servers: a state file held by another
    // qosd stops the run here.
    let state = args
        .state_file
        .clone()
        .unwrap_or_else(|| out.join("state.json"));
    // Absolute, so that the restore hint works from any directory.
    let state = std::path::absolute(&state).unwrap_or(state);
    let mut act = start_actuation(&state, &enabled, &sc.node)?;
    let cal = calibration(sc, args, seed)?;
    let duration = args.duration.unwrap_or(sc.duration_s);
    let mut procs = Processes::start(sc, duration)?;
    let tracer = tracer(feedback, args.aggregate, &procs.servers)?;
    let knobs: Vec<String> = enabled
        .iter()
        .filter(|r| act.node().has(**r))
        .map(|r| r.name().to_owned())
        .collect();
    eprintln!(
        "feedback: {feedback}; knobs: {}",
        if knobs.is_empty() {
            "none on this machine (plans go to plans.jsonl only)".to_string()
        } else {
            knobs.join(", ")
        }
    );
    warn_floor(sc, &cal, act.nr_online_cpus());
    let pids = sc
        .apps
        .iter()
        .map(|a| a.name.clone())
        .zip(procs.trees.clone());
    admit_all(&mut act, sc, &pids.collect())?;
    // Opened just before the load starts: its first sample covers the
    // first interval.
    let power = RunPower::start();
    let energy_is_estimate = power.as_ref().is_some_and(RunPower::is_estimate);
    let mut load = Load::start(sc, &mut procs, &cal, duration, seed)?;
    let mut rec = recorder(sc, out, feedback, policy.name(), seed, &act, duration)?;
    rec.tl.energy_is_estimate = energy_is_estimate;
    let cadence = Cadence {
        monitor_ms: sc.monitor_ms,
        interval_ms: sc.interval_ms,
    };
    let nr_slots = cadence.ticks_per_decision() as usize;
    let apps = std::mem::take(&mut load.apps);
    let mut node = ReplayNode::new(apps, act, tracer.clone(), power, feedback, nr_slots);
    let mut ctl = ControlLoop::new(policy);
    let nr_iv = ((duration * 1000.0) / sc.interval_ms as f64).round() as u64;
    let loadavg = || Procfs::new("/").loadavg_1m().ok();
    let (cpu0, t0, load0) = (node.job_cpu_s(), Instant::now(), loadavg());
    drive(&clock, &mut ctl, &mut node, &mut rec, cadence, nr_iv);
    let be_cpus = job_cpus(&cpu0, &node.job_cpu_s(), t0.elapsed().as_secs_f64());
    let load1 = loadavg();
    for n in node.notes.drain(..) {
        eprintln!("{n}");
    }
    rec.finish(ctl.counters());
    let power_failed = node.power_failed();
    let mut tl = std::mem::take(&mut rec.tl);
    tl.meta.extend(run_meta(sc, args.policy));
    what_the_run_had(&mut tl, &knobs, &be_cpus, (load0, load1));
    load.stop();
    restore(node, &state, &mut procs);
    if let Some(t) = &tracer {
        eprintln!("eBPF request boundaries: {}", procs.modes(sc, t));
    }
    drop(procs); // kills the servers and the batch jobs
    write_outputs(out, tl, &cal, sc.apps.len(), power_failed)
}

/// The run's recorder: its timeline, `plans.jsonl` in `out`, a progress
/// line every 10 intervals.
fn recorder(
    sc: &Scenario,
    out: &Path,
    feedback: Feedback,
    policy: &str,
    seed: u64,
    act: &Actuation,
    duration: f64,
) -> anyhow::Result<RunRecorder> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let plans = std::fs::File::create(out.join("plans.jsonl")).context("creating plans.jsonl")?;
    let tl = Timeline {
        scenario: sc.name.clone(),
        mode: "real".into(),
        feedback: feedback.to_string(),
        policy: policy.to_owned(),
        seed,
        interval_s: sc.interval_ms as f64 / 1000.0,
        apps: sc.apps.iter().map(|a| a.name.clone()).collect(),
        ..Default::default()
    };
    let n_apps = sc.apps.len();
    Ok(RunRecorder::new(tl, *act.node())
        .with_plans(Box::new(std::io::BufWriter::new(plans)))
        .on_interval(Box::new(move |tl| progress(tl, n_apps, duration))))
}

/// The calibration: `--calibration`, else measured now; every app that
/// takes load must have an entry.
fn calibration(sc: &Scenario, args: &RealOptions, seed: u64) -> anyhow::Result<Calibration> {
    let cal = match &args.calibration {
        Some(p) => Calibration::read(p).map_err(|e| usage!("{}: {e:#}", p.display()))?,
        None => {
            let o = sweep::SweepOptions {
                seed,
                ..Default::default()
            };
            super::sweep::calibrate(sc, None, &o)?
        }
    };
    // Batch jobs take no load: nothing to calibrate.
    for a in sc.apps.iter().filter(|a| a.job.is_none()) {
        if !cal.apps.contains_key(&a.name) {
            return Err(usage!("calibration has no entry for app {}", a.name));
        }
    }
    Ok(cal)
}

/// Puts every knob back (the batch jobs go back to `procs`, to be killed
/// with the servers after the restore); the state file's lock goes too
/// once nothing is left in the journal.
fn restore(node: ReplayNode, state: &Path, procs: &mut Processes) {
    let (act, jobs) = node.into_parts();
    procs.jobs = jobs.into_iter().map(Some).collect();
    crate::node::setup::finish_actuation(act, state);
}

/// Writes the timeline, summary and plots and prints the summary.
fn write_outputs(
    out: &Path,
    mut tl: Timeline,
    cal: &Calibration,
    nr_apps: usize,
    power_failed: bool,
) -> anyhow::Result<()> {
    // Keep whole intervals only (a stop may cut the last one short).
    tl.rows.truncate(tl.rows.len() / nr_apps * nr_apps);
    if power_failed {
        // Energy over part of the run would read as the run's: keep none.
        tl.rows.iter_mut().for_each(|r| r.power_w = None);
        tl.node_power_w.clear();
        tl.energy_is_estimate = false;
    }
    let (summary, files) = output::write_run(out, &tl, cal)?;
    crate::out!("{}", output::summary_table(&summary))?;
    crate::outln!(
        "\nwrote {}\n      {}\n      {} and .png",
        files.timeline_csv.display(),
        files.summary_json.display(),
        files.plot_svg.display()
    )?;
    Ok(())
}

/// What the run had, into the timeline's meta: the knobs it turned, the
/// CPUs each batch job received, and the node's load average before and
/// after.
fn what_the_run_had(
    tl: &mut Timeline,
    knobs: &[String],
    be_cpus: &BTreeMap<String, f64>,
    loadavg: (Option<f64>, Option<f64>),
) {
    tl.meta.insert(
        "resources".into(),
        serde_json::to_value(knobs).unwrap_or_default(),
    );
    if !be_cpus.is_empty() {
        // What the batch jobs received: CPU time over the run ÷ its length.
        tl.meta.insert(
            "be_cpus_used".into(),
            serde_json::to_value(be_cpus).unwrap_or_default(),
        );
    }
    if let (Some(a), Some(b)) = loadavg {
        // How much else wanted the CPUs: a batch job in the idle class gets
        // only what every other task on the node leaves (`qosd compare`
        // says so when it used far less than its quota).
        tl.meta
            .insert("loadavg_1m".into(), serde_json::json!([a, b]));
    }
}

/// Mean CPUs each batch job used between two readings `secs` apart.
fn job_cpus(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    secs: f64,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(app, a)| Some((app.clone(), (a - before.get(app)?) / secs.max(1e-9))))
        .collect()
}

/// Says where an LC app's own calibrated curve puts its p99 near its
/// target at the scenario's peak on every CPU: violations there are the
/// app's own tail, which no allocation removes (docs/sharing.md, "What
/// hurts search at the demo's peak").
fn warn_floor(sc: &Scenario, cal: &Calibration, cpus: usize) {
    for a in &sc.apps {
        let Some(f) = cal.peak_floor(a, cpus as f64) else {
            continue;
        };
        if f.share() < FLOOR_WARN_SHARE {
            continue;
        }
        let at = f.latency_us.map_or_else(
            || "past the highest load calibrated".to_owned(),
            |l| {
                format!(
                    "{:.2} ms ({:.0} % of the target)",
                    l / 1000.0,
                    f.share() * 100.0
                )
            },
        );
        eprintln!(
            "note: {}'s calibrated p99 at its peak ({:.0} req/s) on all {cpus} CPUs is {at}, \
             target {:.2} ms: intervals near the peak will cross the target whatever the \
             policy does",
            a.name,
            f.rps,
            f.target_us / 1000.0
        );
    }
}
