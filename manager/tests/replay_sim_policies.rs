//! What the policies do on the simulated node's shipped scenarios: PARTIES
//! against the static split on the ramp, downsizes beside an idle app, the
//! oracle as the lower bound of every policy, and only the scenario's
//! knobs turned. `qosd replay` itself (outputs, seeds, compare, usage
//! errors) is in `replay.rs`.

mod support;

use std::path::Path;

use support::replay::{replay_ok as ok, summary, timeline, timeline_rows};

/// Violations of the search app while its load is at most 80 % of capacity
/// (outside the saturated top of the ramp), from a timeline.
fn violations_below(dir: &Path, capacity: f64, frac: f64) -> f64 {
    let rows = timeline_rows(dir, "search");
    let sel: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| r[2].parse::<f64>().unwrap() <= frac * capacity)
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

/// Search's mean cores over the last 60 s of the ramp (after it), and the
/// idle app's, per seed.
fn cores_after_ramp(dir: &Path, app: &str) -> f64 {
    let v: Vec<f64> = timeline_rows(dir, app)
        .iter()
        .filter(|c| c[0].parse::<f64>().unwrap() > 240.0)
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
    let quota = t.path().join("quota");
    ok(&[
        "replay",
        "scenarios/demo.yaml",
        "--sim",
        "--out",
        quota.to_str().unwrap(),
    ]);
    let r = timeline(&quota);
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
    let r = timeline(&cores);
    assert!(r.iter().all(|c| c[15].is_empty()), "no quota knob");
    // demo.yaml's sim node has this machine's 2 CPUs: one core each, and
    // the cores column is what the run reports.
    assert!(
        r.iter().all(|c| c[8].parse::<f64>().unwrap_or(0.0) >= 1.0),
        "every app holds cores"
    );
}
