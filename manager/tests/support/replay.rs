//! Helpers of the replay tests (`replay`, `replay_sim_policies`,
//! `replay_real`, `grpc_replay`): a successful `qosd` run, quick
//! calibration, one-app scenarios, the replay's server pid and cpuset
//! group, timeline rows and the summary.

use std::path::{Path, PathBuf};

use super::qosd_in_repo as qosd;

/// `qosd ARGS...` from the repo root, which must succeed: its stdout.
pub fn replay_ok(args: &[&str]) -> String {
    let o = qosd(args);
    assert!(
        o.status.success(),
        "qosd {args:?}: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A replay's `summary.json`.
pub fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// A one-app fixture scenario named `app`, constant at `level` of capacity.
pub fn fixture_scenario(dir: &Path, app: &str, level: f64, duration_s: u32) -> PathBuf {
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
pub fn calibrate(sc: &Path, out: &Path) {
    calibrate_with(sc, out, &[]);
}

/// [`calibrate`] with more of `qosd calibrate`'s flags.
pub fn calibrate_with(sc: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "calibrate",
        sc.to_str().unwrap(),
        "--step-s",
        "0.5",
        "--max-rps",
        "20000",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = qosd(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A replay's cpuset group of `app`, `qosd-replay<PID>-<app>`, if one exists.
pub fn replay_group(app: &str) -> Option<PathBuf> {
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
pub fn started_pid(stderr: &str) -> u32 {
    stderr
        .split("pid ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no server pid in {stderr}"))
}

/// Every `timeline.csv` row (all apps) in a replay's output folder, split
/// into columns.
pub fn timeline(dir: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(dir.join("timeline.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_owned).collect::<Vec<_>>())
        .collect()
}

/// The `timeline.csv` rows of `app` in a replay's output folder.
pub fn timeline_rows(dir: &Path, app: &str) -> Vec<Vec<String>> {
    let mut rows = timeline(dir);
    rows.retain(|c| c[1] == app);
    rows
}

/// Server-side p99 from eBPF (column 5) beside the client's (column 4):
/// present in at least 90 % of the rows, and the client's (which adds the
/// loopback and its own scheduling to the same requests) not below it in
/// at least 80 %. Both sides file a request into the interval it ended
/// in, on one clock (`FILE_LAG_MS` in node/sensing/meter.rs).
pub fn assert_ebpf_p99_beside_client<S: AsRef<str>>(rows: &[Vec<S>]) {
    let both: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|c| Some((c[4].as_ref().parse().ok()?, c[5].as_ref().parse().ok()?)))
        .collect();
    assert!(
        both.len() * 10 >= rows.len() * 9,
        "eBPF p99 in {} of {} rows",
        both.len(),
        rows.len()
    );
    let client_above = both.iter().filter(|(c, e)| c >= e).count();
    eprintln!(
        "client >= eBPF in {client_above} of {} intervals",
        both.len()
    );
    // 70 % from 2026-11-26 until both sides filed requests by one clock:
    // they had put a request into an interval by when each learnt of it,
    // and a stall's burst on a boundary landed in different intervals.
    assert!(
        client_above * 10 >= both.len() * 8,
        "client >= eBPF in {client_above} of {}",
        both.len()
    );
}
