//! `qosd check` as a user runs it: the shipped files pass (exit 0); bad
//! files fail with exit 2 and FILE:LINE:COL: KEY on stderr.

mod support;

use std::path::{Path, PathBuf};

use support::{qosd, repo, text};

fn qosd_check(args: &[&Path]) -> (i32, String, String) {
    let mut a = vec![Path::new("check")];
    a.extend_from_slice(args);
    let out = qosd(&a);
    (
        out.status.code().expect("exit code"),
        text(&out.stdout),
        text(&out.stderr),
    )
}

#[test]
fn shipped_config_and_policies_pass() {
    let root = repo();
    let mut files = vec![root.join("config.yaml")];
    for e in std::fs::read_dir(root.join("policies")).expect("policies/") {
        files.push(e.expect("entry").path());
    }
    let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let (code, out, err) = qosd_check(&refs);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("ok: ")).count(),
        files.len(),
        "{out}"
    );
    assert!(out.contains("policy `parties` from"), "{out}");
}

/// Writes `text` as `name` in a temp dir next to a copy of the policies.
fn bad_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

const CONFIG: &str = "\
apps:
  - name: memcached
    match: { comm: memcached }
    class: lc
    target: { p99: 1ms }
policy: parties.yaml
";

/// A best-effort app running `job`, then the `policy:` key.
fn be_job(job: &str) -> String {
    format!("  - name: batch\n    class: be\n    job: {job}\npolicy:")
}

#[test]
fn bad_files_exit_2_with_file_line_col_and_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        repo().join("policies/parties.yaml"),
        dir.path().join("parties.yaml"),
    )
    .expect("copy policy");
    let good = bad_file(dir.path(), "good.yaml", CONFIG);
    let cases = [
        (
            "unknown-key.yaml",
            CONFIG.replace("    class: lc\n", "    class: lc\n    colour: red\n"),
            ":5:5: apps[0].colour: unknown field `colour`",
        ),
        (
            "wrong-unit.yaml",
            CONFIG.replace("1ms", "1 fortnight"),
            ":5:15: apps[0].target.p99: `1 fortnight`: unknown unit",
        ),
        (
            "target-zero.yaml",
            CONFIG.replace("1ms", "0ms"),
            ":5:15: apps[0].target.p99: `0ms`: a target must be greater than 0",
        ),
        (
            "bad-resource.yaml",
            format!("{CONFIG}actuators: {{ enabled: [cores, gpus] }}\n"),
            ":7:",
        ),
        (
            "bad-policy.yaml",
            "name: p\nparties:\n  cycle: [cores, gpus]\n".to_owned(),
            ":3:",
        ),
        ("syntax.yaml", "apps: [\n  - name\n".to_owned(), ":"),
        // Best-effort apps whose batch job qosd runs (`job:`).
        (
            "job-on-lc.yaml",
            CONFIG.replace(
                "    match: { comm: memcached }\n",
                "    job: { kind: hash }\n",
            ),
            ":3:5: apps[0].job: a batch job is for best-effort apps (class: be)",
        ),
        (
            "job-threads.yaml",
            CONFIG.replace("policy:", &be_job("{ kind: hash, threads: 0 }")),
            ":8:24: apps[1].job.threads: 0: must be in 1..=256",
        ),
        (
            "job-typo.yaml",
            CONFIG.replace("policy:", &be_job("{ kind: hash, thread: 2 }")),
            ":8:24: apps[1].job.thread: unknown field `thread`",
        ),
        (
            "job-kind.yaml",
            CONFIG.replace("policy:", &be_job("{ kind: gzip }")),
            ":8:",
        ),
        (
            "job-and-match.yaml",
            CONFIG.replace(
                "policy:",
                &be_job("{ kind: hash }").replace("class: be", "class: be\n    match: { pid: 1 }"),
            ),
            ":8:5: apps[1].match: an app with a `job` is the job's process",
        ),
    ];
    for (name, text, want) in &cases {
        let f = bad_file(dir.path(), name, text);
        let (code, out, err) = qosd_check(&[&good, &f]);
        assert_eq!(code, 2, "{name}: stdout:\n{out}\nstderr:\n{err}");
        let line = err.lines().next().unwrap_or_default();
        assert!(
            line.starts_with(&format!("{}{want}", f.display())),
            "{name}: {err}"
        );
        assert!(
            out.contains(&format!("ok: {}", good.display())),
            "{name}: {out}"
        );
        assert!(
            err.contains("qosd: error: 1 of 2 file(s) invalid"),
            "{name}: {err}"
        );
    }
    // `qosd run` refuses the same file before it starts anything (no
    // job, no group, no API).
    let f = dir.path().join("job-threads.yaml");
    let out = qosd(&[Path::new("run"), Path::new("--config"), &f]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(text(&out.stderr).contains("apps[1].job.threads"), "{out:?}");
    assert!(!text(&out.stdout).contains("batch job"), "{out:?}");
    // The unknown resource names its key.
    let f = dir.path().join("bad-resource.yaml");
    let (_, _, err) = qosd_check(&[&f]);
    assert!(
        err.contains("actuators.enabled") && err.contains("unknown variant `gpus`"),
        "{err}"
    );
    let f = dir.path().join("bad-policy.yaml");
    let (_, _, err) = qosd_check(&[&f]);
    assert!(
        err.contains(":3:") && err.contains("parties.cycle[1]"),
        "{err}"
    );
}

#[test]
fn missing_file_exits_2_naming_it() {
    let (code, _, err) = qosd_check(&[Path::new("/nonexistent/qosd.yaml")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/qosd.yaml: cannot read"), "{err}");
}

#[test]
fn shipped_scenarios_pass_and_a_bad_one_is_located() {
    let root = repo();
    let mut files = Vec::new();
    for e in std::fs::read_dir(root.join("scenarios")).expect("scenarios/") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "yaml") {
            files.push(p);
        }
    }
    assert!(files.len() >= 4, "{files:?}");
    let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let (code, out, err) = qosd_check(&refs);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("scenario `ramp`"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    let text = std::fs::read_to_string(root.join("scenarios/ramp.yaml"))
        .unwrap()
        .replacen("duration_s:", "duration_s: -5\nbogus_key:", 1);
    std::fs::write(&bad, text).unwrap();
    let (code, _, err) = qosd_check(&[&bad]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bad.yaml:"), "{err}");
}

#[test]
fn a_scenario_with_an_unknown_resource_is_located() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("scenarios/demo.yaml"))
        .unwrap()
        .replacen("resources: [", "resources: [turbo, ", 1);
    let bad = dir.path().join("demo.yaml");
    std::fs::write(&bad, text).unwrap();
    let (code, out, err) = qosd_check(&[&bad]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("demo.yaml:") && err.contains("turbo"), "{err}");
    // Nothing is parsed from a file that cannot be, and nothing is
    // printed as valid.
    assert!(!out.contains("ok:"), "{out}");
}
