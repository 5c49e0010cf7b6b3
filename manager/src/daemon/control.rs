//! The daemon's node ([`DaemonNode`], a [`Node`] of the one control
//! loop): on every tick it finds the apps' processes and measures them
//! (latency from each app's feedback source merged over all its pids,
//! RPS, CPU utilisation); applying a plan puts it in force through the
//! actuation. Apps that appear are admitted with their initial share; apps
//! whose processes all exit are released and their knobs restored.
//! [`Controller`] is the node, the loop ([`ControlLoop`]) and the
//! recorder that feeds the API ([`ApiRecorder`]) together, run on the
//! real clock by [`Controller::run`] (`clock.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use qosd_core::control::{Applied as PlanApplied, ControlLoop, LoopCounters, Node, Sensed, Tick};
use qosd_core::oa::{cpus_held, Oa};
use qosd_core::{Allocations, AppClass, Feedback, Limits, NodeCaps, Plan, Policy};
use qosd_sensors::ebpf::RequestTracer;
use qosd_sensors::power::PowerSensor;
use qosd_sensors::sensor::client::{ClientFeeds, ClientSensor};
use qosd_sensors::sensor::ebpf::EbpfSensor;
use qosd_sensors::sensor::AppReading;

use qosd_actuators::grouplock::{GroupLocks, PidClaims};

use super::discover::Finder;
use super::jobs::Jobs;
use super::state::{SharedState, SloView};
use crate::config::{AppConfig, RealtimeConfig};
use crate::kube::PodRef;
use crate::node::actuate::Actuation;
use crate::node::sensing::{fed_tick, plugins, SenseApp, Sensing};

/// One configured app and what the loop keeps about it.
struct AppRt {
    cfg: AppConfig,
    feedback: Feedback,
    limits: Limits,
    pids: Vec<i32>,
    /// Why it is not managed, or its last failure to apply.
    note: Option<String>,
    /// Why a knob refused it (see `refuse.rs`); the knob stays off.
    refused: Option<String>,
    /// Seconds of the decision interval so far, and each pid's CPU
    /// seconds in it (the procfs sensor reads them every tick).
    cpu_span_s: f64,
    iv_cpu_by_pid: BTreeMap<i32, f64>,
    /// Its processes' requests and CPU time, per pid.
    per_pid: oa::PidMeter,
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

/// The daemon: its node, the loop that drives it and what records the
/// loop's decisions for the API.
pub struct Controller {
    node: DaemonNode,
    rec: ApiRecorder,
    ctl: ControlLoop<Box<dyn Policy + Send>>,
}

/// The node `qosd run` manages.
pub struct DaemonNode {
    apps: Vec<AppRt>,
    act: Actuation,
    /// Every sensor's figures of the apps (see [`Sensing`]).
    sensing: Sensing,
    shared: SharedState,
    finder: Finder,
    /// Where the API's client reports reach the client sensor (an app
    /// added at run time is connected here).
    client_feeds: ClientFeeds,
    /// The root prefix (for the group locks of other daemons).
    root: qosd_actuators::Root,
    /// The tracer again, for per-pid operational figures (the sensing
    /// layer's figures are per app).
    tracer: Option<Arc<RequestTracer>>,
    /// The processes this daemon manages, claimed so that another daemon
    /// matching them sees it (none in a dry run: it manages nothing).
    claims: Option<PidClaims>,
    /// The batch jobs of best-effort apps that run one.
    jobs: Jobs,
    /// The next `sense` scans /proc for new processes (decision ticks
    /// always do).
    scan: bool,
    /// Records what the node decides itself (admissions) for the API.
    log: ApiRecorder,
    /// Annotated pods seen (`qosd.io/class`).
    pods: pods::PodApps,
}

mod apps;
mod clock;
mod discovery;
mod oa;
mod pods;
mod record;
mod refuse;
mod report;
pub use clock::Wakeups;
pub use record::ApiRecorder;
pub use report::{describe_target, live_entry};

impl Controller {
    /// The sensors: client reports from the API (each app's inbox in
    /// `shared` is connected here), CPU time from `root`'s /proc and, with
    /// a `tracer`, eBPF requests; power is added by [`Self::set_power`].
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
        let client = ClientSensor::new([]);
        let client_feeds = client.feeds();
        {
            let mut sh = shared.lock();
            for a in apps {
                if let Some(live) = sh.apps.get_mut(&a.name) {
                    live.inbox = client_feeds.inbox(&a.name);
                }
            }
        }
        let ebpf = tracer.clone().map(EbpfSensor::new);
        let sensors = plugins(Box::new(client), root, ebpf, None);
        let sense_apps = apps
            .iter()
            .map(|a| sense_app(a, feedback_override.unwrap_or(a.feedback)))
            .collect();
        let apps = apps
            .iter()
            .map(|a| AppRt::new(a, feedback_override.unwrap_or(a.feedback)))
            .collect();
        let node = DaemonNode {
            apps,
            act,
            sensing: Sensing::new(sensors, sense_apps, nr_slots),
            shared: shared.clone(),
            finder: Finder::new(root),
            client_feeds,
            root: qosd_actuators::Root::new(root),
            tracer,
            claims: (!dry_run).then(|| PidClaims::new(qosd_actuators::Root::new(root))),
            jobs: Jobs::none(nr_apps),
            scan: true,
            log: ApiRecorder::new(shared.clone(), dry_run),
            pods: pods::PodApps::new(root, dry_run, nr_slots),
        };
        let mut node = node;
        node.pods.locked_at_start = node.apps.iter().map(|a| a.cfg.name.clone()).collect();
        let mut c = Controller {
            node,
            rec: ApiRecorder::new(shared, dry_run),
            ctl: ControlLoop::new(policy),
        };
        c.set_realtime(&RealtimeConfig::default());
        c
    }

    /// The real-time gate (`realtime:`'s bounds) for the configured apps
    /// that ask for real time; apps a reload adds stay normal until the
    /// next start.
    pub fn set_realtime(&mut self, rt: &RealtimeConfig) {
        let wants = self.node.apps.iter().filter(|a| a.cfg.wants_realtime());
        self.ctl
            .set_rt_gate(rt.gate(wants.map(|a| a.cfg.name.clone())));
    }

    /// Runs the best-effort apps' batch jobs (started on the next tick).
    pub fn set_jobs(&mut self, jobs: Jobs) {
        for i in 0..self.node.apps.len() {
            // A batch job serves no requests.
            self.node.sensing.app_mut(i).serves = !jobs.is_job(i);
        }
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
        self.node.sensing.add_sensor(Box::new(power));
    }

    /// Adds a sensor that starts after the node (e.g. the net sensor,
    /// whose TC objects are journalled with the knobs).
    pub fn add_sensor(&mut self, s: qosd_sensors::sensor::BoxedSensor) {
        self.node.sensing.add_sensor(s);
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

    /// One tick of the loop, off the clock (the first one, tests).
    /// `scan`: look for new processes (a pass over /proc; decision ticks
    /// always do); otherwise only check that known ones live. `decide`:
    /// ask the policy for a plan and apply it.
    pub fn tick(&mut self, now_ms: u64, dt_s: f64, scan: bool, decide: bool) -> Events {
        self.node.scan = scan;
        let tick = Tick {
            now_ms,
            dt_s,
            decide,
        };
        let (sensed, _) = self.ctl.tick(&mut self.node, &mut self.rec, tick);
        self.node
            .after_tick(&mut self.rec, decide, self.ctl.counters(), sensed.events)
    }
}

impl AppRt {
    fn new(cfg: &AppConfig, feedback: Feedback) -> AppRt {
        AppRt {
            feedback,
            limits: cfg.limits(),
            cfg: cfg.clone(),
            pids: Vec::new(),
            note: None,
            refused: None,
            cpu_span_s: 0.0,
            iv_cpu_by_pid: BTreeMap::new(),
            per_pid: Default::default(),
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
        let scan = std::mem::take(&mut self.scan) || tick.decide;
        events.extend(self.discover(tick.now_ms, scan));
        if tick.decide {
            self.jobs.sample();
            events.extend(self.check_knobs());
        }
        let mut sensed = self.measure(tick);
        sensed.events = events;
        sensed
    }

    fn apply(&mut self, tick: &Tick, plan: &Plan) -> PlanApplied {
        let pids = self.managed_pids();
        let set = self.act.set(&plan.allocations, &pids, true);
        self.note_outcome(set.as_deref().unwrap_or_default());
        // What the policy sees next was measured under the new plan.
        self.sensing.restart(tick.now_ms);
        self.act.outcome(set.as_deref().map_err(String::as_str))
    }

    /// Applies the allocation in force again, which catches threads that
    /// reset their own affinity.
    fn reassert(&mut self, _tick: &Tick) -> Option<PlanApplied> {
        let pids = self.managed_pids();
        let current = self.act.current().clone();
        let applied = self.act.set(&current, &pids, true).ok()?;
        self.note_outcome(&applied);
        Some(self.act.outcome(Ok(&applied)))
    }
}

impl DaemonNode {
    /// After each tick: the node's state to the API, and the tick's lines
    /// (`sensed`'s, then the recorder's).
    fn after_tick(
        &mut self,
        rec: &mut ApiRecorder,
        decided: bool,
        counters: LoopCounters,
        sensed: Events,
    ) -> Events {
        self.publish(decided, counters);
        let mut ev = sensed;
        ev.extend(rec.take_events());
        ev
    }

    /// Pids of the managed apps.
    fn managed_pids(&self) -> BTreeMap<String, Vec<i32>> {
        self.apps
            .iter()
            .filter(|a| self.act.current().contains_key(&a.cfg.name) && !a.pids.is_empty())
            .map(|a| (a.cfg.name.clone(), a.pids.clone()))
            .collect()
    }

    /// Each app's per-pid CPU time of the tick into its interval; on
    /// decision ticks, its per-pid operational figures over the interval
    /// that ends with this tick.
    fn per_pid_cpu(&mut self, tick: &Tick, readings: &[AppReading]) {
        for (a, r) in self.apps.iter_mut().zip(readings) {
            a.cpu_span_s += tick.dt_s;
            for &(pid, used) in r.cpu_by_pid.as_deref().unwrap_or_default() {
                *a.iv_cpu_by_pid.entry(pid).or_default() += used;
            }
            if tick.decide {
                let secs = std::mem::take(&mut a.cpu_span_s);
                let by_pid: Vec<(i32, f64)> =
                    std::mem::take(&mut a.iv_cpu_by_pid).into_iter().collect();
                a.per_pid.update(&by_pid, self.tracer.as_deref(), secs);
            }
        }
    }

    /// Senses the apps and publishes the tick's figures to the API: the
    /// fed latencies (a window that is not restarted by plans) and, for
    /// eBPF apps, both eBPF figures; CPU, power and the batch jobs' rates.
    fn measure(&mut self, tick: &Tick) -> Sensed {
        let (mut sensed, readings) = self.sensing.sense(tick, &self.act);
        self.per_pid_cpu(tick, &readings);
        let mut sh = self.shared.lock();
        if tick.decide {
            sh.power_error = self.sensing.sensors().error("power").map(str::to_owned);
            sh.node_power_w = self.sensing.node_power_w();
            if let Some(u) = self.sensing.node_cpu_util() {
                sh.node_cpu_util = Some(u);
            }
        }
        if let Some(n) = self.sensing.net() {
            sh.net = Some(n.clone());
        }
        for (i, (a, r)) in self.apps.iter().zip(&readings).enumerate() {
            let Some(live) = sh.apps.get_mut(&a.cfg.name) else {
                continue;
            };
            let fed = fed_tick(self.sensing.app(i), r);
            live.recent.push(fed.hist, tick.dt_s, fed.latest_ns);
            if let (Feedback::Ebpf, Some(both)) = (a.feedback, &r.server) {
                for (w, t) in live.ebpf.iter_mut().zip(both.clone()) {
                    w.push(t.hist, tick.dt_s, t.latest_ns);
                }
            }
            if let Some(t) = &r.net {
                live.net.get_or_insert_with(Default::default).add(t);
            }
            live.cpu_util = self.sensing.cpu_util(i);
            live.cpu_seconds_total = self.sensing.cpu_total_s(i);
            if tick.decide {
                live.be_ops_per_s = self.jobs.ops_per_s(i);
                live.power = self.sensing.power(i).cloned();
                live.power_w = live.power.as_ref().map(|p| p.power_w);
                live.knob_counters = self.act.counters(&a.cfg.name);
                // Operational analysis on what it holds (the API's).
                let share = self.act.current().get(&a.cfg.name);
                let node = self.act.node();
                let used = self.sensing.cpus_used(i);
                live.oa = Oa::of_interval(live.recent.rps(), used, share, node);
                let held = cpus_held(share, node);
                live.pid_oa = a.per_pid.figures(held);
                let load = qosd_core::slo::Load {
                    rps: live.recent.rps(),
                    cpus: held,
                };
                live.slo = self.sensing.slo(i).map(|s| SloView::of(s, load));
            }
        }
        for (i, row) in sensed.interval.iter_mut().enumerate() {
            row.be_ops_per_s = self.jobs.ops_per_s(i);
        }
        sensed
    }

    /// Copies allocations, processes and node figures to the shared state.
    fn publish(&mut self, decided: bool, counters: LoopCounters) {
        let mut sh = self.shared.lock();
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
                    match (&a.note, &a.refused) {
                        (Some(n), Some(r)) => Some(format!("{n}; {r}")),
                        (n, r) => n.clone().or_else(|| r.clone()),
                    }
                };
                live.share = share;
                live.cpus = cpus;
                live.pods.clone_from(&a.containers);
            }
        }
    }
}

/// App `a` as the sensing layer needs it: judged against its target (a
/// latency-critical app's), on both sides, with `feedback` feeding it.
fn sense_app(a: &AppConfig, feedback: Feedback) -> SenseApp {
    let target = a.qos_target().filter(|_| a.class == AppClass::Lc);
    SenseApp {
        name: a.name.clone(),
        class: a.class,
        feedback,
        figure: crate::config::figure_of(a.latency),
        limits: a.limits(),
        percentile: target.map_or(99.0, |t| t.percentile),
        client_target_us: target.map(|t| t.value_us),
        // No calibrated gap: the eBPF side shares the target until
        // latencies POSTed by the app's clients measure the gap.
        slo: target.map(|t| qosd_core::slo::SloSide::new(t.value_us, None)),
        ports: a.ports.clone(),
        driven: false,
        serves: true,
    }
}
