//! What a real replay starts before its loop: the scenario's servers and
//! batch jobs, the eBPF request sensor on the servers, every app admitted
//! with its even share, and the open-loop load on every server.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::Context;
use qosd_core::admit::{even_share, Peers};
use qosd_core::knobs::with_class_defaults;
use qosd_core::{Feedback, Limits};
use qosd_scenarios::batch::BatchJob;
use qosd_scenarios::calibrate::Calibration;
use qosd_scenarios::load::{self, IntervalReport, Rate};
use qosd_scenarios::scenario::Scenario;
use qosd_scenarios::{servers, sweep};
use qosd_sensors::ebpf::{Mode, RequestTracer, TargetOptions, TracerOptions};

use crate::node::actuate::Actuation;
use crate::node::replay::{server_pids, ReplayApp};
use crate::node::setup::{batch_cmd, fixture_cmd};
use crate::usage;

/// Seconds a batch job outlives the run's length at most.
const JOB_MARGIN_S: u64 = 30;

/// The scenario's processes, per app in scenario order: its server or its
/// batch job (killed when dropped), and every pid of it.
pub(super) struct Processes {
    pub(super) servers: Vec<Option<servers::Running>>,
    pub(super) jobs: Vec<Option<BatchJob>>,
    /// Every process of each server (nginx's workers are the master's
    /// children) or job: actuated, its latencies merged as the daemon
    /// merges an app's pids.
    pub(super) trees: Vec<Vec<i32>>,
}

impl Processes {
    pub(super) fn start(sc: &Scenario, duration: f64) -> anyhow::Result<Processes> {
        let fixture = fixture_cmd()?;
        let mut p = Processes {
            servers: Vec::new(),
            jobs: Vec::new(),
            trees: Vec::new(),
        };
        for a in &sc.apps {
            let (server, job, pid) = match &a.job {
                Some(j) => {
                    // Bounded in time even if this process were stopped
                    // and never killed it: the run's length and a margin.
                    let exit_after_s = duration.ceil() as u64 + JOB_MARGIN_S;
                    let job = BatchJob::start(&a.name, &batch_cmd()?, &j.args(100, exit_after_s))?;
                    eprintln!("started {} (batch job, pid {})", a.name, job.pid);
                    let pid = job.pid;
                    (None, Some(job), pid)
                }
                None => {
                    let s = servers::start(a, &fixture)?;
                    eprintln!("started {} ({}, pid {})", a.name, s.addr, s.pid);
                    let pid = s.pid;
                    (Some(s), None, pid)
                }
            };
            p.servers.push(server);
            p.jobs.push(job);
            p.trees.push(server_pids(pid));
        }
        Ok(p)
    }

    /// "app mode, ...": each server's request boundaries as the tracer
    /// found them.
    pub(super) fn modes(&self, sc: &Scenario, t: &RequestTracer) -> String {
        let modes: Vec<String> = sc
            .apps
            .iter()
            .zip(&self.servers)
            .filter_map(|(a, s)| Some((a, s.as_ref()?)))
            .map(|(a, s)| {
                let m = t.mode(s.pid).map_or("-".into(), |m| m.to_string());
                format!("{} {m}", a.name)
            })
            .collect();
        modes.join(", ")
    }
}

/// The eBPF request sensor, following each server's pid and descendants
/// in the kernel (nginx's workers, respawned ones too) on its port: the
/// server-side line (and the feedback with `--feedback ebpf`). Without it
/// (not root, no tracefs) the client line alone is drawn, or the run
/// stops if eBPF was to be the feedback.
pub(super) fn tracer(
    feedback: Feedback,
    aggregate: qosd_sensors::ebpf::Aggregate,
    servers: &[Option<servers::Running>],
) -> anyhow::Result<Option<Arc<RequestTracer>>> {
    let topts = TracerOptions {
        aggregate,
        ..Default::default()
    };
    let t = match RequestTracer::start(topts) {
        Ok(t) => t,
        Err(e) if feedback == Feedback::Ebpf => {
            return Err(
                anyhow::Error::new(e).context("--feedback ebpf needs the eBPF request sensor")
            )
        }
        Err(e) => {
            eprintln!("eBPF: not available ({e}); the timeline has client latency only");
            return Ok(None);
        }
    };
    for s in servers.iter().flatten() {
        let opts = TargetOptions {
            mode: Mode::Auto,
            ports: vec![s.port],
            follow_children: true,
        };
        t.add_target(s.pid, opts)
            .with_context(|| format!("tracing {} (pid {})", s.name, s.pid))?;
    }
    Ok(Some(Arc::new(t)))
}

/// The open-loop load on every server along its shape (scaled to the
/// run's length and the app's calibrated capacity), one report per
/// monitoring tick: the replay's apps, with their load generators.
pub(super) struct Load {
    pub(super) apps: Vec<ReplayApp>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) handles: Vec<std::thread::JoinHandle<Result<load::LoadReport, load::LoadError>>>,
}

impl Load {
    pub(super) fn start(
        sc: &Scenario,
        procs: &mut Processes,
        cal: &Calibration,
        duration: f64,
        seed: u64,
    ) -> anyhow::Result<Load> {
        let scale = sc.duration_s / duration;
        let mut l = Load {
            apps: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            handles: Vec::new(),
        };
        for (i, a) in sc.apps.iter().enumerate() {
            let reports = match &procs.servers[i] {
                Some(s) => {
                    let cap = cal.apps[&a.name].capacity_rps;
                    let shape = a.load.clone();
                    let rate = Rate::Profile(Arc::new(move |t| shape.level_at(t * scale) * cap));
                    let mut spec =
                        sweep::spec_for(a, &s.addr, 1.0, duration, seed.wrapping_add(i as u64))
                            .map_err(|e| usage!("{}: {e}", a.name))?;
                    spec.rate = rate;
                    // The policy observes every tick.
                    spec.interval = Duration::from_millis(sc.monitor_ms);
                    let (tx, rx) = mpsc::channel::<IntervalReport>();
                    l.handles.push(load::spawn(spec, Some(tx), l.stop.clone()));
                    Some(rx)
                }
                None => None,
            };
            l.apps.push(ReplayApp {
                spec: a.clone(),
                pids: procs.trees[i].clone(),
                reports,
                job: procs.jobs[i].take(),
                client_target_us: cal.target_us(a),
                slo: cal.slo(a),
            });
        }
        Ok(l)
    }

    /// Stops every load generator and waits for it.
    pub(super) fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles {
            let _ = h.join();
        }
    }
}

/// Every app is admitted in scenario order with its even share of the
/// node (`qosd_core::admit::even_share`), by the daemon's admission rule:
/// the same start as the simulated node's.
pub(super) fn admit_all(
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
