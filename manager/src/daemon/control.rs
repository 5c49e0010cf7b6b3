//! The daemon's node ([`DaemonNode`], a [`Node`] of the one control
//! loop): on every tick it finds the apps' processes and measures them
//! (latency from each app's feedback source merged over all its pids,
//! RPS, CPU utilisation); applying a plan puts it in force through the
//! actuation. Apps that appear are admitted with their initial share; apps
//! whose processes all exit are released and their knobs restored.
//! [`Controller`] is the node and the [`ControlLoop`] together, ticked by
//! the daemon's timer.

use std::collections::BTreeMap;
use std::sync::Arc;

use qosd_core::control::{Applied as PlanApplied, ControlLoop, LoopCounters, Node, Sensed, Tick};
use qosd_core::{Allocations, AppState, Feedback, Limits, NodeCaps, Plan, Policy, Snapshot};
use qosd_sensors::ebpf::{Figure, RequestTracer};
use qosd_sensors::power::PowerSensor;
use qosd_sensors::procfs::{CpuMeter, NodeCpu, Procfs};
use qosd_sensors::stats::LogHistogram;

use qosd_actuators::grouplock::{GroupLocks, PidClaims};

use super::discover::Finder;
use super::jobs::Jobs;
use super::state::SharedState;
use crate::config::AppConfig;
use crate::kube::PodRef;
use crate::node::actuate::Actuation;
use crate::node::latency::{figures_from_tracer, FigureTick, Recent};

/// One configured app and what the loop keeps about it.
struct AppRt {
    cfg: AppConfig,
    feedback: Feedback,
    limits: Limits,
    pids: Vec<i32>,
    /// Why it is not managed, or its last failure to apply.
    note: Option<String>,
    cpu: CpuMeter,
    /// Seconds since its CPU time was last read.
    cpu_span_s: f64,
    /// Share of its CPUs it used over the last decision interval.
    cpu_util: f64,
    /// CPUs' worth of time its processes used over the last interval.
    cpus_used: Option<f64>,
    /// CPU time its processes used since qosd found them, seconds.
    cpu_total_s: f64,
    /// Its latencies as the policy sees them: the last decision
    /// interval's ticks, started again whenever a plan is applied.
    window: Recent,
    /// The pods' containers it is (`match: { pod: ... }` and annotated
    /// pods), as of the last scan.
    containers: Vec<PodRef>,
    /// An app an annotated pod asked for (not in the config): it goes
    /// when the pod does.
    from_pod: bool,
    /// Its group name's lock, for an app added while the daemon runs.
    lock: Option<GroupLocks>,
}

/// Something worth a line on stdout.
pub type Events = Vec<String>;

/// The daemon: its node and the loop that drives it.
pub struct Controller {
    node: DaemonNode,
    ctl: ControlLoop<Box<dyn Policy + Send>>,
}

/// The node `qosd run` manages.
pub struct DaemonNode {
    apps: Vec<AppRt>,
    act: Actuation,
    tracer: Option<Arc<RequestTracer>>,
    power: Option<PowerSensor>,
    shared: SharedState,
    finder: Finder,
    procfs: Procfs,
    /// The root prefix (for the group locks of other daemons).
    root: qosd_actuators::Root,
    /// The processes this daemon manages, claimed so that another daemon
    /// matching them sees it (none in a dry run: it manages nothing).
    claims: Option<PidClaims>,
    node_cpu: Option<NodeCpu>,
    dry_run: bool,
    /// The batch jobs of best-effort apps that run one.
    jobs: Jobs,
    /// The next `sense` scans /proc for new processes.
    scan: bool,
    /// Log lines of the current tick.
    events: Events,
    /// Annotated pods seen (`qosd.io/class`).
    pods: pods::PodApps,
}

mod apps;
mod discovery;
mod pods;
mod report;
pub use report::{describe_target, live_entry};

impl Controller {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        apps: &[AppConfig],
        feedback_override: Option<Feedback>,
        policy: Box<dyn Policy + Send>,
        act: Actuation,
        tracer: Option<Arc<RequestTracer>>,
        shared: SharedState,
        root: &std::path::Path,
        dry_run: bool,
    ) -> Self {
        let nr_slots = {
            let i = &shared.lock().info;
            (i.decide_interval_ms / i.monitor_interval_ms.max(1)).max(1) as usize
        };
        let nr_apps = apps.len();
        let apps = apps
            .iter()
            .map(|a| AppRt::new(a, feedback_override.unwrap_or(a.feedback), nr_slots))
            .collect();
        let node = DaemonNode {
            apps,
            act,
            tracer,
            power: None,
            shared,
            finder: Finder::new(root),
            procfs: Procfs::new(root),
            root: qosd_actuators::Root::new(root),
            claims: (!dry_run).then(|| PidClaims::new(qosd_actuators::Root::new(root))),
            node_cpu: None,
            dry_run,
            jobs: Jobs::none(nr_apps),
            scan: true,
            events: Events::new(),
            pods: pods::PodApps::new(root, dry_run, nr_slots),
        };
        let mut node = node;
        node.pods.locked_at_start = node.apps.iter().map(|a| a.cfg.name.clone()).collect();
        Controller {
            node,
            ctl: ControlLoop::new(policy),
        }
    }

    /// Runs the best-effort apps' batch jobs (started on the next tick).
    pub fn set_jobs(&mut self, jobs: Jobs) {
        self.node.jobs = jobs;
    }

    /// Stops every batch job (before the knobs are put back on exit).
    pub fn stop_jobs(&mut self) -> Events {
        self.node.jobs.stop_all()
    }

    /// Resolves `match: { pod: ... }` from the API server's pods, and
    /// (`annotations`) manages pods annotated `qosd.io/class`.
    pub fn set_pods(&mut self, pods: crate::kube::select::PodSource, annotations: bool) {
        self.node.finder = self.node.finder.clone().with_pods(pods);
        self.node.pods.annotations = annotations;
    }

    /// Samples `power` on every decision tick from now on.
    pub fn set_power(&mut self, power: PowerSensor) {
        self.node.power = Some(power);
    }

    pub fn actuation(&self) -> &Actuation {
        &self.node.act
    }

    pub fn actuation_mut(&mut self) -> &mut Actuation {
        &mut self.node.act
    }

    /// The configured feedback of app `i` after the CLI override.
    pub fn feedback(&self, name: &str) -> Option<Feedback> {
        self.node
            .apps
            .iter()
            .find(|a| a.cfg.name == name)
            .map(|a| a.feedback)
    }

    /// "1 core (CPU 0)", ...: see [`DaemonNode::describe`].
    pub fn describe(&self, app: &str) -> String {
        self.node.describe(app)
    }

    /// One tick of the loop. `scan`: look for new processes (a pass over
    /// /proc); otherwise only check that known ones live. `decide`: ask
    /// the policy for a plan and apply it.
    pub fn tick(&mut self, now_ms: u64, dt_s: f64, scan: bool, decide: bool) -> Events {
        self.node.scan = scan;
        let tick = Tick {
            now_ms,
            dt_s,
            decide,
        };
        let (sensed, entry) =
            self.ctl
                .tick(&mut self.node, &mut qosd_core::control::NoRecorder, tick);
        let mut ev = std::mem::take(&mut self.node.events);
        ev.extend(sensed.events);
        if let Some(e) = entry {
            if e.applied.is_none() {
                // Nothing changed: apply the allocation again anyway, which
                // catches threads that reset their own affinity.
                self.node.reassert(now_ms);
                ev.append(&mut self.node.events);
            }
            ev.extend(self.node.cannot_meet(now_ms, &e.plan));
        }
        self.node.publish(decide, self.ctl.counters());
        ev
    }
}

impl AppRt {
    fn new(cfg: &AppConfig, feedback: Feedback, nr_slots: usize) -> AppRt {
        AppRt {
            window: Recent::new(nr_slots),
            feedback,
            limits: cfg.limits(),
            cfg: cfg.clone(),
            pids: Vec::new(),
            note: None,
            cpu: CpuMeter::default(),
            cpu_span_s: 0.0,
            cpu_util: 0.0,
            cpus_used: None,
            cpu_total_s: 0.0,
            containers: Vec::new(),
            from_pod: false,
            lock: None,
        }
    }
}

impl Node for DaemonNode {
    fn caps(&self) -> NodeCaps {
        *self.act.node()
    }

    fn current(&self) -> &Allocations {
        self.act.current()
    }

    fn sense(&mut self, tick: &Tick) -> Sensed {
        let mut events = self.jobs.supervise(tick.now_ms);
        events.extend(self.discover(tick.now_ms, self.scan));
        if tick.decide {
            self.sample_power();
            self.jobs.sample();
        }
        let snapshot = self.measure(tick.now_ms, tick.dt_s, tick.decide);
        let interval = if tick.decide {
            self.interval_rows()
        } else {
            Vec::new()
        };
        Sensed {
            snapshot,
            interval,
            events,
        }
    }

    fn apply(&mut self, tick: &Tick, plan: &Plan) -> PlanApplied {
        let pids = self.managed_pids();
        let mut errors = Vec::new();
        let ev = match self.act.set(&plan.allocations, &pids, true) {
            Ok(applied) => {
                errors.extend(
                    applied
                        .iter()
                        .filter_map(|a| a.error.as_ref().map(|e| format!("{}: {e}", a.app))),
                );
                self.record(tick.now_ms, &plan.decisions, &applied, None)
            }
            Err(e) => {
                let e = format!("plan not applied: {e}");
                errors.push(e.clone());
                self.record(tick.now_ms, &plan.decisions, &[], Some(&e))
            }
        };
        self.events.extend(ev);
        // What the policy sees next was measured under the new plan.
        for a in &mut self.apps {
            a.window.restart();
        }
        PlanApplied {
            in_force: self.act.current().clone(),
            errors,
        }
    }
}

impl DaemonNode {
    /// Applies the allocation in force again (see [`Controller::tick`]).
    fn reassert(&mut self, now_ms: u64) {
        let pids = self.managed_pids();
        let current = self.act.current().clone();
        if let Ok(applied) = self.act.set(&current, &pids, true) {
            let ev = self.record(now_ms, &[], &applied, None);
            self.events.extend(ev);
        }
    }

    /// Pids of the managed apps.
    fn managed_pids(&self) -> BTreeMap<String, Vec<i32>> {
        self.apps
            .iter()
            .filter(|a| self.act.current().contains_key(&a.cfg.name) && !a.pids.is_empty())
            .map(|a| (a.cfg.name.clone(), a.pids.clone()))
            .collect()
    }

    /// Feeds each app's latencies of this tick in and builds the snapshot
    /// of the managed apps. CPU time is read on decision ticks only: the
    /// kernel counts it in 10 ms ticks, too coarse for 100 ms anyway.
    fn measure(&mut self, now_ms: u64, dt_s: f64, decide: bool) -> Snapshot {
        // Both eBPF figures of eBPF apps (the API offers either); the
        // policy gets the app's configured one.
        let mut ticks: Vec<(FigureTick, Option<[FigureTick; 2]>)> =
            Vec::with_capacity(self.apps.len());
        for a in &self.apps {
            ticks.push(match (a.feedback, &self.tracer) {
                (Feedback::Ebpf, Some(t)) => {
                    let both = figures_from_tracer(t, &a.pids);
                    let i = usize::from(crate::config::figure_of(a.cfg.latency) == Figure::Service);
                    (both[i].clone(), Some(both))
                }
                _ => ((LogHistogram::new(), None), None),
            });
        }
        for a in &mut self.apps {
            a.cpu_span_s += dt_s;
            if !decide {
                continue;
            }
            let used = a.cpu.delta_s(&self.procfs, &a.pids);
            a.cpu_total_s += used;
            let nr_cpus = self
                .act
                .cpus(&a.cfg.name)
                .map_or(self.act.nr_online_cpus(), |c| c.len());
            let secs = std::mem::take(&mut a.cpu_span_s);
            if secs > 0.0 {
                a.cpu_util = (used / (secs * nr_cpus.max(1) as f64)).clamp(0.0, 1.0);
                a.cpus_used = Some(used / secs);
            }
        }
        let mut snap = Snapshot::default();
        let mut sh = self.shared.lock();
        for (i, (a, ((hist, latest), both))) in self.apps.iter_mut().zip(ticks).enumerate() {
            let util = a.cpu_util;
            let Some(live) = sh.apps.get_mut(&a.cfg.name) else {
                continue;
            };
            let (hist, latest) = match a.feedback {
                Feedback::Client => live.inbox.take(),
                Feedback::Ebpf => (hist, latest),
            };
            // The policy's window (restarted when a plan is applied) and
            // the API's (always the last decision interval).
            a.window.push(hist.clone(), dt_s, latest);
            live.recent.push(hist, dt_s, latest);
            if let Some(both) = both {
                for (r, (h, l)) in live.ebpf.iter_mut().zip(both) {
                    r.push(h, dt_s, l);
                }
            }
            live.cpu_util = util;
            live.cpu_seconds_total = a.cpu_total_s;
            if decide {
                live.be_ops_per_s = self.jobs.ops_per_s(i);
            }
            if self.act.current().contains_key(&a.cfg.name) {
                let pct = live.target.map_or(99.0, |t| t.percentile);
                snap.apps.push(AppState {
                    name: a.cfg.name.clone(),
                    class: a.cfg.class,
                    target: live.target,
                    latency_us: a.window.percentile_us(pct),
                    rps: a.window.rps(),
                    nr_samples: a.window.requests(),
                    cpu_util: util,
                    cpus_used: a.cpus_used,
                    power_w: live.power_w,
                    limits: a.limits,
                });
            }
        }
        snap.node_power_w = sh.node_power_w;
        // The windows restart when a plan is applied: the oldest tick any
        // app's figure holds.
        let span_s = self
            .apps
            .iter()
            .map(|a| a.window.span_s())
            .fold(0.0, f64::max);
        snap.since_ms = Some(now_ms.saturating_sub((span_s * 1000.0).round() as u64));
        snap
    }

    /// Copies allocations, processes and node figures to the shared state.
    fn publish(&mut self, decided: bool, counters: LoopCounters) {
        let node = decided.then(|| self.procfs.node_cpu().ok()).flatten();
        let mut sh = self.shared.lock();
        if let Some(n) = node {
            if let Some(before) = self.node_cpu.replace(n) {
                sh.node_cpu_util = Some(n.utilisation_since(&before));
            }
        }
        sh.loop_counters = counters;
        sh.monitor_ticks_total += 1;
        if decided {
            sh.decide_ticks_total += 1;
        }
        for (i, a) in self.apps.iter().enumerate() {
            let share = self.act.current().get(&a.cfg.name).copied();
            let cpus = self.act.cpus(&a.cfg.name);
            if let Some(live) = sh.apps.get_mut(&a.cfg.name) {
                live.pids.clone_from(&a.pids);
                live.note = if a.pids.is_empty() {
                    Some(
                        self.jobs
                            .note(i)
                            .unwrap_or_else(|| "not running".to_owned()),
                    )
                } else {
                    a.note.clone()
                };
                live.share = share;
                live.cpus = cpus;
                live.pods.clone_from(&a.containers);
            }
        }
    }
}
