//! The PNG plot of deliver-bench: deliveries/s against fan-out, deliver and the reference (keep-alive,
//! no outage), each point the median of the repeats with its min-max as a bar. The x axis is
//! logarithmic (fan-out 1, 10, 100).

use super::{CaseSummary, Measure, Outage, Runner};
use crate::plot::{register_fonts, COLORS};
use anyhow::{anyhow, Context as _};
use plotters::prelude::*;
use std::path::Path;

const SIZE: (u32, u32) = (1000, 620);

/// Draws the plot into `path`; `false` (nothing written) when there is no throughput run.
pub fn write_png(summaries: &[CaseSummary], path: &Path) -> anyhow::Result<bool> {
    let series: Vec<Series<'_>> = [
        (Runner::Deliver, "alert-deliver"),
        (Runner::Reference, "reference (at-most-once, same client)"),
    ]
    .into_iter()
    .map(|(runner, label)| {
        let mut points: Vec<(f64, f64, f64, f64)> = summaries
            .iter()
            .filter(|s| {
                s.case.runner == runner
                    && s.case.measure == Measure::Throughput
                    && s.case.keep_alive
                    && s.case.outage == Outage::None
                    && s.case.population == s.case.fanout
            })
            .filter_map(|s| {
                let d = s.deliveries_per_sec?;
                Some(((s.case.fanout as f64).log10(), d.median, d.min, d.max))
            })
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        (label, points)
    })
    .filter(|(_, p)| !p.is_empty())
    .collect();
    if series.is_empty() {
        return Ok(false);
    }
    register_fonts()?;
    draw(&series, path)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("drawing {}", path.display()))?;
    Ok(true)
}

/// A label and its points: (log10 fan-out, median, min, max).
type Series<'a> = (&'a str, Vec<(f64, f64, f64, f64)>);

fn draw(series: &[Series<'_>], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let x_hi = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.0))
        .fold(0.0, f64::max)
        .max(1.0);
    let y_hi = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.3))
        .fold(0.0, f64::max)
        * 1.15;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Deliveries per second against fan-out (pre-loaded backlog, local receiver)",
            ("sans-serif", 22),
        )
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(90)
        .build_cartesian_2d(-0.15..x_hi + 0.15, 0.0..y_hi)?;
    chart
        .configure_mesh()
        .x_desc("subscribers per notification (fan-out, log scale)")
        .y_desc("deliveries/s (median, min-max)")
        .light_line_style(WHITE)
        .x_labels(8)
        .x_label_formatter(&|v| {
            let f = 10f64.powf(*v);
            if (f - f.round()).abs() < 0.05 && [1.0, 10.0, 100.0, 1000.0].contains(&f.round()) {
                format!("{:.0}", f.round())
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()?;
    for (i, (label, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (p.0, p.1)),
                color.stroke_width(3),
            ))?
            .label(*label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
        chart.draw_series(
            points
                .iter()
                .map(|p| Circle::new((p.0, p.1), 5, color.filled())),
        )?;
        chart.draw_series(
            points
                .iter()
                .map(|p| PathElement::new(vec![(p.0, p.2), (p.0, p.3)], color.stroke_width(2))),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}
