//! alert-deliver's metrics, in one place, so the log lines and the counters never drift apart.
//!
//! Outcomes and hand-offs are counted once their transaction has committed, so a batch redone
//! after an abort is counted once; attempts (per subscriber, by outcome) are counted when they
//! happen, since every HTTP call really happened (a call the batch stopped waiting for counts when
//! it ends), as are the skips of an open circuit and the retry records whose due time was
//! clamped (when first read, [`due_clamped`]). The attempts' ratio is the failure rate,
//! `rate(alerts_deliver_attempts_total{outcome!="delivered"}[5m]) / rate(alerts_deliver_attempts_total[5m])`.

use super::subscriptions::Subscriptions;
use metrics::{counter, gauge, histogram};
use std::time::{Duration, SystemTime};
use tracing::warn;

pub const ATTEMPTS: &str = "alerts_deliver_attempts_total";
pub const OUTCOMES: &str = "alerts_deliver_outcomes_total";
pub const HANDOFFS: &str = "alerts_deliver_handoffs_total";
pub const BUCKET_LAG: &str = "alerts_deliver_bucket_lag";
pub const BUCKET_OLDEST_AGE: &str = "alerts_deliver_bucket_oldest_age_seconds";
pub const BACKLOG: &str = "alerts_deliver_backlog";
pub const BACKLOG_OLDEST_AGE: &str = "alerts_deliver_backlog_oldest_age_seconds";
pub const LATENCY: &str = "alerts_deliver_latency_seconds";
pub const TRANSACTIONS: &str = "alerts_deliver_transactions_total";
pub const CIRCUIT_STATE: &str = "alerts_deliver_circuit_state";
pub const CIRCUIT_SKIPPED: &str = "alerts_deliver_circuit_skipped_total";
pub const DUE_CLAMPED: &str = "alerts_deliver_due_clamped_total";

/// Every metric alert-deliver exports of its own (it also exports a few of
/// [`crate::metrics::CATALOGUE`]: see [`describe`]).
pub const CATALOGUE: &[&str] = &[
    ATTEMPTS,
    OUTCOMES,
    HANDOFFS,
    BUCKET_LAG,
    BUCKET_OLDEST_AGE,
    BACKLOG,
    BACKLOG_OLDEST_AGE,
    LATENCY,
    TRANSACTIONS,
    CIRCUIT_STATE,
    CIRCUIT_SKIPPED,
    DUE_CLAMPED,
];

/// Every outcome label.
const OUTCOME_LABELS: &[&str] = &["delivered", "transient", "permanent", "gone"];

/// Registers the labelled series at zero, so a dashboard sees them from the first scrape.
pub fn describe(subs: &Subscriptions, buckets: &[String], ends: &[String]) {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        ATTEMPTS,
        Unit::Count,
        "HTTP delivery attempts, by subscriber and outcome (failure rate per subscriber)."
    );
    describe_counter!(
        OUTCOMES,
        Unit::Count,
        "Deliveries by outcome class, inside committed transactions."
    );
    describe_counter!(
        HANDOFFS,
        Unit::Count,
        "(notification, subscriber) hand-offs committed, by target topic."
    );
    describe_gauge!(BUCKET_LAG, "Records between the deliverer's position and the end of a retry bucket (owned partitions).");
    describe_gauge!(
        BUCKET_OLDEST_AGE,
        "Age of the oldest record waiting in a retry bucket (owned partitions)."
    );
    describe_gauge!(
        BACKLOG,
        "Records of the DLQ or parking lot not yet replayed (no entry in <topic>.replayed)."
    );
    describe_gauge!(
        BACKLOG_OLDEST_AGE,
        "Age of the oldest record of the DLQ or parking lot not yet replayed."
    );
    describe_histogram!(
        LATENCY,
        Unit::Seconds,
        "From a notification's record timestamp to its successful delivery."
    );
    describe_counter!(
        TRANSACTIONS,
        Unit::Count,
        "Hand-off transactions, by result (committed, aborted)."
    );
    describe_gauge!(CIRCUIT_STATE, "A subscriber's circuit breaker: 0 closed, 1 open (deliveries skipped), 2 half-open (one probe).");
    describe_counter!(CIRCUIT_SKIPPED, Unit::Count, "Deliveries not tried because the subscriber's circuit was open (handed to the next bucket).");
    describe_counter!(DUE_CLAMPED, Unit::Count, "Retry records whose retry.next.due.at lay beyond their timestamp plus the last bucket's delay (an edited record, or a due time and a timestamp from different clocks): due at that bound instead. Counted once per record and owner.");
    for s in subs.iter() {
        for outcome in OUTCOME_LABELS {
            counter!(ATTEMPTS, "subscriber" => s.name.clone(), "outcome" => *outcome).increment(0);
        }
        circuit(&s.name, 0.0);
        counter!(CIRCUIT_SKIPPED, "subscriber" => s.name.clone()).increment(0);
    }
    for outcome in OUTCOME_LABELS {
        counter!(OUTCOMES, "outcome" => *outcome).increment(0);
    }
    for topic in buckets.iter().chain(ends) {
        counter!(HANDOFFS, "topic" => topic.clone()).increment(0);
    }
    for topic in buckets {
        counter!(DUE_CLAMPED, "topic" => topic.clone()).increment(0);
        gauge!(BUCKET_LAG, "topic" => topic.clone()).set(0.0);
        gauge!(BUCKET_OLDEST_AGE, "topic" => topic.clone()).set(0.0);
    }
    for topic in ends {
        backlog(topic, Duration::ZERO, 0);
    }
    for result in ["committed", "aborted"] {
        counter!(TRANSACTIONS, "result" => result).increment(0);
    }
    // The shared transactional producer's two (the alert rules watch them for every binary).
    crate::metrics::describe_only(&[
        crate::metrics::FENCED,
        crate::metrics::DELIVERY_FAILURES,
        crate::metrics::TXN_CALLS_STUCK,
        crate::metrics::GROUP_COMMITTED_OFFSET,
        crate::metrics::PARTITION_END_OFFSET,
        crate::metrics::GROUP_LAG,
    ]);
    crate::metrics::txn_calls_at_zero();
    counter!(crate::metrics::FENCED).increment(0);
}

/// One HTTP attempt's outcome.
pub fn attempt(subscriber: &str, outcome: &'static str) {
    counter!(ATTEMPTS, "subscriber" => subscriber.to_owned(), "outcome" => outcome).increment(1);
}

/// A subscriber's breaker state ([`super::breaker::State::gauge`]).
pub fn circuit(subscriber: &str, state: f64) {
    gauge!(CIRCUIT_STATE, "subscriber" => subscriber.to_owned()).set(state);
}

/// A delivery not tried because its subscriber's circuit was open.
pub fn circuit_skipped(subscriber: &str) {
    counter!(CIRCUIT_SKIPPED, "subscriber" => subscriber.to_owned()).increment(1);
}

/// A retry record's due time lay beyond its bound ([`super::buckets::Buckets::due_of`]): it is
/// due at the bound instead. Logged and counted here, once per record and owner (the caller
/// asks [`super::partitions::Partitions::clamp_is_news`]); never the payload.
pub fn due_clamped(topic: &str, partition: i32, offset: i64, header: &str, bound: SystemTime) {
    warn!(
        topic,
        partition,
        offset,
        header,
        bound = %super::buckets::format_time(bound),
        "retry due time beyond its bound (record timestamp + the last bucket's delay): due at the bound instead"
    );
    counter!(DUE_CLAMPED, "topic" => topic.to_owned()).increment(1);
}

/// A delivery succeeded `latency` after its notification was written.
pub fn delivered(latency: Duration) {
    histogram!(LATENCY).record(latency.as_secs_f64());
}

/// A batch's transaction committed: its outcomes and hand-offs.
pub fn committed(outcomes: &[(&'static str, u64)], handoffs: &[(String, u64)]) {
    counter!(TRANSACTIONS, "result" => "committed").increment(1);
    for (outcome, n) in outcomes {
        counter!(OUTCOMES, "outcome" => *outcome).increment(*n);
    }
    for (topic, n) in handoffs {
        counter!(HANDOFFS, "topic" => topic.clone()).increment(*n);
    }
}

/// A batch's transaction aborted (its records are read and delivered again).
pub fn aborted() {
    counter!(TRANSACTIONS, "result" => "aborted").increment(1);
}

/// A retry bucket's lag and the age of its oldest waiting record.
pub fn bucket(topic: &str, lag: i64, oldest: Duration) {
    gauge!(BUCKET_LAG, "topic" => topic.to_owned()).set(lag as f64);
    gauge!(BUCKET_OLDEST_AGE, "topic" => topic.to_owned()).set(oldest.as_secs_f64());
}

/// The DLQ's or parking lot's unreplayed records (the backlog watcher reports through this).
pub fn backlog(topic: &str, oldest: Duration, count: u64) {
    gauge!(BACKLOG, "topic" => topic.to_owned()).set(count as f64);
    gauge!(BACKLOG_OLDEST_AGE, "topic" => topic.to_owned()).set(oldest.as_secs_f64());
}
