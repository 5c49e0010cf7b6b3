//! The evaluation's latency CDF (paper 003 Fig. 4.2), one line per
//! contender on a log axis, drawn as SVG and PNG.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::Report;

impl Report {
    /// CDF of latency (log x), one line per contender, as SVG and PNG.
    pub fn plot(&self, stem: &Path) -> Result<()> {
        let svg = stem.with_extension("svg");
        let png = stem.with_extension("png");
        draw(
            &SVGBackend::new(&svg, (900, 520)).into_drawing_area(),
            &self.cdf,
        )?;
        draw(
            &BitMapBackend::new(&png, (900, 520)).into_drawing_area(),
            &self.cdf,
        )?;
        Ok(())
    }
}

fn draw<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    cdf: &[(String, Vec<f64>)],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plotting: {e}");
    area.fill(&WHITE).map_err(|e| err(&e))?;
    let lo = cdf
        .iter()
        .filter_map(|(_, v)| v.first())
        .copied()
        .fold(f64::INFINITY, f64::min);
    let hi = cdf
        .iter()
        .filter_map(|(_, v)| v.last())
        .copied()
        .fold(0.0, f64::max);
    let (lo, hi) = (lo.max(0.01) * 0.8, hi.max(lo.max(0.01) * 2.0) * 1.2);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Latency CDF (paper 003 Fig. 4.2), deterministic chaos",
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("latency, ms (log)")
        .y_desc("fraction of requests")
        .draw()
        .map_err(|e| err(&e))?;
    let colors = [
        RGBColor(214, 39, 40),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
    ];
    for (i, (name, v)) in cdf.iter().enumerate() {
        let n = v.len().max(1) as f64;
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(
                v.iter().enumerate().map(|(k, x)| (*x, (k + 1) as f64 / n)),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    area.present().map_err(|e| err(&e))?;
    Ok(())
}
