//! `qosd replay`, `compare`, `calibrate` and `load` as a user runs them, on
//! the simulated node (fast). Real replays are in `replay_real.rs`.

mod support;

use std::path::Path;

use support::qosd_in_repo as qosd;
use support::replay::{replay_ok as ok, summary};

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
        "t_s,app,offered_rps,achieved_rps,client_p99_ms,ebpf_p99_ms,target_ms,violation,cores,freq_mhz,llc_ways,mb_percent,power_w,ebpf_target_ms,fed_violation,cpu_quota_milli,be_ops_per_s,client_slack,ebpf_slack,ebpf_target_from,util,headroom,demand_ms,x_sat_rps"
    );
    // Operational analysis per row where the app served requests: the
    // laws hold between the columns (U = X / X_sat, headroom = 1 − U).
    let mut checked = 0;
    for l in text.lines().skip(1) {
        let c: Vec<&str> = l.split(',').collect();
        let v = |i: usize| c[i].parse::<f64>().ok();
        let (Some(x), Some(u), Some(h), Some(d), Some(xs)) = (v(3), v(20), v(21), v(22), v(23))
        else {
            continue;
        };
        assert!(d > 0.0 && xs > 0.0, "{l}");
        assert!((u + h - 1.0).abs() < 1e-3, "{l}");
        assert!((u * xs - x).abs() <= 0.01 * x + 0.2, "{l}");
        checked += 1;
    }
    assert!(checked > 10, "operational figures in {checked} rows");
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
    // --aggregate: a typo, and the simulator (no eBPF sensor to set).
    let o = qosd(&["replay", "scenarios/ramp.yaml", "--aggregate", "kernal"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("expected kernel or records"));
    let o = qosd(&[
        "replay",
        "scenarios/ramp.yaml",
        "--sim",
        "--aggregate",
        "kernel",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--aggregate: for real replays only"));
}

/// `--seeds N`: N sim runs (seeds 7, 8, 9) into seed-<S>/ and each
/// figure's mean and 95 % CI in seeds.json, matching the runs' summaries.
#[test]
fn seeds_runs_n_seeds_and_aggregates_them() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("s");
    let text = ok(&[
        "replay",
        "scenarios/ramp.yaml",
        "--sim",
        "--duration",
        "30",
        "--seed",
        "7",
        "--seeds",
        "3",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(text.contains("± "), "{text}");
    let agg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("seeds.json")).unwrap()).unwrap();
    assert_eq!(agg["seeds"], serde_json::json!([7, 8, 9]));
    let cores: Vec<f64> = [7, 8, 9]
        .iter()
        .map(|s| {
            summary(&out.join(format!("seed-{s}")))["total"]["core_seconds"]
                .as_f64()
                .unwrap()
        })
        .collect();
    let mean = cores.iter().sum::<f64>() / 3.0;
    let m = &agg["total"]["core_seconds"];
    assert!((m["mean"].as_f64().unwrap() - mean).abs() < 1e-6, "{m}");
    assert_eq!(m["n"], 3);
    assert!(m["ci95"].as_f64().unwrap() >= 0.0);
    // `qosd compare` on the seeds folder: the same mean ± CI per figure
    // (recomputed from the seeds' summaries), beside a single run.
    let one = out.join("seed-7");
    let table = ok(&[
        "compare",
        out.to_str().unwrap(),
        one.to_str().unwrap(),
        "--out",
        t.path().to_str().unwrap(),
    ]);
    let total: Vec<&str> = table.lines().filter(|l| l.contains(" total ")).collect();
    assert_eq!(total.len(), 2, "{table}");
    let pm = |v: &serde_json::Value, scale: f64, d: usize| {
        format!(
            "{:.d$} ± {:.d$}",
            v["mean"].as_f64().unwrap() * scale,
            v["ci95"].as_f64().unwrap() * scale
        )
    };
    let tot = &agg["total"];
    for cell in [
        pm(&tot["core_seconds"], 1.0, 0),
        pm(&tot["violation_fraction"], 100.0, 1),
        pm(&tot["mean_cores"], 1.0, 2),
        pm(&agg["oracle_ratio"], 1.0, 2),
    ] {
        assert!(total[0].contains(&cell), "{cell} in {table}");
    }
    // "ramp sim ebpf parties total 3 ...": the runs column.
    assert_eq!(total[0].split_whitespace().nth(5), Some("3"), "{table}");
    assert_eq!(total[1].split_whitespace().nth(5), Some("1"), "{table}");
    // The single run: its own figures, no interval.
    let s7 = summary(&one);
    let c7 = format!("{:.0}", s7["total"]["core_seconds"].as_f64().unwrap());
    assert!(total[1].contains(&c7) && !total[1].contains('±'), "{table}");
}
