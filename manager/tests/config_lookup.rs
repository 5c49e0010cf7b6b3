//! The default-config lookup as a user meets it: `qosd check` (and
//! `qosd run`) without --config take ./config.yaml, else
//! /etc/qosd/config.yaml; a --config that does not exist is an error
//! naming it, never a silent fallback.

mod support;

use std::process::Command;

use support::QOSD;

#[test]
fn check_without_files_takes_config_yaml_of_the_working_directory() {
    let d = tempfile::tempdir().unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::copy(repo.join("config.yaml"), d.path().join("config.yaml")).unwrap();
    std::fs::create_dir(d.path().join("policies")).unwrap();
    std::fs::copy(
        repo.join("policies/parties.yaml"),
        d.path().join("policies/parties.yaml"),
    )
    .unwrap();
    let out = Command::new(QOSD)
        .arg("check")
        .current_dir(d.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok: config.yaml: config:"));
}

#[test]
fn run_with_a_missing_config_exits_2_and_names_it() {
    let out = Command::new(QOSD)
        .args(["run", "--config", "/nonexistent/qosd-config.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--config /nonexistent/qosd-config.yaml: no such file"),
        "{err}"
    );
}

/// Where neither place has a config, the error lists both. On a machine
/// where `make install` put /etc/qosd/config.yaml, that one is found
/// instead, and that is what is checked.
#[test]
fn without_any_config_the_error_says_where_it_looked() {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(QOSD)
        .arg("check")
        .current_dir(d.path())
        .output()
        .unwrap();
    if std::path::Path::new("/etc/qosd/config.yaml").is_file() {
        assert!(String::from_utf8_lossy(&out.stdout).contains("/etc/qosd/config.yaml"));
        return;
    }
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let cwd = d.path().canonicalize().unwrap();
    assert!(
        err.contains(&format!("config.yaml (= {}/config.yaml)", cwd.display())),
        "{err}"
    );
    assert!(err.contains("/etc/qosd/config.yaml"), "{err}");
}
