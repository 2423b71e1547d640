//! The group's lag on every partition of its input, owned or not, as Kafka's own tooling reports
//! it (`kafka-consumer-groups --describe`): so that a partition nobody consumes is visible.
//!
//! librdkafka's statistics give a consumer's lag only for the partitions it owns
//! ([`crate::metrics::CONSUMER_LAG`]). A partition that no member owns (a member that died
//! between the two rounds of a cooperative rebalance under static membership, see docs/pipeline.md,
//! "Group membership") has no such series anywhere, while every instance stays ready. This
//! watcher asks the broker instead: every interval it fetches the group's committed offsets of
//! every input partition and each partition's high watermark, and sets, per partition
//! ([`crate::metrics::group_partition`]):
//!
//! | gauge                           | value                                                        |
//! |---------------------------------|--------------------------------------------------------------|
//! | `alerts_group_committed_offset` | the group's committed offset; the log start where nothing is committed (where the group starts) |
//! | `alerts_partition_end_offset`   | the high watermark                                           |
//! | `alerts_group_lag`              | end minus committed: the lag `kafka-consumer-groups` reports |
//!
//! The lag is a difference of offsets, not a count of records: transaction markers occupy
//! offsets, so a partition consumed to its end behind a transactional producer may show a marker
//! or two. The question these gauges answer is whether the committed offset moves while the end
//! does (the `PartitionWithoutProgress` alert), and for that offsets are right.
//!
//! # Cost
//! A thread and a client of its own, never the processing thread: per round one metadata request,
//! one OffsetFetch for all partitions, and one ListOffsets per partition. The committed offsets
//! are fetched without "require stable" (read_uncommitted), so a round never waits for an open
//! transaction of the processor.
//!
//! # Errors
//! The watcher never stops the pipeline. Every broker call has a deadline ([`CALL_TIMEOUT`]); a
//! round that fails is logged and leaves the gauges as the last round set them (an end that does
//! not move raises no alert); the next round tries again. A topic that does not exist yet has no
//! series.

use super::config::{Isolation, KafkaConfig};
use super::logging::Logged;
use super::offsets::fetch_committed;
use super::read::{partition_count_if_exists, Reader};
use super::tpl::partition_list;
use crate::background::Background;
use anyhow::Context as _;
use rdkafka::consumer::Consumer;
use rdkafka::Offset;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Bound on each broker call of a round.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest sleep between checks of the stop flag.
const STOP_SLICE: Duration = Duration::from_millis(100);

/// One partition's figures of a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionLag {
    pub partition: i32,
    /// The group's committed offset; the log start where nothing is committed.
    pub committed: i64,
    /// The high watermark.
    pub end: i64,
}

impl PartitionLag {
    /// End minus committed, never below zero (a committed offset past the end: a topic deleted
    /// and made again under the same name).
    pub fn lag(&self) -> i64 {
        (self.end - self.committed).max(0)
    }
}

/// The figures of one partition from what the broker answered: the committed offset (`None`
/// where the group has committed nothing) and the low and high watermarks.
pub fn partition_lag(
    partition: i32,
    committed: Option<i64>,
    (low, high): (i64, i64),
) -> PartitionLag {
    PartitionLag {
        partition,
        // Nothing committed: the group starts at the earliest offset (auto.offset.reset).
        committed: committed.unwrap_or(low),
        end: high,
    }
}

/// A running watcher; dropping it stops the watcher and waits for its client to be dropped
/// (bounded, see [`crate::background`]).
pub struct Watcher {
    _thread: Background,
}

impl Watcher {
    /// Watches `group` on every partition of each of `topics` (all it consumes: alert-deliver's
    /// group reads the notifications and every retry bucket) on a thread of its own, setting the
    /// gauges every `every`.
    pub fn spawn(
        kafka: &KafkaConfig,
        group: &str,
        topics: &[String],
        every: Duration,
    ) -> anyhow::Result<Watcher> {
        let probe = Probe::new(kafka, group, topics)?;
        let thread = Background::spawn("group-lag", move |stop| probe.run(every, stop))
            .context("starting the group lag watcher")?;
        Ok(Watcher { _thread: thread })
    }
}

/// What one round asks the broker with.
struct Probe {
    /// Never subscribes, polls or commits: it only asks for the group's offsets and the ends.
    consumer: Reader,
    group: String,
    topics: Vec<String>,
}

impl Probe {
    fn new(kafka: &KafkaConfig, group: &str, topics: &[String]) -> anyhow::Result<Self> {
        // read_uncommitted: the offsets committed now, without waiting for a transaction that
        // holds pending offsets ("require stable" of a read_committed fetch); and the high
        // watermark as the end, as Kafka's tooling shows it.
        let consumer: Reader = kafka
            .group_probe(group, Isolation::ReadUncommitted)
            .create_with_context(Logged)
            .context("creating the group lag reader")?;
        Ok(Probe {
            consumer,
            group: group.to_owned(),
            topics: topics.to_vec(),
        })
    }

    /// Rounds every `every` until `stop`. Blocking.
    fn run(&self, every: Duration, stop: &AtomicBool) {
        info!(group = %self.group, topics = ?self.topics, every = ?every, "watching the group's lag on every partition");
        let mut failing = false;
        while !stop.load(Ordering::Relaxed) {
            let next = Instant::now() + every;
            match self.rounds() {
                Ok(rows) => {
                    for (topic, r) in &rows {
                        crate::metrics::group_partition(
                            &self.group,
                            topic,
                            r.partition,
                            r.committed,
                            r.end,
                            r.lag(),
                        );
                    }
                    if failing {
                        info!(group = %self.group, "group lag readable again");
                        failing = false;
                    }
                    debug!(group = %self.group, partitions = rows.len(), "group lag refreshed");
                }
                Err(e) => {
                    // Once per failure streak: a broker that is away for a while is not news
                    // every interval.
                    if !failing {
                        warn!(group = %self.group, error = format!("{e:#}"), "cannot read the group's lag; the gauges keep their last values");
                        failing = true;
                    }
                }
            }
            while !stop.load(Ordering::Relaxed) && Instant::now() < next {
                std::thread::sleep(STOP_SLICE.min(next.saturating_duration_since(Instant::now())));
            }
        }
    }

    /// One round over every topic.
    fn rounds(&self) -> anyhow::Result<Vec<(&str, PartitionLag)>> {
        let mut rows = Vec::new();
        for topic in &self.topics {
            rows.extend(self.round(topic)?.into_iter().map(|r| (topic.as_str(), r)));
        }
        Ok(rows)
    }

    /// One round of `topic`: the committed offset and the end of every partition.
    fn round(&self, topic: &str) -> anyhow::Result<Vec<PartitionLag>> {
        let Some(n) = partition_count_if_exists(&self.consumer, topic, CALL_TIMEOUT)? else {
            return Ok(Vec::new());
        };
        // Committed first, ends second: an end read after the offsets is never below them.
        let committed = fetch_committed(&self.consumer, &partition_list(topic, 0..n), CALL_TIMEOUT)
            .with_context(|| format!("fetching the committed offsets of group {}", self.group))?;
        (0..n)
            .map(|p| {
                let offset = match committed.find_partition(topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => Some(o),
                    _ => None,
                };
                let marks = self
                    .consumer
                    .fetch_watermarks(topic, p, CALL_TIMEOUT)
                    .with_context(|| format!("fetching the watermarks of {topic}/{p}"))?;
                Ok(partition_lag(p, offset, marks))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_end_minus_committed_and_nothing_committed_counts_from_the_log_start() {
        let r = partition_lag(3, Some(40), (10, 55));
        assert_eq!((r.partition, r.committed, r.end, r.lag()), (3, 40, 55, 15));
        let r = partition_lag(0, None, (10, 55));
        assert_eq!((r.committed, r.lag()), (10, 45));
        // A committed offset past the end (the topic made again): no negative lag.
        let r = partition_lag(1, Some(70), (10, 55));
        assert_eq!(r.lag(), 0);
    }
}
