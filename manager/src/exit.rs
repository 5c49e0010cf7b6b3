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

/// `Err(usage!("..."))`: a usage error with a formatted message.
#[macro_export]
macro_rules! usage {
    ($($arg:tt)*) => {
        anyhow::Error::new($crate::exit::UsageError(format!($($arg)*)))
    };
}

/// Prints the error chain on one line and maps it to an exit code.
pub fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
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
    let _ = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
