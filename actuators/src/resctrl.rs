//! Cache ways (`L3:` lines) and memory bandwidth (`MB:` lines) through
//! Linux resctrl: one control group per app under `/sys/fs/resctrl`,
//! holding the app's threads (new threads inherit their creator's group).
//! Masks are contiguous, disjoint between qosd's apps, inside
//! `info/L3/cbm_mask` and at least `info/L3/min_cbm_bits` long.

use std::path::{Path, PathBuf};

use qosd_core::{Allocation, Resource};

use crate::error::{Error, Result};
use crate::root::{read_file, Root};
use crate::ways::{parse_mask, WayAllocator};
use crate::{proc, Actuator, AppTarget, Ctx, KnobRequest};

pub const BASE: &str = "/sys/fs/resctrl";

/// Why resctrl as a whole is not usable here, if it is not.
fn resctrl_missing(root: &Root) -> Option<String> {
    if !root.exists(BASE) {
        let fs = root.read("/proc/filesystems").unwrap_or_default();
        return Some(if fs.lines().any(|l| l.trim_end().ends_with("resctrl")) {
            format!("no {BASE} directory (resctrl is in /proc/filesystems but not mounted)")
        } else {
            format!("no {BASE} and no resctrl in /proc/filesystems (kernel without CONFIG_X86_CPU_RESCTRL, or a CPU/VM without RDT)")
        });
    }
    if !root.exists(format!("{BASE}/info")) {
        return Some(format!(
            "resctrl is not mounted at {BASE} (mount -t resctrl resctrl {BASE})"
        ));
    }
    None
}

fn cpu_flag(root: &Root, flag: &str) -> bool {
    root.read("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == flag))
}

/// `cpuinfo` hint appended to reasons: says whether the CPU has the feature.
fn flag_note(root: &Root, flag: &str) -> String {
    if cpu_flag(root, flag) {
        String::new()
    } else {
        format!("; /proc/cpuinfo has no {flag} flag")
    }
}

/// The L3 way allocator from `info/L3`, or why there is none.
pub fn probe_l3(root: &Root) -> std::result::Result<WayAllocator, String> {
    if let Some(r) = resctrl_missing(root) {
        return Err(r + &flag_note(root, "cat_l3"));
    }
    let info = format!("{BASE}/info/L3");
    if !root.exists(&info) {
        return Err(format!(
            "no {info}: the CPU has no L3 CAT (or CDP splits it into L3CODE/L3DATA){}",
            flag_note(root, "cat_l3")
        ));
    }
    let mask = root
        .read(format!("{info}/cbm_mask"))
        .map_err(|e| e.to_string())
        .and_then(|s| parse_mask(&s).map_err(|e| format!("{info}/cbm_mask: {e}")))?;
    let min = root
        .read_trim(format!("{info}/min_cbm_bits"))
        .map_err(|e| e.to_string())?
        .parse()
        .map_err(|_| format!("{info}/min_cbm_bits is not a number"))?;
    Ok(WayAllocator {
        cbm_mask: mask,
        min_cbm_bits: min,
    })
}

/// Memory bandwidth limits from `info/MB`: (granularity %, minimum %).
pub fn probe_mb(root: &Root) -> std::result::Result<(u32, u32), String> {
    if let Some(r) = resctrl_missing(root) {
        return Err(r + &flag_note(root, "mba"));
    }
    let info = format!("{BASE}/info/MB");
    if !root.exists(&info) {
        return Err(format!(
            "no {info}: the CPU has no memory bandwidth allocation{}",
            flag_note(root, "mba")
        ));
    }
    let num = |f: &str| -> std::result::Result<u32, String> {
        root.read_trim(format!("{info}/{f}"))
            .map_err(|e| e.to_string())?
            .parse()
            .map_err(|_| format!("{info}/{f} is not a number"))
    };
    Ok((num("bandwidth_gran")?, num("min_bandwidth")?))
}

/// `L3:0=fffff;1=fffff` → [(0, "fffff"), (1, "fffff")] for resource `res`.
pub fn parse_line(schemata: &str, res: &str) -> Vec<(u32, String)> {
    schemata
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(res).and_then(|r| r.strip_prefix(':')))
        .map(|v| {
            v.split(';')
                .filter_map(|d| {
                    let (id, val) = d.split_once('=')?;
                    Some((id.trim().parse().ok()?, val.trim().to_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The domain ids of `res` in the default group's schemata.
pub fn domains(root: &Root, res: &str) -> Result<Vec<u32>> {
    let s = root.read(format!("{BASE}/schemata"))?;
    let d: Vec<u32> = parse_line(&s, res).into_iter().map(|(id, _)| id).collect();
    if d.is_empty() {
        return Err(Error::Invalid(format!("{BASE}/schemata has no {res} line")));
    }
    Ok(d)
}

/// Replaces (or adds) the `res` line of a group's schemata, keeping the
/// other lines, and writes the whole file in one write.
fn set_line(ctx: &mut Ctx, r: Resource, group: &Path, res: &str, value: &str) -> Result<()> {
    let path = group.join("schemata");
    let now = read_file(&path).unwrap_or_default();
    let mut lines: Vec<String> = now
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty() && !l.starts_with(&format!("{res}:")))
        .collect();
    lines.push(format!("{res}:{value}"));
    lines.sort();
    ctx.write(r, &path, &(lines.join("\n") + "\n"), false)
}

/// Makes the app's group (if needed) and puts every thread of its
/// processes in it.
fn ensure_group(ctx: &mut Ctx, r: Resource, app: &AppTarget) -> Result<PathBuf> {
    let group = ctx.root.path(BASE).join(app.group_name());
    for &pid in &app.pids {
        proc::check_pid(&ctx.root, pid)?;
    }
    ctx.mkdir(r, &group)?;
    let listed = read_file(&group.join("tasks")).unwrap_or_default();
    for &pid in &app.pids {
        for tid in proc::tids(&ctx.root, pid)? {
            if !listed.lines().any(|l| l.trim() == tid.to_string()) {
                ctx.assign(r, &group.join("tasks"), &format!("{tid}\n"))?;
            }
        }
    }
    Ok(group)
}

/// The schemata in force for `app`: its group's, or the default group's.
fn schemata_of(root: &Root, app: &AppTarget) -> Result<String> {
    let g = root.path(BASE).join(app.group_name()).join("schemata");
    if g.exists() {
        read_file(&g)
    } else {
        Ok(root.read(format!("{BASE}/schemata"))?)
    }
}

pub struct ResctrlWays {
    pub alloc: WayAllocator,
}

impl ResctrlWays {
    /// Ways held by qosd groups this set does not manage (another qosd
    /// run, or `qosd set`): those stay out of the allocation.
    fn foreign(&self, root: &Root, plan: &KnobRequest<'_>) -> Result<u64> {
        let base = root.path(BASE);
        let ours: Vec<String> = plan.all.values().map(|(a, _)| a.group_name()).collect();
        let mut taken = 0;
        let rd = std::fs::read_dir(&base).map_err(|e| Error::io("listing", &base, e))?;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("qosd-") || ours.contains(&name) {
                continue;
            }
            let s = read_file(&e.path().join("schemata")).unwrap_or_default();
            for (_, m) in parse_line(&s, "L3") {
                taken |= parse_mask(&m)?;
            }
        }
        Ok(taken)
    }
}

impl Actuator for ResctrlWays {
    fn resource(&self) -> Resource {
        Resource::CacheWays
    }

    fn offer(&self, _: &crate::caps::Probe, node: &mut qosd_core::NodeCaps) {
        node.nr_ways = self.alloc.nr_ways();
    }

    fn backend(&self) -> &'static str {
        "resctrl"
    }

    fn apply(&mut self, ctx: &mut Ctx, plan: &KnobRequest<'_>) -> Result<()> {
        if plan.want.llc_ways.is_none() {
            return Ok(());
        }
        let r = Resource::CacheWays;
        let root = ctx.root.clone();
        let doms = domains(&root, "L3")?;
        let requests: Vec<(&AppTarget, u32)> = plan
            .all
            .values()
            .filter_map(|(a, al)| Some((a, al.llc_ways?)))
            .collect();
        let available = self.alloc.cbm_mask & !self.foreign(&root, plan)?;
        let got = self.alloc.allocate(available, &requests)?;
        for (app, mask) in got {
            let value = doms
                .iter()
                .map(|d| format!("{d}={mask:x}"))
                .collect::<Vec<_>>()
                .join(";");
            let group = if app.name == plan.app.name {
                ensure_group(ctx, r, app)?
            } else {
                root.path(BASE).join(app.group_name())
            };
            let now = read_file(&group.join("schemata")).unwrap_or_default();
            let now_l3: Vec<(u32, String)> = parse_line(&now, "L3");
            let same = now_l3.len() == doms.len()
                && now_l3.iter().all(|(_, m)| parse_mask(m).ok() == Some(mask));
            if !same {
                set_line(ctx, r, &group, "L3", &value)?;
            }
        }
        Ok(())
    }

    fn read(&self, ctx: &Ctx, app: &AppTarget) -> Result<Allocation> {
        let s = schemata_of(&ctx.root, app)?;
        let ways = parse_line(&s, "L3")
            .first()
            .map(|(_, m)| parse_mask(m).map(u64::count_ones))
            .transpose()?;
        Ok(Allocation {
            llc_ways: ways,
            ..Default::default()
        })
    }
}

pub struct ResctrlMb {
    /// `info/MB/bandwidth_gran`, percent.
    pub gran_percent: u32,
    /// `info/MB/min_bandwidth`, percent.
    pub min_percent: u32,
}

impl ResctrlMb {
    /// The value resctrl will hold for `percent`: a multiple of the
    /// granularity (rounded up, as the kernel does), at least the minimum.
    pub fn effective(&self, percent: u32) -> Result<u32> {
        if percent == 0 || percent > 100 {
            return Err(Error::Invalid(format!(
                "memory bandwidth {percent}% is not in 1-100"
            )));
        }
        let g = self.gran_percent.max(1);
        Ok(percent
            .div_ceil(g)
            .saturating_mul(g)
            .clamp(self.min_percent, 100))
    }
}

impl Actuator for ResctrlMb {
    fn resource(&self) -> Resource {
        Resource::MemoryBandwidth
    }

    fn offer(&self, _: &crate::caps::Probe, node: &mut qosd_core::NodeCaps) {
        node.mb = Some(qosd_core::MbRange {
            min_percent: self.min_percent,
            step_percent: self.gran_percent.max(1),
        });
    }

    fn backend(&self) -> &'static str {
        "resctrl"
    }

    fn apply(&mut self, ctx: &mut Ctx, plan: &KnobRequest<'_>) -> Result<()> {
        let Some(p) = plan.want.mb_percent else {
            return Ok(());
        };
        let r = Resource::MemoryBandwidth;
        let v = self.effective(p)?;
        let doms = domains(&ctx.root, "MB")?;
        let group = ensure_group(ctx, r, plan.app)?;
        let value = doms
            .iter()
            .map(|d| format!("{d}={v}"))
            .collect::<Vec<_>>()
            .join(";");
        set_line(ctx, r, &group, "MB", &value)
    }

    fn read(&self, ctx: &Ctx, app: &AppTarget) -> Result<Allocation> {
        let s = schemata_of(&ctx.root, app)?;
        let mb = parse_line(&s, "MB")
            .first()
            .map(|(_, v)| v.parse::<u32>())
            .transpose()
            .map_err(|_| Error::Invalid(format!("bad MB line in schemata of {}", app.name)))?;
        Ok(Allocation {
            mb_percent: mb,
            ..Default::default()
        })
    }
}

/// The cache-ways knob's row of [`crate::caps::DETECTORS`]: resctrl L3
/// groups, then Intel's `pqos` tool, as the config allows.
pub fn detect_ways(p: &crate::caps::Probe) -> crate::caps::Detected {
    use crate::caps::{BackendProbe, KnobCaps};
    let (pr, wr) = BackendProbe::of("resctrl", probe_l3(&p.root), |a| {
        format!(
            "resctrl L3 groups: cbm_mask {:x} ({} ways), min_cbm_bits {}",
            a.cbm_mask,
            a.nr_ways(),
            a.min_cbm_bits
        )
    });
    let pqos = crate::pqos::probe(&p.root, p.cfg.pqos_cbm_bits);
    let (pq, wq) = BackendProbe::of("pqos", pqos, |a| {
        format!(
            "pqos classes of service, {} ways, CPUs associated",
            a.nr_ways()
        )
    });
    let allowed = |n: &str| crate::config::allowed(p.cfg.cache_ways_backend, n);
    let caps = KnobCaps::choose(vec![pr, pq], allowed);
    let plugin: Option<Box<dyn Actuator>> = match caps.backend.as_deref() {
        Some("resctrl") => wr.map(|alloc| Box::new(ResctrlWays { alloc }) as Box<dyn Actuator>),
        Some("pqos") => {
            wq.map(|alloc| Box::new(crate::pqos::PqosWays::new(alloc)) as Box<dyn Actuator>)
        }
        _ => None,
    };
    (caps, plugin)
}

/// The memory-bandwidth knob's row of [`crate::caps::DETECTORS`]: resctrl
/// MB lines, its only backend.
pub fn detect_mb(p: &crate::caps::Probe) -> crate::caps::Detected {
    let (pm, m) = crate::caps::BackendProbe::of("resctrl", probe_mb(&p.root), |(g, min)| {
        format!("resctrl MB lines: granularity {g}%, minimum {min}%")
    });
    let caps = crate::caps::KnobCaps::choose(vec![pm], |_| true);
    let plugin = m.map(|(gran_percent, min_percent)| {
        Box::new(ResctrlMb {
            gran_percent,
            min_percent,
        }) as Box<dyn Actuator>
    });
    (caps, plugin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_padded_schemata() {
        let s = "    L3:0=fffff;1=ff\n    MB:0=100;1=50\n";
        assert_eq!(
            parse_line(s, "L3"),
            vec![(0, "fffff".into()), (1, "ff".into())]
        );
        assert_eq!(
            parse_line(s, "MB"),
            vec![(0, "100".into()), (1, "50".into())]
        );
        assert!(parse_line(s, "L2").is_empty());
    }

    #[test]
    fn mb_rounds_up_to_granularity() {
        let m = ResctrlMb {
            gran_percent: 10,
            min_percent: 10,
        };
        assert_eq!(m.effective(35).unwrap(), 40);
        assert_eq!(m.effective(1).unwrap(), 10);
        assert_eq!(m.effective(100).unwrap(), 100);
        assert!(m.effective(0).is_err() && m.effective(101).is_err());
    }
}
