//! Operational analysis (paper 001, after Denning and Buzen) of one app
//! from what the node measures anyway: X, the requests it completed per
//! second (eBPF counts them), and the CPU time its processes used. The
//! service demand D = CPU seconds / request; on an allocation of c CPUs
//! the utilisation is U = X·D / c, the throughput at which it saturates
//! X_sat = c / D, and headroom = 1 − X / X_sat. A policy predicts U on a
//! smaller allocation before it takes a unit away ([`Oa::util_on`]).

use serde::{Deserialize, Serialize};

use crate::policy::{AppState, NodeCaps, Share};
use crate::quota::MILLI_PER_CPU;
use crate::resources::Resource;

/// The operational figures of one app over one window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Oa {
    /// Throughput X, requests/s.
    pub x_rps: f64,
    /// Service demand D, CPU seconds per request.
    pub demand_s: f64,
    /// CPUs of the allocation, c (its cores, or its quota when lower).
    pub cpus: f64,
    /// Utilisation U = X·D / c.
    pub util: f64,
    /// Saturation throughput X_sat = c / D, requests/s.
    pub x_sat_rps: f64,
    /// 1 − X / X_sat (= 1 − U): the share of the allocation left.
    pub headroom: f64,
}

/// Fewer requests per second than this give no demand: a few requests'
/// CPU time is mostly the process's own housekeeping.
pub const MIN_RPS: f64 = 1.0;

impl Oa {
    /// From throughput, CPUs busy and the allocation's CPUs; `None`
    /// without requests, CPU time or CPUs to divide by.
    pub fn of(x_rps: f64, cpus_used: f64, cpus: f64) -> Option<Oa> {
        if !(x_rps >= MIN_RPS && cpus_used > 0.0 && cpus > 0.0 && cpus_used.is_finite()) {
            return None;
        }
        let demand_s = cpus_used / x_rps;
        let x_sat_rps = cpus / demand_s;
        Some(Oa {
            x_rps,
            demand_s,
            cpus,
            util: x_rps * demand_s / cpus,
            x_sat_rps,
            headroom: 1.0 - x_rps / x_sat_rps,
        })
    }

    /// An app's figures under its allocation `share` on `node`.
    pub fn of_app(a: &AppState, share: &Share, node: &NodeCaps) -> Option<Oa> {
        Oa::of(a.rps, a.cpus_used?, cpus_of(share, node)?)
    }

    /// An app's figures over an interval in which it completed `x_rps`
    /// requests/s and kept `cpus_used` CPUs busy, holding `share` (`None`:
    /// not managed) on `node`: see [`cpus_held`].
    pub fn of_interval(
        x_rps: f64,
        cpus_used: Option<f64>,
        share: Option<&Share>,
        node: &NodeCaps,
    ) -> Option<Oa> {
        Oa::of(x_rps, cpus_used?, cpus_held(share, node)?)
    }

    /// Predicted utilisation if the app held `after` instead of `before`
    /// at the same throughput. Fewer CPUs raise it in proportion; a lower
    /// frequency raises the demand at most in proportion (all of a
    /// request's time on the CPU: the cautious guess). Resources whose
    /// effect on the demand is not known (cache ways, memory bandwidth)
    /// predict no change.
    pub fn util_on(&self, before: &Share, after: &Share, node: &NodeCaps) -> f64 {
        let c = cpus_of(after, node).unwrap_or(self.cpus).max(1e-9);
        let f = match (before.freq_mhz, after.freq_mhz) {
            (b, a) if node.has(Resource::Frequency) && a > 0 && b > a => {
                f64::from(b) / f64::from(a)
            }
            _ => 1.0,
        };
        self.x_rps * self.demand_s * f / c
    }

    /// How much the `percentile` (e.g. 99.0) of the queueing wait grows,
    /// in s, if the app held `after` instead of `before` at the same
    /// throughput: M/M/c ([`wait_quantile_s`]) on each allocation's CPUs,
    /// the demand scaled as in [`Oa::util_on`]. `None` when `after`
    /// saturates. Service times with less spread than exponential wait
    /// less, so this errs on the cautious side.
    pub fn wait_growth_on(
        &self,
        before: &Share,
        after: &Share,
        node: &NodeCaps,
        percentile: f64,
    ) -> Option<f64> {
        let p = (percentile / 100.0).clamp(0.5, 0.9999);
        let c0 = cpus_of(before, node).unwrap_or(self.cpus);
        let c1 = cpus_of(after, node).unwrap_or(self.cpus);
        let d1 = self.util_on(before, after, node) * c1 / self.x_rps;
        let now = wait_quantile_s(c0, self.x_rps, self.demand_s, p).unwrap_or(0.0);
        Some((wait_quantile_s(c1, self.x_rps, d1, p)? - now).max(0.0))
    }

    /// How much the `percentile` of the queueing wait grows, in s, if the
    /// throughput rose to `x_rps` on the same CPUs at the same demand
    /// (M/M/c, as [`Oa::wait_growth_on`]). `None` when `x_rps` saturates
    /// them.
    pub fn wait_growth_at(&self, x_rps: f64, percentile: f64) -> Option<f64> {
        let p = (percentile / 100.0).clamp(0.5, 0.9999);
        let now = wait_quantile_s(self.cpus, self.x_rps, self.demand_s, p).unwrap_or(0.0);
        Some((wait_quantile_s(self.cpus, x_rps, self.demand_s, p)? - now).max(0.0))
    }
}

/// Erlang C: the probability that an arrival waits in an M/M/c queue of
/// `c` servers offered `a` = λ/μ erlangs (1 when `a >= c`: saturated).
/// Erlang B by its recurrence, then C from B (no factorials to overflow).
pub fn erlang_c(c: u32, a: f64) -> f64 {
    let c = c.max(1);
    let rho = a / f64::from(c);
    if a <= 0.0 {
        return 0.0;
    }
    if rho >= 1.0 {
        return 1.0;
    }
    let mut b = 1.0;
    for k in 1..=c {
        b = a * b / (f64::from(k) + a * b);
    }
    b / (1.0 - rho * (1.0 - b))
}

/// The `p`-quantile (0 < p < 1) of the waiting time, in s, of an M/M/c
/// queue with `cpus` servers at `x_rps` arrivals/s of `demand_s` CPU
/// seconds each: P(W > t) = C·e^(−(c/D − X)·t), so t_p = ln(C / (1 − p)) /
/// (c/D − X), 0 where fewer than 1 − p wait. Fractional CPUs (a quota)
/// interpolate between the whole counts around them. `None` when
/// saturated (the queue grows without bound).
pub fn wait_quantile_s(cpus: f64, x_rps: f64, demand_s: f64, p: f64) -> Option<f64> {
    let whole = |c: u32| -> Option<f64> {
        let slack_rate = f64::from(c) / demand_s - x_rps;
        if c == 0 || slack_rate <= 0.0 {
            return None;
        }
        let wait_p = erlang_c(c, x_rps * demand_s);
        Some((wait_p / (1.0 - p)).ln().max(0.0) / slack_rate)
    };
    let lo = cpus.floor();
    let frac = cpus - lo;
    let lo_w = whole(lo as u32);
    if frac < 1e-9 {
        return lo_w;
    }
    let hi_w = whole(lo as u32 + 1)?;
    // Below the lower count's saturation the interpolation has no lower
    // end: scale the upper one by the load the fraction must carry.
    let lo_w = lo_w.unwrap_or(hi_w / frac.max(1e-9));
    Some(lo_w + (hi_w - lo_w) * frac)
}

/// CPUs an allocation gives: its cores (where the node has a cores
/// knob), bounded by its CPU quota (where set); `None` when neither
/// says (apps share the CPUs with no quota).
pub fn cpus_of(share: &Share, node: &NodeCaps) -> Option<f64> {
    let cores = node
        .has(Resource::Cores)
        .then_some(f64::from(share.nr_cores))
        .filter(|c| *c > 0.0);
    let quota = (node.has(Resource::CpuQuota) && share.cpu_quota_milli > 0)
        .then(|| f64::from(share.cpu_quota_milli) / f64::from(MILLI_PER_CPU));
    match (cores, quota) {
        (Some(c), Some(q)) => Some(c.min(q)),
        (c, q) => c.or(q),
    }
}

/// CPUs an app can run on: its allocation's ([`cpus_of`]), or all the
/// node's where nothing bounds it (not managed, or no cores or quota
/// knob): its online CPUs ([`NodeCaps::nr_cpus`]), else the cores the
/// cores knob hands out; `None` when the node's size is not known.
pub fn cpus_held(share: Option<&Share>, node: &NodeCaps) -> Option<f64> {
    share.and_then(|s| cpus_of(s, node)).or_else(|| {
        [node.nr_cpus, node.nr_cores]
            .into_iter()
            .find(|n| *n > 0)
            .map(f64::from)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::FreqRange;
    use crate::QuotaRange;

    fn node() -> NodeCaps {
        NodeCaps {
            nr_cores: 8,
            nr_ways: 0,
            freq: Some(FreqRange {
                min_mhz: 1000,
                max_mhz: 3000,
                step_mhz: 100,
            }),
            mb: None,
            quota: Some(QuotaRange {
                step_milli: 100,
                max_milli: 8000,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_laws_hold() {
        // 400 req/s at 2 ms of CPU each on 2 CPUs: 0.8 CPUs busy.
        let o = Oa::of(400.0, 0.8, 2.0).unwrap();
        assert!((o.demand_s - 0.002).abs() < 1e-12);
        assert!((o.util - 0.4).abs() < 1e-12);
        assert!((o.x_sat_rps - 1000.0).abs() < 1e-9);
        assert!((o.headroom - 0.6).abs() < 1e-12);
        assert_eq!(Oa::of(0.5, 0.1, 1.0), None);
        assert_eq!(Oa::of(100.0, 0.0, 1.0), None);
    }

    #[test]
    fn smaller_allocations_predict_higher_utilisation() {
        let n = node();
        let before = Share {
            nr_cores: 2,
            freq_mhz: 3000,
            cpu_quota_milli: 0,
            ..Default::default()
        };
        assert_eq!(cpus_of(&before, &n), Some(2.0));
        let o = Oa::of(400.0, 0.8, 2.0).unwrap();
        let one_core = Share {
            nr_cores: 1,
            ..before
        };
        assert!((o.util_on(&before, &one_core, &n) - 0.8).abs() < 1e-12);
        let quota = Share {
            cpu_quota_milli: 500,
            ..before
        };
        assert_eq!(cpus_of(&quota, &n), Some(0.5));
        assert!((o.util_on(&before, &quota, &n) - 1.6).abs() < 1e-12);
        let slower = Share {
            freq_mhz: 1500,
            ..before
        };
        assert!((o.util_on(&before, &slower, &n) - 0.8).abs() < 1e-12);
        // Not managed, or unbounded: the whole node.
        assert_eq!(cpus_held(None, &n), Some(8.0));
        let unbounded = Share {
            nr_cores: 0,
            cpu_quota_milli: 0,
            ..before
        };
        assert_eq!(cpus_held(Some(&unbounded), &n), Some(8.0));
        assert_eq!(cpus_held(Some(&quota), &n), Some(0.5));
        // The cores knob off (its count 0): the node's online CPUs. They
        // come first where both are known: the knob counts physical cores,
        // and an unbounded app runs on every CPU.
        let no_cores = NodeCaps {
            nr_cores: 0,
            nr_cpus: 6,
            ..n
        };
        assert_eq!(cpus_held(Some(&unbounded), &no_cores), Some(6.0));
        assert_eq!(cpus_held(None, &no_cores), Some(6.0));
        assert_eq!(cpus_held(Some(&quota), &no_cores), Some(0.5));
        let unknown = NodeCaps {
            nr_cpus: 0,
            ..no_cores
        };
        assert_eq!(cpus_held(None, &unknown), None);
        let o = Oa::of_interval(400.0, Some(0.8), Some(&quota), &n).unwrap();
        assert!((o.util - 1.6).abs() < 1e-12);
        assert_eq!(Oa::of_interval(400.0, None, Some(&quota), &n), None);
    }

    #[test]
    fn erlang_c_matches_its_closed_forms() {
        // One server: C = ρ. Two: C = 2ρ² / (1 + ρ).
        assert!((erlang_c(1, 0.6) - 0.6).abs() < 1e-12);
        let rho: f64 = 0.7;
        assert!((erlang_c(2, 1.4) - 2.0 * rho * rho / (1.0 + rho)).abs() < 1e-12);
        assert_eq!(erlang_c(3, 0.0), 0.0);
        assert_eq!(erlang_c(3, 3.0), 1.0);
    }

    #[test]
    fn the_wait_quantile_follows_m_m_c() {
        // M/M/1 at ρ 0.6, D 1 ms: P(W > t) = 0.6·e^(−400 t); p99 at
        // ln(60)/400 s.
        let w = wait_quantile_s(1.0, 600.0, 0.001, 0.99).unwrap();
        assert!((w - 60f64.ln() / 400.0).abs() < 1e-12, "{w}");
        // Fewer than 1 % wait: no wait at the p99.
        assert_eq!(wait_quantile_s(8.0, 100.0, 0.001, 0.99), Some(0.0));
        assert_eq!(wait_quantile_s(2.0, 2000.0, 0.001, 0.99), None);
        // A fraction of a CPU lies between the whole counts.
        let (a, b) = (
            wait_quantile_s(2.0, 1500.0, 0.001, 0.99).unwrap(),
            wait_quantile_s(3.0, 1500.0, 0.001, 0.99).unwrap(),
        );
        let mid = wait_quantile_s(2.5, 1500.0, 0.001, 0.99).unwrap();
        assert!(b < mid && mid < a, "{b} < {mid} < {a}");
        // Below 1.5 CPUs' saturation the lower end is scaled from the upper.
        assert!(wait_quantile_s(1.5, 1200.0, 0.001, 0.99).is_some());
    }

    #[test]
    fn a_small_pool_queues_long_before_a_bound_on_utilisation() {
        // The sim ramp's case: U 0.59 on 4 cores of 1 ms work, 0.79 on 3.
        let n = node();
        let four = Share {
            nr_cores: 4,
            ..Default::default()
        };
        let three = Share {
            nr_cores: 3,
            ..four
        };
        let o = Oa::of(2360.0, 2.36, 4.0).unwrap();
        let grow = o.wait_growth_on(&four, &three, &n, 99.0).unwrap();
        // 4 cores: C ≈ 0.27, p99 wait ≈ 2.0 ms; 3 cores: ≈ 6.4 ms.
        assert!(grow > 0.004 && grow < 0.005, "{grow}");
        let eight = Share {
            nr_cores: 8,
            ..four
        };
        let seven = Share {
            nr_cores: 7,
            ..four
        };
        // The same work on 8 cores (U 0.3) barely queues on 7.
        assert!(o.wait_growth_on(&eight, &seven, &n, 99.0).unwrap() < 1e-4);
        let two = Share {
            nr_cores: 2,
            ..four
        };
        assert_eq!(o.wait_growth_on(&four, &two, &n, 99.0), None);
        // More load on the same 4 cores: the wait at the higher X less
        // the wait now; past X_sat, saturated.
        let up = o.wait_growth_at(2600.0, 99.0).unwrap();
        let want = wait_quantile_s(4.0, 2600.0, 0.001, 0.99).unwrap()
            - wait_quantile_s(4.0, 2360.0, 0.001, 0.99).unwrap();
        assert!((up - want).abs() < 1e-12 && up > 0.0, "{up} vs {want}");
        assert_eq!(o.wait_growth_at(2360.0, 99.0), Some(0.0));
        assert_eq!(o.wait_growth_at(4000.0, 99.0), None);
    }
}
