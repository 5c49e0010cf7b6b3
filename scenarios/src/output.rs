//! The files of a replay in its output folder (`timeline.csv`,
//! `summary.json`, `calibration.json`, `timeline.svg`/`.png`) and the table
//! and overlay plot of `qosd compare` over several such folders.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use qosd_core::yamlfile::{read_kind, Kind};

use crate::calibrate::Calibration;
use crate::plot;
use crate::seeds::MeanCi;
use crate::timeline::{Summary, Timeline};

/// Paths written by [`write_run`].
#[derive(Debug, Clone)]
pub struct RunFiles {
    pub timeline_csv: PathBuf,
    pub summary_json: PathBuf,
    pub calibration_json: PathBuf,
    pub plot_svg: PathBuf,
    pub plot_png: PathBuf,
}

/// Writes every output of one run into `dir` (created if missing).
pub fn write_run(
    dir: &Path,
    tl: &Timeline,
    cal: &Calibration,
) -> anyhow::Result<(Summary, RunFiles)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let files = RunFiles {
        timeline_csv: dir.join("timeline.csv"),
        summary_json: dir.join("summary.json"),
        calibration_json: dir.join("calibration.json"),
        plot_svg: dir.join("timeline.svg"),
        plot_png: dir.join("timeline.png"),
    };
    tl.write_csv(&files.timeline_csv)
        .with_context(|| format!("writing {}", files.timeline_csv.display()))?;
    let mut summary = tl.summary();
    summary
        .meta
        .insert("calibration".into(), serde_json::to_value(cal)?);
    summary.calibration_doubts = crate::calibrate::check::doubts(cal);
    std::fs::write(
        &files.summary_json,
        serde_json::to_string_pretty(&summary)? + "\n",
    )
    .with_context(|| format!("writing {}", files.summary_json.display()))?;
    cal.write(&files.calibration_json)
        .with_context(|| format!("writing {}", files.calibration_json.display()))?;
    let caps: BTreeMap<String, f64> = cal
        .apps
        .iter()
        .map(|(k, v)| (k.clone(), v.capacity_rps))
        .collect();
    plot::run_plot(&dir.join("timeline"), tl, &caps)?;
    Ok((summary, files))
}

/// A one-screen table of a summary.
pub fn summary_table(s: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}  recoveries (s)",
        "app", "violation", "fed viol.", "core·s", "mean cores", "energy J", "p99 max ms"
    );
    let fmt_row = |out: &mut String, name: &str, a: &crate::timeline::AppSummary| {
        let rec: Vec<String> = a
            .time_to_recover_s
            .iter()
            .take(6)
            .map(|x| format!("{x:.1}"))
            .collect();
        let more = if a.time_to_recover_s.len() > 6 {
            " ..."
        } else {
            ""
        };
        let line = format!(
            "{:<12} {:>9.1}% {:>9.1}% {:>10.0} {:>10.2} {:>10} {:>12}  {}{}",
            name,
            a.violation_fraction * 100.0,
            a.violation_fraction_fed * 100.0,
            a.core_seconds,
            a.mean_cores,
            a.energy_j.map_or("-".into(), |e| format!("{e:.0}")),
            a.p99_max_ms.map_or("-".into(), |v| format!("{v:.2}")),
            rec.join(" "),
            more
        );
        let _ = writeln!(out, "{}", line.trim_end());
    };
    for (name, a) in &s.apps {
        fmt_row(&mut out, name, a);
    }
    fmt_row(&mut out, "total", &s.total);
    if let Some(o) = &s.oracle {
        let _ = writeln!(
            out,
            "{:<12} {:>9.1}% {:>10} {:>10.0} {:>10.2}  (policy used {:.2}x its core·s)",
            "oracle",
            o.violation_fraction * 100.0,
            "",
            o.core_seconds,
            o.mean_cores,
            o.policy_ratio
        );
    }
    out.push_str(
        "(violation: client latency vs the client-side target, what users see; fed viol.: the\n \
         latency that fed the policy vs its own side's target)\n",
    );
    if s.oracle.is_some() {
        out.push_str(
            "(oracle: each interval the least allocation that meets every target by the model,\n \
             the lower bound on core·s; its violation: intervals no allocation of the node meets)\n",
        );
    }
    if s.energy_is_estimate {
        out.push_str("(energy is a model estimate, not a measurement)\n");
    }
    for d in &s.calibration_doubts {
        let _ = writeln!(out, "{d}");
    }
    out
}

/// One entry of `qosd compare`: a run folder, or the folder of
/// `replay --seeds N` (its `seeds.json` and `seed-<S>/` runs).
struct Entry {
    label: String,
    /// Every run's summary (one for a plain run folder).
    runs: Vec<Summary>,
    /// The folder whose timeline is plotted (the first seed's).
    plotted: PathBuf,
}

fn read_summary(dir: &Path) -> anyhow::Result<Summary> {
    let sp = dir.join("summary.json");
    let text = read_kind(&sp, Kind::Summary)?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", sp.display()))
}

fn read_entry(dir: &Path) -> anyhow::Result<Entry> {
    let seeds_json = dir.join("seeds.json");
    let dirs: Vec<PathBuf> = if seeds_json.is_file() {
        let text = read_kind(&seeds_json, Kind::Summary)?;
        let agg: crate::seeds::Aggregate = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", seeds_json.display()))?;
        agg.seeds
            .iter()
            .map(|s| dir.join(format!("seed-{s}")))
            .collect()
    } else {
        vec![dir.to_path_buf()]
    };
    let runs = dirs
        .iter()
        .map(|d| read_summary(d))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let first = runs
        .first()
        .ok_or_else(|| anyhow::anyhow!("{}: seeds.json lists no seeds", seeds_json.display()))?;
    Ok(Entry {
        label: format!(
            "{} {} {} {}",
            first.scenario, first.mode, first.feedback, first.policy
        ),
        plotted: dirs[0].clone(),
        runs,
    })
}

/// Reads several run folders (plain runs, or the folders of `replay
/// --seeds N`); prints a table and writes `compare.svg/png` into `out`.
/// Each figure is a run's, or over N runs their mean ± the half-width of
/// its 95 % confidence interval (the statistics of `replay --seeds`).
/// Returns the table.
pub fn compare(dirs: &[PathBuf], out: &Path) -> anyhow::Result<String> {
    let mut plots = Vec::new();
    let mut bands = Vec::new();
    let mut table = String::new();
    let mut doubts: Vec<String> = Vec::new();
    let header = [
        "violation %",
        "fed viol. %",
        "core·s",
        "mean cores",
        "quota CPU·s",
        "BE ops/s",
        "energy J",
        "p99 max ms",
        "x oracle",
    ];
    let _ = writeln!(
        table,
        "{:<28} {:<10} {:>4} {}",
        "run",
        "app",
        "runs",
        header.map(|h| format!("{h:>16}")).join(" ")
    );
    for d in dirs {
        let e = read_entry(d)?;
        for c in e.runs.iter().flat_map(|r| &r.calibration_doubts) {
            if !doubts.contains(c) {
                doubts.push(c.clone());
            }
        }
        let agg = crate::seeds::aggregate(&e.runs);
        let n = e.runs.len();
        let mut line = |app: &str, f: &crate::seeds::Figures, ratio: Option<&MeanCi>| {
            let cells = [
                f.violation_fraction.show(100.0, 1),
                f.violation_fraction_fed.show(100.0, 1),
                f.core_seconds.show(1.0, 0),
                f.mean_cores.show(1.0, 2),
                f.quota_cpu_seconds
                    .as_ref()
                    .map_or("-".into(), |m| m.show(1.0, 1)),
                f.be_ops_per_s
                    .as_ref()
                    .map_or("-".into(), |m| m.show(1.0, 0)),
                f.energy_j.as_ref().map_or("-".into(), |m| m.show(1.0, 0)),
                f.p99_max_ms.as_ref().map_or("-".into(), |m| m.show(1.0, 2)),
                ratio.map_or("-".into(), |m| m.show(1.0, 2)),
            ];
            let _ = writeln!(
                table,
                "{:<28} {:<10} {:>4} {}",
                e.label,
                app,
                n,
                cells.map(|c| format!("{c:>16}")).join(" ")
            );
        };
        for (app, f) in &agg.apps {
            line(app, f, None);
        }
        line("total", &agg.total, agg.oracle_ratio.as_ref());
        let rows = Timeline::read_csv(&e.plotted.join("timeline.csv"))?;
        bands.push((e.label.clone(), crate::bands::of_run(&e.runs[0], &rows)));
        let label = if n > 1 {
            format!("{} ({}, first of {n} seeds)", e.label, e.plotted.display())
        } else {
            format!("{} ({})", e.label, d.display())
        };
        plots.push((label, e.runs[0].feedback.clone(), rows));
    }
    table.push_str(
        "(violation: client latency vs the client-side target, whatever fed the policy;\n \
         fed viol.: the fed latency vs its own side's target; over several runs: mean ± 95 % CI;\n \
         quota CPU·s: CPU quota in force × time (the allocation where apps share CPUs);\n \
         BE ops/s: the batch job's mean throughput;\n \
         x oracle: core·s over the least allocation that meets every target by the model, sim only)\n",
    );
    table.push('\n');
    table.push_str(&crate::bands::table(&bands));
    // Last, under both tables: the runs compared rest on these calibrations
    // (`make demo`'s two runs share one: said once).
    for d in doubts {
        let _ = writeln!(table, "{d}");
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    plot::compare_plot(&out.join("compare"), &plots)?;
    Ok(table)
}
