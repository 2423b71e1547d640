//! One transactional producer, or two taken in turn (`--txn-producers 2`): which one the open
//! batch's records go through.
//!
//! ```text
//!  batch 1 on producer 1 ─► commit ─► batch 2 on producer 2 ─► commit ─► batch 3 on producer 1 …
//!                     (producer 1's commit markers are written while batch 2 fills)
//! ```
//!
//! When `commit_transaction` returns, the coordinator has logged the commit but is still writing
//! its markers. The next transaction's first record makes librdkafka ask AddPartitionsToTxn at
//! once, the broker answers CONCURRENT_TRANSACTIONS until the markers are written, and librdkafka
//! waits a fixed 20 ms before it asks again: nothing of the new batch leaves meanwhile, and its
//! commit waits for that (bench/RESULTS.md section 7). With two producers (two transactional ids)
//! each batch begins on the one that did not commit last, whose markers were written a whole batch
//! ago. Still one transaction at a time: a batch begins only after the previous one committed or
//! aborted (or, with `--overlap-commits`, handed its commit off: [`super::overlap`]), so the order
//! per key, rewinds and revokes are the same as with one; an abort, a revoke or a crash concerns
//! the open transaction, whichever producer holds it. Both ids are registered at start, so a
//! restart fences both and aborts what either left open.

use super::settings::{EngineSettings, Guarantee};
use crate::kafka::txn::TxnProducer;
use anyhow::Context as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The producers of one engine, and which one's transaction is open.
pub(super) struct Producers {
    /// One producer, or two taken in turn.
    all: Vec<Arc<TxnProducer>>,
    /// The index in `all` of the one whose transaction is open, or was the last to be.
    active: AtomicUsize,
}

impl Producers {
    /// Creates the producers: transactional (registering each transactional id fences a
    /// predecessor and aborts what it left open), or one idempotent in the at-least-once mode.
    pub(super) fn start(settings: &EngineSettings) -> anyhow::Result<Self> {
        let all = match settings.guarantee {
            Guarantee::ExactlyOnce => {
                settings.check_instance_id()?;
                settings
                    .transactional_ids()
                    .iter()
                    .map(|id| TxnProducer::start(&settings.kafka, id, settings.transaction_timeout))
                    .collect::<anyhow::Result<Vec<_>>>()?
            }
            Guarantee::AtLeastOnce => {
                vec![
                    TxnProducer::non_transactional(&settings.kafka.idempotent_producer())
                        .context("starting the idempotent producer")?,
                ]
            }
        };
        // The first batch begins on the first producer.
        let last = all.len() - 1;
        Ok(Producers {
            all,
            active: AtomicUsize::new(last),
        })
    }

    /// The index of the producer of the open batch (the last batch's, between batches).
    pub(super) fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed) % self.all.len()
    }

    /// The producer of the open batch (the last batch's, between batches).
    pub(super) fn current(&self) -> &TxnProducer {
        &self.all[self.active()]
    }

    /// The next producer in turn becomes the active one (a batch begins on it).
    pub(super) fn take_turn(&self) {
        let next = (self.active.load(Ordering::Relaxed) + 1) % self.all.len();
        self.active.store(next, Ordering::Relaxed);
    }

    /// Producer `i`.
    pub(super) fn get(&self, i: usize) -> &Arc<TxnProducer> {
        &self.all[i]
    }

    /// The producer in turn after producer `i`.
    pub(super) fn after(&self, i: usize) -> &Arc<TxnProducer> {
        &self.all[(i + 1) % self.all.len()]
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Arc<TxnProducer>> {
        self.all.iter()
    }
}
