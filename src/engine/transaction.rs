//! The transaction of the engine: staging, commit, abort with rewind, and the rebalance
//! callbacks that close the open transaction before partitions go.
//!
//! Both the processing loop and the rebalance callback (which runs inside `poll`, on the same
//! thread) come here with the engine's state locked, so there is one path for each outcome:
//! commit (state, offsets with group metadata, commit), or abort (flush, abort, rewind the input to
//! the committed offsets, drop the in-memory state so it is restored from the changelog).

use super::{Guarantee, Inner, OpenTxn, Shared, REWIND_TIMEOUT};
use crate::metrics as m;
use crate::txn::{TxnError, TxnErrorClass};
use anyhow::anyhow;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::BaseRecord;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

/// The consumer's context: the rebalance callbacks.
pub struct RebalanceHandler {
    shared: Arc<Shared>,
}

impl RebalanceHandler {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        RebalanceHandler { shared }
    }
}

impl ClientContext for RebalanceHandler {}

impl ConsumerContext for RebalanceHandler {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else { return };
        let shared = &self.shared;
        let revoked: Vec<i32> = partitions_of(tpl, &shared.settings.topics.input);
        let mut inner = match shared.lock() {
            Ok(g) => g,
            Err(e) => return error!(error = %e, "state lock poisoned in rebalance"),
        };
        let lost = consumer.assignment_lost();
        info!(partitions = ?revoked, lost, open_txn = inner.txn.is_some(), "partitions revoked");
        if inner.txn.is_some() {
            let remaining: Vec<i32> = inner.state.owned().filter(|p| !revoked.contains(p)).collect();
            let result = if lost {
                // Another member may own these partitions already: our outputs must not commit.
                shared.abort_and_rewind(&mut inner, consumer, &remaining)
            } else {
                match shared.commit_open(&mut inner, consumer) {
                    Err(e) if e.class == TxnErrorClass::Abortable => {
                        warn!(error = %e, "commit on revoke failed; aborting");
                        shared.abort_and_rewind(&mut inner, consumer, &remaining)
                    }
                    other => other,
                }
            };
            if let Err(e) = result {
                error!(error = %e, "transaction could not be closed on revoke");
                inner.fatal.get_or_insert(e);
            }
        }
        for p in revoked {
            inner.state.revoke(p);
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let assigned = partitions_of(tpl, &self.shared.settings.topics.input);
                info!(partitions = ?assigned, "partitions assigned");
                if let Ok(mut inner) = self.shared.lock() {
                    for p in assigned {
                        inner.state.assign(p);
                    }
                }
            }
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
            Rebalance::Revoke(_) => {}
        }
    }
}

fn partitions_of(tpl: &TopicPartitionList, topic: &str) -> Vec<i32> {
    tpl.elements().iter().filter(|e| e.topic() == topic).map(|e| e.partition()).collect()
}

impl Shared {
    pub(super) fn lock(&self) -> anyhow::Result<MutexGuard<'_, Inner>> {
        // A poisoned lock means a panic while the state was half-updated: nothing can be trusted.
        self.inner.lock().map_err(|_| anyhow!("engine state lock poisoned by an earlier panic"))
    }

    /// Writes the batch's changed states to the changelog and adds its offsets (with fresh group
    /// metadata) to the open transaction. Idempotent per transaction.
    pub(super) fn stage(&self, inner: &mut Inner, consumer: &BaseConsumer<RebalanceHandler>) -> Result<(), TxnError> {
        let Inner { txn, state, .. } = inner;
        let Some(txn) = txn.as_mut() else { return Ok(()) };
        if txn.staged {
            return Ok(());
        }
        let topics = &self.settings.topics;
        for (&p, symbols) in &txn.dirty {
            let Some(states) = state.get(p) else { continue };
            for symbol in symbols {
                let Some(s) = states.get(symbol) else { continue };
                let value = serde_json::to_vec(s).unwrap_or_default();
                let record = BaseRecord::to(&topics.changelog)
                    .partition(p)
                    .key(symbol.as_bytes())
                    .payload(value.as_slice());
                self.producer.send(record).map_err(|e| TxnError::new("produce state", e))?;
            }
        }
        if self.settings.guarantee == Guarantee::ExactlyOnce {
            // Present for every consumer with a group.id, which this one always has.
            let group = consumer.group_metadata().ok_or_else(|| TxnError {
                step: "group_metadata",
                class: TxnErrorClass::Fatal,
                source: KafkaError::Global(RDKafkaErrorCode::InvalidGroupId),
            })?;
            self.producer.send_offsets(&self.offsets_of(txn)?, &group)?;
        }
        txn.staged = true;
        Ok(())
    }

    /// At least once: waits until everything produced is acknowledged, and fails (abortable: the
    /// batch is redone) if any record could not be delivered.
    pub(super) fn flush_acknowledged(&self) -> Result<(), TxnError> {
        let failures = self.producer.delivery_failures();
        self.producer
            .flush(self.settings.transaction_timeout)
            .map_err(|e| TxnError { step: "flush", class: TxnErrorClass::Abortable, source: e })?;
        if self.producer.delivery_failures() > failures {
            return Err(TxnError {
                step: "delivery",
                class: TxnErrorClass::Abortable,
                source: KafkaError::MessageProduction(RDKafkaErrorCode::Fail),
            });
        }
        Ok(())
    }

    pub(super) fn offsets_of(&self, txn: &OpenTxn) -> Result<TopicPartitionList, TxnError> {
        let mut tpl = TopicPartitionList::new();
        for (&p, &next) in &txn.offsets {
            tpl.add_partition_offset(&self.settings.topics.input, p, Offset::Offset(next))
                .map_err(|e| TxnError::new("offsets", e))?;
        }
        Ok(tpl)
    }

    /// Exits the process abruptly if the test switch says this commit is the one to crash at.
    pub(super) fn maybe_crash(&self, inner: &Inner) {
        if self.settings.crash_before_commit == Some(inner.stats.commits + 1) {
            // Outputs first into the log, so the crash lands between produce and commit.
            let _ = self.producer.flush(Duration::from_secs(30));
            error!(commit = inner.stats.commits + 1, "test switch: crashing before this commit");
            std::process::abort();
        }
    }

    /// Commits the open transaction, if any: dirty states, then offsets, then commit.
    pub(super) fn commit_open(&self, inner: &mut Inner, consumer: &BaseConsumer<RebalanceHandler>) -> Result<(), TxnError> {
        if inner.txn.is_none() {
            return Ok(());
        }
        let started = Instant::now();
        match self.settings.guarantee {
            Guarantee::ExactlyOnce => {
                self.stage(inner, consumer)?;
                self.maybe_crash(inner);
                self.producer.commit()?;
            }
            Guarantee::AtLeastOnce => {
                // Outputs acknowledged first; state and offsets second. A crash in between repeats
                // the batch's notifications after the restart: that is at-least-once.
                self.flush_acknowledged()?;
                self.maybe_crash(inner);
                self.stage(inner, consumer)?;
                self.flush_acknowledged()?;
                let tpl = inner.txn.as_ref().map(|t| self.offsets_of(t)).transpose()?.unwrap_or_default();
                consumer.commit(&tpl, CommitMode::Sync).map_err(|e| TxnError {
                    step: "commit offsets",
                    class: TxnErrorClass::Abortable,
                    source: e,
                })?;
            }
        }
        let Some(txn) = inner.txn.take() else { return Ok(()) };
        let s = &mut inner.stats;
        s.commits += 1;
        s.committed_records += txn.records;
        s.committed_notifications += txn.notifications;
        s.committed_dead_letters += txn.dead_letters.values().sum::<u64>();
        s.committed_retried += txn.retried;
        s.committed_stale += txn.stale;
        s.committed_unwatched += txn.unwatched;
        m::committed(&txn.dead_letters, txn.records, txn.notifications, txn.stale, txn.retried, started.elapsed());
        debug!(
            records = txn.records,
            notifications = txn.notifications,
            commit_ms = started.elapsed().as_millis() as u64,
            offsets = ?txn.offsets,
            "transaction committed"
        );
        Ok(())
    }

    /// Aborts the open transaction and rewinds `partitions` (input position and state) to the
    /// last commit.
    pub(super) fn abort_and_rewind(
        &self,
        inner: &mut Inner,
        consumer: &BaseConsumer<RebalanceHandler>,
        partitions: &[i32],
    ) -> Result<(), TxnError> {
        if self.settings.guarantee == Guarantee::AtLeastOnce {
            // No transaction to abort: what was produced stays; the redo may repeat it.
            if inner.txn.take().is_some() {
                inner.stats.aborts += 1;
                m::aborted();
            }
        } else if let Some(txn) = inner.txn.take() {
            // Let in-flight produce requests finish first: with records still in flight, Kafka 4.4
            // answered librdkafka's EndTxn(abort) with INVALID_TXN_STATE, a fatal error, in our
            // forced-abort test (the open librdkafka issue #4849 reports the same). Delivery
            // errors here are expected and change nothing: the transaction is aborted anyway.
            if let Err(e) = self.producer.flush(self.settings.transaction_timeout) {
                debug!(error = %e, "flush before abort did not complete");
            }
            self.producer.abort()?;
            inner.stats.aborts += 1;
            m::aborted();
            info!(records = txn.records, "transaction aborted");
        }
        inner.state.invalidate_all();
        if let Err(e) = self.rewind(consumer, partitions) {
            // Without a rewind the redo would skip records: stop rather than lose them.
            return Err(TxnError {
                step: "rewind",
                class: TxnErrorClass::Fatal,
                source: e.downcast::<KafkaError>().unwrap_or(KafkaError::Seek("rewind failed".into())),
            });
        }
        Ok(())
    }

    /// Seeks each partition to its committed offset (the beginning when none is committed).
    pub(super) fn rewind(&self, consumer: &BaseConsumer<RebalanceHandler>, partitions: &[i32]) -> anyhow::Result<()> {
        if partitions.is_empty() {
            return Ok(());
        }
        let input = &self.settings.topics.input;
        let mut tpl = TopicPartitionList::new();
        for &p in partitions {
            tpl.add_partition(input, p);
        }
        let committed = crate::reader::fetch_committed(consumer, &tpl, REWIND_TIMEOUT)?;
        let mut seek = TopicPartitionList::new();
        for e in committed.elements() {
            let to = match e.offset() {
                Offset::Offset(o) => Offset::Offset(o),
                _ => Offset::Beginning,
            };
            seek.add_partition_offset(input, e.partition(), to)?;
        }
        let result = consumer.seek_partitions(seek, REWIND_TIMEOUT)?;
        for e in result.elements() {
            if let Err(err) = e.error() {
                return Err(anyhow!(err).context(format!("seeking {input}/{}", e.partition())));
            }
        }
        info!(rewound = ?partitions, "input rewound to the committed offsets");
        Ok(())
    }
}
