//! Cost of one policy decision (`Policy::observe` + `Policy::decide`) on
//! synthetic snapshots, for the shipped policies and 4 or 32 apps. Prints a
//! markdown table; run by `scenarios/bench/policy.sh` from `make bench`.
//!
//! `cargo run --release -p qosd-manager --example policy_decide [DECISIONS]`

use std::path::Path;
use std::time::Instant;

use qosd_core::{
    Allocations, AppClass, AppState, FreqRange, MbRange, NodeCaps, QosTarget, Share, Snapshot,
};

fn node() -> NodeCaps {
    NodeCaps {
        nr_cores: 64,
        nr_ways: 20,
        freq: Some(FreqRange {
            min_mhz: 1000,
            max_mhz: 3000,
            step_mhz: 100,
        }),
        mb: Some(MbRange {
            min_percent: 10,
            step_percent: 10,
        }),
        ..NodeCaps::default()
    }
}

/// App `i` at time step `t`: latency swings around the target so that
/// the policy keeps acting (upsizes, downsizes, reverts).
fn snapshot(nr_apps: usize, t: u64) -> Snapshot {
    let apps = (0..nr_apps)
        .map(|i| {
            let phase = ((t as f64) / 7.0 + i as f64).sin();
            let be = i % 4 == 3;
            let class = if be { AppClass::Be } else { AppClass::Lc };
            AppState {
                target: (!be).then_some(QosTarget::new(99.0, 1000.0)),
                latency_us: (!be).then_some(1000.0 * (0.9 + 0.4 * phase)),
                rps: 1000.0,
                nr_samples: 500,
                cpu_util: 0.5 + 0.45 * phase,
                ..AppState::new(format!("app{i:02}"), class)
            }
        })
        .collect();
    Snapshot {
        apps,
        node_power_w: Some(100.0),
        since_ms: None,
    }
}

fn initial(nr_apps: usize) -> Allocations {
    (0..nr_apps)
        .map(|i| {
            let s = Share {
                nr_cores: 1,
                nr_ways: 1,
                freq_mhz: 2000,
                mb_percent: 50,
                ..Share::default()
            };
            (format!("app{i:02}"), s)
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let decisions: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(100_000);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    println!("| policy | apps | decisions | changes | ns per decision (observe ×4 + decide) |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for file in ["parties.yaml", "power-saver.yaml", "cpu-util.yaml"] {
        for nr_apps in [4usize, 32] {
            let path = root.join("policies").join(file);
            let mut policy = qosd_manager::policy::load(&path, 1)?;
            let node = node();
            // Snapshots are built before timing: only the policy is measured.
            let snaps: Vec<Snapshot> = (0..64).map(|t| snapshot(nr_apps, t)).collect();
            let mut cur = initial(nr_apps);
            let mut changes = 0usize;
            let start = Instant::now();
            for d in 0..decisions {
                let s = &snaps[(d % 64) as usize];
                for k in 1..5 {
                    policy.observe(d * 500 + k * 100, s);
                }
                let plan = policy.decide(d * 500 + 500, s, &cur, &node);
                changes += plan.decisions.len();
                cur = plan.allocations;
            }
            let ns = start.elapsed().as_nanos() as f64 / decisions as f64;
            println!("| {file} | {nr_apps} | {decisions} | {changes} | {ns:.0} |");
        }
    }
    Ok(())
}
