//! Issue 15, files: what `run`/`replay` refuse `qosd check` refuses too
//! (FILE:LINE:COL: KEY), hostile shapes fail fast with a position (deep
//! nesting, 200 000 apps, duplicate keys, bad bytes, a BOM, a FIFO, a
//! directory) and an error never echoes a file that is not YAML.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{qosd, repo, text, wait_for, QOSD};

/// `qosd check ARGS`: (exit code, stderr).
fn check(args: &[&Path]) -> (i32, String) {
    let mut a = vec![Path::new("check")];
    a.extend_from_slice(args);
    let out = qosd(&a);
    (out.status.code().expect("exit code"), text(&out.stderr))
}

const CONFIG: &str = "\
apps:
  - name: memcached
    match: { comm: memcached }
    class: lc
    target: { p99: 1ms }
policy: parties.yaml
";

struct Dir(tempfile::TempDir);

impl Dir {
    /// A temp dir holding a copy of the shipped policies.
    fn new() -> Dir {
        let d = tempfile::tempdir().expect("tempdir");
        for p in ["parties.yaml", "cpu-util.yaml"] {
            std::fs::copy(repo().join("policies").join(p), d.path().join(p)).expect("copy");
        }
        Dir(d)
    }

    fn put(&self, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
        let p = self.0.path().join(name);
        std::fs::write(&p, bytes).expect("write");
        p
    }
}

/// `check FILE` exits 2 with a first line `FILE:LINE:COL: KEY: ...`
/// containing `want` (FILE may be another file, e.g. the policy).
fn refused(file: &Path, at: &Path, line_col_key: &str, want: &str) {
    let (code, err) = check(&[file]);
    assert_eq!(code, 2, "{}: {err}", file.display());
    let first = err.lines().next().unwrap_or_default();
    let head = format!("{}:{line_col_key}", at.display());
    assert!(first.starts_with(&head), "want {head}…{want}\ngot {err}");
    assert!(first.contains(want), "want {want}\ngot {err}");
}

#[test]
fn check_refuses_configs_that_run_would_refuse() {
    let d = Dir::new();
    let good = d.put("good.yaml", CONFIG);
    assert_eq!(check(&[&good]).0, 0);
    let max = u64::MAX.to_string();
    let cases = [
        (
            format!("{CONFIG}monitor_interval_ms: {max}\n"),
            "7:1: monitor_interval_ms",
            "must be from 10 to 60000 ms",
        ),
        (
            format!("{CONFIG}decide_interval_ms: {max}\n"),
            "7:1: decide_interval_ms",
            "at most 3600000 ms",
        ),
        (
            CONFIG.replace("1ms", &format!("1{}s", "0".repeat(303))),
            "5:15: apps[0].target.p99",
            "at most 3600s",
        ),
        (
            format!("{CONFIG}sensors: {{ ring_buffer_kib: 2147483648 }}\n"),
            "7:12: sensors.ring_buffer_kib",
            "power of two from 4 to 1048576",
        ),
        (
            CONFIG.replace("name: memcached", &format!("name: {}", "a".repeat(5000))),
            "2:5: apps[0].name",
            "at most 64 characters",
        ),
        (
            CONFIG.replace("comm: memcached", "comm: \"mem\\ncached\""),
            "3:14: apps[0].match.comm",
            "no control characters",
        ),
        (
            CONFIG.replace("comm: memcached", "cgroup: /sys/fs/cgroup/../../etc"),
            "3:14: apps[0].match.cgroup",
            "must not contain `..`",
        ),
    ];
    for (i, (yaml, at, want)) in cases.iter().enumerate() {
        let f = d.put(&format!("c{i}.yaml"), yaml);
        refused(&f, &f, at, want);
    }
}

#[test]
fn check_refuses_policies_and_scenarios_that_run_or_replay_would_refuse() {
    let d = Dir::new();
    let parties = std::fs::read_to_string(d.0.path().join("parties.yaml")).unwrap();
    let rules = std::fs::read_to_string(d.0.path().join("cpu-util.yaml")).unwrap();
    let cases = [
        (
            parties.replace("idle_slack: 1.0", "idle_slack: -1e308"),
            "parties.idle_slack",
            "must be in [-1, 1]",
        ),
        (
            parties.replace(
                "victims: [free_pool, best_effort, most_slack_lc]",
                "victims: []",
            ),
            "parties.victims",
            "needs at least one source",
        ),
        (
            rules.replace("victims: [free_pool, best_effort]", "victims: []"),
            "settings.victims",
            "needs at least one source",
        ),
        (
            rules.replace("victims: [free_pool]", "victims: [free_pool, free_pool]"),
            "rules[4].victims[1]",
            "listed twice",
        ),
        (
            rules.replace("\"slack < 0\"", "\"latency > 1e308ms\""),
            "rules[0].when[0]",
            "out of range",
        ),
    ];
    for (i, (yaml, key, want)) in cases.iter().enumerate() {
        let f = d.put(&format!("p{i}.yaml"), yaml);
        let (code, err) = check(&[&f]);
        assert_eq!(code, 2, "{key}: {err}");
        let prefix = format!("{}:", f.display());
        assert!(
            err.starts_with(&prefix) && err.contains(&format!(": {key}: ")),
            "{err}"
        );
        assert!(err.contains(want), "{key}: {err}");
    }
    // A rule for an app the config does not have: at the policy's key.
    let p = d.put(
        "named.yaml",
        rules.replace(
            "  - name: busy\n",
            "  - name: busy\n    apps: [memcached, nope]\n",
        ),
    );
    let c = d.put("c.yaml", CONFIG.replace("parties.yaml", "named.yaml"));
    refused(&c, &p, "26:", "rules[1].apps[1]: `nope` is not an app here");
    // A scenario naming a policy that is not there.
    let ramp = std::fs::read_to_string(repo().join("scenarios/ramp.yaml")).unwrap();
    let s = d.put(
        "s.yaml",
        ramp.replace("../policies/parties.yaml", "nope.yaml"),
    );
    refused(&s, &s, "23:1: policy", "no policy file at");
    let s = d.put(
        "s2.yaml",
        ramp.replace("../policies/parties.yaml", "parties.yaml"),
    );
    assert_eq!(check(&[&s]).0, 0, "{}", check(&[&s]).1);
}

#[test]
fn hostile_shapes_fail_fast_with_a_position() {
    let d = Dir::new();
    // 200 KB of nested brackets, in every kind's position.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    for (name, yaml) in [
        ("deep.yaml", deep.clone()),
        (
            "deep-app.yaml",
            CONFIG.replace("memcached }", &format!("{deep} }}")),
        ),
        (
            "deep-map.yaml",
            format!("name: x\nrules: {}\n", "{a: ".repeat(5000)),
        ),
    ] {
        let f = d.put(name, yaml);
        let (code, err) = check(&[&f]);
        assert_eq!(code, 2, "{name}: {err}");
        assert!(
            err.contains("nested more than 32 levels deep"),
            "{name}: {err}"
        );
        assert!(
            err.starts_with(&format!("{}:", f.display())),
            "{name}: {err}"
        );
    }
    // 200 000 apps, the last one a duplicate: found, and named.
    let mut big = String::from("policy: parties.yaml\napps:\n");
    for i in 0..200_000 {
        let n = if i == 199_999 { 7 } else { i };
        big.push_str(&format!(
            "  - {{ name: a{n}, match: {{ comm: a{n} }}, class: be }}\n"
        ));
    }
    let f = d.put("big.yaml", &big);
    refused(
        &f,
        &f,
        "200002:",
        "apps[199999].name: `a7` is used by an earlier app",
    );
}

#[test]
fn unclear_inputs_get_clear_errors() {
    let d = Dir::new();
    // A duplicate key: at its line, not 1:1.
    let f = d.put("dup.yaml", format!("{CONFIG}seed: 1\nseed: 2\n"));
    refused(&f, &f, "8:1: duplicate key `seed`", "");
    // A bad byte: where it is.
    let mut bytes = CONFIG.as_bytes().to_vec();
    bytes.splice(60..60, [0xff, 0xfe]);
    let f = d.put("latin.yaml", &bytes);
    let (code, err) = check(&[&f]);
    assert_eq!(code, 2, "{err}");
    assert!(err.starts_with(&format!("{}:4:4:", f.display())), "{err}");
    assert!(err.contains("not UTF-8"), "{err}");
    // A byte-order mark is not content.
    let f = d.put("bom.yaml", format!("\u{feff}{CONFIG}"));
    let (code, err) = check(&[&f]);
    assert_eq!(code, 0, "{err}");
    // A policy that is not YAML: named, not echoed.
    let f = d.put("passwd.yaml", CONFIG.replace("parties.yaml", "/etc/passwd"));
    let (code, err) = check(&[&f]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/etc/passwd"), "{err}");
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let second = passwd.lines().nth(1).unwrap();
    assert!(!err.contains(second), "echoes /etc/passwd: {err}");
    // A directory is a directory, for check and for run.
    let dir = d.0.path();
    let (code, err) = check(&[dir]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a directory"), "{err}");
    let out = qosd(&[Path::new("run"), Path::new("--config"), dir]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("a directory"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_fifo_is_refused_not_waited_on() {
    let d = Dir::new();
    let fifo = d.0.path().join("fifo.yaml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut child = Command::new(QOSD)
        .arg("check")
        .arg(&fifo)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let exited = wait_for(Duration::from_secs(20), || {
        child.try_wait().ok().flatten().is_some()
    });
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
        panic!("qosd check waited on a FIFO");
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("a FIFO"),
        "{}",
        text(&out.stderr)
    );
}
