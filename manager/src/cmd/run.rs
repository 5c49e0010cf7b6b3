//! `qosd run`: the node daemon (control loop, HTTP API, `/metrics`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args as ClapArgs, ValueEnum};
use qosd_core::Feedback;

use crate::daemon;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FeedbackArg {
    /// Server-side latency from the eBPF request tracer.
    Ebpf,
    /// Latency pushed by a load generator: POST /v1/apps/NAME/latency
    /// with `Authorization: Bearer <token>` (the token of api.token_file).
    Client,
}

#[derive(ClapArgs, Debug)]
#[command(after_help = "Examples:\n  \
    qosd run                                   ./config.yaml, else /etc/qosd/config.yaml\n  \
    qosd run --config /etc/qosd/config.yaml --dry-run    log changes, make none\n  \
    qosd run --feedback client --policy policies/power-saver.yaml\n\n\
    While it runs:\n  \
    curl -s 127.0.0.1:9477/v1/apps             apps, allocations, latency, RPS\n  \
    curl -s 127.0.0.1:9477/v1/pids/PID/latency_percentile?p=99\n  \
    curl -s 127.0.0.1:9477/metrics             Prometheus\n  \
    qosd metrics --app memcached               the same from the CLI\n  \
    T=$(cat /run/qosd/api.token)               writes need api.token_file's token (root only)\n  \
    curl -s -H \"Authorization: Bearer $T\" -H 'content-type: application/json' \\\n      \
      -d '{\"latencies_us\":[120,98]}' 127.0.0.1:9477/v1/apps/memcached/latency\n\n\
    SIGINT, SIGTERM, SIGHUP (any terminating signal) stop it and put every\n\
    knob back (exit 0). A bad config or policy exits 2 before anything is\n\
    changed. Needs root for eBPF and the knobs.")]
pub struct Args {
    /// The daemon's configuration file; default: ./config.yaml (a source
    /// checkout), else /etc/qosd/config.yaml (`make install`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Latency source of every app, overriding each app's `feedback`.
    #[arg(long, value_enum, value_name = "SOURCE")]
    pub feedback: Option<FeedbackArg>,
    /// Decide and log every change, make none.
    #[arg(long)]
    pub dry_run: bool,
    /// Policy file, overriding the config's `policy`.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// API address, overriding the config's `api.listen` (not loopback:
    /// only with `api.allow_remote: true`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    daemon::run(daemon::Options {
        config: crate::paths::resolve_config(a.config.as_deref())?,
        feedback: a.feedback.map(|f| match f {
            FeedbackArg::Ebpf => Feedback::Ebpf,
            FeedbackArg::Client => Feedback::Client,
        }),
        dry_run: a.dry_run,
        policy: a.policy,
        listen: a.listen,
    })
}
