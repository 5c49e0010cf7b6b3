//! Frequency through cpufreq sysfs on fake trees of both styles:
//! acpi-cpufreq (userspace governor + scaling_setspeed) and intel_pstate
//! (scaling_max_freq only). Apply, read back, restore → byte-identical.

mod common;

use std::path::Path;

use common::*;
use qosd_actuators::{Actuators, Allocation, AppTarget};

/// acpi-cpufreq: available frequencies, the userspace governor offered.
fn acpi_cpufreq(root: &Path, n: u32) {
    cpus(root, n, false);
    for c in 0..n {
        let d = format!("/sys/devices/system/cpu/cpu{c}/cpufreq");
        put(root, &format!("{d}/cpuinfo_min_freq"), "800000\n");
        put(root, &format!("{d}/cpuinfo_max_freq"), "2400000\n");
        put(
            root,
            &format!("{d}/scaling_available_frequencies"),
            "2400000 2000000 1600000 1200000 800000 \n",
        );
        put(
            root,
            &format!("{d}/scaling_available_governors"),
            "conservative ondemand userspace powersave performance schedutil \n",
        );
        put(root, &format!("{d}/scaling_governor"), "ondemand\n");
        put(root, &format!("{d}/scaling_setspeed"), "<unsupported>\n");
        put(root, &format!("{d}/scaling_cur_freq"), "2400000\n");
        put(root, &format!("{d}/scaling_min_freq"), "800000\n");
        put(root, &format!("{d}/scaling_max_freq"), "2400000\n");
    }
}

/// intel_pstate: no userspace governor, no frequency table.
fn intel_pstate(root: &Path, n: u32) {
    cpus(root, n, false);
    for c in 0..n {
        let d = format!("/sys/devices/system/cpu/cpu{c}/cpufreq");
        put(root, &format!("{d}/cpuinfo_min_freq"), "400000\n");
        put(root, &format!("{d}/cpuinfo_max_freq"), "4700000\n");
        put(
            root,
            &format!("{d}/scaling_available_governors"),
            "performance powersave\n",
        );
        put(root, &format!("{d}/scaling_governor"), "powersave\n");
        put(root, &format!("{d}/scaling_cur_freq"), "3100000\n");
        put(root, &format!("{d}/scaling_min_freq"), "400000\n");
        put(root, &format!("{d}/scaling_max_freq"), "4700000\n");
    }
}

#[test]
fn setspeed_style_apply_read_restore() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    acpi_cpufreq(&root, 4);
    process(&root, 500, &[500], "2-3", "0::/\n");
    let before = snapshot(&root);
    let mut a = Actuators::new(&config(&root, &d.path().join("s.json"))).unwrap();
    assert_eq!(
        a.caps()
            .get(qosd_actuators::Resource::Frequency)
            .backend
            .as_deref(),
        Some("cpufreq")
    );
    assert!(a
        .caps()
        .get(qosd_actuators::Resource::Frequency)
        .reason
        .contains("scaling_setspeed"));
    // 1700 MHz is not a step: rounded down to 1600.
    let app = AppTarget::new("web", vec![500]);
    a.apply(
        &app,
        &Allocation {
            freq_mhz: Some(1700),
            ..Default::default()
        },
    )
    .unwrap();
    for c in [2, 3] {
        let dir = format!("/sys/devices/system/cpu/cpu{c}/cpufreq");
        assert_eq!(get(&root, &format!("{dir}/scaling_governor")), "userspace");
        assert_eq!(get(&root, &format!("{dir}/scaling_setspeed")), "1600000");
    }
    // CPUs the app does not run on are untouched.
    assert_eq!(
        get(
            &root,
            "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
        ),
        "ondemand\n"
    );
    assert_eq!(a.read(&app).unwrap().freq_mhz, Some(1600));
    a.restore_all().unwrap();
    assert_eq!(snapshot(&root), before);
}

#[test]
fn max_freq_style_apply_read_restore() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    intel_pstate(&root, 2);
    let before = snapshot(&root);
    let mut a = Actuators::new(&config(&root, &d.path().join("s.json"))).unwrap();
    assert!(a
        .caps()
        .get(qosd_actuators::Resource::Frequency)
        .reason
        .contains("scaling_max_freq"));
    let ch = a.set_cpu_freq(&[0, 1], 2000).unwrap();
    assert_eq!(ch.len(), 2);
    for c in [0, 1] {
        let dir = format!("/sys/devices/system/cpu/cpu{c}/cpufreq");
        assert_eq!(get(&root, &format!("{dir}/scaling_max_freq")), "2000000");
        assert_eq!(
            get(&root, &format!("{dir}/scaling_governor")),
            "powersave\n"
        );
    }
    // A second change keeps the very first original.
    a.set_cpu_freq(&[0], 1000).unwrap();
    a.restore_all().unwrap();
    assert_eq!(snapshot(&root), before);
}

#[test]
fn out_of_range_and_missing_cpu_change_nothing() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    acpi_cpufreq(&root, 2);
    let before = snapshot(&root);
    let mut a = Actuators::new(&config(&root, &d.path().join("s.json"))).unwrap();
    let e = a.set_cpu_freq(&[0, 1], 5000).unwrap_err();
    assert!(e.is_invalid_input());
    assert!(
        e.to_string().contains("outside CPU 0's range 800-2400 MHz"),
        "{e}"
    );
    let e = a.set_cpu_freq(&[0, 7], 1200).unwrap_err();
    assert!(
        e.to_string()
            .contains("/sys/devices/system/cpu/cpu7/cpufreq"),
        "{e}"
    );
    assert_eq!(snapshot(&root), before);
}

#[test]
fn a_file_failing_midway_rolls_back_the_cpus_before_it() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    acpi_cpufreq(&root, 2);
    // CPU 1's scaling_setspeed is missing: CPU 0 is changed first, then
    // the write on CPU 1 fails and CPU 0 must be put back.
    std::fs::remove_file(root.join("sys/devices/system/cpu/cpu1/cpufreq/scaling_setspeed"))
        .unwrap();
    let before = snapshot(&root);
    let state = d.path().join("s.json");
    let mut a = Actuators::new(&config(&root, &state)).unwrap();
    let e = a.set_cpu_freq(&[0, 1], 1200).unwrap_err();
    assert!(
        e.to_string().contains("cpu1/cpufreq/scaling_setspeed"),
        "{e}"
    );
    assert_eq!(snapshot(&root), before);
    assert!(!state.exists());
}

#[test]
fn dry_run_changes_nothing_and_reports() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    acpi_cpufreq(&root, 2);
    let before = snapshot(&root);
    let state = d.path().join("s.json");
    let mut cfg = config(&root, &state);
    cfg.dry_run = true;
    let mut a = Actuators::new(&cfg).unwrap();
    let ch = a.set_cpu_freq(&[0, 1], 1200).unwrap();
    assert_eq!(ch.len(), 4, "governor and setspeed on each CPU: {ch:?}");
    assert_eq!(snapshot(&root), before);
    assert!(!state.exists());
}
