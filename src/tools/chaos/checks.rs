//! What a chaos run must leave behind, checked after every instance has stopped (but for the
//! replication factors of the topics the run creates itself, checked as soon as they exist):
//!
//! - every partition of the run's topics has the cluster's replication factor, min(brokers, 3)
//!   ([`replication_problems`]);
//! - the group's committed offsets are the input's end on every partition;
//! - the read_committed notifications are exactly the expected ones (the verifier:
//!   [`crate::oracle`]);
//! - no transaction is left open: Kafka's `find-hanging` reports none on any broker, and every
//!   output partition's last stable offset has reached its high watermark (an open transaction
//!   holds the LSO back; [`open_transactions`]);
//! - every poison tick of the input is in the DLQ exactly once, matched by the
//!   `dlq.original.partition`/`dlq.original.offset` headers ([`dead_letters_once`]).
//!
//! And for an all-stage run (the checks that read the database and the subscribers are in
//! [`super::downstream`]):
//!
//! - no partition of any group is left without progress: the group's committed offset is at or
//!   past the end of the partition's committed data ([`data_ends`], [`left_behind`]; a
//!   transaction marker or an aborted batch after the last record needs no consuming);
//! - each record of alert-deliver's DLQ and parking lot is there once ([`given_up`]).

use super::cluster::Cluster;
use crate::dlq;
use crate::kafka::read::{partition_count, read_topic_to_end, reader, DEFAULT_READ_TIMEOUT};
use crate::kafka::{Isolation, KafkaConfig};
use anyhow::Context as _;
use rdkafka::consumer::Consumer;
use rdkafka::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const WATERMARK_TIMEOUT: Duration = Duration::from_secs(10);

/// The dead letters against the poison ticks of the input, by origin (partition, offset).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetters {
    /// Poison ticks in the input.
    pub expected: u64,
    /// Dead letters read (read_committed).
    pub found: u64,
    /// Poison ticks without a dead letter.
    pub missing: Vec<(i32, i64)>,
    /// Origins dead-lettered more than once, with the count.
    pub duplicate: Vec<((i32, i64), u64)>,
    /// Dead letters of no poison tick (or without origin headers).
    pub unexpected: Vec<String>,
}

impl DeadLetters {
    pub fn ok(&self) -> bool {
        self.missing.is_empty() && self.duplicate.is_empty() && self.unexpected.is_empty()
    }
}

/// Reads `dlq` (read_committed) and matches each dead letter's origin against `poison`, the input
/// positions of the poison ticks.
pub fn dead_letters_once(
    kafka: &KafkaConfig,
    dlq_topic: &str,
    poison: &BTreeSet<(i32, i64)>,
) -> anyhow::Result<DeadLetters> {
    let mut seen: BTreeMap<(i32, i64), u64> = BTreeMap::new();
    let mut unexpected = Vec::new();
    let found = read_topic_to_end(
        kafka,
        dlq_topic,
        Isolation::ReadCommitted,
        DEFAULT_READ_TIMEOUT,
        |m| {
            let origin = dlq::header(m, "dlq.original.partition")
                .zip(dlq::header(m, "dlq.original.offset"))
                .and_then(|(p, o)| Some((p.parse::<i32>().ok()?, o.parse::<i64>().ok()?)));
            match origin {
                Some(o) if poison.contains(&o) => *seen.entry(o).or_default() += 1,
                Some((p, o)) => unexpected.push(format!("{p}/{o}")),
                None => unexpected.push(format!(
                    "dead letter without origin headers at {dlq_topic} offset {}",
                    m.offset()
                )),
            }
            Ok(())
        },
    )
    .with_context(|| format!("reading the DLQ {dlq_topic}"))?;
    Ok(DeadLetters {
        expected: poison.len() as u64,
        found,
        missing: poison
            .iter()
            .filter(|o| !seen.contains_key(o))
            .copied()
            .collect(),
        duplicate: seen.into_iter().filter(|(_, n)| *n > 1).collect(),
        unexpected,
    })
}

/// Per partition of `topic`, the offset after its last committed record (read_committed): what a
/// consumer group must have committed to have consumed everything. Partitions without a record
/// are absent.
pub fn data_ends(kafka: &KafkaConfig, topic: &str) -> anyhow::Result<BTreeMap<i32, i64>> {
    let mut ends = BTreeMap::new();
    read_topic_to_end(
        kafka,
        topic,
        Isolation::ReadCommitted,
        DEFAULT_READ_TIMEOUT,
        |m| {
            ends.insert(m.partition(), m.offset() + 1);
            Ok(())
        },
    )
    .with_context(|| format!("reading {topic} to its end"))?;
    Ok(ends)
}

/// The partitions of `topic` whose committed offset (`committed(p)`) is behind its data end,
/// described for the report (`who` names the group or the table).
pub fn left_behind(
    who: &str,
    topic: &str,
    committed: impl Fn(i32) -> Option<i64>,
    ends: &BTreeMap<i32, i64>,
) -> Vec<String> {
    ends.iter()
        .filter(|(p, end)| committed(**p).is_none_or(|c| c < **end))
        .map(|(p, end)| {
            let at = committed(*p).map_or("nothing".to_owned(), |c| c.to_string());
            format!("{who}: {topic}/{p} committed {at}, data ends at {end}")
        })
        .collect()
}

/// alert-deliver's records in `topic` (its DLQ or parking lot), read_committed, counted by key
/// (`<notification id>/<subscriber>`, from the value's `id` and the `retry.subscriber` header).
pub fn given_up(kafka: &KafkaConfig, topic: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut keys: BTreeMap<String, u64> = BTreeMap::new();
    read_topic_to_end(
        kafka,
        topic,
        Isolation::ReadCommitted,
        DEFAULT_READ_TIMEOUT,
        |m| {
            let id = serde_json::from_slice::<serde_json::Value>(m.payload().unwrap_or_default())
                .ok()
                .and_then(|v| v["id"].as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("(no id at offset {})", m.offset()));
            let sub = crate::trace::header(m, "retry.subscriber").unwrap_or("(no subscriber)");
            *keys.entry(format!("{id}/{sub}")).or_default() += 1;
            Ok(())
        },
    )
    .with_context(|| format!("reading {topic}"))?;
    Ok(keys)
}

/// Partitions of `topics` whose last stable offset is behind the high watermark: a transaction is
/// open there. A read_committed client's ListOffsets answers the LSO, a read_uncommitted one's the
/// high watermark.
pub fn open_transactions(kafka: &KafkaConfig, topics: &[&str]) -> anyhow::Result<Vec<String>> {
    let committed = reader(kafka, Isolation::ReadCommitted)?;
    let uncommitted = reader(kafka, Isolation::ReadUncommitted)?;
    let mut open = Vec::new();
    for topic in topics {
        for p in 0..partition_count(&committed, topic, WATERMARK_TIMEOUT)? {
            let (_, lso) = committed
                .fetch_watermarks(topic, p, WATERMARK_TIMEOUT)
                .with_context(|| format!("LSO of {topic}/{p}"))?;
            let (_, hw) = uncommitted
                .fetch_watermarks(topic, p, WATERMARK_TIMEOUT)
                .with_context(|| format!("high watermark of {topic}/{p}"))?;
            if lso < hw {
                open.push(format!(
                    "{topic}/{p}: last stable offset {lso} < high watermark {hw}"
                ));
            }
        }
    }
    Ok(open)
}

/// Polls [`open_transactions`] until none is open or `timeout` passed; returns the last answer.
/// After a clean stop nothing should be open at once; an instance whose stop failed leaves its
/// transaction to the coordinator, which aborts it within the transaction timeout.
pub fn wait_no_open_transactions(
    kafka: &KafkaConfig,
    topics: &[&str],
    timeout: Duration,
) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + timeout;
    loop {
        let open = open_transactions(kafka, topics)?;
        if open.is_empty() || Instant::now() > deadline {
            return Ok(open);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Partitions of `topics` whose replication factor is not the cluster's (min(N, 3)).
pub fn replication_problems<'a>(
    cluster: &Cluster,
    topics: impl IntoIterator<Item = &'a str>,
) -> anyhow::Result<Vec<String>> {
    let want = cluster.brokers.min(3) as usize;
    let mut problems = Vec::new();
    for t in topics {
        let rf = cluster.replication_factors(t)?;
        if rf.is_empty() || rf.iter().any(|&r| r != want) {
            problems.push(format!("{t}: replication factors {rf:?}, not {want}"));
        }
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::left_behind;
    use std::collections::BTreeMap;

    #[test]
    fn a_partition_is_behind_when_its_committed_offset_is_before_its_data_end() {
        let ends = BTreeMap::from([(0, 10), (1, 5), (2, 7)]);
        let committed = |p: i32| match p {
            0 => Some(10), // at the end
            1 => Some(6),  // past it: a marker after the last record was consumed too
            2 => Some(6),  // one record left
            _ => None,
        };
        assert_eq!(
            left_behind("g", "t", committed, &ends),
            ["g: t/2 committed 6, data ends at 7"]
        );
        assert_eq!(
            left_behind("g", "t", |_| None, &BTreeMap::from([(3, 1)])),
            ["g: t/3 committed nothing, data ends at 1"]
        );
        assert!(left_behind("g", "t", |_| None, &BTreeMap::new()).is_empty());
    }
}
