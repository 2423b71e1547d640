//! The summary of rebalance-bench: per event and protocol, p50, p99 and max of the idle times of
//! every partition over every repeat (nearest rank, [`crate::stats::percentile`]), each repeat's
//! max, and the goal of issue 44 for that event, met or not.
//!
//! The goals, as issue 44 states them:
//! - SIGTERM of one of three instances: every partition commits again within 2 s, p99 over the
//!   repeats;
//! - a new instance joins: no partition idles more than 1 s (the max);
//! - SIGKILL: every partition commits again within the session timeout + 2 s (the max), the
//!   session being the protocol's: the broker's `group.consumer.session.timeout.ms` under the
//!   consumer protocol, the client's `session.timeout.ms` under classic.
//!
//! Issue 44 sets the SIGTERM goal for the consumer protocol; it is shown for both, to compare.

use super::{Event, Report};
use crate::stats::{max, percentile};
use serde::Serialize;
use std::fmt::Write as _;

/// A goal: a statistic of the idle times at or below a bound.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Goal {
    /// `p99` or `max`.
    pub stat: &'static str,
    pub bound_s: f64,
}

impl Goal {
    /// The goal of `event` under a protocol whose session timeout is `session_s`.
    pub fn of(event: Event, session_s: f64) -> Goal {
        match event {
            Event::Sigterm => Goal {
                stat: "p99",
                bound_s: 2.0,
            },
            Event::Join => Goal {
                stat: "max",
                bound_s: 1.0,
            },
            Event::Sigkill => Goal {
                stat: "max",
                bound_s: session_s + 2.0,
            },
        }
    }

    /// Whether `summary` meets the goal (`None` without figures).
    fn met(&self, p99: Option<f64>, max: Option<f64>) -> Option<bool> {
        let figure = if self.stat == "p99" { p99 } else { max }?;
        Some(figure <= self.bound_s)
    }
}

impl std::fmt::Display for Goal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} <= {:.1} s", self.stat, self.bound_s)
    }
}

/// One event under one protocol, over every repeat.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub event: Event,
    pub protocol: String,
    /// Idle figures (partitions x repeats).
    pub samples: usize,
    pub p50_s: Option<f64>,
    pub p99_s: Option<f64>,
    pub max_s: Option<f64>,
    /// Each repeat's largest idle time, in repeat order.
    pub repeat_max_s: Vec<f64>,
    /// Runs whose event did not settle by its deadline (their figures are lower bounds).
    pub unsettled: usize,
    pub goal: Goal,
    pub met: Option<bool>,
}

/// Every event under every protocol, in event order, the protocols in the order of the report's
/// sessions.
pub fn summarize(report: &Report) -> Vec<Summary> {
    let mut out = Vec::new();
    for event in Event::ALL {
        for session in &report.sessions {
            let results: Vec<_> = report
                .events()
                .filter(|e| e.event == event && e.protocol == session.protocol)
                .collect();
            if results.is_empty() {
                continue;
            }
            let all: Vec<f64> = results
                .iter()
                .flat_map(|e| e.idle_s.iter().flatten().copied())
                .collect();
            let goal = Goal::of(event, session.session_timeout_ms as f64 / 1e3);
            let (p99, max) = (percentile(&all, 99.0), max(&all));
            out.push(Summary {
                event,
                protocol: session.protocol.clone(),
                samples: all.len(),
                p50_s: percentile(&all, 50.0),
                p99_s: p99,
                max_s: max,
                repeat_max_s: results.iter().filter_map(|e| e.max_idle_s()).collect(),
                unsettled: results.iter().filter(|e| !e.settled).count(),
                met: goal.met(p99, max),
                goal,
            });
        }
    }
    out
}

fn secs(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |s| format!("{s:.2} s"))
}

/// The summaries as a Markdown table.
pub fn table(summaries: &[Summary]) -> String {
    let mut out = String::from(
        "| event | protocol | partitions x repeats | p50 | p99 | max | max per repeat (s) | not settled | goal | met |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in summaries {
        let per_repeat: Vec<String> = s.repeat_max_s.iter().map(|v| format!("{v:.2}")).collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.event,
            s.protocol,
            s.samples,
            secs(s.p50_s),
            secs(s.p99_s),
            secs(s.max_s),
            per_repeat.join(", "),
            s.unsettled,
            s.goal,
            match s.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "-",
            }
        );
    }
    out
}

/// One row per partition, event and run: `protocol,repeat,event,partition,idle_ms,settled`
/// (an empty idle_ms for a partition that had no progress before the event).
pub fn idle_csv(report: &Report) -> String {
    let mut out = String::from("protocol,repeat,event,partition,idle_ms,settled\n");
    for e in report.events() {
        for (p, idle) in e.idle_s.iter().enumerate() {
            let _ = writeln!(
                out,
                "{},{},{},{p},{},{}",
                e.protocol,
                e.repeat,
                e.event,
                idle.map_or(String::new(), |s| format!("{:.0}", s * 1e3)),
                e.settled
            );
        }
    }
    out
}

/// One row per event and protocol.
pub fn summary_csv(summaries: &[Summary]) -> String {
    let ms = |v: Option<f64>| v.map_or(String::new(), |s| format!("{:.0}", s * 1e3));
    let mut out =
        String::from("event,protocol,samples,p50_ms,p99_ms,max_ms,not_settled,goal,goal_ms,met\n");
    for s in summaries {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{:.0},{}",
            s.event,
            s.protocol,
            s.samples,
            ms(s.p50_s),
            ms(s.p99_s),
            ms(s.max_s),
            s.unsettled,
            s.goal.stat,
            s.goal.bound_s * 1e3,
            s.met.map_or(String::new(), |m| m.to_string())
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::{EventResult, RunResult, Session, SettleSettings};
    use super::*;

    fn event(protocol: &str, repeat: usize, event: Event, idle: &[Option<f64>]) -> EventResult {
        EventResult {
            protocol: protocol.to_owned(),
            repeat,
            event,
            idle_s: idle.to_vec(),
            settled: true,
            anchor_s: Some(0.5),
            closed_s: 5.0,
            exit: None,
        }
    }

    fn report(runs: Vec<RunResult>) -> Report {
        Report {
            partitions: 2,
            rate: 100,
            symbols: 10,
            commit_interval_ms: 100,
            poll_ms: 50,
            settle: SettleSettings {
                quiet_s: 1.0,
                hold_s: 3.0,
            },
            sessions: ["classic", "consumer"]
                .map(|p| Session {
                    protocol: p.to_owned(),
                    session_timeout_ms: 45_000,
                    heartbeat_interval_ms: 3_000,
                    source: String::new(),
                })
                .to_vec(),
            runs,
        }
    }

    #[test]
    fn figures_pool_every_partition_of_every_repeat_per_event_and_protocol() {
        let runs = (0..2)
            .map(|r| RunResult {
                protocol: "consumer".to_owned(),
                repeat: r,
                start_s: 1.0,
                events: vec![
                    event(
                        "consumer",
                        r,
                        Event::Sigterm,
                        &[Some(0.1), Some(1.0 + r as f64)],
                    ),
                    event("consumer", r, Event::Sigkill, &[Some(0.2), Some(47.5)]),
                    // Partition 1 had no progress before the join: no figure.
                    event("consumer", r, Event::Join, &[Some(0.3), None]),
                ],
                ticks_sent: 1,
                ticks_per_s: 1.0,
            })
            .collect();
        let s = summarize(&report(runs));
        // Classic did not run: no rows for it.
        assert_eq!(s.len(), 3);
        let term = &s[0];
        assert_eq!((term.event, term.samples), (Event::Sigterm, 4));
        // Nearest rank: the 2nd of 0.1, 0.1, 1.0, 2.0.
        assert_eq!(term.p50_s, Some(0.1));
        assert_eq!(term.p99_s, Some(2.0));
        assert_eq!(term.repeat_max_s, [1.0, 2.0]);
        assert_eq!(term.met, Some(true));
        let kill = &s[1];
        assert_eq!(kill.goal.bound_s, 47.0);
        assert_eq!(kill.met, Some(false));
        let join = &s[2];
        assert_eq!(join.samples, 2);
        assert_eq!(join.met, Some(true));
        let table = table(&s);
        assert!(table.contains("| SIGKILL | consumer | 4 | 0.20 s | 47.50 s | 47.50 s | 47.50, 47.50 | 0 | max <= 47.0 s | **no** |"), "{table}");
        let csv = summary_csv(&s);
        assert!(
            csv.contains("SIGTERM,consumer,4,100,2000,2000,0,p99,2000,true"),
            "{csv}"
        );
    }

    #[test]
    fn the_idle_csv_has_a_row_per_partition_and_leaves_unmeasured_ones_empty() {
        let r = report(vec![RunResult {
            protocol: "classic".to_owned(),
            repeat: 0,
            start_s: 1.0,
            events: vec![event("classic", 0, Event::Join, &[Some(0.25), None])],
            ticks_sent: 1,
            ticks_per_s: 1.0,
        }]);
        assert_eq!(
            idle_csv(&r),
            "protocol,repeat,event,partition,idle_ms,settled\nclassic,0,join,0,250,true\nclassic,0,join,1,,true\n"
        );
    }
}
