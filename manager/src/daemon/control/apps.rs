//! Apps added and removed while the daemon runs: annotated pods
//! ([`super::pods`]) and config reloads ([`crate::daemon::reload`]). An
//! added app takes its group name's lock and is found on the next scan;
//! a removed one is untraced, released (its knobs put back) and
//! forgotten.

use qosd_actuators::grouplock::lock_groups;
use qosd_actuators::{AppTarget, Root};
use qosd_core::Feedback;

use super::{AppRt, DaemonNode, Events};
use crate::config::AppConfig;

impl DaemonNode {
    /// Adds an app (`from_pod`: an annotated pod's); Err says why not.
    pub(super) fn add_app(
        &mut self,
        cfg: &AppConfig,
        feedback: Feedback,
        from_pod: bool,
    ) -> Result<(), String> {
        let lock = match &self.pods.lock_root {
            None => None,
            // Held since the start: a second flock of ours would fail.
            Some(_) if self.pods.locked_at_start.contains(&cfg.name) => None,
            Some(r) => {
                let group = AppTarget::new(cfg.name.clone(), Vec::new()).group_name();
                match lock_groups(&Root::new(r), &[group]) {
                    Ok(l) => Some(l),
                    Err(e) => return Err(format!("app {}: not managed: {e}", cfg.name)),
                }
            }
        };
        let nr_slots = self.pods.nr_slots;
        let mut live = super::live_entry(cfg, feedback, nr_slots);
        live.inbox = self.client_feeds.inbox(&cfg.name);
        self.shared.lock().apps.insert(cfg.name.clone(), live);
        self.sensing.add_app(super::sense_app(cfg, feedback));
        let mut a = AppRt::new(cfg, feedback);
        a.lock = lock;
        a.from_pod = from_pod;
        self.apps.push(a);
        // Found on the next scan, wherever the loop is.
        self.scan = true;
        Ok(())
    }

    /// Untraces, releases and forgets app `i`; the line to log.
    pub(super) fn remove_app(&mut self, i: usize, why: &str) -> String {
        let pids = self.apps[i].pids.clone();
        let name = self.apps[i].cfg.name.clone();
        // The sensors stop following it (the eBPF tracer its pids).
        for line in self.sensing.remove_app(i) {
            tracing::info!("{line}");
        }
        self.client_feeds.disconnect(&name);
        self.unclaim(&pids);
        let msg = match self.act.release(&name, &pids) {
            Ok(c) if c.is_empty() => String::new(),
            Ok(c) => format!(", {} settings put back", c.len()),
            Err(e) => format!(", putting its settings back failed: {e}"),
        };
        self.shared.lock().apps.remove(&name);
        // Its group lock goes with it.
        self.apps.remove(i);
        format!("app {name}: {why}: released{msg}")
    }
}

impl DaemonNode {
    /// Makes the configured apps `new` (a reloaded config): apps that left
    /// or changed are released, new and changed ones added; the others
    /// and the annotated pods' apps keep everything.
    pub fn set_apps(&mut self, new: &[AppConfig], feedback: Option<Feedback>) -> Events {
        let n = self;
        let mut ev = Events::new();
        let mut i = 0;
        while i < n.apps.len() {
            let a = &n.apps[i];
            let keep = a.from_pod || new.contains(&a.cfg);
            if keep {
                i += 1;
                continue;
            }
            let why = if new.iter().any(|c| c.name == a.cfg.name) {
                "changed in the config"
            } else {
                "left the config"
            };
            ev.push(n.remove_app(i, why));
        }
        for c in new {
            if n.apps.iter().any(|a| !a.from_pod && a.cfg == *c) {
                continue;
            }
            // An annotated pod's app of the same name yields to the config.
            if let Some(j) = n.apps.iter().position(|a| a.cfg.name == c.name) {
                ev.push(n.remove_app(j, "now a config entry"));
            }
            match n.add_app(c, feedback.unwrap_or(c.feedback), false) {
                Ok(()) => ev.push(format!("app {}: added by the reloaded config", c.name)),
                Err(e) => ev.push(e),
            }
        }
        // Annotated pods are judged again against the new config entries.
        n.pods.forget_generation();
        ev
    }
}
