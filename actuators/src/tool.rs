//! Running the external tools some backends use (`pqos`, `cpupower`, `ip`, `tc`),
//! found on PATH, with their output captured for error messages.

use std::process::Command;

use crate::error::{Error, Result};

/// Runs `argv` and fails with its stderr when it exits non-zero.
pub fn run(argv: &[String]) -> Result<()> {
    output(argv).map(drop)
}

/// Runs `argv`, returns its stdout, and fails with its stderr when it exits
/// non-zero.
pub fn output(argv: &[String]) -> Result<String> {
    let (prog, args) = argv.split_first().ok_or_else(|| Error::Command {
        command: String::new(),
        message: "empty command".into(),
    })?;
    let command = argv.join(" ");
    let out = Command::new(prog)
        .args(args)
        .output()
        .map_err(|e| Error::Command {
            command: command.clone(),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let msg = err.trim().lines().last().unwrap_or("").to_owned();
        return Err(Error::Command {
            command,
            message: format!("{}: {msg}", out.status),
        });
    }
    tracing::debug!("ran {command}");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The full path of `prog` on PATH, if any.
pub fn which(prog: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}
