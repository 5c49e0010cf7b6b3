//! What the machine offers: per knob, whether it is available, which
//! backend was chosen and why, and what each backend lacks. This is what
//! `qosd caps` prints and what the manager plans with.

use qosd_core::Resource;
use serde::Serialize;

/// One backend's probe result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendProbe {
    pub name: String,
    pub available: bool,
    /// What it would use, or why it cannot be used.
    pub reason: String,
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
}

/// Every knob; the JSON keys are the resource names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Caps {
    pub cores: KnobCaps,
    pub frequency: KnobCaps,
    pub cache_ways: KnobCaps,
    pub memory_bandwidth: KnobCaps,
    pub cpu_quota: KnobCaps,
}

impl Caps {
    pub fn get(&self, r: Resource) -> &KnobCaps {
        match r {
            Resource::Cores => &self.cores,
            Resource::Frequency => &self.frequency,
            Resource::CacheWays => &self.cache_ways,
            Resource::MemoryBandwidth => &self.memory_bandwidth,
            Resource::CpuQuota => &self.cpu_quota,
        }
    }
}

impl std::fmt::Display for Caps {
    /// The human table of `qosd caps`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for r in Resource::ALL {
            let k = self.get(r);
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
