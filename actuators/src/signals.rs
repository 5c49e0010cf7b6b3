//! Waiting for SIGINT/SIGTERM/SIGHUP without a signal handler: the signals
//! are blocked and taken with sigwait, so a signal that arrives while a
//! change is being made waits until the change is complete and can then be
//! restored in order.

use nix::sys::signal::{SigSet, Signal};

use crate::error::{Error, Result};

/// Blocks the termination signals in the calling thread (and threads it
/// starts afterwards). Call before making changes.
pub fn block_termination() -> Result<SigSet> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGHUP);
    set.thread_block().map_err(|source| Error::Sys {
        op: "pthread_sigmask",
        tid: 0,
        source,
    })?;
    Ok(set)
}

/// Waits for one of the signals of `set` (from [`block_termination`]).
pub fn wait(set: &SigSet) -> Result<Signal> {
    set.wait().map_err(|source| Error::Sys {
        op: "sigwait",
        tid: 0,
        source,
    })
}
