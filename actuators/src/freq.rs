//! The frequency knob (DVFS) on the app's CPUs, through cpufreq sysfs or
//! the `cpupower` tool. Two styles, chosen by what the driver offers: the
//! `userspace` governor with `scaling_setspeed` (acpi-cpufreq), or capping
//! `scaling_max_freq` (intel_pstate, amd-pstate). Limits come from
//! `cpuinfo_min_freq`, `cpuinfo_max_freq` and `scaling_available_frequencies`.

use qosd_core::{Allocation, Resource};

use crate::error::{Error, Result};
use crate::root::Root;
use crate::{proc, Actuator, AppTarget, Ctx, KnobRequest};
use qosd_core::cpulist;

const R: Resource = Resource::Frequency;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreqStyle {
    /// `userspace` governor + `scaling_setspeed`.
    SetSpeed,
    /// `scaling_max_freq` as a ceiling under the driver's own governor.
    MaxFreq,
}

impl FreqStyle {
    pub fn describe(self) -> &'static str {
        match self {
            FreqStyle::SetSpeed => "userspace governor + scaling_setspeed",
            FreqStyle::MaxFreq => "scaling_max_freq capping",
        }
    }
}

fn dir(cpu: u32) -> String {
    format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq")
}

/// Which style cpufreq on this machine allows, or why there is none.
pub fn probe_sysfs(root: &Root) -> std::result::Result<FreqStyle, String> {
    let d = dir(0);
    if !root.exists(&d) {
        return Err(format!(
            "no {d} (no cpufreq driver: a VM, or the driver is not loaded)"
        ));
    }
    let govs = root
        .read(format!("{d}/scaling_available_governors"))
        .unwrap_or_default();
    if govs.split_whitespace().any(|g| g == "userspace")
        && root.exists(format!("{d}/scaling_setspeed"))
    {
        Ok(FreqStyle::SetSpeed)
    } else if root.exists(format!("{d}/scaling_max_freq")) {
        Ok(FreqStyle::MaxFreq)
    } else {
        Err(format!(
            "{d} has neither the userspace governor nor scaling_max_freq"
        ))
    }
}

/// cpupower drives the same sysfs files, so it needs cpufreq too.
pub fn probe_cpupower(root: &Root) -> std::result::Result<FreqStyle, String> {
    if crate::tool::which("cpupower").is_none() {
        return Err("cpupower not on PATH (apt install linux-cpupower)".into());
    }
    probe_sysfs(root).map_err(|r| format!("cpupower is installed but {r}"))
}

/// The setting in kHz for `mhz` on `cpu`: checked against the CPU's
/// limits, rounded down to an available step where the driver lists them.
pub fn target_khz(root: &Root, cpu: u32, mhz: u32) -> Result<u64> {
    let d = dir(cpu);
    let num = |f: &str| -> Result<u64> {
        let s = root.read_trim(format!("{d}/{f}"))?;
        s.parse()
            .map_err(|_| Error::Invalid(format!("{d}/{f}: {s:?} is not a number")))
    };
    let (lo, hi) = (num("cpuinfo_min_freq")?, num("cpuinfo_max_freq")?);
    let want = u64::from(mhz) * 1000;
    if want < lo || want > hi {
        return Err(Error::Invalid(format!(
            "{mhz} MHz is outside CPU {cpu}'s range {}-{} MHz (cpuinfo_min_freq, cpuinfo_max_freq)",
            lo / 1000,
            hi / 1000
        )));
    }
    let steps: Vec<u64> = root
        .read(format!("{d}/scaling_available_frequencies"))
        .map(|s| {
            s.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    Ok(match steps.iter().filter(|&&s| s <= want).max() {
        Some(&s) => s,
        None => steps.iter().copied().min().unwrap_or(want),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreqVia {
    Sysfs,
    /// `cpupower -c LIST frequency-set -f KHZ` / `-u KHZ`; originals are
    /// read from sysfs and put back with `-g GOV` / `-u KHZ`.
    Cpupower,
}

#[derive(Debug, Clone)]
pub struct FreqActuator {
    pub style: FreqStyle,
    pub via: FreqVia,
}

impl FreqActuator {
    fn apply_cpus(&self, ctx: &mut Ctx, cpus: &[u32], mhz: u32) -> Result<()> {
        let root = ctx.root.clone();
        let mut targets = Vec::new();
        for &cpu in cpus {
            if !root.exists(dir(cpu)) {
                return Err(Error::Invalid(format!("CPU {cpu} has no {}", dir(cpu))));
            }
            targets.push((cpu, target_khz(&root, cpu, mhz)?));
        }
        match self.via {
            FreqVia::Sysfs => {
                for (cpu, khz) in targets {
                    let d = root.path(dir(cpu));
                    match self.style {
                        FreqStyle::SetSpeed => {
                            let gov = d.join("scaling_governor");
                            if crate::root::read_file(&gov)?.trim() != "userspace" {
                                ctx.write(R, &gov, "userspace", false)?;
                            }
                            let ss = d.join("scaling_setspeed");
                            // Outside userspace it reads "<unsupported>":
                            // nothing to write back then, the governor is.
                            let numeric =
                                crate::root::read_file(&ss)?.trim().parse::<u64>().is_ok();
                            ctx.write(R, &ss, &khz.to_string(), !numeric)?;
                        }
                        FreqStyle::MaxFreq => {
                            ctx.write(R, &d.join("scaling_max_freq"), &khz.to_string(), false)?;
                        }
                    }
                }
                Ok(())
            }
            FreqVia::Cpupower => {
                let mut undos = Vec::new();
                for &(cpu, _) in &targets {
                    let d = dir(cpu);
                    let (key, flag, orig) = match self.style {
                        FreqStyle::SetSpeed => (
                            "governor",
                            "-g",
                            root.read_trim(format!("{d}/scaling_governor"))?,
                        ),
                        FreqStyle::MaxFreq => (
                            "max",
                            "-u",
                            root.read_trim(format!("{d}/scaling_max_freq"))?,
                        ),
                    };
                    undos.push((
                        format!("cpupower:{key}:cpu{cpu}"),
                        cpupower_argv(&[cpu], flag, &orig),
                    ));
                }
                let flag = match self.style {
                    FreqStyle::SetSpeed => "-f",
                    FreqStyle::MaxFreq => "-u",
                };
                // One command per distinct target (normally just one).
                let mut khzs: Vec<u64> = targets.iter().map(|t| t.1).collect();
                khzs.sort_unstable();
                khzs.dedup();
                for (i, khz) in khzs.iter().enumerate() {
                    let set: Vec<u32> = targets
                        .iter()
                        .filter(|t| t.1 == *khz)
                        .map(|t| t.0)
                        .collect();
                    let u = if i == 0 {
                        std::mem::take(&mut undos)
                    } else {
                        Vec::new()
                    };
                    ctx.run(R, &cpupower_argv(&set, flag, &khz.to_string()), u)?;
                }
                Ok(())
            }
        }
    }
}

/// `cpupower -c LIST frequency-set FLAG VALUE` (frequencies in kHz, the
/// tool's default unit; `-f` switches to the userspace governor itself).
pub fn cpupower_argv(cpus: &[u32], flag: &str, value: &str) -> Vec<String> {
    [
        "cpupower",
        "-c",
        &cpulist::format(cpus),
        "frequency-set",
        flag,
        value,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

impl Actuator for FreqActuator {
    fn resource(&self) -> Resource {
        R
    }

    fn backend(&self) -> &'static str {
        match self.via {
            FreqVia::Sysfs => "cpufreq",
            FreqVia::Cpupower => "cpupower",
        }
    }

    fn apply(&mut self, ctx: &mut Ctx, plan: &KnobRequest<'_>) -> Result<()> {
        let Some(mhz) = plan.want.freq_mhz else {
            return Ok(());
        };
        if plan.cpus.is_empty() {
            return Err(Error::Invalid(format!(
                "app {} has no CPUs to set the frequency of",
                plan.app.name
            )));
        }
        self.apply_cpus(ctx, plan.cpus, mhz)
    }

    fn offer(&self, p: &crate::caps::Probe, node: &mut qosd_core::NodeCaps) {
        node.freq = p
            .topo
            .as_ref()
            .ok()
            .and_then(|t| freq_range(&p.root, &t.cpus));
    }

    /// For `qosd set freq --cpus`: a CPU list directly.
    fn apply_to_cpus(&mut self, ctx: &mut Ctx, cpus: &[u32], mhz: u32) -> Result<()> {
        self.apply_cpus(ctx, cpus, mhz)
    }

    fn read(&self, ctx: &Ctx, app: &AppTarget) -> Result<Allocation> {
        let pid = *app
            .pids
            .first()
            .ok_or_else(|| Error::Invalid(format!("app {} has no pid", app.name)))?;
        let cpu = *proc::cpus_allowed(&ctx.root, pid)?
            .first()
            .ok_or_else(|| Error::Invalid(format!("pid {pid} has no CPUs")))?;
        Ok(Allocation {
            freq_mhz: Some(read_mhz(&ctx.root, self.style, cpu)?),
            ..Default::default()
        })
    }
}

/// The frequency in force on `cpu`: the set speed, or the cap.
pub fn read_mhz(root: &Root, style: FreqStyle, cpu: u32) -> Result<u32> {
    let d = dir(cpu);
    let file = match style {
        FreqStyle::SetSpeed if root.read_trim(format!("{d}/scaling_governor"))? == "userspace" => {
            "scaling_setspeed"
        }
        FreqStyle::SetSpeed => "scaling_cur_freq",
        FreqStyle::MaxFreq => "scaling_max_freq",
    };
    let s = root.read_trim(format!("{d}/{file}"))?;
    let khz: u64 = s
        .parse()
        .map_err(|_| Error::Invalid(format!("{d}/{file}: {s:?} is not a number")))?;
    Ok((khz / 1000) as u32)
}

/// One unit of a frequency decision where the driver lists no steps
/// (PARTIES moves 100 MHz at a time).
const DEFAULT_FREQ_STEP_MHZ: u32 = 100;

/// The range every CPU can run at (the highest minimum and the lowest
/// maximum over `cpus`), and the smallest step between the frequencies the
/// driver lists.
fn freq_range(root: &Root, cpus: &[u32]) -> Option<qosd_core::FreqRange> {
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
    Some(qosd_core::FreqRange {
        min_mhz: (lo / 1000) as u32,
        max_mhz: (hi / 1000) as u32,
        step_mhz,
    })
}

/// The frequency knob's row of `detect.rs`'s `DETECTORS`: cpufreq sysfs,
/// then the `cpupower` tool, as the config allows.
pub fn detect(p: &crate::caps::Probe) -> crate::caps::Detected {
    use crate::caps::{BackendProbe, KnobCaps};
    let (ps, ss) = BackendProbe::of("cpufreq", probe_sysfs(&p.root), |s| {
        format!("cpufreq sysfs: {}", s.describe())
    });
    let (pc, sc) = BackendProbe::of("cpupower", probe_cpupower(&p.root), |s| {
        format!("cpupower frequency-set: {}", s.describe())
    });
    let allowed = |n: &str| crate::config::allowed(p.cfg.frequency_backend, n);
    let caps = KnobCaps::choose(vec![ps, pc], allowed);
    let plugin = match caps.backend.as_deref() {
        Some("cpufreq") => ss.map(|style| (style, FreqVia::Sysfs)),
        Some("cpupower") => sc.map(|style| (style, FreqVia::Cpupower)),
        _ => None,
    }
    .map(|(style, via)| Box::new(FreqActuator { style, via }) as Box<dyn Actuator>);
    (caps, plugin)
}
