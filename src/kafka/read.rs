//! Reading topics to their end: the verifier, the demo's counters and the state restore.
//!
//! "The end" is the partition EOF event of librdkafka, which for a read_committed reader is the
//! last stable offset. Records are counted as they arrive; offsets are never subtracted, because
//! transaction markers occupy offsets and an aborted batch leaves offsets that no committed reader
//! sees.

use super::config::{Isolation, KafkaConfig};
use super::logging::Logged;
use super::offsets::position_list;
use anyhow::{anyhow, bail, Context as _};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::Offset;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// A standalone reader. Its context logs through [`super::logging`], where the end-of-partition
/// event that librdkafka also reports as an error is logged at debug level.
pub type Reader = BaseConsumer<Logged>;

/// Creates a reader of the given isolation.
pub fn reader(kafka: &KafkaConfig, isolation: Isolation) -> anyhow::Result<Reader> {
    kafka
        .reader(isolation)
        .create_with_context(Logged)
        .context("creating a reader")
}

/// Whether `e` is the broker refusing a reader's nominal group (`price-alerts-reader`, see
/// [`KafkaConfig::reader`]). librdkafka wants a group.id even for assign() and then looks up that
/// group's coordinator, which a least-privilege principal is refused; a reader never uses the
/// group (it commits nothing), so the refusal is noise, not an error worth a warning.
pub fn is_nominal_group_refused(e: &KafkaError) -> bool {
    e.rdkafka_error_code() == Some(rdkafka::error::RDKafkaErrorCode::GroupAuthorizationFailed)
}

/// Default bound on reading a topic to its end.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Number of partitions of `topic`, or an error if it does not exist.
pub fn partition_count<X: ConsumerContext, C: Consumer<X>>(
    consumer: &C,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<i32> {
    partition_count_if_exists(consumer, topic, timeout)?
        .ok_or_else(|| anyhow!("topic {topic} does not exist"))
}

/// Number of partitions of `topic`, or `None` if it does not exist (yet): for readers that may
/// start before a topic is created (the DLQ backlog watcher, the replay ledger).
pub fn partition_count_if_exists<X: ConsumerContext, C: Consumer<X>>(
    consumer: &C,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<Option<i32>> {
    let md = consumer
        .fetch_metadata(Some(topic), timeout)
        .with_context(|| format!("fetching metadata of {topic}"))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    match t.error().map(rdkafka::error::RDKafkaErrorCode::from) {
        None => {}
        Some(rdkafka::error::RDKafkaErrorCode::UnknownTopicOrPartition) => return Ok(None),
        Some(code) => bail!("topic {topic}: {code:?}"),
    }
    Ok((!t.partitions().is_empty()).then(|| t.partitions().len() as i32))
}

/// Reads the given partitions of `topic` from the beginning up to their end, calling `f` for each
/// record; returns the number of records read.
pub fn read_partitions_to_end(
    consumer: &Reader,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
    mut f: impl FnMut(&BorrowedMessage<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let tpl = position_list(topic, partitions.iter().map(|&p| (p, Offset::Beginning)))?;
    // Leaders first: a partition assigned at a logical offset (the beginning) before its leader is
    // known waits for librdkafka's offset-query retry timer (500 ms) instead of asking at once.
    // One metadata round trip makes a fresh reader (every restore after a start) start reading
    // in milliseconds.
    consumer
        .fetch_metadata(Some(topic), timeout)
        .with_context(|| format!("fetching metadata of {topic}"))?;
    consumer
        .assign(&tpl)
        .context("assigning partitions to the reader")?;
    let mut pending: BTreeSet<i32> = partitions.iter().copied().collect();
    let deadline = Instant::now() + timeout;
    let mut count = 0;
    let result = loop {
        if pending.is_empty() {
            break Ok(count);
        }
        let now = Instant::now();
        if now >= deadline {
            break Err(anyhow!(
                "reading {topic} to its end took longer than {timeout:?} (partitions {pending:?} not at their end)"
            ));
        }
        match consumer.poll(deadline - now) {
            None => {}
            Some(Ok(m)) => {
                count += 1;
                if let Err(e) = f(&m) {
                    break Err(e);
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                pending.remove(&p);
            }
            Some(Err(e)) if is_nominal_group_refused(&e) => {
                debug!(topic, error = %e, "reader's nominal group refused")
            }
            // Connection trouble is retried by librdkafka; the deadline bounds the wait.
            Some(Err(e)) => warn!(topic, error = %e, "error while reading; retrying"),
        }
    };
    // Leave the reader free for the next call whatever happened.
    let _ = consumer.unassign();
    result
}

/// Reads every partition of `topic` to its end with a fresh reader of the given isolation.
pub fn read_topic_to_end(
    kafka: &KafkaConfig,
    topic: &str,
    isolation: Isolation,
    timeout: Duration,
    f: impl FnMut(&BorrowedMessage<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let consumer = reader(kafka, isolation)?;
    let n = partition_count(&consumer, topic, timeout)?;
    let partitions: Vec<i32> = (0..n).collect();
    read_partitions_to_end(&consumer, topic, &partitions, timeout, f)
}

/// Counts the records of `topic` visible under `isolation`.
pub fn count_records(
    kafka: &KafkaConfig,
    topic: &str,
    isolation: Isolation,
) -> anyhow::Result<u64> {
    read_topic_to_end(kafka, topic, isolation, DEFAULT_READ_TIMEOUT, |_| Ok(()))
}
