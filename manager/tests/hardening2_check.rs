//! Issue 21, files and command lines: every file qosd reads goes through
//! one guarded reader (regular files only, a size cap per kind: a FIFO, a
//! device or an endless file is refused at once), `check` refuses what
//! `run` and `replay` refuse by value range (NaN, infinite and negative
//! times, runs too small or too large to replay, a NUL in a path, YAML
//! tags, control characters in names, state and token files that cannot
//! be files, sub-microsecond targets), a file of the wrong kind is named
//! as such, and invalid command lines exit 2. Run alone:
//! `cargo test --release -p qosd-manager --test hardening2_check`.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::{qosd, repo, text};

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Dir {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::copy(
            repo().join("policies/parties.yaml"),
            d.path().join("parties.yaml"),
        )
        .expect("copy");
        Dir(d)
    }

    fn put(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

/// `qosd ARGS`: (exit code, stdout, stderr), 60 s at most.
fn run(args: &[&str]) -> (i32, String, String) {
    let t0 = Instant::now();
    let out = qosd(args);
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "qosd {args:?} took {:?}",
        t0.elapsed()
    );
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// `check FILE` exits 2 and says `want`.
fn refused(file: &Path, want: &str) {
    let (code, out, err) = run(&["check", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{}: {out}{err}", file.display());
    assert!(err.contains(want), "want {want:?}\ngot {err}");
    assert!(out.is_empty(), "printed {out:?}");
}

/// A sim scenario with one app whose `load:` and top-level extras are
/// given; `trace` names the trace file when `load` is a trace.
fn scenario(extra: &str, load: &str) -> String {
    format!(
        "name: t\nduration_s: 60\nseed: 1\ninterval_ms: 500\nfeedback: client\n\
         policy: parties.yaml\n{extra}apps:\n  - name: a\n    class: lc\n    \
         server: {{ kind: fixture, work_us: 100 }}\n    protocol: http\n    \
         sim: {{ service_us: 100 }}\n    target: {{ percentile: 99, ms: 5 }}\n    load: {load}\n"
    )
}

fn config(app_extra: &str, top_extra: &str) -> String {
    format!(
        "apps:\n  - name: a\n    match: {{ comm: a }}\n    class: lc\n    \
         target: {{ p99: 1ms }}\n{app_extra}policy: parties.yaml\n{top_extra}"
    )
}

#[test]
fn hardening2_trace_and_calibration_files_are_read_through_the_guard() {
    let d = Dir::new();
    // A FIFO as a trace file: refused at once (it used to hang `check`).
    let fifo = d.path("fifo.csv");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let sc = d.put(
        "fifo.yaml",
        &scenario("", "{ kind: trace, file: fifo.csv }"),
    );
    refused(&sc, "a FIFO: expected a regular CSV file");
    // Endless devices: refused before a byte is read (they used to be
    // read into 1-2 GB of memory).
    for dev in ["/dev/zero", "/dev/urandom"] {
        let sc = d.put(
            "dev.yaml",
            &scenario("", &format!("{{ kind: trace, file: {dev} }}")),
        );
        refused(&sc, "a device: expected a regular CSV file");
    }
    // A trace larger than its cap (64 MiB), sparse so it costs no disk.
    let big = d.path("big.csv");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(65 << 20).unwrap();
    let sc = d.put("big.yaml", &scenario("", "{ kind: trace, file: big.csv }"));
    refused(&sc, "larger than 64 MiB");
    // --calibration /dev/zero: usage error at once.
    let ok = d.put("ok.yaml", &scenario("", "{ kind: constant, level: 0.5 }"));
    let out = d.path("out");
    let (code, _, err) = run(&[
        "replay",
        ok.to_str().unwrap(),
        "--sim",
        "--calibration",
        "/dev/zero",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("a device: expected a regular calibration.json"),
        "{err}"
    );
    // The state file: a FIFO is not waited on by `qosd restore`.
    let sfifo = d.path("state.json");
    nix::unistd::mkfifo(&sfifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let (code, _, err) = run(&["restore", "--state-file", sfifo.to_str().unwrap()]);
    assert_ne!(code, 0, "{err}");
}

#[test]
fn hardening2_times_and_sizes_check_refuses_by_value() {
    let d = Dir::new();
    // Step times that are no times.
    for at in [".nan", ".inf", "-.inf", "-1e308", "-1"] {
        let load = format!("{{ kind: steps, steps: [{{ at_s: {at}, level: 0.5 }}] }}");
        let sc = d.put("steps.yaml", &scenario("", &load));
        refused(&sc, "apps[0].load.steps[0].at_s");
    }
    // Trace times likewise (finite non-negative only).
    for t in ["-1", "-1e308", "nan", "inf"] {
        d.put("t.csv", &format!("t_s,level\n{t},0.5\n10,0.5\n"));
        let sc = d.put("tr.yaml", &scenario("", "{ kind: trace, file: t.csv }"));
        refused(&sc, "need a finite time >= 0");
    }
    // Runs shorter than one interval, or too large to replay.
    let tiny = scenario("", "{ kind: constant, level: 0.5 }")
        .replace("duration_s: 60", "duration_s: 1e-320");
    refused(&d.put("tiny.yaml", &tiny), "shorter than one interval");
    let huge = scenario("", "{ kind: constant, level: 0.5 }")
        .replace("duration_s: 60", "duration_s: 86400")
        .replace("interval_ms: 500", "interval_ms: 10");
    refused(&d.put("huge.yaml", &huge), "timeline rows; at most 1000000");
    // A simulated node whose ways would need a 137 GB table.
    let ways = scenario(
        "node: { nr_cores: 4, nr_ways: 4294967295 }\n",
        "{ kind: constant, level: 0.5 }",
    );
    refused(&d.put("ways.yaml", &ways), "at most 64");
    // `replay --duration` below one interval, or too long for its interval.
    let ok = d.put("ok.yaml", &scenario("", "{ kind: constant, level: 0.5 }"));
    for dur in ["1e-9", "0.1"] {
        let (code, _, err) = run(&["replay", ok.to_str().unwrap(), "--sim", "--duration", dur]);
        assert_eq!(code, 2, "--duration {dur}: {err}");
        assert!(err.contains("shorter than one interval"), "{err}");
    }
}

#[test]
fn hardening2_paths_tags_names_and_targets() {
    let d = Dir::new();
    // A NUL in a cgroup path.
    let c = config("", "").replace(
        "match: { comm: a }",
        "match: { cgroup: \"/sys/fs/cgroup/x\\0y\" }",
    );
    refused(&d.put("nul.yaml", &c), "no NUL byte or control character");
    // YAML tags are refused, not applied.
    let c = config("", "").replace("name: a", "name: !!binary d2Vi");
    refused(
        &d.put("tag.yaml", &c),
        "YAML tag `!!binary` is not accepted",
    );
    // A policy name with a newline cannot forge a line of `check`.
    let p = std::fs::read_to_string(d.path("parties.yaml")).unwrap();
    let name_line = p
        .lines()
        .find(|l| l.starts_with("name:"))
        .unwrap()
        .to_owned();
    let forged = p.replace(&name_line, "name: \"a\\nok: fake line\"");
    let pf = d.put("forged.yaml", &forged);
    let (code, out, err) = run(&["check", pf.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        !out.contains("ok: fake line") && err.contains("control character"),
        "{out}{err}"
    );
    // State and token files that can never be files: refused by check.
    for (key, v) in [
        ("state_file", "/"),
        ("state_file", "/dev/null"),
        ("state_file", "/tmp"),
    ] {
        let c = config("", &format!("{key}: {v}\n"));
        refused(&d.put("sf.yaml", &c), &format!("{key}: {v}"));
    }
    for v in ["/", "/dev/null"] {
        let c = config("", &format!("api:\n  token_file: {v}\n"));
        refused(&d.put("tf.yaml", &c), "api.token_file");
    }
    // A target below a microsecond.
    let c = config("", "").replace("p99: 1ms", "p99: 0.000000001us");
    refused(&d.put("tgt.yaml", &c), "at least 1us");
}

#[test]
fn hardening2_a_file_of_the_wrong_kind_is_named_as_such() {
    let d = Dir::new();
    let cfg = d.put("config.yaml", &config("", ""));
    let sc = d.put("sc.yaml", &scenario("", "{ kind: constant, level: 0.5 }"));
    let pol = d.path("parties.yaml");
    let cases: [(Vec<&str>, &str); 4] = [
        (
            vec!["check", "--kind", "config", pol.to_str().unwrap()],
            "this looks like a policy",
        ),
        (
            vec!["check", "--kind", "policy", cfg.to_str().unwrap()],
            "this looks like a daemon config",
        ),
        (
            vec!["check", "--kind", "scenario", cfg.to_str().unwrap()],
            "this looks like a daemon config",
        ),
        (
            vec![
                "replay",
                "--sim",
                "--policy",
                sc.to_str().unwrap(),
                sc.to_str().unwrap(),
            ],
            "this looks like a scenario",
        ),
    ];
    for (args, want) in cases {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want {want:?}, got {err}");
    }
    let (code, _, err) = run(&["run", "--dry-run", "--config", pol.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("this looks like a policy"), "{err}");
}

#[test]
fn hardening2_invalid_command_lines_exit_2() {
    let d = Dir::new();
    let sc = d.put("sc.yaml", &scenario("", "{ kind: constant, level: 0.5 }"));
    let s = sc.to_str().unwrap();
    let out = d.path("out");
    let o = out.to_str().unwrap();
    for rps in ["0", "NaN", "inf", "1e308", "-5"] {
        let (code, _, err) = run(&["calibrate", s, "--sim", "--max-rps", rps, "--out", o]);
        assert_eq!(code, 2, "--max-rps {rps}: {err}");
    }
    let cases: [&[&str]; 4] = [
        &[
            "replay",
            s,
            "--sim",
            "--resources",
            "cores,cores",
            "--out",
            o,
        ],
        &["trace", "--pid", "1", "--port", "0", "--duration", "1"],
        &["restore", "--root", "relative"],
        &["metrics", "--addr", "garbage"],
    ];
    for args in cases {
        let (code, _, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
}

#[test]
fn hardening2_init_and_root_groups_need_force() {
    let d = Dir::new();
    let c = config("", "").replace("match: { comm: a }", "match: { pid: 1 }");
    refused(&d.put("init.yaml", &c), "pid 1 is init");
    let forced = config("", "").replace("match: { comm: a }", "match: { pid: 1, force: true }");
    let (code, _, err) = run(&["check", d.put("forced.yaml", &forced).to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    if Path::new("/sys/fs/cgroup/cpuset/cgroup.procs").exists() {
        let c = config("", "").replace(
            "match: { comm: a }",
            "match: { cgroup: /sys/fs/cgroup/cpuset }",
        );
        refused(&d.put("root.yaml", &c), "the root of a cgroup hierarchy");
        let c = config("", "").replace(
            "match: { comm: a }",
            "match: { cgroup: /sys/fs/cgroup/cpuset/ }",
        );
        refused(&d.put("root2.yaml", &c), "the root of a cgroup hierarchy");
    }
    let state = d.path("state.json");
    let (code, out, err) = run(&[
        "set",
        "--dry-run",
        "--state-file",
        state.to_str().unwrap(),
        "cores",
        "--pid",
        "1",
        "--cpus",
        "0",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("pid 1 is init"), "{err}");
}
