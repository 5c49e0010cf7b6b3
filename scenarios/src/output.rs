//! The files of a replay in its output folder (`timeline.csv`,
//! `summary.json`, `calibration.json`, `timeline.svg`/`.png`) and the table
//! and overlay plot of `qosd compare` over several such folders.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::calibrate::Calibration;
use crate::plot;
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
    out
}

/// Reads several run folders; prints a table and writes `compare.svg/png`
/// into `out`. Returns the table.
pub fn compare(dirs: &[PathBuf], out: &Path) -> anyhow::Result<String> {
    let mut runs = Vec::new();
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{:<28} {:<10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "run", "app", "violation", "fed viol.", "core·s", "mean cores", "energy J", "p99 max ms"
    );
    for d in dirs {
        let sp = d.join("summary.json");
        let text =
            std::fs::read_to_string(&sp).with_context(|| format!("reading {}", sp.display()))?;
        let s: Summary =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", sp.display()))?;
        let rows = Timeline::read_csv(&d.join("timeline.csv"))?;
        let label = format!("{} {} {} {}", s.scenario, s.mode, s.feedback, s.policy);
        let mut line = |app: &str, a: &crate::timeline::AppSummary| {
            let _ = writeln!(
                table,
                "{:<28} {:<10} {:>9.1}% {:>9.1}% {:>10.0} {:>10.2} {:>10} {:>12}",
                label,
                app,
                a.violation_fraction * 100.0,
                a.violation_fraction_fed * 100.0,
                a.core_seconds,
                a.mean_cores,
                a.energy_j.map_or("-".into(), |e| format!("{e:.0}")),
                a.p99_max_ms.map_or("-".into(), |v| format!("{v:.2}"))
            );
        };
        for (app, a) in &s.apps {
            line(app, a);
        }
        line("total", &s.total);
        runs.push((
            format!("{} ({})", label, d.display()),
            s.feedback.clone(),
            rows,
        ));
    }
    table.push_str(
        "(violation: client latency vs the client-side target, whatever fed the policy;\n \
         fed viol.: the fed latency vs its own side's target)\n",
    );
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    plot::compare_plot(&out.join("compare"), &runs)?;
    Ok(table)
}
