//! Finding each app's processes on every tick (a `/proc` scan on decision
//! ticks, a liveness check otherwise; a job app's process is its job's),
//! handing them to the sensors (the eBPF tracer follows them), admitting apps that appear with
//! their starting share and releasing those whose processes all exited.

use qosd_core::admit::Peers;

use super::{DaemonNode, Events};

impl DaemonNode {
    pub(super) fn discover(&mut self, now_ms: u64, scan: bool) -> Events {
        let mut ev = Events::new();
        if scan {
            ev.extend(self.sync_pod_apps());
            for a in &mut self.apps {
                if a.cfg.matcher.pod.is_some() {
                    a.containers = self.finder.containers_of(&a.cfg.matcher);
                }
            }
        }
        let mut found: Vec<Vec<i32>> = if scan {
            let matchers: Vec<_> = self.apps.iter().map(|a| &a.cfg.matcher).collect();
            let known: Vec<&[i32]> = self.apps.iter().map(|a| a.pids.as_slice()).collect();
            self.finder.find_all(&matchers, &known)
        } else {
            self.apps
                .iter()
                .map(|a| {
                    a.pids
                        .iter()
                        .copied()
                        .filter(|&p| self.finder.alive(p))
                        .collect()
                })
                .collect()
        };
        // A job app's process is its job (started by the supervisor).
        for (i, f) in found.iter_mut().enumerate() {
            if let Some(p) = self.jobs.pids(i) {
                *f = p;
            }
        }
        let mut changed = false;
        for (i, pids) in found.into_iter().enumerate() {
            if pids == self.apps[i].pids {
                continue;
            }
            changed = true;
            let old = std::mem::replace(&mut self.apps[i].pids, pids.clone());
            let name = self.apps[i].cfg.name.clone();
            // The sensors follow them (the eBPF tracer its topmost pids).
            ev.extend(self.sensing.set_pids(i, pids.clone()));
            let managed = self.act.current().contains_key(&name);
            if pids.is_empty() {
                self.apps[i].note = None;
                let msg = match self.act.release(&name, &old) {
                    Ok(c) if c.is_empty() => String::new(),
                    Ok(c) => format!(", {} settings put back", c.len()),
                    Err(e) => format!(", putting its settings back failed: {e}"),
                };
                let gone = if self.apps[i].cfg.matcher.pod.is_some() {
                    "gone or no longer matched (pod deleted or relabelled, or exited)"
                } else {
                    "exited"
                };
                ev.push(format!("app {name}: {gone} (pids {old:?}): released{msg}"));
                self.unclaim(&old);
            } else if !managed {
                ev.extend(self.foreign(i, &pids));
                ev.extend(self.admit(now_ms, i));
            } else {
                ev.push(format!("app {name}: processes now {pids:?}"));
                let left: Vec<i32> = old.iter().copied().filter(|p| !pids.contains(p)).collect();
                self.unclaim(&left);
                ev.extend(self.foreign(i, &pids));
            }
        }
        if scan {
            // Running apps left out for want of units: units may be free now.
            for i in 0..self.apps.len() {
                let name = &self.apps[i].cfg.name;
                if !self.apps[i].pids.is_empty() && !self.act.current().contains_key(name) {
                    let before = self.apps[i].note.clone();
                    let e = self.admit(now_ms, i);
                    if self.apps[i].note != before {
                        ev.extend(e);
                    }
                }
            }
        }
        if changed {
            // New processes of managed apps get their app's settings.
            let pids = self.managed_pids();
            let current = self.act.current().clone();
            if let Ok(applied) = self.act.set(&current, &pids, false) {
                ev.extend(self.record(now_ms, &[], &applied));
            }
        }
        ev
    }

    /// Claims the app's processes and warns of those another running
    /// qosd manages too: by its claim on the process, else by the group it
    /// put them in (a qosd that predates claims). Both would undo each
    /// other's changes.
    fn foreign(&mut self, i: usize, pids: &[i32]) -> Events {
        let name = self.apps[i].cfg.name.clone();
        let mut ev = Events::new();
        let mut claimed = Vec::new();
        if let Some(c) = &mut self.claims {
            for o in c.claim(&name, pids) {
                let (by, app) = o.holder.split_once(' ').unwrap_or((&o.holder, "?"));
                ev.push(format!(
                    "WARNING: app {name}: pid {} is managed by another running qosd \
                     (pid {by}, app {app}): both manage it and the last change wins; \
                     match it in one only",
                    o.pid
                ));
                claimed.push(o.pid);
            }
        }
        let own = qosd_actuators::AppTarget::new(name.clone(), Vec::new()).group_name();
        let root = &self.root;
        ev.extend(
            pids.iter()
                .filter(|p| !claimed.contains(p))
                .filter_map(|&p| {
                    let (g, by) = qosd_actuators::grouplock::foreign_group(root, p, &own)?;
                    Some(format!(
                        "WARNING: app {name}: pid {p} is in {g}, a group of another running qosd \
                 (pid {by}): both manage it and the last change wins; match it in one only"
                    ))
                }),
        );
        ev
    }

    /// Drops this daemon's claims on processes it no longer manages.
    pub(super) fn unclaim(&mut self, pids: &[i32]) {
        if let Some(c) = &mut self.claims {
            c.release(pids);
        }
    }

    /// An app whose processes appeared: its starting share, applied.
    fn admit(&mut self, now_ms: u64, i: usize) -> Events {
        let name = self.apps[i].cfg.name.clone();
        let pids = self.apps[i].pids.clone();
        let peers: Peers = self
            .apps
            .iter()
            .filter(|a| self.act.current().contains_key(&a.cfg.name))
            .map(|a| (a.cfg.name.clone(), (a.cfg.class, a.limits)))
            .collect();
        let cfg = &self.apps[i].cfg;
        let initial = qosd_core::knobs::with_class_defaults(cfg.initial_share(), cfg.class);
        let limits = self.apps[i].limits;
        let (plan, taken) = match self.act.admit(&name, initial, limits, &peers) {
            Ok(x) => x,
            Err(why) => {
                self.apps[i].note = Some(format!("monitored, not managed: {why}"));
                return vec![format!(
                    "app {name}: found pids {pids:?}; monitored, not managed: {why}"
                )];
            }
        };
        self.apps[i].note = None;
        let mut all = self.managed_pids();
        all.insert(name.clone(), pids.clone());
        let mut ev = Vec::new();
        match self.act.set(&plan, &all, false) {
            Ok(applied) => {
                ev.extend(self.record(now_ms, &taken, &applied));
                let failed = applied.iter().find(|a| a.app == name && a.error.is_some());
                match failed {
                    Some(a) => ev.push(format!(
                        "app {name}: found pids {pids:?}; applying its start allocation failed: {}",
                        a.error.as_deref().unwrap_or("")
                    )),
                    None => ev.push(format!(
                        "app {name}: found pids {pids:?}; starts with {}",
                        self.describe(&name)
                    )),
                }
            }
            Err(e) => {
                self.apps[i].note = Some(format!("monitored, not managed: {e}"));
                ev.push(format!("app {name}: found pids {pids:?}; not managed: {e}"));
            }
        }
        ev
    }
}
