//! What a finite number of requests shows of the simulated latency
//! distribution. The queueing model gives each tick's distribution in
//! closed form; a real sensor sees only the requests that completed, and
//! a p99 of 100 requests is their second largest. Drawing the percentile
//! of `n` requests as an order statistic (its rank's Beta law, then the
//! mixture's quantile) costs O(1) per figure whatever `n` is, and gives
//! the sim the sampling noise of real windows: wide at low load, narrow
//! at high load.

use rand::Rng;

use super::model::{percentile, Sample};

/// Requests in `samples` (their completed weights), rounded.
pub fn nr_requests(samples: &[Sample]) -> u64 {
    samples.iter().map(|s| s.weight).sum::<f64>().round() as u64
}

/// The `p`-th percentile (µs) that a sensor would report from the
/// requests of `samples`, client side and server side (the same requests:
/// one rank draw serves both), and how many requests it rests on. `None`
/// for both when no request completed.
pub fn sampled_percentiles<R: Rng>(
    samples: &[Sample],
    p: f64,
    rng: &mut R,
) -> (Option<f64>, Option<f64>, u64) {
    let n = nr_requests(samples);
    if n == 0 {
        return (None, None, 0);
    }
    // The empirical p-quantile is the k-th smallest of n requests.
    let k = ((p / 100.0) * n as f64).ceil().clamp(1.0, n as f64) as u64;
    let u = order_statistic(k, n, rng);
    let q = 100.0 * u;
    (
        percentile(samples, q, true),
        percentile(samples, q, false),
        n,
    )
}

/// The k-th smallest of `n` uniform draws: Beta(k, n − k + 1), drawn as
/// X / (X + Y) with X ~ Gamma(k), Y ~ Gamma(n − k + 1).
pub fn order_statistic<R: Rng>(k: u64, n: u64, rng: &mut R) -> f64 {
    let x = gamma(k, rng);
    let y = gamma(n + 1 - k, rng);
    (x / (x + y)).clamp(0.0, 1.0)
}

/// Gamma(a, 1) for a whole `a` ≥ 1: a sum of exponentials while `a` is
/// small (exact; the tail side of a p99 rank), Wilson–Hilferty's cube of
/// a normal beyond (within a fraction of a percent there).
fn gamma<R: Rng>(a: u64, rng: &mut R) -> f64 {
    if a <= 32 {
        return (0..a).map(|_| -(1.0 - rng.gen::<f64>()).ln()).sum();
    }
    let a = a as f64;
    let z = normal(rng);
    let c = 1.0 - 1.0 / (9.0 * a) + z / (3.0 * a.sqrt());
    (a * c * c * c).max(0.0)
}

/// A standard normal draw (Box–Muller).
pub fn normal<R: Rng>(rng: &mut R) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::model::Queue;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// Beta(k, n − k + 1) has mean k / (n + 1): checked where the exact
    /// sum and the Wilson–Hilferty branch meet.
    #[test]
    fn order_statistics_have_the_beta_mean() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for (k, n) in [(99, 100), (990, 1000), (1, 10), (9900, 10000)] {
            let m: f64 = (0..4000)
                .map(|_| order_statistic(k, n, &mut rng))
                .sum::<f64>()
                / 4000.0;
            let want = k as f64 / (n + 1) as f64;
            assert!((m - want).abs() < 0.004, "k {k} n {n}: {m} vs {want}");
        }
    }

    /// A p99 of 100 requests scatters widely around the distribution's
    /// p99; of 100 000 it sits on it. The sides keep their gap.
    #[test]
    fn few_requests_give_a_noisy_percentile_many_an_exact_one() {
        let sample = |weight: f64| Sample {
            queue: Queue::new(1, 100.0, 1.0, 0.005),
            throttle: None,
            shift_us: 0.0,
            network_us: 300.0,
            noise: 1.0,
            weight,
        };
        let exact = percentile(&[sample(1.0)], 99.0, false).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let spread = |w: f64, rng: &mut ChaCha8Rng| {
            let v: Vec<f64> = (0..300)
                .map(|_| {
                    let (c, e, n) = sampled_percentiles(&[sample(w)], 99.0, rng);
                    assert_eq!(n, w as u64);
                    assert!((c.unwrap() - e.unwrap() - 300.0).abs() < 2.0);
                    e.unwrap() / exact - 1.0
                })
                .collect();
            let m = v.iter().sum::<f64>() / v.len() as f64;
            (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64).sqrt()
        };
        let (few, many) = (spread(100.0, &mut rng), spread(100_000.0, &mut rng));
        assert!(few > 0.15, "{few}");
        assert!(many < 0.03, "{many}");
        assert_eq!(sampled_percentiles(&[sample(0.2)], 99.0, &mut rng).2, 0);
    }
}
