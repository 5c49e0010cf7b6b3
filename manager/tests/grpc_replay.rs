//! A scenario with a gRPC app replays: on the simulated node (the shipped
//! `scenarios/grpc.yaml`) and on this machine, where the grpc-go fixture
//! server is calibrated, loaded by `qosd load`'s gRPC engine (calls
//! multiplexed on one HTTP/2 connection) and followed by the eBPF sensor
//! in `grpc` mode (uprobes), whose p99 feeds PARTIES (root).
//! Run alone: `cargo test -p qosd-manager --test grpc_replay`.

mod support;

use support::replay::{assert_ebpf_p99_beside_client, calibrate, timeline_rows};
use support::{qosd_in_repo as qosd, repo};

fn ok(args: &[&str]) -> String {
    let o = qosd(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "qosd {args:?}: {err}");
    err
}

#[test]
fn shipped_grpc_scenario_replays_on_the_sim() {
    let t = tempfile::tempdir().unwrap();
    let sc = repo().join("scenarios/grpc.yaml");
    ok(&[
        "replay",
        sc.to_str().unwrap(),
        "--sim",
        "--out",
        t.path().to_str().unwrap(),
    ]);
    let search = timeline_rows(t.path(), "search");
    assert_eq!(search.len(), 600, "300 s at 500 ms");
    // The ramp reaches capacity and PARTIES gives the gRPC app cores for it.
    let cores: Vec<u32> = search.iter().map(|c| c[8].parse().unwrap()).collect();
    let (lo, hi) = (cores.iter().min().unwrap(), cores.iter().max().unwrap());
    assert!(hi > lo, "cores {lo}..{hi}: nothing moved");
}

#[test]
fn real_replay_of_a_multiplexed_grpc_app() {
    support::grpc::fixture_dir(); // builds grpc-fixture-server beside qosd
    let t = tempfile::tempdir().unwrap();
    let sc = t.path().join("grpcmini.yaml");
    std::fs::write(
        &sc,
        "name: grpcmini\nduration_s: 12\ninterval_ms: 500\nfeedback: ebpf\napps:\n  \
         - name: grpcsearch\n    class: lc\n    server:\n      kind: grpc\n      work_us: 200\n    \
         protocol: grpc\n    keepalive: true\n    connections: 1\n    target:\n      knee_factor: 1.0\n    \
         load:\n      kind: ramp\n      from: 0.1\n      to: 0.6\n      over_s: 5\n      hold_s: 2\n      back_s: 5\n",
    )
    .unwrap();
    let cal = t.path().join("cal.json");
    calibrate(&sc, &cal);
    let out = t.path().join("run");
    let err = ok(&[
        "replay",
        sc.to_str().unwrap(),
        "--policy",
        "policies/parties.yaml",
        "--calibration",
        cal.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    // Multiplexed streams: the sensor chose uprobes, not syscall turns.
    assert!(
        err.contains("eBPF request boundaries: grpcsearch grpc"),
        "{err}"
    );
    let rows = timeline_rows(&out, "grpcsearch");
    assert!(rows.len() >= 22, "{} rows", rows.len());
    let achieved: f64 = rows.iter().map(|c| c[3].parse::<f64>().unwrap()).sum();
    assert!(achieved > 0.0, "no call completed");
    // Server-side p99 (the policy's feedback) in nearly every interval, and
    // not above the client's, which adds the connection and the client.
    assert_ebpf_p99_beside_client(&rows);
}
