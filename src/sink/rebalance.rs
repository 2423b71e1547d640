//! The sink consumer's context: the rebalance callbacks, which decide where an assigned partition
//! starts and what becomes of a revoked partition's records, and the commit callback, which hears
//! the group's answer to the offsets committed for lag monitoring.
//!
//! ```text
//!  assign ─► read the stored offsets ─┬─ answered ─► each partition starts there (the beginning
//!                                     │              when none is stored), resumed
//!                                     └─ unavailable ─► outage: from the group's committed
//!                                                       offset, paused, unsynced
//!  revoke ─► write the open batch (unless lost or the database is down) ─► commit the stored
//!        offsets to the group (unless lost) ─► drop what the batch still holds of the
//!        partitions ─► unassign
//! ```
//!
//! The invariants these keep are in [`super::partitions`]; what each event does to a partition's
//! state is [`State`]'s table.

use super::db::DbError;
use super::partitions::Shared;
use super::state::State;
use crate::kafka::access::ReadRights;
use crate::kafka::logging;
use anyhow::{anyhow, Context as _};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::sync::Arc;
use tracing::{debug, error, info, warn};

/// The consumer's context: the rebalance callbacks.
pub struct SinkContext {
    shared: Arc<Shared>,
}

impl Shared {
    pub(super) fn context(self: &Arc<Self>) -> SinkContext {
        SinkContext {
            shared: Arc::clone(self),
        }
    }

    /// Assignment: start each partition at its stored offset (the beginning when none is stored).
    fn on_assign(
        &self,
        st: &mut State,
        consumer: &BaseConsumer<SinkContext>,
        tpl: &mut TopicPartitionList,
    ) -> anyhow::Result<()> {
        let parts: Vec<i32> = partitions_of(tpl, &self.opts.topic);
        let stored = match &st.store {
            Some(store) => self.rt.block_on(self.read_offsets(store)),
            None => Err(DbError::Unavailable(
                "database unavailable at assignment".into(),
            )),
        };
        match stored {
            Ok(stored) => {
                for &p in &parts {
                    let at = stored
                        .get(&p)
                        .map_or(Offset::Beginning, |&o| Offset::Offset(o));
                    tpl.set_partition_offset(&self.opts.topic, p, at)?;
                }
                // The group may lag them (a crash between the two commits): it gets them too.
                st.group
                    .stored(parts.iter().filter_map(|p| Some((*p, *stored.get(p)?))));
                info!(partitions = ?parts, stored = ?stored, "partitions assigned: starting at the stored offsets");
            }
            Err(e) if e.is_unavailable() => {
                // The committed offsets (a lower bound of the stored ones) until the database
                // answers; paused and unsynced (`State::assigned`), moved to the stored offsets
                // on recovery.
                self.enter_outage(st, consumer, &e);
                warn!(partitions = ?parts, "partitions assigned during a database outage: paused");
            }
            Err(e) => return Err(anyhow!(e).context("reading the stored offsets")),
        }
        assign(consumer, tpl).context("assigning partitions")?;
        st.assigned(consumer, &parts)
            .context("pausing or resuming the assigned partitions")
    }

    /// Revocation: store the open batch first when the database answers and the assignment is
    /// still ours; otherwise drop the revoked partitions' records (the next owner reads them again
    /// from the stored offsets).
    fn on_revoke(
        &self,
        st: &mut State,
        consumer: &BaseConsumer<SinkContext>,
        tpl: &TopicPartitionList,
    ) -> anyhow::Result<()> {
        let parts = partitions_of(tpl, &self.opts.topic);
        let lost = consumer.assignment_lost();
        let buffered = st.batch.records();
        // A failed write still lets the partitions go (below); its error is reported after.
        let stored = if !lost && st.store.is_some() {
            self.flush(st, consumer)
        } else {
            Ok(())
        };
        if !lost {
            // Still this member's to commit, under the generation that owned them.
            self.commit_group(st, consumer, true)?;
        }
        let dropped = st.revoked(&parts);
        info!(partitions = ?parts, lost, buffered, dropped, "partitions revoked");
        unassign(consumer, tpl).context("unassigning partitions")?;
        stored
    }
}

fn partitions_of(tpl: &TopicPartitionList, topic: &str) -> Vec<i32> {
    tpl.elements()
        .iter()
        .filter(|e| e.topic() == topic)
        .map(|e| e.partition())
        .collect()
}

fn assign(consumer: &BaseConsumer<SinkContext>, tpl: &TopicPartitionList) -> KafkaResult<()> {
    match consumer.rebalance_protocol() {
        RebalanceProtocol::Cooperative => consumer.incremental_assign(tpl),
        _ => consumer.assign(tpl),
    }
}

fn unassign(consumer: &BaseConsumer<SinkContext>, tpl: &TopicPartitionList) -> KafkaResult<()> {
    match consumer.rebalance_protocol() {
        RebalanceProtocol::Cooperative => consumer.incremental_unassign(tpl),
        _ => consumer.unassign(),
    }
}

impl ClientContext for SinkContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        logging::log(level, fac, log_message);
    }

    /// A refused right reaches the loop too, as a consumer error, which says it once per
    /// back-off step ([`ReadRights::on_error`]); everything else as every client logs it.
    fn error(&self, error: KafkaError, reason: &str) {
        if ReadRights::is_refusal(error.rdkafka_error_code()) {
            return debug!(error = %error, reason, "not authorised");
        }
        logging::error(&error, reason);
    }
}

impl ConsumerContext for SinkContext {
    /// Replaces rdkafka's default rebalance: the assigned partitions' start offsets come from the
    /// database, and a revoked partition's batch is stored (or dropped) before it goes.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let shared = &self.shared;
        let mut st = match shared.lock() {
            Ok(g) => g,
            Err(e) => return error!(error = %e, "rebalance with a poisoned state"),
        };
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                shared
                    .rights
                    .group_answered("partitions assigned by the group");
                shared.on_assign(&mut st, consumer, tpl)
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                shared.on_revoke(&mut st, consumer, tpl)
            }
            other => {
                // librdkafka asks for the assignment to be dropped on a rebalance error.
                warn!(error = ?other, "rebalance error; dropping the assignment");
                let mut all = TopicPartitionList::new();
                for p in st.owned() {
                    all.add_partition(&shared.opts.topic, p);
                }
                shared.on_revoke(&mut st, consumer, &all)
            }
        };
        if let Err(e) = result {
            error!(error = format!("{e:#}"), "rebalance failed");
            st.fatal.get_or_insert(e);
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        // A refusal can come as the commit's error or only as its partitions' errors.
        let rights = &self.shared.rights;
        let mut refused = false;
        if let Err(e) = &result {
            if e.rdkafka_error_code() == Some(RDKafkaErrorCode::GroupAuthorizationFailed) {
                rights.group_refused();
                refused = true;
            }
        }
        for e in offsets.elements() {
            match e.error().err().and_then(|e| e.rdkafka_error_code()) {
                Some(RDKafkaErrorCode::TopicAuthorizationFailed) => rights.topic_refused(e.topic()),
                Some(RDKafkaErrorCode::GroupAuthorizationFailed) => rights.group_refused(),
                _ => continue,
            }
            refused = true;
        }
        if result.is_ok() {
            // `try_lock`: a commit answered while the state is held (never expected: callbacks
            // run inside `poll`, which the loop calls unlocked) is simply committed again.
            if let Ok(mut st) = self.shared.state.try_lock() {
                for e in offsets.elements() {
                    if let (true, Offset::Offset(o)) = (e.error().is_ok(), e.offset()) {
                        if e.topic() == self.shared.opts.topic {
                            st.group.acknowledged(e.partition(), o);
                        }
                    }
                }
            }
        }
        match result {
            _ if refused => {}
            Ok(()) => rights.group_answered("offsets committed to the group"),
            Err(e) => {
                debug!(error = %e, "offset commit to the Kafka group failed (lag monitoring only)")
            }
        }
    }
}
