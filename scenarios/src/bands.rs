//! What a run gave each app, by how loaded it was: a latency-critical
//! app's violations (the client-side yardstick) while its offered load
//! was at most a fraction of its calibrated capacity and above it, and a
//! best-effort app's throughput and the CPU it was given and used. The
//! second table of `qosd compare` (`make demo` prints it for PARTIES
//! against the static split).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::calibrate::Calibration;
use crate::timeline::{Row, Summary};

/// Where the load bands split, as a fraction of capacity.
pub const SPLIT: f64 = 0.8;

/// One app of one run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AppBands {
    /// Violating intervals / judged intervals with offered load <= SPLIT
    /// of capacity, and the number judged.
    pub low: Option<(f64, usize)>,
    /// The same above SPLIT (the top of a ramp).
    pub high: Option<(f64, usize)>,
    /// `low` over only the intervals the oracle met (a simulated run's):
    /// the violations some allocation could have avoided. An overload's
    /// backlog still draining as the load falls under SPLIT violates
    /// whatever the allocation; `low` keeps those, this leaves them out.
    pub low_oracle_met: Option<(f64, usize)>,
    /// Mean ops/s of its batch job.
    pub be_ops_per_s: Option<f64>,
    /// Mean CPU quota in force, CPUs (intervals with a quota).
    pub quota_cpus: Option<f64>,
    /// CPU time its job used over the run ÷ the run's length (a real
    /// replay's `meta.be_cpus_used`).
    pub cpus_used: Option<f64>,
    /// The node's 1-minute load average at the run's start and end (a
    /// real replay's `meta.loadavg_1m`): how much else wanted the CPUs.
    pub loadavg: Option<(f64, f64)>,
    /// The run turned the CPU priority knob (`meta.resources`): its batch
    /// jobs ran in the idle class.
    pub idle_class: bool,
}

/// A batch job that used less than this share of its mean quota was
/// held back by something other than its cap (said under the table).
pub const STARVED_SHARE: f64 = 0.25;

/// Per app of `s` (from its timeline `rows`).
pub fn of_run(s: &Summary, rows: &[Row]) -> BTreeMap<String, AppBands> {
    let cal: Option<Calibration> = s
        .meta
        .get("calibration")
        .and_then(|v| serde_json::from_value(v.clone()).ok());
    let used = s.meta.get("be_cpus_used");
    let loadavg = s
        .meta
        .get("loadavg_1m")
        .and_then(|v| Some((v.get(0)?.as_f64()?, v.get(1)?.as_f64()?)));
    let idle_class = s
        .meta
        .get("resources")
        .and_then(|v| v.as_array())
        .is_some_and(|r| r.iter().any(|k| k == "cpu_priority"));
    s.apps
        .iter()
        .map(|(app, a)| {
            let mine: Vec<&Row> = rows.iter().filter(|r| &r.app == app).collect();
            let cap = cal
                .as_ref()
                .and_then(|c| c.apps.get(app))
                .map(|c| c.capacity_rps);
            let band = |high: bool, unmet: &[f64]| {
                let cap = cap?;
                let judged: Vec<bool> = mine
                    .iter()
                    .filter(|r| (r.offered_rps > SPLIT * cap) == high)
                    .filter(|r| !unmet.iter().any(|t| (t - r.t_s).abs() < 1e-6))
                    .filter_map(|r| r.violation)
                    .collect();
                let n = judged.len();
                (n > 0).then(|| (judged.iter().filter(|v| **v).count() as f64 / n as f64, n))
            };
            let quotas: Vec<f64> = mine
                .iter()
                .filter_map(|r| r.cpu_quota_milli)
                .map(|q| f64::from(q) / 1000.0)
                .collect();
            let b = AppBands {
                low: band(false, &[]),
                high: band(true, &[]),
                low_oracle_met: s
                    .oracle
                    .as_ref()
                    .and_then(|o| band(false, &o.infeasible_t_s)),
                be_ops_per_s: a.be_ops_per_s_mean,
                quota_cpus: (!quotas.is_empty())
                    .then(|| quotas.iter().sum::<f64>() / quotas.len() as f64),
                cpus_used: used.and_then(|u| u.get(app)).and_then(|v| v.as_f64()),
                loadavg,
                idle_class,
            };
            (app.clone(), b)
        })
        .collect()
}

/// The table: one line per app per run (`label`, its bands).
pub fn table(runs: &[(String, BTreeMap<String, AppBands>)]) -> String {
    let pct =
        |v: Option<(f64, usize)>| v.map_or("-".into(), |(f, n)| format!("{:.1}% ({n})", f * 100.0));
    let num = |v: Option<f64>, d: usize| v.map_or("-".into(), |x| format!("{x:.d$}"));
    // Two decimals, or two significant digits under 0.1: a job that got
    // 0.003 CPU must not read as 0.00 (nothing measured).
    let cpus = |v: Option<f64>| match v {
        Some(x) if x > 0.0 && x < 0.1 => {
            let prec = (-x.log10()).ceil() as usize + 1;
            format!("{x:.prec$}")
        }
        _ => num(v, 2),
    };
    let split = (SPLIT * 100.0).round();
    // Simulated runs have an oracle: their ≤ SPLIT band also without the
    // intervals it could not meet (a column of its own, the raw one kept).
    let oracle = runs
        .iter()
        .any(|(_, apps)| apps.values().any(|b| b.low_oracle_met.is_some()));
    let met = |b: &AppBands| {
        if oracle {
            format!(" {:>15}", pct(b.low_oracle_met))
        } else {
            String::new()
        }
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<28} {:<10} {:>15} {:>15} {:>10} {:>11} {:>10}{}",
        "run",
        "app",
        format!("viol. ≤{split}%"),
        format!("viol. >{split}%"),
        "BE ops/s",
        "quota CPUs",
        "CPUs used",
        if oracle {
            format!(" {:>15}", format!("≤{split}% o. met"))
        } else {
            String::new()
        }
    );
    for (label, apps) in runs {
        for (app, b) in apps {
            let line = format!(
                "{:<28} {:<10} {:>15} {:>15} {:>10} {:>11} {:>10}{}",
                label,
                app,
                pct(b.low),
                pct(b.high),
                num(b.be_ops_per_s, 0),
                num(b.quota_cpus, 2),
                cpus(b.cpus_used),
                met(b)
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    for (label, apps) in runs {
        for (app, b) in apps {
            if let Some(n) = starved(app, b) {
                let _ = writeln!(out, "{label}: {n}");
            }
        }
    }
    let _ = writeln!(
        out,
        "(viol. ≤{split}% / >{split}%: intervals whose client p99 missed the target while the app's\n \
         offered load was at most / above {split}% of its calibrated capacity (intervals judged);\n \
         quota CPUs: mean CPU quota in force; CPUs used: the batch job's CPU time / run length)"
    );
    if oracle {
        let _ = writeln!(
            out,
            "(≤{split}% o. met: the ≤{split}% band over only the intervals the oracle met: it leaves out\n \
             those no allocation meets, such as an overload's backlog draining as the load falls)"
        );
    }
    out
}

/// Why a batch job used much less CPU than its quota allowed, if it did:
/// its cap did not hold it back, the node's other work did (in the idle
/// class a job runs only when nothing else on the node is runnable, and
/// qosd's groups sit beside every other task on the node).
fn starved(app: &str, b: &AppBands) -> Option<String> {
    let (used, quota) = (b.cpus_used?, b.quota_cpus?);
    if used >= STARVED_SHARE * quota {
        return None;
    }
    let load = b.loadavg.map_or(String::new(), |(s, e)| {
        format!(" (load average {s:.1} at the start, {e:.1} at the end)")
    });
    let why = if b.idle_class {
        "; in the idle class a job runs only when nothing else on the node is runnable"
    } else {
        ""
    };
    Some(format!(
        "{app} used {used:.3} CPU of a {quota:.2} CPU quota ({:.0} %): the rest of the node's work{load} \
         took the CPU its cap left it{why}",
        100.0 * used / quota
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::AppCalibration;
    use crate::timeline::AppSummary;

    fn row(app: &str, offered: f64, viol: Option<bool>, quota: Option<u32>) -> Row {
        Row {
            t_s: 0.5,
            app: app.into(),
            offered_rps: offered,
            achieved_rps: offered,
            client_p99_ms: None,
            ebpf_p99_ms: None,
            target_ms: None,
            violation: viol,
            cores: None,
            freq_mhz: None,
            llc_ways: None,
            mb_percent: None,
            power_w: None,
            ebpf_target_ms: None,
            fed_violation: None,
            cpu_quota_milli: quota,
            be_ops_per_s: None,
            client_slack: None,
            ebpf_slack: None,
            ebpf_target_from: None,
            util: None,
            headroom: None,
            demand_ms: None,
            x_sat_rps: None,
        }
    }

    /// A run's summary whose calibration holds one LC app, "lc", of
    /// capacity 100 rps.
    fn lc_summary() -> Summary {
        let mut cal = Calibration::default();
        cal.apps.insert(
            "lc".into(),
            AppCalibration {
                capacity_rps: 100.0,
                knee_rps: 50.0,
                knee_latency_us: 1.0,
                ebpf_knee_latency_us: None,
                gap: Vec::new(),
                base_latency_us: 1.0,
                percentile: 99.0,
                knee_spread: None,
                knee_fit: None,
                knee_check: None,
                capacity_fit: None,
                nr_cpus: None,
                points: vec![],
            },
        );
        let mut s = Summary::default();
        s.meta
            .insert("calibration".into(), serde_json::to_value(&cal).unwrap());
        s
    }

    #[test]
    fn bands_split_at_the_capacity_fraction() {
        let mut s = lc_summary();
        s.meta
            .insert("be_cpus_used".into(), serde_json::json!({"be": 0.75}));
        s.apps.insert("lc".into(), AppSummary::default());
        s.apps.insert(
            "be".into(),
            AppSummary {
                be_ops_per_s_mean: Some(1000.0),
                ..Default::default()
            },
        );
        let rows = vec![
            row("lc", 10.0, Some(false), None),
            row("lc", 80.0, Some(true), None), // 80 % is in the low band
            row("lc", 79.0, Some(false), None),
            row("lc", 90.0, Some(true), None),
            row("lc", 95.0, None, None), // not judged
            row("be", 0.0, None, Some(500)),
            row("be", 0.0, None, Some(1000)),
        ];
        let b = of_run(&s, &rows);
        assert_eq!(b["lc"].low, Some((1.0 / 3.0, 3)));
        assert_eq!(b["lc"].high, Some((1.0, 1)));
        assert_eq!(b["lc"].be_ops_per_s, None);
        assert_eq!(b["be"].low, None, "no capacity: no bands");
        assert_eq!(b["be"].quota_cpus, Some(0.75));
        assert_eq!(b["be"].cpus_used, Some(0.75));
        assert_eq!(b["be"].be_ops_per_s, Some(1000.0));
        let t = table(&[("run".into(), b)]);
        assert!(t.contains("33.3% (3)"), "{t}");
        assert!(t.contains("100.0% (1)"), "{t}");
    }

    /// A simulated run's ≤ 80 % band also over only the intervals its
    /// oracle met, beside the raw one (which keeps them all).
    #[test]
    fn the_oracles_unmet_intervals_are_counted_apart() {
        let mut s = lc_summary();
        s.apps.insert("lc".into(), AppSummary::default());
        let at = |t_s: f64, viol: bool| Row {
            t_s,
            ..row("lc", 50.0, Some(viol), None)
        };
        let rows = vec![at(0.5, true), at(1.0, true), at(1.5, false), at(2.0, true)];
        let raw = of_run(&s, &rows);
        assert_eq!(raw["lc"].low_oracle_met, None, "no oracle: no column");
        assert!(!table(&[("real".into(), raw)]).contains("o. met"));
        s.oracle = Some(crate::sim::oracle::Oracle {
            infeasible_t_s: vec![0.5, 1.0],
            ..Default::default()
        });
        let b = of_run(&s, &rows);
        assert_eq!(b["lc"].low, Some((0.75, 4)), "the raw figure stays");
        assert_eq!(b["lc"].low_oracle_met, Some((0.5, 2)));
        let t = table(&[("sim".into(), b)]);
        assert!(t.contains("75.0% (4)") && t.contains("50.0% (2)"), "{t}");
    }

    /// A small timeline like a real demo run on a loaded machine (the
    /// batch job idle-class, quota 2.0 then 0.1 CPU, 0.0026 CPU used),
    /// and one like a quiet static run.
    fn be_run(used: f64, quotas: &[u32], loadavg: Option<[f64; 2]>) -> BTreeMap<String, AppBands> {
        let mut s = Summary::default();
        s.meta
            .insert("be_cpus_used".into(), serde_json::json!({ "batch": used }));
        s.meta.insert(
            "resources".into(),
            serde_json::json!(["cpu_quota", "cpu_priority"]),
        );
        if let Some(l) = loadavg {
            s.meta.insert("loadavg_1m".into(), serde_json::json!(l));
        }
        s.apps.insert(
            "batch".into(),
            AppSummary {
                be_ops_per_s_mean: Some(510.9),
                ..Default::default()
            },
        );
        let rows: Vec<Row> = quotas
            .iter()
            .map(|q| row("batch", 0.0, None, Some(*q)))
            .collect();
        of_run(&s, &rows)
    }

    #[test]
    fn a_starved_batch_job_reads_as_what_it_got_and_says_why() {
        let starved = be_run(0.0026, &[2000, 200, 100, 100], Some([9.41, 11.0]));
        let q = starved["batch"].quota_cpus.unwrap();
        assert!((q - 0.6).abs() < 1e-9, "{q}");
        assert_eq!(starved["batch"].loadavg, Some((9.41, 11.0)));
        assert!(starved["batch"].idle_class);
        let quiet = be_run(0.987, &[1000, 1000], None);
        let t = table(&[("loaded".into(), starved), ("quiet".into(), quiet)]);
        // Not "0.00": the figure keeps two significant digits.
        assert!(t.contains(" 0.0026\n"), "{t}");
        assert!(t.contains(" 0.99\n"), "{t}");
        let notes: Vec<&str> = t.lines().filter(|l| l.contains(" used ")).collect();
        assert_eq!(notes.len(), 1, "only the starved run has a note: {t}");
        assert!(
            notes[0].starts_with("loaded: batch used 0.003 CPU of a 0.60 CPU quota (0 %)")
                && notes[0].contains("load average 9.4 at the start, 11.0 at the end")
                && notes[0].contains("idle class"),
            "{}",
            notes[0]
        );
    }
}
