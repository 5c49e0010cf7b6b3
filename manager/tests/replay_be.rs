//! Real replays with a best-effort batch job (root, real cgroups): the job
//! runs in its app's CPU-quota group, its throughput fills `be_ops_per_s`,
//! its CPU follows the quota the policy moves, the static baseline changes
//! nothing, and the job and its group are gone afterwards. Run alone:
//! `cargo test --release -p qosd-manager --test replay_be`.

mod support;

use std::path::{Path, PathBuf};

use support::qosd_in_repo as qosd;
use support::replay::timeline_rows;

/// Real replays share this machine's CPUs: one at a time.
static REAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// search (the fixture at a light constant load) beside a 2-thread batch
/// job, the knob CPU quota only (the apps share every CPU, quota is a
/// pool of the node's CPUs), `secs` long.
fn scenario(dir: &Path, secs: u32) -> PathBuf {
    let sc = dir.join("be.yaml");
    std::fs::write(
        &sc,
        format!(
            "name: be\nduration_s: {secs}\ninterval_ms: 500\nfeedback: client\n\
             resources: [cpu_quota]\napps:\n  \
             - name: search\n    class: lc\n    server:\n      kind: fixture\n      work_us: 200\n    \
             protocol: http\n    connections: 2\n    target:\n      ms: 200\n    load:\n      \
             kind: constant\n      level: 0.2\n  \
             - name: batch\n    class: be\n    job:\n      kind: hash\n      threads: 2\n"
        ),
    )
    .unwrap();
    // A calibration by hand (the job has none): search's capacity only
    // sets its load (100 requests/s of 0.2 ms).
    std::fs::write(
        dir.join("cal.json"),
        r#"{"source": "test", "apps": {"search": {"capacity_rps": 500, "knee_rps": 250,
            "knee_latency_us": 1000, "base_latency_us": 500, "percentile": 99, "points": []}}}"#,
    )
    .unwrap();
    sc
}

fn replay(sc: &Path, out: &Path, policy: &str) -> String {
    let dir = sc.parent().unwrap();
    let o = qosd(&[
        "replay",
        sc.to_str().unwrap(),
        "--policy",
        policy,
        "--calibration",
        dir.join("cal.json").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        o.status.success(),
        "{err}\n{}",
        String::from_utf8_lossy(&o.stdout)
    );
    err
}

/// The pid in "started batch (batch job, pid N)".
fn job_pid(stderr: &str) -> u32 {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("started batch (batch job, pid "))
        .and_then(|s| s.trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("no batch job pid in {stderr}"))
}

fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z"))
}

/// A replay's group for `app` left in the v1 `cpu` hierarchy, if any.
fn quota_group(app: &str) -> Option<PathBuf> {
    let suffix = format!("-{app}");
    std::fs::read_dir("/sys/fs/cgroup/cpu")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let n = p.file_name().unwrap_or_default().to_string_lossy();
            n.starts_with("qosd-replay") && n.ends_with(&suffix)
        })
}

fn col(r: &[String], i: usize) -> Option<f64> {
    r[i].parse().ok()
}

/// The batch job's throughput is in every row, its CPU time stays within
/// the quota in force, and the static split keeps every allocation.
#[test]
fn static_baseline_runs_the_job_within_its_quota_and_changes_nothing() {
    let _one = REAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = tempfile::tempdir().unwrap();
    let sc = scenario(t.path(), 8);
    let out = t.path().join("static");
    let err = replay(&sc, &out, "static");
    assert!(err.contains("knobs: cpu_quota"), "{err}");
    let pid = job_pid(&err);
    assert!(gone(pid), "batch job {pid} still running after the replay");
    assert_eq!(quota_group("batch"), None, "quota group left behind");
    let be = timeline_rows(&out, "batch");
    let lc = timeline_rows(&out, "search");
    assert!(be.len() >= 14, "{} rows", be.len());
    // Columns: 15 cpu_quota_milli, 16 be_ops_per_s. The even split of 2
    // shared CPUs in 0.1-CPU units: 1.0 CPU each, all along.
    let quota = std::thread::available_parallelism().unwrap().get() as f64 * 1000.0 / 2.0;
    for r in be.iter().chain(&lc) {
        assert_eq!(col(r, 15), Some(quota), "quota kept: {r:?}");
    }
    assert!(
        be.iter().all(|r| col(r, 16).is_some_and(|v| v > 0.0)),
        "ops/s in every batch row: {be:?}"
    );
    assert!(lc.iter().all(|r| r[16].is_empty()), "no ops/s for search");
    // The static policy never changed anything: no plan was applied.
    let plans = std::fs::read_to_string(out.join("plans.jsonl")).unwrap();
    assert!(plans.lines().count() >= 14);
    assert!(
        plans.lines().all(|l| l.contains("\"applied\":null")),
        "{plans}"
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert!(s["apps"]["batch"]["be_ops_per_s_mean"].as_f64().unwrap() > 0.0);
    // Two threads would take up to every CPU; the quota holds them to 1.0
    // (CFS bandwidth is enforced per period: a little slack).
    let used = s["meta"]["be_cpus_used"]["batch"].as_f64().unwrap();
    assert!(
        used > 0.0 && used <= quota / 1000.0 * 1.1 + 0.05,
        "batch used {used} CPUs under a {quota} m-CPU quota"
    );
    assert_eq!(s["meta"]["resources"], serde_json::json!(["cpu_quota"]));
}

/// A rule policy takes the job's quota away one unit per second: its
/// throughput falls with it, and its CPU time stays within the quota.
#[test]
fn batch_throughput_follows_the_quota_the_policy_moves() {
    let _one = REAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = tempfile::tempdir().unwrap();
    let sc = scenario(t.path(), 14);
    let policy = t.path().join("shrink.yaml");
    std::fs::write(
        &policy,
        "name: shrink-be\nsettings: { max_actions: 1, victims: [free_pool] }\nrules:\n  \
         - name: take-from-the-job\n    class: be\n    when: [\"rps < 1\"]\n    \
         then:\n      - { resource: cpu_quota, change: -1 }\n    cooldown_ms: 1000\n",
    )
    .unwrap();
    let out = t.path().join("shrink");
    let err = replay(&sc, &out, policy.to_str().unwrap());
    assert!(gone(job_pid(&err)), "batch job still running");
    assert_eq!(quota_group("batch"), None, "quota group left behind");
    let be = timeline_rows(&out, "batch");
    let pts: Vec<(f64, f64)> = be
        .iter()
        .filter_map(|r| Some((col(r, 15)?, col(r, 16)?)))
        .collect();
    assert!(pts.len() * 10 >= be.len() * 9, "{be:?}");
    let q: Vec<f64> = pts.iter().map(|p| p.0).collect();
    assert!(
        q.windows(2).all(|w| w[1] <= w[0]),
        "quota only falls: {q:?}"
    );
    assert!(q[0] >= 900.0 && q[q.len() - 1] <= 300.0, "{q:?}");
    let mean = |lo: f64, hi: f64| {
        let v: Vec<f64> = pts
            .iter()
            .filter(|p| p.0 >= lo && p.0 <= hi)
            .map(|p| p.1)
            .collect();
        assert!(
            !v.is_empty(),
            "no interval with quota in {lo}..={hi}: {q:?}"
        );
        v.iter().sum::<f64>() / v.len() as f64
    };
    let (high, low) = (mean(700.0, 1000.0), mean(0.0, 300.0));
    assert!(
        high > 2.0 * low,
        "ops/s {high:.0} at quota >= 0.7 CPU, {low:.0} at <= 0.3 CPU: {pts:?}"
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let used = s["meta"]["be_cpus_used"]["batch"].as_f64().unwrap();
    let mean_quota = q.iter().sum::<f64>() / q.len() as f64 / 1000.0;
    assert!(
        used <= mean_quota * 1.1 + 0.05,
        "batch used {used} CPUs, mean quota {mean_quota}"
    );
}
