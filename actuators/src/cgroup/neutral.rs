//! What a `qosd-<app>` group's knob files read when they limit nothing:
//! the one table [`super::limits_nothing`] and a dry run's reads of a
//! group it made ([`crate::ctx::dry::Dry`]) share (apart from `cgroup.rs`,
//! so that `ctx/dry.rs` needs nothing that needs the journal).

use std::path::Path;

/// The files qosd's knobs write in a `qosd-<app>` group, each with the
/// value (first word) at which it limits or favours nothing: what the
/// kernel makes a group with. A knob that lets go of an app (a quota
/// lifted to every CPU, the priority back to normal) puts its own file
/// back to this value first, then asks [`super::limits_nothing`].
pub(crate) const NEUTRAL: &[(&str, &str)] = &[
    ("cpu.cfs_quota_us", "-1"),
    ("cpu.max", "max"),
    ("cpu.idle", "0"),
    ("cpu.shares", "1024"),
    ("cpu.weight", "100"),
    ("cpu.rt_runtime_us", "0"),
    ("cpuset.cpus", ""),
];

/// What a knob file of [`NEUTRAL`] reads in a group just made (the first
/// word where the kernel writes more): a dry run's reads of a group it
/// made ([`crate::ctx::Dry`]).
pub(crate) fn fresh_value(file: &Path) -> Option<&'static str> {
    let name = file.file_name()?.to_str()?;
    NEUTRAL.iter().find(|(f, _)| *f == name).map(|(_, v)| *v)
}
