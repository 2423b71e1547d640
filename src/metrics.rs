//! The metrics of the processor, in one place, so log lines and counters never drift apart.
//!
//! Every metric is named in [`CATALOGUE`] with its help text, and [`describe`] registers all of
//! them at zero when the exporter is installed, so a dashboard or an alert rule sees every series
//! from the first scrape, not after its first event (`rate()` over a series that appears late
//! misses its first increase). Labelled series are registered for each known label value (every
//! dead-letter class).
//!
//! Business counters (ticks, notifications, dead letters, transactions) are counted at commit, so
//! a redo after an abort is never counted twice: the figures are those of committed work.
//! Operational events (transient failures, rebalances, restores, delivery failures, fencing) are
//! counted when they happen.
//!
//! Without an installed recorder every call is a no-op. `alert-pipeline --metrics-addr` installs
//! the Prometheus one ([`crate::health`]) and describes these; another binary's endpoint describes
//! its own (alert-deliver: [`crate::deliver::metrics`], with the two of these its shared
//! transactional producer emits).

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};
use std::collections::BTreeMap;
use std::time::Duration;

pub const TICKS_COMMITTED: &str = "alerts_ticks_committed_total";
pub const NOTIFICATIONS_COMMITTED: &str = "alerts_notifications_committed_total";
pub const TICKS_STALE: &str = "alerts_ticks_stale_total";
pub const TICKS_RETRIED: &str = "alerts_ticks_retried_total";
pub const DEAD_LETTERED: &str = "alerts_ticks_dead_lettered_total";
pub const TRANSIENT_FAILURES: &str = "alerts_transient_failures_total";
pub const TRANSACTIONS_COMMITTED: &str = "alerts_transactions_committed_total";
pub const TRANSACTIONS_ABORTED: &str = "alerts_transactions_aborted_total";
pub const COMMIT_SECONDS: &str = "alerts_commit_seconds";
pub const COMMIT_STEP_SECONDS: &str = "alerts_commit_step_seconds";
pub const PARTITIONS_RESTORED: &str = "alerts_partitions_restored_total";
pub const RESTORE_SECONDS: &str = "alerts_restore_seconds";
pub const RESTORE_RECORDS: &str = "alerts_restore_records_total";
pub const RESTORE_HELD: &str = "alerts_restore_held_partitions";
pub const REBALANCES: &str = "alerts_rebalances_total";
pub const FENCED: &str = "alerts_fenced_total";
pub const DELIVERY_FAILURES: &str = "alerts_delivery_failures_total";
pub const CONSUMER_LAG: &str = "alerts_consumer_lag";
pub const GROUP_COMMITTED_OFFSET: &str = "alerts_group_committed_offset";
pub const PARTITION_END_OFFSET: &str = "alerts_partition_end_offset";
pub const GROUP_LAG: &str = "alerts_group_lag";
pub const DLQ_OLDEST_AGE: &str = "alerts_dlq_oldest_unhandled_age_seconds";
pub const DLQ_UNHANDLED: &str = "alerts_dlq_unhandled";
pub const NOT_AUTHORISED: &str = "alerts_not_authorised_total";
pub const TXN_CALLS_STUCK: &str = "alerts_transactional_calls_stuck_total";
pub const OVERLAP_HELD: &str = "alerts_overlap_held_records_total";
pub const RULES_APPLIED: &str = "alerts_rules_applied_total";
pub const RULES_INVALID: &str = "alerts_rules_invalid_total";
pub const RULES_BARRIERS: &str = "alerts_rules_barriers_total";
pub const RULES_HOLD_SECONDS: &str = "alerts_rules_hold_seconds";
pub const ONE_SHOTS_FIRED: &str = "alerts_one_shots_fired_total";

/// The transactional calls that run under a deadline ([`crate::kafka::txn`]): the `call` label of
/// [`TXN_CALLS_STUCK`].
pub const TXN_CALLS: &[&str] = &[
    "init_transactions",
    "send_offsets_to_transaction",
    "commit_transaction",
    "abort_transaction",
];

/// The steps of a commit, the `step` label of [`COMMIT_STEP_SECONDS`]. Exactly-once: `state`
/// (the batch's state records handed to the producer), `flush` (the drain before the offsets of
/// a batch none of whose records was acknowledged yet: `pipeline::commit`), `send_offsets`
/// (AddOffsetsToTxn and TxnOffsetCommit), `end_transaction` (the records still in flight, then
/// EndTxn). At least once:
/// `flush` (the outputs, then the state records, acknowledged; twice a batch), `state`,
/// `commit_offsets` (the group's OffsetCommit). Where a batch's time goes besides processing:
/// pipeline-bench sets their sums against the run's time.
pub const COMMIT_STEPS: &[&str] = &[
    "state",
    "send_offsets",
    "end_transaction",
    "flush",
    "commit_offsets",
];

/// How a metric is exposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric of the processor: name, kind, help text.
pub const CATALOGUE: &[(&str, Kind, &str)] = &[
    (TICKS_COMMITTED, Kind::Counter, "Input records processed or dead-lettered inside committed transactions."),
    (NOTIFICATIONS_COMMITTED, Kind::Counter, "Notifications inside committed transactions."),
    (TICKS_STALE, Kind::Counter, "Stale ticks (seq not newer than the symbol's) ignored inside committed transactions."),
    (TICKS_RETRIED, Kind::Counter, "Ticks that succeeded only after retries, inside committed transactions."),
    (DEAD_LETTERED, Kind::Counter, "Ticks dead-lettered inside committed transactions, by failure class."),
    (TRANSIENT_FAILURES, Kind::Counter, "Failed processing attempts of ticks (each retried or dead-lettered), by class."),
    (TRANSACTIONS_COMMITTED, Kind::Counter, "Transactions committed."),
    (TRANSACTIONS_ABORTED, Kind::Counter, "Transactions aborted (their input is redone)."),
    (COMMIT_SECONDS, Kind::Histogram, "Time to commit a transaction: state, offsets, EndTxn."),
    (COMMIT_STEP_SECONDS, Kind::Histogram, "Time of each step of a commit that succeeded, by step (state, send_offsets, end_transaction; at least once: flush, state, commit_offsets)."),
    (PARTITIONS_RESTORED, Kind::Counter, "Input partitions whose state was restored from the changelog."),
    (RESTORE_SECONDS, Kind::Histogram, "Time to restore a batch of partitions from the changelog."),
    (RESTORE_RECORDS, Kind::Counter, "Changelog records read by restores (with the restore time: the restore rate)."),
    (RESTORE_HELD, Kind::Gauge, "Partitions whose restore is held by an undecided transaction on the changelog (its last stable offset below the end), as last seen: not ready until it is decided (docs/runbook.md)."),
    (REBALANCES, Kind::Counter, "Rebalance events of the consumer group, by kind (assign, revoke, lost)."),
    (FENCED, Kind::Counter, "Times this instance found itself fenced by a newer one (it then stops)."),
    (TXN_CALLS_STUCK, Kind::Counter, "Transactional calls that did not return within their deadline (the transaction timeout + 10 s), by call; each made the producer again."),
    (DELIVERY_FAILURES, Kind::Counter, "Records the producer could not deliver, by topic (the DLQ's included)."),
    (CONSUMER_LAG, Kind::Gauge, "Records between the consumer's position and the end of each input partition it owns (librdkafka's statistics)."),
    (GROUP_COMMITTED_OFFSET, Kind::Gauge, "The group's committed offset on every partition it consumes, owned or not (the log start where nothing is committed)."),
    (PARTITION_END_OFFSET, Kind::Gauge, "The high watermark of every partition the group consumes."),
    (GROUP_LAG, Kind::Gauge, "High watermark minus the group's committed offset on every partition the group consumes, owned or not: the lag kafka-consumer-groups reports (offsets, so transaction markers count)."),
    (DLQ_OLDEST_AGE, Kind::Gauge, "Age of the oldest dead letter not yet replayed (no entry in the replay ledger <dlq>.replayed; 0 when none)."),
    (DLQ_UNHANDLED, Kind::Gauge, "Dead letters not yet replayed (no entry in the replay ledger <dlq>.replayed): a count of records."),
    (OVERLAP_HELD, Kind::Counter, "Outputs held back until the batch whose commit was in flight had drained (--overlap-commits; 0 otherwise)."),
    (RULES_APPLIED, Kind::Counter, "Live alerts' rules records applied to the table, by kind (put, delete); a redo after an abort applies them again."),
    (RULES_INVALID, Kind::Counter, "Rules records that changed nothing because they were invalid (bad JSON or field, wrong partition); each is logged with its offset and reason."),
    (RULES_BARRIERS, Kind::Counter, "Barriers sent to the rules topic for ticks whose alerts in force were not known yet."),
    (RULES_HOLD_SECONDS, Kind::Histogram, "How long an input partition was paused for its next tick's rules (a barrier's round trip, or a rules partition held by an open transaction)."),
    (ONE_SHOTS_FIRED, Kind::Counter, "One-shot alerts that fired, each deleted in the same transaction, inside committed transactions."),
    (NOT_AUTHORISED, Kind::Counter, "Transactions aborted because a right was refused, by right (e.g. \"Write on Topic notifications\"); the input is redone once it is granted."),
];

/// Dead-letter classes, the values of the `class` label of [`DEAD_LETTERED`].
pub const DEAD_LETTER_CLASSES: &[&str] = crate::labels::CLASSES;

/// Registers every metric with its help text, at zero.
pub fn describe() {
    for entry in CATALOGUE {
        describe_entry(entry);
    }
    for name in [
        TICKS_COMMITTED,
        NOTIFICATIONS_COMMITTED,
        TICKS_STALE,
        TICKS_RETRIED,
        TRANSACTIONS_COMMITTED,
        TRANSACTIONS_ABORTED,
        PARTITIONS_RESTORED,
        FENCED,
        OVERLAP_HELD,
    ] {
        counter!(name).increment(0);
    }
    for class in DEAD_LETTER_CLASSES {
        counter!(DEAD_LETTERED, "class" => *class).increment(0);
    }
    counter!(TRANSIENT_FAILURES, "class" => crate::labels::INJECTED).increment(0);
    txn_calls_at_zero();
    for kind in ["assign", "revoke", "lost"] {
        counter!(REBALANCES, "kind" => kind).increment(0);
    }
    gauge!(DLQ_OLDEST_AGE).set(0.0);
    gauge!(DLQ_UNHANDLED).set(0.0);
    gauge!(RESTORE_HELD).set(0.0);
    // Registered without a sample: rendered with every bucket at zero.
    for name in [COMMIT_SECONDS, RESTORE_SECONDS] {
        let _ = histogram!(name);
    }
    for step in COMMIT_STEPS {
        let _ = histogram!(COMMIT_STEP_SECONDS, "step" => *step);
    }
}

/// Describes the named metrics of [`CATALOGUE`] only: for another binary that emits a few of them
/// through shared code (alert-deliver's transactional producer counts delivery failures and
/// fencing) and must not expose the processor's other series.
pub fn describe_only(names: &[&str]) {
    for entry in CATALOGUE.iter().filter(|(name, ..)| names.contains(name)) {
        describe_entry(entry);
    }
}

fn describe_entry(&(name, kind, help): &(&'static str, Kind, &'static str)) {
    match kind {
        Kind::Counter => describe_counter!(name, Unit::Count, help),
        Kind::Gauge => describe_gauge!(name, help),
        Kind::Histogram => describe_histogram!(name, Unit::Seconds, help),
    }
}

/// Histogram buckets of the `_seconds` metrics: from a fast commit (a few ms) to a transaction
/// timeout (tens of seconds).
pub const SECONDS_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A batch committed: its input, outputs and dead letters per class.
pub fn committed(
    dead_letters: &BTreeMap<&'static str, u64>,
    records: u64,
    notifications: u64,
    stale: u64,
    retried: u64,
    took: Duration,
) {
    counter!(TRANSACTIONS_COMMITTED).increment(1);
    counter!(TICKS_COMMITTED).increment(records);
    counter!(NOTIFICATIONS_COMMITTED).increment(notifications);
    counter!(TICKS_STALE).increment(stale);
    counter!(TICKS_RETRIED).increment(retried);
    for (class, n) in dead_letters {
        counter!(DEAD_LETTERED, "class" => *class).increment(*n);
    }
    histogram!(COMMIT_SECONDS).record(took.as_secs_f64());
}

/// Runs one step of a commit, `step` of [`COMMIT_STEPS`], and records its time if it succeeds.
pub fn commit_step<T, E>(step: &'static str, f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    let started = std::time::Instant::now();
    let done = f()?;
    histogram!(COMMIT_STEP_SECONDS, "step" => step).record(started.elapsed().as_secs_f64());
    Ok(done)
}

/// Rules records a join applied.
pub fn rules_applied(a: crate::rules::live::Applied) {
    if a.puts > 0 {
        counter!(RULES_APPLIED, "kind" => "put").increment(a.puts);
    }
    if a.deletes > 0 {
        counter!(RULES_APPLIED, "kind" => "delete").increment(a.deletes);
    }
    if a.invalid > 0 {
        counter!(RULES_INVALID).increment(a.invalid);
    }
}

/// One-shot alerts fired in a committed transaction.
pub fn one_shots_fired(n: u64) {
    counter!(ONE_SHOTS_FIRED).increment(n);
}

/// A barrier was sent to the rules topic.
pub fn barrier_sent() {
    counter!(RULES_BARRIERS).increment(1);
}

/// A partition held for its rules was resumed after `held`.
pub fn tick_hold_ended(held: Duration) {
    histogram!(RULES_HOLD_SECONDS).record(held.as_secs_f64());
}

/// An output was held back until the batch in flight drained (`--overlap-commits`).
pub fn overlap_held() {
    counter!(OVERLAP_HELD).increment(1);
}

/// A transaction aborted (or, at least once, a batch given up).
pub fn aborted() {
    counter!(TRANSACTIONS_ABORTED).increment(1);
}

/// Partitions whose state was restored from the changelog, and how long it took.
pub fn restored(partitions: usize, took: Duration) {
    counter!(PARTITIONS_RESTORED).increment(partitions as u64);
    histogram!(RESTORE_SECONDS).record(took.as_secs_f64());
}

/// `partitions` partitions' restores are held by an undecided transaction (0: none).
pub fn restore_held(partitions: usize) {
    gauge!(RESTORE_HELD).set(partitions as f64);
}

/// A restore read `records` changelog records.
pub fn restore_read(records: u64) {
    counter!(RESTORE_RECORDS).increment(records);
}

/// A processing attempt of a tick failed (it is retried, or dead-lettered when out of budget).
pub fn transient_failure(class: &'static str) {
    counter!(TRANSIENT_FAILURES, "class" => class).increment(1);
}

/// A rebalance event: `assign`, `revoke` or `lost`.
pub fn rebalance(kind: &'static str) {
    counter!(REBALANCES, "kind" => kind).increment(1);
}

/// Registers the stuck-call series of every transactional call at zero.
pub fn txn_calls_at_zero() {
    for call in TXN_CALLS {
        counter!(TXN_CALLS_STUCK, "call" => *call).increment(0);
    }
}

/// A transactional call passed its deadline.
pub fn transactional_call_stuck(call: &'static str) {
    counter!(TXN_CALLS_STUCK, "call" => call).increment(1);
}

/// This instance was fenced.
pub fn fenced() {
    counter!(FENCED).increment(1);
}

/// A transaction aborted because `right` was refused.
pub fn not_authorised(right: &str) {
    counter!(NOT_AUTHORISED, "right" => right.to_owned()).increment(1);
}

/// Registers the per-topic series of the topics a service writes, at zero, so an alert on them
/// (a DLQ that cannot be written) has a series from the start.
pub fn topics_written(topics: &[&str]) {
    for topic in topics {
        counter!(DELIVERY_FAILURES, "topic" => topic.to_string()).increment(0);
        counter!(NOT_AUTHORISED, "right" => format!("Write on Topic {topic}")).increment(0);
    }
}

/// A produced record could not be delivered to `topic`.
pub fn delivery_failed(topic: &str) {
    counter!(DELIVERY_FAILURES, "topic" => topic.to_owned()).increment(1);
}

/// The consumer's lag on `topic`/`partition`, from librdkafka's statistics.
pub fn consumer_lag(topic: &str, partition: i32, lag: i64) {
    gauge!(CONSUMER_LAG, "topic" => topic.to_owned(), "partition" => partition.to_string())
        .set(lag as f64);
}

/// The group's committed offset, the end and their difference (`lag`) on one partition, owned
/// or not ([`crate::kafka::group_lag`] reads them; plain numbers, so that this module, which every
/// other imports, imports none of them).
pub fn group_partition(
    group: &str,
    topic: &str,
    partition: i32,
    committed: i64,
    end: i64,
    lag: i64,
) {
    let labels = [
        ("group", group.to_owned()),
        ("topic", topic.to_owned()),
        ("partition", partition.to_string()),
    ];
    gauge!(GROUP_COMMITTED_OFFSET, &labels).set(committed as f64);
    gauge!(PARTITION_END_OFFSET, &labels).set(end as f64);
    gauge!(GROUP_LAG, &labels).set(lag as f64);
}

/// What the DLQ holds that has not been replayed yet: the oldest one's age and how many records.
pub fn dlq_unhandled(oldest_age: Duration, count: u64) {
    gauge!(DLQ_OLDEST_AGE).set(oldest_age.as_secs_f64());
    gauge!(DLQ_UNHANDLED).set(count as f64);
}

/// Sum of the samples of metric `name` on a Prometheus endpoint (0 while it does not answer):
/// how the benchmark and the tests read a running pipeline's counters. A `name` with labels
/// (`alerts_commit_seconds_bucket{le="0.1"}`) is that one series, written as the endpoint writes it.
pub fn scrape(addr: &str, name: &str) -> f64 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return 0.0;
    };
    if s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .is_err()
    {
        return 0.0;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    sum_of(&body, name)
}

/// Sum of the samples of `name` (a metric, or one series with its labels) in an exposition body.
fn sum_of(body: &str, name: &str) -> f64 {
    let with_labels = name.contains('{');
    body.lines()
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            if with_labels {
                *series == name
            } else {
                series.split('{').next() == Some(name)
            }
        })
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::sum_of;

    const BODY: &str = "# TYPE alerts_commit_seconds histogram
alerts_commit_seconds_bucket{le=\"0.05\"} 7
alerts_commit_seconds_bucket{le=\"0.1\"} 9
alerts_commit_seconds_bucket{le=\"+Inf\"} 10
alerts_commit_seconds_sum 1.25
alerts_commit_seconds_count 10
alerts_dead_lettered_total{class=\"poison\"} 2
alerts_dead_lettered_total{class=\"too_large\"} 3
";

    #[test]
    fn a_name_sums_every_series_of_the_metric_and_labels_pick_one() {
        assert_eq!(sum_of(BODY, "alerts_commit_seconds_count"), 10.0);
        assert_eq!(sum_of(BODY, "alerts_dead_lettered_total"), 5.0);
        assert_eq!(
            sum_of(BODY, "alerts_commit_seconds_bucket{le=\"0.1\"}"),
            9.0
        );
        assert_eq!(sum_of(BODY, "alerts_commit_seconds"), 0.0);
        assert_eq!(sum_of(BODY, "alerts_missing_total"), 0.0);
    }
}
