//! The hand-off: what a failed (notification, subscriber) becomes, and the one Kafka transaction
//! that moves a batch on.
//!
//! ```text
//!   begin ─► send each hand-off (next bucket | DLQ | parking lot) ─► drain ─► send_offsets(every
//!   consumed position of the batch, with the group metadata) ─► commit
//! ```
//! A hand-off and the offset past the record it came from commit together or not at all, so a
//! crash never loses a hand-off (the record is read again) nor doubles one (an aborted hand-off
//! is invisible to read_committed readers, the next bucket's consumer among them). What the
//! transactional errors mean is decided by [`crate::kafka::txn::classify`], the one
//! function for it: the caller rewinds its partitions after an abortable error and stops on a
//! fatal one.
//!
//! # The drain before the offsets
//! The hand-offs are acknowledged before `send_offsets_to_transaction`, so their partitions are
//! registered with the transaction (AddPartitionsToTxn answered) before its AddOffsetsToTxn can
//! fail. librdkafka 2.12 takes an AddPartitionsToTxn response that arrives once the transaction
//! has failed (state AbortableError) for outdated: it forgets the request
//! (`rd_kafka_txn_handle_AddPartitionsToTxn`: "Ignoring outdated AddPartitionsToTxn response",
//! and `txn_req_cnt--`), although the coordinator registered the partitions. When the
//! AddOffsetsToTxn sent beside it was refused first (Read on the group taken away), the count of
//! requests fell to 0 and the abort skipped EndTxn ("No partitions registered: not sending
//! EndTxn"): the transaction stayed open on its coordinator, which timed it out and fenced the
//! producer a transaction timeout later ("Completed rollback of ongoing transaction … due to
//! timeout" in the broker's log). The next EndTxn, or the first AddOffsetsToTxn once the group was
//! granted again, was refused as fenced and alert-deliver exited 1; the fence could not be taken
//! for the coordinator's timeout ([`crate::kafka::txn::Fence`]), since the transaction it timed
//! out had begun several hand-offs before the one refused. The drain costs nothing where a batch
//! hands nothing off, and the commit drains anyway.
//!
//! A hand-off record keeps the notification's key (its symbol: a bucket is partitioned as the
//! notifications are), value and headers (trace context), with the `retry.*` and `dlq.*` headers
//! written afresh: the retry state ([`RetryState`]) and the coordinates where the notification was
//! first read (`dlq.original.*`, carried from bucket to bucket). A DLQ or parking-lot record adds
//! the `dlq.*` headers of every dead letter ([`crate::dlq::Letter`]), so `dlq-replay` inspects and
//! replays it like any other.

use super::buckets::{Buckets, RetryState};
use crate::dlq::{copy_headers, Coordinates, Letter};
use crate::kafka::tpl::positions_list;
use crate::kafka::txn::{TxnCause, TxnError, TxnErrorClass, TxnProducer, DRAIN_TIMEOUT};
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::message::OwnedMessage;
use rdkafka::producer::BaseRecord;
use rdkafka::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};
use tracing::warn;

/// Where a (notification, subscriber) goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Retry bucket `i`.
    Bucket(usize),
    /// The DLQ, with its `dlq.error.class`.
    Dlq(&'static str),
    /// The parking lot (`delivery.gone`).
    ParkingLot,
}

/// Class of the parking lot's records.
pub const GONE: &str = "delivery.gone";

/// One hand-off of a batch.
#[derive(Debug, Clone)]
pub struct Handoff {
    /// Index of the consumed record in the batch.
    pub record: usize,
    /// The subscriber it is for (`-` when the record names none it can be tied to).
    pub subscriber: String,
    pub target: Target,
    /// The failure: a class and a short message, never the payload.
    pub error_class: String,
    pub error_message: String,
    /// The receiver's `Retry-After`.
    pub not_before: Option<Duration>,
    /// Whether a request was made: `retry.attempt` counts only requests, so a delivery skipped
    /// (circuit open) or deferred (no turn) does not use up attempts it never had. It does move
    /// on a stage: the retry window is the buckets' delays, tried or not.
    pub tried: bool,
    /// Whether it is an untried pass round the last bucket ([`Buckets::is_untried_pass`]): one
    /// more for `retry.untried.passes`, which decides when an untried delivery is given up.
    pub untried_pass: bool,
}

impl Handoff {
    /// The topic it goes to.
    pub fn topic(&self, buckets: &Buckets) -> String {
        match self.target {
            Target::Bucket(i) => buckets.bucket_topic(i),
            Target::Dlq(_) => buckets.dlq(),
            Target::ParkingLot => buckets.parking_lot(),
        }
    }

    /// The record's retry state after this failure (`prev`: what it carried).
    pub fn retry_state(
        &self,
        prev: Option<&RetryState>,
        buckets: &Buckets,
        now: SystemTime,
    ) -> RetryState {
        let next_due_at = match self.target {
            Target::Bucket(i) => buckets.due(i, now, self.not_before),
            _ => now,
        };
        RetryState {
            attempt: prev.map_or(0, |p| p.attempt) + u32::from(self.tried),
            first_failure_at: prev
                .map(|p| p.first_failure_at.clone())
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| super::buckets::format_time(now)),
            next_due_at,
            error_class: self.error_class.clone(),
            error_message: self.error_message.clone(),
            subscriber: self.subscriber.clone(),
            untried_passes: prev.map_or(0, |p| p.untried_passes) + u32::from(self.untried_pass),
        }
    }
}

/// TEST ONLY: faults injected into the hand-off transactions of the process (off by default).
#[derive(Debug, Default)]
pub struct TestHooks {
    /// Crash (abort the process) inside the open transaction after this many hand-off records.
    pub crash_after: Option<u64>,
    /// Hand-off records sent so far.
    pub sent: u64,
    /// Abort this hand-off transaction (1-based, counted over the process) instead of committing
    /// it, through the path an abortable commit error takes.
    pub abort_txn: Option<u64>,
    /// Hand-off transactions ended so far.
    pub txns: u64,
    /// While this file exists, abort every hand-off transaction the same way: an abortable error
    /// that comes back on every attempt.
    pub abort_while: Option<std::path::PathBuf>,
    /// While this file exists, hold right before each `send_offsets_to_transaction`
    /// ([`crate::kafka::hold`]).
    pub hold_send_offsets: Option<std::path::PathBuf>,
    /// Every abort of a hand-off transaction fails fatally without reaching the broker
    /// ([`TxnProducer::fail_next_abort`]).
    pub aborts_fail_fatally: bool,
    /// The process's stop flag: a held hand-off lets go when the process is asked to stop.
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl TestHooks {
    fn sent(&mut self, producer: &TxnProducer) {
        self.sent += 1;
        if self.crash_after == Some(self.sent) {
            // Records first into the log, so the crash lands inside an open transaction.
            let _ = producer.flush(Duration::from_secs(30));
            tracing::error!(
                sent = self.sent,
                "test hook: crashing inside an open hand-off transaction"
            );
            std::process::abort();
        }
    }

    /// Commits the open transaction, unless this is the one the hook aborts: then an abortable
    /// error, which [`commit`] handles as it handles a real one (abort, and the caller rewinds).
    fn commit(&mut self, producer: &TxnProducer) -> Result<(), TxnError> {
        self.txns += 1;
        let abort_while = self.abort_while.as_ref().is_some_and(|f| f.exists());
        if self.abort_txn == Some(self.txns) || abort_while {
            tracing::error!(
                txn = self.txns,
                "test hook: aborting a hand-off transaction"
            );
            return Err(TxnError::with_class(
                "commit_transaction",
                TxnErrorClass::Abortable,
                TxnCause::Injected("the test hook aborts this hand-off transaction"),
            ));
        }
        producer.commit()
    }
}

/// The consumed records of a batch and what happened to them; committed by [`commit`].
pub struct Batch<'a> {
    pub records: &'a [OwnedMessage],
    /// The retry state each record carried (`None`: a notification read for the first time).
    pub states: &'a [Option<RetryState>],
    pub handoffs: &'a [Handoff],
}

/// The next position to read of every partition in `records`.
pub fn positions(records: &[OwnedMessage]) -> BTreeMap<(String, i32), i64> {
    let mut next = BTreeMap::new();
    for m in records {
        let e = next
            .entry((m.topic().to_owned(), m.partition()))
            .or_insert(0);
        *e = (*e).max(m.offset() + 1);
    }
    next
}

/// Where to rewind to after an abort: the first offset of every partition in `records`.
pub fn rewind_positions(records: &[OwnedMessage]) -> BTreeMap<(String, i32), i64> {
    let mut first = BTreeMap::new();
    for m in records {
        let e = first
            .entry((m.topic().to_owned(), m.partition()))
            .or_insert(i64::MAX);
        *e = (*e).min(m.offset());
    }
    first
}

/// Bound on each metadata question that names a refused Write after a failed abort.
const REFUSAL_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A hand-off transaction that did not commit.
#[derive(Debug)]
pub struct Failed {
    /// Boxed: a `Result` of this stays small on the hot path.
    pub error: Box<TxnError>,
    /// The topics whose records were refused for lack of Write in it (named by its abort).
    pub refused: BTreeSet<String>,
}

impl From<TxnError> for Failed {
    fn from(error: TxnError) -> Self {
        Failed {
            error: Box::new(error),
            refused: BTreeSet::new(),
        }
    }
}

/// Writes the batch's hand-offs and moves its offsets, in one transaction. On an error the open
/// transaction is aborted when the producer still can, and the topics refused for lack of Write
/// are named ([`TxnProducer::abort_naming_refused`]: a revoked Write aborts and is retried, it
/// does not stop the deliverer); the caller rewinds (abortable) or stops.
pub fn commit(
    producer: &TxnProducer,
    group: ConsumerGroupMetadata,
    group_id: &str,
    buckets: &Buckets,
    batch: &Batch<'_>,
    hook: &mut TestHooks,
) -> Result<(), Failed> {
    producer.begin()?;
    let Err(error) = send_all(producer, group, group_id, buckets, batch, hook)
        .and_then(|()| hook.commit(producer))
    else {
        return Ok(());
    };
    if error.class != TxnErrorClass::Abortable {
        return Err(error.into());
    }
    let mut written = buckets.bucket_topics();
    written.extend([buckets.dlq(), buckets.parking_lot()]);
    if hook.aborts_fail_fatally {
        producer.fail_next_abort();
    }
    match producer.abort_naming_refused(&written, Some(&error), REFUSAL_PROBE_TIMEOUT) {
        Ok(refused) => Err(Failed {
            error: Box::new(error),
            refused,
        }),
        Err(abort) => {
            warn!(error = %abort, "abort after a failed hand-off failed");
            Err(abort.into())
        }
    }
}

fn send_all(
    producer: &TxnProducer,
    group: ConsumerGroupMetadata,
    group_id: &str,
    buckets: &Buckets,
    batch: &Batch<'_>,
    hook: &mut TestHooks,
) -> Result<(), TxnError> {
    let now = SystemTime::now();
    for h in batch.handoffs {
        let m = &batch.records[h.record];
        let prev = batch.states[h.record].as_ref();
        let state = h.retry_state(prev, buckets, now);
        let headers = copy_headers(m, |k| !k.starts_with("retry.") && !k.starts_with("dlq."));
        let headers = state.append(headers);
        let origin = Coordinates::original(m);
        let headers = match h.target {
            Target::Bucket(_) => origin.append(headers),
            Target::Dlq(class) => letter(group_id, class, &state).headers(headers, &origin),
            Target::ParkingLot => letter(group_id, GONE, &state).headers(headers, &origin),
        };
        let topic = h.topic(buckets);
        let mut record = BaseRecord::to(&topic).headers(headers);
        if let Some(k) = m.key() {
            record = record.key(k);
        }
        if let Some(v) = m.payload() {
            record = record.payload(v);
        }
        producer
            .send(record)
            .map_err(|e| TxnError::new("send hand-off", e))?;
        hook.sent(producer);
    }
    let offsets =
        positions_list(&positions(batch.records)).map_err(|e| TxnError::new("offsets", e))?;
    // Every AddPartitionsToTxn answered before the offsets go (module doc, `# The drain before
    // the offsets`). A drain that does not finish changes nothing: the commit drains again.
    if !batch.handoffs.is_empty() {
        let _ = producer.flush(DRAIN_TIMEOUT);
    }
    crate::kafka::hold::hold_before(
        hook.hold_send_offsets.as_deref(),
        "send_offsets_to_transaction",
        Some(&hook.stop),
        || {
            let _ = producer.flush(Duration::from_secs(30));
        },
    );
    producer.send_offsets(&offsets, group)
}

fn letter<'a>(group: &'a str, class: &'a str, state: &'a RetryState) -> Letter<'a> {
    Letter {
        group,
        class,
        message: &state.error_message,
        attempts: state.attempt,
    }
}
