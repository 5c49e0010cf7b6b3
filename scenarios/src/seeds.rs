//! Several runs of one scenario (seeds on the simulated node, repetitions
//! on real servers): each figure's mean and 95 % confidence interval
//! (Student's t), per app and in total, for `qosd replay --seeds N`.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::sim::oracle::Oracle;
use crate::timeline::{AppSummary, Summary};

/// Mean and the half-width of its 95 % confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MeanCi {
    pub mean: f64,
    pub ci95: f64,
    pub n: usize,
}

/// Two-sided 95 % Student's t quantile for `df` degrees of freedom.
fn t95(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        d if d <= 30 => T[d - 1],
        _ => 1.96,
    }
}

impl MeanCi {
    /// Over the figures of the runs that have one; `None` unless all do.
    pub fn of_all(xs: &[Option<f64>]) -> Option<MeanCi> {
        let v: Option<Vec<f64>> = xs.iter().copied().collect();
        v.filter(|v| !v.is_empty()).map(|v| MeanCi::of(&v))
    }

    /// No figure (a `seeds.json` written before the field existed).
    fn none() -> MeanCi {
        MeanCi {
            mean: f64::NAN,
            ci95: f64::NAN,
            n: 0,
        }
    }

    /// `12.3 ± 0.4` (scaled), or the value alone for a single run.
    pub fn show(&self, scale: f64, decimals: usize) -> String {
        let d = decimals;
        if self.n > 1 && self.ci95.is_finite() {
            format!("{:.d$} ± {:.d$}", self.mean * scale, self.ci95 * scale)
        } else if self.mean.is_finite() {
            format!("{:.d$}", self.mean * scale)
        } else {
            "-".into()
        }
    }

    pub fn of(xs: &[f64]) -> MeanCi {
        let n = xs.len();
        let mean = xs.iter().sum::<f64>() / n.max(1) as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n.max(2) - 1) as f64;
        let ci95 = if n > 1 {
            t95(n - 1) * (var / n as f64).sqrt()
        } else {
            f64::NAN
        };
        MeanCi { mean, ci95, n }
    }
}

/// The figures of one app (or the total) over the runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    pub violation_fraction: MeanCi,
    pub violation_fraction_fed: MeanCi,
    pub core_seconds: MeanCi,
    #[serde(default = "MeanCi::none")]
    pub mean_cores: MeanCi,
    /// CPU quota in force × time, CPU·s (runs that have a quota).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_cpu_seconds: Option<MeanCi>,
    /// The batch job's mean ops/s (apps that run one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub be_ops_per_s: Option<MeanCi>,
    pub energy_j: Option<MeanCi>,
    /// Each run's highest p99 of the fed latency, ms.
    #[serde(default)]
    pub p99_max_ms: Option<MeanCi>,
}

/// `seeds.json`: the runs' seeds and each figure's mean and CI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    pub seeds: Vec<u64>,
    pub apps: BTreeMap<String, Figures>,
    pub total: Figures,
    pub reverts: MeanCi,
    pub cannot_meet: MeanCi,
    /// The oracle's core·s and the runs' ratio to it (simulated runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle_core_seconds: Option<MeanCi>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle_ratio: Option<MeanCi>,
}

fn figures(rows: &[&AppSummary]) -> Figures {
    let f = |g: fn(&AppSummary) -> f64| MeanCi::of(&rows.iter().map(|a| g(a)).collect::<Vec<_>>());
    let opt = |g: fn(&AppSummary) -> Option<f64>| {
        MeanCi::of_all(&rows.iter().map(|a| g(a)).collect::<Vec<_>>())
    };
    Figures {
        violation_fraction: f(|a| a.violation_fraction),
        violation_fraction_fed: f(|a| a.violation_fraction_fed),
        core_seconds: f(|a| a.core_seconds),
        mean_cores: f(|a| a.mean_cores),
        quota_cpu_seconds: opt(|a| a.quota_cpu_seconds),
        be_ops_per_s: opt(|a| a.be_ops_per_s_mean),
        energy_j: opt(|a| a.energy_j),
        p99_max_ms: opt(|a| a.p99_max_ms),
    }
}

/// Aggregates the summaries of runs of one scenario.
pub fn aggregate(runs: &[Summary]) -> Aggregate {
    let mut apps = BTreeMap::new();
    if let Some(first) = runs.first() {
        for name in first.apps.keys() {
            let rows: Vec<&AppSummary> = runs.iter().filter_map(|s| s.apps.get(name)).collect();
            apps.insert(name.clone(), figures(&rows));
        }
    }
    let totals: Vec<&AppSummary> = runs.iter().map(|s| &s.total).collect();
    Aggregate {
        seeds: runs.iter().map(|s| s.seed).collect(),
        apps,
        total: figures(&totals),
        reverts: MeanCi::of(&runs.iter().map(|s| s.reverts as f64).collect::<Vec<_>>()),
        cannot_meet: MeanCi::of(
            &runs
                .iter()
                .map(|s| s.cannot_meet as f64)
                .collect::<Vec<_>>(),
        ),
        oracle_core_seconds: oracle(runs, |o| o.core_seconds),
        oracle_ratio: oracle(runs, |o| o.policy_ratio),
    }
}

fn oracle(runs: &[Summary], get: fn(&Oracle) -> f64) -> Option<MeanCi> {
    MeanCi::of_all(
        &runs
            .iter()
            .map(|s| s.oracle.as_ref().map(get))
            .collect::<Vec<_>>(),
    )
}

/// A table of an aggregate: mean ± 95 % CI half-width.
pub fn table(a: &Aggregate) -> String {
    let mut out = String::new();
    let pm = |m: &MeanCi, scale: f64, d: usize| m.show(scale, d);
    let _ = writeln!(
        out,
        "{:<12} {:>18} {:>18} {:>20} {:>20}",
        "app", "violation %", "fed viol. %", "core·s", "energy J"
    );
    let mut line = |name: &str, f: &Figures| {
        let _ = writeln!(
            out,
            "{:<12} {:>18} {:>18} {:>20} {:>20}",
            name,
            pm(&f.violation_fraction, 100.0, 1),
            pm(&f.violation_fraction_fed, 100.0, 1),
            pm(&f.core_seconds, 1.0, 0),
            f.energy_j.as_ref().map_or("-".into(), |e| pm(e, 1.0, 0)),
        );
    };
    for (n, f) in &a.apps {
        line(n, f);
    }
    line("total", &a.total);
    if let (Some(c), Some(r)) = (&a.oracle_core_seconds, &a.oracle_ratio) {
        let _ = writeln!(
            out,
            "{:<12} {:>18} {:>18} {:>20}  (the runs used {}x its core·s)",
            "oracle",
            "",
            "",
            pm(c, 1.0, 0),
            pm(r, 1.0, 2)
        );
    }
    let _ = writeln!(
        out,
        "reverts {}, cannot-meet events {} (mean ± 95 % CI over {} runs, seeds {:?})",
        pm(&a.reverts, 1.0, 1),
        pm(&a.cannot_meet, 1.0, 1),
        a.seeds.len(),
        a.seeds
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_t_interval() {
        let m = MeanCi::of(&[1.0, 2.0, 3.0, 4.0]);
        assert!((m.mean - 2.5).abs() < 1e-12);
        // sd = 1.291, se = 0.6455, t(3) = 3.182.
        assert!((m.ci95 - 3.182 * 0.645_497).abs() < 1e-3, "{}", m.ci95);
        assert!(MeanCi::of(&[5.0]).ci95.is_nan());
    }
}
