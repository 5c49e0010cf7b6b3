//! Apps that pods ask for with `qosd.io/*` annotations: one app per
//! annotated pod (`<namespace>.<pod>`), added when the watch shows the pod
//! and removed (released, untraced) when it goes, stops asking, or a
//! config entry names it (config wins). A malformed annotation is logged
//! once with the pod and the key, and the pod is left alone.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{DaemonNode, Events};
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
    pub(super) lock_root: Option<PathBuf>,
    pub(super) nr_slots: usize,
    /// Names whose group lock the daemon took at start (held till exit).
    pub(super) locked_at_start: BTreeSet<String>,
}

impl PodApps {
    pub fn new(root: &Path, dry_run: bool, nr_slots: usize) -> PodApps {
        PodApps {
            annotations: false,
            generation: None,
            reported: BTreeSet::new(),
            lock_root: (!dry_run).then(|| root.to_owned()),
            nr_slots,
            locked_at_start: BTreeSet::new(),
        }
    }
}

impl PodApps {
    /// Looks at every pod again on the next scan.
    pub fn forget_generation(&mut self) {
        self.generation = None;
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
                    .filter(|a| !a.from_pod)
                    .any(|a| a.cfg.matcher.pod.as_ref().is_some_and(|m| pod.matches(m)));
                match annotations::app_of(pod) {
                    Ok(Some(_)) if configured => {}
                    Ok(Some(a)) => {
                        let clash = self
                            .apps
                            .iter()
                            .any(|x| !x.from_pod && x.cfg.name == a.name);
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
            if !a.from_pod || wanted.get(&a.cfg.name) == Some(&a.cfg) {
                wanted.remove(&a.cfg.name);
                i += 1;
                continue;
            }
            ev.push(self.remove_app(i, "its pod no longer asks to be managed"));
        }
        for cfg in wanted.into_values() {
            let what = describe(&cfg);
            match self.add_app(&cfg, cfg.feedback, true) {
                Ok(()) => ev.push(format!("app {}: annotated pod ({what})", cfg.name)),
                Err(e) => ev.push(e),
            }
        }
        ev
    }
}

fn describe(a: &AppConfig) -> String {
    let class = match a.class {
        qosd_core::AppClass::Lc => "lc",
        qosd_core::AppClass::Be => "be",
    };
    format!("{class} {}", super::describe_target(a.qos_target()))
}
