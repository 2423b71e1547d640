//! The replay ledger: which dead letters have been replayed, one record per dead letter.
//!
//! `<dlq>.replayed` is a compacted topic. Key: the dead letter's coordinates in the DLQ,
//! `dlq-topic/partition/offset` (also the `replay.origin` header of its copy). Value: a small JSON
//! [`Entry`]: when, to which topic, which class, and the dead letter's own timestamp; never the
//! payload. A dead letter is *handled* iff the ledger holds its key.
//!
//! Why a ledger and not a consumer group's offsets: an offset says "everything before here", so a
//! replay that selects some records and commits past the others makes those unreplayable for
//! good. Progress per record lets a filter take exactly what it selects and leave every other dead
//! letter as it was. The copy of a dead letter and its ledger entry are written in the same
//! transaction ([`crate::tools::replay::run`]): an entry is visible to read_committed readers iff its copy is.
//!
//! The dead letter's timestamp in the entry guards against a DLQ that was deleted and created
//! again under the same name: its offsets start at 0 again, and without the timestamp its new dead
//! letters would look handled by the old entries. An entry whose value cannot be read counts as
//! handled (replaying twice is the worse mistake).
//!
//! Compaction keeps one entry per key. The ledger grows by one small record (about 150 bytes) per
//! dead letter replayed and is not pruned when DLQ retention removes the dead letter itself.

use crate::kafka::read::{
    partition_count_if_exists, read_partitions_to_end, reader, End, Reader, DEFAULT_READ_TIMEOUT,
};
use crate::kafka::topics::{ensure_topic, Cleanup, TopicSpec};
use crate::kafka::txn::TxnProducer;
use crate::kafka::{Isolation, KafkaConfig};
use anyhow::Context as _;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::BaseRecord;
use rdkafka::Message;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The ledger of `dlq`.
pub fn topic(dlq: &str) -> String {
    format!("{dlq}.replayed")
}

/// The transactional id of every replay of `dlq`: one per DLQ, so a replay that starts fences
/// the one still running and aborts its open transaction.
pub fn transactional_id(dlq: &str) -> String {
    format!("{dlq}.replay")
}

/// A dead letter's ledger key and the `replay.origin` of its copy: `topic/partition/offset`.
pub fn key(topic: &str, partition: i32, offset: i64) -> String {
    format!("{topic}/{partition}/{offset}")
}

/// The key of the dead letter `m`.
pub fn key_of(m: &BorrowedMessage<'_>) -> String {
    key(m.topic(), m.partition(), m.offset())
}

/// Topic, partition and offset of a ledger key (topic names may not hold `/`, so the last two
/// fields are the numbers).
pub fn parse_key(key: &str) -> Option<(&str, i32, i64)> {
    let mut fields = key.rsplitn(3, '/');
    let offset = fields.next()?.parse().ok()?;
    let partition = fields.next()?.parse().ok()?;
    Some((fields.next()?, partition, offset))
}

/// The value of a ledger entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// When the copy was written (RFC 3339).
    pub replayed_at: String,
    /// Where the copy went.
    pub target: String,
    /// The dead letter's `dlq.error.class`.
    pub class: String,
    /// The dead letter's record timestamp (ms): tells it from a dead letter at the same
    /// coordinates in an earlier DLQ of the same name.
    pub dead_letter_timestamp: Option<i64>,
}

/// Whether a ledger entry recorded with `entry` stands for a dead letter with `record`'s
/// timestamp (an unknown timestamp on either side is taken as the same dead letter).
pub fn same_letter(entry: Option<i64>, record: Option<i64>) -> bool {
    match (entry, record) {
        (Some(e), Some(r)) => e == r,
        _ => true,
    }
}

/// The handled dead letters of one DLQ: (partition, offset) with the timestamp of their entry.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    entries: HashMap<(i32, i64), Option<i64>>,
}

impl Ledger {
    /// Whether the dead letter at `partition`/`offset` with `timestamp` has been replayed.
    pub fn contains(&self, partition: i32, offset: i64, timestamp: Option<i64>) -> bool {
        self.entries
            .get(&(partition, offset))
            .is_some_and(|&e| same_letter(e, timestamp))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A ledger record decoded: partition, offset and timestamp of the dead letter it marks handled,
/// if it is an entry of `dlq` (the ledger of one DLQ holds no others, but a key is data).
pub fn decode(m: &BorrowedMessage<'_>, dlq: &str) -> Option<(i32, i64, Option<i64>)> {
    let key = std::str::from_utf8(m.key()?).ok()?;
    let (_, partition, offset) = parse_key(key).filter(|(t, _, _)| *t == dlq)?;
    let timestamp = m
        .payload()
        .and_then(|v| serde_json::from_slice::<Entry>(v).ok())
        .and_then(|e| e.dead_letter_timestamp);
    Some((partition, offset, timestamp))
}

/// Creates the ledger of `dlq` if it is missing (compacted: one entry per dead letter is all that
/// must stay). One partition: it is small, and read whole.
pub fn ensure(kafka: &KafkaConfig, dlq: &str) -> anyhow::Result<()> {
    let spec = TopicSpec {
        name: topic(dlq),
        partitions: 1,
        cleanup: Cleanup::Compact,
        retention: None,
    };
    futures::executor::block_on(ensure_topic(kafka, &spec))
        .with_context(|| format!("creating the replay ledger {}", spec.name))?;
    Ok(())
}

/// Reads the ledger of `dlq` to its end, read_committed; empty if it does not exist yet.
pub fn read(kafka: &KafkaConfig, dlq: &str) -> anyhow::Result<Ledger> {
    let name = topic(dlq);
    let consumer: Reader = reader(kafka, Isolation::ReadCommitted)?;
    let mut ledger = Ledger::default();
    let Some(n) = partition_count_if_exists(&consumer, &name, DEFAULT_READ_TIMEOUT)? else {
        return Ok(ledger);
    };
    let partitions: Vec<i32> = (0..n).collect();
    read_partitions_to_end(
        &consumer,
        &name,
        &partitions,
        End::Decided,
        DEFAULT_READ_TIMEOUT,
        |m| {
            if let Some((partition, offset, timestamp)) = decode(m, dlq) {
                ledger.entries.insert((partition, offset), timestamp);
            }
            Ok(())
        },
    )
    .with_context(|| format!("reading the replay ledger {name}"))?;
    Ok(ledger)
}

/// Writes the ledger entry of dead letter `m` (replayed to `target`) into the open transaction.
pub fn send(
    producer: &TxnProducer,
    m: &BorrowedMessage<'_>,
    class: &str,
    target: &str,
) -> Result<(), KafkaError> {
    let entry = Entry {
        replayed_at: crate::dlq::now_rfc3339(),
        target: target.to_owned(),
        class: class.to_owned(),
        dead_letter_timestamp: m.timestamp().to_millis(),
    };
    // Serializing a struct of strings and numbers cannot fail.
    let value = serde_json::to_vec(&entry).unwrap_or_default();
    let key = key_of(m);
    let name = topic(m.topic());
    producer.send(BaseRecord::to(&name).key(key.as_bytes()).payload(&value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        assert_eq!(key("a.dlq", 3, 42), "a.dlq/3/42");
        assert_eq!(parse_key("a.dlq/3/42"), Some(("a.dlq", 3, 42)));
        assert_eq!(parse_key("garbage"), None);
        assert_eq!(parse_key("a.dlq/x/1"), None);
    }

    #[test]
    fn the_same_coordinates_in_a_recreated_dlq_are_another_letter() {
        assert!(same_letter(Some(5), Some(5)));
        assert!(!same_letter(Some(5), Some(6)));
        assert!(
            same_letter(None, Some(6)),
            "an entry without a timestamp counts as handled"
        );
        let mut l = Ledger::default();
        l.entries.insert((0, 7), Some(100));
        assert!(l.contains(0, 7, Some(100)));
        assert!(!l.contains(0, 7, Some(200)));
        assert!(!l.contains(0, 8, Some(100)));
    }
}
