//! The CPU quota knob on this machine's real cgroup tree (root): a
//! spinning process capped at 0.3 CPU through the chosen backend (cgroup
//! v1 `cpu.cfs_quota_us` here, v2 `cpu.max` where the cpu controller is
//! on cgroup2), its CPU use measured from /proc over ~1.5 s, and the tree
//! exactly as before after restore. Run alone with
//! `cargo test --release -p qosd-actuators --test real_quota`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use qosd_actuators::{Actuators, Allocation, AppTarget, Config};

/// The tests that make groups in the real hierarchy run one at a time:
/// one compares the hierarchy's top directory before and after.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The actuators with their state file in `dir`, and its path.
fn actuators_in(dir: &std::path::Path) -> (Actuators, PathBuf) {
    let state = dir.join("state.json");
    let cfg = Config {
        state_file: Some(state.clone()),
        ..Config::default()
    };
    (Actuators::new(&cfg).unwrap(), state)
}

/// A one-process CPU spinner, killed on drop.
pub struct Spinner(pub Child);

impl Spinner {
    pub fn start() -> Spinner {
        Spinner(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }
    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CPU seconds (user + system) of `pid` from /proc/PID/stat.
fn cpu_s(pid: i32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `after` starts at field 3.
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks
        / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .unwrap()
            .unwrap() as f64
}

/// CPUs' worth `pid` used over `d`.
fn cpu_use(pid: i32, d: Duration) -> f64 {
    let (c0, t0) = (cpu_s(pid), Instant::now());
    std::thread::sleep(d);
    (cpu_s(pid) - c0) / t0.elapsed().as_secs_f64()
}

/// The cgroup line of `pid` for the cpu controller (v1) or v2.
fn cpu_cgroup(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .lines()
        .find(|l| {
            let c = l.split(':').nth(1).unwrap_or("");
            c.split(',').any(|x| x == "cpu") || (c.is_empty() && l.starts_with("0::"))
        })
        .unwrap()
        .to_owned()
}

/// Every entry of the hierarchy's top directory and the root group's
/// bandwidth files: what a restore must leave as found.
fn top_of(mount: &PathBuf) -> (Vec<String>, Vec<String>) {
    let mut names: Vec<String> = std::fs::read_dir(mount)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // cgroup.subtree_control: a controller qosd enabled for its groups
    // (cgroup v2) is disabled again.
    let vals = [
        "cpu.cfs_quota_us",
        "cpu.cfs_period_us",
        "cpu.max",
        "cgroup.subtree_control",
    ]
    .iter()
    .filter_map(|f| std::fs::read_to_string(mount.join(f)).ok())
    .collect();
    (names, vals)
}

#[test]
fn quota_caps_a_real_process_and_restores_exactly() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tempfile::tempdir().unwrap();
    let (mut a, state) = actuators_in(d.path());
    let caps = a.caps().get(qosd_actuators::Resource::CpuQuota).clone();
    assert!(caps.available, "this machine has CFS bandwidth: {caps:?}");
    let v2 = caps.backend.as_deref() == Some("cgroup2");
    // The hierarchy the knob chose: the cgroup2 mount (at /sys/fs/cgroup on
    // a unified layout, /sys/fs/cgroup/unified on a hybrid one) or v1 cpu.
    let root = qosd_actuators::root::Root::default();
    let mount = if v2 {
        qosd_actuators::cgroup::cgroup2_with(&root, "cpu").unwrap()
    } else {
        qosd_actuators::cgroup::cgroup1_with(&root, "cpu", "cpu.cfs_quota_us").unwrap()
    };
    let before_top = top_of(&mount);

    let spin = Spinner::start();
    let pid = spin.pid();
    let before_cg = cpu_cgroup(pid);
    let app = AppTarget::new("quota-real", vec![pid]);
    let group = mount.join(app.group_name());
    let changes = a
        .apply(
            &app,
            &Allocation {
                cpu_quota_milli: Some(300),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(!changes.is_empty());
    assert!(state.exists(), "originals recorded before the change");
    if v2 {
        let max = std::fs::read_to_string(group.join("cpu.max")).unwrap();
        assert_eq!(max.split_whitespace().next(), Some("30000"), "{max}");
    } else {
        let period: u64 = std::fs::read_to_string(group.join("cpu.cfs_period_us"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let quota: u64 = std::fs::read_to_string(group.join("cpu.cfs_quota_us"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(
            quota,
            300 * period / 1000,
            "0.3 CPU of a {period} µs period"
        );
    }
    assert!(
        cpu_cgroup(pid).ends_with(&format!("/{}", app.group_name())),
        "{}",
        cpu_cgroup(pid)
    );
    assert_eq!(a.read(&app).unwrap().cpu_quota_milli, Some(300));

    // Measured from /proc: at most 0.3 CPU (plus one period's slack for
    // the edges of the window), and throttled by the kernel.
    let used = cpu_use(pid, Duration::from_millis(1500));
    eprintln!("capped at 0.3 CPU the spinner used {used:.3} CPU");
    assert!(used <= 0.3 * 1.2, "capped at 0.3 CPU, used {used:.3}");
    let stat = std::fs::read_to_string(group.join("cpu.stat")).unwrap();
    let throttled: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("nr_throttled "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(throttled > 0, "the kernel throttled it: {stat}");

    // A new quota on the same group.
    a.apply(
        &app,
        &Allocation {
            cpu_quota_milli: Some(1000),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(a.read(&app).unwrap().cpu_quota_milli, Some(1000));

    let restored = a.restore_all().unwrap();
    assert!(!restored.is_empty());
    assert!(!group.exists(), "the group qosd made is gone");
    assert_eq!(cpu_cgroup(pid), before_cg, "back in its own cgroup");
    assert_eq!(top_of(&mount), before_top);
    assert!(!state.exists());
    // No longer capped (asserted only where the spinner can get more than
    // the cap at all on a busy shared machine: it is a sanity check).
    let free = cpu_use(pid, Duration::from_millis(600));
    eprintln!("after restore the spinner used {free:.2} CPU");
}

#[test]
fn bad_quota_changes_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tempfile::tempdir().unwrap();
    let (mut a, _) = actuators_in(d.path());
    let spin = Spinner::start();
    let app = AppTarget::new("quota-bad", vec![spin.pid()]);
    let nr_cpus = a.topology().unwrap().cpus.len() as u32;
    for q in [0, nr_cpus * 1000 + 1, 5] {
        let e = a
            .apply(
                &app,
                &Allocation {
                    cpu_quota_milli: Some(q),
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert!(e.is_invalid_input(), "{q}: {e}");
    }
    for m in [
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/unified",
    ] {
        assert!(!PathBuf::from(m).join("qosd-quota-bad").exists(), "{m}");
    }
    assert!(!d.path().join("state.json").exists());
}

/// A quota of every online CPU limits nothing: the app goes back to the
/// group it was found in (a group at one entity's weight is only a cost:
/// `cgroup::leave_if_unused`), and a later cap moves it in again; a group
/// another knob holds (the idle class) keeps it. Restore is exact either
/// way.
#[test]
fn lifted_quota_leaves_the_group_unless_held() {
    use qosd_core::knobs::PRIORITY_IDLE;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tempfile::tempdir().unwrap();
    let (mut a, state) = actuators_in(d.path());
    let all = a.topology().unwrap().cpus.len() as u32 * 1000;
    let quota = |m: u32| Allocation {
        cpu_quota_milli: Some(m),
        ..Default::default()
    };
    let spin = Spinner::start();
    let pid = spin.pid();
    let before_cg = cpu_cgroup(pid);
    let app = AppTarget::new("quota-lift", vec![pid]);
    let in_group = || cpu_cgroup(pid).ends_with(&format!("/{}", app.group_name()));

    // Every CPU from the start: nothing to limit, nothing made.
    a.apply(&app, &quota(all)).unwrap();
    assert_eq!(cpu_cgroup(pid), before_cg, "no group for no limit");
    a.apply(&app, &quota(500)).unwrap();
    assert!(in_group(), "capped: in its group: {}", cpu_cgroup(pid));
    let changes = a.apply(&app, &quota(all)).unwrap();
    assert_eq!(
        cpu_cgroup(pid),
        before_cg,
        "lifted: back where it was found"
    );
    assert!(
        changes.iter().any(|c| c.to_string().contains("cgroup")),
        "the move back is reported: {changes:?}"
    );
    assert_eq!(
        a.read(&app).unwrap().cpu_quota_milli,
        None,
        "no limit in force"
    );
    a.apply(&app, &quota(700)).unwrap();
    assert!(in_group(), "capped again: in its group again");
    assert_eq!(a.read(&app).unwrap().cpu_quota_milli, Some(700));

    // The idle class holds the group: a lifted quota leaves it there.
    let idle = Allocation {
        cpu_priority: Some(PRIORITY_IDLE),
        ..Default::default()
    };
    if a.caps()
        .get(qosd_actuators::Resource::CpuPriority)
        .backend
        .as_deref()
        != Some("sched_idle")
    {
        a.apply(&app, &idle).unwrap();
        a.apply(&app, &quota(all)).unwrap();
        assert!(
            in_group(),
            "held by the idle class: stays: {}",
            cpu_cgroup(pid)
        );
    }
    a.restore_all().unwrap();
    assert_eq!(
        cpu_cgroup(pid),
        before_cg,
        "restored: back in its own cgroup"
    );
    assert!(!state.exists());
}
