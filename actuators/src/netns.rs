//! Network namespaces as the journal records them: an nsfs path and the
//! namespace's inode, so a restore after a SIGKILL acts in the very
//! namespace qosd changed (or not at all when it is gone: its devices,
//! qdiscs and filters went with it), and the `ip`/`tc` commands that
//! change or restore network objects there (run through `nsenter` when the
//! namespace is not qosd's own).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where bind-mounted (named) namespaces live (`ip netns add`).
const NAMED: &str = "/run/netns";

/// A network namespace: the nsfs file it was found at and its inode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetnsRef {
    pub path: PathBuf,
    pub inode: u64,
}

impl NetnsRef {
    /// The namespace at `path` (`/proc/PID/ns/net`, `/run/netns/NAME`).
    pub fn open(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let inode = std::fs::metadata(&path)
            .map_err(|e| Error::io("reading", &path, e))?
            .ino();
        Ok(NetnsRef { path, inode })
    }

    /// The namespace of process `pid`.
    pub fn of_pid(pid: i32) -> Result<Self> {
        Self::open(format!("/proc/{pid}/ns/net")).map_err(|_| Error::NoSuchPid(pid))
    }

    /// A named namespace (`ip netns add NAME`).
    pub fn named(name: &str) -> Result<Self> {
        Self::open(Path::new(NAMED).join(name))
    }

    /// True when this is the namespace qosd itself runs in.
    pub fn is_own(&self) -> bool {
        std::fs::metadata("/proc/self/ns/net").is_ok_and(|m| m.ino() == self.inode)
    }

    /// The path that still leads to this namespace: the recorded one if its
    /// inode still matches, else a named namespace with the same inode.
    /// `None`: the namespace is gone.
    pub fn locate(&self) -> Option<PathBuf> {
        let same = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.ino() == self.inode);
        if same(&self.path) {
            return Some(self.path.clone());
        }
        std::fs::read_dir(NAMED)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| same(p))
    }

    /// `argv` to run inside this namespace: as is in qosd's own namespace,
    /// else through `nsenter --net=PATH`. `None`: the namespace is gone.
    pub fn command(&self, argv: &[String]) -> Option<Vec<String>> {
        if self.is_own() {
            return Some(argv.to_vec());
        }
        let path = self.locate()?;
        let mut out = vec!["nsenter".to_owned(), format!("--net={}", path.display())];
        out.extend(argv.iter().cloned());
        Some(out)
    }

    /// Runs `argv` in this namespace; returns its stdout.
    pub fn run(&self, argv: &[String]) -> Result<String> {
        let full = self.command(argv).ok_or_else(|| Error::Command {
            command: argv.join(" "),
            message: format!("network namespace {} is gone", self.path.display()),
        })?;
        crate::tool::output(&full)
    }
}

/// True when `e` says the object to remove is already gone (a device
/// removed with its namespace, a filter removed with its qdisc).
pub fn already_gone(e: &Error) -> bool {
    match e {
        Error::Command { message, .. } => [
            "Cannot find device",
            "No such file or directory",
            "Cannot find specified qdisc",
            "Invalid handle",
            "Filter with specified priority/protocol not found",
        ]
        .iter()
        .any(|m| message.contains(m)),
        _ => false,
    }
}

/// True when `dev`'s clsact qdisc in `ns` still holds a filter on either
/// hook (anyone's): qosd removes a clsact qdisc it made only when it is
/// empty, so another tool's filters on it survive qosd's exit.
pub fn clsact_in_use(ns: &NetnsRef, dev: &str) -> Result<bool> {
    for dir in ["ingress", "egress"] {
        let argv: Vec<String> = ["tc", "filter", "show", "dev", dev, dir]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        if !ns.run(&argv)?.trim().is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The only commands a journal entry may run to restore network objects:
/// `ip link del qhd-…` (a delay line qosd made), `tc filter del … pref
/// <qosd's>` and `tc qdisc del … clsact`. A forged state file cannot make
/// root run anything else.
pub fn check_undo(argv: &[String]) -> Result<()> {
    let a: Vec<&str> = argv.iter().map(String::as_str).collect();
    let ok = match a.as_slice() {
        ["ip", "link", "del", dev] => dev.starts_with(DELAY_PREFIX),
        ["tc", "filter", "del", "dev", _, "ingress" | "egress", "pref", p] => {
            [TC_PREF, NET_TC_PREF, NETD_TC_PREF]
                .iter()
                .any(|q| *p == q.to_string())
        }
        ["tc", "qdisc", "del", "dev", _, "clsact"] => true,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "state file entry refused: `{}` is not a command qosd runs to restore the network",
            argv.join(" ")
        )))
    }
}

/// Name prefix of the delay-line veths qosd creates.
pub const DELAY_PREFIX: &str = "qhd-";
/// TC filter priority of qosd's programs (one value, so a restore removes
/// qosd's filters and nobody else's).
pub const TC_PREF: u32 = 0x4851;
/// TC filter priority of `qosd net`'s counting programs: its own, so that
/// removing them leaves a hedge's filters on the same interface alone.
pub const NET_TC_PREF: u32 = 0x4e54;
/// TC filter priority of the daemon's net sensor (`sensors.net`): not
/// `qosd net`'s, so that either can run and stop without the other's.
pub const NETD_TC_PREF: u32 = 0x4e44;

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn only_qosd_network_undos_pass() {
        for ok in [
            "ip link del qhd-1a2b",
            "tc filter del dev eth0 egress pref 18513",
            "tc filter del dev eth0 ingress pref 20052",
            "tc qdisc del dev eth0 clsact",
        ] {
            check_undo(&v(ok)).unwrap();
        }
        for bad in [
            "ip link del eth0",
            "tc filter del dev eth0 egress pref 1",
            "tc qdisc del dev eth0 root",
            "rm -rf /",
            "ip link del qhd-1 extra",
        ] {
            assert!(check_undo(&v(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn own_namespace_runs_without_nsenter() {
        let me = NetnsRef::open("/proc/self/ns/net").unwrap();
        assert!(me.is_own());
        assert_eq!(me.command(&v("ip link")).unwrap(), v("ip link"));
        let gone = NetnsRef {
            path: "/nonexistent".into(),
            inode: 1,
        };
        assert!(gone.command(&v("ip link")).is_none());
    }
}
