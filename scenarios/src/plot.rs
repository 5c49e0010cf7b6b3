//! Plots of a replay in the layout of the paper's Fig. 11, as SVG and PNG:
//! load over time, each latency-critical app's p99 against its target (client
//! and eBPF lines), then cores, frequency, cache ways, memory bandwidth, CPU
//! quota, power and best-effort throughput over time (each panel only when
//! the run has its figure). And the overlay plot of `qosd compare`.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::timeline::{Row, Timeline};

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];
const PANEL_H: u32 = 220;
const WIDTH: u32 = 1000;

/// One line of a panel.
struct Line {
    label: String,
    color: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

/// One panel: a title, a y label, log or linear, its lines.
struct Panel {
    title: String,
    y_desc: String,
    log: bool,
    lines: Vec<Line>,
}

fn series(rows: &[&Row], get: impl Fn(&Row) -> Option<f64>) -> Vec<(f64, f64)> {
    rows.iter()
        .filter_map(|r| get(r).filter(|v| v.is_finite()).map(|v| (r.t_s, v)))
        .collect()
}

/// The panels of one run. `capacity_rps` turns offered load into % of capacity.
fn run_panels(tl: &Timeline, capacity_rps: &BTreeMap<String, f64>) -> Vec<Panel> {
    let by_app: Vec<(usize, &String, Vec<&Row>)> = tl
        .apps
        .iter()
        .enumerate()
        .map(|(i, a)| (i, a, tl.rows_of(a).collect()))
        .collect();
    let color = |i: usize| PALETTE[i % PALETTE.len()];
    let per_app = |title: &str, y: &str, get: fn(&Row) -> Option<f64>| Panel {
        title: title.into(),
        y_desc: y.into(),
        log: false,
        lines: by_app
            .iter()
            .map(|(i, a, rows)| Line {
                label: a.to_string(),
                color: color(*i),
                dashed: false,
                points: series(rows, get),
            })
            .filter(|l| !l.points.is_empty())
            .collect(),
    };
    let mut panels = vec![Panel {
        title: "(a) offered load".into(),
        y_desc: "% of capacity".into(),
        log: false,
        lines: by_app
            .iter()
            .map(|(i, a, rows)| {
                let cap = capacity_rps.get(*a).copied().unwrap_or(0.0);
                let pts = if cap > 0.0 {
                    series(rows, |r| Some(100.0 * r.offered_rps / cap))
                } else {
                    Vec::new()
                };
                Line {
                    label: a.to_string(),
                    color: color(*i),
                    dashed: false,
                    points: pts,
                }
            })
            .collect(),
    }];
    for (_, a, rows) in &by_app {
        if rows.iter().all(|r| r.target_ms.is_none()) {
            continue;
        }
        panels.push(latency_panel(a, rows, &tl.feedback));
    }
    panels.push(per_app("cores", "cores", |r| r.cores.map(f64::from)));
    panels.push(per_app("frequency", "MHz", |r| r.freq_mhz.map(f64::from)));
    panels.push(per_app("LLC ways", "ways", |r| r.llc_ways.map(f64::from)));
    panels.push(per_app("memory bandwidth", "%", |r| {
        r.mb_percent.map(f64::from)
    }));
    panels.push(per_app("CPU quota", "CPUs", |r| {
        r.cpu_quota_milli.map(|m| f64::from(m) / 1000.0)
    }));
    panels.push(per_app("best-effort throughput", "ops/s", |r| {
        r.be_ops_per_s
    }));
    let power = if tl.energy_is_estimate {
        "power (estimate)"
    } else {
        "power"
    };
    panels.push(per_app(power, "W", |r| r.power_w));
    panels.retain(|p| p.lines.iter().any(|l| !l.points.is_empty()));
    panels
}

/// One app's p99 latency, client and eBPF, against its target(s).
fn latency_panel(a: &str, rows: &[&Row], feedback: &str) -> Panel {
    Panel {
        title: format!("{a}: p99 latency vs target (feedback: {})", feedback),
        y_desc: "ms (log)".into(),
        log: true,
        lines: vec![
            Line {
                label: "client".into(),
                color: PALETTE[1],
                dashed: false,
                points: series(rows, |r| r.client_p99_ms),
            },
            Line {
                label: "eBPF".into(),
                color: PALETTE[0],
                dashed: false,
                points: series(rows, |r| r.ebpf_p99_ms),
            },
            Line {
                label: "client target".into(),
                color: RGBColor(0, 0, 0),
                dashed: true,
                points: series(rows, |r| r.target_ms),
            },
        ]
        .into_iter()
        // The eBPF-side target, where it differs from the client's.
        .chain(
            rows.iter()
                .any(|r| r.ebpf_target_ms.is_some() && r.ebpf_target_ms != r.target_ms)
                .then(|| Line {
                    label: "eBPF target".into(),
                    color: PALETTE[0],
                    dashed: true,
                    points: series(rows, |r| r.ebpf_target_ms),
                }),
        )
        .collect(),
    }
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    panels: &[Panel],
) -> Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (head, body) = root.split_vertically(30);
    head.titled(title, ("sans-serif", 20)).map_err(e)?;
    let t_max = panels
        .iter()
        .flat_map(|p| p.lines.iter().flat_map(|l| l.points.iter().map(|q| q.0)))
        .fold(1.0, f64::max);
    for (area, p) in body.split_evenly((panels.len(), 1)).iter().zip(panels) {
        let ys = p.lines.iter().flat_map(|l| l.points.iter().map(|q| q.1));
        let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
            (a.min(y), b.max(y))
        });
        let mut b = ChartBuilder::on(area);
        b.caption(&p.title, ("sans-serif", 15))
            .margin(6)
            .x_label_area_size(28)
            .y_label_area_size(64);
        if p.log {
            let lo = (lo.max(1e-3) / 1.5).max(1e-3);
            let hi = (hi * 1.5).max(lo * 10.0);
            let mut c = b
                .build_cartesian_2d(0f64..t_max, (lo..hi).log_scale())
                .map_err(e)?;
            c.configure_mesh()
                .x_desc("time (s)")
                .y_desc(&p.y_desc)
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_label_formatter(&|y| num(*y))
                .y_labels(6)
                .draw()
                .map_err(e)?;
            lines(&mut c, &p.lines).map_err(e)?;
        } else {
            let hi = if hi > lo {
                hi + 0.08 * (hi - lo).max(1.0)
            } else {
                lo + 1.0
            };
            let lo = lo.min(0.0);
            let mut c = b.build_cartesian_2d(0f64..t_max, lo..hi).map_err(e)?;
            c.configure_mesh()
                .x_desc("time (s)")
                .y_desc(&p.y_desc)
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_label_formatter(&|y| num(*y))
                .draw()
                .map_err(e)?;
            lines(&mut c, &p.lines).map_err(e)?;
        }
    }
    root.present().map_err(e)
}

/// A tick label with as many decimals as its size needs.
fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else if a >= 0.01 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

type Chart<'a, DB, Y> =
    ChartContext<'a, DB, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>;

fn lines<'a, DB: DrawingBackend + 'a, Y>(
    c: &mut Chart<'a, DB, Y>,
    lines: &[Line],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    Y: Ranged<ValueType = f64>,
{
    for l in lines.iter().filter(|l| !l.points.is_empty()) {
        let style = l.color.stroke_width(2);
        let anno = if l.dashed {
            c.draw_series(DashedLineSeries::new(l.points.iter().copied(), 6, 4, style))?
        } else {
            c.draw_series(LineSeries::new(l.points.iter().copied(), style))?
        };
        let color = l.color;
        anno.label(&l.label).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
        });
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}

fn write_both(stem: &Path, title: &str, panels: &[Panel]) -> anyhow::Result<()> {
    let h = 30 + PANEL_H * panels.len().max(1) as u32;
    let svg = stem.with_extension("svg");
    draw(
        SVGBackend::new(&svg, (WIDTH, h)).into_drawing_area(),
        title,
        panels,
    )
    .map_err(|e| anyhow::anyhow!("drawing {}: {e}", svg.display()))?;
    let png = stem.with_extension("png");
    draw(
        BitMapBackend::new(&png, (WIDTH, h)).into_drawing_area(),
        title,
        panels,
    )
    .map_err(|e| anyhow::anyhow!("drawing {}: {e}", png.display()))?;
    Ok(())
}

/// Writes `<stem>.svg` and `<stem>.png` for one run.
pub fn run_plot(
    stem: &Path,
    tl: &Timeline,
    capacity_rps: &BTreeMap<String, f64>,
) -> anyhow::Result<()> {
    let title = format!(
        "{} ({}, feedback {}, policy {}, seed {})",
        tl.scenario, tl.mode, tl.feedback, tl.policy, tl.seed
    );
    write_both(stem, &title, &run_panels(tl, capacity_rps))
}

/// Overlay of several runs, one line per run in every panel: per app what
/// users see (the client p99 against the target), the allocation (CPU
/// quota solid, cores dashed) and a batch job's ops/s.
pub fn compare_plot(stem: &Path, runs: &[(String, String, Vec<Row>)]) -> anyhow::Result<()> {
    write_both(stem, "qosd compare", &compare_panels(runs))
}

/// The panels of [`compare_plot`]; a panel without any point is left out.
fn compare_panels(runs: &[(String, String, Vec<Row>)]) -> Vec<Panel> {
    let mut apps: Vec<String> = Vec::new();
    for (_, _, rows) in runs {
        for r in rows {
            if !apps.contains(&r.app) {
                apps.push(r.app.clone());
            }
        }
    }
    let mut panels = Vec::new();
    for app in &apps {
        let (mut lat, mut alloc, mut ops) = (Vec::new(), Vec::new(), Vec::new());
        let mut target = None;
        for (i, (label, _, rows)) in runs.iter().enumerate() {
            let rows: Vec<&Row> = rows.iter().filter(|r| &r.app == app).collect();
            let color = PALETTE[i % PALETTE.len()];
            let line = |label: String, dashed: bool, points| Line {
                label,
                color,
                dashed,
                points,
            };
            lat.push(line(
                label.clone(),
                false,
                series(&rows, |r| r.client_p99_ms),
            ));
            let quota = |r: &Row| r.cpu_quota_milli.map(|q| f64::from(q) / 1000.0);
            alloc.push(line(format!("{label}: quota"), false, series(&rows, quota)));
            let cores = |r: &Row| r.cores.map(f64::from);
            alloc.push(line(format!("{label}: cores"), true, series(&rows, cores)));
            ops.push(line(
                label.clone(),
                false,
                series(&rows, |r| r.be_ops_per_s),
            ));
            if target.is_none() {
                let t = series(&rows, |r| r.target_ms);
                target = (!t.is_empty()).then_some(t);
            }
        }
        if let Some(t) = target {
            lat.push(Line {
                label: "target".into(),
                color: RGBColor(0, 0, 0),
                dashed: true,
                points: t,
            });
        }
        for (title, y_desc, log, lines) in [
            ("client p99 vs target", "ms (log)", true, lat),
            ("allocation", "CPUs / cores", false, alloc),
            ("batch ops/s", "ops/s", false, ops),
        ] {
            let mut lines = lines;
            lines.retain(|l| !l.points.is_empty());
            panels.push(Panel {
                title: format!("{app}: {title}"),
                y_desc: y_desc.into(),
                log,
                lines,
            });
        }
    }
    panels.retain(|p| p.lines.iter().any(|l| !l.points.is_empty()));
    panels
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t: f64, app: &str) -> Row {
        Row {
            t_s: t,
            app: app.into(),
            offered_rps: 0.0,
            achieved_rps: 0.0,
            client_p99_ms: None,
            ebpf_p99_ms: None,
            target_ms: None,
            violation: None,
            cores: Some(1),
            freq_mhz: None,
            llc_ways: None,
            mb_percent: None,
            power_w: None,
            ebpf_target_ms: None,
            fed_violation: None,
            cpu_quota_milli: None,
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

    #[test]
    fn quota_and_best_effort_panels_appear_only_with_their_figures() {
        let titles = |rows: Vec<Row>| -> Vec<String> {
            let tl = Timeline {
                apps: vec!["lc".into(), "be".into()],
                rows,
                ..Default::default()
            };
            run_panels(&tl, &BTreeMap::new())
                .into_iter()
                .map(|p| p.title)
                .collect()
        };
        let plain: Vec<Row> = (1..4)
            .flat_map(|i| [row(i as f64, "lc"), row(i as f64, "be")])
            .collect();
        let t = titles(plain.clone());
        assert!(t.contains(&"cores".to_string()), "{t:?}");
        assert!(!t
            .iter()
            .any(|x| x == "CPU quota" || x == "best-effort throughput"));
        let with: Vec<Row> = plain
            .into_iter()
            .map(|mut r| {
                r.cpu_quota_milli = Some(500);
                if r.app == "be" {
                    r.be_ops_per_s = Some(1234.0);
                }
                r
            })
            .collect();
        let t = titles(with);
        assert!(t.contains(&"CPU quota".to_string()), "{t:?}");
        assert!(t.contains(&"best-effort throughput".to_string()), "{t:?}");
    }

    /// Every compared run has a line in each panel; quota-only runs show
    /// their quota, a batch job its ops/s, and only the LC app a p99.
    #[test]
    fn compare_shows_client_p99_allocation_and_batch_ops_per_run() {
        let run = |q: u32, ops: f64| -> Vec<Row> {
            (1..4)
                .flat_map(|i| {
                    let mut lc = row(i as f64, "search");
                    (lc.cores, lc.cpu_quota_milli) = (None, Some(q));
                    (lc.client_p99_ms, lc.target_ms) = (Some(3.0), Some(5.0));
                    let mut be = row(i as f64, "batch");
                    (be.cores, be.cpu_quota_milli) = (None, Some(2000 - q));
                    be.be_ops_per_s = Some(ops);
                    [lc, be]
                })
                .collect()
        };
        let runs = vec![
            ("parties".to_string(), "ebpf".to_string(), run(1500, 9e3)),
            ("static".to_string(), "ebpf".to_string(), run(1000, 6e3)),
        ];
        let p = compare_panels(&runs);
        let titles: Vec<&str> = p.iter().map(|p| p.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "search: client p99 vs target",
                "search: allocation",
                "batch: allocation",
                "batch: batch ops/s"
            ]
        );
        let labels =
            |i: usize| -> Vec<&str> { p[i].lines.iter().map(|l| l.label.as_str()).collect() };
        assert_eq!(labels(0), ["parties", "static", "target"]);
        assert_eq!(labels(1), ["parties: quota", "static: quota"]);
        assert_eq!(p[1].lines[0].points[0], (1.0, 1.5));
        assert_eq!(labels(3), ["parties", "static"]);
    }
}
