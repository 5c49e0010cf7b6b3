//! The journal's entries: one thing qosd changed, with what puts it back
//! (how each kind is undone: [`super::undo`]).

use std::path::PathBuf;

use qosd_core::Resource;
use serde::{Deserialize, Serialize};

use super::undo;
use crate::ctx::dry::Dry;
use crate::error::Result;
use crate::netns::NetnsRef;
use crate::root::Root;
use crate::Change;

/// One thing qosd changed, with what puts it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Entry {
    /// A file's content before qosd wrote it. `best_effort`: writing it
    /// back may fail harmlessly (e.g. `scaling_setspeed` reads
    /// `<unsupported>` outside the userspace governor).
    File {
        resource: Resource,
        path: PathBuf,
        original: String,
        #[serde(default)]
        best_effort: bool,
    },
    /// Per-thread CPU affinity of a process. Threads not listed (created
    /// later) get the main thread's original.
    Affinity {
        resource: Resource,
        pid: i32,
        start_time: u64,
        threads: Vec<(i32, String)>,
    },
    /// Per-thread scheduling policy of a process ([`crate::schedpolicy`]
    /// text). Threads not listed (created later) get the main thread's.
    Sched {
        resource: Resource,
        pid: i32,
        start_time: u64,
        threads: Vec<(i32, String)>,
    },
    /// A directory (cgroup, resctrl group) qosd created: removed on restore.
    CreatedDir { resource: Resource, path: PathBuf },
    /// A process qosd moved to another cgroup; `back_to` is the
    /// `cgroup.procs` of the group it came from.
    Moved {
        resource: Resource,
        pid: i32,
        start_time: u64,
        back_to: PathBuf,
    },
    /// A controller qosd enabled in a cgroup2 `cgroup.subtree_control`
    /// (`path`) so that its groups under it can use it: restoring writes
    /// `-controller` (after the groups are gone).
    EnabledController {
        resource: Resource,
        path: PathBuf,
        controller: String,
    },
    /// An external command that puts a setting back (pqos, cpupower).
    Command {
        resource: Resource,
        key: String,
        argv: Vec<String>,
    },
    /// A network object qosd made (a TC filter or clsact qdisc, a delay
    /// line veth) and the `ip`/`tc` command that removes it, run in the
    /// namespace where it was made ([`crate::netns`]).
    Net {
        /// The knob's name (`hedge`).
        knob: String,
        key: String,
        netns: NetnsRef,
        argv: Vec<String>,
    },
}

impl Entry {
    /// Only the first entry per key is kept: it holds the true original.
    pub fn key(&self) -> String {
        match self {
            Entry::File { path, .. } => format!("file:{}", path.display()),
            Entry::Affinity { pid, .. } => format!("affinity:{pid}"),
            Entry::Sched { pid, .. } => format!("sched:{pid}"),
            Entry::CreatedDir { path, .. } => format!("dir:{}", path.display()),
            Entry::Moved { pid, back_to, .. } => format!("moved:{pid}:{}", back_to.display()),
            Entry::EnabledController {
                path, controller, ..
            } => format!("controller:{}:{controller}", path.display()),
            Entry::Command { key, .. } => format!("command:{key}"),
            Entry::Net { key, netns, .. } => format!("net:{}:{key}", netns.inode),
        }
    }

    /// The resource the entry belongs to (`None`: a knob that is not a
    /// share of the node, see [`Entry::Net`]).
    pub fn resource(&self) -> Option<Resource> {
        Some(match self {
            Entry::File { resource, .. }
            | Entry::Affinity { resource, .. }
            | Entry::Sched { resource, .. }
            | Entry::CreatedDir { resource, .. }
            | Entry::Moved { resource, .. }
            | Entry::EnabledController { resource, .. }
            | Entry::Command { resource, .. } => *resource,
            Entry::Net { .. } => return None,
        })
    }

    /// Puts this entry's original back. A dry run (`dry`) logs instead,
    /// reading and keeping what it has done there.
    pub fn undo(&self, root: &Root, dry: Option<&mut Dry>) -> Result<Vec<Change>> {
        let dry_run = dry.is_some();
        super::trust::check_entry(root, self)?;
        match self {
            Entry::File {
                resource,
                path,
                original,
                best_effort,
            } => undo::file(root, dry, resource, path, original, best_effort),
            Entry::Affinity {
                resource,
                pid,
                start_time,
                threads,
            } => undo::affinity(root, dry_run, resource, pid, start_time, threads),
            Entry::Sched {
                resource,
                pid,
                start_time,
                threads,
            } => undo::sched(root, dry, resource, pid, start_time, threads),
            Entry::CreatedDir { resource, path } => undo::created_dir(root, dry, resource, path),
            Entry::Moved {
                resource,
                pid,
                start_time,
                back_to,
            } => undo::moved(root, dry, resource, pid, start_time, back_to),
            Entry::EnabledController {
                resource,
                path,
                controller,
            } => undo::enabled_controller(root, dry.as_deref(), resource, path, controller),
            Entry::Command { resource, argv, .. } => undo::command(root, dry_run, resource, argv),
            Entry::Net {
                knob, netns, argv, ..
            } => undo::net(root, dry_run, knob, netns, argv),
        }
    }
}
