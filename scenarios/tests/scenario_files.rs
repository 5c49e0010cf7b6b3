//! Every shipped scenario parses and validates; invalid files name
//! file:line:col and the key.

use std::path::Path;

use qosd_scenarios::scenario::{self, Scenario};

#[test]
fn every_shipped_scenario_parses_and_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = scenario::shipped(dir).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in ["ramp", "diurnal", "spike", "constant", "grpc"] {
        assert!(
            names.iter().any(|n| n == want),
            "{want}.yaml is shipped: {names:?}"
        );
    }
    for f in &files {
        let s = Scenario::from_file(f).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            s.name,
            f.file_stem().unwrap().to_string_lossy(),
            "name matches the file"
        );
        let policy = s.policy_path().expect("a policy");
        assert!(
            policy.ends_with("policies/parties.yaml"),
            "{}",
            policy.display()
        );
    }
}

#[test]
fn ramp_is_the_papers_case_study() {
    let s = Scenario::from_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("ramp.yaml")).unwrap();
    let search = &s.apps[0];
    assert!((search.load.level_at(0.0) - 0.07).abs() < 1e-9);
    assert!((search.load.peak() - 1.0).abs() < 1e-9);
    assert!(
        (search.load.level_at(s.duration_s) - 0.07).abs() < 1e-9,
        "ramps back down"
    );
    let mc = s.apps.iter().find(|a| a.name == "memcached").unwrap();
    assert!(mc.load.peak() < 0.2, "memcached held below 20 %");
    assert!(
        s.apps
            .iter()
            .all(|a| a.target.as_ref().unwrap().knee_factor == Some(1.0)),
        "targets at the knee"
    );
}

fn err(text: &str) -> String {
    Scenario::parse(Path::new("bad.yaml"), text)
        .unwrap_err()
        .to_string()
}

const GOOD: &str = "name: t
duration_s: 10
apps:
  - name: a
    class: lc
    server:
      kind: memcached
    protocol: memcache
    target:
      ms: 1
    load:
      kind: ramp
      from: 0.1
      to: 0.5
      over_s: 5
";

#[test]
fn errors_name_file_line_col_and_key() {
    assert!(Scenario::parse(Path::new("ok.yaml"), GOOD).is_ok());
    let e = err(&GOOD.replace("to: 0.5", "to: -1"));
    assert_eq!(e, "bad.yaml:14:7: apps[0].load.to: -1: must be >= 0");
    let e = err(&GOOD.replace("over_s: 5", "over_s: 0"));
    assert!(e.starts_with("bad.yaml:15:7: apps[0].load.over_s:"), "{e}");
    // A pinned target (ms, for comparisons that must not move with a
    // calibration) must be a latency.
    let e = err(&GOOD.replace("      ms: 1\n", "      ms: 0\n"));
    assert_eq!(e, "bad.yaml:10:7: apps[0].target.ms: 0: must be > 0");
    let e = err(&GOOD.replace("      ms: 1\n", "      ms: -2.5\n"));
    assert!(
        e.starts_with("bad.yaml:10:7: apps[0].target.ms: -2.5"),
        "{e}"
    );
    let e = err(&GOOD.replace("      ms: 1\n", "      ms: 1\n      knee_factor: 2\n"));
    assert!(
        e.starts_with("bad.yaml:9:5: apps[0].target: give exactly one"),
        "{e}"
    );
    // serde errors keep serde's position.
    let e = err(&GOOD.replace("duration_s: 10", "duration_s: 10\nseeed: 3"));
    assert!(
        e.starts_with("bad.yaml:3:1: seeed: unknown field `seeed`"),
        "{e}"
    );
    let e = err(&GOOD.replace("protocol: memcache", "protocol: http"));
    assert!(
        e.starts_with("bad.yaml:8:5: apps[0].protocol: memcached speaks"),
        "{e}"
    );
    let e = err(&GOOD.replace("class: lc", "class: be"));
    assert!(
        e.contains("apps[0].target: a best-effort app has no target"),
        "{e}"
    );
}

#[test]
fn trace_files_are_read_relative_to_the_scenario() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.csv"), "t_s,level\n0,0.1\n5,0.9\n").unwrap();
    let text = GOOD.replace(
        "      kind: ramp\n      from: 0.1\n      to: 0.5\n      over_s: 5\n",
        "      kind: trace\n      file: t.csv\n",
    );
    let p = dir.path().join("s.yaml");
    std::fs::write(&p, &text).unwrap();
    let s = Scenario::from_file(&p).unwrap();
    assert!((s.apps[0].load.level_at(2.5) - 0.5).abs() < 1e-9);
    std::fs::write(dir.path().join("t.csv"), "t_s,level\n0,0.1\nx,y\n").unwrap();
    let e = Scenario::from_file(&p).unwrap_err().to_string();
    assert!(
        e.contains("apps[0].load.file") && e.contains("line 3"),
        "{e}"
    );
}

/// GOOD with a best-effort batch job beside its latency-critical app.
fn with_job(job: &str) -> String {
    format!("{GOOD}  - name: batch\n    class: be\n{job}")
}

#[test]
fn best_effort_batch_jobs_parse_and_are_checked() {
    use qosd_scenarios::scenario::JobSpec;
    let s = Scenario::parse(
        Path::new("ok.yaml"),
        &with_job("    job: { kind: hash, threads: 2 }\n"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let b = &s.apps[1];
    assert_eq!(
        b.job,
        Some(JobSpec::Hash {
            threads: 2,
            op_kib: 16
        })
    );
    assert!(b.server.is_none() && b.protocol.is_none());
    assert_eq!(b.load.peak(), 0.0, "a job takes no load");
    let args = b.job.as_ref().unwrap().args(100, 30);
    assert_eq!((args.threads, args.op_kib, args.exit_after_s), (2, 16, 30));

    for (job, want) in [
        (
            "    job: { kind: hash, threads: 0 }\n",
            "bad.yaml:18:24: apps[1].job.threads: 0: must be in 1..=256",
        ),
        (
            "    job: { kind: hash, op_kib: 9999 }\n",
            "bad.yaml:18:24: apps[1].job.op_kib: 9999: must be in 1..=4096",
        ),
        (
            "    job: { kind: hash }\n    protocol: http\n",
            "bad.yaml:19:5: apps[1].protocol: a batch job takes no requests: drop `protocol`",
        ),
        (
            "    job: { kind: hash }\n    load: { kind: constant, level: 0.3 }\n",
            "bad.yaml:19:5: apps[1].load: a batch job takes no load: drop `load`",
        ),
        (
            "    job: { kind: hash }\n    server: { kind: nginx }\n",
            "bad.yaml:18:5: apps[1].job: give a `server` or a `job`, not both",
        ),
        (
            "    job: { kind: stress }\n",
            "bad.yaml:18:18: apps[1].job.kind: unknown variant `stress`, expected `hash`",
        ),
    ] {
        let e = err(&with_job(job));
        assert!(e.starts_with(want), "{job}: {e}");
    }
    // A job is for best-effort apps; an app needs a server or a job; a
    // server needs its protocol.
    let e = err(&with_job("    job: { kind: hash }\n").replace("class: be", "class: lc"));
    assert!(
        e.contains("apps[1].job: a batch job is for best-effort apps"),
        "{e}"
    );
    let e = err(&with_job(""));
    assert!(
        e.starts_with("bad.yaml:16:5: apps[1].server: missing: how to start the app"),
        "{e}"
    );
    let e = err(&GOOD.replace("    protocol: memcache\n", ""));
    assert!(
        e.starts_with("bad.yaml:4:5: apps[0].protocol: missing: how the load generator talks"),
        "{e}"
    );
}

#[test]
fn resources_name_the_knobs_of_a_real_replay() {
    use qosd_core::Resource;
    // Absent: every knob the machine has (the replay decides).
    let s = Scenario::parse(Path::new("ok.yaml"), GOOD).unwrap();
    assert_eq!(s.resources, None);
    let with = |list: &str| GOOD.replace("duration_s: 10\n", &format!("duration_s: 10\n{list}\n"));
    let s = Scenario::parse(Path::new("ok.yaml"), &with("resources: [cpu_quota, cores]")).unwrap();
    assert_eq!(s.resources, Some(vec![Resource::CpuQuota, Resource::Cores]));
    // The aliases the config accepts (`quota`, `ways`, ...) hold here too.
    let s = Scenario::parse(Path::new("ok.yaml"), &with("resources: [quota]")).unwrap();
    assert_eq!(s.resources, Some(vec![Resource::CpuQuota]));
    let e = err(&with("resources: []"));
    assert!(e.starts_with("bad.yaml:3:1: resources: empty"), "{e}");
    let e = err(&with("resources: [cpu_quota, cores, cpu_quota]"));
    assert!(
        e.starts_with("bad.yaml:3:31: resources[2]: cpu_quota appears twice"),
        "{e}"
    );
    let e = err(&with("resources: [cpu_quota, turbo]"));
    assert!(
        e.starts_with("bad.yaml:3:") && e.contains("resources") && e.contains("turbo"),
        "{e}"
    );
    let e = err(&with("resources: cpu_quota"));
    assert!(e.starts_with("bad.yaml:3:"), "{e}");
}
