//! Sim models fitted to a machine, as a user runs them: `qosd calibrate
//! --model` on a real batch job (its quota in a real cgroup, put back at
//! the end), `qosd check` on a model file (exit 0; exit 2 with
//! FILE:LINE:COL: KEY), and `qosd replay --sim --model` with a best-effort
//! app filling `be_ops_per_s`. Root (the calibration moves a real quota).

mod support;

use std::path::Path;

use qosd_scenarios::sim::fitted::ModelFile;
use support::{qosd, text};

const SCENARIO: &str = "name: fitme
duration_s: 20
policy: POLICY
node: {nr_cores: 2, freq_min_mhz: 3000, freq_max_mhz: 3000, nr_ways: 0}
apps:
  - name: search
    class: lc
    server: {kind: fixture, work_us: 500}
    protocol: http
    target: {ms: 20}
    load: {kind: ramp, from: 0.1, to: 0.8, start_s: 2, over_s: 8, hold_s: 2, back_s: 8}
  - name: batch
    class: be
    job: {kind: hash, threads: 2, op_kib: 16}
";

fn scenario(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("fitme.yaml");
    let policy = support::repo().join("policies/parties.yaml");
    std::fs::write(
        &p,
        SCENARIO.replace("POLICY", &policy.display().to_string()),
    )
    .unwrap();
    p
}

/// A batch job fitted on this machine: ops per CPU-second from its own
/// count and CPU time, at 1 CPU, 2 CPUs and 0.5 CPU of quota. The quota is
/// a hard ceiling, so the job can never beat the model there by much;
/// the quota is put back (the state file is gone).
#[test]
fn calibrate_model_fits_a_real_batch_job() {
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(dir.path());
    let model = dir.path().join("model.yaml");
    let out = qosd(&[
        "calibrate".as_ref(),
        sc.as_os_str(),
        "--app".as_ref(),
        "batch".as_ref(),
        "--model".as_ref(),
        model.as_os_str(),
        "--step-s".as_ref(),
        "1".as_ref(),
        "--resources".as_ref(),
        "cpu_quota".as_ref(),
    ]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}\n{}", text(&out.stdout));
    let m = ModelFile::from_file(&model).unwrap();
    assert!(m.node.shared_cpus, "no cores in --resources: shared CPUs");
    assert_eq!(m.node.quota_step_milli, 100);
    let rate = m.apps["batch"].ops_per_cpu_s.unwrap();
    assert!(rate > 100.0, "{rate} ops per CPU-second");
    assert_eq!(m.apps["batch"].parallelism, Some(2));
    let checks = &m.checks["batch"];
    assert_eq!(checks.len(), 3, "{checks:?}");
    let half = checks.iter().find(|c| c.quota_milli == 500).unwrap();
    assert!(
        half.measured <= 1.25 * half.model,
        "0.5 CPU of quota: {} ops/s measured, {} modelled",
        half.measured,
        half.model
    );
    assert!(
        !model.with_extension("state.json").exists(),
        "every knob put back: {err}"
    );
    let out = qosd(&["check".as_ref(), model.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("sim model: 2 CPUs, app(s) batch"));
}

#[test]
fn check_locates_errors_in_a_model_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.yaml");
    std::fs::write(
        &p,
        "node: {nr_cores: 2, quota_step_milli: 100}\napps:\n  search: {service_us: 800, parallelism: 0}\n",
    )
    .unwrap();
    let out = qosd(&["check".as_ref(), p.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("m.yaml:3:29: apps.search.parallelism: must be >= 1"),
        "{err}"
    );
    // --model names the file too, and changes nothing: exit 2.
    let sc = scenario(dir.path());
    let out = qosd(&[
        "replay".as_ref(),
        sc.as_os_str(),
        "--sim".as_ref(),
        "--model".as_ref(),
        p.as_os_str(),
        "--out".as_ref(),
        dir.path().join("out").as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("m.yaml:3:29"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.path().join("out").exists());
}

/// The sim with a fitted model: the node of the file (2 shared CPUs, a
/// quota knob), PARTIES moving quota, the job's ops/s in every one of its
/// rows and falling while search holds more quota.
#[test]
fn replay_sim_model_runs_a_batch_job() {
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(dir.path());
    let model = dir.path().join("model.yaml");
    std::fs::write(
        &model,
        "node: {nr_cores: 2, freq_min_mhz: 3000, freq_max_mhz: 3000, nr_ways: 0, shared_cpus: true, quota_step_milli: 100}\napps:\n  search: {service_us: 500, service_cv: 0.3, parallelism: 8, network_ms: 0.1}\n  batch: {parallelism: 2, ops_per_cpu_s: 50000}\n",
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let out = qosd(&[
        "replay".as_ref(),
        sc.as_os_str(),
        "--sim".as_ref(),
        "--model".as_ref(),
        model.as_os_str(),
        "--out".as_ref(),
        out_dir.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("2 shared CPUs"),
        "{}",
        text(&out.stdout)
    );
    let csv = std::fs::read_to_string(out_dir.join("timeline.csv")).unwrap();
    let head: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = |k: &str| head.iter().position(|h| *h == k).unwrap();
    let (ops_c, quota_c) = (col("be_ops_per_s"), col("cpu_quota_milli"));
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .filter(|r: &Vec<&str>| r[1] == "batch")
        .collect();
    assert_eq!(rows.len(), 40);
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r[quota_c].parse().unwrap(), r[ops_c].parse().unwrap()))
        .collect();
    // ops/s = CPUs it may use (its quota, here below what search leaves)
    // x 50 000.
    for (q, ops) in &pts {
        assert!(
            *ops <= q / 1000.0 * 50_000.0 + 1.0,
            "{q} m-CPU: {ops} ops/s"
        );
    }
    let qs: Vec<f64> = pts.iter().map(|p| p.0).collect();
    let (lo, hi) = (
        qs.iter().cloned().fold(f64::MAX, f64::min),
        qs.iter().cloned().fold(0.0, f64::max),
    );
    assert!(lo < hi, "PARTIES moved the job's quota: {qs:?}");
    let at = |q: f64| pts.iter().find(|p| p.0 == q).unwrap().1;
    assert!(at(lo) < at(hi), "fewer ops/s with less quota: {pts:?}");
}
