//! The restore matrix (issue 21), for real on this machine's cgroups
//! (root): a process starts in non-root groups of its own in the cgroup v1
//! `cpuset` and `cpu` hierarchies, with its own settings there (1.5 CPU of
//! quota, `cpu.shares` 512, its own affinity inside its cpuset); `qosd run`
//! manages it with every knob combination this machine has (cores through
//! a cpuset group or through affinity, CPU quota, both, quota over a CFS
//! period of qosd's own (the user's group has a period of its own too,
//! 80 ms, which must come back); the CPU priority
//! knob, alone and with quota, on a best-effort app, and its SCHED_IDLE
//! fallback forced with `QOSD_PRETEND_NO_PRIORITY_CGROUP=1`) and is stopped by
//! SIGTERM, SIGINT, SIGUSR1, SIGKILL then `qosd restore`, and SIGKILL then
//! the next start (SIGHUP reloads the daemon's config: daemon_reload.rs). After each, every file of the process's groups and of
//! the hierarchies' top groups, its groups and every thread's affinity and
//! scheduling policy are
//! exactly as before, and no `qosd-<app>` group is left. Cases run one after
//! the other in one test (each ~1 s). Run alone:
//! `cargo test --release -p qosd-manager --test hardening2_restore`.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use support::*;

const CPUSET: &str = "/sys/fs/cgroup/cpuset";
const CPU: &str = "/sys/fs/cgroup/cpu";

/// Counters that move on their own: not settings, left out of the compare.
fn is_counter(name: &str) -> bool {
    name.contains("stat")
        || name.contains("usage")
        || name.ends_with("memory_pressure")
        || name == "tasks"
        || name == "cgroup.procs"
}

/// Every readable setting file of a group dir (`top`: without the lists of
/// processes, which other work on the node changes).
fn group_files(dir: &Path, top: bool) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let counter = is_counter(&name) && (top || !["tasks", "cgroup.procs"].contains(&&*name));
        if counter || !e.file_type().unwrap().is_file() {
            continue;
        }
        if let Ok(v) = std::fs::read_to_string(e.path()) {
            m.insert(format!("{}/{name}", dir.display()), v);
        }
    }
    m
}

/// The user's groups for this process: made, configured, the process put
/// in them, removed on drop.
struct UserGroups {
    dirs: Vec<PathBuf>,
}

impl UserGroups {
    fn make(tag: &str, pid: u32) -> UserGroups {
        let name = format!("qosd-test-harden-{tag}-{pid}");
        let cs = Path::new(CPUSET).join(&name);
        let cpu = Path::new(CPU).join(&name);
        for d in [&cs, &cpu] {
            std::fs::create_dir(d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        }
        let w = |p: PathBuf, v: &str| {
            std::fs::write(&p, v).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        w(cs.join("cpuset.mems"), "0");
        w(cs.join("cpuset.cpus"), "0-1");
        // A period other than the kernel's default: restore must put the
        // user's pair back, not only the quota.
        w(cpu.join("cpu.cfs_period_us"), "80000");
        w(cpu.join("cpu.cfs_quota_us"), "150000");
        w(cpu.join("cpu.shares"), "512");
        w(cs.join("cgroup.procs"), &pid.to_string());
        w(cpu.join("cgroup.procs"), &pid.to_string());
        // Its own affinity inside its cpuset: CPU 1 only.
        let mut set = nix::sched::CpuSet::new();
        set.set(1).unwrap();
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(pid as i32), &set).unwrap();
        UserGroups {
            dirs: vec![cs, cpu],
        }
    }
}

impl Drop for UserGroups {
    fn drop(&mut self) {
        for d in &self.dirs {
            let procs = d.join("cgroup.procs");
            let top = d.parent().unwrap().join("cgroup.procs");
            for p in std::fs::read_to_string(&procs).unwrap_or_default().lines() {
                let _ = std::fs::write(&top, p);
            }
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// What must come back: the process's groups, every thread's affinity,
/// the user's group files and the hierarchies' top-group settings.
fn snapshot(pid: u32, groups: &UserGroups) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("cgroup".into(), cgroups(pid));
    m.insert("affinity".into(), thread_cpus(pid).join(" "));
    m.insert("policy".into(), format!("{:?}", thread_policies(pid)));
    for d in &groups.dirs {
        m.extend(group_files(d, false));
        m.extend(group_files(d.parent().unwrap(), true));
    }
    m
}

#[derive(Debug, Clone, Copy)]
enum Stop {
    Signal(Signal),
    KillThenRestore,
    KillThenNextStart,
}

/// One knob combination of the matrix: the knobs, their backend, and the
/// CFS period qosd enforces quotas over (`None`: the group's own).
#[derive(Debug, Clone, Copy)]
struct Combo {
    knobs: &'static str,
    backend: &'static str,
    period_us: Option<u64>,
}

fn config(dir: &Path, port: u16, app: &str, matcher: &str, c: Combo) -> PathBuf {
    let Combo {
        knobs,
        backend,
        period_us,
    } = c;
    let p = dir.join("config.yaml");
    // The priority knob acts on best-effort apps (the idle class).
    let class = if knobs.contains("cpu_priority") {
        "class: be"
    } else {
        "class: lc\n    target: { p99: 2ms }\n    feedback: client"
    };
    std::fs::write(
        &p,
        format!(
            "apps:\n  - name: {app}\n    match: {matcher}\n    {class}\n    \
             resources: {{ initial: {{ nr_cores: 1, cpu_quota_milli: 500 }} }}\n\
             policy: {}\nstate_file: {}\n\
             actuators:\n  enabled: [{knobs}]\n  cores_backend: {}\n{}\
             api:\n  listen: 127.0.0.1:{port}\n  token_file: {}\n",
            parties().display(),
            dir.join("state.json").display(),
            if backend == SCHED_IDLE {
                "auto"
            } else {
                backend
            },
            period_us.map_or(String::new(), |p| format!("  cpu_quota_period_us: {p}\n")),
            dir.join("api.token").display(),
        ),
    )
    .unwrap();
    p
}

/// The matrix's name for the priority knob's SCHED_IDLE fallback: its
/// daemons run with the cgroup backends made to look missing.
const SCHED_IDLE: &str = "sched_idle";

fn start(cfg: &Path, port: u16, backend: &str) -> Daemon {
    Daemon::start_with(cfg, port, &[], |c| {
        if backend == SCHED_IDLE {
            c.env("QOSD_PRETEND_NO_PRIORITY_CGROUP", "1");
        }
    })
}

fn wait_exit(d: &mut Daemon) -> std::process::ExitStatus {
    for _ in 0..1500 {
        if let Some(st) = d.child.try_wait().unwrap() {
            std::thread::sleep(Duration::from_millis(100));
            return st;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("qosd did not exit within 30 s");
}

/// One case: returns a description of what differs (empty: restored).
fn case(c: Combo, stop: Stop) -> Vec<String> {
    let Combo { knobs, backend, .. } = c;
    let sleeper = Killed::sleeper(120);
    let pid = sleeper.pid();
    let groups = UserGroups::make("m", pid);
    let before = snapshot(pid, &groups);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let app = format!("hm-{pid}");
    let cfg = config(dir.path(), port, &app, &format!("{{ pid: {pid} }}"), c);
    let mut d = start(&cfg, port, backend);
    let managed = wait_for(Duration::from_secs(10), || {
        d.get(&format!("/v1/apps/{app}"))["managed"] == true && snapshot(pid, &groups) != before
    });
    assert!(
        managed,
        "{knobs}/{backend}: nothing changed: {:?}",
        d.output()
    );
    let mut diffs = Vec::new();
    if let Some(p) = c.period_us {
        // The quota is enforced over qosd's period in qosd's group.
        let f = Path::new(CPU).join(format!("qosd-{app}/cpu.cfs_period_us"));
        let got = std::fs::read_to_string(&f).unwrap_or_default();
        if got.trim() != p.to_string() {
            diffs.push(format!("{}: {got:?}, not {p}", f.display()));
        }
        // And with the default burst: one period's quota may be banked.
        let read = |n: &str| std::fs::read_to_string(f.with_file_name(n)).ok();
        if let (Some(b), Some(q)) = (read("cpu.cfs_burst_us"), read("cpu.cfs_quota_us")) {
            if b != q {
                diffs.push(format!("burst {b:?} is not the quota {q:?}"));
            }
        }
    }
    let daemon_pid = nix::unistd::Pid::from_raw(d.child.id() as i32);
    match stop {
        Stop::Signal(s) => {
            nix::sys::signal::kill(daemon_pid, s).unwrap();
            let st = wait_exit(&mut d);
            let out = d.output();
            if !st.success() {
                diffs.push(format!("exit {st} on {s}"));
            }
            if !out.iter().any(|l| l.contains(&format!("stopping ({s})"))) {
                diffs.push(format!("no 'stopping ({s})' line: {out:?}"));
            }
        }
        Stop::KillThenRestore | Stop::KillThenNextStart => {
            nix::sys::signal::kill(daemon_pid, Signal::SIGKILL).unwrap();
            wait_exit(&mut d);
            if let Stop::KillThenRestore = stop {
                let out = Command::new(QOSD)
                    .args(["restore", "--state-file"])
                    .arg(dir.path().join("state.json"))
                    .output()
                    .unwrap();
                if !out.status.success() {
                    diffs.push(format!("qosd restore: {}", text(&out.stderr)));
                }
            } else {
                // The next start matches nothing: it only puts back.
                let port2 = free_port();
                let cfg2 = config(dir.path(), port2, &app, "{ comm: qd-never-runs }", c);
                let d2 = start(&cfg2, port2, backend);
                if !d2.output().iter().any(|l| l.starts_with("put back ")) {
                    diffs.push(format!("no 'put back' line: {:?}", d2.output()));
                }
                let after = snapshot(pid, &groups);
                let (st, _) = d2.stop();
                assert!(st.success());
                diffs.extend(compare(&before, &after));
                diffs.extend(leftover_groups(&app));
                return diffs;
            }
        }
    }
    diffs.extend(compare(&before, &snapshot(pid, &groups)));
    diffs.extend(leftover_groups(&app));
    diffs
}

fn compare(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    let mut v = Vec::new();
    for (k, b) in before {
        match after.get(k) {
            Some(a) if a == b => {}
            a => v.push(format!("{k}: {b:?} -> {a:?}")),
        }
    }
    v.extend(
        after
            .keys()
            .filter(|k| !before.contains_key(*k))
            .map(|k| format!("{k}: new")),
    );
    v
}

fn leftover_groups(app: &str) -> Vec<String> {
    [CPUSET, CPU]
        .iter()
        .map(|m| Path::new(m).join(format!("qosd-{app}")))
        .filter(|g| g.exists())
        .map(|g| format!("{} left behind", g.display()))
        .collect()
}

#[test]
fn hardening2_every_knob_combination_and_stop_restores_exactly() {
    assert!(
        Path::new(CPUSET).join("cpuset.cpus").exists()
            && Path::new(CPU).join("cpu.cfs_quota_us").exists(),
        "this test needs the cgroup v1 cpuset and cpu hierarchies at {CPUSET} and {CPU}"
    );
    let combo = |knobs, backend| Combo {
        knobs,
        backend,
        period_us: None,
    };
    let combos = [
        combo("cores", "cgroup1"),
        combo("cores", "affinity"),
        combo("cpu_quota", "auto"),
        Combo {
            period_us: Some(10_000),
            ..combo("cpu_quota", "auto")
        },
        combo("cores, cpu_quota", "cgroup1"),
        combo("cores, cpu_quota", "affinity"),
        combo("cpu_priority", "auto"),
        combo("cpu_quota, cpu_priority", "auto"),
        combo("cpu_priority", SCHED_IDLE),
    ];
    let stops = [
        Stop::Signal(Signal::SIGTERM),
        Stop::Signal(Signal::SIGINT),
        // SIGHUP reloads the daemon's config instead (daemon_reload.rs).
        Stop::Signal(Signal::SIGUSR1),
        Stop::KillThenRestore,
        Stop::KillThenNextStart,
    ];
    let mut failed = Vec::new();
    for c in combos {
        let Combo {
            knobs,
            backend,
            period_us,
        } = c;
        let knobs = match period_us {
            Some(p) => format!("{knobs} over {p} µs"),
            None => knobs.to_owned(),
        };
        for stop in stops {
            let d = case(c, stop);
            eprintln!(
                "[{knobs} / {backend}] {stop:?}: {}",
                if d.is_empty() {
                    "restored"
                } else {
                    "NOT RESTORED"
                }
            );
            if !d.is_empty() {
                failed.push(format!("[{knobs} / {backend}] {stop:?}: {d:#?}"));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} cases not restored:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
