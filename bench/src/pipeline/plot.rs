//! The PNG plot: the distribution of end-to-end latency, one line per configuration.
//!
//! A latency goal is a statement about a tail ("p99 <= commit interval + 50 ms"), which medians in
//! a table hide and a bar chart cannot show, so the plot is each configuration's share of
//! notifications (y, percent) visible within x milliseconds of their tick's append, pooled over
//! the repeats. The y axis runs from 50 % to 100 % so that the tail takes most of the height; a
//! dashed vertical line marks the goal of the shortest exactly-once interval and a dotted
//! horizontal line 99 %, so a configuration meets the goal where its line crosses 99 % left of the
//! dashed one.

use super::{Config, RunResult};
use crate::plot::{register_fonts, COLORS};
use crate::stats::percentile;
use anyhow::{anyhow, Context as _};
use plotters::prelude::*;
use std::path::Path;

/// Size of the picture in pixels.
const SIZE: (u32, u32) = (1100, 680);

/// The latency goal beyond the commit interval (issue 11: p99 <= interval + 50 ms).
const GOAL_SLACK_MS: f64 = 50.0;

/// Draws the plot into `path`. Returns `false` (and writes nothing) when no run has latency
/// samples.
pub fn write_png(configs: &[Config], results: &[RunResult], path: &Path) -> anyhow::Result<bool> {
    let curves: Vec<(String, Vec<f64>)> = configs
        .iter()
        .map(|c| {
            let pooled = results
                .iter()
                .filter(|r| &r.config == c)
                .flat_map(|r| r.latencies_ms.iter().copied());
            (c.label(), pooled.collect())
        })
        .collect();
    let eos_intervals = configs
        .iter()
        .filter(|c| c.guarantee == "exactly-once")
        .map(|c| c.commit_interval_ms);
    write_curves(curves, eos_intervals, path)
}

/// Draws the plot of a `results.json` written before into `path` (pipeline-bench --replot):
/// one curve per configuration, in the order of the summaries.
pub fn replot(results_json: &Path, path: &Path) -> anyhow::Result<bool> {
    let text = std::fs::read_to_string(results_json)
        .with_context(|| format!("reading {}", results_json.display()))?;
    let (summaries, runs): (Vec<serde_json::Value>, Vec<serde_json::Value>) =
        serde_json::from_str(&text)
            .with_context(|| format!("{}: not pipeline-bench's results", results_json.display()))?;
    let curves = summaries
        .iter()
        .map(|s| {
            let config = &s["config"];
            let pooled = runs
                .iter()
                .filter(|r| &r["config"] == config)
                .filter_map(|r| r["latencies_ms"].as_array())
                .flatten()
                .filter_map(serde_json::Value::as_f64);
            (label_of(config), pooled.collect())
        })
        .collect();
    let eos_intervals = summaries
        .iter()
        .map(|s| &s["config"])
        .filter(|c| c["guarantee"] == "exactly-once")
        .filter_map(|c| c["commit_interval_ms"].as_u64());
    write_curves(curves, eos_intervals, path)
}

/// [`Config::label`] of a configuration as results.json holds it.
fn label_of(config: &serde_json::Value) -> String {
    let base = format!(
        "{} {}ms",
        config["guarantee"].as_str().unwrap_or("?"),
        config["commit_interval_ms"].as_u64().unwrap_or(0)
    );
    match config["variant"]["name"].as_str() {
        Some(name) if !name.is_empty() => format!("{base} [{name}]"),
        _ => base,
    }
}

fn write_curves(
    curves: Vec<(String, Vec<f64>)>,
    eos_intervals: impl Iterator<Item = u64>,
    path: &Path,
) -> anyhow::Result<bool> {
    let curves: Vec<(String, Vec<f64>)> = curves
        .into_iter()
        .map(|(label, mut samples)| {
            samples.retain(|v| v.is_finite());
            samples.sort_by(f64::total_cmp);
            (label, samples)
        })
        .filter(|(_, samples)| !samples.is_empty())
        .collect();
    if curves.is_empty() {
        return Ok(false);
    }
    let goal_ms = eos_intervals
        .map(|ms| ms as f64 + GOAL_SLACK_MS)
        .fold(f64::INFINITY, f64::min);
    register_fonts()?;
    draw(&curves, goal_ms, path)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("drawing {}", path.display()))?;
    Ok(true)
}

/// The points of a distribution curve from sorted samples: (latency, percent at or below it),
/// from the median up, thinned to at most a few hundred points.
fn cdf_points(sorted: &[f64]) -> Vec<(f64, f64)> {
    let n = sorted.len();
    let first = n / 2;
    let step = (n - first).div_ceil(400).max(1);
    let mut points: Vec<(f64, f64)> = (first..n)
        .step_by(step)
        .map(|i| (sorted[i], (i + 1) as f64 * 100.0 / n as f64))
        .collect();
    points.push((sorted[n - 1], 100.0));
    points
}

fn draw(
    curves: &[(String, Vec<f64>)],
    goal_ms: f64,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    // The x range ends past the slowest p99.9, not at the slowest sample: one stall of seconds
    // would squeeze every curve against the axis.
    let x_hi = curves
        .iter()
        .filter_map(|(_, s)| percentile(s, 99.9))
        .chain(goal_ms.is_finite().then_some(goal_ms))
        .fold(0.0, f64::max)
        * 1.15;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "End-to-end latency at a steady rate: tick append to read_committed visibility",
            ("sans-serif", 22),
        )
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..x_hi, 50.0..100.5)?;
    chart
        .configure_mesh()
        .x_desc("latency (ms)")
        .y_desc("notifications visible within x (%)")
        .light_line_style(WHITE)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()?;
    for (i, (label, samples)) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let p99 = percentile(samples, 99.0).unwrap_or(f64::NAN);
        let points = cdf_points(samples)
            .into_iter()
            .map(|(x, y)| (x.min(x_hi), y));
        let label = format!("{label}: p99 {p99:.0} ms ({} samples)", samples.len());
        // Past the palette the colours come round again, dashed and thinner (the second variant
        // of a comparison, say).
        if i < COLORS.len() {
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(3)))?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
                });
        } else {
            chart
                .draw_series(DashedLineSeries::new(points, 7, 4, color.stroke_width(2)))?
                .label(label)
                .legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (9, 0)], color.stroke_width(2))
                        + PathElement::new(vec![(14, 0), (24, 0)], color.stroke_width(2))
                });
        }
    }
    if goal_ms.is_finite() {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(goal_ms, 50.0), (goal_ms, 100.5)],
                10,
                6,
                BLACK.stroke_width(2),
            ))?
            .label(format!("goal: p99 <= {goal_ms:.0} ms (interval + 50 ms)"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], BLACK.stroke_width(2)));
    }
    chart.draw_series(DashedLineSeries::new(
        vec![(0.0, 99.0), (x_hi, 99.0)],
        3,
        5,
        BLACK.stroke_width(1),
    ))?;
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_curve_runs_from_the_median_to_every_sample() {
        let sorted: Vec<f64> = (1..=1000).map(f64::from).collect();
        let points = cdf_points(&sorted);
        assert_eq!(points.first(), Some(&(501.0, 50.1)));
        assert_eq!(points.last(), Some(&(1000.0, 100.0)));
        assert!(points.len() <= 402);
        assert!(points
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
    }

    #[test]
    fn a_replot_labels_each_configuration_as_the_run_did() {
        let variants: Vec<super::super::Variant> = vec!["two=".parse().unwrap()];
        for c in Config::list(&[20], &[20], &variants)
            .into_iter()
            .chain(Config::list(&[100], &[], &[]))
        {
            let json = serde_json::to_value(&c).unwrap();
            assert_eq!(label_of(&json), c.label());
        }
    }

    #[test]
    fn a_single_sample_is_a_curve_of_one_point_at_100_percent() {
        assert_eq!(cdf_points(&[42.0]).last(), Some(&(42.0, 100.0)));
    }
}
