//! The actuator registry: [`Actuators`], the knob plugins the manager
//! holds, built from a [`Config`] after probing the machine
//! ([`crate::detect::detect`]). `apply` changes an app's allocation whole or
//! not at all; everything is restored on `restore_all`, on drop (which
//! also runs when a panic unwinds), and from the state file after a
//! SIGKILL; `release_app` puts back what was made for an app that exited.

use qosd_core::NodeCaps;

use crate::caps::Caps;
use crate::config::Config;
pub use crate::detect::detect;
use crate::error::{Error, Result};
use crate::journal::{Entry, Journal};
use crate::topology::Topology;
use crate::{
    proc, Actuator, Allocation, AppTarget, Apps, Change, Ctx, KnobRequest, Resource, Root,
};

/// The knobs of one machine, for the manager.
pub struct Actuators {
    pub(crate) ctx: Ctx,
    caps: Caps,
    /// The available knobs, in [`Resource::ALL`] order.
    plugins: Vec<Box<dyn Actuator>>,
    pub(crate) apps: Apps,
    /// What the policy may hand out.
    node: NodeCaps,
    restore_on_drop: bool,
}

impl Actuators {
    /// Probes the machine and opens the state file (taking its lock).
    /// Entries a killed run left in the state file are kept and restored
    /// by the next `restore_all` (see [`Actuators::start`]).
    pub fn new(cfg: &Config) -> Result<Self> {
        cfg.validate()?;
        let (caps, plugins, node) = crate::detect::detect_all(cfg);
        let root = Root::new(&cfg.root);
        let journal = Journal::open(root.clone(), Some(cfg.state_path()), cfg.dry_run)?;
        Ok(Actuators {
            ctx: Ctx::new(root, cfg.dry_run, journal),
            caps,
            plugins,
            apps: Apps::new(),
            node,
            restore_on_drop: cfg.restore_on_drop,
        })
    }

    /// For the daemon and replays: [`Actuators::new`], then put back what
    /// a previous run that was killed left changed.
    pub fn start(cfg: &Config) -> Result<(Self, Vec<Change>)> {
        let mut a = Self::new(cfg)?;
        let leftovers = if a.ctx.journal().entries().is_empty() {
            Vec::new()
        } else {
            tracing::warn!(
                "restoring what a previous qosd left in {}",
                cfg.state_path().display()
            );
            a.restore_all()?
        };
        Ok((a, leftovers))
    }

    pub fn caps(&self) -> &Caps {
        &self.caps
    }

    pub fn root(&self) -> &Root {
        &self.ctx.root
    }

    /// What the policy may hand out on this machine.
    pub fn node_caps(&self) -> NodeCaps {
        self.node
    }

    /// The CPU topology under this set's root.
    pub fn topology(&self) -> Result<Topology> {
        Topology::read(&self.ctx.root)
    }

    fn plugin_mut(&mut self, r: Resource) -> Result<&mut Box<dyn Actuator>> {
        let reason = &self.caps.get(r).reason;
        match self.plugins.iter_mut().find(|p| p.resource() == r) {
            Some(p) => Ok(p),
            None => Err(Error::Unavailable {
                resource: r,
                reason: reason.clone(),
            }),
        }
    }

    /// Leave changes in place when dropped (one-shot `qosd set`); the
    /// state file still holds the originals for `qosd restore`.
    pub fn keep_changes(&mut self) {
        self.restore_on_drop = false;
    }

    /// Puts `alloc` in force for `app`: every set field, all or nothing (a
    /// failure rolls back what was already changed). Fields left `None`
    /// keep what the app had. Returns the changes made.
    pub fn apply(&mut self, app: &AppTarget, alloc: &Allocation) -> Result<Vec<Change>> {
        if app.pids.is_empty() {
            return Err(Error::Invalid(format!("app {} has no pid", app.name)));
        }
        for &pid in &app.pids {
            proc::check_pid(&self.ctx.root, pid)?;
        }
        for r in alloc.resources() {
            self.plugin_mut(r)?;
        }
        // The new allocation merged over what the app already has.
        let merged = self
            .apps
            .get(&app.name)
            .map(|(_, a)| a.clone())
            .unwrap_or_default()
            .merged(alloc);
        let mut all = self.apps.clone();
        all.insert(app.name.clone(), (app.clone(), merged.clone()));

        let cpus = match &merged.cpus {
            Some(c) => c.clone(),
            None => proc::cpus_allowed(&self.ctx.root, app.pids[0])?,
        };
        self.ctx.begin();
        let req = KnobRequest {
            app,
            want: &merged,
            cpus: &cpus,
            all: &all,
        };
        // Only the knobs this call sets (a knob not asked for stays), in
        // table order (cores first: per-CPU knobs follow the new CPUs).
        for p in self.plugins.iter_mut() {
            if !alloc.sets(p.resource()) {
                continue;
            }
            if let Err(e) = p.apply(&mut self.ctx, &req) {
                return Err(self.ctx.rollback(e));
            }
        }
        self.apps = all;
        Ok(self.ctx.commit())
    }

    /// What is in force for `app`, for every available knob.
    pub fn read(&self, app: &AppTarget) -> Result<Allocation> {
        let mut out = Allocation::default();
        for p in &self.plugins {
            out.take(&p.read(&self.ctx, app)?, p.resource());
        }
        Ok(out)
    }

    /// The event counters of every knob that counts (the hedger's), for
    /// `app`: (knob, [(counter, value)]).
    pub fn counters(&self, app: &str) -> Vec<(Resource, Vec<(&'static str, u64)>)> {
        self.plugins
            .iter()
            .map(|p| (p.resource(), p.counters(app)))
            .filter(|(_, c)| !c.is_empty())
            .collect()
    }

    /// Runs every knob's [`Actuator::check`] for `app`: the knobs that
    /// refused it (each has turned itself off for it) and why. The app's
    /// recorded allocation forgets them, so the next apply sets them again.
    pub fn check(&mut self, app: &str) -> Vec<(Resource, Error)> {
        let mut refused = Vec::new();
        for p in self.plugins.iter_mut() {
            if let Err(e) = p.check(&mut self.ctx, app) {
                refused.push((p.resource(), e));
            }
        }
        if let Some((_, alloc)) = self.apps.get_mut(app) {
            for (r, _) in &refused {
                (qosd_core::knobs::knob(*r).copy_alloc)(alloc, &Allocation::default());
            }
        }
        refused
    }

    /// Sets the frequency of a CPU list directly (`qosd set freq --cpus`).
    pub fn set_cpu_freq(&mut self, cpus: &[u32], mhz: u32) -> Result<Vec<Change>> {
        self.plugin_mut(Resource::Frequency)?;
        if cpus.is_empty() {
            return Err(Error::Invalid("empty CPU list".into()));
        }
        self.ctx.begin();
        let ctx = &mut self.ctx;
        let p = self
            .plugins
            .iter_mut()
            .find(|p| p.resource() == Resource::Frequency);
        if let Some(Err(e)) = p.map(|p| p.apply_to_cpus(ctx, cpus, mhz)) {
            return Err(self.ctx.rollback(e));
        }
        Ok(self.ctx.commit())
    }

    /// Forgets an app that exited (its knobs stay recorded for restore).
    pub fn remove_app(&mut self, name: &str) {
        self.apps.remove(name);
    }

    /// Releases an app whose processes have all exited: forgets it and puts
    /// back what was made for it alone (its cpuset cgroup and resctrl
    /// group, the cgroup moves and affinity of its processes). Per-CPU
    /// settings (frequency) stay until [`Actuators::restore_all`], since
    /// those CPUs may serve another app next.
    pub fn release_app(&mut self, app: &AppTarget) -> Result<Vec<Change>> {
        self.apps.remove(&app.name);
        let group = app.group_name();
        let (changes, errors) = self.ctx.restore_where(|e| match e {
            Entry::CreatedDir { path, .. } => {
                path.file_name().and_then(|n| n.to_str()) == Some(group.as_str())
            }
            Entry::Moved { pid, .. } | Entry::Affinity { pid, .. } => app.pids.contains(pid),
            _ => false,
        });
        one_error(errors, &format!("releasing app {}: ", app.name)).map(|()| changes)
    }

    /// The journalled context, for objects made beside the knobs (the net
    /// sensor's TC filters): the journal restores them with the rest.
    pub fn ctx_mut(&mut self) -> &mut Ctx {
        &mut self.ctx
    }

    /// Puts back every original recorded (this run's and a killed run's),
    /// newest first, and empties the state file. Keeps going past
    /// failures; what failed stays in the state file and is returned.
    pub fn restore_all(&mut self) -> Result<Vec<Change>> {
        for p in self.plugins.iter_mut() {
            p.quiesce(&mut self.ctx);
        }
        let (changes, errors) = self.ctx.restore(None);
        self.apps.clear();
        one_error(errors, "").map(|()| changes)
    }
}

/// The restores that failed as one error (`prefix` names what was being
/// restored).
fn one_error(mut errors: Vec<Error>, prefix: &str) -> Result<()> {
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        n => Err(Error::Invalid(format!(
            "{prefix}{n} restores failed: {}",
            errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        ))),
    }
}

impl Drop for Actuators {
    fn drop(&mut self) {
        if !self.restore_on_drop {
            return;
        }
        match self.restore_all() {
            Ok(c) if !c.is_empty() => tracing::info!("restored {} settings", c.len()),
            Ok(_) => {}
            Err(e) => tracing::error!("restoring on exit: {e}"),
        }
    }
}
