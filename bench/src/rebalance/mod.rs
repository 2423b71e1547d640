//! How long partitions go without committed progress when the group changes, under the classic
//! group protocol and under KIP-848's consumer protocol (`rebalance-bench`, issue 44 item 4).
//!
//! Each run gets fresh topics and a fresh group (so nothing carries over from one run to the
//! next) and plays the same story:
//!
//! ```text
//!  paced ticks ──► input (N partitions) ──► 3 × alert-pipeline ──► committed offsets
//!                                                                       ▲
//!   start: 0 1 2 ─ steady ─► SIGTERM 0 ─ settled ─► SIGKILL 1 ─ settled ─► join 3 ─ settled
//!                                                                       │
//!                              the bench polls the group's committed offsets every 50 ms
//! ```
//!
//! - **The instances** are the release `alert-pipeline` as it is deployed, as child processes
//!   ([`crate::child`]), each with its own `--instance-id` (so its own transactional id) and the
//!   product's default membership, **dynamic**: a stop leaves the group at once and a crash is
//!   noticed when its session expires. Static membership would change the SIGTERM story (under
//!   KIP-345 a static member's clean stop is meant not to leave the group, so that a restart
//!   finds its partitions, and a stop for good waits out its session) and it is not what ships
//!   (docs/pipeline.md, "Group membership").
//!   `--group-protocol` is the only thing that differs between the two protocols' runs, besides
//!   the classic session timeout, which the bench sets explicitly (`-X session.timeout.ms`,
//!   librdkafka's default 45 s unless told otherwise) so the report can state it; under the
//!   consumer protocol the session is the broker's and is read from it
//!   (`group.consumer.session.timeout.ms`, [`scenario::broker_settings`]).
//! - **The load** is a paced stream from the bench's own producer (10 ms slices), every symbol in
//!   turn, so every partition has input all the time and each commit advances every partition it
//!   covers. Prices climb 91..110 and drop back, so alerts fire and the changelog has state.
//! - **Progress** is the group's committed offset per input partition, read by a non-member with
//!   `OffsetFetch` (read_uncommitted, so it answers at once and only with committed
//!   transactions' offsets) every `--poll`. That is what exactly-once makes of progress: a
//!   partition whose records are processed but not committed has made none.
//! - **Idle time** per partition and event: the longest stretch without an advance from the
//!   event to the event's settling, [`idle`] says why the longest stretch and when an event is
//!   settled (its anchor seen: the stopped process exited, the killed one is gone, the new one
//!   has committed; then every partition advancing again for a while). The next event waits for
//!   that; an event that does not settle by its deadline is reported as such, its open stretches
//!   counted as they stood.
//! - **Events** in each run, in this order: SIGTERM of instance 0, SIGKILL of instance 1 (so the
//!   survivor holds every partition), a new instance 3 spawned. The clock of each starts at the
//!   signal's send or the spawn.
//! - **Interleaving.** Each repeat runs every protocol, the order alternating from one repeat to
//!   the next (classic, consumer; consumer, classic; …), so drift on the shared machine hits
//!   both.
//!
//! [`report`] summarises per event and protocol (p50, p99 and max over every partition of every
//! repeat, and each repeat's max) against the goals of issue 44; [`plot`] draws every figure;
//! [`cli`] is `rebalance-bench`'s command line and the flow its `main` runs.

pub mod cli;
pub mod idle;
pub mod plot;
pub mod report;
pub mod scenario;

use anyhow::Context as _;
use price_alerts::kafka::config::GroupProtocol;
use price_alerts::kafka::KafkaConfig;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use report::{Goal, Summary};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub kafka: KafkaConfig,
    /// The `alert-pipeline` binary.
    pub binary: PathBuf,
    /// The protocols compared, interleaved in this order in even repeats, reversed in odd ones.
    pub protocols: Vec<GroupProtocol>,
    pub repeats: usize,
    pub partitions: i32,
    /// Ticks per second over every symbol.
    pub rate: usize,
    /// Symbols of the stream (at least a few per partition, so every partition has input).
    pub symbols: usize,
    /// The pipelines' `--commit-interval`.
    pub commit_interval: Duration,
    /// The classic consumer's `session.timeout.ms`, set on the pipelines explicitly.
    pub classic_session_timeout: Duration,
    /// Extra arguments of every pipeline process.
    pub pipeline_args: Vec<String>,
    /// How often the group's committed offsets are read.
    pub poll: Duration,
    /// When an event counts as over ([`idle::Settle`]).
    pub settle: idle::Settle,
    /// Bound on each event's settling, beyond the session timeout for a SIGKILL.
    pub event_timeout: Duration,
    /// Bound on the start: every instance committing and every partition progressing.
    pub start_timeout: Duration,
    /// Where the pipelines' logs go (one file per process).
    pub log_dir: PathBuf,
}

/// A change of the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Event {
    /// One instance stopped with SIGTERM: it commits, leaves the group and exits.
    Sigterm,
    /// One instance killed: its partitions wait for its session to expire.
    Sigkill,
    /// A new instance started: partitions move to it.
    Join,
}

impl Event {
    pub const ALL: [Event; 3] = [Event::Sigterm, Event::Sigkill, Event::Join];

    pub fn label(self) -> &'static str {
        match self {
            Event::Sigterm => "SIGTERM",
            Event::Sigkill => "SIGKILL",
            Event::Join => "join",
        }
    }
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// What one event did to the partitions, in one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventResult {
    pub protocol: String,
    pub repeat: usize,
    pub event: Event,
    /// Idle time per partition (s); `None` for a partition without progress before the event.
    pub idle_s: Vec<Option<f64>>,
    /// The event settled before its deadline.
    pub settled: bool,
    /// From the event to its anchor (s): the stopped process's exit, the new one's first commit.
    pub anchor_s: Option<f64>,
    /// From the event to its window's close (s).
    pub closed_s: f64,
    /// The exit status of the stopped instance (SIGTERM), as the OS reported it.
    pub exit: Option<String>,
}

impl EventResult {
    /// The longest idle time of any partition (s).
    pub fn max_idle_s(&self) -> Option<f64> {
        crate::stats::max(&self.idle_s.iter().flatten().copied().collect::<Vec<_>>())
    }
}

impl std::fmt::Display for EventResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idle: Vec<String> = self
            .idle_s
            .iter()
            .map(|s| s.map_or("-".to_owned(), |s| format!("{s:.2}")))
            .collect();
        write!(
            f,
            "{} #{} {}: max idle {:.2} s, {} in {:.1} s (anchor {}); per partition [{}]{}",
            self.protocol,
            self.repeat,
            self.event,
            self.max_idle_s().unwrap_or(f64::NAN),
            if self.settled {
                "settled"
            } else {
                "NOT settled"
            },
            self.closed_s,
            self.anchor_s
                .map_or("not seen".to_owned(), |a| format!("{a:.2} s")),
            idle.join(" "),
            self.exit
                .as_ref()
                .map_or(String::new(), |e| format!("; {e}")),
        )
    }
}

/// One run: a protocol in one repeat.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub protocol: String,
    pub repeat: usize,
    /// From the spawn of the three instances to a steady group (s).
    pub start_s: f64,
    pub events: Vec<EventResult>,
    /// Ticks the paced stream sent during the run, and their rate (the pace it kept).
    pub ticks_sent: u64,
    pub ticks_per_s: f64,
}

/// The session settings each protocol ran with, as stated in the report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Session {
    pub protocol: String,
    pub session_timeout_ms: u64,
    pub heartbeat_interval_ms: u64,
    /// Whose settings these are, and where they come from.
    pub source: String,
}

/// Everything a run of the benchmark measured, with its settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub partitions: i32,
    pub rate: usize,
    pub symbols: usize,
    pub commit_interval_ms: u64,
    pub poll_ms: u64,
    pub settle: SettleSettings,
    pub sessions: Vec<Session>,
    pub runs: Vec<RunResult>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SettleSettings {
    pub quiet_s: f64,
    pub hold_s: f64,
}

impl Report {
    /// Every event result of every run.
    pub fn events(&self) -> impl Iterator<Item = &EventResult> {
        self.runs.iter().flat_map(|r| r.events.iter())
    }

    /// The session settings of `protocol`.
    pub fn session(&self, protocol: &str) -> Option<&Session> {
        self.sessions.iter().find(|s| s.protocol == protocol)
    }

    /// The settings, as lines for the report's head.
    pub fn settings_text(&self) -> String {
        let mut out = format!(
            "{} partitions, {} ticks/s over {} symbols, commit interval {} ms, offsets polled every {} ms; settled once every partition advanced within {} s, for {} s in a row\n",
            self.partitions,
            self.rate,
            self.symbols,
            self.commit_interval_ms,
            self.poll_ms,
            self.settle.quiet_s,
            self.settle.hold_s
        );
        let fed: Vec<f64> = self.runs.iter().map(|r| r.ticks_per_s).collect();
        if let Some(fed) = crate::stats::Spread::of(&fed) {
            out.push_str(&format!(
                "ticks fed per second, over the runs: median {:.0} ({:.0}-{:.0})\n",
                fed.median, fed.min, fed.max
            ));
        }
        for s in &self.sessions {
            out.push_str(&format!(
                "{}: session timeout {} ms, heartbeat interval {} ms ({})\n",
                s.protocol, s.session_timeout_ms, s.heartbeat_interval_ms, s.source
            ));
        }
        out
    }
}

/// The protocols of `repeat` in their turn: as given in even repeats, reversed in odd ones.
pub fn order(protocols: &[GroupProtocol], repeat: usize) -> Vec<GroupProtocol> {
    let mut v = protocols.to_vec();
    if repeat % 2 == 1 {
        v.reverse();
    }
    v
}

/// Runs every protocol `repeats` times, interleaved; `progress` is told of each event.
pub fn run(opts: &Options, mut progress: impl FnMut(&str)) -> anyhow::Result<Report> {
    let sessions = scenario::sessions(opts)?;
    for s in &sessions {
        progress(&format!(
            "{}: session timeout {} ms, heartbeat interval {} ms ({})",
            s.protocol, s.session_timeout_ms, s.heartbeat_interval_ms, s.source
        ));
    }
    let mut runs = Vec::new();
    for repeat in 0..opts.repeats {
        for protocol in order(&opts.protocols, repeat) {
            let session = sessions
                .iter()
                .find(|s| s.protocol == protocol.as_str())
                .map_or(opts.classic_session_timeout, |s| {
                    Duration::from_millis(s.session_timeout_ms)
                });
            let r = scenario::run(opts, protocol, repeat, session, &mut progress)
                .with_context(|| format!("run {protocol} #{repeat}"))?;
            progress(&format!(
                "{protocol} #{repeat}: {} ticks fed at {:.0}/s",
                r.ticks_sent, r.ticks_per_s
            ));
            runs.push(r);
        }
    }
    Ok(Report {
        partitions: opts.partitions,
        rate: opts.rate,
        symbols: opts.symbols,
        commit_interval_ms: opts.commit_interval.as_millis() as u64,
        poll_ms: opts.poll.as_millis() as u64,
        settle: SettleSettings {
            quiet_s: opts.settle.quiet,
            hold_s: opts.settle.hold,
        },
        sessions,
        runs,
    })
}

/// Writes `results.json` (settings and every run), `results.md` (the settings and the table),
/// `idle.csv` (one row per partition, event and run), `summary.csv` and `idle.png` into `dir`;
/// returns what results.md holds.
pub fn write_outputs(dir: &Path, report: &Report) -> anyhow::Result<String> {
    let summaries = report::summarize(report);
    let text = format!("{}\n{}", report.settings_text(), report::table(&summaries));
    crate::write_results(dir, &(report, &summaries), &text)?;
    std::fs::write(dir.join("idle.csv"), report::idle_csv(report))?;
    std::fs::write(dir.join("summary.csv"), report::summary_csv(&summaries))?;
    plot::write_png(report, &summaries, &dir.join("idle.png"))?;
    Ok(text)
}

/// The report of a `results.json` written before (rebalance-bench --replot), to write its
/// outputs again.
pub fn read_report(results_json: &Path) -> anyhow::Result<Report> {
    let text = std::fs::read_to_string(results_json)
        .with_context(|| format!("reading {}", results_json.display()))?;
    let (report, _summaries): (Report, serde_json::Value) = serde_json::from_str(&text)
        .with_context(|| format!("{}: not rebalance-bench's results", results_json.display()))?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_take_turns_first() {
        let both = [GroupProtocol::Classic, GroupProtocol::Consumer];
        assert_eq!(order(&both, 0), both);
        assert_eq!(
            order(&both, 1),
            [GroupProtocol::Consumer, GroupProtocol::Classic]
        );
        assert_eq!(order(&both, 2), both);
        assert_eq!(
            order(&[GroupProtocol::Consumer], 1),
            [GroupProtocol::Consumer]
        );
    }
}
