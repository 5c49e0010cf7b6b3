//! Recorded calibrations for the tests: runs of `qosd calibrate
//! --record-passes` (`passes_*.txt`), rebuilt as passes of each fitted load.

use qosd_sensors::stats::LogHistogram;

use super::{Passes, Point};

/// Largest distance from the median, % of it.
pub fn spread_pct(v: &[f64]) -> f64 {
    let m = qosd_core::measure::median(v.to_vec()).unwrap_or(0.0);
    v.iter().map(|x| (x - m).abs()).fold(0.0, f64::max) * 100.0 / m
}

/// Recorded calibrations (a `passes_*.txt` file): per run, its pole and each fitted load's passes, rebuilt as histograms
/// (a pass's 40 slowest requests as recorded, the rest at the 40th: the
/// pooled p99 of three passes rests on at most the 46 slowest). A blank
/// line or a `#` comment is skipped.
pub fn recorded_passes(text: &str) -> Vec<(f64, Vec<Passes>)> {
    let mut runs: Vec<(f64, Vec<(f64, Passes)>)> = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let f: Vec<f64> = line
            .split_whitespace()
            .skip(usize::from(line.starts_with("cap")))
            .map(|v| v.parse().unwrap())
            .collect();
        if line.starts_with("cap") {
            runs.push((f[1], Vec::new()));
            continue;
        }
        let (n, top) = (f[4] as usize, &f[6..]);
        let mut h = LogHistogram::new();
        for v in top
            .iter()
            .chain(std::iter::repeat_n(&top[top.len() - 1], n - top.len()))
        {
            h.record((v * 1e6) as u64);
        }
        let p = Point {
            offered_rps: f[2],
            achieved_rps: f[3],
            latency_us: f[5] * 1000.0,
        };
        let steps = &mut runs[f[0] as usize].1;
        match steps.iter_mut().find(|(r, _)| *r == f[1]) {
            Some((_, s)) => s.push((p, h)),
            None => steps.push((f[1], vec![(p, h)])),
        }
    }
    runs.into_iter()
        .map(|(pole, s)| (pole, s.into_iter().map(|(_, p)| p).collect()))
        .collect()
}

/// A recorded run (at least three passes a load) read as a calibration
/// with the default two passes and the check: each load's first two
/// passes, and for each load the check picks, its third pass as the
/// retry. The loads and the retried ones (indices).
pub fn as_calibrated(pole: f64, steps: &[Passes]) -> (Vec<Passes>, Vec<usize>) {
    let mut two = first_passes(steps, 2);
    let retry = super::check::to_retry(&two, 99.0, pole);
    for &i in &retry {
        two[i].push(steps[i][2].clone());
    }
    (two, retry)
}

/// The first `n` passes of each load.
pub fn first_passes(steps: &[Passes], n: usize) -> Vec<Passes> {
    steps.iter().map(|s| s[..n].to_vec()).collect()
}

/// A load's latencies (ms) as one pass of a step.
pub fn pass(rps: f64, ms: &[f64]) -> (Point, LogHistogram) {
    let mut h = LogHistogram::new();
    for v in ms {
        h.record((v * 1e6) as u64);
    }
    let p = Point {
        offered_rps: rps,
        achieved_rps: rps,
        latency_us: h.percentile(99.0).unwrap() as f64 / 1e3,
    };
    (p, h)
}
