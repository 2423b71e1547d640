//! Offsets: fetching what a group committed, and seeking to it (partition lists: [`super::tpl`]).
//!
//! Every position the project computes is "the next offset to read", as Kafka commits them. Where
//! a group has committed nothing yet, the position is the beginning of the partition (the
//! processor's groups start at the earliest offset, so no tick is ever skipped).
//!
//! # Retries
//! A young broker may still be electing or loading a group's coordinator, and librdkafka hands
//! those answers back instead of retrying: [`fetch_committed`] asks again until its timeout. It is
//! the only function here that talks to the broker about committed offsets; the others build on
//! it.

use super::access::Denials;
use super::config::{Isolation, KafkaConfig};
use super::logging::Logged;
use super::read::{partition_count, Reader, DEFAULT_READ_TIMEOUT};
use super::tpl::{partition_list, position_list};
use anyhow::Context as _;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};
use tracing::{debug, info};

/// The committed offsets of `tpl`'s partitions for the consumer's group, asked again while the
/// group coordinator is moving or loading, until `timeout`.
///
/// For a read_committed consumer the broker answers only once no transaction holds pending
/// offsets on these partitions (KIP-447 "require stable"): a previous owner's last transaction is
/// resolved first. That is what the processor relies on before it restores a partition's state.
pub fn fetch_committed<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    tpl: &TopicPartitionList,
    timeout: Duration,
) -> Result<TopicPartitionList, KafkaError> {
    let deadline = Instant::now() + timeout;
    loop {
        match consumer.committed_offsets(
            tpl.clone(),
            deadline.saturating_duration_since(Instant::now()),
        ) {
            Err(e) if coordinator_moving(&e) && Instant::now() < deadline => {
                debug!(error = %e, "group coordinator not ready; asking again");
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Asks a group's coordinator for the group's committed offsets, without joining the group: the
/// processor's rewinds and restores ask through it rather than through their group consumer.
///
/// Why a client of its own: the group consumer's librdkafka looks its coordinator up again only
/// on errors and every 10 minutes, so after its coordinator's broker froze (connections open,
/// nothing answered) and KRaft moved the group, its OffsetFetch still went to the frozen broker:
/// a rewind waited 9.2 s and 19.6 s (tests/coordinator.rs, the freeze case; issue 20). This client
/// looks the coordinator up every few seconds, and drops a connection that leaves a request
/// unanswered for a few seconds, so that its look-ups never stay with a frozen broker
/// ([`KafkaConfig::group_probe`]: `COORDINATOR_QUERY_INTERVAL`, `OFFSETS_CLIENT_SOCKET_TIMEOUT`).
/// Frequent look-ups on the group consumer instead broke a refused group: librdkafka then parks
/// the consumer in "query coordinator" and its OffsetFetch waits out the whole timeout instead of
/// answering GROUP_AUTHORIZATION_FAILED (tests/security.rs saw the pipeline silent for 20 s). Here
/// a refused look-up, which librdkafka reports only as an error event, is watched for between
/// short asks and returned as that error.
pub struct GroupOffsets {
    consumer: BaseConsumer<Denials>,
}

/// How long the first ask of [`GroupOffsets::fetch`] waits before the error events are looked
/// at; each further ask waits twice as long, up to [`MAX_ASK_SLICE`]. A refused look-up shows in
/// the first second. An OffsetFetch that waits for a previous owner's pending offsets is retried
/// by librdkafka on its own after an ask ends, so growing asks keep those retries few.
const ASK_SLICE: Duration = Duration::from_secs(1);
const MAX_ASK_SLICE: Duration = Duration::from_secs(8);

impl GroupOffsets {
    /// A client for `group`'s offsets; `isolation` ReadCommitted waits for a previous owner's
    /// pending offsets to be decided (see [`fetch_committed`]).
    pub fn new(kafka: &KafkaConfig, group: &str, isolation: Isolation) -> anyhow::Result<Self> {
        let consumer = kafka
            .group_probe(group, isolation)
            .create_with_context(Denials::default())
            .context("creating the group offsets client")?;
        Ok(GroupOffsets { consumer })
    }

    /// The committed offsets of `tpl`'s partitions, as [`fetch_committed`], but a refused group
    /// returns GROUP_AUTHORIZATION_FAILED, within about [`ASK_SLICE`] when the refusal is new.
    pub fn fetch(
        &self,
        tpl: &TopicPartitionList,
        timeout: Duration,
    ) -> Result<TopicPartitionList, KafkaError> {
        let deadline = Instant::now() + timeout;
        let mut ask = ASK_SLICE;
        loop {
            let slice = ask.min(deadline.saturating_duration_since(Instant::now()));
            ask = (ask * 2).min(MAX_ASK_SLICE);
            let result = fetch_committed(&self.consumer, tpl, slice);
            // Serve the error events queued meanwhile (a refused FindCoordinator).
            let _ = self.consumer.poll(Duration::ZERO);
            match result {
                Ok(committed) => {
                    self.consumer.context().clear();
                    return Ok(committed);
                }
                Err(e) if self.consumer.context().group_refused() => {
                    debug!(error = %e, "the group is refused");
                    return Err(KafkaError::MetadataFetch(
                        RDKafkaErrorCode::GroupAuthorizationFailed,
                    ));
                }
                Err(e)
                    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::OperationTimedOut)
                        && Instant::now() < deadline => {}
                Err(e) => return Err(e),
            }
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

/// Where the consumer's group resumes on `partitions` of `topic`: the committed offset, or the
/// beginning where nothing is committed. A partition the broker answered with an error (e.g.
/// TOPIC_AUTHORIZATION_FAILED when Read on the topic is refused) fails the whole call: its offset
/// is unknown, and taking it for "nothing committed" would rewind to the beginning.
pub fn committed_positions(
    offsets: &GroupOffsets,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
) -> Result<TopicPartitionList, KafkaError> {
    let committed = offsets.fetch(&partition_list(topic, partitions.iter().copied()), timeout)?;
    for e in committed.elements() {
        e.error()?;
    }
    position_list(
        topic,
        committed.elements().iter().map(|e| {
            let at = match e.offset() {
                Offset::Offset(o) => Offset::Offset(o),
                _ => Offset::Beginning,
            };
            (e.partition(), at)
        }),
    )
}

/// Seeks each of `partitions` (assigned to the consumer) to its committed position: how the
/// processor rewinds its input after an abort, so the redo reads exactly what was not committed.
pub fn seek_to_committed<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    offsets: &GroupOffsets,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
) -> Result<(), KafkaError> {
    if partitions.is_empty() {
        return Ok(());
    }
    let positions = committed_positions(offsets, topic, partitions, timeout)?;
    for e in consumer.seek_partitions(positions, timeout)?.elements() {
        e.error()?;
    }
    info!(topic, partitions = ?partitions, "rewound to the committed offsets");
    Ok(())
}

/// Committed offsets of `group` on every partition of `topic` (`None` where nothing is committed),
/// as an observer sees them (tests, the demo, benchmarks).
pub fn committed_offsets(
    kafka: &KafkaConfig,
    group: &str,
    topic: &str,
) -> anyhow::Result<Vec<Option<i64>>> {
    // read_uncommitted: an observer wants the offsets committed now, not to wait (up to the
    // timeout) until no transaction holds pending offsets, as a read_committed consumer's
    // "require stable" fetch does while a processor is mid-commit.
    let mut cfg = kafka.reader(Isolation::ReadUncommitted);
    cfg.set("group.id", group);
    let consumer: Reader = cfg
        .create_with_context(Logged)
        .context("creating an offsets reader")?;
    let n = partition_count(&consumer, topic, DEFAULT_READ_TIMEOUT)?;
    let committed = fetch_committed(
        &consumer,
        &partition_list(topic, 0..n),
        DEFAULT_READ_TIMEOUT,
    )
    .with_context(|| format!("fetching committed offsets of group {group}"))?;
    Ok((0..n)
        .map(
            |p| match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            },
        )
        .collect())
}
