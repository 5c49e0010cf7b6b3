//! Exit codes and error reporting shared by every subcommand.
//!
//! A subcommand returns `anyhow::Result<()>`. Errors that are the user's
//! (bad arguments, invalid files, a pid that does not exist) are wrapped in
//! [`UsageError`] and exit 2; anything else is a runtime failure and exits 1.

use std::process::ExitCode;

pub const RUNTIME: u8 = 1;
pub const USAGE: u8 = 2;

/// An error caused by the user's input: exit code 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Maps a library error to the CLI's exit codes: the user's input is a
/// usage error (exit 2), the rest a runtime failure (exit 1).
pub fn to_anyhow(e: qosd_actuators::Error) -> anyhow::Error {
    if e.is_invalid_input() {
        crate::usage!("{e}")
    } else {
        anyhow::Error::new(e)
    }
}

/// `Err(usage!("..."))`: a usage error with a formatted message.
#[macro_export]
macro_rules! usage {
    ($($arg:tt)*) => {
        anyhow::Error::new($crate::exit::UsageError(format!($($arg)*)))
    };
}

/// `outln!(...)?`: `println!` that hands back a failed write (stdout closed
/// by `| head`) as an error instead of panicking, so the command stops
/// through its normal path (knobs put back) and [`report`] ends it quietly.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err($crate::exit::stdout_error)
    }};
}

/// `out!(...)?`: `print!` as [`outln!`] does it.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut o = std::io::stdout().lock();
        write!(o, $($arg)*)
            .and_then(|()| o.flush())
            .map_err($crate::exit::stdout_error)
    }};
}

/// Standard output was closed by its reader (`qosd ... | head`).
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// A failed write to stdout: [`StdoutClosed`] when the reader has gone
/// (a broken pipe), else the I/O error.
pub fn stdout_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        anyhow::Error::new(StdoutClosed)
    } else {
        anyhow::Error::new(e).context("writing to standard output")
    }
}

/// Whether `e` comes from writing to a closed stdout: [`StdoutClosed`], or
/// a broken pipe from a command's own writer while stdout's reader is gone
/// (a broken pipe elsewhere, a socket or a child's stdin, is an error).
fn stdout_closed(e: &anyhow::Error) -> bool {
    let broken = |c: &(dyn std::error::Error + 'static)| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    };
    e.chain().any(|c| c.is::<StdoutClosed>()) || (e.chain().any(broken) && stdout_reader_gone())
}

/// True when stdout is a pipe whose reading end is closed (poll reports
/// POLLERR on the writing end).
fn stdout_reader_gone() -> bool {
    let mut p = libc::pollfd {
        fd: libc::STDOUT_FILENO,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout; poll only reads fd 1's state.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & libc::POLLERR != 0
}

/// Ends the process as a Unix tool does when its reader goes away: killed
/// by SIGPIPE, silently (the shell sees 128 + 13). Called after the
/// command returned, so everything it held has been put back.
pub fn die_of_sigpipe() -> ExitCode {
    // SAFETY: restoring the default disposition of SIGPIPE (Rust's runtime
    // ignores it) and raising it on this thread; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    ExitCode::from(128 + libc::SIGPIPE as u8)
}

/// Prints the error chain on one line and maps it to an exit code; a
/// closed stdout ends the process quietly (see [`die_of_sigpipe`]).
pub fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if stdout_closed(&e) => die_of_sigpipe(),
        Err(e) => {
            eprintln!("qosd: error: {e:#}");
            let usage = e.chain().any(|c| c.is::<UsageError>());
            ExitCode::from(if usage { USAGE } else { RUNTIME })
        }
    }
}

pub fn init_logging(filter: Option<&str>) {
    use tracing_subscriber::EnvFilter;
    let filter = filter
        .map(str::to_owned)
        .or_else(|| std::env::var("QOSD_LOG").ok())
        .unwrap_or_else(|| "warn".to_owned());
    // Colour only on a terminal: a log written to a file (or the journal)
    // gets no escape codes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
