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

pub fn run(args: Args) -> anyhow::Result<()> {
    let cfg = Config {
        root: args.root.clone(),
        ..Config::default()
    };
    cfg.validate().map_err(super::set::to_anyhow)?;
    let (caps, _) = detect(&cfg).map_err(super::set::to_anyhow)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&caps).context("encoding caps as JSON")?
        );
    } else {
        print!("{caps}");
    }
    Ok(())
}
