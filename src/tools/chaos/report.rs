//! What a chaos run found ([`ChaosReport`]): the figures of what it did (every stage's process
//! starts and signals, the broker bounces, the coordinator kills and how each watched instance
//! came out of its kill, the transactions the pipeline's instances logged), what the checks
//! found ([`checks`](super::checks), and the sink's and the deliverer's in an all-stage run),
//! and the verdict ([`ChaosReport::ok`]).
//!
//! A file of its own because the report is the run's one output: `alert-chaos` and the chaos
//! tests print it as it is ([`Display`](fmt::Display): one line per figure, then each problem
//! found marked `!`, then `VERDICT:`), docs/testing.md quotes it, and [`run`](super::run)
//! only fills it.

use super::alerts;
use super::bounce::Bounce;
use super::checks::DeadLetters;
use super::coordinator::CoordinatorKill;
use super::downstream::DownstreamReport;
use super::instances::{self, InstanceFigures, Instances};
use super::plan::Stage;
use crate::kafka::config::GroupProtocol;
use crate::oracle::VerifyReport;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// The figures and the verdict of a run.
#[derive(Debug, Clone)]
pub struct ChaosReport {
    pub seed: u64,
    pub prefix: String,
    pub ticks: usize,
    pub instances: usize,
    /// The pipeline instances' figures.
    pub figures: InstanceFigures,
    /// Every stage's instance figures (the pipeline's first).
    pub stages: Vec<(Stage, InstanceFigures)>,
    /// The group protocol each stage ran, and the session of its members under it
    /// ([`ChaosOptions::session`](super::ChaosOptions::session)).
    pub group_protocols: Vec<(Stage, GroupProtocol, Duration)>,
    pub bounces: Vec<Bounce>,
    /// The coordinator kills, each with the outcome of every instance watched.
    pub coordinator_kills: Vec<CoordinatorKill>,
    /// Transactions committed and aborted, as the instances logged them.
    pub commits: u64,
    pub aborts: u64,
    /// Partitions of the run's topics without the cluster's replication factor.
    pub replication: Vec<String>,
    /// The group's committed offsets after the stop, and the input's end.
    pub committed: Vec<Option<i64>>,
    pub end: BTreeMap<i32, i64>,
    pub verify: VerifyReport,
    pub dead_letters: DeadLetters,
    /// Partitions whose LSO stayed behind the high watermark.
    pub open_transactions: Vec<String>,
    /// find-hanging rows, per broker.
    pub hanging: Vec<String>,
    /// Exit status of each instance's last process.
    pub final_exits: Vec<(String, String)>,
    pub chaos: Duration,
    pub total: Duration,
    /// The sink's and the deliverer's checks and PostgreSQL's shutdowns (all-stage runs).
    pub downstream: Option<DownstreamReport>,
    /// Live alerts: the alert changes made during the chaos.
    pub alert_changes: Option<alerts::Changes>,
}

impl ChaosReport {
    /// Whether the committed offsets are the input's end on every partition.
    pub fn committed_at_end(&self) -> bool {
        self.end
            .iter()
            .all(|(p, o)| self.committed.get(*p as usize).copied().flatten() == Some(*o))
    }

    /// Instances left stuck by a coordinator kill.
    pub fn stuck(&self) -> usize {
        self.coordinator_kills
            .iter()
            .map(CoordinatorKill::stuck)
            .sum()
    }

    /// Every property holds.
    pub fn ok(&self) -> bool {
        self.stuck() == 0
            && self.committed_at_end()
            && self.verify.ok()
            && self.verify.input_records == self.ticks as u64
            && self.dead_letters.ok()
            && self.open_transactions.is_empty()
            && self.hanging.is_empty()
            && self.replication.is_empty()
            && self.downstream.as_ref().is_none_or(|d| d.checks.ok())
    }
}

/// Commits and aborts the instances logged (every incarnation appends to its instance's log).
pub(super) fn logged_transactions(dir: &std::path::Path, ids: &[String]) -> (u64, u64) {
    let (mut commits, mut aborts) = (0, 0);
    for id in ids {
        let text = std::fs::read(Instances::log_path(dir, Stage::Pipeline, id)).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        commits += text.matches("transaction committed").count() as u64;
        aborts += text.matches("transaction aborted").count() as u64;
    }
    (commits, aborts)
}

impl fmt::Display for ChaosReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fig = &self.figures;
        let (hard, clean) = (
            self.bounces.iter().filter(|b| b.hard).count(),
            self.bounces.iter().filter(|b| !b.hard).count(),
        );
        let v = &self.verify;
        let d = &self.dead_letters;
        writeln!(
            f,
            "chaos run, seed {} (the same --seed replays the stream and the schedule)",
            self.seed
        )?;
        writeln!(f, "{:<22} {}", "ticks", self.ticks)?;
        let protocols: Vec<String> = self
            .group_protocols
            .iter()
            .map(|(s, p, session)| {
                let whose = match p {
                    GroupProtocol::Classic => "the client's",
                    GroupProtocol::Consumer => "the broker's",
                };
                format!(
                    "{} {p} (session {}s, {whose})",
                    s.name(),
                    session.as_secs_f64()
                )
            })
            .collect();
        writeln!(f, "{:<22} {}", "group protocols", protocols.join("; "))?;
        writeln!(
            f,
            "{:<22} {} ({} process starts)",
            "instances", self.instances, fig.starts
        )?;
        writeln!(f, "{:<22} {}", "SIGKILLs", fig.sigkills)?;
        writeln!(
            f,
            "{:<22} {} ({} exited 0, {} escalated to SIGKILL)",
            "SIGTERMs", fig.sigterms, fig.clean_exits, fig.term_escalations
        )?;
        writeln!(
            f,
            "{:<22} {} ({} fenced: {})",
            "SIGSTOPs (zombies)",
            fig.sigstops,
            fig.zombies_fenced,
            fig.zombie_outcomes.join("; ")
        )?;
        for (stage, fig) in self.stages.iter().filter(|(s, _)| *s != Stage::Pipeline) {
            writeln!(
                f,
                "{:<22} {} process starts; {} SIGKILLs, {} SIGTERMs ({} exited 0, {} escalated), \
                 {} SIGSTOPs ({} expelled from their group: {})",
                format!("{} instances", stage.name()),
                fig.starts,
                fig.sigkills,
                fig.sigterms,
                fig.clean_exits,
                fig.term_escalations,
                fig.sigstops,
                fig.zombies_fenced,
                fig.zombie_outcomes.join("; ")
            )?;
        }
        writeln!(f, "{:<22} {} hard, {} clean", "broker bounces", hard, clean)?;
        for b in &self.bounces {
            writeln!(
                f,
                "  {:<5} broker {} ({}): down {:.1}s, back and fully replicated in {:.1}s",
                if b.hard { "hard" } else { "clean" },
                b.broker,
                b.role,
                b.down.as_secs_f64(),
                b.recovered.as_secs_f64()
            )?;
        }
        writeln!(
            f,
            "{:<22} {} ({} busy instances watched, {} stuck)",
            "coordinator kills",
            self.coordinator_kills.len(),
            self.coordinator_kills
                .iter()
                .flat_map(|k| &k.instances)
                .filter(|(_, p)| *p != instances::Progress::Idle)
                .count(),
            self.stuck()
        )?;
        for k in &self.coordinator_kills {
            writeln!(f, "  {k}")?;
        }
        let watchdog: Vec<String> = self
            .stages
            .iter()
            .map(|(s, fig)| format!("{} {}", s.name(), fig.watchdog_exits))
            .collect();
        writeln!(
            f,
            "{:<22} {} (restarted)",
            "exits 75 (watchdog)",
            watchdog.join(", ")
        )?;
        let unplanned: Vec<String> = self
            .stages
            .iter()
            .flat_map(|(s, fig)| {
                fig.unplanned_exits
                    .iter()
                    .map(move |e| format!("{}: {e}", s.name()))
            })
            .collect();
        writeln!(f, "{:<22} {}", "unplanned exits", unplanned.len())?;
        for e in &unplanned {
            writeln!(f, "  {e}")?;
        }
        let finals: Vec<String> = self
            .final_exits
            .iter()
            .map(|(id, s)| format!("{id}: {s}"))
            .collect();
        writeln!(f, "{:<22} {}", "final stops", finals.join("; "))?;
        writeln!(
            f,
            "{:<22} {} ({} aborted)",
            "commits", self.commits, self.aborts
        )?;
        if let Some(c) = &self.alert_changes {
            writeln!(
                f,
                "{:<22} {} ({} updates, {} deletes, {} one-shots, {} banded; {} given up)",
                "alert changes",
                c.total(),
                c.updates,
                c.deletes,
                c.one_shots,
                c.banded,
                c.given_up
            )?;
        }
        writeln!(f, "{:<22} {}", "expected", v.expected)?;
        writeln!(f, "{:<22} {}", "found", v.found)?;
        writeln!(f, "{:<22} {}", "missing", v.missing.len())?;
        writeln!(f, "{:<22} {}", "duplicate", v.duplicate.len())?;
        writeln!(f, "{:<22} {}", "unexpected", v.unexpected.len())?;
        writeln!(
            f,
            "{:<22} {} of {} poison ticks (missing {}, duplicate {}, unexpected {})",
            "dead letters",
            d.found,
            d.expected,
            d.missing.len(),
            d.duplicate.len(),
            d.unexpected.len()
        )?;
        writeln!(
            f,
            "{:<22} {}",
            "offsets at input end",
            if self.committed_at_end() { "yes" } else { "NO" }
        )?;
        writeln!(
            f,
            "{:<22} {} open, {} hanging (find-hanging)",
            "transactions left",
            self.open_transactions.len(),
            self.hanging.len()
        )?;
        if let Some(d) = &self.downstream {
            write!(f, "{d}")?;
        }
        writeln!(
            f,
            "{:<22} {:.1}s (chaos {:.1}s)",
            "duration",
            self.total.as_secs_f64(),
            self.chaos.as_secs_f64()
        )?;
        let problems = self
            .replication
            .iter()
            .chain(&self.open_transactions)
            .chain(&self.hanging)
            .map(String::as_str)
            .chain(v.missing.iter().take(5).map(String::as_str))
            .chain(v.duplicate.iter().take(5).map(|(id, _)| id.as_str()))
            .chain(v.unexpected.iter().take(5).map(String::as_str));
        for p in problems {
            writeln!(f, "  ! {p}")?;
        }
        if !self.committed_at_end() {
            writeln!(
                f,
                "  ! committed {:?}, input end {:?}",
                self.committed, self.end
            )?;
        }
        if self.stuck() > 0 {
            writeln!(
                f,
                "  ! {} instances stuck after a coordinator kill",
                self.stuck()
            )?;
        }
        if v.input_records != self.ticks as u64 {
            writeln!(
                f,
                "  ! the input holds {} records, {} were fed",
                v.input_records, self.ticks
            )?;
        }
        if self.ok() {
            write!(f, "VERDICT: exactly once")
        } else {
            write!(
                f,
                "VERDICT: FAILED (the run's topics are kept: prefix {})",
                self.prefix
            )
        }
    }
}
