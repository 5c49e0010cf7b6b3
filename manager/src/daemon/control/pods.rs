//! Apps that pods ask for with `qosd.io/*` annotations: one app per
//! annotated pod (`<namespace>.<pod>`), added when the watch shows the pod
//! and removed (released, untraced) when it goes, stops asking, or a
//! config entry names it (config wins). A malformed annotation is logged
//! once with the pod and the key, and the pod is left alone.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use qosd_actuators::grouplock::lock_groups;
use qosd_actuators::{AppTarget, Root};

use super::{AppRt, DaemonNode, Events};
use crate::config::AppConfig;
use crate::kube::annotations;

/// What the daemon keeps about annotated pods.
#[derive(Debug)]
pub struct PodApps {
    pub annotations: bool,
    /// The watch's generation last looked at.
    generation: Option<u64>,
    /// Errors already logged (each once while it lasts).
    reported: BTreeSet<String>,
    /// Where group locks live; None in a dry run (no group is made).
    lock_root: Option<PathBuf>,
    nr_slots: usize,
}

impl PodApps {
    pub fn new(root: &Path, dry_run: bool, nr_slots: usize) -> PodApps {
        PodApps {
            annotations: false,
            generation: None,
            reported: BTreeSet::new(),
            lock_root: (!dry_run).then(|| root.to_owned()),
            nr_slots,
        }
    }
}

impl DaemonNode {
    /// Brings the annotated pods' apps in line with the watch.
    pub(super) fn sync_pod_apps(&mut self) -> Events {
        let Some(src) = self.finder.pods().cloned() else {
            return Events::new();
        };
        if !self.pods.annotations {
            return Events::new();
        }
        let (wanted, errors) = {
            let g = src.set.lock();
            if !g.synced || self.pods.generation == Some(g.generation) {
                return Events::new();
            }
            self.pods.generation = Some(g.generation);
            let mut wanted: BTreeMap<String, AppConfig> = BTreeMap::new();
            let mut errors = BTreeSet::new();
            for pod in g.by_uid.values() {
                let configured = self
                    .apps
                    .iter()
                    .filter(|a| a.from_pod.is_none())
                    .any(|a| a.cfg.matcher.pod.as_ref().is_some_and(|m| pod.matches(m)));
                match annotations::app_of(pod) {
                    Ok(Some(_)) if configured => {}
                    Ok(Some(a)) => {
                        let clash = self
                            .apps
                            .iter()
                            .any(|x| x.from_pod.is_none() && x.cfg.name == a.name);
                        if clash {
                            errors.insert(format!(
                                "pod {}/{}: app `{}` is a config entry's name",
                                pod.namespace, pod.name, a.name
                            ));
                        } else {
                            wanted.insert(a.name.clone(), a);
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        errors.insert(e);
                    }
                }
            }
            (wanted, errors)
        };
        let mut ev = Events::new();
        for e in errors.difference(&self.pods.reported) {
            tracing::warn!("kubernetes: {e}");
            ev.push(format!("kubernetes: {e}: pod left alone"));
        }
        self.pods.reported = errors;
        let mut wanted = wanted;
        let mut i = 0;
        while i < self.apps.len() {
            let a = &self.apps[i];
            if a.from_pod.is_none() || wanted.get(&a.cfg.name) == Some(&a.cfg) {
                wanted.remove(&a.cfg.name);
                i += 1;
                continue;
            }
            ev.extend(self.remove_app(i));
        }
        for cfg in wanted.into_values() {
            ev.extend(self.add_app(cfg));
        }
        ev
    }

    fn add_app(&mut self, cfg: AppConfig) -> Events {
        let lock = match &self.pods.lock_root {
            None => None,
            Some(r) => {
                let group = AppTarget::new(cfg.name.clone(), Vec::new()).group_name();
                match lock_groups(&Root::new(r), &[group]) {
                    Ok(l) => Some(l),
                    Err(e) => return vec![format!("app {}: not managed: {e}", cfg.name)],
                }
            }
        };
        let live = super::live_entry(&cfg, cfg.feedback, self.pods.nr_slots);
        self.shared.lock().apps.insert(cfg.name.clone(), live);
        let mut a = AppRt::new(&cfg, cfg.feedback, self.pods.nr_slots);
        a.from_pod = Some(lock);
        let msg = format!("app {}: annotated pod ({})", cfg.name, describe(&cfg));
        self.apps.push(a);
        vec![msg]
    }

    /// Releases an annotated pod's app and forgets it.
    fn remove_app(&mut self, i: usize) -> Events {
        let pids = self.apps[i].pids.clone();
        let name = self.apps[i].cfg.name.clone();
        self.untrace(i, &pids);
        let msg = match self.act.release(&name, &pids) {
            Ok(c) if c.is_empty() => String::new(),
            Ok(c) => format!(", {} settings put back", c.len()),
            Err(e) => format!(", putting its settings back failed: {e}"),
        };
        self.shared.lock().apps.remove(&name);
        // Its group lock goes with it.
        self.apps.remove(i);
        vec![format!(
            "app {name}: its pod no longer asks to be managed: released{msg}"
        )]
    }
}

fn describe(a: &AppConfig) -> String {
    let class = match a.class {
        qosd_core::AppClass::Lc => "lc",
        qosd_core::AppClass::Be => "be",
    };
    format!("{class} {}", super::describe_target(a.qos_target()))
}
