//! A dry run reports the steps a real run makes, on this machine's real
//! v1 `cpu` hierarchy and scheduler (root): the CPU priority knob taken
//! through realtime (twice: the second is a reassert), normal, idle,
//! normal, realtime and a restore, first with `dry_run` and then for
//! real, on the same multi-threaded process. Each transition's reported
//! changes are the same, step for step and value for value: normal puts
//! the process back and removes the group in both (a dry run used to
//! judge "does a knob still hold the group" and "is the app real-time"
//! on a machine it never changed, and reported none of it). The dry run
//! changes nothing; the real run's restore puts every thread, the
//! process's group and the hierarchy back exactly.

use std::process::{Child, Command, Stdio};

use qosd_actuators::{Actuators, Allocation, AppTarget, Config};
use qosd_core::knobs::{PRIORITY_IDLE, PRIORITY_NORMAL, PRIORITY_REALTIME};

const CPU: &str = "/sys/fs/cgroup/cpu";

/// python3 with two extra sleeping threads, killed on drop.
struct App(Child);

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Each thread's policy, priority and nice (qosd's text for them), and
/// the process's v1 `cpu` group.
fn state(pid: u32) -> (Vec<(String, String)>, String) {
    let mut threads = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let tid = t.file_name().to_string_lossy().into_owned();
        let policy = qosd_actuators::schedpolicy::get(tid.parse().unwrap()).unwrap();
        threads.push((tid, policy));
    }
    threads.sort();
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let group = cg
        .lines()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "cpu"))
        })
        .unwrap()
        .to_owned();
    (threads, group)
}

/// The groups in the hierarchy's top directory.
fn top_groups() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(CPU)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Every transition's reported changes, as text, and the restore's.
fn run(dry_run: bool, app: &AppTarget, dir: &std::path::Path) -> Vec<Vec<String>> {
    let cfg = Config {
        dry_run,
        state_file: Some(dir.join(format!("state-{dry_run}.json"))),
        ..Config::default()
    };
    let mut acts = Actuators::new(&cfg).unwrap();
    let mut out = Vec::new();
    for p in [
        PRIORITY_REALTIME,
        PRIORITY_REALTIME,
        PRIORITY_NORMAL,
        PRIORITY_IDLE,
        PRIORITY_NORMAL,
        PRIORITY_REALTIME,
    ] {
        let want = Allocation {
            cpu_priority: Some(p),
            ..Default::default()
        };
        let changes = acts
            .apply(app, &want)
            .unwrap_or_else(|e| panic!("{p}: {e}"));
        out.push(changes.iter().map(|c| c.to_string()).collect());
    }
    let restored = acts.restore_all().unwrap();
    out.push(restored.iter().map(|c| c.to_string()).collect());
    out
}

#[test]
fn real_priority_dry_run_reports_the_steps_of_the_real_run() {
    if !std::path::Path::new(&format!("{CPU}/cpu.rt_runtime_us")).exists() {
        panic!("this machine has RT group scheduling in v1 cpu (BUILD-NOTES.md)");
    }
    let script = "import threading, time\n\
        for _ in range(2): threading.Thread(target=time.sleep, args=(120,), daemon=True).start()\n\
        print('ready', flush=True); time.sleep(120)";
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready");
    let app = App(child);
    let pid = app.0.id();
    let target = AppTarget::new("dryrun-test", vec![pid as i32]);
    let group = format!("{CPU}/{}", target.group_name());
    let before = state(pid);
    assert_eq!(before.0.len(), 3, "{before:?}");
    let top = top_groups();
    let d = tempfile::tempdir().unwrap();

    let dry = run(true, &target, d.path());
    assert_eq!(state(pid), before, "a dry run changes nothing");
    assert_eq!(top_groups(), top);
    assert!(!d.path().join("state-true.json").exists());

    let real = run(false, &target, d.path());
    assert_eq!(state(pid), before, "the real run's restore is exact");
    assert_eq!(top_groups(), top);
    assert!(!std::path::Path::new(&group).exists());
    assert!(!d.path().join("state-false.json").exists());

    // The real run did what the comparison is about: made the group with
    // its budget, made every thread real-time, reasserted nothing, and on
    // normal put the process back and removed the group.
    let has = |step: &[String], s: &str| step.iter().any(|c| c.contains(s));
    assert!(
        has(&real[0], "cpu.rt_runtime_us: 0 -> 900000"),
        "{:?}",
        real[0]
    );
    assert_eq!(
        real[0].iter().filter(|c| c.contains("-> fifo:1")).count(),
        3
    );
    assert!(
        real[1].is_empty(),
        "a reassert changes nothing: {:?}",
        real[1]
    );
    for n in [2, 4] {
        assert!(has(&real[n], "cgroup: qosd group ->"), "{n}: {:?}", real[n]);
        assert!(has(&real[n], "created -> removed"), "{n}: {:?}", real[n]);
    }
    assert!(
        has(&real[2], "cpu.rt_runtime_us: 900000 -> 0"),
        "{:?}",
        real[2]
    );
    assert!(has(&real[3], "cpu.idle: 0 -> 1"), "{:?}", real[3]);
    for (n, (d, r)) in dry.iter().zip(&real).enumerate() {
        eprintln!("transition {n}: {r:?}");
        assert_eq!(d, r, "transition {n}: the dry run reported other steps");
    }
}
