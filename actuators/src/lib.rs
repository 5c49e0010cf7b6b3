//! qosd actuators: apply a resource setting to an app, read back what is in
//! force, and restore what was found.
//!
//! Each knob is a plugin behind the small [`Actuator`] trait, with the
//! backends the machine offers chosen at start by its row of
//! [`detect::DETECTORS`]: cores (cgroup v2 or v1 cpuset, or
//! `sched_setaffinity`), frequency (cpufreq sysfs or `cpupower`), cache
//! ways (resctrl or `pqos`), memory bandwidth (resctrl MB) and CPU quota
//! (cgroup v2 `cpu.max` or v1 CFS quota), CPU priority (the idle class:
//! `cpu.idle`, else the lowest weight). [`Actuators`] holds them for the
//! manager. Every path goes through
//! one [`Root`]; every change is journalled first ([`journal`]) so that it
//! can be undone on drop, on a signal, after a panic, or after a SIGKILL.

pub mod caps;
pub mod cgroup;
pub mod config;
pub mod cores;
pub mod ctx;
pub mod detect;
pub mod error;
pub mod freq;
pub mod grouplock;
pub mod journal;
pub mod netns;
pub mod pqos;
pub mod priority;
pub mod proc;
pub mod quota;
pub mod realtime;
pub mod registry;
pub mod resctrl;
pub mod root;
pub mod schedpolicy;
pub mod signals;
pub mod statefile;
pub mod tool;
pub mod topology;
pub mod ways;

use std::collections::BTreeMap;

pub use caps::{BackendProbe, Caps, KnobCaps, Probe};
pub use config::{Config, CoresBackend, FreqBackend, QuotaBackend, WaysBackend};
pub use ctx::Ctx;
pub use error::{Error, Result};
pub use journal::restore_state_file;
pub use qosd_core::{Allocation, Resource};
pub use registry::Actuators;
pub use root::Root;
pub use topology::{allocate_cores, Topology};
pub use ways::WayAllocator;

use serde::Serialize;

/// An app as the actuators see it: a name (used for its cgroup / resctrl
/// group, `qosd-<name>`) and its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppTarget {
    pub name: String,
    pub pids: Vec<i32>,
}

impl AppTarget {
    pub fn new(name: impl Into<String>, pids: Vec<i32>) -> Self {
        AppTarget {
            name: name.into(),
            pids,
        }
    }

    /// The app of `qosd set --pid PID`: named after the pid.
    pub fn from_pid(pid: i32) -> Self {
        AppTarget::new(format!("pid{pid}"), vec![pid])
    }

    /// The group directory name: `qosd-` and the name with anything but
    /// `[A-Za-z0-9_.-]` replaced, so it is always one path component.
    pub fn group_name(&self) -> String {
        let clean: String = self
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("qosd-{clean}")
    }
}

/// One value changed (or restored), for logs and `qosd set` output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// The knob's name: a [`Resource`]'s (`cores`, ...) or a lever's that
    /// is not a share of the node (`hedge`).
    pub resource: &'static str,
    /// The file, or "pid N thread T affinity", or the command run.
    pub target: String,
    pub from: String,
    pub to: String,
}

impl Change {
    pub fn new(
        resource: Resource,
        target: impl Into<String>,
        from: impl Into<String>,
        to: impl Into<String>,
    ) -> Self {
        Self::knob(resource.name(), target, from, to)
    }

    /// A change of a knob that is not a [`Resource`].
    pub fn knob(
        knob: &'static str,
        target: impl Into<String>,
        from: impl Into<String>,
        to: impl Into<String>,
    ) -> Self {
        Change {
            resource: knob,
            target: target.into(),
            from: from.into().trim().to_owned(),
            to: to.into().trim().to_owned(),
        }
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.to == "run" {
            write!(f, "{}: ran `{}`", self.resource, self.target)
        } else if self.from.is_empty() {
            write!(f, "{}: {} = {}", self.resource, self.target, self.to)
        } else {
            write!(
                f,
                "{}: {}: {} -> {}",
                self.resource, self.target, self.from, self.to
            )
        }
    }
}

/// Every app the set manages with what it is to have (this app's entry is
/// the allocation being applied).
pub type Apps = BTreeMap<String, (AppTarget, Allocation)>;

/// What one `apply` asks of a plugin: one app's knob settings (not the
/// policy's [`qosd_core::Plan`] of every app's share, nor the manager's
/// allocations of every app).
pub struct KnobRequest<'a> {
    pub app: &'a AppTarget,
    /// The allocation wanted for `app` (only this plugin's field matters).
    pub want: &'a Allocation,
    /// The CPUs the app runs on after the change (for per-CPU knobs).
    pub cpus: &'a [u32],
    /// All apps of the set, `app` included with `want`.
    pub all: &'a Apps,
}

/// One kind of resource with one backend. The required surface is small:
/// put a setting in force, read back what is in force; restoring replays
/// the journal entries of this resource.
pub trait Actuator: Send {
    fn resource(&self) -> Resource;

    /// The backend's name as `qosd caps` shows it.
    fn backend(&self) -> &'static str;

    /// Puts `plan.want`'s field for this resource in force for `plan.app`.
    /// Every change goes through `ctx` (journal, dry-run, rollback).
    fn apply(&mut self, ctx: &mut Ctx, plan: &KnobRequest<'_>) -> Result<()>;

    /// What is in force for `app` (only this resource's field is set).
    fn read(&self, ctx: &Ctx, app: &AppTarget) -> Result<Allocation>;

    /// Adds what this knob offers to the policy's view of the node (its
    /// range; the default offers nothing).
    fn offer(&self, probe: &caps::Probe, node: &mut qosd_core::NodeCaps) {
        let _ = (probe, node);
    }

    /// Sets a per-CPU knob on a CPU list directly (`qosd set freq --cpus`);
    /// the default: this knob is not set per CPU.
    fn apply_to_cpus(&mut self, ctx: &mut Ctx, cpus: &[u32], value: u32) -> Result<()> {
        let _ = (ctx, cpus, value);
        Err(Error::Invalid(format!(
            "{} is not set per CPU",
            self.resource()
        )))
    }

    /// Event counters of what this knob did for `app` (name, count), for
    /// `/metrics` and the API; the default: none (a level has no events).
    fn counters(&self, app: &str) -> Vec<(&'static str, u64)> {
        let _ = app;
        Vec::new()
    }

    /// Checks, between decisions, what this knob saw of `app` while in
    /// force, and finishes what it left pending (the hedger's drains). An
    /// error refuses the app: the knob has turned itself off for it and
    /// says why, and the manager keeps the knob at its lowest level for
    /// that app (the hedger: requests that carry no id). The default:
    /// nothing to check.
    fn check(&mut self, ctx: &mut Ctx, app: &str) -> Result<()> {
        let _ = (ctx, app);
        Ok(())
    }

    /// Before every knob is put back (exit, signal): lets what is in
    /// flight end (the hedger stops new hedges and waits, bounded, for
    /// those sent to settle). The default: nothing in flight.
    fn quiesce(&mut self, ctx: &mut Ctx) {
        let _ = ctx;
    }

    /// Puts back everything this resource changed.
    fn restore(&mut self, ctx: &mut Ctx) -> (Vec<Change>, Vec<Error>) {
        ctx.restore(Some(self.resource()))
    }
}
