//! The DLQ backlog watcher: how many dead letters are still unhandled and how old the oldest one
//! is, as the gauges `alerts_dlq_unhandled` and `alerts_dlq_oldest_unhandled_age_seconds`
//! ([`crate::metrics::dlq_unhandled`]).
//!
//! Two readers (read_committed, no group, nothing committed) tail the DLQ and its replay ledger
//! from the beginning, incrementally; a [`Backlog`] keeps the unhandled dead letters with their
//! timestamps in memory; every interval the gauges are set from it. The count is of records and
//! exact: a dead letter is unhandled until its ledger entry arrives, whichever reader is ahead.
//! The gauges are first set once both readers have reached their end, so a half-read DLQ is never
//! reported.
//!
//! # Cost
//! DLQ volume is low. The readers keep a small prefetch queue and librdkafka's default long poll,
//! so an idle watcher costs two fetches a second per broker. Memory is bounded: at most
//! [`MAX_TRACKED`] unhandled dead letters are tracked (tens of bytes each); past that, more are
//! counted but not tracked, and the count becomes an upper bound (their replays cannot be told
//! apart) until the process restarts; a warning says so. Dead letters that retention removed are
//! forgotten: the DLQ's low watermarks are read every interval.
//!
//! # Errors
//! The watcher never stops the pipeline. A topic that does not exist yet (no dead letter, no
//! replay) counts as empty and is looked for again every interval; read errors are logged once per
//! interval and retried by librdkafka.

use super::ledger::{self, same_letter};
use crate::background::Background;
use crate::kafka::logging::Logged;
use crate::kafka::read::{partition_count_if_exists, Reader};
use crate::kafka::tpl::position_list;
use crate::kafka::{Isolation, KafkaConfig};
use anyhow::Context as _;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message, Offset};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Most unhandled dead letters tracked one by one.
pub const MAX_TRACKED: usize = 100_000;

/// Records taken from one reader before the other gets its turn.
const DRAIN: usize = 1_000;

/// Longest wait in a poll: bounds how late a stop or a refresh is noticed.
const POLL_SLICE: Duration = Duration::from_millis(100);

/// Bound on one metadata or watermark request.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// The unhandled dead letters of one DLQ, from the dead letters and ledger entries seen so far.
#[derive(Debug)]
pub struct Backlog {
    cap: usize,
    /// Unhandled dead letters: (partition, offset) with the record timestamp (ms).
    unhandled: HashMap<(i32, i64), Option<i64>>,
    /// Ledger entries of dead letters the DLQ reader has not reached yet.
    ahead: HashMap<(i32, i64), Option<i64>>,
    /// Next DLQ offset to read, per partition: what is behind it has been seen.
    next: HashMap<i32, i64>,
    /// Unhandled dead letters past the cap: counted, not tracked.
    untracked: u64,
}

impl Backlog {
    /// An empty backlog that tracks at most `cap` dead letters (and as many ledger entries ahead).
    pub fn new(cap: usize) -> Self {
        Backlog {
            cap,
            unhandled: HashMap::new(),
            ahead: HashMap::new(),
            next: HashMap::new(),
            untracked: 0,
        }
    }

    /// The DLQ reader met a dead letter.
    pub fn dead_letter(&mut self, partition: i32, offset: i64, timestamp: Option<i64>) {
        let next = self.next.entry(partition).or_insert(0);
        *next = (*next).max(offset + 1);
        if self
            .ahead
            .remove(&(partition, offset))
            .is_some_and(|entry| same_letter(entry, timestamp))
        {
            return;
        }
        if self.unhandled.len() >= self.cap {
            if self.untracked == 0 {
                warn!(cap = self.cap, "more unhandled dead letters than the watcher tracks; the DLQ count is an upper bound from now on");
            }
            self.untracked += 1;
            return;
        }
        self.unhandled.insert((partition, offset), timestamp);
    }

    /// The ledger reader met the entry of a replayed dead letter.
    pub fn replayed(&mut self, partition: i32, offset: i64, timestamp: Option<i64>) {
        match self.unhandled.get(&(partition, offset)) {
            Some(&t) if same_letter(timestamp, t) => {
                self.unhandled.remove(&(partition, offset));
            }
            // Not read yet: remember it for when it comes. Behind the reader and not tracked: a
            // dead letter handled before, removed by retention, or past the cap.
            _ if offset >= self.next.get(&partition).copied().unwrap_or(0)
                && self.ahead.len() < self.cap =>
            {
                self.ahead.insert((partition, offset), timestamp);
            }
            _ => {}
        }
    }

    /// Retention removed the dead letters of `partition` below `low`: forget them.
    pub fn forget_before(&mut self, partition: i32, low: i64) {
        self.unhandled
            .retain(|&(p, o), _| p != partition || o >= low);
        self.ahead.retain(|&(p, o), _| p != partition || o >= low);
        let next = self.next.entry(partition).or_insert(0);
        *next = (*next).max(low);
    }

    /// Unhandled dead letters (an upper bound once more than the cap were seen).
    pub fn count(&self) -> u64 {
        self.unhandled.len() as u64 + self.untracked
    }

    /// Timestamp (ms) of the oldest tracked unhandled dead letter.
    pub fn oldest(&self) -> Option<i64> {
        self.unhandled.values().flatten().min().copied()
    }
}

/// A running watcher; dropping it stops the watcher and waits for its readers to be dropped
/// (bounded, see [`crate::background`]).
pub struct Watcher {
    _thread: Background,
}

impl Watcher {
    /// Watches `dlq` on a thread of its own, setting the gauges every `every`.
    pub fn spawn(kafka: KafkaConfig, dlq: String, every: Duration) -> anyhow::Result<Watcher> {
        Self::spawn_reporting(kafka, dlq, every, |_, age, count| {
            crate::metrics::dlq_unhandled(age, count)
        })
    }

    /// Watches `dlq` like [`Watcher::spawn`], handing (topic, oldest age, count) to `report`
    /// instead of the pipeline's gauges (alert-deliver reports its DLQ and parking lot by topic).
    pub fn spawn_reporting(
        kafka: KafkaConfig,
        dlq: String,
        every: Duration,
        report: Report,
    ) -> anyhow::Result<Watcher> {
        let thread = Background::spawn("dlq-watch", move |stop| {
            if let Err(e) = watch(&kafka, &dlq, every, stop, report) {
                warn!(
                    dlq,
                    error = format!("{e:#}"),
                    "the DLQ backlog watcher stopped; its gauges are no longer updated"
                );
            }
        })
        .context("starting the DLQ backlog watcher")?;
        Ok(Watcher { _thread: thread })
    }
}

/// Where a watcher's figures go: (topic, age of the oldest unhandled record, unhandled count).
pub type Report = fn(&str, Duration, u64);

/// Tails `dlq` and its ledger until `stop`, reporting the backlog every `every`. Blocking.
pub fn watch(
    kafka: &KafkaConfig,
    dlq: &str,
    every: Duration,
    stop: &AtomicBool,
    report: Report,
) -> anyhow::Result<()> {
    let mut letters = Tail::new(kafka, dlq)?;
    let mut entries = Tail::new(kafka, &ledger::topic(dlq))?;
    let mut backlog = Backlog::new(MAX_TRACKED);
    let mut refresh_at = Instant::now();
    let mut reported = false;
    // Nothing came last round: wait a little in the polls instead of spinning.
    let mut wait = Duration::ZERO;
    info!(dlq, every = ?every, "watching the DLQ backlog");
    while !stop.load(Ordering::Relaxed) {
        // Also as soon as the first catch-up is done, not an interval later.
        let first = !reported && letters.caught_up() && entries.caught_up();
        if first || Instant::now() >= refresh_at {
            for (partition, low) in letters.refresh() {
                backlog.forget_before(partition, low);
            }
            entries.refresh();
            if letters.caught_up() && entries.caught_up() {
                let age = backlog.oldest().map_or(Duration::ZERO, |ts| {
                    Duration::from_millis((now_ms() - ts).max(0) as u64)
                });
                report(dlq, age, backlog.count());
                if !reported {
                    info!(dlq, unhandled = backlog.count(), oldest_age = ?age, "DLQ backlog read");
                    reported = true;
                }
                debug!(dlq, unhandled = backlog.count(), oldest_age = ?age, "DLQ backlog");
            }
            refresh_at = Instant::now() + every;
        }
        let got = letters.drain(wait, |m| {
            backlog.dead_letter(m.partition(), m.offset(), m.timestamp().to_millis())
        }) + entries.drain(wait, |m| {
            if let Some((partition, offset, timestamp)) = ledger::decode(m, dlq) {
                backlog.replayed(partition, offset, timestamp);
            }
        });
        wait = if got == 0 {
            POLL_SLICE / 2
        } else {
            Duration::ZERO
        };
    }
    Ok(())
}

/// A reader that follows every partition of one topic from the beginning, taking in partitions as
/// they appear.
struct Tail {
    consumer: Reader,
    topic: String,
    /// Partitions assigned so far.
    partitions: i32,
    /// Whether the topic's existence has been asked once (a missing topic counts as read).
    looked: bool,
    /// Partitions that have not reached their end yet.
    pending: BTreeSet<i32>,
    /// Read errors since the last refresh, and the last one.
    errors: u64,
    last_error: Option<KafkaError>,
}

impl Tail {
    fn new(kafka: &KafkaConfig, topic: &str) -> anyhow::Result<Self> {
        let mut cfg = kafka.reader(Isolation::ReadCommitted);
        // Tailing, not racing to an end: librdkafka's default long poll (500 ms) keeps an idle
        // watcher to two fetches a second, where the readers' 20 ms would make fifty.
        cfg.set("fetch.wait.max.ms", "500");
        // Keep memory small: dead letters are few, a big prefetch buys nothing here.
        cfg.set("queued.max.messages.kbytes", "1024");
        let consumer: Reader = cfg
            .create_with_context(Logged)
            .context("creating a DLQ watcher reader")?;
        Ok(Tail {
            consumer,
            topic: topic.to_owned(),
            partitions: 0,
            looked: false,
            pending: BTreeSet::new(),
            errors: 0,
            last_error: None,
        })
    }

    /// Takes in new partitions, reports the errors of the last interval, and returns each
    /// partition's low watermark (where retention has removed records below).
    fn refresh(&mut self) -> Vec<(i32, i64)> {
        if let Some(e) = self.last_error.take() {
            warn!(topic = %self.topic, errors = self.errors, error = %e, "errors while watching the DLQ backlog; retrying");
            self.errors = 0;
        }
        match partition_count_if_exists(&self.consumer, &self.topic, METADATA_TIMEOUT) {
            Ok(count) => {
                self.looked = true;
                let count = count.unwrap_or(0);
                if count > self.partitions {
                    let new = position_list(
                        &self.topic,
                        (self.partitions..count).map(|p| (p, Offset::Beginning)),
                    );
                    match new.map(|tpl| self.consumer.incremental_assign(&tpl)) {
                        Ok(Ok(())) => {
                            self.pending.extend(self.partitions..count);
                            self.partitions = count;
                        }
                        Ok(Err(e)) | Err(e) => {
                            warn!(topic = %self.topic, error = %e, "cannot assign the watcher's partitions")
                        }
                    }
                }
            }
            Err(e) => {
                debug!(topic = %self.topic, error = format!("{e:#}"), "no metadata for the watcher yet")
            }
        }
        (0..self.partitions)
            .filter_map(|p| {
                self.consumer
                    .fetch_watermarks(&self.topic, p, METADATA_TIMEOUT)
                    .ok()
                    .map(|(low, _)| (p, low))
            })
            .collect()
    }

    /// Whether every partition has been read to its end once.
    fn caught_up(&self) -> bool {
        self.looked && self.pending.is_empty()
    }

    /// Hands out up to [`DRAIN`] records, waiting at most `wait` for the first; returns how many.
    fn drain(&mut self, wait: Duration, mut f: impl FnMut(&BorrowedMessage<'_>)) -> usize {
        let mut n = 0;
        for i in 0..DRAIN {
            match self
                .consumer
                .poll(if i == 0 { wait } else { Duration::ZERO })
            {
                None => break,
                Some(Ok(m)) => {
                    f(&m);
                    n += 1;
                }
                Some(Err(e)) => self.event(e),
            }
        }
        n
    }

    fn event(&mut self, e: KafkaError) {
        match e {
            KafkaError::PartitionEOF(p) => {
                self.pending.remove(&p);
            }
            e if crate::kafka::read::is_nominal_group_refused(&e) => {}
            e => {
                self.errors += 1;
                self.last_error = Some(e);
            }
        }
    }
}

/// Milliseconds since the epoch, now (the ages of dead letters are measured against it).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_is_unhandled_until_its_entry_comes_whichever_comes_first() {
        let mut b = Backlog::new(10);
        b.dead_letter(0, 0, Some(100));
        b.dead_letter(0, 1, Some(200));
        b.dead_letter(1, 0, Some(50));
        assert_eq!((b.count(), b.oldest()), (3, Some(50)));
        b.replayed(1, 0, Some(50));
        assert_eq!((b.count(), b.oldest()), (2, Some(100)));
        // The ledger reader ahead of the DLQ reader.
        b.replayed(0, 2, Some(300));
        b.dead_letter(0, 2, Some(300));
        assert_eq!(b.count(), 2);
        b.replayed(0, 0, Some(100));
        b.replayed(0, 1, Some(200));
        assert_eq!((b.count(), b.oldest()), (0, None));
    }

    #[test]
    fn an_entry_of_an_earlier_dlq_of_the_same_name_does_not_count() {
        let mut b = Backlog::new(10);
        b.replayed(0, 0, Some(1));
        b.dead_letter(0, 0, Some(2));
        assert_eq!(b.count(), 1);
        b.replayed(0, 0, Some(1));
        assert_eq!(b.count(), 1);
        b.replayed(0, 0, Some(2));
        assert_eq!(b.count(), 0);
    }

    #[test]
    fn retention_and_the_cap_bound_memory() {
        let mut b = Backlog::new(2);
        for o in 0..4 {
            b.dead_letter(0, o, Some(o));
        }
        assert_eq!(b.count(), 4, "past the cap still counted");
        assert_eq!(b.unhandled.len(), 2);
        b.replayed(0, 9, None);
        b.forget_before(0, 1);
        assert_eq!(b.unhandled.len(), 1, "offset 0 was removed by retention");
        assert_eq!(b.oldest(), Some(1));
        b.forget_before(0, 10);
        assert!(b.ahead.is_empty() && b.unhandled.is_empty());
    }
}
