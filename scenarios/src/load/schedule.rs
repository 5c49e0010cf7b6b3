//! Arrival schedules: when each request is due, fixed in advance by the rate
//! profile and the seed, never by the replies (open loop).

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// How requests are spaced at a given rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrival {
    /// Exponential gaps (a Poisson process): the usual model of many
    /// independent clients.
    #[default]
    Poisson,
    /// Evenly spaced requests, 1/rate apart.
    Uniform,
}

impl std::str::FromStr for Arrival {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "poisson" => Ok(Arrival::Poisson),
            "uniform" => Ok(Arrival::Uniform),
            _ => Err(format!(
                "unknown arrival process {s:?} (poisson or uniform)"
            )),
        }
    }
}

/// Offered load in requests per second as a function of the time since the
/// start, in seconds.
#[derive(Clone)]
pub enum Rate {
    Constant(f64),
    Profile(Arc<dyn Fn(f64) -> f64 + Send + Sync>),
}

impl std::fmt::Debug for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rate::Constant(r) => write!(f, "Constant({r})"),
            Rate::Profile(_) => f.write_str("Profile(..)"),
        }
    }
}

impl Rate {
    pub fn at(&self, t_s: f64) -> f64 {
        let r = match self {
            Rate::Constant(r) => *r,
            Rate::Profile(f) => f(t_s),
        };
        if r.is_finite() {
            r.clamp(0.0, MAX_RPS)
        } else {
            0.0
        }
    }
}

/// Highest rate a schedule produces, whatever the profile says.
pub const MAX_RPS: f64 = 10_000_000.0;
/// While the rate is zero the schedule looks again this often (ns).
const IDLE_STEP_NS: u64 = 1_000_000;

/// The arrival times of one run, as offsets from its start in nanoseconds,
/// produced lazily in increasing order and ending at `duration_ns`.
pub struct Schedule {
    rate: Rate,
    arrival: Arrival,
    rng: ChaCha8Rng,
    t_ns: f64,
    duration_ns: u64,
    /// No request has left yet (a uniform schedule sends its first at once).
    first: bool,
}

impl Schedule {
    pub fn new(rate: Rate, arrival: Arrival, seed: u64, duration_ns: u64) -> Self {
        Self {
            rate,
            arrival,
            rng: ChaCha8Rng::seed_from_u64(seed),
            t_ns: 0.0,
            duration_ns,
            first: true,
        }
    }
}

impl Iterator for Schedule {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        loop {
            if self.t_ns >= self.duration_ns as f64 {
                return None;
            }
            let r = self.rate.at(self.t_ns / 1e9);
            if r <= 0.0 {
                self.t_ns += IDLE_STEP_NS as f64;
                continue;
            }
            let gap = match self.arrival {
                // -ln(U) with U in (0, 1]: an Exp(1) sample.
                Arrival::Poisson => -(1.0 - self.rng.gen::<f64>()).ln() * 1e9 / r,
                Arrival::Uniform => 1e9 / r,
            };
            // The first uniform request leaves at once, so that N = rate × T.
            if self.first && self.arrival == Arrival::Uniform {
                self.first = false;
                return Some(self.t_ns as u64);
            }
            self.first = false;
            self.t_ns += gap;
            if self.t_ns >= self.duration_ns as f64 {
                return None;
            }
            return Some(self.t_ns as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_count_is_exact() {
        let n = Schedule::new(Rate::Constant(1000.0), Arrival::Uniform, 1, 2_000_000_000).count();
        assert_eq!(n, 2000);
    }

    #[test]
    fn poisson_count_near_rate_and_seeded() {
        let a: Vec<u64> =
            Schedule::new(Rate::Constant(5000.0), Arrival::Poisson, 7, 1_000_000_000).collect();
        let b: Vec<u64> =
            Schedule::new(Rate::Constant(5000.0), Arrival::Poisson, 7, 1_000_000_000).collect();
        let c: Vec<u64> =
            Schedule::new(Rate::Constant(5000.0), Arrival::Poisson, 8, 1_000_000_000).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // 5000 ± 5 sigma (sigma = sqrt(5000) ≈ 71).
        assert!((a.len() as i64 - 5000).abs() < 360, "{}", a.len());
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn profile_follows_rate_and_skips_zero() {
        // 0 rps for the first half second, then 2000 rps.
        let rate = Rate::Profile(Arc::new(|t| if t < 0.5 { 0.0 } else { 2000.0 }));
        let v: Vec<u64> = Schedule::new(rate, Arrival::Uniform, 1, 1_000_000_000).collect();
        assert!(v[0] >= 500_000_000, "{}", v[0]);
        assert!((v.len() as i64 - 1000).abs() <= 2, "{}", v.len());
    }
}
