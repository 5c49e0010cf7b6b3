//! The signals that end qosd, and waiting for them without a handler: the
//! signals are blocked and taken with sigwait, so a signal that arrives
//! while a change is being made waits until the change is complete and can
//! then be restored in order. The list is shared with the daemon's
//! handlers (manager `signals`), so both catch the same set.

use crate::error::{Error, Result};

/// Every signal whose default action ends the process and that can be
/// caught: the named ones and the real-time ones. Left out: the
/// synchronous faults (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS,
/// SIGABRT: a fault in qosd itself, where running more code is unsafe;
/// a Rust panic restores through its own path) and SIGPIPE (Rust's
/// runtime ignores it: a write to a closed pipe fails with EPIPE instead).
pub fn terminating() -> Vec<i32> {
    let mut v = vec![
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGTERM,
        libc::SIGSTKFLT,
        libc::SIGXCPU,
        libc::SIGXFSZ,
        libc::SIGVTALRM,
        libc::SIGPROF,
        libc::SIGIO,
        libc::SIGPWR,
    ];
    v.extend(libc::SIGRTMIN()..=libc::SIGRTMAX());
    v
}

/// `SIGTERM`, `SIGRTMIN+3`, or the number for anything else.
pub fn name(sig: i32) -> String {
    if (libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&sig) {
        return format!("SIGRTMIN+{}", sig - libc::SIGRTMIN());
    }
    nix::sys::signal::Signal::try_from(sig)
        .map_or_else(|_| format!("signal {sig}"), |s| s.to_string())
}

fn sys(op: &'static str, rc: libc::c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Sys {
            op,
            tid: 0,
            source: nix::Error::from_raw(rc),
        })
    }
}

/// The termination signals, blocked in the thread that blocked them.
pub struct Blocked(libc::sigset_t);

/// Blocks every [`terminating`] signal in the calling thread (and threads
/// it starts afterwards). Call before making changes.
pub fn block_termination() -> Result<Blocked> {
    // SAFETY: sigemptyset/sigaddset fill a set we own; pthread_sigmask
    // reads it and changes only this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in terminating() {
            libc::sigaddset(&mut set, s);
        }
        sys(
            "pthread_sigmask",
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()),
        )?;
        Ok(Blocked(set))
    }
}

impl Blocked {
    /// Waits for one of the blocked signals; returns its number.
    pub fn wait(&self) -> Result<i32> {
        let mut sig: libc::c_int = 0;
        // SAFETY: the set is initialised; sigwait writes one int.
        sys("sigwait", unsafe { libc::sigwait(&self.0, &mut sig) })?;
        Ok(sig)
    }

    /// Waits at most `timeout` for one of the blocked signals: `None` when
    /// none came (a loop that must also do timed work, e.g. `qosd net`).
    pub fn wait_timeout(&self, timeout: std::time::Duration) -> Result<Option<i32>> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
        };
        // SAFETY: the set and the timespec are initialised; a null info
        // pointer is allowed.
        let rc = unsafe { libc::sigtimedwait(&self.0, std::ptr::null_mut(), &ts) };
        if rc >= 0 {
            return Ok(Some(rc));
        }
        match nix::Error::last() {
            nix::Error::EAGAIN | nix::Error::EINTR => Ok(None),
            e => Err(Error::Sys {
                op: "sigtimedwait",
                tid: 0,
                source: e,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_holds_hup_usr1_and_the_real_time_signals_but_no_fault() {
        let t = terminating();
        for s in [libc::SIGHUP, libc::SIGUSR1, libc::SIGTERM, libc::SIGRTMAX()] {
            assert!(t.contains(&s), "{}", name(s));
        }
        for s in [libc::SIGSEGV, libc::SIGKILL, libc::SIGSTOP, libc::SIGPIPE] {
            assert!(!t.contains(&s), "{}", name(s));
        }
        assert_eq!(name(libc::SIGHUP), "SIGHUP");
        assert_eq!(name(libc::SIGRTMIN() + 2), "SIGRTMIN+2");
    }
}
