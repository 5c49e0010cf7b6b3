//! `qosd run`: the node daemon. It reads the config and the policy (a bad
//! file stops it before anything is touched), binds the HTTP API, probes
//! the knobs, starts the eBPF request tracer, then ticks on deadlines:
//! monitor every `monitor_interval_ms`, decide every `decide_interval_ms`.
//! SIGINT, SIGTERM, SIGHUP and every other terminating signal (caught
//! before anything is touched) stop it; every knob it changed is put back (also when it
//! panics; after a SIGKILL the next start or `qosd restore` does it), at
//! once: the API's clients get [`SHUTDOWN_GRACE`] to finish, whatever
//! they are doing.

pub mod api;
pub mod auth;
pub mod control;
pub mod discover;
pub mod jobs;
pub mod metrics;
pub mod reload;
pub mod server;
pub mod state;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use qosd_actuators::Actuators;
use qosd_core::control::Cadence;
use qosd_core::{Feedback, Resource};
use qosd_sensors::ebpf::{RequestTracer, TracerOptions};
use qosd_sensors::power::PowerSensor;

use crate::config::Config;
use crate::node::actuate::Actuation;
use crate::policy::PolicyFile;
use crate::signals::{self, Signals};
use crate::usage;
use crate::yamlfile;
use control::{describe_target, live_entry, Controller, Wakeups};
use state::{unix_ms, KnobInfo, RunInfo, Shared, SharedState};

/// What `qosd run` was asked for.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub config: PathBuf,
    /// Overrides every app's `feedback`.
    pub feedback: Option<Feedback>,
    /// Overrides `actuators.dry_run`.
    pub dry_run: bool,
    /// Overrides the config's `policy`.
    pub policy: Option<PathBuf>,
    /// Overrides `api.listen`.
    pub listen: Option<SocketAddr>,
}

/// The config and policy, validated; every error is the user's (exit 2).
pub fn load(o: &Options) -> anyhow::Result<(Config, PolicyFile, PathBuf)> {
    let text = yamlfile::read(&o.config).map_err(|e| usage!("{e}"))?;
    let mut cfg = Config::parse(&o.config, &text).map_err(|e| usage!("{e}"))?;
    let (policy, ppath) = match &o.policy {
        Some(p) => (
            PolicyFile::load_for(p, &cfg.app_names()).map_err(|e| usage!("{e}"))?,
            p.clone(),
        ),
        None => {
            let (_, pf) = Config::load(&o.config).map_err(|e| usage!("{e}"))?;
            (pf, cfg.policy_path(&o.config))
        }
    };
    if o.dry_run {
        cfg.actuators.dry_run = true;
    }
    if let Some(l) = o.listen {
        if let Some(why) = crate::config::api::remote_refusal(l, cfg.api.allow_remote) {
            return Err(usage!("--listen {why}"));
        }
        cfg.api.listen = l;
    }
    Ok((cfg, policy, ppath))
}

/// How long requests in progress may finish once qosd is told to stop;
/// then every connection is dropped and the knobs are put back.
pub const SHUTDOWN_GRACE: Duration = Duration::from_millis(200);

pub fn run(o: Options) -> anyhow::Result<()> {
    let (cfg, policy, ppath) = load(&o)?;
    // Every terminating signal is caught from here on, before anything is
    // touched: one arriving during start-up is taken after the first tick
    // (or before it), never by the default action.
    signals::reload_on_hup();
    let sigs = Signals::install()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(serve(o, cfg, policy, ppath, sigs))
}

fn knob_table(act: &Actuation, enabled: &[Resource]) -> Vec<KnobInfo> {
    Resource::ALL
        .iter()
        .map(|&r| {
            let k = act.caps().get(r);
            let on = enabled.contains(&r);
            KnobInfo {
                resource: r,
                in_use: on && act.node().has(r),
                backend: k.backend.clone(),
                reason: match (on, k.available) {
                    (false, _) => "disabled in the config (actuators.enabled)".into(),
                    (true, _) => k.reason.clone(),
                },
            }
        })
        .collect()
}

async fn serve(
    o: Options,
    cfg: Config,
    policy: PolicyFile,
    ppath: PathBuf,
    sigs: Signals,
) -> anyhow::Result<()> {
    // Bind first: a port in use stops qosd before it changes anything.
    let listener = tokio::net::TcpListener::bind(cfg.api.listen)
        .await
        .with_context(|| format!("binding the API to {}", cfg.api.listen))?;
    // The write credential: made (or refused) before anything is touched.
    let token_path = cfg.api.token_path(&cfg.actuators.root);
    let (token, token_created) =
        auth::Token::load_or_create(&token_path).context("preparing the API's write token")?;
    let watch = auth::TokenWatch::new(&token_path);
    // Pods from the API server: credentials and node name checked before
    // any knob is touched.
    let pods = if cfg.wants_pods() {
        let (pods, _node) =
            crate::kube::start(cfg.kubernetes.as_ref()).map_err(|e| usage!("{e}"))?;
        Some(pods)
    } else {
        None
    };
    let act_cfg = qosd_actuators::Config {
        root: cfg.actuators.root.clone(),
        dry_run: cfg.actuators.dry_run,
        state_file: cfg.state_file.clone(),
        cores_backend: cfg.actuators.cores_backend,
        frequency_backend: cfg.actuators.frequency_backend,
        cache_ways_backend: cfg.actuators.cache_ways_backend,
        cpu_quota_backend: cfg.actuators.cpu_quota_backend,
        cpu_quota_unit_milli: cfg.actuators.cpu_quota_unit_milli,
        cpu_quota_period_us: cfg.actuators.cpu_quota_period_us,
        ..Default::default()
    };
    // One daemon per group name on the node, whatever its state file:
    // held until exit (the kernel drops it even on SIGKILL).
    let _groups = if act_cfg.dry_run {
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
    let (actuators, leftovers) = Actuators::start(&act_cfg).context("starting the actuators")?;
    if !leftovers.is_empty() {
        println!(
            "put back {} settings a previous qosd left in {}",
            leftovers.len(),
            act_cfg.state_path().display()
        );
    }
    let act =
        Actuation::new(actuators, &cfg.actuators.enabled).context("reading the CPU topology")?;

    let feedback_of = |f: Feedback| o.feedback.unwrap_or(f);
    // A batch job serves no requests: it needs no tracer.
    let needs_ebpf = cfg
        .apps
        .iter()
        .any(|a| a.job.is_none() && feedback_of(a.feedback) == Feedback::Ebpf);
    // Client feedback and batch jobs only: no eBPF program is attached
    // (nothing would read it, and every syscall on the node would pay).
    let tracer = match needs_ebpf.then(|| {
        RequestTracer::start(TracerOptions {
            ringbuf_bytes: cfg.sensors.ring_buffer_kib.saturating_mul(1024),
            window: cfg.sensors.window_requests as usize,
            aggregate: cfg
                .sensors
                .aggregate
                .unwrap_or_else(qosd_sensors::ebpf::Aggregate::from_env),
            ..Default::default()
        })
    }) {
        None => {
            println!(
                "ebpf: not started (no app uses feedback: ebpf); per-pid figures are unavailable"
            );
            None
        }
        Some(Ok(t)) => {
            match t.fallback_reason() {
                None => println!("ebpf: {} hooks", t.hooks().as_str()),
                Some(why) => println!("ebpf: {} hooks ({why})", t.hooks().as_str()),
            }
            Some(Arc::new(t))
        }
        Some(Err(e)) => {
            return Err(anyhow::Error::new(e)
                .context("starting the eBPF request tracer (needed by apps with feedback: ebpf)"))
        }
    };

    let power = if cfg.sensors.power {
        match PowerSensor::open(&cfg.power, &cfg.actuators.root) {
            Ok(p) => Some(p),
            Err(e) => {
                println!("power: not measured ({e}); power_w is null");
                None
            }
        }
    } else {
        println!("power: off (sensors.power: false)");
        None
    };
    let nr_slots = (cfg.decide_interval_ms / cfg.monitor_interval_ms).max(1) as usize;
    let knobs = knob_table(&act, &cfg.actuators.enabled);
    let info = RunInfo {
        version: env!("CARGO_PKG_VERSION"),
        policy: policy.name.clone(),
        config: o.config.display().to_string(),
        monitor_interval_ms: cfg.monitor_interval_ms,
        decide_interval_ms: cfg.decide_interval_ms,
        latency_window_ms: cfg.decide_interval_ms,
        dry_run: cfg.actuators.dry_run,
        knobs: knobs.clone(),
        ebpf: tracer.is_some(),
        power: power
            .as_ref()
            .map_or("none".into(), |p| p.caps().source.to_string()),
        started_unix_ms: unix_ms(),
    };
    let mut shared = Shared::new(info);
    for a in &cfg.apps {
        shared.apps.insert(
            a.name.clone(),
            live_entry(a, feedback_of(a.feedback), nr_slots),
        );
    }
    let shared = SharedState::new(shared);

    println!(
        "qosd {}: policy {} ({}), seed {}; monitor every {} ms, decide every {} ms{}",
        env!("CARGO_PKG_VERSION"),
        policy.name,
        ppath.display(),
        cfg.seed,
        cfg.monitor_interval_ms,
        cfg.decide_interval_ms,
        if cfg.actuators.dry_run {
            "; DRY RUN: no knob is changed"
        } else {
            ""
        }
    );
    println!("knobs:");
    for k in &knobs {
        let state = if k.in_use { "in use" } else { "skipped" };
        let backend = k.backend.as_deref().unwrap_or("-");
        println!(
            "  {:<17} {state:<8} {backend:<9} {}",
            k.resource.name(),
            k.reason
        );
    }
    match &tracer {
        Some(_) => println!(
            "sensors: ebpf request tracer (ring buffer {} KiB, window {} requests); cpu from /proc",
            cfg.sensors.ring_buffer_kib, cfg.sensors.window_requests
        ),
        None => println!("sensors: client feedback only; cpu from /proc"),
    }
    if let Some(p) = &power {
        let c = p.caps();
        let via = if c.backend == c.source.to_string() {
            String::new()
        } else {
            format!(" via {}", c.backend)
        };
        let est = if c.source.is_estimate() {
            " (ESTIMATES)"
        } else {
            ""
        };
        let weight = match c.weight {
            qosd_sensors::power::Weight::Cycles => "cycles",
            qosd_sensors::power::Weight::Time => "on-CPU time",
        };
        println!(
            "power: {}{via}{est}, threads weighed by {weight}; per-app watts every decision",
            c.source
        );
        for n in &c.notes {
            println!("  {n}");
        }
    }

    let mut ctl = Controller::new(
        &cfg.apps,
        o.feedback,
        policy.build(cfg.seed),
        act,
        tracer.clone(),
        shared.clone(),
        &cfg.actuators.root,
        cfg.actuators.dry_run,
    );
    if let Some(p) = power {
        ctl.set_power(p);
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
    let start = Instant::now();
    // A signal during start-up: no first change at all.
    let early = sigs.pending();
    let events = match early {
        None => ctl.tick(0, 0.0, true, false),
        Some(_) => Vec::new(),
    };
    println!("apps:");
    for a in &cfg.apps {
        let fb = match a.job {
            Some(_) => "none (batch job)".to_owned(),
            None => feedback_of(a.feedback).to_string(),
        };
        let t = describe_target(a.qos_target());
        let m = &a.matcher;
        let how = match (m.pid, &m.comm, &m.cgroup, &m.pod) {
            _ if a.job.is_some() => "its batch job".to_owned(),
            (Some(p), _, _, _) => format!("pid {p}"),
            (_, Some(c), _, _) => format!("comm {c}"),
            (_, _, Some(g), _) => format!("cgroup {}", g.display()),
            (_, _, _, Some(p)) => format!("pod {}", crate::kube::describe(p)),
            _ => "-".into(),
        };
        let sh = shared.lock();
        let live = sh.apps.get(&a.name);
        let pids = live.map(|l| l.pids.clone()).unwrap_or_default();
        let what = if pids.is_empty() {
            "not running yet (picked up when it appears)".to_owned()
        } else if live.is_some_and(|l| l.share.is_some()) {
            format!("pids {pids:?}: {}", ctl.describe(&a.name))
        } else {
            format!(
                "pids {pids:?}: {}",
                live.and_then(|l| l.note.clone()).unwrap_or_default()
            )
        };
        let class = match a.class {
            qosd_core::AppClass::Lc => "lc",
            qosd_core::AppClass::Be => "be",
        };
        println!(
            "  {:<12} {class} {t}, feedback {fb}, match {how}: {what}",
            a.name
        );
    }
    for e in events.iter().filter(|e| !e.starts_with("app ")) {
        println!("{e}");
    }
    let addr = listener.local_addr().unwrap_or(cfg.api.listen);
    println!(
        "api: http://{addr} (GET /v1/apps, /v1/pids/PID/..., /v1/decisions, /metrics; POST /v1/apps/NAME/latency)"
    );
    println!(
        "api: writes need `Authorization: Bearer <token>`, the token in {} ({})",
        token_path.display(),
        if token_created {
            "made now, mode 0600"
        } else {
            "mode 0600"
        }
    );
    if !addr.ip().is_loopback() {
        println!(
            "WARNING: api: listening on {addr}, not loopback (api.allow_remote): every GET and \
             /metrics is open to whoever reaches it; writes still need the token"
        );
    }
    let (limits, lowered) = server::Limits::capped(
        cfg.api.max_connections as usize,
        Duration::from_millis(cfg.api.request_timeout_ms),
    );
    if let Some(nofile) = lowered {
        println!(
            "api: at most {} connections (half the open-file limit {nofile}; api.max_connections is {})",
            limits.max_connections, cfg.api.max_connections
        );
    }
    let credential = Arc::new(auth::Credential::new(token));
    let app = api::router(api::Api {
        shared: shared.clone(),
        tracer: tracer.clone(),
        token: credential.clone(),
    });
    let server = server::Server::spawn(listener, app, limits);

    let sigs = sigs.watch()?;
    let mut wake = Wakeups::new(sigs, early, &o, cfg.clone(), watch, credential);
    let cadence = Cadence {
        monitor_ms: cfg.monitor_interval_ms,
        interval_ms: cfg.decide_interval_ms,
    };
    let why = ctl.run(&o, &mut wake, cadence, start).await;
    println!("stopping ({why}): putting every knob back");
    server.shutdown(SHUTDOWN_GRACE).await;
    for e in ctl.stop_jobs() {
        println!("{e}");
    }
    let restored = ctl.actuation_mut().restore_all();
    let detach = if tracer.is_some() {
        "; detaching the eBPF programs"
    } else {
        ""
    };
    let result = match restored {
        // A dry run changed nothing: the journal only held what it logged.
        Ok(c) if cfg.actuators.dry_run => {
            println!(
                "dry run: nothing to put back ({} logged changes were never made){detach}",
                c.len()
            );
            Ok(())
        }
        Ok(c) => {
            for ch in &c {
                println!("restored {ch}");
            }
            println!("restored {} settings{detach}", c.len());
            Ok(())
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!(
            "restoring; what failed stays in {} for `qosd restore`",
            act_cfg.state_path().display()
        ))),
    };
    // Detaching every tracepoint waits for the kernel's RCU grace
    // periods: about a second and a half here, after the knobs are back.
    drop(ctl);
    drop(tracer);
    result
}
