//! Cores through cpuset cgroups on fake cgroup v2 and v1 trees: apply,
//! read back, restore, and the tree is byte-identical to before.

mod common;

use common::*;
use qosd_actuators::{Actuators, Allocation, AppTarget, CoresBackend};

fn cgroup2_tree(root: &std::path::Path) {
    cpus(root, 4, true);
    let cg = "/sys/fs/cgroup";
    put(
        root,
        &format!("{cg}/cgroup.controllers"),
        "cpuset cpu io memory pids\n",
    );
    put(
        root,
        &format!("{cg}/cgroup.subtree_control"),
        "cpuset cpu io memory pids\n",
    );
    put(root, &format!("{cg}/cgroup.procs"), "1\n");
    put(root, &format!("{cg}/cpuset.cpus.effective"), "0-3\n");
    put(root, &format!("{cg}/cpuset.mems.effective"), "0\n");
    put(
        root,
        &format!("{cg}/system.slice/app.service/cgroup.procs"),
        "4242\n",
    );
    put(
        root,
        &format!("{cg}/system.slice/db.service/cgroup.procs"),
        "4343\n",
    );
    process(
        root,
        4242,
        &[4242, 4243],
        "0-3",
        "0::/system.slice/app.service\n",
    );
    process(root, 4343, &[4343], "0-3", "0::/system.slice/db.service\n");
}

fn cgroup1_tree(root: &std::path::Path) {
    cpus(root, 4, true);
    let cg = "/sys/fs/cgroup/cpuset";
    put(root, &format!("{cg}/cpuset.cpus"), "0-3\n");
    put(root, &format!("{cg}/cpuset.mems"), "0\n");
    put(root, &format!("{cg}/cgroup.procs"), "1\n");
    put(root, &format!("{cg}/tasks"), "1\n");
    put(root, &format!("{cg}/app/cgroup.procs"), "4242\n");
    put(root, &format!("{cg}/app/cpuset.cpus"), "0-3\n");
    put(root, &format!("{cg}/app/cpuset.mems"), "0\n");
    process(
        root,
        4242,
        &[4242, 4243],
        "0-3",
        "5:cpuset:/app\n1:name=systemd:/x\n",
    );
}

#[test]
fn cgroup2_apply_read_restore_is_byte_identical() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    cgroup2_tree(&root);
    let before = snapshot(&root);
    let state = d.path().join("state.json");
    let mut a = Actuators::new(&config(&root, &state)).unwrap();
    assert_eq!(
        a.caps()
            .get(qosd_actuators::Resource::Cores)
            .backend
            .as_deref(),
        Some("cgroup2")
    );
    let app = AppTarget::new("web", vec![4242]);
    let alloc = Allocation {
        cpus: Some(vec![1, 3]),
        ..Default::default()
    };
    let changes = a.apply(&app, &alloc).unwrap();
    assert!(!changes.is_empty());
    let g = "/sys/fs/cgroup/qosd-web";
    assert_eq!(get(&root, &format!("{g}/cpuset.cpus")), "1,3");
    assert_eq!(get(&root, &format!("{g}/cpuset.mems")), "0");
    assert_eq!(get(&root, &format!("{g}/cgroup.procs")), "4242\n");
    assert_eq!(a.read(&app).unwrap().cpus, Some(vec![1, 3]));
    assert!(state.exists(), "originals are recorded before the change");

    // Another app may not take a sibling of CPU 1 (CPU 3's core is 1's).
    let db = AppTarget::new("db", vec![4343]);
    let err = a
        .apply(
            &db,
            &Allocation {
                cpus: Some(vec![0, 1]),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("share physical cores"), "{err}");
    assert!(
        !root.join("sys/fs/cgroup/qosd-db").exists(),
        "nothing half-applied"
    );
    a.apply(
        &db,
        &Allocation {
            cpus: Some(vec![0, 2]),
            ..Default::default()
        },
    )
    .unwrap();

    a.restore_all().unwrap();
    assert_eq!(snapshot(&root), before);
    assert!(!state.exists(), "state file removed once all is restored");
}

#[test]
fn cgroup1_apply_read_restore_is_byte_identical() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    cgroup1_tree(&root);
    let before = snapshot(&root);
    let state = d.path().join("state.json");
    let mut cfg = config(&root, &state);
    cfg.cores_backend = CoresBackend::Cgroup1;
    let app = AppTarget::new("web", vec![4242]);
    {
        let mut a = Actuators::new(&cfg).unwrap();
        assert_eq!(
            a.caps()
                .get(qosd_actuators::Resource::Cores)
                .backend
                .as_deref(),
            Some("cgroup1")
        );
        a.apply(
            &app,
            &Allocation {
                cpus: Some(vec![2]),
                ..Default::default()
            },
        )
        .unwrap();
        let g = "/sys/fs/cgroup/cpuset/qosd-web";
        assert_eq!(get(&root, &format!("{g}/cpuset.cpus")), "2");
        assert_eq!(get(&root, &format!("{g}/cpuset.mems")), "0");
        assert_eq!(a.read(&app).unwrap().cpus, Some(vec![2]));
        // Apply again with a different list: the group is reused.
        a.apply(
            &app,
            &Allocation {
                cpus: Some(vec![0, 2]),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(get(&root, &format!("{g}/cpuset.cpus")), "0,2");
        // Dropped here: restore on drop.
    }
    assert_eq!(snapshot(&root), before);
}

#[test]
fn bad_cpu_list_and_unknown_pid_change_nothing() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    cgroup1_tree(&root);
    let before = snapshot(&root);
    let state = d.path().join("state.json");
    let mut a = Actuators::new(&config(&root, &state)).unwrap();
    let app = AppTarget::new("web", vec![4242]);
    let e = a
        .apply(
            &app,
            &Allocation {
                cpus: Some(vec![9]),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(e.is_invalid_input());
    assert!(e.to_string().contains("CPU 9 is not online"), "{e}");
    let e = a
        .apply(
            &AppTarget::from_pid(777),
            &Allocation {
                cpus: Some(vec![1]),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(e.to_string(), "no process with pid 777");
    assert_eq!(snapshot(&root), before);
    assert!(!state.exists());
}

#[test]
fn failure_midway_rolls_back_the_group() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    cgroup1_tree(&root);
    // The parent's cpuset.mems cannot be read: the step after creating the
    // group and writing its cpus fails.
    std::fs::remove_file(root.join("sys/fs/cgroup/cpuset/cpuset.mems")).unwrap();
    std::fs::create_dir(root.join("sys/fs/cgroup/cpuset/cpuset.mems")).unwrap();
    let before = snapshot(&root);
    let state = d.path().join("state.json");
    let mut a = Actuators::new(&config(&root, &state)).unwrap();
    let app = AppTarget::new("web", vec![4242]);
    let e = a
        .apply(
            &app,
            &Allocation {
                cpus: Some(vec![1]),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("/sys/fs/cgroup/cpuset/cpuset.mems"),
        "{e}"
    );
    assert_eq!(
        snapshot(&root),
        before,
        "the created group is removed again"
    );
    assert!(!state.exists());
}

#[test]
fn reapplying_the_same_allocation_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    cgroup1_tree(&root);
    let mut a = Actuators::new(&config(&root, &d.path().join("s.json"))).unwrap();
    let app = AppTarget::new("web", vec![4242]);
    let alloc = Allocation {
        cpus: Some(vec![1]),
        ..Default::default()
    };
    assert!(!a.apply(&app, &alloc).unwrap().is_empty());
    // What the kernel shows once the process is moved.
    put(&root, "/proc/4242/cgroup", "5:cpuset:/qosd-web\n");
    let after = snapshot(&root);
    // The manager re-applies every tick: no write, no change reported.
    assert!(a.apply(&app, &alloc).unwrap().is_empty());
    assert_eq!(snapshot(&root), after);
}
