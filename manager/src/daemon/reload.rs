//! Config changes without a restart: on SIGHUP, and when the config file
//! changes (a ConfigMap update swaps the symlink the file is reached
//! through, so the file's identity is polled, not watched by inode). The
//! new file (and its policy) is validated completely first; an invalid one
//! changes nothing and is reported with its file:line:col. A valid one
//! changes the apps only — those that left or changed are released, new
//! ones found — and says which other settings wait for a restart.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::control::DaemonNode;
use super::{load, Options};
use crate::config::Config;

/// What identifies the file's content on disk: a replaced file or a
/// swapped symlink changes one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

fn stamp(p: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(p).ok()?;
    Some(Stamp {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    })
}

/// Notices that the config file changed.
#[derive(Debug)]
pub struct FileWatch {
    path: PathBuf,
    last: Option<Stamp>,
}

impl FileWatch {
    pub fn new(path: &Path) -> FileWatch {
        FileWatch {
            path: path.to_owned(),
            last: stamp(path),
        }
    }

    /// True once per change (a file missing for a moment is no change:
    /// the symlink swap may be half done).
    pub fn changed(&mut self) -> bool {
        let Some(now) = stamp(&self.path) else {
            return false;
        };
        if self.last.as_ref() == Some(&now) {
            return false;
        }
        self.last = Some(now);
        true
    }
}

/// The top-level settings that differ (applied at the next start only).
fn restart_only(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut v = Vec::new();
    let mut check = |k: &'static str, same: bool| {
        if !same {
            v.push(k);
        }
    };
    check("policy", old.policy == new.policy);
    check("seed", old.seed == new.seed);
    check(
        "monitor_interval_ms",
        old.monitor_interval_ms == new.monitor_interval_ms,
    );
    check(
        "decide_interval_ms",
        old.decide_interval_ms == new.decide_interval_ms,
    );
    check("api", old.api == new.api);
    check("actuators", old.actuators == new.actuators);
    check("sensors", old.sensors == new.sensors);
    check("power", old.power == new.power);
    check("state_file", old.state_file == new.state_file);
    check("kubernetes", old.kubernetes == new.kubernetes);
    check("realtime", old.realtime == new.realtime);
    v
}

/// Reloads `o.config` into the running daemon; the lines to log.
/// `running` becomes the config in force.
pub fn reload(o: &Options, running: &mut Config, node: &mut DaemonNode, why: &str) -> Vec<String> {
    let new = match load(o) {
        Ok((c, _, _)) => c,
        Err(e) => {
            return vec![format!(
                "reload ({why}) refused, everything kept as it is: {e:#}"
            )]
        }
    };
    let jobs = |c: &Config| {
        c.apps
            .iter()
            .filter(|a| a.job.is_some())
            .cloned()
            .collect::<Vec<_>>()
    };
    if (jobs(running) != jobs(&new) || !jobs(&new).is_empty()) && running.apps != new.apps {
        return vec![format!(
            "reload ({why}) refused, everything kept as it is: apps with a `job:` change \
             only with a restart"
        )];
    }
    if !running.wants_pods() && new.wants_pods() {
        return vec![format!(
            "reload ({why}) refused, everything kept as it is: the pod watch (match: pod, \
             kubernetes:) starts only with a restart"
        )];
    }
    let mut ev = vec![format!("reload ({why}): {} valid", o.config.display())];
    if running.apps == new.apps {
        ev.push("reload: the apps are unchanged".into());
    }
    ev.extend(node.set_apps(&new.apps, o.feedback));
    let later = restart_only(running, &new);
    if !later.is_empty() {
        ev.push(format!(
            "reload: changed settings that apply at the next start: {}",
            later.join(", ")
        ));
    }
    running.apps = new.apps;
    ev
}
