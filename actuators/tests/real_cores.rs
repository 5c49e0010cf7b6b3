//! Real cores tests on this machine (root): a running `memcached -t 4`
//! moved by sched_setaffinity and by a cpuset cgroup, every thread checked
//! in /proc/PID/task/*/status, a thread memcached creates afterwards
//! included, and the originals back after restore. Run alone with
//! `cargo test -p qosd-actuators --test real_cores`.

mod common;

use std::path::Path;
use std::process::Command;

use common::memcached::{new_thread, start_memcached, tids};
use qosd_actuators::{Actuators, Allocation, AppTarget, Config, CoresBackend, Root, Topology};

fn allowed(pid: u32, tid: i32) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_owned()
}

/// The CPU to confine memcached to: the last online one.
fn target_cpu() -> u32 {
    *Topology::read(&Root::default())
        .unwrap()
        .cpus
        .last()
        .unwrap()
}

fn config(state: &Path, backend: CoresBackend) -> Config {
    Config {
        state_file: Some(state.to_owned()),
        cores_backend: backend,
        ..Config::default()
    }
}

#[test]
fn real_cores_affinity_moves_every_memcached_thread() {
    let mc = start_memcached();
    let pid = mc.child.id();
    let original: Vec<(i32, String)> = tids(pid)
        .into_iter()
        .map(|t| (t, allowed(pid, t)))
        .collect();
    assert!(original.len() >= 5, "memcached -t 4 has at least 5 threads");
    let d = tempfile::tempdir().unwrap();
    let mut a = Actuators::new(&config(&d.path().join("s.json"), CoresBackend::Affinity)).unwrap();
    let cpu = target_cpu();
    let app = AppTarget::new("memcached", vec![pid as i32]);
    a.apply(
        &app,
        &Allocation {
            cpus: Some(vec![cpu]),
            ..Default::default()
        },
    )
    .unwrap();
    for t in tids(pid) {
        assert_eq!(allowed(pid, t), cpu.to_string(), "thread {t}");
    }
    // A thread created after the change inherits it.
    let t = new_thread(&mc);
    assert_eq!(allowed(pid, t), cpu.to_string(), "new thread {t}");
    assert_eq!(a.read(&app).unwrap().cpus, Some(vec![cpu]));

    a.restore_all().unwrap();
    let main_orig = original
        .iter()
        .find(|(t, _)| *t == pid as i32)
        .unwrap()
        .1
        .clone();
    for t in tids(pid) {
        let want = original
            .iter()
            .find(|(o, _)| *o == t)
            .map(|o| o.1.clone())
            .unwrap_or_else(|| main_orig.clone());
        assert_eq!(allowed(pid, t), want, "thread {t} restored");
    }
    assert!(!d.path().join("s.json").exists());
}

#[test]
fn real_cores_cpuset_cgroup_holds_new_threads() {
    let caps_cfg = config(Path::new("/nonexistent/s.json"), CoresBackend::Auto);
    let (caps, _) = qosd_actuators::registry::detect(&caps_cfg).unwrap();
    let backend = caps
        .get(qosd_actuators::Resource::Cores)
        .backends
        .iter()
        .find(|b| b.available && b.name.starts_with("cgroup"))
        .unwrap_or_else(|| {
            panic!(
                "this machine has no usable cpuset cgroup: {}",
                caps.get(qosd_actuators::Resource::Cores).reason
            )
        });
    let backend = if backend.name == "cgroup2" {
        CoresBackend::Cgroup2
    } else {
        CoresBackend::Cgroup1
    };
    let controller = if backend == CoresBackend::Cgroup2 {
        None
    } else {
        Some("cpuset")
    };
    // /proc/TID/cgroup exists for every thread, listed or not.
    let cgroup_of = |_pid: u32, tid: i32| -> String {
        qosd_actuators::proc::cgroup_of(&Root::default(), tid, controller).unwrap()
    };

    let mc = start_memcached();
    let pid = mc.child.id();
    let orig_group = cgroup_of(pid, pid as i32);
    let orig_mask = allowed(pid, pid as i32);
    let d = tempfile::tempdir().unwrap();
    let mut a = Actuators::new(&config(&d.path().join("s.json"), backend)).unwrap();
    // The app name carries the pid: tests running at once never share a group.
    let app = AppTarget::new(format!("test-mc-{pid}"), vec![pid as i32]);
    let cpu = target_cpu();
    a.apply(
        &app,
        &Allocation {
            cpus: Some(vec![cpu]),
            ..Default::default()
        },
    )
    .unwrap();
    let group = format!("/{}", app.group_name());
    assert_eq!(cgroup_of(pid, pid as i32), group);
    for t in tids(pid) {
        assert_eq!(allowed(pid, t), cpu.to_string(), "thread {t}");
    }
    let t = new_thread(&mc);
    assert_eq!(allowed(pid, t), cpu.to_string(), "new thread {t}");
    let task_cg = std::fs::read_to_string(format!("/proc/{pid}/task/{t}/cgroup")).unwrap();
    assert!(
        task_cg.contains(&group),
        "new thread {t} is in {group}: {task_cg}"
    );

    a.restore_all().unwrap();
    assert_eq!(cgroup_of(pid, pid as i32), orig_group);
    assert_eq!(allowed(pid, pid as i32), orig_mask);
    let mount = match backend {
        CoresBackend::Cgroup2 => qosd_actuators::cores::probe_cgroup2(&Root::default()),
        _ => qosd_actuators::cores::probe_cgroup1(&Root::default()),
    }
    .unwrap();
    assert!(
        !mount.join(app.group_name()).exists(),
        "the cgroup qosd made is removed"
    );
}

#[test]
fn real_cores_restored_when_a_panic_unwinds() {
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id() as i32;
    let orig = allowed(child.id(), pid);
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("s.json");
    let cfg = config(&state, CoresBackend::Affinity);
    let cpu = target_cpu();
    let r = std::thread::spawn(move || {
        let mut a = Actuators::new(&cfg).unwrap();
        a.apply(
            &AppTarget::from_pid(pid),
            &Allocation {
                cpus: Some(vec![cpu]),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(allowed(pid as u32, pid), cpu.to_string());
        panic!("boom while holding actuators");
    })
    .join();
    assert!(r.is_err());
    assert_eq!(allowed(child.id(), pid), orig);
    assert!(!state.exists());
    let _ = child.kill();
    let _ = child.wait();
}
