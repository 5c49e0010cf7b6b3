//! The CPU priority knob: best-effort apps in the idle scheduling class,
//! so that a latency-critical thread preempts them at once instead of
//! sharing the CPU at equal weight. An app's processes go to its
//! `qosd-<app>` group in the cpu hierarchy (the group the quota knob uses)
//! and the group is marked idle: `cpu.idle` = 1 (cgroup v2 since 5.15, and
//! v1 where the kernel has it), else the lowest weight (`cpu.weight` 1,
//! v1 `cpu.shares` 2). "Normal" puts the default back in that group
//! (`cpu.idle` 0, `cpu.weight` 100, `cpu.shares` 1024). Without a cpu
//! group hierarchy, every thread of the app goes to `SCHED_IDLE` (and back
//! to `SCHED_OTHER` for "normal"), threads made later at each reassert.
//! The realtime value (opt-in, latency-critical apps): [`crate::realtime`].

use std::path::{Path, PathBuf};

use qosd_core::knobs::{PRIORITY_IDLE, PRIORITY_NORMAL, PRIORITY_REALTIME};
use qosd_core::{Allocation, Resource};

use crate::caps::{BackendProbe, Detected, KnobCaps, Probe};
use crate::cgroup::{self, cgroup1_with, cgroup2_with};
use crate::error::{Error, Result};
use crate::realtime::{self, Rt};
use crate::root::read_file;
use crate::{proc, schedpolicy, Actuator, AppTarget, Ctx, KnobRequest};

const R: Resource = Resource::CpuPriority;

/// Which file of the group says "idle", and its values (idle, normal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// `cpu.idle`: the group is SCHED_IDLE for the fair scheduler.
    Idle,
    /// `cpu.weight` (v2): 1 against the default 100.
    Weight,
    /// `cpu.shares` (v1): 2 (the kernel's minimum) against 1024.
    Shares,
}

impl Mark {
    fn file(self) -> &'static str {
        match self {
            Mark::Idle => "cpu.idle",
            Mark::Weight => "cpu.weight",
            Mark::Shares => "cpu.shares",
        }
    }

    /// The value written for a priority (idle or normal).
    fn value(self, priority: u32) -> &'static str {
        let idle = priority == PRIORITY_IDLE;
        match self {
            Mark::Idle => ["0", "1"][idle as usize],
            Mark::Weight => ["100", "1"][idle as usize],
            Mark::Shares => ["1024", "2"][idle as usize],
        }
    }

    /// The priority a value of this file means: idle at (or below) the
    /// idle value, normal above.
    fn priority_of(self, value: &str) -> Option<u32> {
        let v: u64 = value.trim().parse().ok()?;
        let idle = match self {
            Mark::Idle => v == 1,
            Mark::Weight => v <= 1,
            Mark::Shares => v <= 2,
        };
        Some(if idle { PRIORITY_IDLE } else { PRIORITY_NORMAL })
    }
}

/// How an app is marked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A `qosd-<app>` group in a cpu hierarchy, marked by `mark`.
    Group {
        /// cgroup v2 (else v1 `cpu` hierarchy).
        v2: bool,
        /// The hierarchy's mount directory (prefixed).
        mount: PathBuf,
        mark: Mark,
    },
    /// `SCHED_IDLE` on every thread of the app.
    SchedIdle,
}

pub struct PriorityActuator {
    pub backend: Backend,
    /// How the realtime value is applied here, or why it cannot be.
    pub rt: std::result::Result<Rt, String>,
}

/// Test-only: makes the priority knob's cgroup backends look missing, so
/// that the `SCHED_IDLE` fallback runs on a machine that has cpu groups.
pub const PRETEND_NO_GROUPS_ENV: &str = "QOSD_PRETEND_NO_PRIORITY_CGROUP";

/// The best mark a cpu hierarchy offers: `cpu.idle`, else the weight.
/// `None` when a cgroup2 mount cannot tell yet: its root group has no
/// `cpu.*` files and no child group has the cpu controller, so the mark is
/// read from the first group qosd makes ([`group_mark`]).
fn mark_of(mount: &Path, v2: bool) -> Option<Mark> {
    if mount.join("cpu.idle").exists() || has_child_file(mount, "cpu.idle") {
        Some(Mark::Idle)
    } else if !v2 {
        Some(Mark::Shares)
    } else if has_child_file(mount, "cpu.weight") {
        Some(Mark::Weight)
    } else {
        None
    }
}

/// The mark a cgroup2 group with the cpu controller offers (`None` when it
/// has no `cpu.*` files: not made, as in a dry run, or no controller).
fn group_mark(group: &Path) -> Option<Mark> {
    if group.join("cpu.idle").exists() {
        Some(Mark::Idle)
    } else if group.join("cpu.weight").exists() {
        Some(Mark::Weight)
    } else {
        None
    }
}

/// The v2 root group has no `cpu.*` files; its children do. Any child
/// group tells whether the kernel has `cpu.idle`.
fn has_child_file(mount: &Path, file: &str) -> bool {
    std::fs::read_dir(mount)
        .map(|rd| rd.flatten().any(|e| e.path().join(file).exists()))
        .unwrap_or(false)
}

/// The CPU priority knob's row of `detect.rs`'s `DETECTORS`: a cpu
/// cgroup v2, then the v1 `cpu` hierarchy, then `SCHED_IDLE` per thread.
pub fn detect(p: &Probe) -> Detected {
    let root = &p.root;
    let pretend = std::env::var_os(PRETEND_NO_GROUPS_ENV).is_some_and(|v| v == "1");
    let group = |r: std::result::Result<PathBuf, String>| match pretend {
        true => Err(format!("pretended missing (${PRETEND_NO_GROUPS_ENV}=1)")),
        false => r,
    };
    let probe = |name: &str, v2: bool, r: std::result::Result<PathBuf, String>| {
        BackendProbe::of(name, group(r), |m| {
            let how = match mark_of(m, v2) {
                Some(Mark::Idle) => "idle class: cpu.idle",
                Some(Mark::Weight) => "lowest weight (the kernel has no cpu.idle): cpu.weight",
                Some(Mark::Shares) => "lowest weight (the kernel has no cpu.idle): cpu.shares",
                None => "idle class (cpu.idle, kernel 5.15+) else the lowest weight (cpu.weight)",
            };
            format!("{how} in a group per app under {}", root.show(m))
        })
    };
    let (p2, m2) = probe("cgroup2", true, cgroup2_with(root, "cpu"));
    let (p1, m1) = probe("cgroup1", false, cgroup1_with(root, "cpu", "cpu.shares"));
    let (ps, s) = BackendProbe::of("sched_idle", crate::cores::probe_affinity(root), |_| {
        "idle class: SCHED_IDLE on every thread in /proc/PID/task (no cpu group)".into()
    });
    let mut caps = KnobCaps::choose(vec![p2, p1, ps], |_| true);
    let backend = match caps.backend.as_deref() {
        Some("cgroup2") => m2.map(|m| (true, m)),
        Some("cgroup1") => m1.map(|m| (false, m)),
        _ => None,
    }
    .map(|(v2, mount)| {
        // Undecided (a fresh cgroup2 mount): the weight until the first
        // group made says better.
        let mark = mark_of(&mount, v2).unwrap_or(Mark::Weight);
        Backend::Group { v2, mount, mark }
    })
    .or_else(|| {
        (caps.backend.as_deref() == Some("sched_idle"))
            .then_some(s)
            .flatten()
            .map(|()| Backend::SchedIdle)
    });
    let plugin = backend.map(|backend| {
        let group = match &backend {
            Backend::Group { v2, mount, .. } => Some((*v2, mount.as_path())),
            Backend::SchedIdle => None,
        };
        let rt = realtime::probe(root, group, p.cfg.rt_budget_us);
        let line = match &rt {
            Ok(rt) => format!("; {}", rt.describe()),
            Err(why) => format!("; realtime: not available: {why}"),
        };
        caps.reason += &line;
        let chosen = caps.backend.clone();
        for b in caps
            .backends
            .iter_mut()
            .filter(|b| Some(&b.name) == chosen.as_ref())
        {
            b.reason += &line;
        }
        Box::new(PriorityActuator { backend, rt }) as Box<dyn Actuator>
    });
    (caps, plugin)
}

/// Normal on the group backend: the app as qosd found it. Its threads
/// back from real time and the group's budget to 0 ([`realtime::demote`]),
/// the group's mark to normal; then, unless another knob still holds the
/// group (a CPU quota in force, on cgroup v2 the cores knob's cpuset), its
/// processes back in the groups they were found in and the group removed
/// ([`cgroup::leave_if_unused`]). A group of its own at normal weight is
/// one entity of weight 1024 against every other runnable task of the root
/// group: measured beside the idle-class job and a local client at
/// 1600 rps, p99 18.4 ms there against 12.0 / 11.1 ms at the root
/// (docs/sharing-rt.md). No group is made for normal.
fn normal(
    ctx: &mut Ctx,
    req: &KnobRequest<'_>,
    mount: &Path,
    mark: Mark,
    group: &Path,
) -> Result<()> {
    let pids = &req.app.pids;
    // As a real run would find it: a dry run reads what it has done.
    let exists = ctx.is_dir(group);
    realtime::demote(ctx, exists.then_some(group), pids)?;
    if !exists {
        return Ok(());
    }
    // The quota knob applies first (table order): its files tell.
    ctx.write(
        R,
        &group.join(mark.file()),
        mark.value(PRIORITY_NORMAL),
        false,
    )?;
    cgroup::leave_if_unused(ctx, mount, group, pids)
}

impl Actuator for PriorityActuator {
    fn resource(&self) -> Resource {
        R
    }

    fn backend(&self) -> &'static str {
        match self.backend {
            Backend::Group { v2: true, .. } => "cgroup2",
            Backend::Group { v2: false, .. } => "cgroup1",
            Backend::SchedIdle => "sched_idle",
        }
    }

    fn offer(&self, _: &Probe, node: &mut qosd_core::NodeCaps) {
        node.cpu_priority = true;
    }

    fn apply(&mut self, ctx: &mut Ctx, req: &KnobRequest<'_>) -> Result<()> {
        let Some(priority) = req.want.cpu_priority else {
            return Ok(());
        };
        if !(PRIORITY_IDLE..=PRIORITY_REALTIME).contains(&priority) {
            return Err(Error::Invalid(format!(
                "CPU priority {priority} is none of {PRIORITY_IDLE} (idle), {PRIORITY_NORMAL} \
                 (normal), {PRIORITY_REALTIME} (realtime)"
            )));
        }
        let rt = match (priority == PRIORITY_REALTIME, &self.rt) {
            (false, _) => None,
            (true, Ok(rt)) => Some(rt.clone()),
            (true, Err(why)) => {
                return Err(Error::Unavailable {
                    resource: R,
                    reason: format!("realtime: {why}"),
                })
            }
        };
        let pids = &req.app.pids;
        let (v2, mount, mark) = match &mut self.backend {
            Backend::Group { v2, mount, mark } => (*v2, mount, mark),
            Backend::SchedIdle => {
                let policy = match priority {
                    PRIORITY_IDLE => schedpolicy::IDLE,
                    PRIORITY_REALTIME => return realtime::promote(ctx, pids),
                    _ => schedpolicy::OTHER,
                };
                realtime::demote(ctx, None, pids)?;
                for &pid in pids {
                    ctx.set_sched_policy(R, pid, policy)?;
                }
                return Ok(());
            }
        };
        let group = mount.join(req.app.group_name());
        if priority == PRIORITY_NORMAL {
            return normal(ctx, req, mount, *mark, &group);
        }
        if v2 {
            // A fresh cgroup2 mount (no systemd) has no controller enabled
            // for its children: the group would have no cpu.* files.
            cgroup::enable_for_groups(ctx, R, mount, "cpu")?;
        }
        ctx.mkdir(R, &group)?;
        if v2 {
            *mark = group_mark(&group).unwrap_or(*mark);
        }
        // Threads back first, then the budget; the budget before any
        // real-time thread moves in (the kernel refuses both otherwise).
        match &rt {
            Some(rt) => realtime::give_budget(ctx, rt, &group)?,
            None => realtime::demote(ctx, Some(&group), pids)?,
        }
        let file = group.join(mark.file());
        ctx.write(R, &file, mark.value(priority.min(PRIORITY_NORMAL)), false)?;
        let controller = (!v2).then_some("cpu");
        cgroup::move_pids(ctx, R, mount, &group, controller, pids)?;
        match rt {
            Some(_) => realtime::promote(ctx, pids),
            None => Ok(()),
        }
    }

    /// The priority of the group the app's first process is in (the root
    /// group, with no file, is normal), or of its main thread's policy.
    fn read(&self, ctx: &Ctx, app: &AppTarget) -> Result<Allocation> {
        let pid = cgroup::first_pid(app)?;
        // A fake tree's pid is no live thread: its group file decides.
        let policy = schedpolicy::get(pid);
        let policy = match (&self.backend, policy) {
            (Backend::SchedIdle, p) => p?,
            (_, p) => p.unwrap_or_default(),
        };
        let priority = match &self.backend {
            _ if schedpolicy::policy_part(&policy) == realtime::POLICY => PRIORITY_REALTIME,
            Backend::SchedIdle => match policy.starts_with(schedpolicy::IDLE) {
                true => PRIORITY_IDLE,
                false => PRIORITY_NORMAL,
            },
            Backend::Group { v2, mount, mark } => {
                let controller = (!v2).then_some("cpu");
                let current = proc::cgroup_of(&ctx.root, pid, controller)?;
                let file = mount
                    .join(current.trim_start_matches('/'))
                    .join(mark.file());
                match read_file(&file) {
                    Ok(s) => mark.priority_of(&s).ok_or_else(|| {
                        Error::Invalid(format!("{}: unexpected {s:?}", file.display()))
                    })?,
                    Err(_) if !file.exists() => PRIORITY_NORMAL,
                    Err(e) => return Err(e),
                }
            }
        };
        Ok(Allocation {
            cpu_priority: Some(priority),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip() {
        for m in [Mark::Idle, Mark::Weight, Mark::Shares] {
            for p in [PRIORITY_IDLE, PRIORITY_NORMAL] {
                assert_eq!(m.priority_of(m.value(p)), Some(p), "{m:?} {p}");
            }
            assert_eq!(m.priority_of("x"), None);
        }
    }
}
