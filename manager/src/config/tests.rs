//! Config parsing and validation: the shipped file, and one bad file per
//! kind of mistake, each reported at its file:line:col and key.

use std::net::SocketAddr;
use std::path::Path;

use super::*;

const GOOD: &str = "\
apps:
  - name: web
    match: { comm: nginx }
    class: lc
    target: { p99.9: 20ms }
    resources:
      initial: { nr_cores: 2 }
      min: { nr_cores: 1 }
      max: { nr_cores: 4, mb_percent: 100 }
  - name: batch
    match: { cgroup: /sys/fs/cgroup/batch }
    class: be
";

fn parse(text: &str) -> Result<Config, FileError> {
    Config::parse(Path::new("c.yaml"), text)
}

/// The error for `GOOD` with `from` replaced by `to`.
fn err_with(from: &str, to: &str) -> FileError {
    assert!(GOOD.contains(from), "{from}");
    parse(&GOOD.replacen(from, to, 1)).expect_err(to)
}

#[test]
fn shipped_config_is_valid_with_its_policy() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config.yaml");
    let (c, policy) = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.apps[0].matcher.comm.as_deref(), Some("memcached"));
    assert_eq!(c.apps[0].feedback, Feedback::Ebpf);
    assert_eq!(c.apps[0].latency, LatencyFrom::Arrival);
    assert_eq!((c.monitor_interval_ms, c.decide_interval_ms), (100, 500));
    assert_eq!(c.api.listen.to_string(), DEFAULT_API_ADDR);
    assert_eq!(policy.name, "parties");
}

#[test]
fn defaults_fill_what_is_left_out() {
    let c = parse(GOOD).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.policy, Path::new("policies/parties.yaml"));
    assert_eq!(c.api.listen.to_string(), "127.0.0.1:9477");
    assert_eq!(c.actuators.enabled, Resource::ALL.to_vec());
    assert_eq!(c.sensors.ring_buffer_kib, 128);
    let web = &c.apps[0];
    assert_eq!(web.qos_target(), Some(QosTarget::new(99.9, 20_000.0)));
    assert_eq!(web.initial_share().nr_cores, 2);
    let l = web.limits();
    assert_eq!(
        (l.min.nr_cores, l.max.nr_cores, l.max.mb_percent),
        (1, 4, 100)
    );
    assert_eq!(l.max.nr_ways, u32::MAX);
    assert_eq!(
        c.policy_path(Path::new("/etc/qosd/config.yaml")),
        Path::new("/etc/qosd/policies/parties.yaml")
    );
}

#[test]
fn unknown_key_names_line_col_and_key() {
    let e = err_with("    class: be\n", "    class: be\n    colour: red\n");
    assert_eq!(
        (e.line, e.col, e.key.as_str()),
        (13, 5, "apps[1].colour"),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with("c.yaml:13:5: apps[1].colour: unknown field `colour`"),
        "{e}"
    );
}

#[test]
fn unknown_resource_is_an_unknown_key() {
    let e = err_with("min: { nr_cores: 1 }", "min: { nr_cores: 1, gpus: 2 }");
    assert_eq!(
        (e.line, e.key.as_str()),
        (8, "apps[0].resources.min.gpus"),
        "{e}"
    );
    assert!(e.msg.contains("expected one of `nr_cores`"), "{e}");
}

#[test]
fn wrong_unit_and_zero_target() {
    let e = err_with("p99.9: 20ms", "p99.9: 20 parsecs");
    assert_eq!(
        (e.line, e.col, e.key.as_str()),
        (5, 15, "apps[0].target.p99.9"),
        "{e}"
    );
    assert!(e.msg.contains("unknown unit `parsecs`"), "{e}");
    let e = err_with("p99.9: 20ms", "p99.9: 0ms");
    assert_eq!((e.line, e.key.as_str()), (5, "apps[0].target.p99.9"), "{e}");
    assert!(e.msg.contains("greater than 0"), "{e}");
    let e = err_with("p99.9: 20ms", "p99.9: 20");
    assert!(e.msg.contains("needs a unit"), "{e}");
    let e = err_with("p99.9: 20ms", "q99: 20ms");
    assert!(e.msg.contains("not a percentile"), "{e}");
}

#[test]
fn wrong_types_and_enum_values() {
    let e = err_with("class: lc", "class: critical");
    assert_eq!((e.line, e.key.as_str()), (4, "apps[0].class"), "{e}");
    assert!(e.msg.contains("unknown variant `critical`"), "{e}");
    let e = err_with("nr_cores: 2", "nr_cores: two");
    assert_eq!(
        (e.line, e.key.as_str()),
        (7, "apps[0].resources.initial.nr_cores"),
        "{e}"
    );
    let e = err_with("class: lc", "class: lc\n    latency: read");
    assert_eq!((e.line, e.key.as_str()), (5, "apps[0].latency"), "{e}");
    assert!(e.msg.contains("unknown variant `read`"), "{e}");
    let c = parse(&GOOD.replacen("class: lc", "class: lc\n    latency: service", 1)).unwrap();
    assert_eq!(c.apps[0].latency, LatencyFrom::Service);
    assert_eq!(c.apps[1].latency, LatencyFrom::Arrival);
    let e = parse(&format!("{GOOD}api: {{ listen: localhost }}\n")).unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (13, "api.listen"), "{e}");
    let e = parse(&format!(
        "{GOOD}actuators: {{ enabled: [cores, cpu_quota], cpu_quota_unit_milli: 5 }}\n"
    ))
    .unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (13, "actuators.cpu_quota_unit_milli"),
        "{e}"
    );
    let c = parse(&format!("{GOOD}actuators: {{ enabled: [cores, quota] }}\n")).unwrap();
    assert_eq!(
        c.actuators.enabled,
        vec![Resource::Cores, Resource::CpuQuota]
    );
    assert_eq!(c.actuators.cpu_quota_unit_milli, 100);
    let e = parse(&format!("{GOOD}actuators: {{ enabled: [cores, gpus] }}\n")).unwrap_err();
    assert_eq!(e.line, 13, "{e}");
    assert!(e.key.starts_with("actuators.enabled"), "{e}");
}

#[test]
fn semantic_errors_point_at_their_key() {
    let cases: &[(&str, &str, usize, &str, &str)] = &[
        (
            "max: { nr_cores: 4,",
            "max: { nr_cores: 0,",
            9,
            "apps[0].resources.max.nr_cores",
            "at least 1",
        ),
        (
            "initial: { nr_cores: 2 }",
            "initial: { nr_cores: 9 }",
            7,
            "apps[0].resources.initial.nr_cores",
            "outside [1, 4]",
        ),
        (
            "min: { nr_cores: 1 }",
            "min: { nr_cores: 5 }",
            8,
            "apps[0].resources.min.nr_cores",
            "above max 4",
        ),
        (
            "mb_percent: 100",
            "mb_percent: 101",
            9,
            "apps[0].resources.max.mb_percent",
            "1 to 100",
        ),
        (
            "mb_percent: 100",
            "mb_percent: 100, cpu_quota_milli: 5",
            9,
            "apps[0].resources.max.cpu_quota_milli",
            "at least 10",
        ),
        (
            "match: { comm: nginx }",
            "match: { comm: nginx, pid: 4 }",
            3,
            "apps[0].match",
            "exactly one",
        ),
        (
            "match: { comm: nginx }",
            "match: { comm: a-very-long-command-name }",
            3,
            "apps[0].match.comm",
            "15 bytes",
        ),
        (
            "match: { comm: nginx }",
            "match: { pid: -3 }",
            3,
            "apps[0].match.pid",
            "positive",
        ),
        // An absent key is shown at its app.
        (
            "    class: lc\n    target: { p99.9: 20ms }\n",
            "    class: lc\n",
            2,
            "apps[0].target",
            "needs a target",
        ),
        // A batch job instead of `match:`, for best-effort apps only.
        (
            "    match: { cgroup: /sys/fs/cgroup/batch }\n",
            "    job: { kind: hash, threads: 0 }\n",
            11,
            "apps[1].job.threads",
            "1..=256",
        ),
        (
            "    match: { cgroup: /sys/fs/cgroup/batch }\n",
            "    job: { kind: hash, op_kib: 5000 }\n",
            11,
            "apps[1].job.op_kib",
            "1..=4096",
        ),
        (
            "    class: be\n",
            "    class: be\n    job: { kind: hash }\n",
            11,
            "apps[1].match",
            "drop `match`",
        ),
        (
            "    match: { comm: nginx }\n",
            "    job: { kind: hash }\n",
            3,
            "apps[0].job",
            "best-effort apps (class: be)",
        ),
        (
            "    match: { cgroup: /sys/fs/cgroup/batch }\n",
            "    job: { kind: hash }\n    ports: [80]\n",
            12,
            "apps[1].ports",
            "takes no requests",
        ),
        (
            "    match: { cgroup: /sys/fs/cgroup/batch }\n",
            "",
            10,
            "apps[1].match",
            "or, for a best-effort app, a `job`",
        ),
        (
            "name: batch",
            "name: web",
            10,
            "apps[1].name",
            "used by an earlier app",
        ),
        (
            "name: web",
            "name: web server",
            2,
            "apps[0].name",
            "letters, digits",
        ),
        (
            "class: be",
            "class: be\n    resources: { initial: { cpu_priority: 3 } }",
            13,
            "apps[1].resources.initial.cpu_priority",
            "for latency-critical apps",
        ),
        (
            "max: { nr_cores: 4,",
            "max: { cpu_priority: 3, nr_cores: 4,",
            9,
            "apps[0].resources.max.cpu_priority",
            "initial: { cpu_priority: 3 }",
        ),
    ];
    for (from, to, line, key, msg) in cases {
        let e = err_with(from, to);
        assert_eq!((e.line, e.key.as_str()), (*line, *key), "{to}: {e}");
        assert!(e.msg.contains(msg), "{to}: {e}");
        assert!(e.col > 0, "{e}");
    }
    let e = parse(&format!(
        "{GOOD}monitor_interval_ms: 100\ndecide_interval_ms: 250\n"
    ))
    .unwrap_err();
    assert_eq!(
        (e.line, e.col, e.key.as_str()),
        (14, 1, "decide_interval_ms"),
        "{e}"
    );
    let e = parse(&format!("{GOOD}sensors: {{ ring_buffer_kib: 100 }}\n")).unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (13, "sensors.ring_buffer_kib"),
        "{e}"
    );
    for (net, key) in [
        ("{ bin_ms: 3 }", "sensors.net.bin_ms"),
        ("{ top_n: 0 }", "sensors.net.top_n"),
        ("{ ifaces: [eth0, \"a b\"] }", "sensors.net.ifaces[1]"),
    ] {
        let e = parse(&format!("{GOOD}sensors: {{ net: {net} }}\n")).unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (13, key), "{e}");
    }
    let c = parse(&format!("{GOOD}sensors: {{ net: {{}} }}\n")).unwrap();
    let n = c.sensors.net.unwrap();
    assert_eq!((n.bin_ms, n.top_n, n.ifaces.len()), (1, 10, 0));
    let e = parse(&format!("{GOOD}state_file: run/state.json\n")).unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (13, "state_file"), "{e}");
    let e = parse("apps: []\n").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (1, "apps"), "{e}");
}

#[test]
fn best_effort_apps_may_run_a_batch_job() {
    let c = parse(&GOOD.replace(
        "    match: { cgroup: /sys/fs/cgroup/batch }\n",
        "    job: { kind: hash, threads: 2 }\n",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.apps[1].matcher, Match::default());
    assert_eq!(
        c.apps[1].job,
        Some(JobSpec::Hash {
            threads: 2,
            op_kib: 16
        })
    );
    // The job's schema is strict: an unknown kind or key is named.
    for (bad, word) in [
        ("{ kind: gzip }", "gzip"),
        ("{ kind: hash, thread: 2 }", "thread"),
    ] {
        let e = parse(&GOOD.replace(
            "    match: { cgroup: /sys/fs/cgroup/batch }\n",
            &format!("    job: {bad}\n"),
        ))
        .expect_err(bad);
        assert_eq!(e.line, 11, "{e}");
        assert!(e.to_string().contains(word), "{e}");
        if word == "thread" {
            assert_eq!((e.key.as_str(), e.col), ("apps[1].job.thread", 24), "{e}");
        }
    }
}

/// The shipped config's commented-out batch-job app is valid as written.
#[test]
fn shipped_batch_job_example_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config.yaml");
    let text = std::fs::read_to_string(&path).expect("config.yaml");
    let on = text
        .replace("  # - name: batch\n", "  - name: batch\n")
        .replace("  #   class: be\n", "    class: be\n")
        .replace("  #   job: {", "    job: {");
    assert_ne!(on, text, "the example is in config.yaml");
    let c = Config::parse(&path, &on).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.apps[1].name, "batch");
    assert!(c.apps[1].job.is_some());
}

#[test]
fn missing_or_invalid_policy_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, format!("{GOOD}policy: nowhere.yaml\n")).expect("write");
    let e = Config::load(&cfg).unwrap_err();
    assert_eq!(
        (e.path.as_path(), e.line, e.key.as_str()),
        (cfg.as_path(), 13, "policy"),
        "{e}"
    );
    assert!(e.msg.contains("nowhere.yaml"), "{e}");

    let pol = dir.path().join("bad.yaml");
    std::fs::write(&pol, "name: bad\nparties:\n  upsize_below_slack: high\n").expect("write");
    std::fs::write(&cfg, format!("{GOOD}policy: bad.yaml\n")).expect("write");
    let e = Config::load(&cfg).unwrap_err();
    assert_eq!(
        (e.path.as_path(), e.line, e.key.as_str()),
        (pol.as_path(), 3, "parties.upsize_below_slack"),
        "{e}"
    );
}

#[test]
fn default_api_address_parses() {
    assert_eq!(
        DEFAULT_API_ADDR.parse::<SocketAddr>().ok(),
        Some(SocketAddr::from(([127, 0, 0, 1], 9477)))
    );
}

#[test]
fn sensors_aggregate_is_kernel_records_or_unset() {
    use qosd_sensors::ebpf::Aggregate;
    assert_eq!(parse(GOOD).unwrap().sensors.aggregate, None);
    let c = parse(&format!("{GOOD}sensors: {{ aggregate: kernel }}\n")).unwrap();
    assert_eq!(c.sensors.aggregate, Some(Aggregate::Kernel));
    let c = parse(&format!("{GOOD}sensors: {{ aggregate: records }}\n")).unwrap();
    assert_eq!(c.sensors.aggregate, Some(Aggregate::Records));
    let e = parse(&format!("{GOOD}sensors: {{ aggregate: kernal }}\n")).unwrap_err();
    assert_eq!(e.line, 13, "{e}");
    assert!(e.to_string().contains("kernal"), "{e}");
}

#[test]
fn a_latency_critical_app_asks_for_real_time_and_is_admitted_normal() {
    let c = parse(&GOOD.replacen(
        "initial: { nr_cores: 2 }",
        "initial: { nr_cores: 2, cpu_priority: 3 }",
        1,
    ))
    .expect("realtime for an lc app");
    assert!(c.apps[0].wants_realtime());
    assert!(!c.apps[1].wants_realtime());
    let s = c.apps[0].initial_share();
    assert_eq!(s.cpu_priority, qosd_core::knobs::PRIORITY_NORMAL);
    assert_eq!(s.nr_cores, 2);
}

#[test]
fn the_real_time_gates_bounds_are_keys_checked_at_their_place() {
    let c = parse(GOOD).unwrap();
    assert_eq!(c.realtime, super::RealtimeConfig::default());
    assert_eq!((c.realtime.on_below, c.realtime.off_above), (0.6, 0.7));
    let c = parse(&format!(
        "{GOOD}realtime: {{ on_below: 0.4, off_above: 0.5 }}\n"
    ))
    .unwrap();
    assert_eq!((c.realtime.on_below, c.realtime.off_above), (0.4, 0.5));
    for (text, key, msg) in [
        (
            "realtime: { on_below: 0.7 }",
            "realtime.on_below",
            "below off_above (0.7)",
        ),
        (
            "realtime: { on_below: 0.8, off_above: 0.5 }",
            "realtime.on_below",
            "below off_above",
        ),
        (
            "realtime: { off_above: 1.5 }",
            "realtime.off_above",
            "in (0, 1]",
        ),
        (
            "realtime: { on_below: 0 }",
            "realtime.on_below",
            "in (0, 1]",
        ),
        (
            "realtime: { on_below: .nan }",
            "realtime.on_below",
            "in (0, 1]",
        ),
    ] {
        let e = parse(&format!("{GOOD}{text}\n")).unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (13, key), "{text}: {e}");
        assert!(e.col > 1 && e.msg.contains(msg), "{text}: {e}");
    }
    let e = parse(&format!("{GOOD}realtime: {{ off_abov: 0.8 }}\n")).unwrap_err();
    assert!(e.to_string().contains("off_abov"), "{e}");
}
