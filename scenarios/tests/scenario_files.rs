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
