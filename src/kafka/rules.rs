//! The rules topic's records as the live-alert join takes them ([`crate::rules::live`] decodes
//! them; this module only takes them out of Kafka's messages): the pipeline's rules reader, the
//! oracle and `alert-rules list` all read them through here, so all three see the same records.

use super::read::{read_topic_to_end, DEFAULT_READ_TIMEOUT};
use super::{Isolation, KafkaConfig};
use crate::rules::live::{decode, PartitionJoin, RuleRecord, FIRED_HEADER};
use anyhow::Context as _;
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::Message;
use std::collections::BTreeMap;

/// A record of the rules topic as the join takes it.
pub fn rule_record(m: &BorrowedMessage<'_>, partitions: i32) -> RuleRecord {
    let fired = m.headers().and_then(|h| {
        h.iter()
            .find(|h| h.key == FIRED_HEADER)
            .and_then(|h| h.value)
    });
    RuleRecord {
        offset: m.offset(),
        ts: m.timestamp().to_millis().unwrap_or(0),
        change: decode(m.key(), m.payload(), fired, m.partition(), partitions),
    }
}

/// Every record of a rules topic of `partitions` partitions, read_committed to its end, pushed
/// into a join per partition, none applied yet: what `list` and the oracle start from.
pub fn read_joins(
    kafka: &KafkaConfig,
    topic: &str,
    partitions: i32,
) -> anyhow::Result<BTreeMap<i32, PartitionJoin>> {
    let mut joins: BTreeMap<i32, PartitionJoin> = BTreeMap::new();
    read_topic_to_end(
        kafka,
        topic,
        Isolation::ReadCommitted,
        DEFAULT_READ_TIMEOUT,
        |m| {
            joins
                .entry(m.partition())
                .or_default()
                .push(rule_record(m, partitions));
            Ok(())
        },
    )
    .with_context(|| format!("reading rules topic {topic}"))?;
    Ok(joins)
}
