//! A thread's scheduling policy (`sched_getscheduler`/`sched_setscheduler`)
//! as a short text the journal and state file keep: `other`, `batch`,
//! `idle`, `fifo:PRIO`, `rr:PRIO`, with `+reset_on_fork` when the thread
//! has that flag, and ` nice:N` when the thread's nice value is not 0 (so
//! that a restore puts the nice back too). The CPU priority knob's last
//! backend puts a best-effort app's threads in `SCHED_IDLE` where the kernel
//! offers no cpu group; its realtime value makes them `fifo:1` (inherited by threads made later).

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

/// The policy part of a text (without its ` nice:N`).
pub fn policy_part(text: &str) -> &str {
    text.split_once(" nice:").map_or(text, |(p, _)| p)
}

/// `(policy | flags, priority, nice)` of a text; nice `None` when the text
/// names none (a setter leaves the nice value alone then).
pub fn parse_full(text: &str) -> Result<(libc::c_int, libc::c_int, Option<i32>)> {
    let (head, nice) = match text.split_once(" nice:") {
        Some((h, n)) => match n.parse::<i32>() {
            Ok(n) if (-20..=19).contains(&n) => (h, Some(n)),
            _ => {
                return Err(Error::Invalid(format!(
                    "scheduling policy {text:?}: nice must be -20..=19"
                )))
            }
        },
        None => (text, None),
    };
    let (policy, prio) = parse(head)?;
    Ok((policy, prio, nice))
}

/// `(policy | flags, priority)` of a policy text (no nice part).
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

/// True when setting `want` on a thread now at `now` would raise it: make
/// it real-time (unless it has that very policy already) or give it a
/// lower nice. A restore never does that: qosd leaves real-time threads
/// alone and keeps the nice it finds, so no journalled original needs it,
/// and a forged one must not get it.
pub fn raises(now: &str, want: &str) -> bool {
    let nice = |t: &str| parse_full(t).ok().and_then(|(_, _, n)| n).unwrap_or(0);
    let rt = is_realtime(want) && policy_part(now) != policy_part(want);
    rt || (want.contains(" nice:") && nice(want) < nice(now))
}

/// The nice value of thread `tid`.
fn nice_of(tid: i32) -> Result<i32> {
    nix::errno::Errno::clear();
    // SAFETY: a plain syscall on a thread id; -1 is a valid nice, so errno
    // tells a failure.
    let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
    if n == -1 && nix::errno::Errno::last_raw() != 0 {
        return Err(sys("getpriority", tid));
    }
    Ok(n)
}

/// The policy of thread `tid`, with its nice value when not 0.
pub fn get(tid: i32) -> Result<String> {
    let mut s = get_policy(tid)?;
    let nice = nice_of(tid)?;
    if nice != 0 {
        s += &format!(" nice:{nice}");
    }
    Ok(s)
}

/// The policy of thread `tid` (no nice part).
fn get_policy(tid: i32) -> Result<String> {
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

/// Sets the policy of thread `tid`, and its nice value when the text
/// names one (else the nice value is left alone).
pub fn set(tid: i32, text: &str) -> Result<()> {
    let (policy, prio, nice) = parse_full(text)?;
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: a syscall on a thread id with a valid `param`.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } < 0 {
        return Err(sys("sched_setscheduler", tid));
    }
    if let Some(n) = nice {
        // SAFETY: a plain syscall on a thread id.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, n) } < 0 {
            return Err(sys("setpriority", tid));
        }
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
        assert_eq!(parse_full("batch nice:5").unwrap().2, Some(5));
        assert_eq!(policy_part("batch nice:5"), "batch");
        for bad in ["other nice:20", "other nice:x", "fifo nice:1"] {
            assert!(parse_full(bad).is_err(), "{bad}");
        }
        assert!(raises("other", "fifo:1") && !raises("fifo:1 nice:3", "fifo:1"));
        assert!(raises("other nice:0", "other nice:-5") && !raises("idle nice:5", "other nice:5"));
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
        // The nice part is the test runner's (nice 19 under `heavy`).
        assert_eq!(policy_part(&now), IDLE);
        assert_eq!(before, after);
    }
}
