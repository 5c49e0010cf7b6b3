//! The error type at the crate boundary. Callers branch on it: invalid input
//! (exit 2 in the CLI) versus a knob that is missing versus an I/O failure.

use std::path::PathBuf;

use qosd_core::Resource;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller asked for something impossible (bad CPU list, too many ways,
    /// unknown pid). Nothing was changed.
    #[error("{0}")]
    Invalid(String),
    /// The process does not exist (or exited while being changed).
    #[error("no process with pid {0}")]
    NoSuchPid(i32),
    /// The knob does not exist on this machine; the reason says why.
    #[error("{resource}: unavailable: {reason}")]
    Unavailable { resource: Resource, reason: String },
    /// Reading or writing a file failed; the path is named.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A syscall on a thread failed.
    #[error("{op} on thread {tid}: {source}")]
    Sys {
        op: &'static str,
        tid: i32,
        #[source]
        source: nix::Error,
    },
    /// An external tool (pqos, cpupower) failed or could not be run.
    #[error("running `{command}`: {message}")]
    Command { command: String, message: String },
    /// The state file is malformed or locked by another qosd.
    #[error("state file {}: {message}", path.display())]
    State { path: PathBuf, message: String },
    /// A change failed and undoing the part already made failed too.
    #[error("{error}; rolling back also failed: {rollback}")]
    RollbackFailed { error: Box<Error>, rollback: String },
}

impl From<qosd_core::cpulist::CpuListError> for Error {
    fn from(e: qosd_core::cpulist::CpuListError) -> Self {
        Error::Invalid(e.to_string())
    }
}

impl From<qosd_core::sys::SysError> for Error {
    fn from(e: qosd_core::sys::SysError) -> Self {
        match e {
            qosd_core::sys::SysError::Io { op, path, source } => Error::Io { op, path, source },
            e @ qosd_core::sys::SysError::Parse { .. } => Error::Invalid(e.to_string()),
        }
    }
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// True when the error is the caller's input (bad pid, bad list, too
    /// many ways): the CLI exits 2 for these. A knob the machine lacks is
    /// not: that is a runtime failure (exit 1).
    pub fn is_invalid_input(&self) -> bool {
        match self {
            Error::Invalid(_) | Error::NoSuchPid(_) => true,
            Error::RollbackFailed { error, .. } => error.is_invalid_input(),
            _ => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
