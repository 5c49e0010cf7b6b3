//! What the daemon's loop uses besides `apply`: node capacities for the
//! policy (fake trees and this machine), and releasing an app that exited
//! (its group goes, the other app's stays, the final restore is complete).

mod common;

use common::*;
use qosd_actuators::{Actuators, Allocation, AppTarget, Root, Topology};

fn cgroup1_two_apps(root: &std::path::Path) {
    cpus(root, 4, false);
    let cg = "/sys/fs/cgroup/cpuset";
    put(root, &format!("{cg}/cpuset.cpus"), "0-3\n");
    put(root, &format!("{cg}/cpuset.mems"), "0\n");
    // A plain file stands for cgroup.procs: moving 4343 back writes
    // "4343" over it, so that is what it holds before too.
    put(root, &format!("{cg}/cgroup.procs"), "4343\n");
    put(root, &format!("{cg}/tasks"), "1\n");
    put(
        root,
        "/proc/self/mounts",
        "cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n",
    );
    process(root, 4242, &[4242], "0-3", "5:cpuset:/\n");
    process(root, 4343, &[4343], "0-3", "5:cpuset:/\n");
}

#[test]
fn release_removes_only_the_exited_apps_group() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    cgroup1_two_apps(&root);
    let before = snapshot(&root);
    let state = d.path().join("state.json");
    let mut a = Actuators::new(&config(&root, &state)).unwrap();
    assert_eq!(
        a.caps()
            .get(qosd_actuators::Resource::Cores)
            .backend
            .as_deref(),
        Some("cgroup1")
    );
    let web = AppTarget::new("web", vec![4242]);
    let db = AppTarget::new("db", vec![4343]);
    for (app, cpus) in [(&web, vec![0]), (&db, vec![1, 2])] {
        let alloc = Allocation {
            cpus: Some(cpus),
            ..Default::default()
        };
        a.apply(app, &alloc).unwrap();
    }
    let g = "/sys/fs/cgroup/cpuset/qosd-web";
    assert_eq!(get(&root, &format!("{g}/cpuset.cpus")), "0");

    // web exits: its process is gone from /proc.
    std::fs::remove_dir_all(root.join("proc/4242")).unwrap();
    let changes = a.release_app(&web).unwrap();
    assert!(
        changes
            .iter()
            .any(|c| c.target.ends_with("qosd-web") && c.to == "removed"),
        "{changes:?}"
    );
    assert!(!root.join(g.trim_start_matches('/')).exists());
    assert!(root.join("sys/fs/cgroup/cpuset/qosd-db").exists());
    // The state file still holds db's originals.
    let st = std::fs::read_to_string(&state).unwrap();
    assert!(st.contains("qosd-db") && !st.contains("qosd-web"), "{st}");

    // web's CPU is free for db now (no "shares physical cores" refusal).
    let alloc = Allocation {
        cpus: Some(vec![0, 1]),
        ..Default::default()
    };
    a.apply(&db, &alloc).unwrap();

    a.restore_all().unwrap();
    drop(a);
    let mut after = snapshot(&root);
    let mut want = before;
    want.retain(|p, _| !p.starts_with("proc/4242"));
    after.retain(|p, _| !p.starts_with("proc/4242"));
    assert_eq!(after, want);
    assert!(!state.exists());
}

#[test]
fn node_caps_on_a_fake_tree_with_cpufreq() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    // 4 logical CPUs, 2 physical cores (siblings 0,2 and 1,3).
    cpus(&root, 4, true);
    put(&root, "/proc/self/task/1/stat", "");
    for c in 0..4 {
        let p = format!("/sys/devices/system/cpu/cpu{c}/cpufreq");
        put(&root, &format!("{p}/cpuinfo_min_freq"), "800000\n");
        let max = if c == 3 { "2200000\n" } else { "2400000\n" };
        put(&root, &format!("{p}/cpuinfo_max_freq"), max);
        put(&root, &format!("{p}/scaling_max_freq"), max);
        put(
            &root,
            &format!("{p}/scaling_available_governors"),
            "performance powersave\n",
        );
    }
    let state = d.path().join("state.json");
    let a = Actuators::new(&config(&root, &state)).unwrap();
    let n = a.node_caps();
    assert_eq!(n.nr_cores, 2, "physical cores, not logical CPUs");
    assert_eq!(n.nr_ways, 0);
    let f = n.freq.expect("cpufreq range");
    assert_eq!((f.min_mhz, f.max_mhz, f.step_mhz), (800, 2200, 100));
    assert_eq!(n.mb, None);
    assert_eq!(a.topology().unwrap().cores, vec![vec![0, 2], vec![1, 3]]);
}

#[test]
fn node_caps_of_this_machine_match_its_topology() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("state.json");
    let cfg = qosd_actuators::Config {
        dry_run: true,
        state_file: Some(state),
        ..Default::default()
    };
    let a = Actuators::new(&cfg).unwrap();
    let topo = Topology::read(&Root::default()).unwrap();
    let n = a.node_caps();
    assert_eq!(n.nr_cores as usize, topo.cores.len());
    assert_eq!(
        n.nr_ways > 0,
        a.caps().get(qosd_actuators::Resource::CacheWays).available
    );
    assert_eq!(
        n.freq.is_some(),
        a.caps().get(qosd_actuators::Resource::Frequency).available
    );
    assert_eq!(
        n.mb.is_some(),
        a.caps()
            .get(qosd_actuators::Resource::MemoryBandwidth)
            .available
    );
}
