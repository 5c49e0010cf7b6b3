//! The cgroup plumbing the cpuset and CPU quota knobs share: finding the
//! hierarchy that has a controller (v2 mount or v1 hierarchy) and moving an
//! app's processes into its `qosd-<app>` group.

use std::path::{Path, PathBuf};

use qosd_core::Resource;

use crate::error::{Error, Result};
use crate::journal::Entry;
use crate::root::Root;
use crate::{AppTarget, Ctx};

/// The table of what a group's knob files read when they limit nothing.
pub(crate) mod neutral;

/// A mounted filesystem from `/proc/self/mounts`: (mount point, fstype, options).
fn mounts(root: &Root) -> Vec<(String, String, String)> {
    let Ok(s) = root.read("/proc/self/mounts") else {
        return Vec::new();
    };
    s.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4).then(|| (f[1].to_owned(), f[2].to_owned(), f[3].to_owned()))
        })
        .collect()
}

/// Finds the cgroup2 mount where `controller` is available (the cores and
/// quota knobs share it). A controller not yet enabled for child groups in
/// the mount's `cgroup.subtree_control` is enabled by [`enable_for_groups`]
/// when qosd first makes a group there, as systemd does for its slices.
pub fn cgroup2_with(root: &Root, controller: &str) -> std::result::Result<PathBuf, String> {
    let mut cands: Vec<String> = mounts(root)
        .into_iter()
        .filter(|(_, t, _)| t == "cgroup2")
        .map(|(m, _, _)| m)
        .collect();
    if cands.is_empty() {
        cands = vec!["/sys/fs/cgroup".into(), "/sys/fs/cgroup/unified".into()];
    }
    let Some(m) = cands
        .iter()
        .find(|m| root.exists(format!("{m}/cgroup.controllers")))
    else {
        return Err(format!(
            "no cgroup2 mount (no cgroup.controllers in {})",
            cands.join(" or ")
        ));
    };
    let ctrls = root
        .read(format!("{m}/cgroup.controllers"))
        .unwrap_or_default();
    if !ctrls.split_whitespace().any(|c| c == controller) {
        return Err(format!(
            "cgroup2 at {m}: {controller} not in cgroup.controllers (the controller is bound to a cgroup v1 hierarchy or not built)"
        ));
    }
    if !root.exists(format!("{m}/cgroup.subtree_control")) {
        return Err(format!("cgroup2 at {m}: no cgroup.subtree_control"));
    }
    Ok(root.path(m))
}

/// Enables `controller` for the groups under a cgroup2 `mount` (its
/// `cgroup.subtree_control`), journalled so that restoring disables it
/// again. A v1 hierarchy needs nothing.
pub fn enable_for_groups(
    ctx: &mut Ctx,
    resource: Resource,
    mount: &Path,
    controller: &str,
) -> Result<()> {
    ctx.enable_controller(resource, &mount.join("cgroup.subtree_control"), controller)
}

/// Finds the cgroup v1 hierarchy with `controller` among its mount
/// options (alone or co-mounted, e.g. `cpu,cpuacct`) and `file` in it.
pub fn cgroup1_with(
    root: &Root,
    controller: &str,
    file: &str,
) -> std::result::Result<PathBuf, String> {
    let m = mounts(root)
        .into_iter()
        .find(|(_, t, o)| t == "cgroup" && o.split(',').any(|x| x == controller))
        .map(|(m, _, _)| m)
        .unwrap_or_else(|| format!("/sys/fs/cgroup/{controller}"));
    if root.exists(format!("{m}/{file}")) && root.exists(format!("{m}/cgroup.procs")) {
        Ok(root.path(m))
    } else {
        Err(format!(
            "no cgroup v1 {controller} hierarchy (no {m}/{file})"
        ))
    }
}

/// Moves each of `pids` into `group` (under `mount`) unless it is there
/// already; `controller` names the v1 hierarchy (`None` for v2). Each move
/// is journalled by `ctx` so that restoring puts the process back.
pub fn move_pids(
    ctx: &mut Ctx,
    resource: Resource,
    mount: &Path,
    group: &Path,
    controller: Option<&str>,
    pids: &[i32],
) -> Result<()> {
    for &pid in pids {
        let from = ctx.group_of(pid, mount, controller)?;
        if from == group {
            continue;
        }
        ctx.move_pid(
            resource,
            pid,
            mount,
            &group.join("cgroup.procs"),
            &from.join("cgroup.procs"),
        )?;
    }
    Ok(())
}

/// Puts `pids` back in the groups qosd found them in under `mount` and
/// removes `group` if qosd made it, by undoing (and so consuming) their
/// move entries in this hierarchy and the group's own entry, newest
/// first: a later restore does not repeat them, and a crash midway leaves
/// entries whose undo is harmless to repeat (a process already back, a
/// group already gone). Processes in the group that qosd did not move
/// (children made there) go to its parent as the group is removed.
pub fn leave_group(ctx: &mut Ctx, mount: &Path, group: &Path, pids: &[i32]) -> Result<()> {
    let ours = |e: &Entry| match e {
        Entry::Moved { pid, back_to, .. } => pids.contains(pid) && back_to.starts_with(mount),
        Entry::CreatedDir { path, .. } => path == group,
        _ => false,
    };
    if !ctx.journal().entries().iter().any(ours) {
        return Ok(());
    }
    ctx.undo_where(ours)
}

/// Whether no knob holds `group` any more: every file of [`neutral::NEUTRAL`] it
/// has reads its neutral value (as `ctx` reads it: in a dry run, what
/// the run has written).
pub fn limits_nothing(ctx: &Ctx, group: &Path) -> bool {
    neutral::NEUTRAL.iter().all(|(file, neutral)| {
        ctx.read(&group.join(file)).map_or(true, |v| {
            v.split_whitespace().next().unwrap_or("") == *neutral
        })
    })
}

/// Puts `pids` back where they were found and removes `group`
/// ([`leave_group`]) when no knob holds it ([`limits_nothing`]): a group
/// that limits nothing is only a cost. On the fair class it competes as
/// one entity, its weight split over the CPUs its threads run on, against
/// every thread outside it at full weight each: measured, the fixture at
/// 80 % of its capacity beside a local client had a p99 of 12.7 ms at the
/// root and 61 ms (36.8-151) in a group at the default weight
/// (docs/sharing.md, "A group that limits nothing"). A later limit makes
/// the group and moves the processes in again.
pub fn leave_if_unused(ctx: &mut Ctx, mount: &Path, group: &Path, pids: &[i32]) -> Result<()> {
    if limits_nothing(ctx, group) {
        leave_group(ctx, mount, group, pids)?;
    }
    Ok(())
}

/// The app's first process: the one whose group a knob reads back.
pub fn first_pid(app: &AppTarget) -> Result<i32> {
    app.pids
        .first()
        .copied()
        .ok_or_else(|| Error::Invalid(format!("app {} has no pid", app.name)))
}
