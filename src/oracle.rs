//! The oracle: what the notifications should be, against what read_committed readers find.
//!
//! The expected notifications are computed from the committed input with the same pure crossing
//! rule, partition by partition in offset order, per symbol: exactly what an uninterrupted
//! processor would do. Ticks that do not decode, and poison ticks when fault injection is on, are
//! skipped here (the processor dead-letters them). The found notifications are read with read_committed to the end of every partition and
//! compared by id (`symbol:seq:threshold:direction`): missing, duplicate and unexpected ids are
//! listed, and any of them makes the verdict fail.

use crate::alert::{apply_alerts, apply_rules, LiveOutcome, Notification, Outcome, SymbolState};
use crate::dlq::FaultInjection;
use crate::kafka::read::{read_topic_to_end, DEFAULT_READ_TIMEOUT};
use crate::kafka::{Isolation, KafkaConfig};
use crate::rules::Rules;
use crate::tick;
use anyhow::Context as _;
use rdkafka::Message;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// The verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Input records read (read_committed).
    pub input_records: u64,
    /// Input records that did not decode as ticks.
    pub bad_ticks: u64,
    /// Stale ticks in the input.
    pub stale_ticks: u64,
    /// Ticks that are poison under the fault injection in force.
    pub poison_ticks: u64,
    /// Live alerts: ticks whose alerts in force no rules record decides yet (not processed).
    pub undecided_ticks: u64,
    /// Notifications the input implies.
    pub expected: u64,
    /// Notifications found (read_committed), duplicates included.
    pub found: u64,
    /// Expected ids not found.
    pub missing: Vec<String>,
    /// Ids found more than once, with their count.
    pub duplicate: Vec<(String, u64)>,
    /// Ids found that the input does not imply.
    pub unexpected: Vec<String>,
    /// The final state per (partition, symbol) an uninterrupted run ends with.
    pub final_state: BTreeMap<i32, BTreeMap<String, SymbolState>>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.missing.is_empty() && self.duplicate.is_empty() && self.unexpected.is_empty()
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:<12} {:>10}", "input ticks", self.input_records)?;
        writeln!(f, "{:<12} {:>10}", "bad ticks", self.bad_ticks)?;
        writeln!(f, "{:<12} {:>10}", "stale ticks", self.stale_ticks)?;
        writeln!(f, "{:<12} {:>10}", "poison ticks", self.poison_ticks)?;
        if self.undecided_ticks > 0 {
            writeln!(f, "{:<12} {:>10}", "undecided", self.undecided_ticks)?;
        }
        writeln!(f, "{:<12} {:>10}", "expected", self.expected)?;
        writeln!(f, "{:<12} {:>10}", "found", self.found)?;
        writeln!(f, "{:<12} {:>10}", "missing", self.missing.len())?;
        writeln!(f, "{:<12} {:>10}", "duplicate", self.duplicate.len())?;
        writeln!(f, "{:<12} {:>10}", "unexpected", self.unexpected.len())?;
        for id in self.missing.iter().take(10) {
            writeln!(f, "  missing    {id}")?;
        }
        for (id, n) in self.duplicate.iter().take(10) {
            writeln!(f, "  duplicate  {id} x{n}")?;
        }
        for id in self.unexpected.iter().take(10) {
            writeln!(f, "  unexpected {id}")?;
        }
        write!(
            f,
            "{}",
            if self.ok() {
                "VERDICT: exactly once"
            } else {
                "VERDICT: DIFFERENCES FOUND"
            }
        )
    }
}

/// Expected notification ids of a committed input, computed with the crossing rule.
pub fn expected_from_input(
    kafka: &KafkaConfig,
    input: &str,
    rules: &Rules,
    max_tick_bytes: usize,
    faults: FaultInjection,
    report: &mut VerifyReport,
) -> anyhow::Result<Vec<String>> {
    let mut state: BTreeMap<i32, HashMap<String, Option<SymbolState>>> = BTreeMap::new();
    let mut expected = Vec::new();
    report.input_records = read_topic_to_end(
        kafka,
        input,
        Isolation::ReadCommitted,
        DEFAULT_READ_TIMEOUT,
        |m| {
            let Ok(t) = tick::decode(m.payload(), max_tick_bytes) else {
                report.bad_ticks += 1;
                return Ok(());
            };
            if faults.is_poison(t.seq) {
                // Dead-lettered by the processor after its retry budget: no state change, no alert.
                report.poison_ticks += 1;
                return Ok(());
            }
            let s = state
                .entry(m.partition())
                .or_default()
                .entry(t.symbol.clone())
                .or_insert(None);
            match apply_rules(rules, s, &t) {
                Outcome::Accepted { crossings } => expected.extend(
                    crossings
                        .iter()
                        .map(|c| Notification::id_of(&t.symbol, t.seq, c.threshold, c.direction)),
                ),
                Outcome::Stale { .. } => report.stale_ticks += 1,
                Outcome::Unwatched => {}
            }
            Ok(())
        },
    )
    .with_context(|| format!("reading input {input}"))?;
    report.final_state = final_state(state);
    Ok(expected)
}

/// The symbols' states the replay ended with, per partition (those never accepted left out).
fn final_state(
    state: BTreeMap<i32, HashMap<String, Option<SymbolState>>>,
) -> BTreeMap<i32, BTreeMap<String, SymbolState>> {
    state
        .into_iter()
        .map(|(p, m)| {
            (
                p,
                m.into_iter()
                    .filter_map(|(s, st)| st.map(|st| (s, st)))
                    .collect(),
            )
        })
        .collect()
}

/// Compares the notifications implied by `input` with those committed to `notifications`.
pub fn verify(
    kafka: &KafkaConfig,
    input: &str,
    notifications: &str,
    rules: &Rules,
    max_tick_bytes: usize,
    faults: FaultInjection,
) -> anyhow::Result<VerifyReport> {
    let mut report = VerifyReport::default();
    let expected = expected_from_input(kafka, input, rules, max_tick_bytes, faults, &mut report)?;
    let found = found_in(kafka, notifications, &mut report)?;
    compare(&mut report, &expected, &found);
    Ok(report)
}

/// [`verify`] for live alerts: the expected notifications from the input and the rules topic,
/// joined by the rule of [`crate::rules::live`].
pub fn verify_live(
    kafka: &KafkaConfig,
    input: &str,
    notifications: &str,
    rules_topic: &str,
    max_tick_bytes: usize,
    faults: FaultInjection,
) -> anyhow::Result<VerifyReport> {
    let mut report = VerifyReport::default();
    let expected = expected_from_live(
        kafka,
        input,
        rules_topic,
        max_tick_bytes,
        faults,
        &mut report,
    )?;
    let found = found_in(kafka, notifications, &mut report)?;
    compare(&mut report, &expected, &found);
    Ok(report)
}

/// Expected notification ids of a committed input joined with the live alerts of `rules_topic`:
/// partition by partition, each tick sees the alerts in force by the join's rule (the same
/// [`PartitionJoin`] the pipeline drives, fed the whole rules partition at once). A tick whose
/// prefix no record ends has not been processed by a pipeline yet; it is counted as undecided and
/// evaluated with every alert applied.
pub fn expected_from_live(
    kafka: &KafkaConfig,
    input: &str,
    rules_topic: &str,
    max_tick_bytes: usize,
    faults: FaultInjection,
    report: &mut VerifyReport,
) -> anyhow::Result<Vec<String>> {
    let probe = crate::kafka::read::reader(kafka, Isolation::ReadCommitted)?;
    let partitions = crate::kafka::read::partition_count(&probe, input, DEFAULT_READ_TIMEOUT)?;
    let mut joins = crate::kafka::rules::read_joins(kafka, rules_topic, partitions)?;
    let mut state: BTreeMap<i32, HashMap<String, Option<SymbolState>>> = BTreeMap::new();
    let mut expected = Vec::new();
    report.input_records = read_topic_to_end(
        kafka,
        input,
        Isolation::ReadCommitted,
        DEFAULT_READ_TIMEOUT,
        |m| {
            // As the pipeline: the join's prefix advances for every record, before it is decoded.
            let join = joins.entry(m.partition()).or_default();
            if !join.ready(m.timestamp().to_millis().unwrap_or(0), m.offset()) {
                report.undecided_ticks += 1;
            }
            let Ok(t) = tick::decode(m.payload(), max_tick_bytes) else {
                report.bad_ticks += 1;
                return Ok(());
            };
            if faults.is_poison(t.seq) {
                report.poison_ticks += 1;
                return Ok(());
            }
            let s = state
                .entry(m.partition())
                .or_default()
                .entry(t.symbol.clone())
                .or_insert(None);
            match apply_alerts(join.table().of_symbol(&t.symbol), s, &t) {
                LiveOutcome::Accepted { fired } => {
                    for f in fired {
                        expected.push(Notification::id_of_alert(
                            &t.symbol,
                            t.seq,
                            &f.id,
                            f.direction,
                        ));
                        if f.one_shot {
                            join.fire_one_shot(&f.id, f.version);
                        }
                    }
                }
                LiveOutcome::Stale { .. } => report.stale_ticks += 1,
            }
            Ok(())
        },
    )
    .with_context(|| format!("reading input {input}"))?;
    // With the disarmed alerts of the re-arm bands: what the pipeline's changelog must hold.
    report.final_state = final_state(state);
    Ok(expected)
}

/// The notifications committed to `notifications`: id -> times found.
fn found_in(
    kafka: &KafkaConfig,
    notifications: &str,
    report: &mut VerifyReport,
) -> anyhow::Result<HashMap<String, u64>> {
    let mut found: HashMap<String, u64> = HashMap::new();
    report.found = read_topic_to_end(
        kafka,
        notifications,
        Isolation::ReadCommitted,
        DEFAULT_READ_TIMEOUT,
        |m| {
            let n: Notification = serde_json::from_slice(m.payload().unwrap_or_default())
                .with_context(|| {
                    format!(
                        "{notifications}/{} offset {} is not a notification",
                        m.partition(),
                        m.offset()
                    )
                })?;
            *found.entry(n.id).or_default() += 1;
            Ok(())
        },
    )
    .with_context(|| format!("reading notifications {notifications}"))?;
    Ok(found)
}

/// Fills in the verdict: the expected ids against the found ones (id -> times found). Shared by
/// the topic's verifier above and the check of alert-sink's table.
pub fn compare(report: &mut VerifyReport, expected: &[String], found: &HashMap<String, u64>) {
    report.expected = expected.len() as u64;
    let mut expected_count: HashMap<&str, u64> = HashMap::new();
    for id in expected {
        *expected_count.entry(id).or_default() += 1;
    }
    for (id, &want) in &expected_count {
        match found.get(*id) {
            None => report.missing.push((*id).to_owned()),
            Some(&got) if got > want => report.duplicate.push(((*id).to_owned(), got)),
            Some(_) => {}
        }
    }
    for id in found.keys() {
        if !expected_count.contains_key(id.as_str()) {
            report.unexpected.push(id.clone());
        }
    }
    report.missing.sort();
    report.duplicate.sort();
    report.unexpected.sort();
}
