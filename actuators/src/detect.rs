//! Probing the machine at start: every knob's detection (a row of
//! [`DETECTORS`], in [`Resource::ALL`] order) run once, giving what
//! `qosd caps` shows, the chosen plugins and the node's capacities.

use std::collections::BTreeMap;

use qosd_core::{NodeCaps, Resource};

use crate::caps::{BackendProbe, Caps, Detected, KnobCaps, Probe};
use crate::config::Config;
use crate::root::Root;
use crate::topology::Topology;
use crate::{cores, freq, priority, quota, resctrl, Actuator};

/// Probes the backends of one knob and builds the chosen one.
pub type Detect = fn(&Probe) -> Detected;

/// Every knob's detection, in [`Resource::ALL`] order.
pub const DETECTORS: [(Resource, Detect); 7] = [
    (Resource::Cores, cores::detect),
    (Resource::Frequency, freq::detect),
    (Resource::CacheWays, resctrl::detect_ways),
    (Resource::MemoryBandwidth, resctrl::detect_mb),
    (Resource::CpuQuota, quota::detect),
    (Resource::CpuPriority, priority::detect),
    (Resource::Hedge, linked_hedge),
];

/// The hedge knob's detection, which lives in the `qosd-hedge` crate (it
/// builds on this one): the binary links it in at start ([`link_hedge`]).
static HEDGE_DETECT: std::sync::OnceLock<Detect> = std::sync::OnceLock::new();

/// Links the hedge knob's detection in (once; later calls are ignored).
pub fn link_hedge(detect: Detect) {
    let _ = HEDGE_DETECT.set(detect);
}

fn linked_hedge(p: &Probe) -> Detected {
    match HEDGE_DETECT.get() {
        Some(detect) => detect(p),
        None => {
            let probe = BackendProbe {
                name: "tc-bpf".into(),
                available: false,
                reason: "the hedger is not linked into this program".into(),
            };
            (KnobCaps::choose(vec![probe], |_| true), None)
        }
    }
}

/// Probes the machine: what `qosd caps` shows, the chosen plugins (in
/// [`Resource::ALL`] order) and what the policy may hand out.
pub fn detect(cfg: &Config) -> crate::Result<(Caps, Vec<Box<dyn Actuator>>)> {
    let (caps, plugins, _) = detect_all(cfg);
    Ok((caps, plugins))
}

/// [`detect`] and the node's capacities, each plugin adding its own
/// ([`Actuator::offer`]).
pub(crate) fn detect_all(cfg: &Config) -> (Caps, Vec<Box<dyn Actuator>>, NodeCaps) {
    let root = Root::new(&cfg.root);
    let topo = Topology::read(&root).map_err(|e| e.to_string());
    let p = Probe { root, cfg, topo };
    let mut caps = BTreeMap::new();
    let mut plugins = Vec::new();
    let mut node = NodeCaps {
        // The node's size, whichever knobs work.
        nr_cpus: p.topo.as_ref().map_or(0, |t| t.cpus.len() as u32),
        ..NodeCaps::default()
    };
    for (r, detect) in DETECTORS {
        let (k, plugin) = detect(&p);
        if let Some(plugin) = plugin {
            plugin.offer(&p, &mut node);
            plugins.push(plugin);
        }
        caps.insert(r, k);
    }
    (Caps(caps), plugins, node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_knob_is_detected_in_order() {
        let rs: Vec<Resource> = DETECTORS.iter().map(|d| d.0).collect();
        assert_eq!(rs, Resource::ALL.to_vec());
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            root: dir.path().to_owned(),
            state_file: Some(dir.path().join("state.json")),
            ..Config::default()
        };
        let (caps, plugins, node) = detect_all(&cfg);
        assert!(plugins.is_empty(), "an empty tree offers nothing");
        for r in Resource::ALL {
            assert!(!caps.get(r).available, "{r}");
            assert!(!node.has(r), "{r}");
        }
        let json = serde_json::to_value(&caps).unwrap();
        let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
        let names: Vec<&str> = Resource::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(keys, names);
        assert_eq!(node.nr_cpus, 0, "no topology, no size");
    }

    /// The node's online CPUs are its size whatever knobs work: a tree with
    /// only a CPU list offers no knob, and still 3 CPUs.
    #[test]
    fn the_online_cpus_are_counted_without_any_knob() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = dir.path().join("sys/devices/system/cpu");
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cpu.join("online"), "0-2\n").unwrap();
        let cfg = Config {
            root: dir.path().to_owned(),
            state_file: Some(dir.path().join("state.json")),
            ..Config::default()
        };
        let (_, plugins, node) = detect_all(&cfg);
        assert!(plugins.is_empty());
        assert_eq!((node.nr_cpus, node.nr_cores), (3, 0));
    }
}
