//! Starting the net sensor (`sensors.net`): loads the TC counting
//! programs, journals every clsact qdisc and filter in the actuators'
//! journal before attaching (so the daemon's exit, its signal handlers
//! and `qosd restore` after a SIGKILL remove them with the knobs), and
//! hands the plugin to the sensing layer.

use qosd_actuators::netns::{NetnsRef, NETD_TC_PREF};
use qosd_sensors::net::{default_ifaces, iface_by_name, Direction, Iface, NetOptions, NetSensor};
use qosd_sensors::sensor::net::NetPlugin;

use super::control::Controller;
use crate::config::NetConfig;

/// Journal keys of the daemon's net objects start with this.
const KEY_PREFIX: &str = "netd:";

/// Starts the net sensor on `ctl`; returns the interfaces it counts on.
/// A dry run starts none: it would add TC filters, which a dry run
/// never removes.
pub fn start(ctl: &mut Controller, cfg: &NetConfig, dry_run: bool) -> anyhow::Result<Vec<String>> {
    anyhow::ensure!(
        !dry_run,
        "not started in a dry run (it adds TC filters to the interfaces)"
    );
    let ifaces = ifaces(cfg)?;
    let opts = NetOptions {
        bin_ms: cfg.bin_ms,
        ..NetOptions::default()
    };
    // Loaded before anything is made: a kernel that refuses the programs
    // leaves the interfaces untouched.
    let sensor = NetSensor::load(opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    let ns = NetnsRef::of_pid(std::process::id() as i32)?;
    let ctx = ctl.actuation_mut().ctx_mut();
    for i in &ifaces {
        for dir in Direction::BOTH {
            ctx.tc_hook("net", &ns, KEY_PREFIX, &i.name, dir.as_str(), NETD_TC_PREF)?;
        }
        sensor
            .attach(i.ifindex, NETD_TC_PREF)
            .map_err(|e| anyhow::anyhow!("{}: {e}", i.name))?;
    }
    ctl.add_sensor(Box::new(NetPlugin::new(sensor, cfg.top_n as usize)));
    Ok(ifaces.into_iter().map(|i| i.name).collect())
}

fn ifaces(cfg: &NetConfig) -> anyhow::Result<Vec<Iface>> {
    if cfg.ifaces.is_empty() {
        let all = default_ifaces().map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::ensure!(
            !all.is_empty(),
            "no up, non-loopback Ethernet interface here: name some in sensors.net.ifaces"
        );
        return Ok(all);
    }
    let mut out: Vec<Iface> = Vec::new();
    for name in &cfg.ifaces {
        let i = iface_by_name(name).map_err(|e| anyhow::anyhow!("sensors.net.ifaces: {e}"))?;
        if !out.contains(&i) {
            out.push(i);
        }
    }
    Ok(out)
}
