//! The PNG plot: transactional throughput against the commit interval.
//!
//! One solid line per record size (and a thinner one with hollow squares for the overlapped mode)
//! through the median throughput at each commit interval, with a
//! vertical bar from the slowest to the fastest repeat, and the same size's idempotent median as a
//! dashed horizontal line: the gap between the two is the cost of transactions. The x axis is
//! logarithmic because the default intervals (10, 100, 1000 ms) are decades apart. Throughput is
//! in MB/s rather than records/s: 100 B and 1 KB records differ about sixfold in records/s, which
//! would flatten the 1 KB line against the axis, but are within a factor of two in MB/s (the
//! legend gives the idempotent records/s).
//!
//! The font and colours are shared with the other plots ([`crate::plot`]).

use super::report::{thousands, BenchReport, Summary};
use crate::plot::{register_fonts, COLORS};
use anyhow::{anyhow, Context as _};
use plotters::prelude::*;
use std::path::Path;

/// Size of the picture in pixels.
const SIZE: (u32, u32) = (1100, 680);

/// Draws the plot into `path`. Returns `false` (and writes nothing) when the report has no
/// transactional result to plot.
pub fn write_png(report: &BenchReport, path: &Path) -> anyhow::Result<bool> {
    let txn: Vec<&Summary> = report
        .summaries
        .iter()
        .filter(|s| s.commit_interval_ms.is_some() && s.mb_per_s.is_some())
        .collect();
    if txn.is_empty() {
        return Ok(false);
    }
    register_fonts()?;
    draw(report, &txn, path)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("drawing {}", path.display()))?;
    Ok(true)
}

/// Whether a summary is of the overlapped mode (its label says so: `overlap-100ms`).
fn is_overlapped(s: &Summary) -> bool {
    s.mode.starts_with("overlap-")
}

/// The label of an x key point: the interval it falls on, or nothing.
fn label_if_measured(v: f64, intervals: &[f64]) -> String {
    match intervals.iter().find(|&&i| (v - i).abs() <= i * 1e-6) {
        Some(i) => format!("{i:.0} ms"),
        None => String::new(),
    }
}

fn draw(
    report: &BenchReport,
    txn: &[&Summary],
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let intervals: Vec<f64> = txn
        .iter()
        .filter_map(|s| s.commit_interval_ms)
        .map(|v| v as f64)
        .collect();
    let lo = intervals.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = intervals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    // A factor of two of room on each side, so the end points do not sit on the frame.
    let (x_lo, x_hi) = (lo / 2.0, hi * 2.0);
    let y_top = report
        .summaries
        .iter()
        .filter(|s| s.commit_interval_ms.is_some() || s.mode == "idempotent")
        .filter_map(|s| s.mb_per_s.map(|r| r.max))
        .fold(0.0, f64::max)
        // Headroom above the highest bar for the legend (upper right), so it hides no data.
        * 1.5;
    let y_top = if y_top > 0.0 { y_top } else { 1.0 };

    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let s = &report.settings;
    let caption = format!(
        "Transactional producer throughput vs commit interval ({} partitions, median of {} repeats)",
        s.partitions, s.repeats
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 22))
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(95)
        .build_cartesian_2d((x_lo..x_hi).log_scale(), 0.0..y_top)?;
    chart
        .configure_mesh()
        .x_desc("commit interval (ms, log scale)")
        .y_desc("MB/s (2^20 B of payload per second)")
        // Only the measured intervals are labelled: the log axis' own key points (20, 30, ... and
        // a doubled 100) would crowd them.
        .x_label_formatter(&|v| label_if_measured(*v, &intervals))
        .light_line_style(WHITE)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()?;

    for (i, &size) in s.record_sizes.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        for overlapped in [false, true] {
            let mut points: Vec<(f64, f64, f64, f64)> = txn
                .iter()
                .filter(|m| m.record_size == size && is_overlapped(m) == overlapped)
                .filter_map(|m| Some((m.commit_interval_ms? as f64, m.mb_per_s?)))
                .map(|(x, r)| (x, r.median, r.min, r.max))
                .collect();
            if points.is_empty() {
                continue;
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            // The overlapped mode: a thinner line and hollow squares, in the size's colour.
            let (width, what) = if overlapped {
                (2, "overlapped commits")
            } else {
                (3, "transactional")
            };
            chart
                .draw_series(LineSeries::new(
                    points.iter().map(|p| (p.0, p.1)),
                    color.stroke_width(width),
                ))?
                .label(format!("{size} B {what} (median, bar = min-max)"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(width))
                });
            if overlapped {
                chart.draw_series(points.iter().map(|p| {
                    Rectangle::new(
                        [(p.0 * 0.96, p.1 * 0.985), (p.0 * 1.04, p.1 * 1.015)],
                        color.stroke_width(2),
                    )
                }))?;
            } else {
                chart.draw_series(
                    points
                        .iter()
                        .map(|p| Circle::new((p.0, p.1), 5, color.filled())),
                )?;
            }
            chart.draw_series(
                points
                    .iter()
                    .map(|p| PathElement::new(vec![(p.0, p.2), (p.0, p.3)], color.stroke_width(2))),
            )?;
        }
        let idem = report.summary("idempotent", size);
        if let (Some(mb), Some(rps)) = (
            idem.and_then(|m| m.mb_per_s),
            idem.and_then(|m| m.records_per_s),
        ) {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(x_lo, mb.median), (x_hi, mb.median)],
                    12,
                    8,
                    color.stroke_width(2),
                ))?
                .label(format!(
                    "{size} B idempotent (median): {:.1} MB/s, {} records/s",
                    mb.median,
                    thousands(rps.median)
                ))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 10, y)], color.stroke_width(2))
                });
        }
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}
