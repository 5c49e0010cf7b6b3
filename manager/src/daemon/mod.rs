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
mod banner;
pub mod control;
pub mod discover;
pub mod jobs;
pub mod metrics;
mod net;
pub mod reload;
pub mod server;
mod start;
pub mod state;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use qosd_core::control::Cadence;
use qosd_core::Feedback;

use crate::config::Config;
use crate::policy::PolicyFile;
use crate::signals::{self, Signals};
use crate::usage;
use crate::yamlfile;
use control::{Controller, Wakeups};

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

/// The daemon: set up (nothing is touched before every refusal is past),
/// run the loop until a signal, shut down (every knob put back).
async fn serve(
    o: Options,
    cfg: Config,
    policy: PolicyFile,
    ppath: PathBuf,
    sigs: Signals,
) -> anyhow::Result<()> {
    let held = start::hold(&cfg).await?;
    let token_path = cfg.api.token_path(&cfg.actuators.root);
    let watch = auth::TokenWatch::new(&token_path);
    let act = start::actuation(&cfg)?;
    let tracer = start::tracer(&cfg, o.feedback)?;
    let power = start::power(&cfg);
    let knobs = start::knob_table(&act, &cfg.actuators.enabled);
    let shared = start::shared_state(&o, &cfg, &policy, knobs.clone(), tracer.is_some(), &power);
    banner::run(
        &cfg,
        &policy.name,
        &ppath,
        &knobs,
        tracer.is_some(),
        power.as_ref(),
    );
    let mut ctl = start::controller(
        &o,
        &cfg,
        &policy,
        act,
        tracer.clone(),
        power,
        held.pods,
        shared.clone(),
    )?;

    let start = Instant::now();
    // A signal during start-up: no first change at all.
    let early = sigs.pending();
    let events = match early {
        None => ctl.tick(0, 0.0, true, false),
        Some(_) => Vec::new(),
    };
    banner::apps(&cfg, o.feedback, &shared, &ctl, &events);
    let addr = held.listener.local_addr().unwrap_or(cfg.api.listen);
    let limits = server::Limits::capped(
        cfg.api.max_connections as usize,
        Duration::from_millis(cfg.api.request_timeout_ms),
    );
    banner::api(&cfg, addr, &token_path, held.token_created, &limits);
    let credential = Arc::new(auth::Credential::new(held.token));
    let app = api::router(api::Api {
        shared: shared.clone(),
        tracer: tracer.clone(),
        token: credential.clone(),
    });
    let server = server::Server::spawn(held.listener, app, limits.0);

    let mut wake = Wakeups::new(sigs.watch()?, early, &o, cfg.clone(), watch, credential);
    let cadence = Cadence {
        monitor_ms: cfg.monitor_interval_ms,
        interval_ms: cfg.decide_interval_ms,
    };
    let why = ctl.run(&o, &mut wake, cadence, start).await;
    println!("stopping ({why}): putting every knob back");
    server.shutdown(SHUTDOWN_GRACE).await;
    let result = shutdown(&cfg, &mut ctl, tracer.is_some());
    // Detaching every tracepoint waits for the kernel's RCU grace
    // periods: about a second and a half here, after the knobs are back.
    drop(ctl);
    drop(tracer);
    drop(held.groups);
    result
}

/// Stops the batch jobs and puts every knob back.
fn shutdown(cfg: &Config, ctl: &mut Controller, ebpf: bool) -> anyhow::Result<()> {
    for e in ctl.stop_jobs() {
        println!("{e}");
    }
    let restored = ctl.actuation_mut().restore_all();
    let detach = if ebpf {
        "; detaching the eBPF programs"
    } else {
        ""
    };
    match restored {
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
            start::act_config(cfg).state_path().display()
        ))),
    }
}
