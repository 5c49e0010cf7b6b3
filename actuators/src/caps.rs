//! What the machine offers, probed once at start: per knob, whether it is
//! available, which backend was chosen and why, and what each backend
//! lacks ([`Caps`], what `qosd caps` prints), the chosen plugins, and the
//! node's capacities in the policy's terms ([`NodeCaps`]). The knobs are
//! the rows of [`DETECTORS`], one detection function per knob, in
//! [`Resource::ALL`] order.

use std::collections::BTreeMap;

use qosd_core::{NodeCaps, Resource};
use serde::Serialize;

use crate::config::Config;
use crate::root::Root;
use crate::topology::Topology;
use crate::{cores, freq, priority, quota, resctrl, Actuator};

/// One backend's probe result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendProbe {
    pub name: String,
    pub available: bool,
    /// What it would use, or why it cannot be used.
    pub reason: String,
}

impl BackendProbe {
    /// A probe result from a probe function: `ok` says what an available
    /// backend would use; the error is why it cannot be used.
    pub fn of<T>(
        name: &str,
        r: std::result::Result<T, String>,
        ok: impl FnOnce(&T) -> String,
    ) -> (BackendProbe, Option<T>) {
        let (available, reason, v) = match r {
            Ok(v) => (true, ok(&v), Some(v)),
            Err(reason) => (false, reason, None),
        };
        let p = BackendProbe {
            name: name.into(),
            available,
            reason,
        };
        (p, v)
    }
}

/// One knob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KnobCaps {
    pub available: bool,
    /// The backend chosen (none when unavailable).
    pub backend: Option<String>,
    /// Why that backend, or why none.
    pub reason: String,
    /// Every backend in order of preference.
    pub backends: Vec<BackendProbe>,
}

impl KnobCaps {
    /// Picks the first available probe among those `allowed` (the
    /// preference from the config), in the given order.
    pub fn choose(probes: Vec<BackendProbe>, allowed: impl Fn(&str) -> bool) -> Self {
        let chosen = probes
            .iter()
            .find(|p| p.available && allowed(&p.name))
            .cloned();
        match chosen {
            Some(c) => {
                let also: Vec<&str> = probes
                    .iter()
                    .filter(|p| p.available && p.name != c.name)
                    .map(|p| p.name.as_str())
                    .collect();
                let mut reason = c.reason.clone();
                if !also.is_empty() {
                    reason += &format!("; also available: {}", also.join(", "));
                }
                KnobCaps {
                    available: true,
                    backend: Some(c.name),
                    reason,
                    backends: probes,
                }
            }
            None => {
                let reason = probes
                    .iter()
                    .map(|p| {
                        if p.available {
                            format!("{}: available but not selected in the config", p.name)
                        } else {
                            format!("{}: {}", p.name, p.reason)
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                KnobCaps {
                    available: false,
                    backend: None,
                    reason,
                    backends: probes,
                }
            }
        }
    }

    /// The chosen backend turned out unusable after all (`reason`).
    pub fn withdraw(&mut self, reason: String) {
        self.available = false;
        self.backend = None;
        self.reason = reason;
    }
}

/// Every knob; the JSON keys are the resource names, in [`Resource::ALL`]
/// order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Caps(BTreeMap<Resource, KnobCaps>);

impl Caps {
    pub fn get(&self, r: Resource) -> &KnobCaps {
        // `detect` fills every resource (a test checks).
        &self.0[&r]
    }
}

impl std::fmt::Display for Caps {
    /// The human table of `qosd caps`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (r, k) in &self.0 {
            match &k.backend {
                Some(b) => writeln!(f, "{:<17} available    backend {b}", r.name())?,
                None => writeln!(f, "{:<17} unavailable", r.name())?,
            }
            for p in &k.backends {
                writeln!(
                    f,
                    "  {:<10} {:<4} {}",
                    p.name,
                    if p.available { "yes" } else { "no" },
                    p.reason
                )?;
            }
        }
        Ok(())
    }
}

/// What every knob's detection sees.
pub struct Probe<'a> {
    pub root: Root,
    pub cfg: &'a Config,
    /// The CPU topology, or why it cannot be read.
    pub topo: std::result::Result<Topology, String>,
}

/// A knob's caps and, when available, its plugin.
pub type Detected = (KnobCaps, Option<Box<dyn Actuator>>);

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
    let mut node = NodeCaps::default();
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
    }
}
