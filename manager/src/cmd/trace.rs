//! `qosd trace`: live per-interval RPS and server-side latency of running
//! processes, from the eBPF request sensor; a summary over the whole run at
//! the end (duration reached, Ctrl-C, or every target exited).

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args as ClapArgs;
use qosd_core::AppPower;
use qosd_sensors::ebpf::{
    Aggregate, HookChoice, Hooks, KindReport, Mode, RequestTracer, TargetOptions, TargetReport,
    TraceError, TracerOptions,
};
use qosd_sensors::power::{PowerConfig, PowerSensor};
use serde_json::json;

use crate::config::Match;
use crate::daemon::discover::Finder;
use crate::secs::{secs, MAX_SECS};
use crate::{signals, usage};

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
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Seconds between lines.
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
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

pub fn run(mut a: Args) -> anyhow::Result<()> {
    let (interval, duration) = check_args(&a)?;
    let mode: Mode = a.mode.parse().map_err(|e: String| usage!("{e}"))?;
    let mut topts = TracerOptions {
        ringbuf_bytes: a.ringbuf_kib.saturating_mul(1024),
        ..Default::default()
    };
    if let Some(h) = &a.hooks {
        topts.hooks = h.parse::<HookChoice>().map_err(|e: String| usage!("{e}"))?;
    }
    topts.aggregate = a.aggregate.get();
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
    let banner = match (tracer.hooks(), tracer.fallback_reason()) {
        (Hooks::Sockets, _) => "hooks: sockets (socket tracepoints; latency from each \
                                request's arrival, service from the first read)"
            .to_string(),
        (Hooks::Syscalls, why) => format!(
            "hooks: syscalls (fallback: {}; latency = service, from the first read)",
            why.unwrap_or("asked for")
        ),
    };
    let mut power = if a.power {
        let ps = PowerSensor::open(&PowerConfig::default(), std::path::Path::new("/"))
            .context("starting the power sensor (--power)")?;
        Some(ps)
    } else {
        None
    };
    signals::install()?;
    let start = Instant::now();
    let end = duration.map(|d| start + d);
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(
            out,
            "{}",
            json!({ "hooks": tracer.hooks().as_str(), "aggregate": tracer.aggregate().as_str(),
                "banner": banner })
        )?;
    } else {
        writeln!(out, "{banner}")?;
        writeln!(
            out,
            "{}{}",
            header(),
            if a.power {
                "   power_w  mJ/request"
            } else {
                ""
            }
        )?;
    }
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
        let sample = match power.as_mut() {
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
                    power: pw.as_ref(),
                };
                print_line(&mut out, a.json, &line, None)?;
            }
        }
        next += interval;
        if finished || all_exited {
            break;
        }
    }
    // Replies already sent on connections still open are finished requests.
    for &pid in &a.pid {
        tracer.flush_open(pid).map_err(trace_err)?;
    }
    let t_s = start.elapsed().as_secs_f64();
    for &pid in &a.pid {
        if let Some(r) = tracer.take_report(pid) {
            let line = Line {
                t_s,
                pid,
                mode: r.mode,
                k: &r.total,
                svc: &r.service_total,
                dropped: tracer.dropped(),
                by_turns: tracer.counted_by_turns(),
                power: None,
            };
            print_line(&mut out, a.json, &line, Some(&r))?;
            if !a.json {
                if let Some(p) = &r.probes {
                    writeln!(out, "pid {pid}: gRPC calls from uprobes on {p}")?;
                }
                if let Some(w) = &r.warning {
                    writeln!(out, "pid {pid}: warning: {w}")?;
                }
                if line.by_turns > 0 {
                    writeln!(
                        out,
                        "{} connection(s) counted one request per turn: their bytes could not \
                         be read, or a read needed more parsing than the counter's bound \
                         (docs/requests.md)",
                        line.by_turns
                    )?;
                }
                if r.exited {
                    writeln!(out, "pid {pid} exited during the trace")?;
                }
            }
            if r.connections == 0 {
                // Said on stderr too, so that --json users see it.
                let note = no_connection_note(pid, &a.port);
                if !a.json {
                    writeln!(out, "{note}")?;
                }
                eprintln!("qosd trace: {note}");
            }
        }
    }
    out.flush().context("writing to stdout")?;
    Ok(())
}

/// Why a target may have shown nothing.
fn no_connection_note(pid: u32, ports: &[u16]) -> String {
    let on = if ports.is_empty() {
        String::new()
    } else {
        format!(" on port(s) {ports:?}")
    };
    format!(
        "pid {pid}: no connection was seen{on} during the trace: it (and its descendants) \
         accepted or served none; check the pid (a server's workers, not a launcher script) \
         and --port"
    )
}

fn header() -> String {
    format!(
        "{:>7} {:>8} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7}",
        "t_s",
        "pid",
        "mode",
        "requests",
        "rps",
        "latest_us",
        "mean_us",
        "p50_us",
        "p95_us",
        "p99_us",
        "svc_p50_us",
        "svc_p99_us",
        "dropped"
    )
}

/// One line of output: a pid's figures over an interval or the whole run.
struct Line<'a> {
    t_s: f64,
    pid: u32,
    mode: Mode,
    k: &'a KindReport,
    /// The same requests' service times.
    svc: &'a KindReport,
    dropped: u64,
    /// Connections counted by turns after all (node-wide; the summary's).
    by_turns: u64,
    power: Option<&'a AppPower>,
}

fn print_line(
    out: &mut impl Write,
    json: bool,
    l: &Line<'_>,
    summary_of: Option<&TargetReport>,
) -> anyhow::Result<()> {
    let summary = summary_of.is_some();
    let (t_s, pid, k, svc, dropped) = (l.t_s, l.pid, l.k, l.svc, l.dropped);
    let mode = if l.mode == Mode::Auto {
        "undecided"
    } else {
        l.mode.as_str()
    };
    if json {
        let mut v = json!({
            "t_s": (t_s * 1000.0).round() / 1000.0,
            "pid": pid,
            "mode": mode,
            "requests": k.requests,
            "rps": (k.rps * 10.0).round() / 10.0,
            "latest_us": k.latest_us,
            "mean_us": k.mean_us,
            "p50_us": k.p50_us,
            "p95_us": k.p95_us,
            "p99_us": k.p99_us,
            "svc_latest_us": svc.latest_us,
            "svc_mean_us": svc.mean_us,
            "svc_p50_us": svc.p50_us,
            "svc_p95_us": svc.p95_us,
            "svc_p99_us": svc.p99_us,
            "dropped": dropped,
        });
        if let Some(p) = l.power {
            v["power_w"] = json!(p.power_w);
            v["energy_per_request_j"] = json!(p.energy_per_request_j);
            v["power_source"] = json!(p.source);
            v["energy_is_estimate"] = json!(p.energy_is_estimate);
        }
        if let Some(r) = summary_of {
            v["summary"] = json!(true);
            v["counted_by_turns"] = json!(l.by_turns);
            v["max_us"] = json!(k.max_us);
            v["svc_max_us"] = json!(svc.max_us);
            if let Some(p) = &r.probes {
                v["probes"] = json!(p);
            }
            if let Some(w) = &r.warning {
                v["warning"] = json!(w);
            }
        }
        writeln!(out, "{v}")?;
    } else {
        let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}"));
        if summary {
            writeln!(out, "summary over {t_s:.1} s:")?;
        }
        let power = l.power.map_or(String::new(), |p| {
            let est = if p.energy_is_estimate { "~" } else { "" };
            let mj = p
                .energy_per_request_j
                .map_or("-".into(), |j| format!("{est}{:.3}", j * 1e3));
            format!(" {:>9} {:>11}", format!("{est}{:.2}", p.power_w), mj)
        });
        writeln!(
            out,
            "{:>7.1} {:>8} {:>10} {:>9} {:>10.1} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7}{power}",
            t_s,
            pid,
            mode,
            k.requests,
            k.rps,
            f(k.latest_us),
            f(k.mean_us),
            f(k.p50_us),
            f(k.p95_us),
            f(k.p99_us),
            f(svc.p50_us),
            f(svc.p99_us),
            dropped
        )?;
    }
    out.flush()?;
    Ok(())
}
