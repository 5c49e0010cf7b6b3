//! Real-mode `qosd replay` (scaffolding): starts the scenario's servers on
//! this machine, calibrates them (or reads `--calibration`), drives the
//! open-loop load of every app along its shape, feeds the policy with the
//! client latency each interval, and writes the same outputs as `--sim`.
//!
//! Server-side latency comes from the eBPF request sensor (each server's
//! pid, its listening port), client latency from the load generator; the
//! policy is fed the one `--feedback` names. Each app's power is its
//! server processes' share from the power sensor (RAPL, or the model here:
//! an estimate, flagged `energy_is_estimate` in summary.json).
//!
//! The policy's plans are put in force through the daemon's actuation
//! ([`crate::daemon::actuate::Actuation`]: the same code as `qosd run`),
//! on the knobs this machine has; every plan also goes to `plans.jsonl`.
//! Everything is put back when the replay ends, is interrupted, or fails.
//! The originals are journalled in the replay's own state file (default
//! `<out>/state.json`), so that a replay runs beside a `qosd run` daemon
//! (which holds `/run/qosd/state.json`) and a SIGKILLed one is undone by
//! `qosd restore --state-file <out>/state.json`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::Context;
use qosd_core::{
    AppState, Feedback, Limits, Policy, PowerSource, QosTarget, Resource, Share, Snapshot,
};
use qosd_scenarios::calibrate::Calibration;
use qosd_scenarios::load::{self, IntervalReport, Rate};
use qosd_scenarios::scenario::Scenario;
use qosd_scenarios::timeline::{Row, Timeline};
use qosd_scenarios::{output, servers, sweep};
use qosd_sensors::ebpf::{Mode, RequestTracer, TargetOptions, TracerOptions};
use qosd_sensors::power::{PowerConfig, PowerSample, PowerSensor};

use crate::daemon::actuate::Actuation;
use crate::daemon::admit::Peers;
use crate::usage;

pub fn run(
    sc: &Scenario,
    args: &super::replay::Args,
    feedback: Feedback,
    seed: u64,
    policy: &mut dyn Policy,
    out: &Path,
) -> anyhow::Result<()> {
    crate::signals::install()?;
    // Before calibrating or starting servers: a state file held by another
    // qosd stops the run here.
    let state = args
        .state_file
        .clone()
        .unwrap_or_else(|| out.join("state.json"));
    // Absolute, so that the restore hint works from any directory.
    let state = std::path::absolute(&state).unwrap_or(state);
    let mut act = start_actuation(&state)?;
    let cal = match &args.calibration {
        Some(p) => Calibration::read(p).map_err(|e| usage!("{}: {e:#}", p.display()))?,
        None => {
            let o = sweep::SweepOptions {
                seed,
                ..Default::default()
            };
            super::calibrate::real(sc, None, &o)?
        }
    };
    for a in &sc.apps {
        if !cal.apps.contains_key(&a.name) {
            return Err(usage!("calibration has no entry for app {}", a.name));
        }
    }
    let duration = args.duration.unwrap_or(sc.duration_s);
    let scale = sc.duration_s / duration;
    let fixture = super::calibrate::fixture_cmd()?;
    let mut running = Vec::new();
    for a in &sc.apps {
        let s = servers::start(a, &fixture)?;
        eprintln!("started {} ({}, pid {})", a.name, s.addr, s.pid);
        running.push(s);
    }
    // The eBPF request sensor gives the server-side line (and the feedback
    // with --feedback ebpf); without it (not root, no tracefs) the client
    // line alone is drawn, or the run stops if eBPF was to be the feedback.
    let tracer = match RequestTracer::start(TracerOptions::default()) {
        Ok(t) => Some(t),
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
    if let Some(t) = &tracer {
        for s in &running {
            let opts = TargetOptions {
                mode: Mode::Auto,
                ports: vec![s.port],
                follow_children: true,
            };
            t.add_target(s.pid, opts)
                .with_context(|| format!("tracing {} (pid {})", s.name, s.pid))?;
        }
    }
    let knobs: Vec<&str> = Resource::CYCLE
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
        .zip(&running)
        .map(|(a, s)| (a.name.clone(), vec![s.pid as i32]))
        .collect();
    admit_all(&mut act, sc, &pids)?;
    // Opened just before the load starts: its first sample covers the
    // first interval.
    let mut power = RunPower::start();
    let stop = Arc::new(AtomicBool::new(false));
    let mut rxs = Vec::new();
    let mut handles = Vec::new();
    for (i, (a, s)) in sc.apps.iter().zip(&running).enumerate() {
        let cap = cal.apps[&a.name].capacity_rps;
        let shape = a.load.clone();
        let rate = Rate::Profile(Arc::new(move |t| shape.level_at(t * scale) * cap));
        let mut spec = sweep::spec_for(a, &s.addr, 1.0, duration, seed.wrapping_add(i as u64))
            .map_err(|e| usage!("{}: {e}", a.name))?;
        spec.rate = rate;
        spec.interval = Duration::from_millis(sc.interval_ms);
        let (tx, rx) = mpsc::channel::<IntervalReport>();
        handles.push(load::spawn(spec, Some(tx), stop.clone()));
        rxs.push(rx);
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut plans =
        std::fs::File::create(out.join("plans.jsonl")).context("creating plans.jsonl")?;
    let mut tl = Timeline {
        scenario: sc.name.clone(),
        mode: "real".into(),
        feedback: feedback.to_string(),
        policy: policy.name().to_owned(),
        seed,
        interval_s: sc.interval_ms as f64 / 1000.0,
        apps: sc.apps.iter().map(|a| a.name.clone()).collect(),
        energy_is_estimate: power.as_ref().is_some_and(RunPower::is_estimate),
        ..Default::default()
    };
    let nr_iv = ((duration * 1000.0) / sc.interval_ms as f64).round() as usize;
    let node = *act.node();
    for iv in 0..nr_iv {
        // One report per interval from each generator; a generator that
        // ended (or a stop) ends the run.
        let reports: Vec<IntervalReport> = rxs
            .iter()
            .map_while(|rx| {
                rx.recv_timeout(Duration::from_millis(sc.interval_ms * 4 + 2000))
                    .ok()
            })
            .collect();
        if reports.len() < sc.apps.len() || crate::signals::stop_requested() {
            break;
        }
        // Power over the interval the reports just closed.
        let sample = power.as_mut().and_then(|p| p.sample());
        let mut snap = Snapshot {
            node_power_w: sample.as_ref().map(|s| s.node.total_w),
            ..Default::default()
        };
        if let Some(s) = &sample {
            tl.node_power_w.push(s.node.total_w);
        }
        for ((a, r), srv) in sc.apps.iter().zip(reports).zip(&running) {
            let target_us = cal.target_us(a);
            let p99 = r.latency.p99_us.map(|x| x / 1000.0);
            let ebpf_us = tracer
                .as_ref()
                .and_then(|t| t.take_report(srv.pid))
                .and_then(|t| match a.latency {
                    qosd_core::LatencyFrom::Arrival => t.interval.p99_us,
                    qosd_core::LatencyFrom::Service => t.service_interval.p99_us,
                });
            let ebpf = ebpf_us.map(|x| x / 1000.0);
            let fed = if feedback == Feedback::Ebpf {
                ebpf
            } else {
                p99
            };
            // The server's processes (nginx's workers are its children).
            let app_power = sample
                .as_ref()
                .map(|s| s.app(&process_tree(srv.pid), Some(r.latency.rps)));
            let power_w = app_power.as_ref().map(|p| p.power_w);
            // CPU time over the interval ÷ the CPUs it holds, as the daemon
            // computes it (rule policies such as cpu-util.yaml read it).
            let cpu_util = app_power.map_or(0.0, |p| {
                let held = act.cpus(&a.name).map_or(act.nr_online_cpus(), |c| c.len());
                (p.cpus_used / held.max(1) as f64).clamp(0.0, 1.0)
            });
            tl.rows.push(Row {
                t_s: r.t_s,
                app: a.name.clone(),
                offered_rps: r.offered_rps,
                achieved_rps: r.latency.rps,
                client_p99_ms: p99,
                ebpf_p99_ms: ebpf,
                target_ms: target_us.map(|t| t / 1000.0),
                violation: target_us.and_then(|t| fed.map(|l| l * 1000.0 > t)),
                cores: level(&act, &a.name, Resource::Cores),
                freq_mhz: level(&act, &a.name, Resource::Frequency),
                llc_ways: level(&act, &a.name, Resource::CacheWays),
                mb_percent: level(&act, &a.name, Resource::MemoryBandwidth),
                power_w,
                cpu_quota_milli: None,
                be_ops_per_s: None,
            });
            let pct = a.target.as_ref().map_or(99.0, |t| t.percentile);
            snap.apps.push(AppState {
                name: a.name.clone(),
                class: a.class,
                target: target_us.map(|v| QosTarget {
                    percentile: pct,
                    value_us: v,
                }),
                latency_us: fed.map(|ms| ms * 1000.0),
                rps: r.latency.rps,
                cpu_util,
                power_w,
                limits: Limits::default(),
            });
        }
        snap.apps.sort_by(|x, y| x.name.cmp(&y.name));
        let now_ms = ((iv + 1) as u64) * sc.interval_ms;
        policy.observe(now_ms, &snap);
        let current = act.current().clone();
        let plan = policy.decide(now_ms, &snap, &current, &node);
        writeln!(plans, "{}", serde_json::to_string(&plan)?)?;
        if plan.allocations != current {
            for a in act
                .set(&plan.allocations, &pids, false)
                .map_err(anyhow::Error::msg)?
            {
                if let Some(e) = a.error {
                    eprintln!(
                        "applying {}'s allocation failed (it keeps the previous one): {e}",
                        a.app
                    );
                }
            }
        }
        if iv % 10 == 9 {
            let last: Vec<String> = tl.rows[tl.rows.len() - sc.apps.len()..]
                .iter()
                .map(|r| {
                    format!(
                        "{} {:.0} rps p99 {}",
                        r.app,
                        r.achieved_rps,
                        r.client_p99_ms.map_or("-".into(), |v| format!("{v:.2} ms"))
                    )
                })
                .collect();
            eprintln!(
                "[{:>5.0}/{duration:.0} s] {}",
                (iv + 1) as f64 * tl.interval_s,
                last.join(" | ")
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
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
            .map(|(a, s)| {
                let m = t.mode(s.pid).map_or("-".into(), |m| m.to_string());
                format!("{} {m}", a.name)
            })
            .collect();
        eprintln!("eBPF request boundaries: {}", modes.join(", "));
    }
    drop(running); // kills the servers
                   // Keep whole intervals only (a stop may cut the last one short).
    tl.rows
        .truncate(tl.rows.len() / sc.apps.len() * sc.apps.len());
    if power.as_ref().is_some_and(|p| p.failed) {
        // Energy over part of the run would read as the run's: keep none.
        tl.rows.iter_mut().for_each(|r| r.power_w = None);
        tl.node_power_w.clear();
        tl.energy_is_estimate = false;
    }
    let (summary, files) = output::write_run(out, &tl, &cal)?;
    print!("{}", output::summary_table(&summary));
    println!(
        "\nwrote {}\n      {}\n      {} and .png",
        files.timeline_csv.display(),
        files.summary_json.display(),
        files.plot_svg.display()
    );
    Ok(())
}

/// The actuators with their defaults but journalling to `state` (the
/// replay's own state file, not the daemon's), behind the daemon's
/// actuation. Knobs the machine lacks are simply absent from the node.
fn start_actuation(state: &Path) -> anyhow::Result<Actuation> {
    let cfg = qosd_actuators::Config {
        state_file: Some(state.to_owned()),
        ..Default::default()
    };
    let (act, leftovers) = qosd_actuators::Actuators::start(&cfg)
        .map_err(crate::cmd::set::to_anyhow)
        .with_context(|| format!("starting the actuators (state file {})", state.display()))?;
    if !leftovers.is_empty() {
        eprintln!(
            "put back {} setting(s) a previous run left in {}",
            leftovers.len(),
            state.display()
        );
    }
    eprintln!(
        "actuator state: {} (if this replay is killed: qosd restore --state-file {})",
        state.display(),
        state.display()
    );
    let mut act = Actuation::new(act, &Resource::CYCLE).context("reading the CPU topology")?;
    // Groups `qosd-replay<PID>-<app>`: never a daemon's `qosd-<app>`, nor
    // another replay's with the same app names.
    act.set_group_prefix(&format!("replay{}-", std::process::id()));
    Ok(act)
}

/// The power sensor of a real replay: RAPL where the machine has it, else
/// the model (every figure an estimate, flagged in summary.json). A sample
/// that fails ends power for the run (`failed`).
struct RunPower {
    sensor: PowerSensor,
    failed: bool,
}

impl RunPower {
    /// `None` (said on stderr) where the sensor cannot run, e.g. not root:
    /// the power column stays empty and energy_j null.
    fn start() -> Option<RunPower> {
        match PowerSensor::open(&PowerConfig::default(), Path::new("/")) {
            Ok(sensor) => {
                let c = sensor.caps();
                eprintln!(
                    "power: {} ({}), threads weighed by {}",
                    c.backend,
                    if c.source == PowerSource::Model {
                        "an ESTIMATE from utilisation, no RAPL here"
                    } else {
                        "measured"
                    },
                    c.weight
                );
                Some(RunPower {
                    sensor,
                    failed: false,
                })
            }
            Err(e) => {
                eprintln!("power: not available ({e}); no power_w, energy_j null");
                None
            }
        }
    }

    fn is_estimate(&self) -> bool {
        self.sensor.caps().source == PowerSource::Model
    }

    /// Power since the previous sample.
    fn sample(&mut self) -> Option<PowerSample> {
        if self.failed {
            return None;
        }
        match self.sensor.sample() {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("power: sampling failed ({e}); the run keeps no power figure");
                self.failed = true;
                None
            }
        }
    }
}

/// `pid` and its descendants (from /proc/PID/task/TID/children): the
/// processes whose power is the app's.
fn process_tree(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() && out.len() < 4096 {
        let p = out[i];
        i += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            out.extend(
                kids.split_whitespace()
                    .filter_map(|k| k.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// Every app starts with one unit of each pooled knob and the rest shared
/// out by the policy from there (the same admission as `qosd run`).
fn admit_all(
    act: &mut Actuation,
    sc: &Scenario,
    pids: &BTreeMap<String, Vec<i32>>,
) -> anyhow::Result<()> {
    let mut peers = Peers::new();
    let initial = Share {
        nr_cores: 1,
        nr_ways: 1,
        ..Default::default()
    };
    for a in &sc.apps {
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

/// The level of `r` in force for `app`, where the node has that knob.
fn level(act: &Actuation, app: &str, r: Resource) -> Option<u32> {
    if !act.node().has(r) {
        return None;
    }
    act.current().get(app).map(|s| s.get(r))
}
