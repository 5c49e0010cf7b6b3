//! What `qosd trace` prints: the banner, a line per pid and interval (a
//! table or JSON lines), and each pid's summary with its notes.

use std::io::Write;

use qosd_core::AppPower;
use qosd_sensors::ebpf::{Hooks, KindReport, Mode, RequestTracer, TargetReport};
use serde_json::json;

/// The hooks in use and what the figures mean with them, then the
/// table's header (none for JSON).
/// `power`: a power column follows.
pub(super) fn banner(
    out: &mut impl Write,
    json: bool,
    power: bool,
    tracer: &RequestTracer,
) -> anyhow::Result<()> {
    let banner = match (tracer.hooks(), tracer.fallback_reason()) {
        (Hooks::Sockets, _) => "hooks: sockets (socket tracepoints; latency from each \
                                request's arrival, service from the first read)"
            .to_string(),
        (Hooks::Syscalls, why) => format!(
            "hooks: syscalls (fallback: {}; latency = service, from the first read)",
            why.unwrap_or("asked for")
        ),
    };
    if json {
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
            if power { "   power_w  mJ/request" } else { "" }
        )?;
    }
    Ok(())
}

/// Each pid's figures over the whole trace, with what is worth knowing
/// about them.
pub(super) fn totals(
    out: &mut impl Write,
    (json, pids, ports): (bool, &[u32], &[u16]),
    tracer: &RequestTracer,
    t_s: f64,
) -> anyhow::Result<()> {
    for &pid in pids {
        if let Some(r) = tracer.take_report(pid) {
            let l = Line {
                t_s,
                pid,
                mode: r.mode,
                k: &r.total,
                svc: &r.service_total,
                dropped: tracer.dropped(),
                by_turns: tracer.counted_by_turns(),
                timed_by_turns: tracer.timed_by_turns(),
                power: None,
            };
            line(out, json, &l, Some(&r))?;
            if !json {
                if let Some(p) = &r.probes {
                    writeln!(out, "pid {pid}: gRPC calls from uprobes on {p}")?;
                }
                if let Some(w) = &r.warning {
                    writeln!(out, "pid {pid}: warning: {w}")?;
                }
                if l.by_turns > 0 {
                    writeln!(
                        out,
                        "{} connection(s) counted one request per turn: their bytes could not \
                     be read, or a read needed more parsing than the counter's bound \
                     (docs/requests.md)",
                        l.by_turns
                    )?;
                }
                if l.timed_by_turns > 0 {
                    writeln!(
                        out,
                        "{} HTTP connection(s) timed by turns, not by their replies: a reply \
                     could not be parsed, or too many requests waited for replies \
                     (docs/requests.md, \"Replies\")",
                        l.timed_by_turns
                    )?;
                }
                if r.exited {
                    writeln!(out, "pid {pid} exited during the trace")?;
                }
            }
            if r.connections == 0 {
                // Said on stderr too, so that --json users see it.
                let note = no_connection_note(pid, ports);
                if !json {
                    writeln!(out, "{note}")?;
                }
                eprintln!("qosd trace: {note}");
            }
        }
    }
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
pub(super) struct Line<'a> {
    pub(super) t_s: f64,
    pub(super) pid: u32,
    pub(super) mode: Mode,
    pub(super) k: &'a KindReport,
    /// The same requests' service times.
    pub(super) svc: &'a KindReport,
    pub(super) dropped: u64,
    /// Connections counted by turns after all (node-wide; the summary's).
    pub(super) by_turns: u64,
    /// HTTP connections timed by turns after all (node-wide; the summary's).
    pub(super) timed_by_turns: u64,
    pub(super) power: Option<&'a AppPower>,
}

pub(super) fn line(
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
            v["timed_by_turns"] = json!(l.timed_by_turns);
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
