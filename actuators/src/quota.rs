//! The CPU quota knob: how much CPU time an app may use per period, in
//! thousandths of a CPU, through CFS bandwidth control. Backends: cgroup v2
//! `cpu.max` ("QUOTA PERIOD") in the app's group `qosd-<app>` (the same
//! group the cpuset backend uses), or cgroup v1 `cpu.cfs_quota_us` /
//! `cpu.cfs_period_us` in a group of that name in the `cpu` hierarchy. The
//! period is the group's own (the kernel's default 100 ms) unless
//! `actuators.cpu_quota_period_us` sets one: a group that has used its
//! quota is throttled until the period ends, so a short period (10 ms)
//! bounds the wait a throttled request sees (docs/sharing.md). Where the
//! kernel has CFS burst (5.14+: `cpu.max.burst`, v1 `cpu.cfs_burst_us`),
//! `actuators.cpu_quota_burst_pct` of each period's quota that went unused
//! may be banked and spent later: measured, that keeps a server's p99 near
//! its unthrottled value at 80 % of its quota, where a short period does
//! not (docs/sharing.md). Every file written is journalled and restored.

use std::path::{Path, PathBuf};

use qosd_core::quota::MILLI_PER_CPU;
use qosd_core::{Allocation, Resource};

use crate::caps::{BackendProbe, KnobCaps};
use crate::cgroup::{self, cgroup1_with, cgroup2_with};
use crate::config::QuotaBackend;
use crate::error::{Error, Result};
use crate::root::{read_file, Root};
use crate::{proc, Actuator, AppTarget, Ctx, KnobRequest};

const R: Resource = Resource::CpuQuota;

/// The kernel's default CFS period, used when a group's file cannot be
/// read (a group not made yet in a dry run).
const DEFAULT_PERIOD_US: u64 = 100_000;
/// The kernel refuses quotas under 1 ms.
const MIN_QUOTA_US: u64 = 1_000;
pub use crate::config::DEFAULT_BURST_PCT;

/// The cgroup v2 mount with the `cpu` controller (enabled for its
/// children when qosd first makes a group there).
pub fn probe_cgroup2(root: &Root) -> std::result::Result<PathBuf, String> {
    cgroup2_with(root, "cpu")
}

/// The cgroup v1 hierarchy with the `cpu` controller and CFS bandwidth
/// (a kernel without CONFIG_CFS_BANDWIDTH has no `cpu.cfs_quota_us`).
pub fn probe_cgroup1(root: &Root) -> std::result::Result<PathBuf, String> {
    cgroup1_with(root, "cpu", "cpu.cfs_quota_us")
}

/// The CPU quota knob's row of `detect.rs`'s `DETECTORS`: cgroup v2,
/// then v1, as the config allows; none without the online CPUs (the most
/// quota any app may get).
pub fn detect(p: &crate::caps::Probe) -> crate::caps::Detected {
    let root = &p.root;
    let probe = |name: &str, r: std::result::Result<PathBuf, String>, what: &str| {
        BackendProbe::of(name, r, |m| {
            format!("{what} per app under {}", root.show(m))
        })
    };
    let (p2, m2) = probe("cgroup2", probe_cgroup2(root), "cpu.max in a cgroup");
    let (p1, m1) = probe(
        "cgroup1",
        probe_cgroup1(root),
        "cpu.cfs_quota_us in a cgroup v1 cpu group",
    );
    let allowed = |n: &str| match p.cfg.cpu_quota_backend {
        QuotaBackend::Auto => true,
        QuotaBackend::Cgroup2 => n == "cgroup2",
        QuotaBackend::Cgroup1 => n == "cgroup1",
    };
    let mut caps = KnobCaps::choose(vec![p2, p1], allowed);
    let mount = match caps.backend.as_deref() {
        Some("cgroup2") => m2.map(|m| (true, m)),
        Some("cgroup1") => m1.map(|m| (false, m)),
        _ => None,
    };
    let nr_cpus = p.topo.as_ref().ok().map(|t| t.cpus.len() as u32);
    match (mount, nr_cpus) {
        (Some((v2, mount)), Some(n)) if n > 0 => {
            let plugin = QuotaActuator {
                v2,
                mount,
                nr_cpus: n,
                period_us: p.cfg.cpu_quota_period_us,
                burst_pct: p.cfg.cpu_quota_burst_pct,
            };
            (caps, Some(Box::new(plugin)))
        }
        (Some(_), _) => {
            caps.withdraw("cannot read the online CPUs (/sys/devices/system/cpu/online)".into());
            (caps, None)
        }
        (None, _) => (caps, None),
    }
}

#[derive(Debug, Clone)]
pub struct QuotaActuator {
    /// cgroup v2 (`cpu.max`) or v1 (`cpu.cfs_quota_us`).
    pub v2: bool,
    /// The hierarchy's mount directory (prefixed).
    pub mount: PathBuf,
    /// Online CPUs: no app can use more, so no quota may exceed them.
    pub nr_cpus: u32,
    /// The CFS period to enforce quotas over, µs (`None`: the group's own).
    pub period_us: Option<u64>,
    /// CFS burst, % of the quota (0-100); nothing is written where the
    /// kernel has no burst file.
    pub burst_pct: u32,
}

/// Parses a group's quota and period: v2 `cpu.max` ("max 100000" or
/// "30000 100000"), v1 the two files' numbers. `None` quota = unlimited.
fn parse_v2(s: &str) -> Option<(Option<u64>, u64)> {
    let mut it = s.split_whitespace();
    let q = it.next()?;
    let period = it
        .next()
        .map_or(Some(DEFAULT_PERIOD_US), |p| p.parse().ok())?;
    let quota = if q == "max" {
        None
    } else {
        Some(q.parse().ok()?)
    };
    Some((quota, period))
}

impl QuotaActuator {
    /// Quota (µs, `None` = unlimited) and period (µs) of a group dir.
    fn group_quota(&self, group: &Path) -> Result<(Option<u64>, u64)> {
        let bad = |f: &Path, s: &str| Error::Invalid(format!("{}: unexpected {s:?}", f.display()));
        if self.v2 {
            let f = group.join("cpu.max");
            let s = read_file(&f)?;
            parse_v2(&s).ok_or_else(|| bad(&f, &s))
        } else {
            let fq = group.join("cpu.cfs_quota_us");
            let fp = group.join("cpu.cfs_period_us");
            let (q, p) = (read_file(&fq)?, read_file(&fp)?);
            let period: u64 = p.trim().parse().map_err(|_| bad(&fp, &p))?;
            let quota: i64 = q.trim().parse().map_err(|_| bad(&fq, &q))?;
            Ok(((quota >= 0).then_some(quota as u64), period))
        }
    }

    fn controller(&self) -> Option<&'static str> {
        (!self.v2).then_some("cpu")
    }

    /// The group's burst file and its value (µs), where the kernel has
    /// CFS burst; a group made in a dry run reads as 0.
    fn burst_file(&self, group: &Path) -> Option<(PathBuf, u64)> {
        let f = group.join(if self.v2 {
            "cpu.max.burst"
        } else {
            "cpu.cfs_burst_us"
        });
        match read_file(&f) {
            Ok(s) => Some((f, s.trim().parse().unwrap_or(0))),
            Err(_) if !group.exists() => Some((f, 0)),
            Err(_) => None,
        }
    }

    /// Writes quota `q` over `period` (and the burst that goes with it).
    /// The kernel refuses a burst above the quota, so a burst that falls
    /// is written before the quota and one that rises after it.
    fn write_quota(
        &self,
        ctx: &mut Ctx,
        group: &Path,
        q: u64,
        period: u64,
        found: u64,
    ) -> Result<()> {
        let burst = self
            .burst_file(group)
            .map(|(f, old)| (f, old, q * u64::from(self.burst_pct) / 100));
        if let Some((f, old, b)) = &burst {
            if b < old {
                ctx.write(R, f, &b.to_string(), false)?;
            }
        }
        if self.v2 {
            ctx.write(R, &group.join("cpu.max"), &format!("{q} {period}"), false)?;
        } else {
            // Period first: with the quota after it, the pair is never
            // left at the new quota over the old period.
            if period != found {
                let f = group.join("cpu.cfs_period_us");
                ctx.write(R, &f, &period.to_string(), false)?;
            }
            ctx.write(R, &group.join("cpu.cfs_quota_us"), &q.to_string(), false)?;
        }
        match burst {
            Some((f, old, b)) if b >= old => ctx.write(R, &f, &b.to_string(), false),
            _ => Ok(()),
        }
    }
}

impl QuotaActuator {
    /// Lifts the group's quota (its period and burst stay).
    fn write_unlimited(&self, ctx: &mut Ctx, group: &Path) -> Result<()> {
        let (quota, period) = self.group_quota(group)?;
        if quota.is_none() {
            return Ok(());
        }
        if self.v2 {
            ctx.write(R, &group.join("cpu.max"), &format!("max {period}"), false)
        } else {
            ctx.write(R, &group.join("cpu.cfs_quota_us"), "-1", false)
        }
    }
}

/// Milli-CPUs to a quota in µs per `period_us`, and back (rounded to the
/// nearest milli-CPU).
pub fn quota_us(milli: u32, period_us: u64) -> u64 {
    milli as u64 * period_us / MILLI_PER_CPU as u64
}

pub fn milli_of(quota_us: u64, period_us: u64) -> u32 {
    ((quota_us * MILLI_PER_CPU as u64 + period_us / 2) / period_us.max(1)) as u32
}

impl Actuator for QuotaActuator {
    fn resource(&self) -> Resource {
        R
    }

    fn offer(&self, p: &crate::caps::Probe, node: &mut qosd_core::NodeCaps) {
        node.quota = Some(qosd_core::QuotaRange {
            step_milli: p.cfg.cpu_quota_unit_milli,
            max_milli: self.nr_cpus * MILLI_PER_CPU,
        });
    }

    fn backend(&self) -> &'static str {
        if self.v2 {
            "cgroup2"
        } else {
            "cgroup1"
        }
    }

    fn apply(&mut self, ctx: &mut Ctx, plan: &KnobRequest<'_>) -> Result<()> {
        let Some(milli) = plan.want.cpu_quota_milli else {
            return Ok(());
        };
        let max = self.nr_cpus * MILLI_PER_CPU;
        if milli == 0 || milli > max {
            return Err(Error::Invalid(format!(
                "CPU quota {:.3} CPU is not in (0, {}] (this machine's online CPUs)",
                milli as f64 / MILLI_PER_CPU as f64,
                self.nr_cpus
            )));
        }
        let group = self.mount.join(plan.app.group_name());
        let pids = &plan.app.pids;
        if milli == max {
            // Every online CPU is no limit: the group's quota unlimited,
            // and the app back where it was found unless another knob
            // holds the group (cgroup::leave_if_unused). A dry run asks
            // whether its own earlier steps made the group.
            if ctx.is_dir(&group) {
                self.write_unlimited(ctx, &group)?;
                cgroup::leave_if_unused(ctx, &self.mount, &group, pids)?;
            }
            return Ok(());
        }
        if self.v2 {
            cgroup::enable_for_groups(ctx, R, &self.mount, "cpu")?;
        }
        ctx.mkdir(R, &group)?;
        // The group's period (a group made in a dry run does not exist),
        // or the one configured.
        let found = self
            .group_quota(&group)
            .map(|(_, p)| p)
            .unwrap_or(DEFAULT_PERIOD_US);
        let period = self.period_us.unwrap_or(found);
        let q = quota_us(milli, period);
        if q < MIN_QUOTA_US {
            return Err(Error::Invalid(format!(
                "CPU quota {:.3} CPU is {q} µs per {period} µs period; the kernel's minimum is {MIN_QUOTA_US} µs",
                milli as f64 / MILLI_PER_CPU as f64
            )));
        }
        self.write_quota(ctx, &group, q, period, found)?;
        cgroup::move_pids(ctx, R, &self.mount, &group, self.controller(), pids)
    }

    /// The quota of the group the app's first process is in (its own
    /// `qosd-<app>` once applied); unlimited reads as `None`.
    fn read(&self, ctx: &Ctx, app: &AppTarget) -> Result<Allocation> {
        let pid = cgroup::first_pid(app)?;
        let current = proc::cgroup_of(&ctx.root, pid, self.controller())?;
        let group = self.mount.join(current.trim_start_matches('/'));
        let file = if self.v2 {
            "cpu.max"
        } else {
            "cpu.cfs_quota_us"
        };
        // The v2 root group has no cpu.max: nothing limits it.
        if !group.join(file).exists() {
            return Ok(Allocation::default());
        }
        let (quota, period) = self.group_quota(&group)?;
        Ok(Allocation {
            cpu_quota_milli: quota.map(|q| milli_of(q, period)),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_max_parses_both_forms() {
        assert_eq!(parse_v2("max 100000\n"), Some((None, 100_000)));
        assert_eq!(parse_v2("30000 50000"), Some((Some(30_000), 50_000)));
        assert_eq!(parse_v2("max"), Some((None, DEFAULT_PERIOD_US)));
        assert_eq!(parse_v2("x 1"), None);
        assert_eq!(parse_v2(""), None);
    }

    #[test]
    fn milli_cpus_convert_both_ways() {
        assert_eq!(quota_us(300, 100_000), 30_000);
        assert_eq!(quota_us(1500, 50_000), 75_000);
        assert_eq!(milli_of(30_000, 100_000), 300);
        assert_eq!(milli_of(33_333, 100_000), 333);
        for m in [10, 100, 250, 999, 4000] {
            assert_eq!(milli_of(quota_us(m, 100_000), 100_000), m);
        }
    }
}
