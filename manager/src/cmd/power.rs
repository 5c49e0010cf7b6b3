//! `qosd power`: live per-process and per-thread power, its source (`rapl`
//! or `model`, the latter always labelled an estimate) and the shares of
//! paper 001 eq. (1)-(2), from the power sensor.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args as ClapArgs;
use qosd_sensors::power::{PowerCaps, PowerConfig, PowerSample, PowerSensor, SourceChoice};
use serde_json::json;

use crate::secs::{secs, MAX_SECS};
use crate::usage;

#[derive(ClapArgs, Debug)]
#[command(after_help = "Examples:\n  \
    qosd power                              whole node, top threads, every second\n  \
    qosd power --pid $(pidof memcached)     one process and its threads\n  \
    qosd power --pid 1234 --json --duration 10   JSON lines for 10 s\n\n\
    Power is attributed per paper 001 eq. (2): each socket's active power \
    (RAPL core domain, else package x busy fraction; the model's dynamic \
    terms) split by each thread's weighted cycles (on-CPU time without a \
    PMU), hyperthread-aware per eq. (1). Without RAPL every figure comes \
    from a model and is marked ESTIMATE (\"energy_is_estimate\": true). \
    Needs root (loads a sched_switch BPF program).")]
pub struct Args {
    /// Show only this process (and its threads); repeat for several.
    #[arg(long, value_name = "PID")]
    pub pid: Vec<i32>,
    /// One JSON object per interval on stdout.
    #[arg(long)]
    pub json: bool,
    /// Stop after this many seconds (default: until Ctrl-C).
    #[arg(long, allow_negative_numbers = true, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Seconds between reports.
    #[arg(
        long,
        allow_negative_numbers = true,
        value_name = "SECS",
        default_value_t = 1.0
    )]
    pub interval: f64,
    /// Threads listed per interval.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Energy source: auto, powercap, perf or model.
    #[arg(long, value_name = "SOURCE", default_value = "auto", value_parser = parse_source)]
    pub source: SourceChoice,
    /// HT_r of eq. (1) (1.0..=2.0).
    #[arg(long, value_name = "RATIO", default_value_t = 1.1)]
    pub ht_ratio: f64,
    /// Read /sys and /proc under this directory (a fake tree, for tests).
    #[arg(long, value_name = "DIR", default_value = "/", hide_short_help = true)]
    pub root: PathBuf,
}

fn parse_source(s: &str) -> Result<SourceChoice, String> {
    serde_json::from_value(json!(s))
        .map_err(|_| format!("{s:?}: expected auto, powercap, perf or model"))
}

fn check_args(a: &Args) -> anyhow::Result<()> {
    secs("--interval", a.interval, 0.05, 3600.0)?;
    if let Some(d) = a.duration {
        secs("--duration", d, 0.0, MAX_SECS)?;
    }
    if !(1.0..=2.0).contains(&a.ht_ratio) {
        return Err(usage!("--ht-ratio {}: expected 1.0..=2.0", a.ht_ratio));
    }
    for &pid in &a.pid {
        let alive =
            pid > 0 && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        if !alive {
            return Err(usage!("--pid {pid}: no such process"));
        }
    }
    Ok(())
}

fn comm(root: &Path, tgid: u32, tid: Option<u32>) -> String {
    let p = match tid {
        Some(t) => root.join(format!("proc/{tgid}/task/{t}/comm")),
        None => root.join(format!("proc/{tgid}/comm")),
    };
    std::fs::read_to_string(p).map_or_else(|_| "?".to_owned(), |s| s.trim().to_owned())
}

fn label(s: &PowerSample) -> &'static str {
    if s.energy_is_estimate {
        " ESTIMATE"
    } else {
        ""
    }
}

/// The text report of one interval.
pub fn format_text(s: &PowerSample, pids: &[u32], top: usize, root: &Path) -> String {
    let mut o = String::new();
    let n = &s.node;
    o += &format!(
        "{:.1}s  source {}{}  node {:.2} W  active {:.2} W  idle {:.2} W",
        s.interval_s,
        s.source,
        label(s),
        n.total_w,
        n.active_w,
        n.idle_w
    );
    if let Some(d) = n.dram_w {
        o += &format!("  dram {d:.2} W");
    }
    o += &format!("  weight {}\n", s.weight);
    o += "     PID COMM             THREADS   CPUS   SHARE    POWER W  ENERGY J\n";
    let procs: Vec<_> = if pids.is_empty() {
        s.processes.iter().take(top).collect()
    } else {
        s.processes
            .iter()
            .filter(|p| pids.contains(&p.tgid))
            .collect()
    };
    for &pid in pids.iter().filter(|p| s.process(**p).is_none()) {
        o += &format!(
            "{pid:>8} {:<16} (did not run this interval)\n",
            comm(root, pid, None)
        );
    }
    for p in procs {
        o += &format!(
            "{:>8} {:<16} {:>7} {:>6.3} {:>6.1}% {:>10.3} {:>9.3}\n",
            p.tgid,
            comm(root, p.tgid, None),
            p.nr_threads,
            p.cpus_used,
            p.share * 100.0,
            p.power_w,
            p.energy_j
        );
    }
    o += "     TID     PID COMM              CPU%   SHARE    POWER W\n";
    let threads = s
        .threads
        .iter()
        .filter(|t| pids.is_empty() || pids.contains(&t.tgid))
        .take(top);
    for t in threads {
        o += &format!(
            "{:>8} {:>7} {:<16} {:>5.1}% {:>6.1}% {:>10.3}{}\n",
            t.tid,
            t.tgid,
            comm(root, t.tgid, Some(t.tid)),
            t.cpu_fraction * 100.0,
            t.share * 100.0,
            t.power_w,
            if t.exited { "  (exited)" } else { "" }
        );
    }
    o
}

/// The JSON object of one interval: the whole sample, cut to `pids` when
/// given, with `t_s` (seconds since start).
pub fn format_json(s: &PowerSample, pids: &[u32], top: usize, t_s: f64) -> serde_json::Value {
    let mut v = serde_json::to_value(s).unwrap_or_default();
    let keep = |tgid: u32| pids.is_empty() || pids.contains(&tgid);
    let procs: Vec<_> = s
        .processes
        .iter()
        .filter(|p| keep(p.tgid))
        .take(if pids.is_empty() { top } else { usize::MAX })
        .collect();
    let threads: Vec<_> = s
        .threads
        .iter()
        .filter(|t| keep(t.tgid))
        .take(top)
        .collect();
    v["processes"] = json!(procs);
    v["threads"] = json!(threads);
    v["t_s"] = json!((t_s * 1000.0).round() / 1000.0);
    v
}

fn print_caps(c: &PowerCaps, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "qosd power: source {}{}, weight {}, HT_r {}, {} CPUs on {} socket(s){}",
        c.source,
        if c.source.is_estimate() {
            " (ESTIMATE)".to_owned()
        } else {
            format!(" ({}: {})", c.backend, c.domains.join(", "))
        },
        c.weight,
        c.ht_ratio,
        c.nr_cpus,
        c.nr_sockets,
        if c.smt { ", SMT" } else { "" }
    )?;
    for n in &c.notes {
        writeln!(out, "  {n}")?;
    }
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    check_args(&args)?;
    let cfg = PowerConfig {
        source: args.source,
        ht_ratio: args.ht_ratio,
        ..PowerConfig::default()
    };
    let mut sensor = PowerSensor::open(&cfg, &args.root).context("starting the power sensor")?;
    crate::signals::install().context("installing signal handlers")?;
    let pids: Vec<u32> = args.pid.iter().map(|p| *p as u32).collect();
    let stdout = std::io::stdout();
    if args.json {
        print_caps(sensor.caps(), &mut std::io::stderr())?;
    } else {
        print_caps(sensor.caps(), &mut stdout.lock())?;
    }
    let start = Instant::now();
    let step = secs("--interval", args.interval, 0.05, 3600.0)?;
    let duration = args.duration.map(|d| secs("--duration", d, 0.0, MAX_SECS));
    let end = duration.transpose()?.map(|d| start + d);
    let mut next = start + step;
    let (mut node_j, mut pid_j) = (0.0, vec![0.0; pids.len()]);
    let mut estimate = false;
    loop {
        let deadline = end.map_or(next, |e| next.min(e));
        while Instant::now() < deadline && !crate::signals::stop_requested() {
            std::thread::sleep((deadline - Instant::now()).min(Duration::from_millis(50)));
        }
        let s = sensor.sample().context("sampling power")?;
        estimate |= s.energy_is_estimate;
        node_j += s.node.total_w * s.interval_s;
        for (i, p) in pids.iter().enumerate() {
            pid_j[i] += s.process(*p).map_or(0.0, |p| p.energy_j);
        }
        let mut out = stdout.lock();
        if args.json {
            let t = start.elapsed().as_secs_f64();
            writeln!(out, "{}", format_json(&s, &pids, args.top, t))?;
        } else {
            writeln!(out, "{}", format_text(&s, &pids, args.top, &args.root))?;
        }
        out.flush()?;
        let done = crate::signals::stop_requested() || end.is_some_and(|e| Instant::now() >= e);
        if done {
            break;
        }
        // On deadlines: a slow sample does not shift later ones.
        while next <= Instant::now() {
            next += step;
        }
    }
    if !args.json {
        let est = if estimate { " (ESTIMATE)" } else { "" };
        let mut line = format!(
            "total over {:.1}s: node {node_j:.1} J{est}",
            start.elapsed().as_secs_f64()
        );
        for (p, j) in pids.iter().zip(&pid_j) {
            line += &format!(", pid {p} {j:.2} J");
        }
        crate::outln!("{line}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: Args,
    }

    #[test]
    fn bad_arguments_are_usage_errors_naming_the_value() {
        let parse = |v: &[&str]| {
            Cli::try_parse_from(std::iter::once("power").chain(v.iter().copied())).map(|c| c.a)
        };
        let a = parse(&["--interval", "0"]).unwrap();
        let e = check_args(&a).unwrap_err();
        assert!(e.to_string().contains("--interval 0"));
        assert!(e.chain().any(|c| c.is::<crate::exit::UsageError>()));
        let a = parse(&["--pid", "999999999"]).unwrap();
        assert!(check_args(&a)
            .unwrap_err()
            .to_string()
            .contains("999999999"));
        assert!(parse(&["--source", "wall"]).is_err());
        assert_eq!(
            parse(&["--source", "model"]).unwrap().source,
            SourceChoice::Model
        );
        let a = parse(&["--ht-ratio", "3"]).unwrap();
        assert!(check_args(&a)
            .unwrap_err()
            .to_string()
            .contains("--ht-ratio"));
        let a = parse(&["--pid", &std::process::id().to_string()]).unwrap();
        check_args(&a).unwrap();
    }
}
