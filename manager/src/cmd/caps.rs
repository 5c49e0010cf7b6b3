//! `qosd caps`: which knobs (cores, frequency, cache ways, memory
//! bandwidth, CPU quota) this machine offers, the backend each would use and why, and
//! what is missing for the others.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args as ClapArgs;
use qosd_actuators::registry::detect;
use qosd_actuators::Config;

#[derive(ClapArgs, Debug)]
#[command(after_help = "Examples:\n  \
    qosd caps                 table of knobs, backends and reasons\n  \
    qosd caps --json          the same as one JSON object (keys cores, frequency,\n                            cache_ways, memory_bandwidth, cpu_quota; each with available,\n                            backend, reason, backends)\n  \
    qosd caps --root /tmp/t   probe a fake /sys tree instead of this machine")]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Root prefix for /sys, /proc, cgroup and resctrl paths.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
}

/// Which kernel path the eBPF request sensor takes here, found by loading
/// it (as `qosd trace` would), and why; "none" with the reason when it
/// cannot load at all (not root, no BTF...).
fn request_sensor() -> (&'static str, String) {
    use qosd_sensors::ebpf::{Hooks, RequestTracer, TracerOptions};
    match RequestTracer::start(TracerOptions::default()) {
        Ok(t) => match (t.hooks(), t.fallback_reason()) {
            (Hooks::Sockets, _) => (
                "sockets",
                "socket tracepoints loaded: latency from arrival and service".into(),
            ),
            (h, why) => (
                h.as_str(),
                format!("fallback: {}", why.unwrap_or("asked for")),
            ),
        },
        Err(e) => ("none", e.to_string()),
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let cfg = Config {
        root: args.root.clone(),
        ..Config::default()
    };
    cfg.validate().map_err(crate::exit::to_anyhow)?;
    let (caps, _) = detect(&cfg).map_err(crate::exit::to_anyhow)?;
    let (hooks, why) = request_sensor();
    if args.json {
        let mut v = serde_json::to_value(&caps).context("encoding caps as JSON")?;
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "request_sensor".into(),
                serde_json::json!({ "hooks": hooks, "reason": why }),
            );
        }
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&v).context("encoding caps as JSON")?
        )?;
    } else {
        crate::out!("{caps}")?;
        crate::outln!("request sensor: {hooks} hooks ({why})")?;
    }
    Ok(())
}
