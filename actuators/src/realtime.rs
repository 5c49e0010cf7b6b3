//! The realtime value of the CPU priority knob ([`PRIORITY_REALTIME`],
//! docs/sharing-rt.md): every thread of a latency-critical app at
//! `SCHED_FIFO` 1, in its `qosd-<app>` cpu group, which first gets an RT
//! budget where the kernel has RT group scheduling (`cpu.rt_runtime_us`:
//! the app's RT time per period per CPU, the rest of the period left to
//! the fair class). Threads and children the app makes later inherit the
//! policy (no `SCHED_RESET_ON_FORK`: a connection thread is real-time from
//! its first request, not from the next reassert). Each thread's policy,
//! priority and nice are journalled before the change; threads that were
//! real-time before qosd are left alone. Whatever puts the app back
//! (normal, restore, `qosd restore` after a SIGKILL) lowers what inherited
//! the policy too: an unlisted thread of a journalled process, and any
//! task left in the group at exactly qosd's policy ([`lower_in_group`]),
//! to `SCHED_OTHER` at the nice it has: a lowering, which the trust rule
//! (a restore never raises a thread) allows.
//!
//! [`PRIORITY_REALTIME`]: qosd_core::knobs::PRIORITY_REALTIME

use std::path::Path;

use qosd_core::Resource;

use crate::error::{Error, Result};
use crate::journal::Entry;
use crate::root::{read_file, Root};
use crate::Ctx;

const R: Resource = Resource::CpuPriority;

/// The policy qosd gives the threads ([`crate::schedpolicy`] text).
/// Inherited by threads and children made later: measured, the fixture's
/// 8 keep-alive connections made 16 threads at the start of each run,
/// SCHED_OTHER for up to 350 ms (4 % of its requests at 1000 rps) until
/// the next reassert under reset-on-fork, and with a connection per
/// request every request ran on a new SCHED_OTHER thread
/// (docs/sharing-rt.md).
pub const POLICY: &str = "fifo:1";
/// The group's RT budget file (cgroup v1 `cpu`, `CONFIG_RT_GROUP_SCHED`).
pub const BUDGET_FILE: &str = "cpu.rt_runtime_us";
/// No longer read (the budget is `realtime.budget_us` in the daemon's
/// config, `--rt-budget-us` for `qosd set`): set, it makes realtime
/// unavailable with a reason naming both, rather than being ignored.
pub const BUDGET_ENV: &str = "QOSD_RT_BUDGET_US";
/// The budgets a group may have, µs per `cpu.rt_period_us` (1 s): the
/// kernel's bound is the period.
pub const BUDGET_RANGE_US: std::ops::RangeInclusive<u64> = 1..=1_000_000;
/// 90 % of each CPU per period. The budget is per CPU and the app's load
/// is not spread evenly over its CPUs: at 600 000 the fixture at 50 % of
/// its capacity (0.5 of each CPU on average) was throttled on one CPU at
/// times (an RT group past its budget stops until the next period), 16 µs
/// of run-queue wait per request and p99 1.29x alone, against 1 µs and
/// 1.11x with `chrt` (no group budget); at 900 000, 1 µs and below `chrt`
/// (docs/sharing-rt.md, measured quiet). The CPU-use gate, not the budget,
/// keeps the app far from spinning; the budget is the backstop that leaves
/// the fair class (the batch job, qosd, sshd) 100 ms of every second on
/// every CPU. One such app fits under the root's 950 000; a second is
/// refused by the kernel (the children's sum would exceed it) with a clear
/// error, rather than both sharing a smaller bound silently.
pub const DEFAULT_BUDGET_US: u64 = 900_000;
// Below the root's default 950 000, or no app could get it.
const _: () = assert!(DEFAULT_BUDGET_US < 950_000);

/// How realtime is applied on the knob's backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rt {
    /// RT group scheduling (v1 `cpu`): the group gets `budget_us` first.
    Budget { budget_us: u64 },
    /// No RT group scheduling: threads may be real-time in any group; the
    /// node-wide `sched_rt_runtime_us` is the only bound.
    Plain,
}

impl Rt {
    /// The caps text of an available realtime.
    pub fn describe(&self) -> String {
        match self {
            Rt::Budget { budget_us } => format!(
                "realtime: available ({POLICY} on every thread, group RT budget {budget_us} µs \
                 per period in {BUDGET_FILE})"
            ),
            Rt::Plain => format!(
                "realtime: available ({POLICY} on every thread; no RT group scheduling, \
                 bounded by the node's sched_rt_runtime_us)"
            ),
        }
    }
}

/// Whether `budget_us` is a budget a group may be given (the range only;
/// the parent's budget is [`parent_budget_us`]'s), or why not.
pub fn check_budget(budget_us: u64) -> std::result::Result<(), String> {
    if BUDGET_RANGE_US.contains(&budget_us) {
        Ok(())
    } else {
        Err(format!(
            "{budget_us} µs is not an RT budget in 1..=1000000 (µs of each 1 s period, per CPU)"
        ))
    }
}

/// The RT budget of the v1 `cpu` hierarchy's root group under `root` and
/// its file, where the kernel has RT group scheduling: the bound of the
/// sum of its children's budgets (the kernel refuses more: `EINVAL`).
/// `None` where it cannot be read, or is -1 (RT throttling off: no bound).
pub fn parent_budget_us(root: &Root) -> Option<(u64, std::path::PathBuf)> {
    let mount = crate::cgroup::cgroup1_with(root, "cpu", BUDGET_FILE).ok()?;
    let file = mount.join(BUDGET_FILE);
    let v: i64 = read_file(&file).ok()?.trim().parse().ok()?;
    u64::try_from(v).ok().map(|v| (v, file))
}

/// The budget a config asks for, unless `$QOSD_RT_BUDGET_US` (no longer
/// read) is set: an operator who set it expects it to count.
fn budget_us(configured: u64) -> std::result::Result<u64, String> {
    match std::env::var_os(BUDGET_ENV) {
        Some(v) => Err(format!(
            "${BUDGET_ENV}={v:?} is set but no longer read: the budget is realtime.budget_us \
             in the daemon's config, or --rt-budget-us for `qosd set` ({configured} µs \
             here); unset it"
        )),
        None => check_budget(configured).map(|()| configured),
    }
}

/// Whether the process has CAP_SYS_NICE (capability 23).
fn has_cap_sys_nice() -> bool {
    qosd_core::sys::effective_caps().is_some_and(|c| c & (1 << 23) != 0)
}

/// Whether the kernel has RT group scheduling: a v1 `cpu` hierarchy with
/// `cpu.rt_runtime_us`, or `CONFIG_RT_GROUP_SCHED=y` in its config.
fn rt_group_sched(root: &Root) -> bool {
    if crate::cgroup::cgroup1_with(root, "cpu", BUDGET_FILE).is_ok() {
        return true;
    }
    let release = read_file(&root.path("/proc/sys/kernel/osrelease")).unwrap_or_default();
    read_file(&root.path(format!("/boot/config-{}", release.trim())))
        .is_ok_and(|c| c.lines().any(|l| l == "CONFIG_RT_GROUP_SCHED=y"))
}

/// Whether realtime can be applied on the priority knob's backend, or why
/// not: `group` is its cpu hierarchy (cgroup v2?, mount), `None` for the
/// per-thread `SCHED_IDLE` backend. `budget_us_cfg`: the configured
/// budget ([`crate::Config::rt_budget_us`]).
pub fn probe(
    root: &Root,
    group: Option<(bool, &Path)>,
    budget_us_cfg: u64,
) -> std::result::Result<Rt, String> {
    if !has_cap_sys_nice() {
        return Err("no CAP_SYS_NICE: the kernel refuses SCHED_FIFO".into());
    }
    let group_sched = rt_group_sched(root);
    match group {
        Some((false, mount)) if mount.join(BUDGET_FILE).exists() => Ok(Rt::Budget {
            budget_us: budget_us(budget_us_cfg)?,
        }),
        Some((true, _)) if group_sched => Err(
            "cgroup v2 with RT group scheduling: the kernel has no per-group RT budget there \
             and refuses real-time threads in a non-root cpu group"
                .into(),
        ),
        None if group_sched => Err(
            "RT group scheduling without a cpu group for qosd: a thread in a group with no RT \
             budget cannot be made real-time"
                .into(),
        ),
        _ => Ok(Rt::Plain),
    }
}

/// Gives `group` its budget (before any real-time thread can be in it).
pub fn give_budget(ctx: &mut Ctx, rt: &Rt, group: &Path) -> Result<()> {
    let Rt::Budget { budget_us } = rt else {
        return Ok(());
    };
    let file = group.join(BUDGET_FILE);
    // The kernel frees a removed group's budget after an RCU grace period:
    // a budget written within ~100 ms of removing one (a restore, then a
    // set) is refused with EINVAL though the sum fits. Retried for 1 s.
    let einval = |e: &Error| matches!(e, Error::Io { source, .. } if source.raw_os_error() == Some(libc::EINVAL));
    let mut tries = 0;
    let mut write = || loop {
        match ctx.write(R, &file, &budget_us.to_string(), false) {
            Err(e) if einval(&e) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r,
        }
    };
    write().map_err(|e| {
        let parent = group.parent().map(|p| p.join(BUDGET_FILE));
        let parent = parent.and_then(|p| read_file(&p).ok()).unwrap_or_default();
        Error::Unavailable {
            resource: R,
            reason: format!(
                "realtime: the kernel refused an RT budget of {budget_us} µs ({e}); the \
                     groups' budgets may not exceed their parent's {} µs (realtime.budget_us \
                     in the daemon's config, --rt-budget-us for `qosd set`)",
                parent.trim()
            ),
        }
    })
}

/// Makes every thread of `pids` real-time (after [`give_budget`] and the
/// move into the group).
pub fn promote(ctx: &mut Ctx, pids: &[i32]) -> Result<()> {
    for &pid in pids {
        ctx.set_sched_policy(R, pid, POLICY).map_err(|e| match e {
            Error::Sys { op, tid, source } => Error::Unavailable {
                resource: R,
                reason: format!("realtime: {op} {POLICY} on pid {pid} thread {tid}: {source}"),
            },
            e => e,
        })?;
    }
    Ok(())
}

/// Puts every thread qosd made real-time in `pids` back to what was
/// journalled, then the group's budget back to 0 (the kernel refuses 0
/// while real-time tasks are in the group: EBUSY).
pub fn demote(ctx: &mut Ctx, group: Option<&Path>, pids: &[i32]) -> Result<()> {
    let ours = |e: &Entry| matches!(e, Entry::Sched { resource: R, pid, .. } if pids.contains(pid));
    // Only an app qosd made real-time (its main thread at qosd's policy):
    // an idle app's `SCHED_IDLE` entries stay for its next reassert.
    let rt_now = pids.iter().any(|&p| {
        ctx.sched_of(p)
            .is_ok_and(|t| crate::schedpolicy::policy_part(&t) == POLICY)
    });
    if rt_now && ctx.journal().entries().iter().any(ours) {
        ctx.undo_where(ours)?;
    }
    let Some(group) = group else {
        return Ok(());
    };
    if !ctx.dry_run {
        for c in lower_in_group(&ctx.root, group)? {
            ctx.noted(c);
        }
    }
    let file = group.join(BUDGET_FILE);
    match ctx.read(&file) {
        Ok(b) if b.trim() != "0" => ctx.write(R, &file, "0", false),
        _ => Ok(()),
    }
}

/// Lowers every task in the cpu `group` (v1 `tasks`, v2 `cgroup.threads`)
/// that is at exactly qosd's [`POLICY`] to `SCHED_OTHER`, its nice kept:
/// what inherited real time (a thread made later, a child process) and
/// is not otherwise put back. Run before the group's budget goes to 0
/// (the kernel refuses it while real-time tasks are in the group) and
/// before qosd removes the group (a task moved out would stay real-time).
/// Returns what it changed.
pub fn lower_in_group(root: &Root, group: &Path) -> Result<Vec<crate::Change>> {
    let mut out = Vec::new();
    // A fake tree's task ids are no threads of this machine.
    if !crate::proc::on_kernel_fs(group) {
        return Ok(out);
    }
    let list = ["tasks", "cgroup.threads"]
        .iter()
        .find_map(|f| read_file(&group.join(f)).ok())
        .unwrap_or_default();
    for tid in list.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        let Ok(now) = crate::schedpolicy::get(tid) else {
            continue;
        };
        if crate::schedpolicy::policy_part(&now) != POLICY {
            continue;
        }
        match crate::schedpolicy::set(tid, crate::schedpolicy::OTHER) {
            Ok(()) => out.push(crate::Change::new(
                R,
                format!("thread {tid} in {} (inherited)", root.show(group)),
                now,
                crate::schedpolicy::OTHER,
            )),
            Err(Error::Sys {
                source: nix::Error::ESRCH,
                ..
            }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_parses_and_is_realtime() {
        let (p, prio) = crate::schedpolicy::parse(POLICY).unwrap();
        assert_eq!(p, libc::SCHED_FIFO, "no reset-on-fork: children inherit");
        assert_eq!(prio, 1);
    }
}
