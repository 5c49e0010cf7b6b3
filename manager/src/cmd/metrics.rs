//! `qosd metrics`: asks a running daemon (`qosd run`) over its HTTP API
//! and prints the figures: every app, one app, or one traced process.

use std::time::Duration;

use anyhow::Context;
use clap::Args as ClapArgs;
use serde_json::{json, Value};

use crate::config::DEFAULT_API_ADDR;
use crate::usage;

#[derive(ClapArgs, Debug)]
#[command(after_help = "Examples:\n  \
    qosd metrics                          every app: allocation, RPS, latency vs target\n  \
    qosd metrics --app memcached --p 99.9 one app, with its p99.9\n  \
    qosd metrics --pid 1234 --json        one process (eBPF window), as JSON\n\n\
    Exit codes: 0 ok, 1 no daemon answering at --addr, 2 unknown app or pid.")]
pub struct Args {
    /// The daemon's API address (`api.listen` in its config).
    #[arg(long, default_value = DEFAULT_API_ADDR, value_name = "ADDR:PORT")]
    pub addr: String,
    /// Only this app.
    #[arg(long, value_name = "NAME", conflicts_with = "pid")]
    pub app: Option<String>,
    /// Only this process (one of an app's; figures from its eBPF window).
    #[arg(long, value_name = "PID")]
    pub pid: Option<i32>,
    /// Percentile to ask for besides p50/p95/p99, in (0, 100].
    #[arg(long, value_name = "P")]
    pub p: Option<f64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `HOST:PORT` (an IP address or a name, a port from 1 to 65535): anything
/// else is a usage error before any lookup.
fn check_addr(addr: &str) -> anyhow::Result<()> {
    let ok = match addr.rsplit_once(':') {
        Some((host, port)) => {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            port.parse::<u16>().is_ok_and(|p| p > 0)
                && !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-:_".contains(c))
        }
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(usage!(
            "--addr {addr:?}: expected HOST:PORT, e.g. 127.0.0.1:9477"
        ))
    }
}

struct Client {
    agent: ureq::Agent,
    base: String,
}

impl Client {
    fn new(addr: &str) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .http_status_as_error(false)
            .build()
            .into();
        Client {
            agent,
            base: format!("http://{addr}"),
        }
    }

    fn get(&self, path: &str) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut r = self.agent.get(&url).call().with_context(|| {
            format!(
                "no qosd daemon answering at {} (is `qosd run` running? --addr)",
                self.base
            )
        })?;
        let status = r.status();
        let v: Value = r
            .body_mut()
            .read_json()
            .with_context(|| format!("reading the reply of {url}"))?;
        if status.is_success() {
            return Ok(v);
        }
        let msg = v["error"].as_str().unwrap_or("error").to_owned();
        if status.as_u16() == 404 || status.as_u16() == 400 {
            Err(usage!("{msg}"))
        } else {
            Err(anyhow::anyhow!("{url}: {status}: {msg}"))
        }
    }
}

fn ms(us: &Value) -> String {
    us.as_f64().map_or("-".into(), |v| {
        if v >= 1000.0 {
            format!("{:.2} ms", v / 1000.0)
        } else {
            format!("{v:.0} us")
        }
    })
}

fn num(v: &Value, digits: usize) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn alloc(a: &Value) -> String {
    let al = &a["allocation"];
    if al.is_null() {
        return a["note"].as_str().unwrap_or("not managed").to_owned();
    }
    let mut parts = Vec::new();
    if let (Some(n), Some(c)) = (al["cores"].as_u64(), al["cpus"].as_str()) {
        parts.push(format!("{n} core{} ({c})", if n == 1 { "" } else { "s" }));
    }
    for (k, unit) in [
        ("llc_ways", " ways"),
        ("frequency_mhz", " MHz"),
        ("memory_bandwidth_percent", "% MB"),
    ] {
        if let Some(v) = al[k].as_u64() {
            parts.push(format!("{v}{unit}"));
        }
    }
    if parts.is_empty() {
        "as found".into()
    } else {
        parts.join(", ")
    }
}

fn print_apps(apps: &[Value]) -> anyhow::Result<()> {
    crate::outln!(
        "{:<14} {:<3} {:<7} {:<14} {:>9} {:>10} {:>10} {:>7} {:>5}  allocation",
        "app",
        "cls",
        "source",
        "pids",
        "rps",
        "latency",
        "target",
        "slack",
        "cpu%"
    )?;
    for a in apps {
        let pids: Vec<String> = a["pids"]
            .as_array()
            .map(|v| v.iter().map(|p| p.to_string()).collect())
            .unwrap_or_default();
        let pct = a["target"]["percentile"].as_f64().unwrap_or(99.0);
        crate::outln!(
            "{:<14} {:<3} {:<7} {:<14} {:>9} {:>10} {:>10} {:>7} {:>5}  {}",
            a["name"].as_str().unwrap_or("?"),
            a["class"].as_str().unwrap_or("?"),
            a["feedback"].as_str().unwrap_or("?"),
            if pids.is_empty() {
                "-".into()
            } else {
                pids.join(",")
            },
            num(&a["latency"]["rps"], 0),
            format!("p{pct} {}", ms(&a["latency"]["target_percentile_us"])),
            ms(&a["target"]["latency_us"]),
            num(&a["slack"], 2),
            a["cpu_util"]
                .as_f64()
                .map_or("-".into(), |u| format!("{:.0}", u * 100.0)),
            alloc(a),
        )?;
    }
    Ok(())
}

fn print_figures(what: &str, f: &Value, extra: Option<(f64, &Value)>) -> anyhow::Result<()> {
    crate::outln!("{what}")?;
    crate::outln!("  requests {}   rps {}", f["requests"], num(&f["rps"], 1))?;
    crate::outln!(
        "  latest {}   mean {}   p50 {}   p95 {}   p99 {}",
        ms(&f["latest_us"]),
        ms(&f["mean_us"]),
        ms(&f["p50_us"]),
        ms(&f["p95_us"]),
        ms(&f["p99_us"])
    )?;
    if let Some((p, v)) = extra {
        crate::outln!("  p{p} {}", ms(v))?;
    }
    Ok(())
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Some(p) = a.p {
        if !(p > 0.0 && p <= 100.0) {
            return Err(usage!(
                "--p {p}: a percentile is in (0, 100], e.g. 99 or 99.9"
            ));
        }
    }
    check_addr(&a.addr)?;
    let c = Client::new(&a.addr);
    let out = if let Some(pid) = a.pid {
        let mut v = c.get(&format!("/v1/pids/{pid}"))?;
        if let Some(p) = a.p {
            let x = c.get(&format!("/v1/pids/{pid}/latency_percentile?p={p}"))?;
            v["window"][format!("p{p}_us")] = x["latency_us"].clone();
        }
        if !a.json {
            let app = v["app"].as_str().unwrap_or("?");
            let head = format!(
                "pid {pid} (app {app}, mode {}): {} requests since traced; last {} requests:",
                v["mode"].as_str().unwrap_or("-"),
                v["requests_total"],
                v["window"]["requests"]
            );
            let extra = a.p.map(|p| (p, &v["window"][format!("p{p}_us")]));
            print_figures(&head, &v["window"], extra)?;
        }
        v
    } else if let Some(app) = &a.app {
        let mut v = c.get(&format!("/v1/apps/{app}"))?;
        if let Some(p) = a.p {
            let x = c.get(&format!("/v1/apps/{app}/latency_percentile?p={p}"))?;
            v["latency"][format!("p{p}_us")] = x["latency_us"].clone();
        }
        if !a.json {
            print_apps(std::slice::from_ref(&v))?;
            let head = format!(
                "\nlast {} ms ({}):",
                v["latency"]["window_ms"],
                v["feedback"].as_str().unwrap_or("?")
            );
            let extra = a.p.map(|p| (p, &v["latency"][format!("p{p}_us")]));
            print_figures(&head, &v["latency"], extra)?;
        }
        v
    } else {
        let v = c.get("/v1/apps")?;
        if !a.json {
            print_apps(v.as_array().map(Vec::as_slice).unwrap_or(&[]))?;
        }
        json!(v)
    };
    if a.json {
        crate::outln!("{}", serde_json::to_string_pretty(&out)?)?;
    }
    Ok(())
}
