//! `qosd calibrate SCENARIO --model FILE`: fit each app's sim model on this
//! machine and write it for `qosd replay --sim --model FILE`. Every server
//! runs a few load steps at each of a few allocations (1 CPU; 2 CPUs; half
//! a CPU of quota), put in force through the replay's actuators (cpuset,
//! CFS quota) and put back at the end; each step records the client and
//! eBPF percentiles, the server's CPU time and its busy threads. A batch
//! job runs a few seconds at the same allocations. The fitting itself is
//! `qosd_scenarios::sim::fit` (pure, tested on synthetic points).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use qosd_core::{Allocations, Resource, Share};
use qosd_scenarios::batch::BatchJob;
use qosd_scenarios::scenario::{AppSpec, Scenario, SimNode};
use qosd_scenarios::servers;
use qosd_scenarios::sim::fit::{self, JobPoint, ServerPoint};
use qosd_scenarios::sim::fitted::ModelFile;
use qosd_scenarios::sim::model::SimModel;
use qosd_scenarios::sweep::{self, SweepOptions};
use qosd_sensors::ebpf::{RequestTracer, TracerOptions};
use qosd_sensors::procfs::Procfs;

use super::actuate::Actuation;
use super::latency::from_tracer;
use super::replay::trace_server;
use super::step_cpu::{self, cpu};

/// Load steps of a server at each allocation, as fractions of the
/// capacity expected there (the last one saturates it).
const LOADS: [f64; 4] = [0.25, 0.5, 0.75, 1.4];

/// Allocations measured: (cores, quota milli-CPUs; the quota is never
/// above the cores, so "no quota" is the cores' worth). Without a cores
/// knob the apps share every CPU and quota is what varies: all of them,
/// one CPU's worth and half of one.
fn allocations(nr_cpus: u32, cores: bool, quota: bool) -> Vec<(u32, u32)> {
    let one = if cores { 1 } else { nr_cpus };
    let mut v = vec![(one, one * 1000)];
    if cores && nr_cpus >= 2 {
        v.push((2, 2000));
    }
    if !cores && quota && nr_cpus >= 2 {
        v.push((one, 1000));
    }
    if quota {
        v.push((one, 500));
    }
    v
}

/// Puts `(cores, quota)` in force for one app's processes.
fn put(act: &mut Actuation, app: &str, pids: &[i32], cores: u32, quota: u32) -> anyhow::Result<()> {
    let node = *act.node();
    let share = Share {
        nr_cores: if node.has(Resource::Cores) { cores } else { 0 },
        cpu_quota_milli: if node.has(Resource::CpuQuota) {
            quota
        } else {
            0
        },
        freq_mhz: node.range(Resource::Frequency).map_or(0, |r| r.1),
        ..Default::default()
    };
    let plan: Allocations = [(app.to_owned(), share)].into();
    let pids = BTreeMap::from([(app.to_owned(), pids.to_vec())]);
    for r in act.set(&plan, &pids, true).map_err(anyhow::Error::msg)? {
        if let Some(e) = r.error {
            anyhow::bail!("{app}: putting {cores} core(s), quota {quota} m-CPU in force: {e}");
        }
    }
    Ok(())
}

/// What the fitted node offers: this machine's CPUs and the knobs it has,
/// of those `resources` allows (no cores knob: the apps share the CPUs).
fn node_of(act: &Actuation, resources: &[Resource]) -> SimNode {
    let caps = act.node();
    let on = |r: Resource| caps.has(r) && resources.contains(&r);
    let freq = caps.freq.filter(|_| on(Resource::Frequency));
    SimNode {
        nr_cores: act.nr_online_cpus() as u32,
        shared_cpus: !on(Resource::Cores),
        quota_step_milli: caps
            .quota
            .filter(|_| on(Resource::CpuQuota))
            .map_or(0, |q| q.step_milli),
        // A node without the knob runs at one frequency (the model's unit).
        freq_min_mhz: freq.map_or(3000, |f| f.min_mhz),
        freq_max_mhz: freq.map_or(3000, |f| f.max_mhz),
        freq_step_mhz: freq.map_or(100, |f| f.step_mhz.max(1)),
        nr_ways: if on(Resource::CacheWays) {
            caps.nr_ways
        } else {
            0
        },
        ..SimNode::default()
    }
}

struct Ctx<'a> {
    act: &'a mut Actuation,
    tracer: Option<&'a RequestTracer>,
    procfs: Procfs,
    allocs: Vec<(u32, u32)>,
    step_s: f64,
    seed: u64,
    node: SimNode,
}

/// Load steps of one server at every allocation.
fn server_points(c: &mut Ctx, app: &AppSpec) -> anyhow::Result<Vec<ServerPoint>> {
    let fixture = super::setup::fixture_cmd()?;
    let srv = servers::start(app, &fixture)?;
    eprintln!("fitting {} ({}, pid {})", app.name, srv.addr, srv.pid);
    let pids = trace_server(c.tracer, srv.pid, srv.port);
    let pct = app.target.as_ref().map_or(99.0, |t| t.percentile);
    let fig = crate::config::figure_of(app.latency);
    // A short drain: a saturated step's achieved rate is then close to
    // the rate the server kept (replies after the drain are lost, not
    // counted over the step).
    let o = SweepOptions {
        step_s: c.step_s,
        seed: c.seed,
        drain_s: 0.1,
        // Its steps are fitted as measured (the model's own figures).
        min_samples: 0,
        ..Default::default()
    };
    let mut points = Vec::new();
    // CPU time per request, first from a light probe (an overestimate:
    // wake-ups), then from the busiest unsaturated step so far.
    let mut s_us: Option<f64> = None;
    let result = (|| -> anyhow::Result<()> {
        for &(cores, quota) in &c.allocs.clone() {
            put(c.act, &app.name, &pids, cores, quota)?;
            let cpus = f64::from(cores).min(f64::from(quota) / 1000.0);
            let mut loads: Vec<Option<f64>> = LOADS.iter().map(|&x| Some(x)).collect();
            if s_us.is_none() {
                loads.insert(0, None); // the probe
            }
            for x in loads {
                let rps = match (x, s_us) {
                    (Some(x), Some(s)) => x * cpus * 1e6 / s,
                    _ => 100.0,
                };
                if let Some(t) = c.tracer {
                    let _ = from_tracer(t, &pids, fig); // drop what came before
                }
                let cpu0 = cpu(&c.procfs, &pids).0;
                let (p, threads) = step_cpu::during(&c.procfs, &pids, || {
                    sweep::measure(app, &srv.addr, rps, &o, pct)
                });
                let (p, _err) =
                    p.with_context(|| format!("{}: load step at {rps:.0} rps", app.name))?;
                let cpu1 = cpu(&c.procfs, &pids).0;
                // The share of a CPU over the load itself (not the drain
                // and backlog wait after it).
                let busy = threads.busy(c.step_s);
                let ebpf = c.tracer.and_then(|t| {
                    let (h, _) = from_tracer(t, &pids, fig);
                    h.percentile(pct).map(|v| v as f64 / 1e3)
                });
                let pt = ServerPoint {
                    nr_cores: cores,
                    quota_milli: quota,
                    offered_rps: p.offered_rps,
                    achieved_rps: p.achieved_rps,
                    client_us: p.latency_us,
                    ebpf_us: ebpf,
                    cpu_s: cpu1 - cpu0,
                    wall_s: c.step_s,
                    busy_threads: busy,
                };
                let per_req = pt.cpu_s / (pt.achieved_rps * pt.wall_s).max(1.0) * 1e6;
                eprintln!(
                    "  {cores} core(s) quota {:.1} CPU  offered {:>8.0}  achieved {:>8.0} rps  p99 {:>8.3} ms  eBPF {}  CPU/req {per_req:.0} us  busy threads {busy}",
                    f64::from(quota) / 1000.0,
                    pt.offered_rps,
                    pt.achieved_rps,
                    pt.client_us / 1000.0,
                    ebpf.map_or("-".into(), |v| format!("{:.3} ms", v / 1000.0)),
                );
                if x.is_none() {
                    s_us = Some(per_req.max(1.0));
                } else if x.is_some_and(|x| x <= 0.8) && pt.achieved_rps >= 0.9 * pt.offered_rps {
                    s_us = Some(per_req.max(1.0));
                    points.push(pt);
                } else {
                    points.push(pt);
                }
            }
        }
        Ok(())
    })();
    if let Some(t) = c.tracer {
        for &pid in &pids {
            let _ = t.remove_target(pid as u32);
        }
    }
    let released = c.act.release(&app.name, &pids);
    result?;
    released.map_err(|e| anyhow::anyhow!("{}: putting its knobs back: {e}", app.name))?;
    Ok(points)
}

/// A batch job at every allocation.
fn job_points(c: &mut Ctx, app: &AppSpec) -> anyhow::Result<Vec<JobPoint>> {
    let Some(job) = &app.job else {
        return Ok(Vec::new());
    };
    let exe = std::env::current_exe().context("locating the qosd binary")?;
    let cmd = vec![exe.display().to_string(), "batch".into()];
    let budget = (c.allocs.len() as f64 * (c.step_s + 1.0) + 30.0) as u64;
    let j = BatchJob::start(&app.name, &cmd, &job.args(100, budget))?;
    let pids = vec![j.pid as i32];
    eprintln!("fitting {} (batch job, pid {})", app.name, j.pid);
    let mut points = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        for &(cores, quota) in &c.allocs.clone() {
            put(c.act, &app.name, &pids, cores, quota)?;
            // One CFS period and a report to settle, then the window: the
            // job's own count and clock, and its CPU time, over it.
            std::thread::sleep(Duration::from_millis(300));
            let (p0, cpu0, t0) = (j.progress(), cpu(&c.procfs, &pids).0, Instant::now());
            std::thread::sleep(Duration::from_secs_f64(c.step_s));
            // A starved job may report late: wait for a line past the window.
            let mut p1 = j.progress();
            while p1.map(|p| p.1) <= p0.map(|p| p.1) && t0.elapsed().as_secs_f64() < c.step_s + 5.0
            {
                std::thread::sleep(Duration::from_millis(50));
                p1 = j.progress();
            }
            let used = (cpu(&c.procfs, &pids).0 - cpu0) / t0.elapsed().as_secs_f64();
            let ops = match (p0, p1) {
                (Some((n0, us0)), Some((n1, us1))) if us1 > us0 => {
                    n1.saturating_sub(n0) as f64 * 1e6 / (us1 - us0) as f64
                }
                _ => anyhow::bail!("{}: the job reported no progress", app.name),
            };
            eprintln!(
                "  {cores} core(s) quota {:.1} CPU  {ops:>9.0} ops/s on {used:.2} CPUs",
                f64::from(quota) / 1000.0
            );
            points.push(JobPoint {
                nr_cores: cores,
                quota_milli: quota,
                ops_per_s: ops,
                cpus_used: used,
            });
        }
        Ok(())
    })();
    let released = c.act.release(&app.name, &pids);
    result?;
    released.map_err(|e| anyhow::anyhow!("{}: putting its knobs back: {e}", app.name))?;
    Ok(points)
}

/// Fits every app (or `only`) of `sc` and writes the model to `file`.
pub fn run(
    sc: &Scenario,
    only: Option<&str>,
    step_s: f64,
    resources: &[Resource],
    file: &Path,
) -> anyhow::Result<()> {
    crate::signals::install()?;
    let state = file.with_extension("state.json");
    let state = std::path::absolute(&state).unwrap_or(state);
    let mut act = super::setup::start_actuation(&state, resources, &sc.node)?;
    let node = node_of(&act, resources);
    let caps = *act.node();
    let allocs = allocations(
        node.nr_cores,
        caps.has(Resource::Cores),
        caps.has(Resource::CpuQuota),
    );
    let tracer = match RequestTracer::start(TracerOptions::default()) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("eBPF: not available ({e}); fitting on client latency only");
            None
        }
    };
    let mut model = ModelFile {
        source: format!(
            "qosd calibrate --model on {} ({} CPUs), {} s steps",
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .unwrap_or_default()
                .trim(),
            node.nr_cores,
            step_s
        ),
        node: node.clone(),
        apps: BTreeMap::new(),
        checks: BTreeMap::new(),
    };
    let mut c = Ctx {
        act: &mut act,
        tracer: tracer.as_ref(),
        procfs: Procfs::new("/"),
        allocs,
        step_s,
        seed: sc.seed,
        node,
    };
    let result = (|| -> anyhow::Result<()> {
        for app in sc.apps.iter().filter(|a| only.is_none_or(|n| n == a.name)) {
            if crate::signals::stop_requested() {
                anyhow::bail!("interrupted");
            }
            let fitted = if let Some(job) = &app.job {
                let pts = job_points(&mut c, app)?;
                let threads = match job {
                    qosd_scenarios::scenario::JobSpec::Hash { threads, .. } => *threads,
                };
                fit::fit_job(&pts, threads, &c.node)
            } else {
                let pts = server_points(&mut c, app)?;
                let pct = app.target.as_ref().map_or(99.0, |t| t.percentile);
                fit::fit_server(&pts, pct, &SimModel::of(app), &c.node)
            };
            let (spec, checks) =
                fitted.with_context(|| format!("{}: no usable measurement to fit", app.name))?;
            model.apps.insert(app.name.clone(), spec);
            model.checks.insert(app.name.clone(), checks);
        }
        Ok(())
    })();
    super::setup::finish_actuation(act, &state);
    result?;
    print_checks(&model);
    // Only what was fitted: unset (null) values are the defaults anyway.
    let mut v = serde_json::to_value(&model).context("serialising the model")?;
    strip_nulls(&mut v);
    let text = format!(
        "# Sim model fitted by `qosd calibrate --model` (read by `qosd replay --sim --model`).\n{}",
        serde_yaml_ng::to_string(&v).context("serialising the model")?
    );
    if let Some(d) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    std::fs::write(file, text).with_context(|| format!("writing {}", file.display()))?;
    // What is written must read back: the same validation as --model.
    ModelFile::from_file(file).map_err(|e| anyhow::anyhow!("the written model: {e}"))?;
    println!("wrote {} ({})", file.display(), model.source);
    Ok(())
}

fn strip_nulls(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

fn print_checks(m: &ModelFile) {
    println!(
        "{:<12} {:>6} {:>9} {:>12} {:>12} {:>7}",
        "app", "cores", "quota", "measured", "model", "error"
    );
    for (app, checks) in &m.checks {
        for c in checks {
            println!(
                "{:<12} {:>6} {:>9.1} {:>12.0} {:>12.0} {:>6.0}%  {}",
                app,
                c.nr_cores,
                f64::from(c.quota_milli) / 1000.0,
                c.measured,
                c.model,
                (c.model / c.measured.max(1e-9) - 1.0) * 100.0,
                c.unit
            );
        }
    }
}
