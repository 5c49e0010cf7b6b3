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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::Context;
use qosd_core::admit::{even_share, Peers};
use qosd_core::control::{Cadence, ControlLoop, Node, RealTime, Recorder, Wake};
use qosd_core::knobs::with_class_defaults;
use qosd_core::{Feedback, Limits, Policy, Resource};
use qosd_scenarios::batch::BatchJob;
use qosd_scenarios::calibrate::Calibration;
use qosd_scenarios::load::{self, IntervalReport, Rate};
use qosd_scenarios::record::RunRecorder;
use qosd_scenarios::scenario::Scenario;
use qosd_scenarios::timeline::Timeline;
use qosd_scenarios::{output, servers, sweep};
use qosd_sensors::ebpf::{Mode, RequestTracer, TargetOptions, TracerOptions};

use super::actuate::Actuation;
use super::power::RunPower;
use super::replay::{server_pids, ReplayApp, ReplayNode};
use super::setup::{batch_cmd, fixture_cmd, resources, run_meta, start_actuation};
use crate::usage;

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
    let mut act = start_actuation(&state, &enabled, sc.node.cfs_period_us)?;
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
    let duration = args.duration.unwrap_or(sc.duration_s);
    let scale = sc.duration_s / duration;
    let fixture = fixture_cmd()?;
    // Per app, in scenario order: its server, or its batch job.
    let mut running: Vec<Option<servers::Running>> = Vec::new();
    let mut jobs: Vec<Option<BatchJob>> = Vec::new();
    for a in &sc.apps {
        match &a.job {
            Some(j) => {
                // Bounded in time even if this process were stopped and
                // never killed it: the run's length and a margin.
                let exit_after_s = duration.ceil() as u64 + JOB_MARGIN_S;
                let job = BatchJob::start(&a.name, &batch_cmd()?, &j.args(100, exit_after_s))?;
                eprintln!("started {} (batch job, pid {})", a.name, job.pid);
                running.push(None);
                jobs.push(Some(job));
            }
            None => {
                let s = servers::start(a, &fixture)?;
                eprintln!("started {} ({}, pid {})", a.name, s.addr, s.pid);
                running.push(Some(s));
                jobs.push(None);
            }
        }
    }
    // The eBPF request sensor gives the server-side line (and the feedback
    // with --feedback ebpf); without it (not root, no tracefs) the client
    // line alone is drawn, or the run stops if eBPF was to be the feedback.
    let tracer = match RequestTracer::start(TracerOptions::default()) {
        Ok(t) => Some(Arc::new(t)),
        Err(e) if feedback == Feedback::Ebpf => {
            return Err(
                anyhow::Error::new(e).context("--feedback ebpf needs the eBPF request sensor")
            )
        }
        Err(e) => {
            eprintln!("eBPF: not available ({e}); the timeline has client latency only");
            None
        }
    };
    // Every process of each server (nginx's workers are the master's
    // children) or job, actuated, its latencies merged as the daemon
    // merges an app's pids.
    let trees: Vec<Vec<i32>> = running
        .iter()
        .zip(&jobs)
        .map(|(s, j)| match (s, j) {
            (Some(s), _) => server_pids(s.pid),
            (None, Some(j)) => server_pids(j.pid),
            (None, None) => Vec::new(),
        })
        .collect();
    if let Some(t) = &tracer {
        // The server's pid with its descendants followed in the kernel
        // (nginx's workers, respawned ones too): one target per server.
        for s in running.iter().flatten() {
            let opts = TargetOptions {
                mode: Mode::Auto,
                ports: vec![s.port],
                follow_children: true,
            };
            t.add_target(s.pid, opts)
                .with_context(|| format!("tracing {} (pid {})", s.name, s.pid))?;
        }
    }
    let knobs: Vec<&str> = enabled
        .iter()
        .filter(|r| act.node().has(**r))
        .map(|r| r.name())
        .collect();
    eprintln!(
        "feedback: {feedback}; knobs: {}",
        if knobs.is_empty() {
            "none on this machine (plans go to plans.jsonl only)".to_string()
        } else {
            knobs.join(", ")
        }
    );
    let pids: BTreeMap<String, Vec<i32>> = sc
        .apps
        .iter()
        .zip(&trees)
        .map(|(a, t)| (a.name.clone(), t.clone()))
        .collect();
    admit_all(&mut act, sc, &pids)?;
    // Opened just before the load starts: its first sample covers the
    // first interval.
    let power = RunPower::start();
    let energy_is_estimate = power.as_ref().is_some_and(RunPower::is_estimate);
    let stop = Arc::new(AtomicBool::new(false));
    let mut apps = Vec::new();
    let mut handles = Vec::new();
    for (i, (((a, s), job), tree)) in sc
        .apps
        .iter()
        .zip(&running)
        .zip(&mut jobs)
        .zip(&trees)
        .enumerate()
    {
        let target = cal.target_us(a);
        let reports = match s {
            Some(s) => {
                let cap = cal.apps[&a.name].capacity_rps;
                let shape = a.load.clone();
                let rate = Rate::Profile(Arc::new(move |t| shape.level_at(t * scale) * cap));
                let mut spec =
                    sweep::spec_for(a, &s.addr, 1.0, duration, seed.wrapping_add(i as u64))
                        .map_err(|e| usage!("{}: {e}", a.name))?;
                spec.rate = rate;
                // One report per monitoring tick: the policy observes every tick.
                spec.interval = Duration::from_millis(sc.monitor_ms);
                let (tx, rx) = mpsc::channel::<IntervalReport>();
                handles.push(load::spawn(spec, Some(tx), stop.clone()));
                Some(rx)
            }
            None => None,
        };
        apps.push(ReplayApp {
            spec: a.clone(),
            pids: tree.clone(),
            reports,
            job: job.take(),
            client_target_us: target,
            slo: cal.slo(a),
        });
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let plans = std::fs::File::create(out.join("plans.jsonl")).context("creating plans.jsonl")?;
    let tl = Timeline {
        scenario: sc.name.clone(),
        mode: "real".into(),
        feedback: feedback.to_string(),
        policy: policy.name().to_owned(),
        seed,
        interval_s: sc.interval_ms as f64 / 1000.0,
        apps: sc.apps.iter().map(|a| a.name.clone()).collect(),
        energy_is_estimate,
        ..Default::default()
    };
    let n_apps = sc.apps.len();
    let mut rec = RunRecorder::new(tl, *act.node())
        .with_plans(Box::new(std::io::BufWriter::new(plans)))
        .on_interval(Box::new(move |tl| progress(tl, n_apps, duration)));
    let cadence = Cadence {
        monitor_ms: sc.monitor_ms,
        interval_ms: sc.interval_ms,
    };
    let nr_slots = cadence.ticks_per_decision() as usize;
    let mut node = ReplayNode::new(apps, act, tracer.clone(), power, feedback, nr_slots);
    let mut ctl = ControlLoop::new(policy);
    let nr_iv = ((duration * 1000.0) / sc.interval_ms as f64).round() as u64;
    let (cpu0, t0) = (node.job_cpu_s(), Instant::now());
    drive(&clock, &mut ctl, &mut node, &mut rec, cadence, nr_iv);
    let be_cpus = job_cpus(&cpu0, &node.job_cpu_s(), t0.elapsed().as_secs_f64());
    for n in node.notes.drain(..) {
        eprintln!("{n}");
    }
    rec.finish(ctl.counters());
    let power_failed = node.power_failed();
    let mut tl = std::mem::take(&mut rec.tl);
    tl.meta.extend(run_meta(sc, args.policy));
    tl.meta.insert(
        "resources".into(),
        serde_json::to_value(&knobs).unwrap_or_default(),
    );
    if !be_cpus.is_empty() {
        // What the batch jobs received: CPU time over the run ÷ its length.
        tl.meta.insert(
            "be_cpus_used".into(),
            serde_json::to_value(&be_cpus).unwrap_or_default(),
        );
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    let (mut act, jobs) = node.into_parts();
    match act.restore_all() {
        Ok(ch) if !ch.is_empty() => eprintln!("restored {} setting(s)", ch.len()),
        Ok(_) => {}
        Err(e) => eprintln!(
            "restoring the knobs: {e} (run `qosd restore --state-file {}`)",
            state.display()
        ),
    }
    // Dropping `act` releases the state file's lock. Everything is back: the
    // lock file is all that is left of the journal; it is not an output.
    drop(act);
    if !state.exists() {
        let _ = std::fs::remove_file(state.with_extension("lock"));
    }
    if let Some(t) = &tracer {
        let modes: Vec<String> = sc
            .apps
            .iter()
            .zip(&running)
            .filter_map(|(a, s)| Some((a, s.as_ref()?)))
            .map(|(a, s)| {
                let m = t.mode(s.pid).map_or("-".into(), |m| m.to_string());
                format!("{} {m}", a.name)
            })
            .collect();
        eprintln!("eBPF request boundaries: {}", modes.join(", "));
    }
    drop(running); // kills the servers
    drop(jobs); // and the batch jobs
                // Keep whole intervals only (a stop may cut the last one short).
    tl.rows
        .truncate(tl.rows.len() / sc.apps.len() * sc.apps.len());
    if power_failed {
        // Energy over part of the run would read as the run's: keep none.
        tl.rows.iter_mut().for_each(|r| r.power_w = None);
        tl.node_power_w.clear();
        tl.energy_is_estimate = false;
    }
    let (summary, files) = output::write_run(out, &tl, &cal)?;
    crate::out!("{}", output::summary_table(&summary))?;
    crate::outln!(
        "\nwrote {}\n      {}\n      {} and .png",
        files.timeline_csv.display(),
        files.summary_json.display(),
        files.plot_svg.display()
    )?;
    Ok(())
}

/// Seconds a batch job outlives the run's length at most.
const JOB_MARGIN_S: u64 = 30;

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

/// The real replay's driver of the one real-time loop
/// ([`ControlLoop::run_realtime`]): it sleeps to each tick unless a load
/// generator ended or a signal asked to stop.
struct Clocked<'a> {
    node: &'a mut ReplayNode,
    rec: &'a mut RunRecorder,
}

impl RealTime for Clocked<'_> {
    fn parts(&mut self) -> (&mut dyn Node, &mut dyn Recorder) {
        (&mut *self.node, &mut *self.rec)
    }

    async fn wait(&mut self, due: Instant) -> Wake {
        if self.node.ended || crate::signals::stop_requested() {
            return Wake::Stop("stopped".into());
        }
        tokio::time::sleep_until(due.into()).await;
        Wake::Due
    }
}

/// Runs the loop on the real clock for `nr_intervals` decision intervals
/// or until it is stopped.
fn drive(
    clock: &tokio::runtime::Runtime,
    ctl: &mut ControlLoop<&mut dyn Policy>,
    node: &mut ReplayNode,
    rec: &mut RunRecorder,
    cadence: Cadence,
    nr_intervals: u64,
) {
    let end = nr_intervals * cadence.ticks_per_decision();
    let mut d = Clocked { node, rec };
    clock.block_on(ctl.run_realtime(&mut d, cadence, Instant::now(), Some(end)));
}

/// A progress line every 10 decision intervals.
fn progress(tl: &Timeline, nr_apps: usize, duration: f64) {
    let n = tl.rows.len() / nr_apps.max(1);
    if n == 0 || !n.is_multiple_of(10) {
        return;
    }
    let last: Vec<String> = tl.rows[tl.rows.len() - nr_apps..]
        .iter()
        .map(|r| match r.be_ops_per_s {
            // A batch job: its throughput and the quota it ran under.
            Some(ops) => format!(
                "{} {ops:.0} ops/s quota {}",
                r.app,
                r.cpu_quota_milli
                    .map_or("-".into(), |q| format!("{:.1}", f64::from(q) / 1000.0))
            ),
            None => format!(
                "{} {:.0} rps p99 {}{}",
                r.app,
                r.achieved_rps,
                r.client_p99_ms.map_or("-".into(), |v| format!("{v:.2} ms")),
                r.cpu_quota_milli.map_or(String::new(), |q| format!(
                    " quota {:.1}",
                    f64::from(q) / 1000.0
                ))
            ),
        })
        .collect();
    eprintln!(
        "[{:>5.0}/{duration:.0} s] {}",
        n as f64 * tl.interval_s,
        last.join(" | ")
    );
}

/// Every app is admitted in scenario order with its even share of the
/// node (`qosd_core::admit::even_share`), by the daemon's admission rule:
/// the same start as the simulated node's.
fn admit_all(
    act: &mut Actuation,
    sc: &Scenario,
    pids: &BTreeMap<String, Vec<i32>>,
) -> anyhow::Result<()> {
    let mut peers = Peers::new();
    let node = *act.node();
    for (i, a) in sc.apps.iter().enumerate() {
        let initial = with_class_defaults(even_share(&node, sc.apps.len(), i), a.class);
        let (plan, _) = act
            .admit(&a.name, initial, Limits::default(), &peers)
            .map_err(|e| anyhow::anyhow!("admitting {}: {e}", a.name))?;
        let admitted: BTreeMap<String, Vec<i32>> = pids
            .iter()
            .filter(|(n, _)| plan.contains_key(*n))
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect();
        for r in act
            .set(&plan, &admitted, false)
            .map_err(anyhow::Error::msg)?
        {
            if let Some(e) = r.error {
                anyhow::bail!("applying {}'s start allocation: {e}", r.app);
            }
        }
        peers.insert(a.name.clone(), (a.class, Limits::default()));
    }
    Ok(())
}
