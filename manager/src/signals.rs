//! Every terminating signal (the list is the actuators' [`terminating`])
//! as a flag that loops poll, and, for the daemon, as a wake-up it can
//! await: the handler only stores the flag and writes the signal's number
//! to a pipe (both async-signal-safe). Installed before anything is
//! changed, so no signal finds the default action (death with the knobs
//! left in place) once qosd has started.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use anyhow::Context;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet};
pub use qosd_actuators::signals::{name, terminating};

static STOP: AtomicBool = AtomicBool::new(false);
/// The writing end of the daemon's wake-up pipe (-1: none).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

/// Set by the daemon: SIGHUP reloads its config instead of stopping it.
static HUP_RELOADS: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    if !(sig == libc::SIGHUP && HUP_RELOADS.load(Ordering::SeqCst)) {
        STOP.store(true, Ordering::SeqCst);
    }
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let b = sig as u8;
        // SAFETY: write(2) is async-signal-safe; a full pipe (EAGAIN) drops
        // the byte, and a signal is already waiting there.
        unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
    }
}

/// Routes every terminating signal to [`stop_requested`].
pub fn install() -> anyhow::Result<()> {
    let act = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in terminating() {
        // SAFETY: the handler only stores into atomics and calls write(2),
        // both async-signal-safe. Real-time signals have no `Signal`
        // variant, so the raw sigaction is used for every signal.
        let rc = unsafe { libc::sigaction(sig, &libc::sigaction::from(act), std::ptr::null_mut()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("catching {}", name(sig)));
        }
    }
    Ok(())
}

pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// The flag itself, for code that polls an `&AtomicBool` (the load
/// generator's run loop).
pub fn flag() -> &'static AtomicBool {
    &STOP
}

/// What the daemon does on a signal. This is the one place a signal is
/// given another meaning: SIGHUP reloads the daemon's config (once
/// [`reload_on_hup`] was called); every other signal stops it, which puts
/// every knob back first. Elsewhere (replays, `qosd set --hold`) SIGHUP
/// stops too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Stop,
    Reload,
}

pub fn action(sig: i32) -> Action {
    if sig == libc::SIGHUP && HUP_RELOADS.load(Ordering::SeqCst) {
        Action::Reload
    } else {
        Action::Stop
    }
}

/// From now on SIGHUP reloads (the daemon) instead of stopping.
pub fn reload_on_hup() {
    HUP_RELOADS.store(true, Ordering::SeqCst);
}

/// The daemon's signals: every terminating signal caught from
/// [`Signals::install`] on, read from the handler's pipe.
pub struct Signals {
    read: OwnedFd,
    _write: OwnedFd,
}

impl Signals {
    /// Installs the handlers with a wake-up pipe. Call before anything is
    /// changed (no runtime needed).
    pub fn install() -> anyhow::Result<Signals> {
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC)
                .context("making the signal pipe")?;
        WAKE_FD.store(write.as_raw_fd(), Ordering::SeqCst);
        install()?;
        Ok(Signals {
            read,
            _write: write,
        })
    }

    /// A signal that has arrived, without waiting.
    pub fn pending(&self) -> Option<i32> {
        let mut b = [0u8; 1];
        match nix::unistd::read(self.read.as_raw_fd(), &mut b) {
            Ok(1) => Some(b[0] as i32),
            _ => None,
        }
    }

    /// The same signals, awaitable (call inside a tokio runtime).
    pub fn watch(self) -> anyhow::Result<Watched> {
        // SAFETY: `self.read` is an OwnedFd moved into the AsyncFd: it stays
        // open and the same descriptor for the AsyncFd's whole life.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                self.read,
                tokio::io::Interest::READABLE,
            )
        }
        .map_err(|e| anyhow::Error::new(std::io::Error::from(e)))
        .context("watching the signal pipe")?;
        Ok(Watched {
            fd,
            _write: self._write,
        })
    }
}

/// [`Signals`] registered with the tokio runtime.
pub struct Watched {
    fd: tokio::io::unix::AsyncFd<OwnedFd>,
    _write: OwnedFd,
}

impl Watched {
    /// Waits for the next signal.
    pub async fn next(&self) -> anyhow::Result<i32> {
        loop {
            let mut g = self
                .fd
                .readable()
                .await
                .context("watching the signal pipe")?;
            let mut b = [0u8; 1];
            match nix::unistd::read(self.fd.get_ref().as_raw_fd(), &mut b) {
                Ok(1) => return Ok(b[0] as i32),
                _ => g.clear_ready(),
            }
        }
    }
}
