//! A thread's scheduling policy (`sched_getscheduler`/`sched_setscheduler`)
//! as a short text the journal and state file keep: `other`, `batch`,
//! `idle`, `fifo:PRIO`, `rr:PRIO`, with `+reset_on_fork` when the thread
//! has that flag. The CPU priority knob's last backend puts a best-effort
//! app's threads in `SCHED_IDLE` where the kernel offers no cpu group.

use crate::error::{Error, Result};

/// `SCHED_IDLE`: the thread runs only when nothing else of the fair class
/// wants the CPU.
pub const IDLE: &str = "idle";
/// `SCHED_OTHER`: the default policy.
pub const OTHER: &str = "other";

/// The flag `sched_getscheduler` ORs into the policy of a thread whose
/// children start at the default policy.
const RESET_ON_FORK: libc::c_int = 0x4000_0000;

fn name_of(policy: libc::c_int) -> Option<&'static str> {
    Some(match policy {
        libc::SCHED_OTHER => OTHER,
        libc::SCHED_BATCH => "batch",
        libc::SCHED_IDLE => IDLE,
        libc::SCHED_FIFO => "fifo",
        libc::SCHED_RR => "rr",
        _ => return None,
    })
}

/// The policy text of `(policy | flags, priority)`.
fn format(policy: libc::c_int, prio: libc::c_int) -> Result<String> {
    let base = policy & !RESET_ON_FORK;
    let name =
        name_of(base).ok_or_else(|| Error::Invalid(format!("unknown scheduling policy {base}")))?;
    let mut s = name.to_owned();
    if base == libc::SCHED_FIFO || base == libc::SCHED_RR {
        s += &format!(":{prio}");
    }
    if policy & RESET_ON_FORK != 0 {
        s += "+reset_on_fork";
    }
    Ok(s)
}

/// `(policy | flags, priority)` of a policy text.
pub fn parse(text: &str) -> Result<(libc::c_int, libc::c_int)> {
    let bad = || {
        Error::Invalid(format!("scheduling policy {text:?}: expected other, batch, idle, fifo:N or rr:N (+reset_on_fork)"))
    };
    let (head, flags) = match text.strip_suffix("+reset_on_fork") {
        Some(h) => (h, RESET_ON_FORK),
        None => (text, 0),
    };
    let (name, prio) = match head.split_once(':') {
        Some((n, p)) => (n, p.parse::<libc::c_int>().map_err(|_| bad())?),
        None => (head, 0),
    };
    let policy = [
        libc::SCHED_OTHER,
        libc::SCHED_BATCH,
        libc::SCHED_IDLE,
        libc::SCHED_FIFO,
        libc::SCHED_RR,
    ]
    .into_iter()
    .find(|&p| name_of(p) == Some(name))
    .ok_or_else(bad)?;
    let realtime = policy == libc::SCHED_FIFO || policy == libc::SCHED_RR;
    if realtime != head.contains(':') || !(0..=99).contains(&prio) {
        return Err(bad());
    }
    Ok((policy | flags, prio))
}

/// True for `fifo`/`rr`: qosd never demotes a real-time thread, and a
/// state file may not make one.
pub fn is_realtime(text: &str) -> bool {
    text.starts_with("fifo") || text.starts_with("rr")
}

fn sys(op: &'static str, tid: i32) -> Error {
    Error::Sys {
        op,
        tid,
        source: nix::Error::last(),
    }
}

/// The policy of thread `tid`.
pub fn get(tid: i32) -> Result<String> {
    // SAFETY: plain syscalls on a thread id; `param` is a valid out pointer.
    let policy = unsafe { libc::sched_getscheduler(tid) };
    if policy < 0 {
        return Err(sys("sched_getscheduler", tid));
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as above.
    if unsafe { libc::sched_getparam(tid, &mut param) } < 0 {
        return Err(sys("sched_getparam", tid));
    }
    format(policy, param.sched_priority)
}

/// Sets the policy of thread `tid` (the nice value is left alone).
pub fn set(tid: i32, text: &str) -> Result<()> {
    let (policy, prio) = parse(text)?;
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: a syscall on a thread id with a valid `param`.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } < 0 {
        return Err(sys("sched_setscheduler", tid));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_round_trip() {
        for t in [
            "other",
            "batch",
            "idle",
            "fifo:10",
            "rr:99",
            "idle+reset_on_fork",
        ] {
            let (p, prio) = parse(t).unwrap();
            assert_eq!(format(p, prio).unwrap(), t);
        }
        for bad in ["", "fifo", "other:3", "rr:100", "deadline", "idle+x"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(is_realtime("fifo:1") && !is_realtime("idle"));
    }

    #[test]
    fn own_thread_reads_back_what_was_set() {
        // A thread of our own: set idle, read it back, put it back.
        let h = std::thread::spawn(|| {
            // SAFETY: gettid has no arguments.
            let tid = unsafe { libc::gettid() };
            let before = get(tid).unwrap();
            set(tid, IDLE).unwrap();
            let now = get(tid).unwrap();
            set(tid, &before).unwrap();
            (before, now, get(tid).unwrap())
        });
        let (before, now, after) = h.join().unwrap();
        assert_eq!(now, IDLE);
        assert_eq!(before, after);
    }
}
