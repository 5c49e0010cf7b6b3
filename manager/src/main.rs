//! `qosd`: node-level QoS and power manager for latency-critical services.
//!
//! The binary is thin: it parses the command line and hands each subcommand
//! to its module in `cmd/`. Exit codes: 0 success, 1 runtime failure,
//! 2 usage or invalid input (see [`qosd_manager::exit`]).

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use qosd_manager::{cmd, exit};

/// Keep latency-critical services within their QoS targets with the fewest
/// cores, cache ways and watts, watching them from the outside with eBPF.
#[derive(Parser)]
#[command(name = "qosd", version, about, long_about = None)]
#[command(after_help = "Examples:\n  \
    qosd trace --pid $(pidof memcached) --json     live RPS and latency of a process\n  \
    qosd trace --pid 1234 --pid 5678 --duration 10 several processes for 10 s\n  \
    qosd check config.yaml policies/*.yaml         validate files (file:line:col on error)\n  \
    qosd power --pid $(pidof nginx)                power of a process and its threads\n  \
    qosd run --config config.yaml                  the daemon (API on 127.0.0.1:9477)\n  \
    qosd metrics --app memcached                   ask a running daemon\n\n\
    Exit codes: 0 success, 1 runtime failure, 2 usage or invalid input.")]
struct Cli {
    /// Log filter (error, warn, info, debug, trace or a tracing directive);
    /// also read from QOSD_LOG.
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Per-interval RPS and server-side latency of running processes (eBPF).
    Trace(cmd::trace::Args),
    /// Open-loop load generator (HTTP/1.1, memcached or gRPC) with latency from the scheduled send time.
    Load(cmd::load::Args),
    /// Replay a scenario on real servers or on the simulated node (--sim).
    Replay(cmd::replay::Args),
    /// Table and overlay plot of several replays.
    Compare(cmd::compare::Args),
    /// Find each app's capacity and knee on this machine (or the sim).
    Calibrate(cmd::calibrate::Args),
    /// Fixture HTTP server for scenarios and tests.
    #[command(hide = true)]
    Fixture(cmd::fixture::Args),
    /// Best-effort batch job (hashing) that prints its progress, for scenarios and tests.
    #[command(hide = true)]
    Batch(cmd::batch::Args),
    /// Which knobs (every row of the knob table) and backends this machine has.
    Caps(cmd::caps::Args),
    /// Change one knob by hand (one-shot; `qosd restore` puts it back).
    Set(cmd::set::Args),
    /// Put back everything recorded in the state file.
    Restore(cmd::restore::Args),
    /// Validate config, policy and scenario files (exit 0 valid, 2 invalid).
    Check(cmd::check::Args),
    /// Per-process and per-thread power and its source (RAPL, or a model).
    Power(cmd::power::Args),
    /// Per-peer packets, bytes and millisecond peak rates on interfaces (TC eBPF).
    Net(cmd::net::Args),
    /// The node daemon: control loop, HTTP API and Prometheus /metrics.
    Run(cmd::run::Args),
    /// Figures of a running daemon (per app or per pid).
    Metrics(cmd::metrics::Args),
    /// Shell completions (bash, zsh, fish) or man pages, from these definitions.
    Completions(cmd::completions::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // clap prints help/version to stdout (exit 0) and errors to
            // stderr (exit 2).
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE } else { 0 });
        }
    };
    exit::init_logging(cli.log.as_deref());
    // The hedge knob lives in its own crate, which builds on the actuators.
    qosd_hedge::knob::link();
    let result = match cli.command {
        Command::Trace(a) => cmd::trace::run(a),
        Command::Load(a) => cmd::load::run(a),
        Command::Replay(a) => cmd::replay::run(a),
        Command::Compare(a) => cmd::compare::run(a),
        Command::Calibrate(a) => cmd::calibrate::run(a),
        Command::Fixture(a) => cmd::fixture::run(a),
        Command::Batch(a) => cmd::batch::run(a),
        Command::Caps(a) => cmd::caps::run(a),
        Command::Set(a) => cmd::set::run(a),
        Command::Restore(a) => cmd::restore::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::Power(a) => cmd::power::run(a),
        Command::Net(a) => cmd::net::run(a),
        Command::Run(a) => cmd::run::run(a),
        Command::Metrics(a) => cmd::metrics::run(a),
        Command::Completions(a) => cmd::completions::run(a, Cli::command()),
    };
    exit::report(result)
}
