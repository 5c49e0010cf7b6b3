//! Cache ways and memory bandwidth through resctrl on a fake tree: L3
//! cbm_mask fffff, min_cbm_bits 1, two L3 domains, and MB.

mod common;

use std::path::Path;

use common::*;
use qosd_actuators::{Actuators, Allocation, AppTarget};

fn resctrl(root: &Path) {
    cpus(root, 4, true);
    let b = "/sys/fs/resctrl";
    put(root, &format!("{b}/info/L3/cbm_mask"), "fffff\n");
    put(root, &format!("{b}/info/L3/min_cbm_bits"), "1\n");
    put(root, &format!("{b}/info/L3/num_closids"), "16\n");
    put(root, &format!("{b}/info/L3/shareable_bits"), "0\n");
    put(root, &format!("{b}/info/MB/bandwidth_gran"), "10\n");
    put(root, &format!("{b}/info/MB/min_bandwidth"), "10\n");
    put(root, &format!("{b}/info/MB/num_closids"), "8\n");
    put(root, &format!("{b}/info/MB/delay_linear"), "1\n");
    put(
        root,
        &format!("{b}/schemata"),
        "    L3:0=fffff;1=fffff\n    MB:0=100;1=100\n",
    );
    put(root, &format!("{b}/tasks"), "1\n2\n");
    put(root, &format!("{b}/cpus"), "f\n");
    process(root, 600, &[600, 601, 602], "0-3", "0::/\n");
    process(root, 700, &[700], "0-3", "0::/\n");
}

fn l3(root: &Path, group: &str) -> String {
    let s = get(root, &format!("/sys/fs/resctrl/{group}/schemata"));
    s.lines()
        .find(|l| l.trim().starts_with("L3:"))
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
fn ways_and_mb_apply_read_restore_is_byte_identical() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    resctrl(&root);
    let before = snapshot(&root);
    let mut a = Actuators::new(&config(&root, &d.path().join("s.json"))).unwrap();
    assert_eq!(
        a.caps()
            .get(qosd_actuators::Resource::CacheWays)
            .backend
            .as_deref(),
        Some("resctrl")
    );
    assert_eq!(
        a.caps()
            .get(qosd_actuators::Resource::MemoryBandwidth)
            .backend
            .as_deref(),
        Some("resctrl")
    );
    let web = AppTarget::new("web", vec![600]);
    let db = AppTarget::new("db", vec![700]);
    a.apply(
        &web,
        &Allocation {
            llc_ways: Some(6),
            mb_percent: Some(35),
            ..Default::default()
        },
    )
    .unwrap();
    a.apply(
        &db,
        &Allocation {
            llc_ways: Some(4),
            ..Default::default()
        },
    )
    .unwrap();
    // Apps are packed from the top in name order: db first, then web;
    // both L3 domains get the same mask.
    assert_eq!(l3(&root, "qosd-db"), "L3:0=f0000;1=f0000");
    assert_eq!(l3(&root, "qosd-web"), "L3:0=fc00;1=fc00");
    let web_s = get(&root, "/sys/fs/resctrl/qosd-web/schemata");
    assert!(
        web_s.contains("MB:0=40;1=40"),
        "35% rounds up to the 10% step: {web_s}"
    );
    assert_eq!(a.read(&web).unwrap().llc_ways, Some(6));
    assert_eq!(a.read(&web).unwrap().mb_percent, Some(40));
    assert_eq!(a.read(&db).unwrap().llc_ways, Some(4));
    // Growing db repacks web below it, still disjoint.
    a.apply(
        &db,
        &Allocation {
            llc_ways: Some(8),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(l3(&root, "qosd-db"), "L3:0=ff000;1=ff000");
    assert_eq!(l3(&root, "qosd-web"), "L3:0=fc0;1=fc0");
    a.restore_all().unwrap();
    assert_eq!(snapshot(&root), before);
}

#[test]
fn too_many_ways_or_bad_percent_change_nothing() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    resctrl(&root);
    let before = snapshot(&root);
    let mut a = Actuators::new(&config(&root, &d.path().join("s.json"))).unwrap();
    let web = AppTarget::new("web", vec![600]);
    let e = a
        .apply(
            &web,
            &Allocation {
                llc_ways: Some(21),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("the cache has 20"), "{e}");
    // Ways fit but the bandwidth is invalid: the ways are rolled back too.
    let e = a
        .apply(
            &web,
            &Allocation {
                llc_ways: Some(2),
                mb_percent: Some(150),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    assert_eq!(snapshot(&root), before);
    // Two apps cannot hold more than the 20 ways together.
    a.apply(
        &web,
        &Allocation {
            llc_ways: Some(15),
            ..Default::default()
        },
    )
    .unwrap();
    let e = a
        .apply(
            &AppTarget::new("db", vec![700]),
            &Allocation {
                llc_ways: Some(6),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("21 cache ways asked for by 2 apps together"),
        "{e}"
    );
    a.restore_all().unwrap();
    assert_eq!(snapshot(&root), before);
}

#[test]
fn another_runs_groups_are_left_alone() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    resctrl(&root);
    // `qosd set ways` from another invocation holds the top 5 ways.
    put(
        &root,
        "/sys/fs/resctrl/qosd-pid9/schemata",
        "L3:0=f8000;1=f8000\nMB:0=100;1=100\n",
    );
    let before = snapshot(&root);
    let mut a = Actuators::new(&config(&root, &d.path().join("s.json"))).unwrap();
    let web = AppTarget::new("web", vec![600]);
    a.apply(
        &web,
        &Allocation {
            llc_ways: Some(3),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(l3(&root, "qosd-web"), "L3:0=7000;1=7000");
    a.restore_all().unwrap();
    assert_eq!(snapshot(&root), before);
}

#[test]
fn missing_resctrl_is_reported_with_a_reason() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    cpus(&root, 2, false);
    process(&root, 600, &[600], "0-1", "0::/\n");
    put(&root, "/proc/filesystems", "nodev\tsysfs\nnodev\tcgroup2\n");
    let mut a = Actuators::new(&config(&root, &d.path().join("s.json"))).unwrap();
    let c = a.caps().get(qosd_actuators::Resource::CacheWays).clone();
    assert!(!c.available);
    assert!(
        c.reason.contains("no resctrl in /proc/filesystems"),
        "{}",
        c.reason
    );
    let e = a
        .apply(
            &AppTarget::new("web", vec![600]),
            &Allocation {
                llc_ways: Some(2),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(e.to_string().starts_with("cache_ways: unavailable"), "{e}");
    assert!(
        !a.caps()
            .get(qosd_actuators::Resource::MemoryBandwidth)
            .available
    );
}
