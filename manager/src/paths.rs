//! Where qosd looks for its config when `--config` is not given: the
//! source tree first (`./config.yaml`, so `cargo run -- run` works in a
//! checkout), then the installed copy (`/etc/qosd/config.yaml`, put there
//! by `make install`). Policies are found relative to the config file.

use std::path::{Path, PathBuf};

/// Where `make install` puts the config and `policies/` (SYSCONFDIR/qosd).
pub const SYSTEM_CONFIG_DIR: &str = "/etc/qosd";
/// The installed default config.
pub const SYSTEM_CONFIG: &str = "/etc/qosd/config.yaml";
/// The config of a source checkout, relative to the working directory.
pub const LOCAL_CONFIG: &str = "config.yaml";

/// The places the default config is looked for, in order.
pub fn config_candidates() -> Vec<PathBuf> {
    vec![PathBuf::from(LOCAL_CONFIG), PathBuf::from(SYSTEM_CONFIG)]
}

/// `explicit` if given (it must then exist: a typo in `--config` is not
/// silently replaced by another file), else the first candidate that is a
/// file. The error is a usage error (exit 2) that lists every place looked.
pub fn resolve_config(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    match explicit {
        Some(p) if p.is_file() => Ok(p.to_owned()),
        Some(p) => Err(match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => {
                crate::usage!("--config {}: a directory, not a config file", p.display())
            }
            Ok(_) => crate::usage!("--config {}: not a regular file", p.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                crate::usage!("--config {}: no such file", p.display())
            }
            Err(e) => crate::usage!("--config {}: {e}", p.display()),
        }),
        None => find_config_in(&config_candidates()),
    }
}

/// The first of `candidates` that is a file; the error names each one
/// (relative ones also as absolute, since the working directory of a
/// service is rarely what its operator expects).
pub fn find_config_in(candidates: &[PathBuf]) -> anyhow::Result<PathBuf> {
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        tracing::debug!("using config {}", found.display());
        return Ok(found.clone());
    }
    let looked: Vec<String> = candidates.iter().map(|p| describe(p)).collect();
    Err(crate::usage!(
        "no config file: --config not given and none found (looked in {}); \
         pass --config FILE, or `make install` to put the default at {SYSTEM_CONFIG}",
        looked.join(", ")
    ))
}

fn describe(p: &Path) -> String {
    if p.is_absolute() {
        return p.display().to_string();
    }
    match std::env::current_dir() {
        Ok(cwd) => format!("{} (= {})", p.display(), cwd.join(p).display()),
        Err(_) => p.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_existing_candidate_wins() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a.yaml");
        let b = d.path().join("b.yaml");
        std::fs::write(&b, "apps: []\n").unwrap();
        assert_eq!(find_config_in(&[a.clone(), b.clone()]).unwrap(), b);
        std::fs::write(&a, "apps: []\n").unwrap();
        assert_eq!(find_config_in(&[a.clone(), b]).unwrap(), a);
    }

    #[test]
    fn none_found_names_every_place_and_is_a_usage_error() {
        let d = tempfile::tempdir().unwrap();
        let abs = d.path().join("etc/qosd/config.yaml");
        let e = find_config_in(&[PathBuf::from("no-such-qosd.yaml"), abs.clone()]).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("no-such-qosd.yaml (= /"), "{msg}");
        assert!(msg.contains(&abs.display().to_string()), "{msg}");
        assert!(msg.contains("--config"), "{msg}");
        assert!(e.chain().any(|c| c.is::<crate::exit::UsageError>()));
    }

    #[test]
    fn a_directory_is_not_a_config() {
        let d = tempfile::tempdir().unwrap();
        assert!(find_config_in(&[d.path().to_owned()]).is_err());
    }

    #[test]
    fn explicit_missing_config_is_an_error_not_a_fallback() {
        let e = resolve_config(Some(Path::new("/nonexistent/qosd.yaml"))).unwrap_err();
        assert!(format!("{e}").contains("/nonexistent/qosd.yaml"));
    }

    #[test]
    fn candidates_are_source_tree_then_etc() {
        assert_eq!(
            config_candidates(),
            vec![
                PathBuf::from("config.yaml"),
                PathBuf::from("/etc/qosd/config.yaml")
            ]
        );
    }
}
