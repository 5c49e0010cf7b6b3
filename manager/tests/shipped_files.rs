//! Every policy and config file shipped in the repository parses and
//! validates (a typo in a shipped file fails here, not on a user's node).

mod support;

use std::path::{Path, PathBuf};

use support::repo;

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_shipped_policy_validates_and_builds() {
    let files = yaml_files(&repo().join("policies"));
    assert!(
        files.iter().any(|p| p.ends_with("parties.yaml")),
        "{files:?}"
    );
    for f in files {
        let policy = qosd_manager::policy::load(&f, 0).unwrap_or_else(|e| panic!("{e}"));
        assert!(!policy.name().is_empty());
    }
}
