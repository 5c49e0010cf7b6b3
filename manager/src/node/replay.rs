//! A real replay's node: the scenario's servers on this machine, driven by
//! our load generators, measured through the daemon's sensing layer
//! ([`Sensing`]: the load generators' reports, the eBPF request sensor with
//! every pid of each server merged, CPU time and power), and actuated by
//! the daemon's [`Actuation`]. A best-effort app
//! may be a batch job instead of a server: no load and no latency, its
//! throughput (ops/s) and CPU time are its figures.

use std::collections::BTreeMap;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use qosd_core::control::{Applied, Node, Sensed, Tick};
use qosd_core::slo::SloSide;
use qosd_core::{Allocations, Feedback, Limits, NodeCaps, Plan};
use qosd_scenarios::batch::BatchJob;
use qosd_scenarios::load::IntervalReport;
use qosd_scenarios::scenario::AppSpec;
use qosd_sensors::ebpf::{Mode, RequestTracer, TargetOptions};
use qosd_sensors::procfs::Procfs;
use qosd_sensors::sensor::client::ClientSensor;
use qosd_sensors::sensor::ebpf::EbpfSensor;

use super::actuate::Actuation;
use super::power::RunPower;
use super::sensing::{plugins, SenseApp, Sensing};

/// One app of the replay.
pub struct ReplayApp {
    pub spec: AppSpec,
    /// Every process of the app's server or job (its pid and descendants).
    pub pids: Vec<i32>,
    /// Its load generator's reports (one per monitoring tick); `None` for
    /// a batch job, which takes no load.
    pub reports: Option<Receiver<IntervalReport>>,
    /// A best-effort app's batch job (`job:` in the scenario).
    pub job: Option<BatchJob>,
    /// The target the client latency is scored against, µs.
    pub client_target_us: Option<f64>,
    /// The eBPF side of the SLO: the client target less the calibrated
    /// client/server gap, refreshed from this run's client samples.
    pub slo: Option<SloSide>,
}

/// The real replay's node. Build it once the servers run, the targets are
/// traced and every app is admitted.
pub struct ReplayNode {
    apps: Vec<ReplayApp>,
    /// The batch job was seen gone (said once), per app.
    job_gone: Vec<bool>,
    act: Actuation,
    sensing: Sensing,
    /// A load generator ended (its channel closed): the run is over.
    pub ended: bool,
    /// Lines for stderr (failed applies).
    pub notes: Vec<String>,
}

impl ReplayNode {
    /// `nr_slots`: monitoring ticks per decision interval (the window).
    /// The servers are traced already (`tracer`'s targets): the sensors
    /// take their pids as they are.
    pub fn new(
        mut apps: Vec<ReplayApp>,
        act: Actuation,
        tracer: Option<Arc<RequestTracer>>,
        power: Option<RunPower>,
        feedback: Feedback,
        nr_slots: usize,
    ) -> Self {
        let sense_apps = apps
            .iter()
            .map(|a| SenseApp {
                name: a.spec.name.clone(),
                class: a.spec.class,
                feedback,
                figure: crate::config::figure_of(a.spec.latency),
                limits: Limits::default(),
                percentile: a.spec.target.as_ref().map_or(99.0, |t| t.percentile),
                client_target_us: a.client_target_us,
                slo: a.slo.clone(),
                // Traced already, each on its own ports.
                ports: Vec::new(),
                driven: a.reports.is_some(),
                serves: a.job.is_none(),
            })
            .collect();
        let feeds: Vec<_> = apps
            .iter_mut()
            .filter_map(|a| Some((a.spec.name.clone(), a.reports.take()?)))
            .collect();
        let sensors = plugins(
            Box::new(ClientSensor::new(feeds)),
            std::path::Path::new("/"),
            tracer.map(EbpfSensor::new),
            power.map(RunPower::into_sensor),
        );
        let mut sensing = Sensing::new(sensors, sense_apps, nr_slots);
        for (i, a) in apps.iter().enumerate() {
            sensing.take_pids(i, a.pids.clone());
        }
        ReplayNode {
            job_gone: vec![false; apps.len()],
            apps,
            act,
            sensing,
            ended: false,
            notes: Vec::new(),
        }
    }

    /// The actuation back, to restore the knobs at the end, and the batch
    /// jobs (killed when dropped: after the restore, as the servers are).
    pub fn into_parts(self) -> (Actuation, Vec<BatchJob>) {
        let jobs = self.apps.into_iter().filter_map(|a| a.job).collect();
        (self.act, jobs)
    }

    /// CPU seconds each batch job has used so far (`/proc/PID/stat`, every
    /// thread), by app; a job whose process is gone is left out.
    pub fn job_cpu_s(&self) -> BTreeMap<String, f64> {
        let procfs = Procfs::new("/");
        self.apps
            .iter()
            .filter_map(|a| {
                let pid = a.job.as_ref()?.pid as i32;
                let s = procfs.process_cpu_s(pid).ok().flatten()?;
                Some((a.spec.name.clone(), s))
            })
            .collect()
    }

    /// The power sensor failed during the run (its figures are dropped).
    pub fn power_failed(&self) -> bool {
        self.sensing.sensors().failed("power")
    }

    fn pids(&self) -> BTreeMap<String, Vec<i32>> {
        self.apps
            .iter()
            .map(|a| (a.spec.name.clone(), a.pids.clone()))
            .collect()
    }

    /// App `i`'s batch job throughput since the previous decision (`None`
    /// for a server); a job that ended is said once in the notes.
    fn job_ops_per_s(&mut self, i: usize) -> Option<f64> {
        let job = self.apps[i].job.as_mut()?;
        let v = job.ops_per_s();
        if v.is_none() && !job.running() && !self.job_gone[i] {
            self.job_gone[i] = true;
            self.notes.push(format!(
                "the batch job of {} (pid {}) ended before the run did",
                job.name, job.pid
            ));
        }
        v
    }
}

impl Node for ReplayNode {
    fn caps(&self) -> NodeCaps {
        *self.act.node()
    }

    fn current(&self) -> &Allocations {
        self.act.current()
    }

    fn sense(&mut self, tick: &Tick) -> Sensed {
        let (mut sensed, _) = self.sensing.sense(tick, &self.act);
        self.ended |= self.sensing.ended;
        for (i, row) in sensed.interval.iter_mut().enumerate() {
            row.be_ops_per_s = self.job_ops_per_s(i);
        }
        sensed
    }

    fn apply(&mut self, tick: &Tick, plan: &Plan) -> Applied {
        let pids = self.pids();
        let set = self.act.set(&plan.allocations, &pids, false);
        let out = self.act.outcome(set.as_deref().map_err(String::as_str));
        for e in &out.errors {
            self.notes
                .push(format!("applying {e} (it keeps the previous allocation)"));
        }
        // What the policy sees next was measured under the new plan.
        self.sensing.restart(tick.now_ms);
        out
    }
}

/// The pids of a server: it and its descendants, as `i32`.
pub fn server_pids(pid: u32) -> Vec<i32> {
    qosd_core::sys::tree::process_tree(&qosd_core::sys::Root::default(), pid as i32)
}

/// The pids of a fixture server (listening on `port`), each traced as a
/// target of its own when there is a tracer: a calibration or a fit
/// merges their latencies itself, so children are not followed under the
/// parent.
pub fn trace_server(tracer: Option<&RequestTracer>, pid: u32, port: u16) -> Vec<i32> {
    let tree = server_pids(pid);
    let Some(t) = tracer else {
        return tree;
    };
    for &pid in &tree {
        let opts = TargetOptions {
            mode: Mode::Auto,
            ports: vec![port],
            follow_children: false,
        };
        if let Err(e) = t.add_target(pid as u32, opts) {
            eprintln!("  eBPF: tracing pid {pid}: {e}");
        }
    }
    tree
}
