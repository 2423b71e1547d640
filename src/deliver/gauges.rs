//! The ends of the retry buckets, read beside the loop for the bucket gauges
//! (`alerts_deliver_bucket_lag`).
//!
//! A bucket's lag is its end minus where the deliverer stands in it (the held head of a paused
//! partition, else the position). The position is the consumer's own and costs nothing; the end
//! is a broker round trip per partition. Asked in line, every 5 s, those round trips stopped the
//! poll loop for about 370 ms (3 buckets x 6 partitions, each bounded by 100 ms), and every
//! notification that became visible meanwhile waited that long: the p99 of a paced delivery run
//! (bench/RESULTS.md, section 12.2). So a thread of its own, with a client of its own, reads them;
//! the loop only reads what it found last.
//!
//! librdkafka's cached watermarks (`rd_kafka_get_watermark_offsets`) would cost nothing either,
//! but they come with fetches, and a held partition is paused: its cached end would stay where it
//! was when it paused, and its lag would miss what arrived since.
//!
//! # Errors
//! The thread never stops the deliverer. Each request has a deadline ([`CALL_TIMEOUT`]); an end
//! not read in a round keeps its last value, and the first failure of a streak is logged.

use crate::background::Background;
use crate::kafka::config::{Isolation, KafkaConfig};
use crate::kafka::read::{partition_count_if_exists, reader, Reader};
use anyhow::Context as _;
use rdkafka::consumer::Consumer;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tracing::{debug, info};

/// Bound on each broker request of a round.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest sleep between checks of the stop flag.
const STOP_SLICE: Duration = Duration::from_millis(100);

type Found = BTreeMap<(String, i32), i64>;

/// The last ends read of every partition of some topics, refreshed on a thread of its own.
pub struct BucketEnds {
    found: Arc<Mutex<Found>>,
    _thread: Background,
}

impl BucketEnds {
    /// Reads the end of every partition of `topics` every `every`, read_committed as the
    /// deliverer reads them (the end is the last stable offset: what its position can reach).
    pub fn spawn(
        kafka: &KafkaConfig,
        topics: Vec<String>,
        every: Duration,
    ) -> anyhow::Result<Self> {
        let probe = reader(kafka, Isolation::ReadCommitted)?;
        let found = Arc::new(Mutex::new(Found::new()));
        let shared = Arc::clone(&found);
        let thread = Background::spawn("bucket-ends", move |stop| {
            watch(&probe, &topics, every, &shared, stop)
        })
        .context("starting the bucket ends reader")?;
        Ok(BucketEnds {
            found,
            _thread: thread,
        })
    }

    /// The last end read of `topic` [`partition`], if one was.
    pub fn end(&self, topic: &str, partition: i32) -> Option<i64> {
        let found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        found.get(&(topic.to_owned(), partition)).copied()
    }
}

/// Rounds every `every` until `stop`. Blocking.
fn watch(
    probe: &Reader,
    topics: &[String],
    every: Duration,
    found: &Mutex<Found>,
    stop: &AtomicBool,
) {
    let mut failing = false;
    while !stop.load(Ordering::Relaxed) {
        let next = Instant::now() + every;
        let mut failed = None;
        for topic in topics {
            let (ends, error) = round(probe, topic, stop);
            found
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(ends.into_iter().map(|(p, end)| ((topic.clone(), p), end)));
            failed = failed.or(error);
        }
        match failed {
            Some(error) if !failing => {
                info!(%error, "cannot read a retry bucket's end; its lag gauge keeps its last value");
                failing = true;
            }
            Some(_) => {}
            None if failing => {
                debug!("the retry buckets' ends are readable again");
                failing = false;
            }
            None => {}
        }
        while !stop.load(Ordering::Relaxed) && Instant::now() < next {
            std::thread::sleep(STOP_SLICE.min(next.saturating_duration_since(Instant::now())));
        }
    }
}

/// The ends of `topic`'s partitions that could be read, and the first error, if any (the other
/// partitions' ends still count: only those that failed keep their last value).
fn round(probe: &Reader, topic: &str, stop: &AtomicBool) -> (Vec<(i32, i64)>, Option<String>) {
    let n = match partition_count_if_exists(probe, topic, CALL_TIMEOUT) {
        Ok(Some(n)) => n,
        Ok(None) => return (Vec::new(), None),
        Err(e) => {
            return (
                Vec::new(),
                Some(format!("the partitions of {topic}: {e:#}")),
            )
        }
    };
    let mut ends = Vec::new();
    let mut error = None;
    for p in 0..n {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        match probe.fetch_watermarks(topic, p, CALL_TIMEOUT) {
            Ok((_, high)) => ends.push((p, high)),
            Err(e) => {
                error.get_or_insert_with(|| format!("the end of {topic} [{p}]: {e}"));
            }
        }
    }
    (ends, error)
}
