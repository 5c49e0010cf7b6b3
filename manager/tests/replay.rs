//! `qosd replay`, `compare`, `calibrate` and `load` as a user runs them, on
//! the simulated node (fast). Real replays are in `replay_real.rs`.

mod support;

use std::path::Path;

use support::qosd_in_repo as qosd;

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

/// PARTIES on the sim ramp, over 5 seeds: where each app's resource
/// cycle starts is seeded, and some starts leave search short at the top
/// of the ramp (it takes cores first only in some), so the claim is about
/// the median run, not one lucky seed.
#[test]
fn parties_on_the_sim_ramp_meets_targets_with_fewer_cores_than_static() {
    let t = tempfile::tempdir().unwrap();
    let s = t.path().join("static");
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
        serde_json::from_str(&std::fs::read_to_string(s.join("calibration.json")).unwrap())
            .unwrap();
    let cap = cal["apps"]["search"]["capacity_rps"].as_f64().unwrap();
    let core_s = |v: &serde_json::Value| v["total"]["core_seconds"].as_f64().unwrap();
    let ss = summary(&s);
    let vs = violations_below(&s, cap, 0.8);
    let (mut vps, mut cores) = (Vec::new(), Vec::new());
    for seed in 0..5 {
        let p = t.path().join(format!("parties{seed}"));
        ok(&[
            "replay",
            "scenarios/ramp.yaml",
            "--sim",
            "--seed",
            &seed.to_string(),
            "--out",
            p.to_str().unwrap(),
        ]);
        let sp = summary(&p);
        vps.push(violations_below(&p, cap, 0.8));
        cores.push(core_s(&sp));
    }
    println!(
        "PARTIES per seed: {cores:?} core·s, search violations at <= 80% load {vps:?}; static: {:.0} core·s, {:.1}%",
        core_s(&ss),
        vs * 100.0,
    );
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (vp, cp) = (median(&vps), median(&cores));
    assert!(
        cp <= core_s(&ss) && cores.iter().sum::<f64>() < 5.0 * core_s(&ss),
        "PARTIES uses fewer core·s than the static split: {cores:?}"
    );
    assert!(
        vp < 0.08,
        "PARTIES keeps violations low outside the saturated peak (median): {vps:?}"
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

/// Search's mean cores over the last 60 s of the ramp (after it), and the
/// idle app's, per seed.
fn cores_after_ramp(dir: &Path, app: &str) -> f64 {
    let text = std::fs::read_to_string(dir.join("timeline.csv")).unwrap();
    let v: Vec<f64> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|c| c[1] == app && c[0].parse::<f64>().unwrap() > 240.0)
        .map(|c| c[8].parse::<f64>().unwrap())
        .collect();
    v.iter().sum::<f64>() / v.len() as f64
}

/// Downsize starvation (issue 13): a third latency-critical app that
/// serves nothing sits at its floor with the most slack; its downsizes
/// cannot happen, and before the fix no other app was tried, so search kept
/// its peak cores after the ramp (14 at every seed). Now search gives them
/// back as it does without the idle app: within one core, over 8 seeds.
#[test]
fn an_idle_app_at_its_floor_does_not_stop_other_downsizes() {
    let t = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let policy = repo.join("policies/parties.yaml");
    let base = std::fs::read_to_string(repo.join("scenarios/ramp.yaml"))
        .unwrap()
        .replace("../policies/parties.yaml", policy.to_str().unwrap());
    let idle =
        "  - name: idle\n    class: lc\n    server:\n      kind: memcached\n      threads: 2\n    \
                protocol: memcache\n    connections: 1\n    target:\n      percentile: 99\n      \
                knee_factor: 1.0\n    load:\n      kind: constant\n      level: 0.0\n";
    let two = t.path().join("ramp.yaml");
    let three = t.path().join("ramp-idle.yaml");
    std::fs::write(&two, &base).unwrap();
    std::fs::write(&three, format!("{base}{idle}")).unwrap();
    let (mut with, mut without) = (0.0, 0.0);
    for seed in 1..=8 {
        let s = seed.to_string();
        for (sc, sum) in [(&two, &mut without), (&three, &mut with)] {
            let out = t.path().join(format!("out-{seed}"));
            ok(&[
                "replay",
                sc.to_str().unwrap(),
                "--sim",
                "--seed",
                &s,
                "--out",
                out.to_str().unwrap(),
            ]);
            *sum += cores_after_ramp(&out, "search") / 8.0;
            if sc == &three {
                assert_eq!(
                    cores_after_ramp(&out, "idle"),
                    1.0,
                    "the idle app holds one core"
                );
            }
        }
    }
    eprintln!("search after the ramp: {without:.2} cores without the idle app, {with:.2} with it");
    assert!(
        (with - without).abs() <= 1.0,
        "search keeps {with:.2} cores beside an idle app, {without:.2} without"
    );
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

/// The oracle (each interval the least allocation that meets every target
/// by the model) is the lower bound on core·s: no shipped policy, nor the
/// static split, uses fewer on the same load (a policy could only by
/// missing targets the oracle meets); summary.json and the table carry it
/// with the policy's ratio to it.
#[test]
fn the_oracle_is_below_every_policy() {
    let t = tempfile::tempdir().unwrap();
    for sc in ["ramp", "constant", "spike"] {
        for policy in [
            "static",
            "policies/parties.yaml",
            "policies/parties-original.yaml",
            "policies/power-saver.yaml",
            "policies/cpu-util.yaml",
        ] {
            let dir = t.path().join(format!("{sc}-{}", policy.replace('/', "-")));
            let text = ok(&[
                "replay",
                &format!("scenarios/{sc}.yaml"),
                "--sim",
                "--policy",
                policy,
                "--out",
                dir.to_str().unwrap(),
            ]);
            let s = summary(&dir);
            let o = &s["oracle"];
            let (oc, pc) = (
                o["core_seconds"].as_f64().unwrap(),
                s["total"]["core_seconds"].as_f64().unwrap(),
            );
            println!(
                "{sc} {policy}: {pc:.0} core·s, {:.1} % violations; oracle {oc:.0} core·s, {:.1} %",
                s["total"]["violation_fraction"].as_f64().unwrap() * 100.0,
                o["violation_fraction"].as_f64().unwrap() * 100.0
            );
            assert!(oc > 0.0 && oc <= pc, "{sc} {policy}: oracle {oc} vs {pc}");
            assert!((o["policy_ratio"].as_f64().unwrap() - pc / oc).abs() < 1e-9);
            assert!(text.contains("\noracle "), "{text}");
        }
    }
}

/// The sim honours the knobs a run may turn: `scenarios/demo.yaml` says
/// `resources: [cpu_quota]`, so its simulated node shares the CPUs and
/// only quota moves (no cores column), as on the real 2-CPU machine;
/// `--resources cores` instead gives cores and no quota.
#[test]
fn the_sim_turns_only_the_scenarios_resources() {
    let t = tempfile::tempdir().unwrap();
    let rows = |dir: &Path| -> Vec<Vec<String>> {
        let text = std::fs::read_to_string(dir.join("timeline.csv")).unwrap();
        text.lines()
            .skip(1)
            .map(|l| l.split(',').map(str::to_owned).collect())
            .collect()
    };
    let quota = t.path().join("quota");
    ok(&[
        "replay",
        "scenarios/demo.yaml",
        "--sim",
        "--out",
        quota.to_str().unwrap(),
    ]);
    let r = rows(&quota);
    // Columns: ... 8 cores, 9 freq_mhz, 10 llc_ways ... 15 cpu_quota_milli, 16 be_ops_per_s.
    assert!(
        r.iter().all(|c| c[8].is_empty() || c[8] == "0"),
        "no cores knob"
    );
    // PARTIES moves the best-effort job's quota first (quota_be_first):
    // search's cap is lifted, the batch job's moves.
    let quotas: std::collections::BTreeSet<&str> = r
        .iter()
        .filter(|c| c[1] == "batch")
        .map(|c| c[15].as_str())
        .collect();
    assert!(quotas.len() > 3, "the batch job's quota moves: {quotas:?}");
    assert!(
        r.iter().any(|c| c[1] == "batch" && !c[16].is_empty()),
        "the batch job reports ops/s"
    );
    let cores = t.path().join("cores");
    ok(&[
        "replay",
        "scenarios/demo.yaml",
        "--sim",
        "--resources",
        "cores",
        "--out",
        cores.to_str().unwrap(),
    ]);
    let r = rows(&cores);
    assert!(r.iter().all(|c| c[15].is_empty()), "no quota knob");
    // demo.yaml's sim node has this machine's 2 CPUs: one core each, and
    // the cores column is what the run reports.
    assert!(
        r.iter().all(|c| c[8].parse::<f64>().unwrap_or(0.0) >= 1.0),
        "every app holds cores"
    );
}
