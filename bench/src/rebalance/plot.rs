//! The PNG plot of rebalance-bench: every partition's idle time per event and protocol.
//!
//! One column per event and protocol, every figure a dot (partitions and repeats spread
//! sideways so they do not hide each other), a thin bar at the column's p50 and a thick one at its
//! p99, and the event's goal as a dashed line over its column. The legend sits top right, over
//! the join's column, whose figures are the shortest at the top of the axis. The y axis is logarithmic: a
//! SIGKILL's idle times are the session timeout (tens of seconds) while a join's are fractions of
//! a second, and both matter.

use super::report::Summary;
use super::Report;
use crate::plot::{register_fonts, COLORS};
use anyhow::{anyhow, Context as _};
use plotters::prelude::*;
use std::path::Path;

const SIZE: (u32, u32) = (1100, 680);

/// Half the width of a column's spread of dots, in event widths.
const SPREAD: f64 = 0.1;

/// Draws the plot into `path`; `false` (nothing written) when there is no figure.
pub fn write_png(report: &Report, summaries: &[Summary], path: &Path) -> anyhow::Result<bool> {
    let protocols: Vec<&str> = report
        .sessions
        .iter()
        .map(|s| s.protocol.as_str())
        .collect();
    let dots: Vec<Dot> = report
        .events()
        .flat_map(|e| {
            let column = column_x(e.event as usize, &protocols, &e.protocol);
            let n = e.idle_s.len().max(1);
            e.idle_s.iter().enumerate().filter_map(move |(p, idle)| {
                let k = (p + e.repeat * n) as f64;
                // A spread that differs by partition and repeat (golden-ratio steps).
                let offset = ((k * 0.618_034).fract() - 0.5) * 2.0 * SPREAD;
                Some(Dot {
                    x: column? + offset,
                    idle_s: (*idle)?,
                    protocol: e.protocol.clone(),
                })
            })
        })
        .collect();
    if dots.is_empty() {
        return Ok(false);
    }
    register_fonts()?;
    draw(report, summaries, &protocols, &dots, path)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("drawing {}", path.display()))?;
    Ok(true)
}

struct Dot {
    x: f64,
    idle_s: f64,
    protocol: String,
}

/// The middle of the column of `protocol` under event number `event`: the events one unit apart,
/// their protocols side by side within.
fn column_x(event: usize, protocols: &[&str], protocol: &str) -> Option<f64> {
    let k = protocols.iter().position(|p| *p == protocol)?;
    let n = protocols.len() as f64;
    Some(event as f64 + 0.5 + (k as f64 - (n - 1.0) / 2.0) * 0.32)
}

fn color_of(protocols: &[&str], protocol: &str) -> RGBColor {
    let k = protocols.iter().position(|p| *p == protocol).unwrap_or(0);
    COLORS[k % COLORS.len()]
}

fn draw(
    report: &Report,
    summaries: &[Summary],
    protocols: &[&str],
    dots: &[Dot],
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let goals = summaries.iter().map(|s| s.goal.bound_s);
    let hi = dots
        .iter()
        .map(|d| d.idle_s)
        .chain(goals)
        .fold(1.0, f64::max)
        * 1.6;
    let lo = dots
        .iter()
        .map(|d| d.idle_s)
        .fold(f64::INFINITY, f64::min)
        .clamp(0.005, 0.05)
        * 0.7;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Partition idle time per group event: {} partitions, 3 instances, {} ticks/s",
                report.partitions, report.rate
            ),
            ("sans-serif", 22),
        )
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..3.0, (lo..hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("dots: every partition of every repeat; thin black bar p50, thick bar p99; dashed: the goal")
        .y_desc("longest time without a committed offset advancing (s, log)")
        .light_line_style(WHITE)
        .x_labels(7)
        .x_label_formatter(&|v: &f64| {
            let e = (*v - 0.5).round();
            if (*v - 0.5 - e).abs() < 0.01 && (0.0..3.0).contains(&e) {
                super::Event::ALL[e as usize].label().to_owned()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v: &f64| {
            if *v >= 1.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        })
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()?;
    for protocol in protocols {
        let color = color_of(protocols, protocol);
        let label = match report.session(protocol) {
            Some(s) => format!(
                "{protocol} (session {:.0} s, heartbeat {:.0} s)",
                s.session_timeout_ms as f64 / 1e3,
                s.heartbeat_interval_ms as f64 / 1e3
            ),
            None => (*protocol).to_owned(),
        };
        chart
            .draw_series(
                dots.iter()
                    .filter(|d| d.protocol == *protocol)
                    .map(|d| Circle::new((d.x, d.idle_s.max(lo)), 3, color.mix(0.6).filled())),
            )?
            .label(label)
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
    }
    for s in summaries {
        let Some(x) = column_x(s.event as usize, protocols, &s.protocol) else {
            continue;
        };
        let color = color_of(protocols, &s.protocol);
        let half = SPREAD + 0.03;
        if let Some(p50) = s.p50_s {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x - half, p50.max(lo)), (x + half, p50.max(lo))],
                BLACK.stroke_width(1),
            )))?;
        }
        if let Some(p99) = s.p99_s {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x - half, p99.max(lo)), (x + half, p99.max(lo))],
                color.stroke_width(4),
            )))?;
        }
        chart.draw_series(DashedLineSeries::new(
            vec![
                (x - half - 0.03, s.goal.bound_s),
                (x + half + 0.03, s.goal.bound_s),
            ],
            6,
            4,
            BLACK.stroke_width(2),
        ))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_sit_side_by_side_inside_their_event() {
        let both = ["classic", "consumer"];
        let a = column_x(0, &both, "classic").unwrap();
        let b = column_x(0, &both, "consumer").unwrap();
        assert!(a < b && a - SPREAD > 0.0 && b + SPREAD < 1.0, "{a} {b}");
        assert_eq!(column_x(2, &["consumer"], "consumer"), Some(2.5));
        assert_eq!(column_x(1, &both, "other"), None);
    }

    /// A made-up run of both protocols: the plot is drawn (REBALANCE_PLOT=path keeps it, to
    /// look at).
    #[test]
    fn a_plot_is_drawn_from_a_report() {
        use super::super::{report, Event, EventResult, RunResult, Session, SettleSettings};
        let runs = ["classic", "consumer"]
            .into_iter()
            .flat_map(|protocol| {
                (0..3).map(move |repeat| RunResult {
                    protocol: protocol.to_owned(),
                    repeat,
                    start_s: 5.0,
                    events: Event::ALL
                        .iter()
                        .map(|&event| EventResult {
                            protocol: protocol.to_owned(),
                            repeat,
                            event,
                            idle_s: (0..12)
                                .map(|p| {
                                    let moved = p % 3 == repeat;
                                    Some(match (event, moved) {
                                        (Event::Sigkill, true) => 46.0 + p as f64 / 10.0,
                                        (_, true) => 1.5 + p as f64 / 10.0,
                                        _ => 0.1 + p as f64 / 100.0,
                                    })
                                })
                                .collect(),
                            settled: true,
                            anchor_s: Some(0.4),
                            closed_s: 5.0,
                            exit: None,
                        })
                        .collect(),
                    ticks_sent: 1,
                    ticks_per_s: 1.0,
                })
            })
            .collect();
        let r = Report {
            partitions: 12,
            rate: 1000,
            symbols: 240,
            commit_interval_ms: 100,
            poll_ms: 50,
            settle: SettleSettings {
                quiet_s: 1.0,
                hold_s: 3.0,
            },
            sessions: vec![
                Session {
                    protocol: "classic".to_owned(),
                    session_timeout_ms: 45_000,
                    heartbeat_interval_ms: 3_000,
                    source: String::new(),
                },
                Session {
                    protocol: "consumer".to_owned(),
                    session_timeout_ms: 45_000,
                    heartbeat_interval_ms: 5_000,
                    source: String::new(),
                },
            ],
            runs,
        };
        let path = std::env::var_os("REBALANCE_PLOT")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::env::temp_dir().join(format!("rebalance-plot-{}.png", std::process::id()))
            });
        let drawn = write_png(&r, &report::summarize(&r), &path).unwrap();
        assert!(drawn);
        let len = std::fs::metadata(&path).unwrap().len();
        if std::env::var_os("REBALANCE_PLOT").is_none() {
            let _ = std::fs::remove_file(&path);
        }
        assert!(len > 10_000, "{len} bytes");
    }
}
