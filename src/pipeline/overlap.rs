//! The overlap mode (`EngineSettings::overlap_commits`): a batch's commit leaves the critical
//! path. Its drain (waiting for every record to be acknowledged) and `commit_transaction` run on
//! a thread of their own while the next batch is processed in a transaction of a second
//! producer; the two producers take turns.
//!
//! ```text
//!  engine thread   … batch n on X ─┐ wait for n-1 ─ stage n (changelog, send_offsets + group
//!                                  │ metadata) ─ hand off ─► batch n+1 on Y … ─┐ wait for n ─ …
//!  commit thread                   └──────────────────────► drain X, commit_transaction(X)
//!  n+1's records: a key n wrote ─► held (in order) until n's outcome is known, then sent
//!                 any other key  ─► sent at once
//! ```
//!
//! # Why this keeps exactly-once
//! - **At most one commit in flight, and commits in batch order.** Batch n+1 is staged (its
//!   changelog records and `send_offsets_to_transaction`) only after n's `commit_transaction`
//!   returned. So n+1's offsets reach the group coordinator after n's, and n+1 can commit only
//!   if n did. (The coordinator materialises pending transactional offsets in the order their
//!   records were appended, whichever transaction's markers land first, so n+1's offsets are
//!   never overwritten by n's.)
//! - **One outcome for both batches on failure.** If n fails, n+1 (which already saw n's effects
//!   in memory) is aborted too, and the engine rewinds to the committed offsets and restores
//!   the committed state, exactly as after any abort. An abort for any other reason first waits
//!   for n, so it rewinds to offsets that include n if it committed.
//! - **A crash aborts both.** Both transactional ids are registered at start, so a restarted
//!   instance fences both and aborts whatever either left open (a commit whose EndTxn was sent
//!   completes instead); its stable offset fetch then sees n committed or not, never half.
//! - **Zombies.** Fencing across generations is the group metadata in `send_offsets` (KIP-447),
//!   fresh at every staging; a revoke waits for the commit in flight and commits (or, if the
//!   assignment was lost, aborts) the open batch before the partitions go.
//! - **Per-key order.** Two producers give no order between them. A record of n+1 whose
//!   (topic, key) n wrote waits in `OpenTxn::held`, and every later one of that key with it,
//!   until n's commit is known: n's records are all acknowledged then, so n+1's land at higher
//!   offsets. Changelog records need no hold: n+1 writes them only at its staging, after n.
//! - **Counting.** A batch is counted (stats, metrics) when its commit is known to have
//!   succeeded (reaped without waiting in `poll_once`, or waited for), once.
//!
//! # Error handling
//! The commit thread returns the producer's classified error ([`super::producer::classify`]).
//! Abortable: the failed transaction is aborted on its producer, then the open batch, then the
//! rewind. Fatal (fenced, either producer): the engine stops as in the other mode.

use super::commit::{Committer, Session};
use super::producer::{TxnCause, TxnError, TxnErrorClass, TxnProducer};
use super::settings::HoldPoint;
use crate::metrics as m;
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::BaseRecord;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Bound on the test hook's drain and on its wait for held records.
const HOOK_WAIT: Duration = Duration::from_secs(30);

/// The identity whose order the hold keeps: topic and key (a record without a key is keyed by
/// `None`, conservatively).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct OutKey {
    topic: String,
    key: Option<Vec<u8>>,
}

impl OutKey {
    fn of(record: &BaseRecord<'_, [u8], [u8]>) -> Self {
        OutKey {
            topic: record.topic.to_owned(),
            key: record.key.map(<[u8]>::to_vec),
        }
    }
}

/// An output record held back: an owned copy of what `send` would have taken.
#[derive(Debug)]
pub(super) struct HeldRecord {
    topic: String,
    partition: Option<i32>,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    timestamp: Option<i64>,
    headers: Option<OwnedHeaders>,
}

impl HeldRecord {
    fn of(record: BaseRecord<'_, [u8], [u8]>) -> Self {
        HeldRecord {
            topic: record.topic.to_owned(),
            partition: record.partition,
            key: record.key.map(<[u8]>::to_vec),
            payload: record.payload.map(<[u8]>::to_vec),
            timestamp: record.timestamp,
            headers: record.headers,
        }
    }

    fn record(&mut self) -> BaseRecord<'_, [u8], [u8]> {
        BaseRecord {
            topic: &self.topic,
            partition: self.partition,
            payload: self.payload.as_deref(),
            key: self.key.as_deref(),
            timestamp: self.timestamp,
            headers: self.headers.take(),
            delivery_opaque: (),
        }
    }
}

/// A batch whose drain and `commit_transaction` run on the commit thread.
pub(super) struct InFlight {
    handle: JoinHandle<Result<(), TxnError>>,
    /// The producer it commits on.
    producer: usize,
    /// Its output keys: the open batch holds records of these back.
    pub(super) written: Arc<HashSet<OutKey>>,
    /// Its counts and offsets, counted once its commit is known.
    batch: super::commit::OpenTxn,
    /// When it was handed off (the commit time metric).
    started: Instant,
}

impl Committer {
    /// Enqueues one output record of the open batch on its producer. In the overlap mode a record
    /// whose key the commit in flight wrote is held back instead (see the module docs).
    pub fn emit(
        &self,
        txn: &mut super::commit::OpenTxn,
        record: BaseRecord<'_, [u8], [u8]>,
    ) -> Result<(), KafkaError> {
        if !self.settings.overlapped() {
            return self.producers[txn.producer].send(record);
        }
        let key = OutKey::of(&record);
        if txn.blocked.contains(&key) {
            txn.held.push(HeldRecord::of(record));
            self.held_now.fetch_add(1, Ordering::Relaxed);
            m::held_back();
        } else {
            self.producers[txn.producer].send(record)?;
        }
        txn.written.insert(key);
        Ok(())
    }

    /// Overlap mode: ends the open batch without waiting for its commit. Waits for the commit in
    /// flight, if any (at most one); then stages this batch and hands its drain and commit to the
    /// commit thread; the next batch begins on the other producer. An abortable failure aborts
    /// and rewinds `rewind`, and is not an error. Returns whether the batch was handed off.
    pub fn hand_off<C: ConsumerContext>(
        &self,
        session: &mut Session,
        consumer: &BaseConsumer<C>,
        rewind: &[i32],
    ) -> Result<bool, TxnError> {
        let handed = self
            .settle(session, consumer, rewind, true)
            .and_then(|clear| match clear {
                true => self.stage_and_spawn(session, consumer),
                false => Ok(false),
            });
        match handed {
            Err(e) if e.class == TxnErrorClass::Abortable => {
                warn!(error = %e, "commit failed; aborting and rewinding");
                self.abort_and_rewind(session, consumer, rewind)?;
                Ok(false)
            }
            other => other,
        }
    }

    /// Learns the outcome of the commit in flight if it has finished, without waiting (see
    /// [`Committer::settle`]). Returns false if the engine rewound.
    pub fn reap<C: ConsumerContext>(
        &self,
        session: &mut Session,
        consumer: &BaseConsumer<C>,
        rewind: &[i32],
    ) -> Result<bool, TxnError> {
        match self.settle(session, consumer, rewind, false) {
            Err(e) if e.class == TxnErrorClass::Abortable => {
                warn!(error = %e, "abortable transactional error; aborting and rewinding");
                self.abort_and_rewind(session, consumer, rewind)?;
                Ok(false)
            }
            other => other,
        }
    }

    /// Settles the commit in flight if it has finished (or, with `wait`, once it has): a commit
    /// is counted and the open batch's held records are sent, in order; a failure aborts the open
    /// batch too and rewinds `rewind`. Returns whether the open batch goes on (false: rewound).
    /// Nothing in flight (always so outside the overlap mode): true at once.
    pub(super) fn settle<C: ConsumerContext>(
        &self,
        session: &mut Session,
        consumer: &BaseConsumer<C>,
        rewind: &[i32],
        wait: bool,
    ) -> Result<bool, TxnError> {
        match &session.in_flight {
            None => return Ok(true),
            Some(f) if !wait && !f.handle.is_finished() => return Ok(true),
            Some(_) => {}
        }
        if self.finish_in_flight(session)? == Some(false) {
            self.abort_and_rewind(session, consumer, rewind)?;
            return Ok(false);
        }
        self.release(session)?;
        Ok(true)
    }

    /// Waits for the commit in flight, if any, and records its outcome: a commit is counted; an
    /// abortable failure aborts that producer's transaction (counted as an abort). Returns
    /// whether it committed (`None`: nothing was in flight); a fatal error is returned.
    pub(super) fn finish_in_flight(&self, session: &mut Session) -> Result<Option<bool>, TxnError> {
        let Some(f) = session.in_flight.take() else {
            return Ok(None);
        };
        let outcome = f.handle.join().unwrap_or_else(|_| {
            Err(TxnError::with_class(
                "commit thread",
                TxnErrorClass::Fatal,
                TxnCause::CommitThread("it panicked".to_owned()),
            ))
        });
        match outcome {
            Ok(()) => {
                self.count_commit(session, &f.batch, f.started);
                Ok(Some(true))
            }
            Err(e) if e.class == TxnErrorClass::Abortable => {
                warn!(error = %e, records = f.batch.records, "overlapped commit failed; aborting it and the batch after it");
                let refused = self.abort_open(f.producer)?;
                session.stats.aborts += 1;
                m::aborted();
                if !refused.is_empty() {
                    self.report_refused(session, &refused);
                }
                Ok(Some(false))
            }
            Err(e) => Err(e),
        }
    }

    /// The commit the open batch waited on is known: its held records go out, in the order
    /// they were produced, before anything else of their keys.
    fn release(&self, session: &mut Session) -> Result<(), TxnError> {
        let Some(txn) = session.txn.as_mut() else {
            return Ok(());
        };
        txn.blocked = Arc::default();
        if txn.held.is_empty() {
            return Ok(());
        }
        let producer = &self.producers[txn.producer];
        let held = std::mem::take(&mut txn.held);
        self.held_now.store(0, Ordering::Relaxed);
        let released = held.len();
        for mut h in held {
            producer
                .send(h.record())
                .map_err(|e| TxnError::new("produce held record", e))?;
        }
        debug!(records = released, "held records released");
        if let Some((n, HoldPoint::Released)) = self.settings.hooks.hold_overlapped {
            if session.handoffs >= n {
                // Released records into the log first, so the kill finds them there, uncommitted.
                let _ = producer.flush(HOOK_WAIT);
                hold_here(HoldPoint::Released, session.handoffs, || released as u64);
            }
        }
        Ok(())
    }

    /// Stages the open batch (nothing is in flight now) and starts its commit on the commit
    /// thread; the next batch will begin on the other producer.
    fn stage_and_spawn<C: ConsumerContext>(
        &self,
        session: &mut Session,
        consumer: &BaseConsumer<C>,
    ) -> Result<bool, TxnError> {
        if session.txn.is_none() {
            return Ok(false);
        }
        self.stage(session, consumer)?;
        self.maybe_crash(session);
        let Some(mut batch) = session.txn.take() else {
            return Ok(false);
        };
        session.handoffs += 1;
        let producer = Arc::clone(&self.producers[batch.producer]);
        let hold = match self.settings.hooks.hold_overlapped {
            Some((n, point)) if n == session.handoffs => Some(point),
            _ => None,
        };
        let (held_now, handoff) = (Arc::clone(&self.held_now), session.handoffs);
        let handle = std::thread::Builder::new()
            .name("txn-commit".to_owned())
            .spawn(move || commit_in_background(&producer, hold, handoff, &held_now))
            .map_err(|e| {
                TxnError::with_class(
                    "commit thread",
                    TxnErrorClass::Fatal,
                    TxnCause::CommitThread(e.to_string()),
                )
            })?;
        session.current = (batch.producer + 1) % self.producers.len();
        let written = Arc::new(std::mem::take(&mut batch.written));
        session.in_flight = Some(InFlight {
            handle,
            producer: batch.producer,
            written,
            batch,
            started: Instant::now(),
        });
        Ok(true)
    }
}

/// The commit thread's work: drain and `commit_transaction` ([`TxnProducer::commit`]), with the
/// test hook's hold points around `commit_transaction`. For the `Released` point the thread only
/// waits (bounded) until the next batch holds records back, so that its reap has some to release.
fn commit_in_background(
    producer: &TxnProducer,
    hold: Option<HoldPoint>,
    handoff: u64,
    held_now: &AtomicU64,
) -> Result<(), TxnError> {
    let held = || held_now.load(Ordering::Relaxed);
    if hold == Some(HoldPoint::Drained) {
        // The drain that commit() does first, done here so the hold lands between it and EndTxn.
        let _ = producer.flush(HOOK_WAIT);
        hold_here(HoldPoint::Drained, handoff, held);
    }
    let committed = producer.commit();
    match hold {
        Some(HoldPoint::Committed) if committed.is_ok() => {
            hold_here(HoldPoint::Committed, handoff, held)
        }
        Some(HoldPoint::Released) => {
            wait_for_held(&held);
        }
        _ => {}
    }
    committed
}

/// TEST HOOK: waits (bounded) until the open batch holds records back, says so, and stays here
/// until the test kills the process.
fn hold_here(point: HoldPoint, handoff: u64, held: impl Fn() -> u64) {
    wait_for_held(&held);
    warn!(handoff, point = ?point, held = held(), "test hook: overlapped commit held; waiting to be killed");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// TEST HOOK: waits until `held()` is not zero, at most [`HOOK_WAIT`].
fn wait_for_held(held: &impl Fn() -> u64) {
    let until = Instant::now() + HOOK_WAIT;
    while held() == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_record_goes_out_as_it_came_in() {
        let headers = OwnedHeaders::new().insert(rdkafka::message::Header {
            key: "traceparent",
            value: Some("00-abc"),
        });
        let record = BaseRecord::<[u8], [u8]>::to("notifications")
            .key(b"BBCA".as_slice())
            .payload(b"{}".as_slice())
            .headers(headers);
        let key = OutKey::of(&record);
        let mut held = HeldRecord::of(record);
        let again = held.record();
        assert_eq!(again.topic, "notifications");
        assert_eq!(again.key, Some(b"BBCA".as_slice()));
        assert_eq!(again.payload, Some(b"{}".as_slice()));
        assert_eq!(again.partition, None);
        assert_eq!(
            again.headers.as_ref().map(rdkafka::message::Headers::count),
            Some(1)
        );
        assert_eq!(OutKey::of(&again), key);
    }

    #[test]
    fn the_same_key_on_another_topic_is_another_key() {
        let a = BaseRecord::<[u8], [u8]>::to("notifications").key(b"K".as_slice());
        let b = BaseRecord::<[u8], [u8]>::to("market-updates.dlq").key(b"K".as_slice());
        let none = BaseRecord::<[u8], [u8]>::to("notifications");
        assert_ne!(OutKey::of(&a), OutKey::of(&b));
        assert_ne!(OutKey::of(&a), OutKey::of(&none));
    }
}
