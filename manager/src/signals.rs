//! SIGINT/SIGTERM as a flag that loops poll: the handler only stores.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{self, SigHandler, Signal};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Routes SIGINT and SIGTERM to [`stop_requested`].
pub fn install() -> anyhow::Result<()> {
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores into an atomic, which is
        // async-signal-safe.
        unsafe { signal::signal(sig, SigHandler::Handler(on_signal)) }?;
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
