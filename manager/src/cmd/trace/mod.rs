//! `qosd trace`: live per-interval RPS and server-side latency of running
//! processes, from the eBPF request sensor; a summary over the whole run at
//! the end (duration reached, Ctrl-C, or every target exited).

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args as ClapArgs;
use qosd_sensors::ebpf::{
    Aggregate, HookChoice, Mode, RequestTracer, TargetOptions, TraceError, TracerOptions,
};
use qosd_sensors::power::{PowerConfig, PowerSensor};

use crate::config::Match;
use crate::daemon::discover::Finder;
use crate::secs::{secs, MAX_SECS};
use crate::{signals, usage};

mod print;
use print::Line;

#[derive(ClapArgs, Debug)]
#[command(after_help = "Examples:\n  \
    qosd trace --pid $(pidof memcached) --json\n  \
    qosd trace --pid 1234 --pid 5678 --interval 0.5 --duration 30\n  \
    qosd trace --pid $(pidof -s nginx) --mode connection --port 80\n  \
    qosd trace --pid $(pidof my-grpc-server) --mode grpc\n  \
    qosd trace --pid $(cat /run/nginx.pid)     # the master and its workers\n  \
    qosd trace --comm memcached --port 11211\n\n\
    Modes: `connection` counts one request per accepted connection (accept ->\n\
    close); `turn` counts request/response turns on persistent connections\n\
    (keep-alive HTTP, memcached, redis); `grpc` counts gRPC calls multiplexed\n\
    on HTTP/2 connections, with uprobes on the server's gRPC library (grpc-go\n\
    executables with symbols, or a gRPC C-core shared library with symbols;\n\
    otherwise it warns and falls back to `turn`); `auto` picks one per\n\
    process from what it sees. Two figures per request, both server-side and\n\
    ending at the last reply bytes written: latency (`p99_us`...) from the\n\
    request's arrival in the server's socket, waiting for the CPU included,\n\
    and service (`svc_p99_us`...) from the server's first read (gRPC: from\n\
    the call handed to the server, to the status). A pid is traced with its\n\
    descendants, present and forked later (pre-fork servers: trace the\n\
    master). Hooks: socket tracepoints; where the kernel lacks them, syscall\n\
    tracepoints (latency = service there; descendants followed too); the\n\
    first line says which. Needs root.")]
pub struct Args {
    /// Process to trace, with its descendants (repeat for several).
    #[arg(long, value_name = "PID", required_unless_present_any = ["comm", "cgroup"])]
    pub pid: Vec<u32>,
    /// Trace the processes with this command name (/proc/PID/comm); one
    /// whose parent matches too is followed as the parent's descendant.
    #[arg(long, value_name = "NAME")]
    pub comm: Option<String>,
    /// Trace the processes of this cgroup directory (cgroup.procs).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<std::path::PathBuf>,
    /// Stop after this many seconds (default: until Ctrl-C or every target exits).
    #[arg(long, allow_negative_numbers = true, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Seconds between lines.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value_t = 1.0,
        value_name = "SECS"
    )]
    pub interval: f64,
    /// How requests are delimited.
    #[arg(long, default_value = "auto", value_parser = ["auto", "connection", "turn", "grpc"])]
    pub mode: String,
    /// Only connections accepted on this local port (repeatable).
    #[arg(value_parser = clap::value_parser!(u16).range(1..), long, value_name = "N")]
    pub port: Vec<u16>,
    /// One JSON object per line (and a last line with "summary": true).
    #[arg(long)]
    pub json: bool,
    /// Add power columns: watts attributed to the process and joules per
    /// request (the power sensor: RAPL, or a model estimate where there is
    /// none, marked as such).
    #[arg(long)]
    pub power: bool,
    /// Ring buffer size in KiB (a power of two).
    #[arg(long, default_value_t = 128, value_name = "KIB")]
    pub ringbuf_kib: u32,
    /// Kernel hooks: socket tracepoints, syscall tracepoints (the
    /// fallback), or sockets where the kernel has them [default: auto, or
    /// $QOSD_HOOKS].
    #[arg(long, value_parser = ["auto", "sockets", "syscalls"])]
    pub hooks: Option<String>,
    #[command(flatten)]
    pub aggregate: AggregateArg,
}

/// `--aggregate`, the one definition `qosd trace` and `qosd replay` share
/// (the daemon's is `sensors.aggregate` in its config).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct AggregateArg {
    /// Where requests are aggregated: `records` (one ring-buffer record per
    /// request, statistics in userspace) or `kernel` (histograms in BPF
    /// maps, read every 100 ms; docs/aggregation.md) [default: records, or
    /// $QOSD_AGGREGATE].
    #[arg(long = "aggregate", value_name = "kernel|records",
          value_parser = clap::value_parser!(Aggregate))]
    pub choice: Option<Aggregate>,
}

impl AggregateArg {
    /// The choice given, else `$QOSD_AGGREGATE`, else `records`.
    pub fn get(&self) -> Aggregate {
        self.choice.unwrap_or_else(Aggregate::from_env)
    }
}

/// The pids to trace: --pid as given, plus --comm and --cgroup matches
/// found with the daemon's own `match:` code, keeping only the topmost of
/// a process tree (its descendants are followed under it).
fn select(a: &Args) -> anyhow::Result<Vec<u32>> {
    let mut pids = a.pid.clone();
    let matchers: Vec<Match> = [
        a.comm.as_ref().map(|c| Match {
            comm: Some(c.clone()),
            ..Default::default()
        }),
        a.cgroup.as_ref().map(|g| Match {
            cgroup: Some(g.clone()),
            ..Default::default()
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    if matchers.is_empty() {
        return Ok(pids);
    }
    if let Some(g) = &a.cgroup {
        if !g.join("cgroup.procs").is_file() {
            return Err(usage!(
                "--cgroup {}: not a cgroup directory (no cgroup.procs)",
                g.display()
            ));
        }
    }
    let refs: Vec<&Match> = matchers.iter().collect();
    let mut found: Vec<i32> = Finder::new("/")
        .find_all(&refs, &[])
        .into_iter()
        .flatten()
        .filter(|&p| p > 0)
        .collect();
    found.sort_unstable();
    found.dedup();
    if found.is_empty() {
        return Err(usage!(
            "no process matches{}{}",
            a.comm
                .as_ref()
                .map_or(String::new(), |c| format!(" --comm {c}")),
            a.cgroup
                .as_ref()
                .map_or(String::new(), |g| format!(" --cgroup {}", g.display()))
        ));
    }
    for p in crate::daemon::discover::topmost(&found) {
        let p = p as u32; // > 0: filtered above
        if !pids.contains(&p) {
            pids.push(p);
        }
    }
    Ok(pids)
}

fn trace_err(e: TraceError) -> anyhow::Error {
    if e.is_usage() {
        usage!("{e}")
    } else {
        anyhow::Error::new(e)
    }
}

/// The interval and the run length, checked; then every pid.
fn check_args(a: &Args) -> anyhow::Result<(Duration, Option<Duration>)> {
    let interval = secs("--interval", a.interval, 0.01, 3600.0)?;
    let duration = a
        .duration
        .map(|d| secs("--duration", d, 0.0, MAX_SECS))
        .transpose()?;
    for &pid in &a.pid {
        check_user_pid(pid)?;
    }
    Ok((interval, duration))
}

/// A live user process: not pid 0, not gone, not a kernel thread (tracing
/// one would attach to nothing it serves and report nothing).
fn check_user_pid(pid: u32) -> anyhow::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| usage!("no such process: pid {pid}"))?;
    qosd_actuators::proc::check_pid(&qosd_actuators::Root::default(), pid).map_err(|e| match e {
        qosd_actuators::Error::NoSuchPid(_) => usage!("no such process: pid {pid}"),
        e => usage!("{e}"),
    })
}

/// The boundary mode and the tracer's options the arguments ask for.
fn tracer_options(a: &Args) -> anyhow::Result<(Mode, TracerOptions)> {
    let mode: Mode = a.mode.parse().map_err(|e: String| usage!("{e}"))?;
    let mut topts = TracerOptions {
        ringbuf_bytes: a.ringbuf_kib.saturating_mul(1024),
        ..Default::default()
    };
    if let Some(h) = &a.hooks {
        topts.hooks = h.parse::<HookChoice>().map_err(|e: String| usage!("{e}"))?;
    }
    topts.aggregate = a.aggregate.get();
    Ok((mode, topts))
}

pub fn run(mut a: Args) -> anyhow::Result<()> {
    let (interval, duration) = check_args(&a)?;
    let (mode, topts) = tracer_options(&a)?;
    a.pid = select(&a)?;
    let tracer = RequestTracer::start(topts).map_err(trace_err)?;
    for &pid in &a.pid {
        let opts = TargetOptions {
            mode,
            ports: a.port.clone(),
            follow_children: true,
        };
        tracer.add_target(pid, opts).map_err(trace_err)?;
    }
    let mut power = if a.power {
        let ps = PowerSensor::open(&PowerConfig::default(), std::path::Path::new("/"))
            .context("starting the power sensor (--power)")?;
        Some(ps)
    } else {
        None
    };
    signals::install()?;
    let start = Instant::now();
    let mut out = std::io::stdout().lock();
    print::banner(&mut out, a.json, a.power, &tracer)?;
    let end = duration.map(|d| start + d);
    live(
        &mut out,
        &a,
        &tracer,
        power.as_mut(),
        (start, interval, end),
    )?;
    // Replies already sent on connections still open are finished requests.
    for &pid in &a.pid {
        tracer.flush_open(pid).map_err(trace_err)?;
    }
    let t_s = start.elapsed().as_secs_f64();
    print::totals(&mut out, (a.json, &a.pid, &a.port), &tracer, t_s)?;
    out.flush().context("writing to stdout")?;
    Ok(())
}

/// A line per pid every `interval` from `start` until `end`, a stop
/// signal, or every pid has exited.
fn live(
    out: &mut impl Write,
    a: &Args,
    tracer: &RequestTracer,
    mut power: Option<&mut PowerSensor>,
    (start, interval, end): (Instant, Duration, Option<Instant>),
) -> anyhow::Result<()> {
    let mut next = start + interval;
    loop {
        // Sleep to the next deadline in small steps so Ctrl-C is prompt.
        let stop_at = end.map_or(next, |e| e.min(next));
        while Instant::now() < stop_at && !signals::stop_requested() {
            std::thread::sleep((stop_at - Instant::now()).min(Duration::from_millis(50)));
        }
        let t_s = start.elapsed().as_secs_f64();
        let finished = signals::stop_requested() || end.is_some_and(|e| Instant::now() >= e);
        let mut all_exited = true;
        let sample = match power.as_deref_mut() {
            Some(ps) => Some(ps.sample().context("sampling power")?),
            None => None,
        };
        for &pid in &a.pid {
            let Some(r) = tracer.take_report(pid) else {
                continue;
            };
            all_exited &= r.exited;
            if Instant::now() >= next || finished {
                let pw = sample.as_ref().map(|s| s.app(&[pid], Some(r.interval.rps)));
                let line = Line {
                    t_s,
                    pid,
                    mode: r.mode,
                    k: &r.interval,
                    svc: &r.service_interval,
                    dropped: tracer.dropped(),
                    by_turns: 0,
                    timed_by_turns: 0,
                    power: pw.as_ref(),
                };
                print::line(out, a.json, &line, None)?;
            }
        }
        next += interval;
        if finished || all_exited {
            break;
        }
    }
    Ok(())
}
