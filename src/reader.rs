//! Reading topics to their end: the verifiers, the demo's counters and the state restore.
//!
//! "The end" is the partition EOF event of librdkafka, which for a read_committed reader is the
//! last stable offset. Records are counted as they arrive; offsets are never subtracted, because
//! transaction markers occupy offsets and an aborted batch leaves offsets that no committed reader
//! sees.

use crate::config::{Isolation, KafkaConfig};
use anyhow::{anyhow, bail, Context as _};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tracing::{debug, error, warn};

/// A standalone reader.
pub type Reader = BaseConsumer<ReaderContext>;

/// Context of readers: reaching the end of a partition is what a reader waits for, so the
/// end-of-partition event that librdkafka also reports as an error is logged at debug level.
#[derive(Default)]
pub struct ReaderContext;

impl ClientContext for ReaderContext {
    fn error(&self, error: KafkaError, reason: &str) {
        match error {
            KafkaError::PartitionEOF(_) | KafkaError::Global(RDKafkaErrorCode::PartitionEOF) => debug!(%reason, "partition end"),
            e => error!(error = %e, %reason, "librdkafka error"),
        }
    }
}

impl ConsumerContext for ReaderContext {}

/// Creates a reader of the given isolation.
pub fn reader(kafka: &KafkaConfig, isolation: Isolation) -> anyhow::Result<Reader> {
    kafka.reader(isolation).create_with_context(ReaderContext).context("creating a reader")
}

/// Default bound on reading a topic to its end.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Number of partitions of `topic`, or an error if it does not exist.
pub fn partition_count<X: ConsumerContext, C: Consumer<X>>(consumer: &C, topic: &str, timeout: Duration) -> anyhow::Result<i32> {
    let md = consumer
        .fetch_metadata(Some(topic), timeout)
        .with_context(|| format!("fetching metadata of {topic}"))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| anyhow!("topic {topic} not in metadata"))?;
    if let Some(err) = t.error() {
        bail!("topic {topic}: {:?}", rdkafka::error::RDKafkaErrorCode::from(err));
    }
    if t.partitions().is_empty() {
        bail!("topic {topic} does not exist");
    }
    Ok(t.partitions().len() as i32)
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
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl).context("assigning partitions to the reader")?;
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
pub fn count_records(kafka: &KafkaConfig, topic: &str, isolation: Isolation) -> anyhow::Result<u64> {
    read_topic_to_end(kafka, topic, isolation, DEFAULT_READ_TIMEOUT, |_| Ok(()))
}

/// Committed offsets of `group` on every partition of `topic` (`None` where nothing is committed).
pub fn committed_offsets(kafka: &KafkaConfig, group: &str, topic: &str) -> anyhow::Result<Vec<Option<i64>>> {
    // read_uncommitted: an observer wants the offsets committed now, not to wait (up to the
    // timeout) until no transaction holds pending offsets, as a read_committed consumer's
    // "require stable" fetch does while a processor is mid-commit.
    let mut cfg = kafka.reader(Isolation::ReadUncommitted);
    cfg.set("group.id", group);
    let consumer: Reader = cfg.create_with_context(ReaderContext).context("creating an offsets reader")?;
    let n = partition_count(&consumer, topic, DEFAULT_READ_TIMEOUT)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        tpl.add_partition(topic, p);
    }
    let committed = fetch_committed(&consumer, &tpl, DEFAULT_READ_TIMEOUT)
        .with_context(|| format!("fetching committed offsets of group {group}"))?;
    Ok((0..n)
        .map(|p| match committed.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        })
        .collect())
}

/// The committed offsets of `tpl`'s partitions for the consumer's group. A young broker may still
/// be electing or loading the group's coordinator, and librdkafka hands those answers back instead
/// of retrying: ask again until `timeout`.
pub fn fetch_committed<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    tpl: &TopicPartitionList,
    timeout: Duration,
) -> Result<TopicPartitionList, KafkaError> {
    let deadline = Instant::now() + timeout;
    loop {
        match consumer.committed_offsets(tpl.clone(), deadline.saturating_duration_since(Instant::now())) {
            Err(e) if coordinator_moving(&e) && Instant::now() < deadline => {
                debug!(error = %e, "group coordinator not ready; asking again");
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Whether an error means the group coordinator is moving or loading (worth asking again).
fn coordinator_moving(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::CoordinatorLoadInProgress
        )
    )
}
