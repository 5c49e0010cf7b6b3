//! A replay on a calibration whose knee check warned says so, in its
//! summary and under `qosd compare`'s tables; a replay on a good one says
//! nothing. Both calibrations are made by the calibration's own code
//! ([`knee_passes`]: passes, retries, check) from recorded runs of the
//! demo's calibration: one where the machine moved between the passes
//! (`passes_s8.txt` run 0, loaded), one quiet (`passes_s10.txt` run 10),
//! and written and read back as `calibration.json`. No timing: the passes
//! are replayed from the record, the replays run on the simulated node.

use std::path::Path;

use qosd_core::Feedback;

use super::{knee_passes, Load};
use crate::calibrate::recorded::recorded_passes;
use crate::calibrate::{from_points, Calibration};
use crate::load::LoadError;
use crate::output::{compare, summary_table, write_run};
use crate::scenario::Scenario;
use crate::sim::{self, SimOptions, StaticPolicy};
use crate::sweep::SweepOptions;

/// `search`'s calibration from recorded run `run` of `text`: the sweep's
/// pass as the steps, each later pass or retry `knee_passes` asks for
/// served from the record in order.
fn calibrated(text: &str, run: usize) -> Calibration {
    let (pole, loads) = &recorded_passes(text)[run];
    let mut steps: Vec<Load> = loads
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let (p, h) = s[0].clone();
            Load::first(p.offered_rps, k as u64, p, h, None)
        })
        .collect();
    let mut c = from_points(steps.iter().map(|l| *l.point()).collect(), 99.0).unwrap();
    c.capacity_rps = *pole;
    let mut next = vec![1; loads.len()];
    knee_passes(
        &mut steps,
        &mut c,
        &SweepOptions::default(),
        &mut |_, seed, _| {
            let k = seed as usize;
            let pass = loads[k].get(next[k]).cloned();
            next[k] += 1;
            let (p, h) = pass.ok_or_else(|| LoadError::BadSpec(format!("load {k}: no pass")))?;
            Ok((p, h, None))
        },
    )
    .unwrap();
    let mut cal = Calibration {
        source: format!("recorded run {run}"),
        ..Default::default()
    };
    cal.apps.insert("search".into(), c);
    cal
}

/// The demo on the simulated node for 10 s under the static split, on
/// `cal` written and read back as a file: the run's folder, its summary
/// table.
fn replay(cal: &Calibration, dir: &Path) -> String {
    let file = dir.with_extension("json");
    cal.write(&file).unwrap();
    let cal = Calibration::read(&file).unwrap();
    let sc = Scenario::from_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("demo.yaml")).unwrap();
    let opts = SimOptions {
        feedback: Feedback::Ebpf,
        seed: 1,
        duration_s: Some(10.0),
    };
    let tl = sim::run(&sc, &cal, &mut StaticPolicy, &opts);
    let (s, files) = write_run(dir, &tl, &cal).unwrap();
    let json = std::fs::read_to_string(files.summary_json).unwrap();
    assert_eq!(
        json.contains("calibration_doubts"),
        !s.calibration_doubts.is_empty()
    );
    summary_table(&s)
}

#[test]
fn a_replay_on_a_noisy_calibration_says_so_and_on_a_good_one_does_not() {
    let noisy = calibrated(include_str!("../calibrate/passes_s8.txt"), 0);
    let good = calibrated(include_str!("../calibrate/passes_s10.txt"), 10);
    let check = noisy.apps["search"].knee_check.clone().unwrap_or_default();
    assert!(!check.warnings.is_empty(), "{check:?}");
    assert!(good.apps["search"].knee_check.is_none());

    let t = tempfile::tempdir().unwrap();
    let (a, b, q) = (t.path().join("a"), t.path().join("b"), t.path().join("q"));
    let text = replay(&noisy, &a);
    replay(&noisy, &b);
    let line = text
        .lines()
        .find(|l| l.starts_with("calibration: search's knee passes "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("spread ±")
            && line.contains("knee check warning")
            && line.contains("re-run `qosd calibrate` on a quiet machine"),
        "{line}"
    );
    assert!(!replay(&good, &q).contains("calibration:"));

    // `make demo`'s two runs share one calibration: the line once, last.
    let out = t.path().join("cmp");
    let table = compare(&[a.clone(), b, q.clone()], &out).unwrap();
    assert_eq!(table.matches(line).count(), 1, "{table}");
    assert_eq!(table.lines().last(), Some(line), "{table}");
    let table = compare(&[q], &out).unwrap();
    assert!(!table.contains("calibration:"), "{table}");
}
