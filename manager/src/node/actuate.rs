//! From the policy's counts to the machine: the allocation in force per
//! app, turned into actuator settings (which CPUs through the [`CoreMap`];
//! ways, MHz and MB percent as levels), applied app by app in an order that
//! frees units before they are handed on. Only knobs the node can actuate
//! and the config enables are ever set. An app whose apply fails keeps
//! what it had (each apply is all or nothing).

use std::collections::BTreeMap;

use qosd_actuators::{Actuators, AppTarget, Caps, Change, Error, Topology};
use qosd_core::knobs::knob;
use qosd_core::{Allocation, Allocations, Decision, Limits, NodeCaps, Resource, Share, KNOBS};

use super::coremap::CoreMap;
use qosd_core::admit::{admit, Peers};

/// The outcome of applying one app's allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub app: String,
    /// The error, when it kept its previous allocation.
    pub error: Option<String>,
    /// Its processes were gone (not an error: discovery releases it).
    pub gone: bool,
    /// Settings changed on the machine.
    pub changes: Vec<Change>,
}

pub struct Actuation {
    act: Actuators,
    topo: Topology,
    cores: CoreMap,
    node: NodeCaps,
    current: Allocations,
    /// What was last put in force per app: its pids and settings.
    last: BTreeMap<String, (Vec<i32>, Allocation)>,
    /// Put before each app's name in what the actuators make for it (its
    /// cpuset group `qosd-<prefix><app>`): empty for the daemon; a replay
    /// sets its own so it never shares a group with a daemon's app.
    group_prefix: String,
}

impl Actuation {
    /// `enabled`: the knobs the config lets the policy turn; the others
    /// are reported absent to the policy.
    pub fn new(act: Actuators, enabled: &[Resource]) -> Result<Self, Error> {
        let topo = act.topology()?;
        let mut node = act.node_caps();
        for r in Resource::ALL {
            if !enabled.contains(&r) {
                node.disable(r);
            }
        }
        Ok(Actuation {
            cores: CoreMap::new(node.nr_cores as usize),
            act,
            topo,
            node,
            current: Allocations::new(),
            last: BTreeMap::new(),
            group_prefix: String::new(),
        })
    }

    /// What the policy may hand out.
    pub fn node(&self) -> &NodeCaps {
        &self.node
    }

    pub fn caps(&self) -> &Caps {
        self.act.caps()
    }

    /// The allocation in force of every managed app.
    pub fn current(&self) -> &Allocations {
        &self.current
    }

    /// Names the groups of every app `qosd-<prefix><app>` from now on.
    pub fn set_group_prefix(&mut self, prefix: &str) {
        self.group_prefix = prefix.to_owned();
    }

    /// The event counters of the knobs that count (the hedger's) for `app`.
    pub fn counters(&self, app: &str) -> Vec<(Resource, Vec<(&'static str, u64)>)> {
        self.act.counters(&format!("{}{app}", self.group_prefix))
    }

    /// Runs the knobs' checks for `app` (see [`Actuators::check`]): the
    /// knobs that refused it, each now at its lowest level in the
    /// allocation in force, and why.
    pub fn check(&mut self, app: &str) -> Vec<(Resource, String)> {
        let refused = self.act.check(&format!("{}{app}", self.group_prefix));
        for (r, _) in &refused {
            let lowest = (knob(*r).range)(&self.node).map_or(0, |(lo, _)| lo);
            if let Some(s) = self.current.get_mut(app) {
                s.set(*r, lowest);
            }
            self.last.remove(app);
        }
        refused
            .into_iter()
            .map(|(r, e)| (r, e.to_string()))
            .collect()
    }

    /// Online logical CPUs.
    pub fn nr_online_cpus(&self) -> usize {
        self.topo.cpus.len()
    }

    /// The CPUs of `app`'s cores, when cores are managed.
    pub fn cpus(&self, app: &str) -> Option<Vec<u32>> {
        let c = self.cores.cpus(&self.topo, app);
        (!c.is_empty()).then_some(c)
    }

    /// The allocation `app` is to start with (see [`admit`]), and the
    /// units taken from others for it. Nothing is applied yet.
    pub fn admit(
        &self,
        app: &str,
        initial: Share,
        limits: Limits,
        peers: &Peers,
    ) -> Result<(Allocations, Vec<Decision>), String> {
        let mut next = self.current.clone();
        let (share, taken) = admit(&self.node, &mut next, peers, app, initial, limits)?;
        next.insert(app.to_owned(), share);
        Ok((next, taken))
    }

    /// The settings of the knobs the node has and `s` sets (a level of
    /// 0 leaves the knob as found); CPU lists come from the core map.
    fn settings(&self, app: &str, s: &Share) -> Allocation {
        let mut a = Allocation::default();
        for k in &KNOBS {
            let v = (k.share)(s);
            if v == 0 || !self.node.has(k.resource) {
                continue;
            }
            match k.level_alloc {
                Some(put) => put(&mut a, v),
                None => a.cpus = Some(self.cores.cpus(&self.topo, app)),
            }
        }
        a
    }

    /// Puts the allocations `wanted` (a plan's) in force for the apps in
    /// `pids` (the managed apps and their processes; an app not listed is
    /// ignored, a listed app missing from `wanted` keeps its allocation). `force` applies
    /// every app again even if nothing changed (the backends write only
    /// what differs), which catches threads that reset their affinity.
    pub fn set(
        &mut self,
        wanted: &Allocations,
        pids: &BTreeMap<String, Vec<i32>>,
        force: bool,
    ) -> Result<Vec<Applied>, String> {
        let mut want = Allocations::new();
        for app in pids.keys() {
            if let Some(s) = wanted.get(app).or_else(|| self.current.get(app)) {
                want.insert(app.clone(), *s);
            }
        }
        let before: BTreeMap<String, Vec<usize>> = want
            .keys()
            .map(|a| (a.clone(), self.cores.cores(a)))
            .collect();
        if self.node.has(Resource::Cores) {
            let counts = want.iter().map(|(a, s)| (a.clone(), s.nr_cores)).collect();
            self.cores.assign(&counts)?;
        }
        // Apps giving pooled units back go first, so that the units are
        // free when the apps taking them are applied.
        let grows = |app: &String, s: &Share| {
            let old = self.current.get(app).copied().unwrap_or_default();
            s.nr_cores > old.nr_cores || s.nr_ways > old.nr_ways
        };
        let mut order: Vec<(&String, &Share)> = want.iter().collect();
        order.sort_by_key(|(a, s)| grows(a, s));
        let mut out = Vec::new();
        let mut next = self.current.clone();
        for (app, share) in order {
            let settings = self.settings(app, share);
            let procs = pids.get(app).cloned().unwrap_or_default();
            let same = self.last.get(app) == Some(&(procs.clone(), settings.clone()));
            if settings.is_empty() || procs.is_empty() || (same && !force) {
                next.insert(app.clone(), *share);
                continue;
            }
            let target = AppTarget::new(format!("{}{app}", self.group_prefix), procs.clone());
            match self.act.apply(&target, &settings) {
                Ok(changes) => {
                    next.insert(app.clone(), *share);
                    self.last.insert(app.clone(), (procs, settings));
                    out.push(Applied {
                        app: app.clone(),
                        error: None,
                        gone: false,
                        changes,
                    });
                }
                Err(e) => {
                    // Back to the cores it had; its entry in `next` stays
                    // the old allocation.
                    self.cores
                        .set(app, before.get(app).cloned().unwrap_or_default());
                    out.push(Applied {
                        app: app.clone(),
                        gone: matches!(e, Error::NoSuchPid(_)),
                        error: Some(e.to_string()),
                        changes: Vec::new(),
                    });
                }
            }
        }
        self.current = next;
        Ok(out)
    }

    /// `set`'s outcome in the loop's terms: the allocation in force and
    /// every failure, as lines ("app: why", apps whose processes went away
    /// too) and by app (where going away is no failure).
    pub fn outcome(&self, set: Result<&[Applied], &str>) -> qosd_core::control::Applied {
        let mut out = qosd_core::control::Applied {
            in_force: self.current.clone(),
            ..Default::default()
        };
        match set {
            Ok(applied) => {
                for a in applied {
                    let Some(e) = &a.error else { continue };
                    out.errors.push(format!("{}: {e}", a.app));
                    if !a.gone {
                        out.failed.insert(a.app.clone(), e.clone());
                    }
                }
            }
            Err(e) => {
                let e = format!("plan not applied: {e}");
                out.errors.push(e.clone());
                out.refused = Some(e);
            }
        }
        out
    }

    /// Forgets an app whose processes are all gone and puts back what was
    /// made for it (its cpuset group, resctrl group).
    pub fn release(&mut self, app: &str, pids: &[i32]) -> Result<Vec<Change>, Error> {
        self.current.remove(app);
        self.last.remove(app);
        self.cores.set(app, Vec::new());
        self.act.release_app(&AppTarget::new(
            format!("{}{app}", self.group_prefix),
            pids.to_vec(),
        ))
    }

    /// Puts every knob back as it was found.
    /// The actuators' journalled context (see [`Actuators::ctx_mut`]).
    pub fn ctx_mut(&mut self) -> &mut qosd_actuators::Ctx {
        self.act.ctx_mut()
    }

    pub fn restore_all(&mut self) -> Result<Vec<Change>, Error> {
        self.current.clear();
        self.last.clear();
        self.cores = CoreMap::new(self.node.nr_cores as usize);
        self.act.restore_all()
    }
}
