//! What `qosd run` says when it starts: the policy and cadence, each knob
//! (in use, or why not), the sensors, each app (how it is matched and what
//! it holds after the first tick) and where the API listens.

use std::net::SocketAddr;
use std::path::Path;

use qosd_core::Feedback;
use qosd_sensors::power::PowerSensor;

use super::control::{describe_target, Controller};
use super::server::Limits;
use super::state::{KnobInfo, SharedState};
use crate::config::{AppConfig, Config};

/// The run's first lines: policy, cadence, knobs, sensors and power.
pub fn run(
    cfg: &Config,
    policy: &str,
    ppath: &Path,
    knobs: &[KnobInfo],
    ebpf: bool,
    power: Option<&PowerSensor>,
) {
    println!(
        "qosd {}: policy {policy} ({}), seed {}; monitor every {} ms, decide every {} ms{}",
        env!("CARGO_PKG_VERSION"),
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
    for k in knobs {
        let state = if k.in_use { "in use" } else { "skipped" };
        let backend = k.backend.as_deref().unwrap_or("-");
        println!(
            "  {:<17} {state:<8} {backend:<9} {}",
            k.resource.name(),
            k.reason
        );
    }
    if ebpf {
        println!(
            "sensors: ebpf request tracer (ring buffer {} KiB, window {} requests); cpu from /proc",
            cfg.sensors.ring_buffer_kib, cfg.sensors.window_requests
        );
    } else {
        println!("sensors: client feedback only; cpu from /proc");
    }
    if let Some(p) = power {
        power_lines(p);
    }
    realtime_line(cfg);
}

/// The gate's bounds and the RT budget, when an app asks for real time.
fn realtime_line(cfg: &Config) {
    let wants: Vec<&str> = cfg
        .apps
        .iter()
        .filter(|a| a.wants_realtime())
        .map(|a| a.name.as_str())
        .collect();
    if wants.is_empty() {
        return;
    }
    let rt = &cfg.realtime;
    println!(
        "realtime: {} (on below {} / off above {} of the CPUs held); group RT budget {} µs \
         per 1 s period per CPU in cpu.rt_runtime_us (realtime.budget_us)",
        wants.join(", "),
        rt.on_below,
        rt.off_above,
        rt.budget_us
    );
}

fn power_lines(p: &PowerSensor) {
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

/// Each configured app after the first tick, then that tick's lines
/// (but the per-app ones, said here already).
pub fn apps(
    cfg: &Config,
    feedback: Option<Feedback>,
    shared: &SharedState,
    ctl: &Controller,
    first_tick: &[String],
) {
    println!("apps:");
    for a in &cfg.apps {
        let fb = match a.job {
            Some(_) => "none (batch job)".to_owned(),
            None => feedback.unwrap_or(a.feedback).to_string(),
        };
        let t = describe_target(a.qos_target());
        let class = match a.class {
            qosd_core::AppClass::Lc => "lc",
            qosd_core::AppClass::Be => "be",
        };
        println!(
            "  {:<12} {class} {t}, feedback {fb}, match {}: {}",
            a.name,
            matched_by(a),
            holds(a, shared, ctl)
        );
    }
    for e in first_tick.iter().filter(|e| !e.starts_with("app ")) {
        println!("{e}");
    }
}

/// How app `a` is found.
fn matched_by(a: &AppConfig) -> String {
    let m = &a.matcher;
    match (m.pid, &m.comm, &m.cgroup, &m.pod) {
        _ if a.job.is_some() => "its batch job".to_owned(),
        (Some(p), _, _, _) => format!("pid {p}"),
        (_, Some(c), _, _) => format!("comm {c}"),
        (_, _, Some(g), _) => format!("cgroup {}", g.display()),
        (_, _, _, Some(p)) => format!("pod {}", crate::kube::describe(p)),
        _ => "-".into(),
    }
}

/// App `a`'s processes and what they hold, or why nothing.
fn holds(a: &AppConfig, shared: &SharedState, ctl: &Controller) -> String {
    let sh = shared.lock();
    let live = sh.apps.get(&a.name);
    let pids = live.map(|l| l.pids.clone()).unwrap_or_default();
    if pids.is_empty() {
        "not running yet (picked up when it appears)".to_owned()
    } else if live.is_some_and(|l| l.share.is_some()) {
        format!("pids {pids:?}: {}", ctl.describe(&a.name))
    } else {
        format!(
            "pids {pids:?}: {}",
            live.and_then(|l| l.note.clone()).unwrap_or_default()
        )
    }
}

/// Where the API listens, how writes are allowed, and its limits.
pub fn api(
    cfg: &Config,
    addr: SocketAddr,
    token_path: &Path,
    created: bool,
    (limits, lowered): &(Limits, Option<u64>),
) {
    println!(
        "api: http://{addr} (GET /v1/apps, /v1/pids/PID/..., /v1/decisions, /metrics; POST /v1/apps/NAME/latency)"
    );
    println!(
        "api: writes need `Authorization: Bearer <token>`, the token in {} ({})",
        token_path.display(),
        if created {
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
    if let Some(nofile) = lowered {
        println!(
            "api: at most {} connections (half the open-file limit {nofile}; api.max_connections is {})",
            limits.max_connections, cfg.api.max_connections
        );
    }
}
