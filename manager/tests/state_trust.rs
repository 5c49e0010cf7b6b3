//! Issue 15, item 6: the state file root replays. A symlink planted at its
//! temp name is not written through, a forged file cannot make restore
//! remove a directory qosd did not create, and a file another user could
//! have written is refused, naming the file and why. Real `qosd set` and
//! `qosd restore` runs on a real process.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use support::*;

fn set_cores(state: &Path, pid: u32) -> std::process::Output {
    qosd(&[
        "set",
        "--state-file",
        state.to_str().unwrap(),
        "cores",
        "--pid",
        &pid.to_string(),
        "--cpus",
        "0",
        "--backend",
        "affinity",
    ])
}

fn restore(state: &Path) -> std::process::Output {
    qosd(&["restore", "--state-file", state.to_str().unwrap()])
}

#[test]
fn a_symlink_at_the_temp_name_is_not_followed() {
    let d = tempfile::tempdir().unwrap();
    let victim = d.path().join("victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    let state = d.path().join("s.json");
    std::os::unix::fs::symlink(&victim, d.path().join("s.json.tmp")).unwrap();
    let app = Killed::sleeper(60);
    let before = cpus_allowed(app.pid());
    let out = set_cores(&state, app.pid());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    let m = std::fs::symlink_metadata(&state).unwrap();
    assert!(m.is_file(), "the state file is a plain file");
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
    // A link at the lock's name is not opened either.
    let out = restore(&state);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(cpus_allowed(app.pid()), before);
    let lock = d.path().join("s.lock");
    let _ = std::fs::remove_file(&lock);
    std::os::unix::fs::symlink(&victim, &lock).unwrap();
    let out = set_cores(&state, app.pid());
    assert!(!out.status.success(), "followed the lock link");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert_eq!(cpus_allowed(app.pid()), before, "nothing changed");
}

/// A state file recording that qosd created `dir`.
fn forged(state: &Path, dir: &Path) {
    let v = serde_json::json!({
        "version": 1,
        "root": "/",
        "entries": [{ "kind": "created_dir", "resource": "cores", "path": dir }],
    });
    std::fs::write(state, v.to_string()).unwrap();
    std::fs::set_permissions(state, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn restore_removes_only_groups_qosd_names_under_its_roots() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("s.json");
    // An empty directory anywhere, even one named like a qosd group.
    for name in ["victim-dir", "qosd-victim"] {
        let victim = d.path().join(name);
        std::fs::create_dir(&victim).unwrap();
        forged(&state, &victim);
        let out = restore(&state);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{name}: {err}");
        assert!(err.contains("not one qosd manages"), "{err}");
        assert!(err.contains(victim.to_str().unwrap()), "{err}");
        assert!(victim.is_dir(), "{name} removed");
    }
    // A cgroup outside qosd's names, under the cgroup root.
    let cg = Path::new("/sys/fs/cgroup/qosd-test-victim-not-ours");
    let other = Path::new("/sys/fs/cgroup/victim-not-qosd");
    if Path::new("/sys/fs/cgroup/cgroup.procs").exists() {
        std::fs::create_dir(other).unwrap();
        forged(&state, other);
        let out = restore(&state);
        let kept = other.is_dir();
        let _ = std::fs::remove_dir(other);
        assert!(!out.status.success(), "{}", text(&out.stderr));
        assert!(kept, "a cgroup qosd does not name was removed");
        // One of its own names goes.
        std::fs::create_dir(cg).unwrap();
        forged(&state, cg);
        let out = restore(&state);
        let gone = !cg.exists();
        let _ = std::fs::remove_dir(cg);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(gone);
    }
}

#[test]
fn a_state_file_others_could_write_is_refused_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("s.json");
    let victim = d.path().join("victim-dir");
    std::fs::create_dir(&victim).unwrap();
    let s = state.display().to_string();
    forged(&state, &victim);
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o666)).unwrap();
    let app = Killed::sleeper(60);
    let before = cpus_allowed(app.pid());
    for out in [restore(&state), set_cores(&state, app.pid())] {
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains(&s) && err.contains("writable by group or others"),
            "{err}"
        );
    }
    assert!(victim.is_dir());
    assert_eq!(cpus_allowed(app.pid()), before);
    // Owned by another user (nobody), even if only they can write it.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&state, Some(65534), Some(65534)).unwrap();
    let out = restore(&state);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&s) && err.contains("owned by uid 65534"),
        "{err}"
    );
    assert!(victim.is_dir());
    assert_eq!(
        std::fs::metadata(&state).unwrap().uid(),
        65534,
        "left as it was"
    );
}

#[test]
fn a_state_file_in_a_directory_others_can_write_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let shared = d.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let state = shared.join("s.json");
    let app = Killed::sleeper(60);
    let before = cpus_allowed(app.pid());
    let out = set_cores(&state, app.pid());
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("only root can write"), "{err}");
    assert_eq!(cpus_allowed(app.pid()), before);
    assert!(!state.exists());
}
