//! Cache ways through Intel's `pqos` tool (intel-cmt-cat), for machines
//! with CAT but without a mounted resctrl (pqos then programs the MSRs).
//! Each app gets a class of service (COS 1, 2, ...) with its mask
//! (`pqos -e "llc:COS=0xMASK"`) and its CPUs are associated with that class
//! (`pqos -a "llc:COS=CPULIST"`). Restore puts the class back to the full
//! mask and the CPUs back in COS 0.

use std::collections::BTreeMap;

use qosd_core::{Allocation, Resource};

use crate::error::{Error, Result};
use crate::journal::Entry;
use crate::root::Root;
use crate::ways::WayAllocator;
use crate::{Actuator, AppTarget, Ctx, KnobRequest};
use qosd_core::cpulist;

const R: Resource = Resource::CacheWays;

/// pqos needs the tool, a CPU with L3 CAT, and the number of ways: from
/// `cbm_bits` (config) or the L3's `ways_of_associativity`.
pub fn probe(root: &Root, cbm_bits: Option<u32>) -> std::result::Result<WayAllocator, String> {
    if crate::tool::which("pqos").is_none() {
        return Err("pqos not on PATH (apt install intel-cmt-cat)".into());
    }
    let cat = root
        .read("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "cat_l3"));
    if !cat {
        return Err(
            "pqos is installed but the CPU has no L3 CAT (no cat_l3 flag in /proc/cpuinfo)".into(),
        );
    }
    let bits = match cbm_bits {
        Some(b) => b,
        None => {
            let p = "/sys/devices/system/cpu/cpu0/cache/index3/ways_of_associativity";
            root.read_trim(p)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("no {p} to size the cache bitmask (set pqos_cbm_bits)"))?
        }
    };
    if bits == 0 || bits > 64 {
        return Err(format!("{bits} cache ways is not a usable bitmask width"));
    }
    Ok(WayAllocator {
        cbm_mask: if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        },
        min_cbm_bits: 1,
    })
}

pub struct PqosWays {
    pub alloc: WayAllocator,
    /// Class of service of each app, given on first use.
    cos: BTreeMap<String, u32>,
    /// The ways last put in force per app (pqos has no cheap read-back).
    last: BTreeMap<String, u32>,
}

impl PqosWays {
    pub fn new(alloc: WayAllocator) -> Self {
        PqosWays {
            alloc,
            cos: BTreeMap::new(),
            last: BTreeMap::new(),
        }
    }

    /// The app's class: the one it has, else the lowest not used by this
    /// set nor recorded in the journal (another qosd run, `qosd set`).
    fn cos_of(&mut self, ctx: &Ctx, app: &str) -> u32 {
        if let Some(&c) = self.cos.get(app) {
            return c;
        }
        let used: Vec<u32> = ctx
            .journal()
            .entries()
            .iter()
            .filter_map(|e| match e {
                Entry::Command { key, .. } => key.strip_prefix("pqos:cos:")?.parse().ok(),
                _ => None,
            })
            .chain(self.cos.values().copied())
            .collect();
        let c = (1..).find(|c| !used.contains(c)).unwrap_or(1);
        self.cos.insert(app.to_owned(), c);
        c
    }
}

fn argv(args: &[&str]) -> Vec<String> {
    std::iter::once("pqos")
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect()
}

impl Actuator for PqosWays {
    fn resource(&self) -> Resource {
        R
    }

    fn backend(&self) -> &'static str {
        "pqos"
    }

    fn offer(&self, _: &crate::caps::Probe, node: &mut qosd_core::NodeCaps) {
        node.nr_ways = self.alloc.nr_ways();
    }

    fn apply(&mut self, ctx: &mut Ctx, plan: &KnobRequest<'_>) -> Result<()> {
        let Some(ways) = plan.want.llc_ways else {
            return Ok(());
        };
        if plan.cpus.is_empty() {
            return Err(Error::Invalid(format!(
                "app {} has no CPUs to associate",
                plan.app.name
            )));
        }
        let requests: Vec<(String, u32)> = plan
            .all
            .iter()
            .filter_map(|(n, (_, a))| Some((n.clone(), a.llc_ways?)))
            .collect();
        let got = self.alloc.allocate(self.alloc.cbm_mask, &requests)?;
        let full = self.alloc.cbm_mask;
        for (name, mask) in got {
            let cos = self.cos_of(ctx, &name);
            let set = argv(&["-e", &format!("llc:{cos}=0x{mask:x}")]);
            let undo = argv(&["-e", &format!("llc:{cos}=0x{full:x}")]);
            ctx.run(R, &set, vec![(format!("pqos:cos:{cos}"), undo)])?;
        }
        let cos = self.cos_of(ctx, &plan.app.name);
        let list = cpulist::format(plan.cpus);
        let undo = argv(&["-a", &format!("llc:0={list}")]);
        ctx.run(
            R,
            &argv(&["-a", &format!("llc:{cos}={list}")]),
            vec![(format!("pqos:assoc:{list}"), undo)],
        )?;
        self.last.insert(plan.app.name.clone(), ways);
        Ok(())
    }

    fn read(&self, _ctx: &Ctx, app: &AppTarget) -> Result<Allocation> {
        Ok(Allocation {
            llc_ways: self.last.get(&app.name).copied(),
            ..Default::default()
        })
    }
}
