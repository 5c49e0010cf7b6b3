//! The request sensor against a busy server (root, real eBPF): qosd's
//! fixture near its knee, loaded open-loop by `qosd load` with requests
//! pipelined on 8 keep-alive connections, as a calibration or a replay
//! loads it (`support::loaded`). Over the same requests the server-side
//! p99 must not read above the client's: the client's latency of a
//! request holds all that the server adds to it. Timing every request of
//! a turn from the turn's first arrival read 1.1-1.4x the client's p99
//! here from ~55 % of capacity up (docs/requests.md, "Timing").
//! Run alone: `cargo test --release -p qosd-manager --test trace_loaded`.

mod support;

use support::loaded::{loaded_runs, WORK_US};

/// Share of the measured capacity offered: near the knee, where queues
/// build on the connections (the calibrations' knees sit at 50-60 %).
const LOAD_SHARE: f64 = 0.7;
/// How far the eBPF p99 may read above the client's: each is read off a
/// log histogram that answers within 0.4 % of the nearest-rank value
/// (sensors/src/stats.rs; the kernel's histograms keep the same buckets,
/// bpf/agg.h), so two of them can differ by 0.8 % on identical samples.
const HIST_ROOM: f64 = 1.01;

#[test]
fn ebpf_p99_is_not_above_the_clients_near_the_knee() {
    for run in loaded_runs(LOAD_SHARE) {
        let (client, ebpf) = run.p99s();
        let aggregate = run.aggregate;
        // The load did build queues (else this would test nothing).
        assert!(
            client > 3.0 * WORK_US as f64,
            "{aggregate}: client p99 {client} us: no queueing"
        );
        assert!(
            ebpf <= HIST_ROOM * client,
            "{aggregate}: eBPF p99 {ebpf} us above the client's {client} us"
        );
    }
}
