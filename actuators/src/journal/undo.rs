//! Undoing each kind of journal entry: write a file back, put affinity
//! back, remove a group qosd made (emptying it first if the kernel still
//! counts tasks in it), move a process back, disable a controller, run the
//! command that puts a setting back.

use std::path::Path;

use qosd_core::Resource;

use crate::ctx::dry::Dry;
use crate::error::{Error, Result};
use crate::netns::NetnsRef;
use crate::proc;
use crate::root::{read_file, write_file, Root};
use crate::Change;

/// A file's content written back (a failure is harmless where `best_effort`).
pub(super) fn file(
    root: &Root,
    dry: Option<&mut Dry>,
    resource: &Resource,
    path: &Path,
    original: &str,
    best_effort: &bool,
) -> Result<Vec<Change>> {
    let mut out = Vec::new();
    let now = match &dry {
        Some(d) => d.read(path),
        None => read_file(path),
    };
    let now = now.unwrap_or_default();
    if let Some(d) = dry {
        d.wrote(path, original);
    } else {
        match write_file(path, original, false) {
            Ok(()) => {}
            Err(e) if *best_effort => {
                tracing::debug!("restoring {} skipped: {e}", path.display())
            }
            Err(e) => return Err(e),
        }
    }
    out.push(Change::new(*resource, root.show(path), now, original));
    Ok(out)
}

/// Each thread's affinity put back (threads made later get the main thread's).
pub(super) fn affinity(
    root: &Root,
    dry_run: bool,
    resource: &Resource,
    pid: &i32,
    start_time: &u64,
    threads: &[(i32, String)],
) -> Result<Vec<Change>> {
    let ops = UndoOps {
        what: "affinity",
        get: &|tid| proc::get_affinity(tid).map(|c| qosd_core::cpulist::format(&c)),
        set: &|tid, want| proc::set_affinity(tid, &qosd_core::cpulist::parse(want)?),
        sched: false,
    };
    // A dry run keeps no affinity: nothing decides on it.
    let mut scratch = Dry::default();
    let dry = dry_run.then_some(&mut scratch);
    each_thread(root, dry, resource, *pid, *start_time, threads, &ops)
}

/// Each thread's scheduling policy put back (threads made later get the
/// main thread's).
pub(super) fn sched(
    root: &Root,
    dry: Option<&mut Dry>,
    resource: &Resource,
    pid: &i32,
    start_time: &u64,
    threads: &[(i32, String)],
) -> Result<Vec<Change>> {
    // Never raises a thread (see `schedpolicy::raises`): a listed thread
    // whose original is real-time was left alone, and an unlisted one
    // must not inherit a real-time main thread's policy.
    // A thread at exactly qosd's real-time policy that would be raised
    // (its want real-time too) inherited qosd's policy: lowered instead.
    let set = |tid, want: &str| match crate::schedpolicy::get(tid) {
        Ok(now) if crate::schedpolicy::raises(&now, want) => {
            if crate::schedpolicy::policy_part(&now) == crate::realtime::POLICY {
                return crate::schedpolicy::set(tid, crate::schedpolicy::OTHER);
            }
            tracing::warn!("pid {pid} thread {tid}: left at {now}, not raised to {want}");
            Ok(())
        }
        _ => crate::schedpolicy::set(tid, want),
    };
    let ops = UndoOps {
        what: "scheduling policy",
        get: &crate::schedpolicy::get,
        set: &set,
        sched: true,
    };
    each_thread(root, dry, resource, *pid, *start_time, threads, &ops)
}

/// The policy [`sched`]'s setter gives a thread at `now` asked for `want`
/// (never a raise: qosd's own real time lowered to `SCHED_OTHER`, another
/// left as it is), for a dry run to keep.
fn dry_want(now: &str, want: &str) -> String {
    if !crate::schedpolicy::raises(now, want) {
        return want.to_owned();
    }
    match crate::schedpolicy::policy_part(now) == crate::realtime::POLICY {
        true => crate::schedpolicy::OTHER.to_owned(),
        false => now.to_owned(),
    }
}

/// How [`each_thread`] reads and writes one per-thread setting.
struct UndoOps<'a> {
    what: &'static str,
    get: &'a dyn Fn(i32) -> Result<String>,
    set: &'a dyn Fn(i32, &str) -> Result<()>,
    /// The scheduling policy: a dry run reads and keeps it ([`Dry`]).
    sched: bool,
}

/// Puts one per-thread setting back on every thread of a process that is
/// still the one qosd changed; a thread not listed gets the main thread's.
fn each_thread(
    root: &Root,
    mut dry: Option<&mut Dry>,
    resource: &Resource,
    pid: i32,
    start_time: u64,
    threads: &[(i32, String)],
    ops: &UndoOps<'_>,
) -> Result<Vec<Change>> {
    let mut out = Vec::new();
    if !proc::same_process(root, pid, start_time) {
        tracing::info!("pid {pid} is gone: its {} needs no restore", ops.what);
        return Ok(out);
    }
    let main = threads
        .iter()
        .find(|(t, _)| *t == pid)
        .or(threads.first())
        .map(|(_, c)| c.clone())
        .unwrap_or_default();
    for tid in proc::tids(root, pid).unwrap_or_default() {
        let want = threads
            .iter()
            .find(|(t, _)| *t == tid)
            .map_or(main.as_str(), |(_, c)| c.as_str());
        let now = match &dry {
            Some(d) if ops.sched => d.sched(tid),
            _ => (ops.get)(tid),
        };
        if let Some(d) = dry.as_deref_mut() {
            if ops.sched {
                let before = now.as_deref().unwrap_or_default();
                d.set_sched(tid, before, &dry_want(before, want));
            }
        } else {
            match (ops.set)(tid, want) {
                Ok(()) => {}
                // The thread exited meanwhile.
                Err(Error::Sys {
                    source: nix::Error::ESRCH,
                    ..
                }) => continue,
                Err(e) => return Err(e),
            }
        }
        out.push(Change::new(
            *resource,
            format!("pid {pid} thread {tid} {}", ops.what),
            now.unwrap_or_default(),
            want,
        ));
    }
    Ok(out)
}

/// A group qosd made, removed.
pub(super) fn created_dir(
    root: &Root,
    dry: Option<&mut Dry>,
    resource: &Resource,
    path: &Path,
) -> Result<Vec<Change>> {
    let mut out = Vec::new();
    if !dry.as_ref().map_or(path.exists(), |d| d.is_dir(path)) {
        return Ok(out);
    }
    if let Some(d) = dry {
        d.made(path, false);
    } else {
        // What inherited qosd's real time in the group (children, threads
        // made later) must not leave it real-time.
        out.extend(crate::realtime::lower_in_group(root, path)?);
        remove_group_dir(path)?;
    }
    out.push(Change::new(
        *resource,
        root.show(path),
        "created",
        "removed",
    ));
    Ok(out)
}

/// A process qosd moved, back in the group it came from.
pub(super) fn moved(
    root: &Root,
    dry: Option<&mut Dry>,
    resource: &Resource,
    pid: &i32,
    start_time: &u64,
    back_to: &Path,
) -> Result<Vec<Change>> {
    let mut out = Vec::new();
    if !proc::same_process(root, *pid, *start_time) {
        return Ok(out);
    }
    if let Some(d) = dry {
        d.moved_back(*pid, back_to.parent().unwrap_or(back_to));
    } else {
        match write_file(back_to, &format!("{pid}\n"), false) {
            Ok(()) => {}
            // Exited between the check and the write.
            Err(Error::Io { ref source, .. }) if source.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => return Err(e),
        }
    }
    out.push(Change::new(
        *resource,
        format!("pid {pid} cgroup"),
        "qosd group",
        root.show(back_to.parent().unwrap_or(back_to)),
    ));
    Ok(out)
}

/// A controller qosd enabled, disabled again unless others use it now.
pub(super) fn enabled_controller(
    root: &Root,
    dry: Option<&Dry>,
    resource: &Resource,
    path: &Path,
    controller: &str,
) -> Result<Vec<Change>> {
    let mut out = Vec::new();
    let now = dry.map_or_else(|| read_file(path), |d| d.read(path));
    let now = now.unwrap_or_default();
    if !now.split_whitespace().any(|c| c == controller) {
        return Ok(out);
    }
    if dry.is_none() {
        match write_file(path, &format!("-{controller}"), false) {
            Ok(()) => {}
            // Groups qosd did not make use it now: disabling it
            // would take it from them, so it stays, and says so.
            Err(Error::Io { ref source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {
                tracing::warn!(
                    "{controller} stays enabled in {}: other groups use it now",
                    root.show(path)
                );
                return Ok(out);
            }
            Err(e) => return Err(e),
        }
    }
    out.push(Change::new(
        *resource,
        root.show(path),
        now.trim(),
        format!("-{controller}"),
    ));
    Ok(out)
}

/// The command that puts a setting back, run.
pub(super) fn command(
    _root: &Root,
    dry_run: bool,
    resource: &Resource,
    argv: &[String],
) -> Result<Vec<Change>> {
    let mut out = Vec::new();
    if !dry_run {
        crate::tool::run(argv)?;
    }
    out.push(Change::new(*resource, argv.join(" "), "", "run"));
    Ok(out)
}

/// The `ip`/`tc` command that removes a network object, run in its namespace.
pub(super) fn net(
    _root: &Root,
    dry_run: bool,
    knob: &str,
    netns: &NetnsRef,
    argv: &[String],
) -> Result<Vec<Change>> {
    let mut out = Vec::new();
    let Some(full) = netns.command(argv) else {
        tracing::info!(
            "network namespace {} is gone: `{}` needs no restore",
            netns.path.display(),
            argv.join(" ")
        );
        return Ok(out);
    };
    if let ["tc", "qdisc", "del", "dev", dev, "clsact"] = argv
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        match crate::netns::clsact_in_use(netns, dev) {
            Ok(false) => {}
            Ok(true) => {
                tracing::info!("the clsact qdisc of {dev} still holds filters: kept");
                return Ok(out);
            }
            Err(e) if crate::netns::already_gone(&e) => return Ok(out),
            Err(e) => return Err(e),
        }
    }
    if !dry_run {
        match crate::tool::run(&full) {
            Err(e) if crate::netns::already_gone(&e) => return Ok(out),
            r => r?,
        }
    }
    out.push(Change::knob(knob_name(knob), full.join(" "), "", "run"));
    Ok(out)
}

/// The static name of a knob recorded in a state file (`Change` holds
/// `&'static str`); an unknown one (a newer qosd's) shows as `net`.
fn knob_name(k: &str) -> &'static str {
    match k {
        "hedge" => "hedge",
        _ => "net",
    }
}

/// Removes a cgroup or resctrl group qosd made. On the kernel's filesystems
/// rmdir removes the control files with it; on a plain directory (a fake
/// tree in tests) the files qosd wrote there are removed first, as the
/// kernel would.
fn remove_group_dir(path: &Path) -> Result<()> {
    match std::fs::remove_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        // A cgroup still holding processes qosd did not move there itself
        // (children the app forked later): they go to the parent group,
        // then the group can go.
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) && path.join("cgroup.procs").exists() => {
            empty_busy_cgroup(path)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) && !proc::on_kernel_fs(path) => {
            std::fs::remove_dir_all(path).map_err(|e| Error::io("removing", path, e))
        }
        Err(e) => Err(Error::io("removing", path, e)),
    }
}

/// How often, and how far apart, removing a busy cgroup is tried again: a
/// process that is exiting still holds its group until the kernel has
/// reaped it, though `cgroup.procs` no longer lists it.
const RMDIR_TRIES: u32 = 50;
const RMDIR_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// Moves what is left in a cgroup to its parent and removes it, trying
/// again for about a second while the kernel still counts exiting tasks.
fn empty_busy_cgroup(path: &Path) -> Result<()> {
    let parent = path.parent().unwrap_or(path).join("cgroup.procs");
    let mut last = None;
    for _ in 0..RMDIR_TRIES {
        let procs = read_file(&path.join("cgroup.procs"))?;
        for pid in procs.lines().map(str::trim).filter(|l| !l.is_empty()) {
            match write_file(&parent, &format!("{pid}\n"), false) {
                Err(Error::Io { ref source, .. }) if source.raw_os_error() == Some(libc::ESRCH) => {
                }
                r => r?,
            }
        }
        match std::fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = Some(e),
            Err(e) => return Err(Error::io("removing", path, e)),
        }
        std::thread::sleep(RMDIR_PAUSE);
    }
    let e = last.unwrap_or_else(|| std::io::Error::from_raw_os_error(libc::EBUSY));
    tracing::warn!(
        "{}: still busy after {} tries {} ms apart: left in place",
        path.display(),
        RMDIR_TRIES,
        RMDIR_PAUSE.as_millis()
    );
    Err(Error::io("removing (still busy after 1 s)", path, e))
}
