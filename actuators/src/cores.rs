//! The cores knob: which CPUs an app runs on. Backends: a cpuset cgroup
//! (v2 or v1) per app, which holds threads created later by construction,
//! or `sched_setaffinity` on every thread, which new threads inherit from
//! the thread that creates them (and which the manager re-applies each tick
//! for apps that reset their own affinity).

use std::path::{Path, PathBuf};

use qosd_core::{cpulist, Allocation, Resource};

use crate::error::{Error, Result};
use crate::root::Root;
use crate::topology::Topology;
use crate::{cgroup, proc, Actuator, AppTarget, Ctx, KnobRequest};

const R: Resource = Resource::Cores;

/// Finds the cgroup2 mount with the cpuset controller usable: the
/// prefixed mount directory, or why not.
pub fn probe_cgroup2(root: &Root) -> std::result::Result<PathBuf, String> {
    cgroup::cgroup2_with(root, "cpuset")
}

/// Finds the cgroup v1 hierarchy that has the cpuset controller.
pub fn probe_cgroup1(root: &Root) -> std::result::Result<PathBuf, String> {
    cgroup::cgroup1_with(root, "cpuset", "cpuset.cpus")
}

/// Affinity needs `/proc/PID/task` under the root to find the threads.
pub fn probe_affinity(root: &Root) -> std::result::Result<(), String> {
    if root.exists("/proc/self/task") {
        Ok(())
    } else {
        Err("no /proc/self/task under the root (not a real /proc)".into())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoresImpl {
    Affinity,
    /// A cpuset cgroup per app under `mount` (prefixed).
    Cgroup {
        v2: bool,
        mount: PathBuf,
    },
}

pub struct CoresActuator {
    pub imp: CoresImpl,
    pub topo: Topology,
}

impl CoresActuator {
    fn group(&self, app: &AppTarget) -> Option<PathBuf> {
        match &self.imp {
            CoresImpl::Cgroup { mount, .. } => Some(mount.join(app.group_name())),
            CoresImpl::Affinity => None,
        }
    }

    fn apply_cgroup(
        &self,
        ctx: &mut Ctx,
        v2: bool,
        mount: &Path,
        app: &AppTarget,
        cpus: &[u32],
    ) -> Result<()> {
        let group = mount.join(app.group_name());
        if v2 {
            cgroup::enable_for_groups(ctx, R, mount, "cpuset")?;
        }
        let created = ctx.mkdir(R, &group)?;
        ctx.write(R, &group.join("cpuset.cpus"), &cpulist::format(cpus), false)?;
        // A cpuset needs memory nodes before it can hold a task: the
        // parent's (the root group's effective nodes in v2).
        let mems = group.join("cpuset.mems");
        let empty = created
            || crate::root::read_file(&mems)
                .map(|s| s.trim().is_empty())
                .unwrap_or(true);
        if empty {
            let parent = mount.join(if v2 {
                "cpuset.mems.effective"
            } else {
                "cpuset.mems"
            });
            let m = crate::root::read_file(&parent)?;
            ctx.write(R, &mems, m.trim(), false)?;
        }
        let controller = if v2 { None } else { Some("cpuset") };
        cgroup::move_pids(ctx, R, mount, &group, controller, &app.pids)
    }
}

impl Actuator for CoresActuator {
    fn resource(&self) -> Resource {
        R
    }

    fn backend(&self) -> &'static str {
        match self.imp {
            CoresImpl::Affinity => "affinity",
            CoresImpl::Cgroup { v2: true, .. } => "cgroup2",
            CoresImpl::Cgroup { v2: false, .. } => "cgroup1",
        }
    }

    fn apply(&mut self, ctx: &mut Ctx, plan: &KnobRequest<'_>) -> Result<()> {
        let Some(cpus) = &plan.want.cpus else {
            return Ok(());
        };
        self.topo.check_cpus(cpus)?;
        for (name, (_, other)) in plan.all {
            if name == &plan.app.name {
                continue;
            }
            if let Some(oc) = &other.cpus {
                let shared = self.topo.shared_cores(cpus, oc);
                if !shared.is_empty() {
                    let s: Vec<u32> = shared
                        .iter()
                        .flat_map(|&i| self.topo.cores[i].clone())
                        .collect();
                    return Err(Error::Invalid(format!(
                        "CPUs {} of app {} share physical cores (CPUs {}) with app {name}",
                        cpulist::format(cpus),
                        plan.app.name,
                        cpulist::format(&s)
                    )));
                }
            }
        }
        match self.imp.clone() {
            CoresImpl::Affinity => {
                for &pid in &plan.app.pids {
                    ctx.set_affinity(R, pid, cpus)?;
                }
                Ok(())
            }
            CoresImpl::Cgroup { v2, mount } => self.apply_cgroup(ctx, v2, &mount, plan.app, cpus),
        }
    }

    fn offer(&self, _: &crate::caps::Probe, node: &mut qosd_core::NodeCaps) {
        node.nr_cores = self.topo.cores.len() as u32;
    }

    fn read(&self, ctx: &Ctx, app: &AppTarget) -> Result<Allocation> {
        let pid = cgroup::first_pid(app)?;
        let cpus = match self.group(app) {
            Some(g) if g.join("cpuset.cpus").exists() => {
                cpulist::parse(&crate::root::read_file(&g.join("cpuset.cpus"))?)?
            }
            _ => proc::cpus_allowed(&ctx.root, pid)?,
        };
        Ok(Allocation {
            cpus: Some(cpus),
            ..Default::default()
        })
    }
}

/// The cores knob's row of `detect.rs`'s `DETECTORS`: cgroup v2, v1,
/// then affinity, as the config allows; none without a topology.
pub fn detect(p: &crate::caps::Probe) -> crate::caps::Detected {
    use crate::caps::{BackendProbe, KnobCaps};
    let root = &p.root;
    let (p2, c2) = BackendProbe::of("cgroup2", probe_cgroup2(root), |m| {
        format!("cpuset cgroup per app under {}", root.show(m))
    });
    let (p1, c1) = BackendProbe::of("cgroup1", probe_cgroup1(root), |m| {
        format!("cgroup v1 cpuset per app under {}", root.show(m))
    });
    let (pa, ca) = BackendProbe::of("affinity", probe_affinity(root), |_| {
        "sched_setaffinity on every thread in /proc/PID/task (new threads inherit it)".into()
    });
    let allowed = |n: &str| crate::config::allowed(p.cfg.cores_backend, n);
    let mut caps = KnobCaps::choose(vec![p2, p1, pa], allowed);
    let topo = match (&caps.backend, &p.topo) {
        (Some(_), Ok(t)) => t.clone(),
        (Some(_), Err(e)) => {
            caps.withdraw(format!("cannot read the CPU topology: {e}"));
            return (caps, None);
        }
        (None, _) => return (caps, None),
    };
    let imp = match caps.backend.as_deref() {
        Some("cgroup2") => c2.map(|mount| CoresImpl::Cgroup { v2: true, mount }),
        Some("cgroup1") => c1.map(|mount| CoresImpl::Cgroup { v2: false, mount }),
        _ => ca.map(|_| CoresImpl::Affinity),
    };
    let plugin = imp.map(|imp| Box::new(CoresActuator { imp, topo }) as Box<dyn Actuator>);
    (caps, plugin)
}
