//! The CPU quota knob on fake cgroup v2 and v1 trees (the same code as on
//! a real tree, under a root prefix): `cpu.max` / `cpu.cfs_quota_us` in
//! the app's `qosd-<app>` group, shared with the cpuset backend on v2,
//! read back, bad input, dry run, and the tree byte-identical after
//! restore, in-process and from the state file after a "kill".

mod common;

use common::*;
use qosd_actuators::{
    restore_state_file, Actuators, Allocation, AppTarget, CoresBackend, QuotaBackend,
};

fn cgroup2_tree(root: &std::path::Path, cpu: bool) {
    cpus(root, 4, false);
    let cg = "/sys/fs/cgroup";
    let ctrls = if cpu {
        "cpuset cpu io memory pids\n"
    } else {
        "cpuset io memory pids\n"
    };
    put(
        root,
        "/proc/self/mounts",
        "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n",
    );
    put(root, &format!("{cg}/cgroup.controllers"), ctrls);
    put(root, &format!("{cg}/cgroup.subtree_control"), ctrls);
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
        &format!("{cg}/system.slice/app.service/cpu.max"),
        "max 100000\n",
    );
    process(
        root,
        4242,
        &[4242, 4243],
        "0-3",
        "0::/system.slice/app.service\n",
    );
}

fn cgroup1_tree(root: &std::path::Path) {
    cpus(root, 2, false);
    let cg = "/sys/fs/cgroup/cpu";
    put(
        root,
        "/proc/self/mounts",
        "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n",
    );
    put(
        root,
        "/sys/fs/cgroup/unified/cgroup.controllers",
        "hugetlb\n",
    );
    put(root, &format!("{cg}/cgroup.procs"), "1\n");
    put(root, &format!("{cg}/cpu.cfs_quota_us"), "-1\n");
    put(root, &format!("{cg}/cpu.cfs_period_us"), "100000\n");
    put(root, &format!("{cg}/app/cgroup.procs"), "4242\n");
    put(root, &format!("{cg}/app/cpu.cfs_quota_us"), "-1\n");
    put(root, &format!("{cg}/app/cpu.cfs_period_us"), "100000\n");
    process(root, 4242, &[4242], "0-1", "4:cpu:/app\n0::/\n");
}

fn quota(m: u32) -> Allocation {
    Allocation {
        cpu_quota_milli: Some(m),
        ..Default::default()
    }
}

#[test]
fn cgroup2_cpu_max_shares_the_cpuset_group_and_restores_byte_identical() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    cgroup2_tree(&root, true);
    let before = snapshot(&root);
    let state = d.path().join("state.json");
    let mut a = Actuators::new(&config(&root, &state)).unwrap();
    assert_eq!(
        a.caps()
            .get(qosd_actuators::Resource::CpuQuota)
            .backend
            .as_deref(),
        Some("cgroup2")
    );
    assert_eq!(
        a.node_caps().quota,
        Some(qosd_core::QuotaRange {
            step_milli: 100,
            max_milli: 4000
        })
    );
    let app = AppTarget::new("web", vec![4242]);
    // Before: the app's own group says unlimited.
    assert_eq!(a.read(&app).unwrap().cpu_quota_milli, None);
    let both = Allocation {
        cpus: Some(vec![1, 2]),
        cpu_quota_milli: Some(1500),
        ..Default::default()
    };
    a.apply(&app, &both).unwrap();
    let g = "/sys/fs/cgroup/qosd-web";
    assert_eq!(get(&root, &format!("{g}/cpu.max")), "150000 100000");
    assert_eq!(get(&root, &format!("{g}/cpuset.cpus")), "1-2");
    assert_eq!(get(&root, &format!("{g}/cgroup.procs")), "4242\n");
    put(&root, "/proc/4242/cgroup", "0::/qosd-web\n");
    let r = a.read(&app).unwrap();
    assert_eq!((r.cpus, r.cpu_quota_milli), (Some(vec![1, 2]), Some(1500)));
    // The quota alone, later: the group's period is kept.
    put(&root, &format!("{g}/cpu.max"), "150000 50000\n");
    a.apply(&app, &quota(300)).unwrap();
    assert_eq!(get(&root, &format!("{g}/cpu.max")), "15000 50000");
    assert_eq!(a.read(&app).unwrap().cpu_quota_milli, Some(300));

    a.restore_all().unwrap();
    // What the kernel shows once the process is back in its group.
    put(&root, "/proc/4242/cgroup", "0::/system.slice/app.service\n");
    assert_eq!(snapshot(&root), before);
    assert!(!state.exists());
}

#[test]
fn cgroup2_without_the_cpu_controller_says_why_and_v1_is_used_instead() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    cgroup2_tree(&root, false);
    let a = Actuators::new(&config(&root, &d.path().join("s.json"))).unwrap();
    let q = &a.caps().get(qosd_actuators::Resource::CpuQuota);
    assert!(!q.available);
    assert!(
        q.reason.contains("cpu not in cgroup.controllers"),
        "{}",
        q.reason
    );
    assert!(
        q.reason.contains("no cgroup v1 cpu hierarchy"),
        "{}",
        q.reason
    );
    assert_eq!(a.node_caps().quota, None);

    let root = d.path().join("root1");
    cgroup1_tree(&root);
    let a = Actuators::new(&config(&root, &d.path().join("s1.json"))).unwrap();
    assert_eq!(
        a.caps()
            .get(qosd_actuators::Resource::CpuQuota)
            .backend
            .as_deref(),
        Some("cgroup1")
    );
    let mut cfg = config(&root, &d.path().join("s2.json"));
    cfg.cpu_quota_backend = QuotaBackend::Cgroup2;
    let a = Actuators::new(&cfg).unwrap();
    assert!(
        !a.caps().get(qosd_actuators::Resource::CpuQuota).available,
        "cgroup2 asked for, not there"
    );
}

#[test]
fn cgroup1_quota_survives_a_kill_and_the_state_file_restores_it() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    cgroup1_tree(&root);
    let before = snapshot(&root);
    let state = d.path().join("state.json");
    let mut cfg = config(&root, &state);
    cfg.cores_backend = CoresBackend::Affinity;
    cfg.cpu_quota_unit_milli = 50;
    let mut a = Actuators::new(&cfg).unwrap();
    assert_eq!(a.node_caps().quota.map(|q| q.step_milli), Some(50));
    let app = AppTarget::new("batch", vec![4242]);
    assert_eq!(a.read(&app).unwrap().cpu_quota_milli, None, "-1 = none");
    a.apply(&app, &quota(250)).unwrap();
    let g = "/sys/fs/cgroup/cpu/qosd-batch";
    assert_eq!(get(&root, &format!("{g}/cpu.cfs_quota_us")), "25000");
    assert_eq!(get(&root, &format!("{g}/cgroup.procs")), "4242\n");
    // As if SIGKILLed: nothing restored on drop.
    a.keep_changes();
    drop(a);
    assert_ne!(snapshot(&root), before);
    let restored = restore_state_file(&state, false).unwrap();
    assert!(
        restored.iter().any(|c| c.to.contains("removed")),
        "{restored:?}"
    );
    assert_eq!(snapshot(&root), before);
    assert!(!state.exists());
}

#[test]
fn bad_quotas_and_dry_run_change_nothing() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    cgroup1_tree(&root);
    let before = snapshot(&root);
    let state = d.path().join("state.json");
    let mut a = Actuators::new(&config(&root, &state)).unwrap();
    let app = AppTarget::new("batch", vec![4242]);
    for (m, msg) in [
        (0, "is not in (0, 2]"),
        (2001, "is not in (0, 2]"),
        (5, "minimum is 1000 µs"),
    ] {
        let e = a.apply(&app, &quota(m)).unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
        assert!(e.to_string().contains(msg), "{m}: {e}");
    }
    assert_eq!(snapshot(&root), before);
    assert!(!state.exists());
    drop(a);

    let mut cfg = config(&root, &state);
    cfg.dry_run = true;
    let mut a = Actuators::new(&cfg).unwrap();
    let changes = a.apply(&app, &quota(500)).unwrap();
    let shown: Vec<String> = changes.iter().map(|c| c.to_string()).collect();
    assert!(
        shown
            .iter()
            .any(|c| c.contains("cpu.cfs_quota_us") && c.contains("50000")),
        "{shown:?}"
    );
    drop(a);
    assert_eq!(snapshot(&root), before, "a dry run writes nothing");
}
