//! Real replays (root): real servers calibrated on this machine, the
//! open-loop load, eBPF feedback, the policy's plans put in force on the
//! cores and put back; a replay beside a daemon; utilisation fed to rule
//! policies. Run alone: `cargo test -p qosd-manager --test replay_real`.

mod support;

use std::path::Path;
use std::process::Command;

use support::replay::{
    assert_ebpf_p99_beside_client, calibrate, calibrate_with, fixture_scenario, replay_group,
    replay_ok as ok, started_pid,
};
use support::{cgroups, free_port, qosd_in_repo as qosd, repo, wait_for, write_config};
use support::{AppSpec, Daemon, Killed, QOSD};

/// Real replays share this machine's CPUs and measure latency and CPU use
/// on them: one at a time, or one would starve the other's server.
static REAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn real_replay_lock() -> std::sync::MutexGuard<'static, ()> {
    REAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A reduced ramp on real servers: calibrate quickly, replay 15 s with eBPF
/// feedback (root); servers start and stop, outputs are written.
#[test]
fn real_replay_of_a_reduced_ramp() {
    let _one_at_a_time = real_replay_lock();
    let t = tempfile::tempdir().unwrap();
    let sc = t.path().join("mini.yaml");
    std::fs::write(
        &sc,
        "name: mini\nduration_s: 15\ninterval_ms: 500\nfeedback: ebpf\napps:\n  \
         - name: search\n    class: lc\n    server:\n      kind: fixture\n      work_us: 500\n    protocol: http\n    \
         connections: 4\n    target:\n      knee_factor: 1.0\n    load:\n      kind: ramp\n      from: 0.07\n      to: 0.8\n      \
         over_s: 6\n      hold_s: 2\n      back_s: 6\n",
    )
    .unwrap();
    let cal = t.path().join("cal.json");
    // The fitted knee (the default). Both figures are read the same way
    // at the same load: the client's on its fitted curve, the eBPF one on
    // a curve fitted to the eBPF steps (at the fitted knee eBPF had read
    // 1.43x the client once, 5456 against 3825 us, when one step's eBPF
    // p99 was set against the client's curve).
    calibrate_with(&sc, &cal, &[]);
    // Calibration measured the server-side (eBPF) latency at the same knee
    // load as the client's: the eBPF-side target, below the client's.
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cal).unwrap()).unwrap();
    let s = &c["apps"]["search"];
    let (client, ebpf) = (
        s["knee_latency_us"].as_f64().unwrap(),
        s["ebpf_knee_latency_us"]
            .as_f64()
            .expect("eBPF latency at the knee"),
    );
    eprintln!("knee p99: eBPF {ebpf:.0} µs, client {client:.0} µs");
    // Two knee passes (the default): each pass's own knee goes beside the
    // knee of their pooled requests; where a pass alone does not fit a
    // curve (beside two spinners, once), the calibration says so.
    match s["knee_spread"]["repeats_us"].as_array() {
        Some(passes) => {
            assert_eq!(passes.len(), 2, "{passes:?}");
            assert!(
                passes.iter().all(|k| k.as_f64().unwrap() > 0.0),
                "{passes:?}"
            );
        }
        None => assert!(
            s["knee_check"]["warnings"]
                .to_string()
                .contains("no spread"),
            "no knee_spread and no warning saying why: {s}"
        ),
    }
    assert!(ebpf > 0.0, "eBPF {ebpf} µs, client {client} µs");
    // The two knee figures are each read off a curve fitted to noisy
    // steps. Quiet, eBPF came out 8 % and 16 % above the client (1798
    // against 1667 µs; 2548 against 2204 µs); on a busy machine 2.7x
    // (18 326 against 6 731 µs, two spinners beside the test); a CI
    // machine failed the 1.25x bar this test had (2026-11-26, most likely
    // this bar: the log cut the message). What must hold is per load: at
    // the median calibrated load the server side is not above the
    // clients' p99 of the same requests (a sensor that doubles is below 0
    // at every load). One step can be: a backlog left by a saturated step
    // drains into the next step's window on the server side only (why
    // eBPF can read above the client at all: docs/control.md, "Why eBPF's
    // per-interval p99 came out above the client's").
    let mut gaps: Vec<f64> = s["gap"]
        .as_array()
        .expect("client/eBPF gap per load")
        .iter()
        .map(|g| g["gap_us"].as_f64().unwrap())
        .collect();
    gaps.sort_by(f64::total_cmp);
    assert!(gaps.len() >= 3, "{gaps:?}");
    assert!(
        gaps[gaps.len() / 2] >= 0.0,
        "client - eBPF p99 per calibrated load, median below 0: {gaps:?}"
    );
    let out = t.path().join("run");
    let o = qosd(&[
        "replay",
        sc.to_str().unwrap(),
        "--policy",
        "static",
        "--calibration",
        cal.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    // The server it started is gone.
    let pid = started_pid(&err);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap()
                .contains(") Z"),
        "server {pid} stopped"
    );
    let text = std::fs::read_to_string(out.join("timeline.csv")).unwrap();
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert!(rows.len() >= 28, "{} rows", rows.len());
    let achieved: f64 = rows
        .iter()
        .map(|l| l.split(',').nth(3).unwrap().parse::<f64>().unwrap())
        .sum();
    assert!(achieved > 0.0);
    assert!(
        rows.iter()
            .all(|l| l.split(',').nth(4).is_some_and(|c| !c.is_empty())),
        "client p99 in every row"
    );
    // Server-side p99 from eBPF beside it (the policy's feedback here); the
    // client's includes the loopback and its own scheduling, so it is not
    // below the server's in most intervals.
    let cols: Vec<Vec<&str>> = rows.iter().map(|l| l.split(',').collect()).collect();
    assert_ebpf_p99_beside_client(&cols);
    assert!(out.join("timeline.png").is_file() && out.join("plans.jsonl").is_file());
    // The start was put in force on the cores knob this machine has (the
    // app's even share of the node: every CPU, as the only app; the
    // static policy keeps it), and everything was put back at the end.
    let nr_cpus = std::thread::available_parallelism()
        .unwrap()
        .get()
        .to_string();
    assert!(
        rows.iter()
            .all(|l| l.split(',').nth(8).is_some_and(|c| c == nr_cpus)),
        "{nr_cpus} cores in every row: {rows:?}"
    );
    assert!(err.contains("knobs: cores"), "{err}");
    assert_eq!(
        replay_group("search"),
        None,
        "replay left its cpuset group behind"
    );
    // Power from the power sensor: every row has the server's power, it
    // grows with the load, the app's energy is within the node's, and it
    // is flagged an estimate on a machine without RAPL. RAPL is what the
    // sensor reads: powercap, or the perf `power` PMU's energy-pkg event
    // (some VMs of this kind have the PMU with energy-psys only).
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let rapl = Path::new("/sys/class/powercap/intel-rapl:0/energy_uj").exists()
        || Path::new("/sys/bus/event_source/devices/power/events/energy-pkg").exists();
    assert_eq!(summary["energy_is_estimate"], !rapl, "{summary}");
    let power: Vec<(f64, f64)> = rows
        .iter()
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            let w = c[12]
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("no power_w in {l}"));
            (c[2].parse::<f64>().unwrap(), w)
        })
        .collect();
    assert!(
        power.iter().all(|(_, w)| w.is_finite() && *w >= 0.0),
        "{power:?}"
    );
    let positive = power.iter().filter(|(_, w)| *w > 0.0).count();
    assert!(
        positive * 10 >= power.len() * 9,
        "power_w > 0 in {positive} of {} rows under load",
        power.len()
    );
    let mut by_load = power.clone();
    by_load.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    let q = by_load.len() / 4;
    let mean = |v: &[(f64, f64)]| v.iter().map(|p| p.1).sum::<f64>() / v.len() as f64;
    let (low, high) = (mean(&by_load[..q]), mean(&by_load[by_load.len() - q..]));
    eprintln!("power: {low:.2} W at the lowest quarter of the load, {high:.2} W at the highest");
    assert!(high > low, "more load, more power: {low} W vs {high} W");
    let app_j = summary["apps"]["search"]["energy_j"].as_f64().unwrap();
    let node_j = summary["total"]["energy_j"].as_f64().unwrap();
    assert!(
        app_j > 0.0 && app_j < node_j,
        "app {app_j} J, node {node_j} J"
    );
    assert!(err.contains("power: model (an ESTIMATE") || rapl, "{err}");
}

/// A real replay runs beside a `qosd run` daemon: it journals to its own
/// state file (<out>/state.json), not the daemon's; pointed at the
/// daemon's it stops at once (exit 1, naming the file); SIGKILLed, its
/// state file is left and `qosd restore --state-file` puts its cpuset
/// group back, while the daemon keeps its own app managed throughout.
#[test]
fn real_replay_beside_a_daemon_uses_its_own_state_file() {
    let _one_at_a_time = real_replay_lock();
    let t = tempfile::tempdir().unwrap();
    // The daemon, managing a sleeper, journalling to its own state file.
    let sleeper = Killed::sleeper(300);
    let spid = sleeper.pid();
    let ddir = t.path().join("daemon");
    std::fs::create_dir_all(&ddir).unwrap();
    let port = free_port();
    let dname = format!("beside-daemon-{spid}");
    let cfg = write_config(
        &ddir,
        port,
        &[AppSpec {
            name: &dname,
            matcher: format!("{{ pid: {spid} }}"),
            target_us: Some(10_000.0),
            feedback: "client",
            // Pinned (quota too: PARTIES would give an idle app's quota
            // back), so that the daemon's state file stays as it is.
            resources: "{ initial: { nr_cores: 1 }, min: { nr_cores: 1, cpu_quota_milli: 1000 }, max: { nr_cores: 1 } }",
        }],
    );
    let daemon = Daemon::start(&cfg, port, &[]);
    let dgroup = format!("/sys/fs/cgroup/cpuset/qosd-{dname}");
    assert!(
        wait_for(std::time::Duration::from_secs(10), || cgroups(spid)
            .contains(&format!("qosd-{dname}"))),
        "the daemon did not put the sleeper in {dgroup}: {}",
        cgroups(spid)
    );
    let dstate = ddir.join("state.json");
    let dstate_before = std::fs::read(&dstate).expect("the daemon's state file");

    // The same app name as the daemon's: the replay's groups are its own.
    let app = dname.clone();
    let sc = fixture_scenario(t.path(), &app, 0.2, 4);
    let cal = t.path().join("cal.json");
    calibrate(&sc, &cal);
    let replay = |out: &Path, extra: &[&str]| {
        let mut a = vec![
            "replay",
            sc.to_str().unwrap(),
            "--policy",
            "static",
            "--calibration",
            cal.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };

    // Pointed at the daemon's state file: refused before anything starts.
    let o = qosd(&replay(
        &t.path().join("clash"),
        &["--state-file", dstate.to_str().unwrap()],
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("locked by another running qosd") && err.contains(dstate.to_str().unwrap()),
        "{err}"
    );
    assert!(!err.contains("started "), "no server started: {err}");

    // Its own state file: the whole replay runs beside the daemon.
    let out = t.path().join("run");
    let o = qosd(&replay(&out, &[]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let own = out.join("state.json");
    assert!(
        err.contains(&format!("qosd restore --state-file {}", own.display())),
        "{err}"
    );
    assert!(err.contains("knobs: cores"), "{err}");
    assert!(!own.exists(), "everything put back: no state left");
    assert!(!out.join("state.lock").exists(), "no lock file left");
    assert!(out.join("timeline.csv").is_file());

    // SIGKILLed mid-run: its state file stays; `qosd restore` undoes it.
    let killed = t.path().join("killed");
    let mut child = Command::new(QOSD)
        .current_dir(repo())
        .args(replay(&killed, &["--duration", "60"]))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let kstate = killed.join("state.json");
    let in_force = wait_for(std::time::Duration::from_secs(30), || {
        kstate.exists() && replay_group(&app).is_some()
    });
    let group = replay_group(&app).unwrap_or_default();
    child.kill().unwrap();
    let ko = child.wait_with_output().unwrap();
    let kerr = String::from_utf8_lossy(&ko.stderr);
    assert!(in_force, "the replay's cores never in force: {kerr}");
    // Its server died with it (parent-death signal): no port or CPU held.
    let server = started_pid(&kerr);
    let gone = wait_for(std::time::Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{server}/stat"))
            .map_or(true, |st| st.contains(") Z"))
    });
    assert!(gone, "server {server} outlived the SIGKILLed replay");
    let o = qosd(&["restore", "--state-file", kstate.to_str().unwrap()]);
    let rout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{rout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(rout.contains("restored "), "{rout}");
    assert!(!kstate.exists(), "state file consumed by the restore");
    assert!(!group.exists(), "{} put back", group.display());

    // The daemon ran on untouched: alive, its app still in its group, its
    // state file as it was.
    assert!(cgroups(spid).contains(&format!("qosd-{dname}")));
    assert_eq!(std::fs::read(&dstate).unwrap(), dstate_before);
    let (st, dout) = daemon.stop();
    assert!(st.success(), "qosd run: {st}; {dout:?}");
    drop(sleeper);
}

/// A real replay gives rule policies the app's CPU utilisation (its CPU
/// time over the CPUs it holds): under cpu-util.yaml, with a target far
/// away (so only the utilisation rules move it), a server that starts on
/// both cores (its even share) gives one back while quiet (`quiet`) and is
/// given it again once kept busy on the one it has left (`busy`). The busy
/// step is 0.9 of the capacity calibrated on both CPUs (the server's
/// completion rate with a backlog, `calibrate::capacity`): ~1.8 CPUs of
/// work on the one left; at 0.7 the one CPU's utilisation stayed under the
/// rule's 0.8 in 2 of 4 runs on a loaded machine.
#[test]
fn real_replay_feeds_cpu_utilisation_to_rule_policies() {
    let _one_at_a_time = real_replay_lock();
    let t = tempfile::tempdir().unwrap();
    let sc = t.path().join("utilapp.yaml");
    std::fs::write(
        &sc,
        "name: utilapp\nduration_s: 14\ninterval_ms: 500\nfeedback: client\napps:\n  \
         - name: utilapp\n    class: lc\n    server:\n      kind: fixture\n      work_us: 500\n    \
         protocol: http\n    connections: 4\n    target:\n      ms: 100000\n    load:\n      \
         kind: steps\n      steps:\n        - { at_s: 0, level: 0.1 }\n        \
         - { at_s: 6, level: 0.9 }\n",
    )
    .unwrap();
    let cal = t.path().join("cal.json");
    calibrate(&sc, &cal);
    let out = t.path().join("run");
    ok(&[
        "replay",
        sc.to_str().unwrap(),
        "--policy",
        "policies/cpu-util.yaml",
        "--calibration",
        cal.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(out.join("timeline.csv")).unwrap();
    let cores: Vec<u32> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(8).unwrap().parse().unwrap())
        .collect();
    let nr_cpus = std::thread::available_parallelism().unwrap().get() as u32;
    assert_eq!(
        cores.first(),
        Some(&nr_cpus),
        "starts on every core: {cores:?}"
    );
    let low = cores.iter().position(|&c| c < nr_cpus);
    assert!(low.is_some(), "quiet, never gave a core back: {cores:?}");
    assert!(
        cores[low.unwrap()..].contains(&nr_cpus),
        "busy on fewer cores, never given one back: {cores:?}"
    );
}
