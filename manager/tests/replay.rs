//! `qosd replay`, `compare`, `calibrate` and `load` as a user runs them.
//! The sim tests are fast; `real_replay_*` starts real servers (run alone
//! with `cargo test -p qosd-manager --test replay real_`).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{cgroups, free_port, qosd_in_repo as qosd, repo, wait_for, write_config};
use support::{AppSpec, Daemon, Killed, QOSD};

fn ok(args: &[&str]) -> String {
    let o = qosd(args);
    assert!(
        o.status.success(),
        "qosd {args:?}: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Real replays share this machine's CPUs and measure latency and CPU use
/// on them: one at a time, or one would starve the other's server.
static REAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn real_replay_lock() -> std::sync::MutexGuard<'static, ()> {
    REAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn sim_replay_writes_every_output_and_is_deterministic() {
    let t = tempfile::tempdir().unwrap();
    let (a, b, c) = (t.path().join("a"), t.path().join("b"), t.path().join("c"));
    for (dir, seed) in [(&a, "5"), (&b, "5"), (&c, "6")] {
        ok(&[
            "replay",
            "scenarios/ramp.yaml",
            "--sim",
            "--seed",
            seed,
            "--out",
            dir.to_str().unwrap(),
        ]);
    }
    for f in [
        "timeline.csv",
        "summary.json",
        "calibration.json",
        "timeline.svg",
        "timeline.png",
    ] {
        let len = std::fs::metadata(a.join(f)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 100, "{f} written ({len} bytes)");
    }
    let csv = |d: &Path| std::fs::read(d.join("timeline.csv")).unwrap();
    assert_eq!(csv(&a), csv(&b), "same seed: byte-identical timeline.csv");
    assert_ne!(csv(&a), csv(&c), "another seed: another timeline");
    let text = String::from_utf8(csv(&a)).unwrap();
    assert_eq!(
        text.lines().next().unwrap(),
        "t_s,app,offered_rps,achieved_rps,client_p99_ms,ebpf_p99_ms,target_ms,violation,cores,freq_mhz,llc_ways,mb_percent,power_w"
    );
    // mb_percent is empty: the simulated node has no memory-bandwidth knob.
    assert!(
        text.lines().nth(1).unwrap().contains(",,"),
        "{}",
        text.lines().nth(1).unwrap()
    );
    let s = summary(&a);
    assert_eq!(s["energy_is_estimate"], true);
    for k in [
        "violation_fraction",
        "core_seconds",
        "mean_cores",
        "energy_j",
        "p99_max_ms",
        "time_to_recover_s",
    ] {
        assert!(!s["apps"]["search"][k].is_null(), "{k}");
        assert!(!s["total"][k].is_null(), "{k}");
    }
}

/// Violations of the search app while its load is at most 80 % of capacity
/// (outside the saturated top of the ramp), from a timeline.
fn violations_below(dir: &Path, capacity: f64, frac: f64) -> f64 {
    let text = std::fs::read_to_string(dir.join("timeline.csv")).unwrap();
    let rows: Vec<Vec<String>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect();
    let sel: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| r[1] == "search" && r[2].parse::<f64>().unwrap() <= frac * capacity)
        .collect();
    sel.iter().filter(|r| r[7] == "1").count() as f64 / sel.len() as f64
}

#[test]
fn parties_on_the_sim_ramp_meets_targets_with_fewer_cores_than_static() {
    let t = tempfile::tempdir().unwrap();
    let (p, s) = (t.path().join("parties"), t.path().join("static"));
    ok(&[
        "replay",
        "scenarios/ramp.yaml",
        "--sim",
        "--out",
        p.to_str().unwrap(),
    ]);
    ok(&[
        "replay",
        "scenarios/ramp.yaml",
        "--sim",
        "--policy",
        "static",
        "--out",
        s.to_str().unwrap(),
    ]);
    let cal: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p.join("calibration.json")).unwrap())
            .unwrap();
    let cap = cal["apps"]["search"]["capacity_rps"].as_f64().unwrap();
    let (sp, ss) = (summary(&p), summary(&s));
    let core_s = |v: &serde_json::Value| v["total"]["core_seconds"].as_f64().unwrap();
    let (vp, vs) = (
        violations_below(&p, cap, 0.8),
        violations_below(&s, cap, 0.8),
    );
    println!(
        "PARTIES: {:.0} core·s, search violations at <= 80% load {:.1}%, overall {:.1}%; static: {:.0} core·s, {:.1}%, {:.1}%",
        core_s(&sp),
        vp * 100.0,
        sp["apps"]["search"]["violation_fraction"].as_f64().unwrap() * 100.0,
        core_s(&ss),
        vs * 100.0,
        ss["apps"]["search"]["violation_fraction"].as_f64().unwrap() * 100.0
    );
    assert!(
        core_s(&sp) < core_s(&ss),
        "PARTIES uses fewer core·s than the static split"
    );
    assert!(
        vp < 0.08,
        "PARTIES keeps violations low outside the saturated peak: {vp}"
    );
    assert!(vp < vs, "and lower than the static split: {vp} vs {vs}");
}

#[test]
fn compare_feedback_sources() {
    let t = tempfile::tempdir().unwrap();
    let (e, c) = (t.path().join("ebpf"), t.path().join("client"));
    ok(&[
        "replay",
        "scenarios/spike.yaml",
        "--sim",
        "--out",
        e.to_str().unwrap(),
    ]);
    ok(&[
        "replay",
        "scenarios/spike.yaml",
        "--sim",
        "--feedback",
        "client",
        "--out",
        c.to_str().unwrap(),
    ]);
    assert_eq!(summary(&c)["feedback"], "client");
    let out = ok(&[
        "compare",
        e.to_str().unwrap(),
        c.to_str().unwrap(),
        "--out",
        t.path().to_str().unwrap(),
    ]);
    assert!(
        out.contains("spike sim ebpf parties") && out.contains("spike sim client parties"),
        "{out}"
    );
    assert!(
        std::fs::metadata(t.path().join("compare.png"))
            .unwrap()
            .len()
            > 1000
    );
    assert!(
        std::fs::metadata(t.path().join("compare.svg"))
            .unwrap()
            .len()
            > 1000
    );
}

#[test]
fn duration_compresses_the_scenario() {
    let t = tempfile::tempdir().unwrap();
    ok(&[
        "replay",
        "scenarios/ramp.yaml",
        "--sim",
        "--duration",
        "30",
        "--out",
        t.path().to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(t.path().join("timeline.csv")).unwrap();
    assert_eq!(text.lines().count(), 1 + 60 * 2);
    // The whole ramp is there: up to 100 % and back.
    let peak = text
        .lines()
        .skip(1)
        .filter(|l| l.contains(",search,"))
        .map(|l| l.split(',').nth(2).unwrap().parse::<f64>().unwrap())
        .fold(0.0, f64::max);
    assert!(peak > 15_000.0, "{peak}");
}

#[test]
fn usage_errors_exit_2_and_name_the_problem() {
    let t = tempfile::tempdir().unwrap();
    let bad = t.path().join("bad.yaml");
    std::fs::write(&bad, "name: x\nduration_s: -1\napps: []\n").unwrap();
    let o = qosd(&["replay", bad.to_str().unwrap(), "--sim"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.yaml:2:1: duration_s"), "{err}");
    let o = qosd(&[
        "load",
        "--target",
        "192.0.2.1:80",
        "--protocol",
        "http",
        "--rps",
        "10",
        "--duration",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a loopback address"));
    let o = qosd(&[
        "replay",
        "scenarios/ramp.yaml",
        "--sim",
        "--policy",
        "/nonexistent.yaml",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent.yaml"));
    let o = qosd(&["compare", t.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
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
    calibrate(&sc, &cal);
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
    let both: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            Some((c[4].parse().ok()?, c[5].parse().ok()?))
        })
        .collect();
    assert!(
        both.len() * 10 >= rows.len() * 9,
        "eBPF p99 in {} of {} rows",
        both.len(),
        rows.len()
    );
    let client_above = both.iter().filter(|(c, e)| c >= e).count();
    assert!(
        client_above * 10 >= both.len() * 8,
        "client >= eBPF in {client_above} of {}",
        both.len()
    );
    assert!(out.join("timeline.png").is_file() && out.join("plans.jsonl").is_file());
    // The plans were put in force on the cores knob this machine has, and
    // everything was put back at the end.
    assert!(
        rows.iter()
            .all(|l| l.split(',').nth(8).is_some_and(|c| c == "1")),
        "cores in every row: {rows:?}"
    );
    assert!(err.contains("knobs: cores"), "{err}");
    assert_eq!(
        replay_group("search"),
        None,
        "replay left its cpuset group behind"
    );
    // Power from the power sensor: every row has the server's power, it
    // grows with the load, the app's energy is within the node's, and it
    // is flagged an estimate on a machine without RAPL (this one).
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let rapl = Path::new("/sys/class/powercap/intel-rapl:0/energy_uj").exists()
        || Path::new("/sys/bus/event_source/devices/power").exists();
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

/// A one-app fixture scenario named `app`, constant at `level` of capacity.
fn fixture_scenario(dir: &Path, app: &str, level: f64, duration_s: u32) -> PathBuf {
    let sc = dir.join(format!("{app}.yaml"));
    std::fs::write(
        &sc,
        format!(
            "name: {app}\nduration_s: {duration_s}\ninterval_ms: 500\nfeedback: client\napps:\n  \
             - name: {app}\n    class: lc\n    server:\n      kind: fixture\n      work_us: 500\n    \
             protocol: http\n    connections: 4\n    target:\n      knee_factor: 1.0\n    load:\n      \
             kind: constant\n      level: {level}\n"
        ),
    )
    .unwrap();
    sc
}

/// `qosd calibrate` of a scenario, quickly (0.5 s steps).
fn calibrate(sc: &Path, out: &Path) {
    let o = qosd(&[
        "calibrate",
        sc.to_str().unwrap(),
        "--step-s",
        "0.5",
        "--max-rps",
        "20000",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A replay's cpuset group of `app`, `qosd-replay<PID>-<app>`, if one exists.
fn replay_group(app: &str) -> Option<PathBuf> {
    let suffix = format!("-{app}");
    std::fs::read_dir("/sys/fs/cgroup/cpuset")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let n = p.file_name().unwrap_or_default().to_string_lossy();
            n.starts_with("qosd-replay") && n.ends_with(&suffix)
        })
}

/// The pid in a "started APP (ADDR, pid N)" line.
fn started_pid(stderr: &str) -> u32 {
    stderr
        .split("pid ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no server pid in {stderr}"))
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
            resources: "{ initial: { nr_cores: 1 }, min: { nr_cores: 1 }, max: { nr_cores: 1 } }",
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
/// away (so only the `busy` rule can grow it), a server kept busy on its one
/// core is given the second.
#[test]
fn real_replay_feeds_cpu_utilisation_to_rule_policies() {
    let _one_at_a_time = real_replay_lock();
    let t = tempfile::tempdir().unwrap();
    let sc = t.path().join("utilapp.yaml");
    std::fs::write(
        &sc,
        "name: utilapp\nduration_s: 8\ninterval_ms: 500\nfeedback: client\napps:\n  \
         - name: utilapp\n    class: lc\n    server:\n      kind: fixture\n      work_us: 500\n    \
         protocol: http\n    connections: 4\n    target:\n      ms: 100000\n    load:\n      \
         kind: constant\n      level: 0.7\n",
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
    assert_eq!(cores.first(), Some(&1), "starts on one core: {cores:?}");
    assert!(
        cores.contains(&2),
        "busy on one core, never given the second: {cores:?}"
    );
}
