//! The latency reader of pipeline-bench: a read_committed consumer that tails the notifications
//! while paced ticks go in, and measures each notification's latency from its tick's append time
//! (`tick_ts`) to the moment it became visible to a committed reader.

use anyhow::{anyhow, bail};
use price_alerts::alert::Notification;
use price_alerts::kafka::read::{reader, Reader};
use price_alerts::kafka::{Isolation, KafkaConfig};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// How long the reader may take to connect and position itself on every partition.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Bound on each watermark query.
const WATERMARKS_TIMEOUT: Duration = Duration::from_secs(10);

/// A running latency reader on its own thread.
pub struct LatencyTail {
    /// Set by [`LatencyTail::finish`]: no more output is coming.
    stop: Arc<AtomicBool>,
    thread: JoinHandle<anyhow::Result<Vec<f64>>>,
}

impl LatencyTail {
    /// Starts tailing `topic` (of `partitions` partitions) from its current end, and returns once
    /// the reader has reached that end on every partition: from then on, every notification
    /// that becomes visible is read, and read as soon as it is visible. (A reader still
    /// connecting while the ticks go in would miss them, or see them late and report its own
    /// start-up as latency.)
    pub fn start(kafka: &KafkaConfig, topic: &str, partitions: i32) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = {
            let (kafka, topic, stop) = (kafka.clone(), topic.to_owned(), stop.clone());
            std::thread::spawn(move || {
                let reader = match Positioned::at_end(&kafka, &topic, partitions) {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(anyhow!("{e:#}")));
                        return Err(e);
                    }
                };
                let _ = ready_tx.send(Ok(()));
                reader.tail(&stop)
            })
        };
        match ready_rx.recv_timeout(START_TIMEOUT + WATERMARKS_TIMEOUT) {
            Ok(Ok(())) => Ok(LatencyTail { stop, thread }),
            Ok(Err(e)) => Err(e.context("starting the latency reader")),
            Err(_) => {
                stop.store(true, Ordering::Relaxed);
                bail!(
                    "the latency reader did not reach the end of {topic} within {START_TIMEOUT:?}"
                )
            }
        }
    }

    /// Call once every output is committed: reads the topic to its end and returns the latency of
    /// each notification read, in milliseconds.
    pub fn finish(self) -> anyhow::Result<Vec<f64>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow!("latency reader panicked"))?
    }
}

/// A read_committed reader assigned to every partition of a topic at known offsets.
struct Positioned {
    consumer: Reader,
    topic: String,
    /// Where the reader started, per partition: its position until it reads a record there.
    /// librdkafka reports no position for a partition it has read nothing from, so a partition
    /// that got no new notification would otherwise never count as read to its end.
    start: Vec<i64>,
    /// Latencies of notifications read while positioning (none unless output was still coming).
    early: Vec<f64>,
}

impl Positioned {
    /// Assigned at each partition's high watermark (explicit offsets, not `Offset::End`, so that
    /// the start is known), once the reader has seen every partition's end.
    fn at_end(kafka: &KafkaConfig, topic: &str, partitions: i32) -> anyhow::Result<Self> {
        let consumer = reader(kafka, Isolation::ReadCommitted)?;
        let mut start = Vec::new();
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            let (_, high) = consumer.fetch_watermarks(topic, p, WATERMARKS_TIMEOUT)?;
            start.push(high);
            tpl.add_partition_offset(topic, p, Offset::Offset(high))?;
        }
        consumer.assign(&tpl)?;
        let deadline = Instant::now() + START_TIMEOUT;
        let mut at_end = BTreeSet::new();
        let mut early = Vec::new();
        while (at_end.len() as i32) < partitions {
            if Instant::now() > deadline {
                bail!("only partitions {at_end:?} of {topic} reached their end");
            }
            match consumer.poll(Duration::from_millis(100)) {
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    at_end.insert(p);
                }
                // Appended after the watermarks were read: it counts.
                Some(Ok(m)) => early.push(latency_ms(&m)?),
                Some(Err(e)) => return Err(e.into()),
                None => {}
            }
        }
        Ok(Positioned {
            consumer,
            topic: topic.to_owned(),
            start,
            early,
        })
    }

    /// Reads until `stop` is set and every partition is read to its end; returns the latency of
    /// each notification in milliseconds.
    fn tail(mut self, stop: &AtomicBool) -> anyhow::Result<Vec<f64>> {
        let mut latencies = std::mem::take(&mut self.early);
        loop {
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => latencies.push(latency_ms(&m)?),
                Some(Err(KafkaError::PartitionEOF(_))) | None => {
                    // Done once told to stop and every partition's position is at its end (all
                    // output is committed by then, so the end is the high watermark).
                    if stop.load(Ordering::Relaxed) && self.caught_up()? {
                        return Ok(latencies);
                    }
                }
                Some(Err(e)) => return Err(e.into()),
            }
        }
    }

    fn caught_up(&self) -> anyhow::Result<bool> {
        let positions = self.consumer.position()?;
        for (p, &start) in (0..).zip(&self.start) {
            let (_, high) = self
                .consumer
                .fetch_watermarks(&self.topic, p, WATERMARKS_TIMEOUT)?;
            let at = match positions.find_partition(&self.topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                // Nothing read from this partition yet.
                _ => start,
            };
            if at < high {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// From the append of a notification's tick (`tick_ts`) to now, in milliseconds.
fn latency_ms(m: &BorrowedMessage<'_>) -> anyhow::Result<f64> {
    let seen = now_ms();
    let n: Notification = serde_json::from_slice(m.payload().unwrap_or_default())?;
    let appended = OffsetDateTime::parse(&n.tick_ts, &Rfc3339)?.unix_timestamp_nanos() as f64 / 1e6;
    Ok(seen - appended)
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}
