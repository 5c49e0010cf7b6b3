//! Why each load has its own arrivals, the same in every pass: the load
//! generator's Poisson arrivals for one seed, fed to a FIFO queue with the
//! demo's service time (1 / 960 s) over a 2 ms floor, step by step as a
//! sweep runs them. No timing: the queue is computed.

use crate::calibrate::check::disagreement;
use crate::calibrate::{CurveFit, Point};
use crate::load::{Arrival, Rate, Schedule};
use qosd_sensors::stats::LogHistogram;

/// The demo's fitted loads (rps) and its capacity.
const LOADS: [f64; 7] = [95.0, 135.0, 192.0, 274.0, 393.0, 547.0, 754.0];
const POLE: f64 = 960.0;

/// One 2 s step at `rps` on the arrivals of `seed`: its point and latencies.
fn step(rps: f64, seed: u64) -> (Point, LogHistogram) {
    let s_ns = 1e9 / POLE;
    let mut free = 0.0f64;
    let mut h = LogHistogram::new();
    for t in Schedule::new(Rate::Constant(rps), Arrival::Poisson, seed, 2_000_000_000) {
        free = free.max(t as f64) + s_ns;
        h.record((free - t as f64) as u64 + 2_000_000);
    }
    let p = Point {
        offered_rps: rps,
        achieved_rps: rps,
        latency_us: h.percentile(99.0).unwrap() as f64 / 1e3,
    };
    (p, h)
}

/// The fitted knee latency (µs) of one pass, each load on `seed(k)`.
fn knee(seed: impl Fn(usize) -> u64) -> f64 {
    let steps: Vec<(Point, u64)> = LOADS
        .iter()
        .enumerate()
        .map(|(k, &r)| {
            let (p, h) = step(r, seed(k));
            (p, h.len())
        })
        .collect();
    CurveFit::of(&steps, POLE).unwrap().knee().1
}

/// Before, every step of the sweep's pass ran on seed 1 and every step of
/// the next on seed 1001: one arrival sequence each, scaled to every
/// rate, so one burst in it raised the whole pass. Seed 1's knee sits
/// high among 200 seeds (168th), seed 1001's low (34th), 1.13× apart on
/// this queue: the order of the quiet calibrations' passes (seed 1 above
/// 2001 above 1001, 1.4× from first to second on the fixture server).
#[test]
fn one_seed_for_every_load_set_a_whole_pass_apart() {
    let (k1, k1001) = (knee(|_| 1), knee(|_| 1001));
    let others: Vec<f64> = (0..200u64).map(|s| knee(|_| 7 + 13 * s)).collect();
    let below = |k: f64| others.iter().filter(|&&x| x < k).count();
    let ranks = (below(k1), below(k1001));
    assert!(
        k1 / k1001 > 1.1 && ranks.0 >= 160 && ranks.1 <= 80,
        "{k1} {k1001}: {ranks:?}"
    );
}

/// Two passes of a load on different arrivals differ by luck alone, the
/// more the nearer capacity: at 754 rps (0.79 of it) by 1.5× or more in
/// one pair of ten, and the requests above the pooled p99 split far from
/// even in most pairs. No factor tells a stall from that, so a load's
/// passes share its arrivals, and the check compares like with like.
#[test]
fn passes_on_different_arrivals_disagree_by_luck_alone() {
    let mut ratios = Vec::new();
    let mut lopsided = 0;
    for s in 0..100u64 {
        let (a, b) = (step(754.0, 11 + 2 * s), step(754.0, 5000 + 2 * s));
        ratios.push(a.0.latency_us.max(b.0.latency_us) / a.0.latency_us.min(b.0.latency_us));
        let d = disagreement(&[a, b], 99.0).unwrap();
        lopsided += usize::from(d.p_value < crate::calibrate::DISAGREE_P);
    }
    let q90 = qosd_core::measure::quantile(&ratios, 0.9).unwrap();
    assert!(q90 > 1.4, "{q90}");
    assert!(lopsided > 30, "{lopsided}");
    // The same arrivals twice: the same queue, no disagreement at all.
    let (a, b) = (step(754.0, 11), step(754.0, 11));
    assert!(disagreement(&[a, b], 99.0).unwrap().p_value > 0.99);
}
