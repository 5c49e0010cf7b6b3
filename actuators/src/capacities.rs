//! What the manager's control loop needs from the actuators beyond
//! `apply`: the node's capacities in the policy's terms ([`NodeCaps`]:
//! physical cores, cache ways, frequency range, memory-bandwidth range, 0
//! or `None` for what this machine cannot actuate), and releasing an app
//! whose processes have all exited.

use qosd_core::quota::MILLI_PER_CPU;
use qosd_core::{FreqRange, MbRange, NodeCaps, QuotaRange};

use crate::caps::Caps;
use crate::journal::Entry;
use crate::root::Root;
use crate::topology::Topology;
use crate::{resctrl, Actuators, AppTarget, Change, Error, Result};

/// One unit of a frequency decision where the driver lists no steps
/// (PARTIES moves 100 MHz at a time).
const DEFAULT_FREQ_STEP_MHZ: u32 = 100;

/// The capacities of the knobs `caps` found available, read under `root`.
pub fn node_caps(root: &Root, caps: &Caps, cfg: &crate::Config) -> NodeCaps {
    let pqos_cbm_bits = cfg.pqos_cbm_bits;
    let topo = Topology::read(root).ok();
    let nr_cores = match (&topo, caps.cores.available) {
        (Some(t), true) => t.cores.len() as u32,
        _ => 0,
    };
    let nr_ways = match caps.cache_ways.backend.as_deref() {
        Some("resctrl") => resctrl::probe_l3(root).map_or(0, |a| a.nr_ways()),
        Some("pqos") => crate::pqos::probe(root, pqos_cbm_bits).map_or(0, |a| a.nr_ways()),
        _ => 0,
    };
    let freq = match (&topo, caps.frequency.available) {
        (Some(t), true) => freq_range(root, &t.cpus),
        _ => None,
    };
    let mb = if caps.memory_bandwidth.available {
        resctrl::probe_mb(root).ok().map(|(gran, min)| MbRange {
            min_percent: min,
            step_percent: gran.max(1),
        })
    } else {
        None
    };
    let quota = match (&topo, caps.cpu_quota.available) {
        (Some(t), true) => Some(QuotaRange {
            step_milli: cfg.cpu_quota_unit_milli,
            max_milli: t.cpus.len() as u32 * MILLI_PER_CPU,
        }),
        _ => None,
    };
    NodeCaps {
        nr_cores,
        nr_ways,
        freq,
        mb,
        quota,
    }
}

/// The range every CPU can run at (the highest minimum and the lowest
/// maximum over `cpus`), and the smallest step between the frequencies the
/// driver lists.
fn freq_range(root: &Root, cpus: &[u32]) -> Option<FreqRange> {
    let khz = |cpu: u32, f: &str| -> Option<u64> {
        root.read_trim(format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq/{f}"))
            .ok()?
            .parse()
            .ok()
    };
    let mut lo = 0u64;
    let mut hi = u64::MAX;
    let mut step_khz = u64::MAX;
    for &c in cpus {
        lo = lo.max(khz(c, "cpuinfo_min_freq")?);
        hi = hi.min(khz(c, "cpuinfo_max_freq")?);
        if let Ok(list) = root.read(format!(
            "/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_available_frequencies"
        )) {
            let mut v: Vec<u64> = list
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            v.sort_unstable();
            for w in v.windows(2) {
                if w[1] > w[0] {
                    step_khz = step_khz.min(w[1] - w[0]);
                }
            }
        }
    }
    if cpus.is_empty() || hi <= lo {
        return None;
    }
    let step_mhz = if step_khz == u64::MAX {
        DEFAULT_FREQ_STEP_MHZ
    } else {
        (step_khz / 1000).max(1) as u32
    };
    Some(FreqRange {
        min_mhz: (lo / 1000) as u32,
        max_mhz: (hi / 1000) as u32,
        step_mhz,
    })
}

impl Actuators {
    /// What the policy may hand out on this machine.
    pub fn node_caps(&self) -> NodeCaps {
        self.node
    }

    /// The CPU topology under this set's root.
    pub fn topology(&self) -> Result<Topology> {
        Topology::read(&self.ctx.root)
    }

    /// Releases an app whose processes have all exited: forgets it and puts
    /// back what was made for it alone (its cpuset cgroup and resctrl
    /// group, the cgroup moves and affinity of its processes). Per-CPU
    /// settings (frequency) stay until [`Actuators::restore_all`], since
    /// those CPUs may serve another app next.
    pub fn release_app(&mut self, app: &AppTarget) -> Result<Vec<Change>> {
        self.apps.remove(&app.name);
        let group = app.group_name();
        let (changes, mut errors) = self.ctx.restore_where(|e| match e {
            Entry::CreatedDir { path, .. } => {
                path.file_name().and_then(|n| n.to_str()) == Some(group.as_str())
            }
            Entry::Moved { pid, .. } | Entry::Affinity { pid, .. } => app.pids.contains(pid),
            _ => false,
        });
        match errors.len() {
            0 => Ok(changes),
            1 => Err(errors.remove(0)),
            n => Err(Error::Invalid(format!(
                "releasing app {}: {n} restores failed: {}",
                app.name,
                errors
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            ))),
        }
    }
}
