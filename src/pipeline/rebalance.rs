//! The consumer's context: the rebalance callbacks that close the open transaction before
//! partitions go, and the resume of partitions a live-alerts hold paused.
//!
//! ```text
//!  revoke (inside poll) ─► the batch in flight settles, then the open batch commits (aborts if
//!        the assignment was lost or the commit fails) ─► resume what a hold paused ─► forget
//!        the revoked partitions
//!  assign (inside poll) ─► mark the new partitions for restore (before their first record)
//! ```
//!
//! # Rebalances
//! On revoke, the open transaction is committed (aborted if the assignment was lost: another
//! member may own the partitions already) before the partitions go, inside the callback, as
//! librdkafka's `transactions.c` does; the callback gets the consumer, so it sends fresh group
//! metadata. On assign, the new partitions are marked for restore.
//!
//! The callbacks run inside `poll`, on the loop's thread, and reach the
//! [`Session`](super::commit::Session) through the [`Committer`] with the lock taken, as the loop
//! does: one path per outcome ([`super::commit`]). A fatal error of a callback is kept in the
//! session and reported after `poll` returns.

use super::commit::Committer;
use crate::metrics as m;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, TopicPartitionList};
use std::sync::Arc;
use tracing::{error, info, warn};

/// The consumer's context: the rebalance callbacks.
pub struct RebalanceHandler {
    committer: Arc<Committer>,
}

impl RebalanceHandler {
    pub(super) fn new(committer: Arc<Committer>) -> Self {
        RebalanceHandler { committer }
    }
}

impl ClientContext for RebalanceHandler {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        crate::kafka::logging::log(level, fac, log_message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        crate::kafka::logging::error(&error, reason);
    }

    /// librdkafka's statistics (every `statistics.interval.ms`): the consumer lag per partition.
    fn stats(&self, statistics: rdkafka::Statistics) {
        for (topic, t) in &statistics.topics {
            for (&partition, p) in &t.partitions {
                // -1: not known yet; the internal partition -1 is not a real one.
                if partition >= 0 && p.consumer_lag >= 0 {
                    m::consumer_lag(topic, partition, p.consumer_lag);
                }
            }
        }
    }
}

impl ConsumerContext for RebalanceHandler {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let c = &self.committer;
        let revoked = partitions_of(tpl, &c.settings().topics.input);
        let mut session = match c.lock() {
            Ok(g) => g,
            Err(e) => return error!(error = %e, "partitions revoked with the state lock poisoned"),
        };
        let lost = consumer.assignment_lost();
        m::rebalance(if lost { "lost" } else { "revoke" });
        info!(partitions = ?revoked, lost, open_txn = session.txn.is_some(), in_flight = session.outbox.has_in_flight(), "partitions revoked");
        if session.txn.is_some() || session.overlapping() {
            let remaining: Vec<i32> = session
                .state
                .owned()
                .filter(|p| !revoked.contains(p))
                .collect();
            let result = if lost {
                // Another member may own these partitions already: our outputs must not commit.
                c.abort_and_rewind(&mut session, consumer, &remaining, None)
            } else {
                c.commit_or_abort(&mut session, consumer, &remaining)
                    .map(|_| ())
            };
            if let Err(e) = result {
                error!(error = %e, "transaction could not be closed on revoke");
                session.fatal.get_or_insert(e);
            }
        }
        resume(
            consumer,
            &c.settings().topics.input,
            &session.state.release(Some(&revoked)),
        );
        for p in revoked {
            session.state.revoke(p);
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let assigned = partitions_of(tpl, &self.committer.settings().topics.input);
                m::rebalance("assign");
                info!(partitions = ?assigned, "partitions assigned");
                match self.committer.lock() {
                    Ok(mut session) => assigned.into_iter().for_each(|p| session.state.assign(p)),
                    Err(e) => {
                        error!(error = %e, "partitions assigned with the state lock poisoned")
                    }
                }
            }
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
            Rebalance::Revoke(tpl) => {
                let revoked = partitions_of(tpl, &self.committer.settings().topics.input);
                if self.committer.settings().hooks.abort_after_revoke && !revoked.is_empty() {
                    // Here the partitions are unassigned and the consumer has not rejoined yet:
                    // between the two rounds of a cooperative rebalance.
                    error!(partitions = ?revoked, "test hook: crashing right after this revoke");
                    std::process::abort();
                }
            }
        }
    }
}

/// Resumes input partitions that a live-alerts hold paused (a failure is logged: the partition
/// would stay paused until its next assignment).
pub(super) fn resume<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    input: &str,
    partitions: &[i32],
) {
    if partitions.is_empty() {
        return;
    }
    let tpl = crate::kafka::tpl::partition_list(input, partitions.iter().copied());
    if let Err(e) = consumer.resume(&tpl) {
        warn!(partitions = ?partitions, error = %e, "resuming held partitions failed");
    }
}

fn partitions_of(tpl: &TopicPartitionList, topic: &str) -> Vec<i32> {
    tpl.elements()
        .iter()
        .filter(|e| e.topic() == topic)
        .map(|e| e.partition())
        .collect()
}
