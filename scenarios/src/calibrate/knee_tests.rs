use super::super::from_points;
use super::*;

/// Steps at `(rps, p99 ms)`, each holding the requests of a 2 s step.
fn steps(raw: &[(f64, f64)]) -> Vec<(Point, u64)> {
    raw.iter()
        .map(|&(r, ms)| {
            let p = Point {
                offered_rps: r,
                achieved_rps: r,
                latency_us: ms * 1000.0,
            };
            (p, (2.0 * r) as u64)
        })
        .collect()
}

/// Five calibrations of `scenarios/demo.yaml` (search on 1 CPU), one
/// after another on this machine with other sessions' builds at nice 19
/// (2026-11-26, main at 25fa701): the sweep's steps, p99 in ms. The
/// capacity step (1031 rps) is past the pole and left out of the fit.
const DEMO_RUNS: [[(f64, f64); 8]; 5] = [
    [
        (95.0, 4.211),
        (135.0, 9.929),
        (192.0, 7.684),
        (274.0, 8.749),
        (393.0, 9.339),
        (547.0, 14.582),
        (754.0, 16.843),
        (1031.0, 197.657),
    ],
    [
        (95.0, 8.274),
        (135.0, 6.046),
        (192.0, 11.239),
        (274.0, 8.552),
        (393.0, 12.419),
        (547.0, 12.157),
        (754.0, 15.172),
        (1031.0, 186.122),
    ],
    [
        (95.0, 6.734),
        (135.0, 5.456),
        (192.0, 4.833),
        (274.0, 7.717),
        (393.0, 11.370),
        (547.0, 10.453),
        (754.0, 14.189),
        (1031.0, 187.171),
    ],
    [
        (95.0, 3.547),
        (135.0, 4.309),
        (192.0, 7.225),
        (274.0, 8.946),
        (393.0, 10.191),
        (547.0, 12.419),
        (754.0, 16.548),
        (1031.0, 175.636),
    ],
    [
        (95.0, 4.702),
        (135.0, 6.570),
        (192.0, 8.045),
        (274.0, 8.372),
        (393.0, 10.912),
        (547.0, 12.354),
        (754.0, 16.417),
        (1031.0, 211.288),
    ],
];

/// Largest distance from the median, % of it.
fn spread_pct(v: &[f64]) -> f64 {
    let m = median(v.to_vec());
    v.iter().map(|x| (x - m).abs()).fold(0.0, f64::max) * 100.0 / m
}

#[test]
fn a_clean_queue_curve_is_recovered_and_its_knee_is_the_power_peak() {
    let truth = CurveFit {
        base_us: 2000.0,
        growth_us: 1500.0,
        pole_rps: 1000.0,
        nr_steps: 0,
        samples: 0,
        median_err_pct: 0.0,
    };
    let raw: Vec<(Point, u64)> = (1..=9)
        .map(|i| {
            let r = i as f64 * 100.0;
            let p = Point {
                offered_rps: r,
                achieved_rps: r,
                latency_us: truth.latency_us(r),
            };
            (p, 1000)
        })
        .collect();
    let f = CurveFit::of(&raw, 1000.0).unwrap();
    assert!((f.base_us - 2000.0).abs() < 1e-6 && (f.growth_us - 1500.0).abs() < 1e-6);
    // The 900 rps step is past 0.8 of the pole: left out.
    assert_eq!((f.nr_steps, f.samples), (8, 8000));
    assert!(f.median_err_pct < 1e-6);
    // The knee maximises rps / latency: no load on a fine grid does better.
    let (k, lk) = f.knee();
    assert!((lk - f.latency_us(k)).abs() < 1e-6);
    let best = (1..1000)
        .map(|i| i as f64)
        .max_by(|a, b| (a / f.latency_us(*a)).total_cmp(&(b / f.latency_us(*b))))
        .unwrap();
    assert!((best - k).abs() <= 1.0, "{best} vs {k}");
}

#[test]
fn one_stalled_step_does_not_drag_the_fit() {
    let curve = |r: f64| 2.0 + 1.5 * r / (1000.0 - r);
    let mut raw: Vec<(f64, f64)> = (1..=8)
        .map(|i| (i as f64 * 110.0, curve(i as f64 * 110.0)))
        .collect();
    let clean = CurveFit::of(&steps(&raw), 1000.0).unwrap().knee();
    // Another process took the CPU during the 330 rps step: 4× its p99.
    raw[2].1 *= 4.0;
    let stalled = CurveFit::of(&steps(&raw), 1000.0).unwrap().knee();
    assert!(
        (stalled.1 / clean.1 - 1.0).abs() < 0.05,
        "{stalled:?} vs {clean:?}"
    );
    assert!(
        (stalled.0 / clean.0 - 1.0).abs() < 0.05,
        "{stalled:?} vs {clean:?}"
    );
}

/// The recorded runs: the knee read off single steps spread by ±44 % (one
/// run put it at 135 rps, 4.3 ms, against ~7.7 ms for the others); the
/// fitted knee keeps all five within ±12 % of their median (−11 % / +8 %:
/// steps of 2 s hold too few requests for ±10 % on these steps alone).
#[test]
fn the_fitted_knee_of_five_noisy_calibrations_repeats() {
    let mut fitted = Vec::new();
    let mut read = Vec::new();
    for run in &DEMO_RUNS {
        let s = steps(run);
        let mut c = from_points(s.iter().map(|(p, _)| *p).collect(), 99.0).unwrap();
        assert_eq!(c.capacity_rps, 1031.0);
        read.push(c.knee_latency_us);
        c.fit_knee(&s);
        let f = c.knee_fit.expect("the demo's curve fits");
        assert_eq!(f.nr_steps, 7);
        assert!(f.median_err_pct < 25.0, "{f:?}");
        // The knee sits on the curve, between the light steps and the pole.
        assert!(c.knee_rps > 400.0 && c.knee_rps < 800.0, "{}", c.knee_rps);
        fitted.push(c.knee_latency_us);
    }
    assert!(spread_pct(&read) > 40.0, "{read:?}");
    assert!(spread_pct(&fitted) <= 12.0, "{fitted:?}");
}

#[test]
fn no_fit_without_three_steps_or_without_growth() {
    let two = steps(&[(100.0, 3.0), (200.0, 4.0), (990.0, 50.0)]);
    assert!(CurveFit::of(&two, 1000.0).is_none());
    // Flat (or falling) latency: no queue to fit, no knee on it.
    let flat = steps(&[(100.0, 5.0), (200.0, 5.0), (400.0, 4.0), (800.0, 3.0)]);
    assert!(CurveFit::of(&flat, 1000.0).is_none());
    // A calibration with no fit keeps the knee read off its steps.
    let mut c = from_points(flat.iter().map(|(p, _)| *p).collect(), 99.0).unwrap();
    let before = (c.knee_rps, c.knee_latency_us);
    c.fit_knee(&flat);
    assert_eq!((c.knee_rps, c.knee_latency_us), before);
    assert!(c.knee_fit.is_none());
}

/// A step the server fell behind in is not on the curve.
#[test]
fn steps_the_server_fell_behind_in_are_left_out() {
    let mut s = steps(&[(100.0, 3.0), (300.0, 4.0), (500.0, 6.0), (700.0, 11.0)]);
    let f = CurveFit::of(&s, 1000.0).unwrap();
    s.push((
        Point {
            offered_rps: 800.0,
            achieved_rps: 600.0,
            latency_us: 900_000.0,
        },
        1200,
    ));
    assert_eq!(CurveFit::of(&s, 1000.0), Some(f));
}

#[test]
fn knee_spread_is_around_the_median() {
    let k = KneeSpread::of(vec![10.0, 12.0, 9.0, 30.0, 11.0], 5000, 3000).unwrap();
    assert_eq!((k.median_us, k.min_us, k.max_us), (11.0, 9.0, 30.0));
    assert!((k.spread_pct - 100.0 * 19.0 / 11.0).abs() < 1e-9);
    assert_eq!(k.repeats_us.len(), 5);
    assert!(KneeSpread::of(vec![f64::INFINITY], 0, 0).is_none());
    let even = KneeSpread::of(vec![1.0, 3.0], 2, 2).unwrap();
    assert_eq!(even.median_us, 2.0);
}

/// A sixth calibration whose capacity came out at 1092 rps (its 1031 rps
/// step, p99 188 ms, counted as kept up with): that step sits at 94 % of
/// the pole, where it would decide the fit alone; left out, the knee lands
/// with the other five.
#[test]
fn a_step_near_the_pole_does_not_decide_the_fit() {
    let s = steps(&[
        (102.0, 6.013),
        (143.0, 6.275),
        (200.0, 8.176),
        (280.0, 8.143),
        (391.0, 10.977),
        (547.0, 12.485),
        (754.0, 16.220),
        (1031.0, 188.219),
    ]);
    let f = CurveFit::of(&s, 1092.0).unwrap();
    assert_eq!(f.nr_steps, 7);
    let (_, lk) = f.knee();
    assert!((lk / 12_830.0 - 1.0).abs() < 0.05, "{lk}");
}
