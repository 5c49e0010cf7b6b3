//! Starting `qosd run` up to its first tick, in the order that keeps a
//! refusal harmless: the API's port and write token, the pod watch and the
//! group locks are taken before any knob is touched; then the actuators
//! (putting back what a killed qosd left), the eBPF request tracer, the
//! power sensor, the API's state and the controller.

use std::sync::Arc;

use anyhow::Context;
use qosd_actuators::grouplock::GroupLocks;
use qosd_actuators::Actuators;
use qosd_core::{Feedback, Resource};
use qosd_sensors::ebpf::{RequestTracer, TracerOptions};
use qosd_sensors::power::PowerSensor;

use super::control::{live_entry, Controller};
use super::state::{unix_ms, KnobInfo, RunInfo, Shared, SharedState};
use super::{auth, jobs, Options};
use crate::config::Config;
use crate::kube::select::PodSource;
use crate::node::actuate::Actuation;
use crate::policy::PolicyFile;
use crate::usage;

/// What start-up refuses on before anything is touched.
pub struct Held {
    pub listener: tokio::net::TcpListener,
    pub token: auth::Token,
    /// The token file was made now.
    pub token_created: bool,
    pub pods: Option<PodSource>,
    /// One daemon per group name on the node (none in a dry run): held
    /// until exit (the kernel drops them even on SIGKILL).
    pub groups: Option<GroupLocks>,
}

/// Binds the API, prepares its token, starts the pod watch and locks the
/// apps' group names: every error here leaves the node as it was.
pub async fn hold(cfg: &Config) -> anyhow::Result<Held> {
    // Bind first: a port in use stops qosd before it changes anything.
    let listener = tokio::net::TcpListener::bind(cfg.api.listen)
        .await
        .with_context(|| format!("binding the API to {}", cfg.api.listen))?;
    let token_path = cfg.api.token_path(&cfg.actuators.root);
    let (token, token_created) =
        auth::Token::load_or_create(&token_path).context("preparing the API's write token")?;
    // Pods from the API server: credentials and node name checked before
    // any knob is touched.
    let pods = if cfg.wants_pods() {
        let (pods, _node) =
            crate::kube::start(cfg.kubernetes.as_ref()).map_err(|e| usage!("{e}"))?;
        Some(pods)
    } else {
        None
    };
    let groups = if cfg.actuators.dry_run {
        None
    } else {
        let names: Vec<String> = cfg
            .apps
            .iter()
            .map(|a| qosd_actuators::AppTarget::new(a.name.clone(), Vec::new()).group_name())
            .collect();
        let root = qosd_actuators::Root::new(&cfg.actuators.root);
        Some(qosd_actuators::grouplock::lock_groups(&root, &names).map_err(|e| usage!("{e}"))?)
    };
    Ok(Held {
        listener,
        token,
        token_created,
        pods,
        groups,
    })
}

/// The actuators' settings from the config.
pub fn act_config(cfg: &Config) -> qosd_actuators::Config {
    qosd_actuators::Config {
        root: cfg.actuators.root.clone(),
        dry_run: cfg.actuators.dry_run,
        state_file: cfg.state_file.clone(),
        cores_backend: cfg.actuators.cores_backend,
        frequency_backend: cfg.actuators.frequency_backend,
        cache_ways_backend: cfg.actuators.cache_ways_backend,
        cpu_quota_backend: cfg.actuators.cpu_quota_backend,
        cpu_quota_unit_milli: cfg.actuators.cpu_quota_unit_milli,
        cpu_quota_period_us: cfg.actuators.cpu_quota_period_us,
        cpu_quota_burst_pct: cfg.actuators.cpu_quota_burst_pct,
        hedge: cfg
            .apps
            .iter()
            .filter_map(|a| Some((a.name.clone(), a.hedge.as_ref()?.spec())))
            .collect(),
        rt_budget_us: cfg.realtime.budget_us,
        ..Default::default()
    }
}

/// The actuators, after putting back what a previous qosd left.
pub fn actuation(cfg: &Config) -> anyhow::Result<Actuation> {
    let act_cfg = act_config(cfg);
    let (actuators, leftovers) = Actuators::start(&act_cfg).context("starting the actuators")?;
    if !leftovers.is_empty() {
        println!(
            "put back {} settings a previous qosd left in {}",
            leftovers.len(),
            act_cfg.state_path().display()
        );
    }
    Actuation::new(actuators, &cfg.actuators.enabled).context("reading the CPU topology")
}

/// The eBPF request tracer, when an app that serves requests is fed by
/// it: otherwise no program is attached (nothing would read it, and every
/// syscall on the node would pay).
pub fn tracer(
    cfg: &Config,
    feedback: Option<Feedback>,
) -> anyhow::Result<Option<Arc<RequestTracer>>> {
    let needs_ebpf = cfg
        .apps
        .iter()
        .any(|a| a.job.is_none() && feedback.unwrap_or(a.feedback) == Feedback::Ebpf);
    if !needs_ebpf {
        println!("ebpf: not started (no app uses feedback: ebpf); per-pid figures are unavailable");
        return Ok(None);
    }
    let t = RequestTracer::start(TracerOptions {
        ringbuf_bytes: cfg.sensors.ring_buffer_kib.saturating_mul(1024),
        window: cfg.sensors.window_requests as usize,
        aggregate: cfg
            .sensors
            .aggregate
            .unwrap_or_else(qosd_sensors::ebpf::Aggregate::from_env),
        ..Default::default()
    })
    .map_err(|e| {
        anyhow::Error::new(e)
            .context("starting the eBPF request tracer (needed by apps with feedback: ebpf)")
    })?;
    match t.fallback_reason() {
        None => println!("ebpf: {} hooks", t.hooks().as_str()),
        Some(why) => println!("ebpf: {} hooks ({why})", t.hooks().as_str()),
    }
    Ok(Some(Arc::new(t)))
}

/// The power sensor, unless it is off or not available here.
pub fn power(cfg: &Config) -> Option<PowerSensor> {
    if !cfg.sensors.power {
        println!("power: off (sensors.power: false)");
        return None;
    }
    PowerSensor::open(&cfg.power, &cfg.actuators.root)
        .map_err(|e| println!("power: not measured ({e}); power_w is null"))
        .ok()
}

/// Each knob as the API shows it: in use, or why not.
pub fn knob_table(act: &Actuation, enabled: &[Resource]) -> Vec<KnobInfo> {
    Resource::ALL
        .iter()
        .map(|&r| {
            let k = act.caps().get(r);
            let on = enabled.contains(&r);
            KnobInfo {
                resource: r,
                in_use: on && act.node().has(r),
                backend: k.backend.clone(),
                reason: if on {
                    k.reason.clone()
                } else {
                    "disabled in the config (actuators.enabled)".into()
                },
            }
        })
        .collect()
}

/// The API's state at start: the run's facts and every configured app.
pub fn shared_state(
    o: &Options,
    cfg: &Config,
    policy: &PolicyFile,
    knobs: Vec<KnobInfo>,
    ebpf: bool,
    power: &Option<PowerSensor>,
) -> SharedState {
    let nr_slots = (cfg.decide_interval_ms / cfg.monitor_interval_ms).max(1) as usize;
    let info = RunInfo {
        version: env!("CARGO_PKG_VERSION"),
        policy: policy.name.clone(),
        config: o.config.display().to_string(),
        monitor_interval_ms: cfg.monitor_interval_ms,
        decide_interval_ms: cfg.decide_interval_ms,
        latency_window_ms: cfg.decide_interval_ms,
        dry_run: cfg.actuators.dry_run,
        knobs,
        ebpf,
        power: power
            .as_ref()
            .map_or("none".into(), |p| p.caps().source.to_string()),
        started_unix_ms: unix_ms(),
    };
    let mut shared = Shared::new(info);
    for a in &cfg.apps {
        let fb = o.feedback.unwrap_or(a.feedback);
        shared
            .apps
            .insert(a.name.clone(), live_entry(a, fb, nr_slots));
    }
    SharedState::new(shared)
}

/// The controller with its sensors, pods and batch jobs.
#[allow(clippy::too_many_arguments)]
pub fn controller(
    o: &Options,
    cfg: &Config,
    policy: &PolicyFile,
    act: Actuation,
    tracer: Option<Arc<RequestTracer>>,
    power: Option<PowerSensor>,
    pods: Option<PodSource>,
    shared: SharedState,
) -> anyhow::Result<Controller> {
    let mut ctl = Controller::new(
        &cfg.apps,
        o.feedback,
        policy.build(cfg.seed),
        act,
        tracer,
        shared,
        &cfg.actuators.root,
        cfg.actuators.dry_run,
    );
    ctl.set_realtime(&cfg.realtime);
    if let Some(p) = power {
        ctl.set_power(p);
    }
    if let Some(n) = &cfg.sensors.net {
        match super::net::start(&mut ctl, n, cfg.actuators.dry_run) {
            Ok(on) => println!(
                "net: counting on {} ({} ms bins, top {} peers); TC filters journalled",
                on.join(", "),
                n.bin_ms,
                n.top_n
            ),
            Err(e) => println!("net: not started ({e:#}); no traffic figures"),
        }
    }
    if let Some(pods) = pods {
        let annotations = cfg.kubernetes.as_ref().is_none_or(|k| k.annotations);
        ctl.set_pods(pods, annotations);
    }
    if cfg.apps.iter().any(|a| a.job.is_some()) {
        if cfg.actuators.dry_run {
            // A job is work on the node, not a knob: a dry run starts none.
            println!("jobs: dry run: no batch job is started");
        } else {
            // Progress lines once per monitoring tick: every decision
            // interval holds several.
            let report_ms = cfg.monitor_interval_ms.min(1000);
            ctl.set_jobs(jobs::Jobs::new(&cfg.apps, report_ms)?);
        }
    }
    Ok(ctl)
}
