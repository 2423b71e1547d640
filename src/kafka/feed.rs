//! The tick feed: writing ticks to the input topic, as an upstream producer would. The demo, the
//! generator, the benchmarks and the tests load their input with it.
//!
//! A [`Feed`] is an idempotent, non-transactional producer and waits for every delivery, so the
//! caller knows where each tick landed and can compute the offsets a processor must commit.

use super::config::KafkaConfig;
use super::logging::Logged;
use crate::tick::{encode, Tick};
use anyhow::{anyhow, Context as _};
use futures::future::join_all;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const LOAD_CHUNK: usize = 20_000;

/// Where one loaded record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landed {
    pub partition: i32,
    pub offset: i64,
}

/// An upstream feed: one idempotent producer, reused for every batch.
pub struct Feed {
    producer: FutureProducer<Logged>,
}

impl Feed {
    pub fn new(kafka: &KafkaConfig) -> anyhow::Result<Self> {
        let producer = kafka
            .idempotent_producer()
            .create_with_context(Logged)
            .context("creating the tick feed")?;
        Ok(Feed { producer })
    }

    /// Produces raw (key, value) records and waits for all of them; returns where each landed.
    pub fn send_raw(
        &self,
        topic: &str,
        records: &[(Option<Vec<u8>>, Vec<u8>)],
    ) -> anyhow::Result<Vec<Landed>> {
        let mut landed = Vec::with_capacity(records.len());
        // Chunks stay well below librdkafka's local queue (100,000 messages by default), so a send
        // never waits for room, which would need an async runtime's timer.
        for chunk in records.chunks(LOAD_CHUNK) {
            let futures = chunk.iter().map(|(k, v)| {
                let mut r = FutureRecord::<[u8], [u8]>::to(topic).payload(v.as_slice());
                if let Some(k) = k {
                    r = r.key(k.as_slice());
                }
                self.producer
                    .send(r, Timeout::After(Duration::from_secs(30)))
            });
            for r in futures::executor::block_on(join_all(futures)) {
                let d = r.map_err(|(e, _)| {
                    anyhow!(e).context(format!("loading a record into {topic}"))
                })?;
                landed.push(Landed {
                    partition: d.partition,
                    offset: d.offset,
                });
            }
        }
        Ok(landed)
    }

    /// Produces ticks keyed by symbol and waits for all of them.
    pub fn send_ticks(&self, topic: &str, ticks: &[Tick]) -> anyhow::Result<Vec<Landed>> {
        let records: Vec<_> = ticks
            .iter()
            .map(|t| (Some(t.symbol.as_bytes().to_vec()), encode(t)))
            .collect();
        self.send_raw(topic, &records)
    }

    /// Produces ticks at most `per_second` a second (0: all at once): one-second slices, each
    /// sent and acknowledged, then a wait for the next second.
    pub fn send_ticks_at_rate(
        &self,
        topic: &str,
        ticks: &[Tick],
        per_second: u64,
    ) -> anyhow::Result<Vec<Landed>> {
        if per_second == 0 {
            return self.send_ticks(topic, ticks);
        }
        let started = Instant::now();
        let mut landed = Vec::with_capacity(ticks.len());
        for (i, slice) in ticks.chunks(per_second as usize).enumerate() {
            landed.extend(self.send_ticks(topic, slice)?);
            let next = started + Duration::from_secs(i as u64 + 1);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        Ok(landed)
    }
}

/// Produces raw records with a one-off feed.
pub fn produce_raw(
    kafka: &KafkaConfig,
    topic: &str,
    records: &[(Option<Vec<u8>>, Vec<u8>)],
) -> anyhow::Result<Vec<Landed>> {
    Feed::new(kafka)?.send_raw(topic, records)
}

/// Produces ticks with a one-off feed.
pub fn produce_ticks(
    kafka: &KafkaConfig,
    topic: &str,
    ticks: &[Tick],
) -> anyhow::Result<Vec<Landed>> {
    Feed::new(kafka)?.send_ticks(topic, ticks)
}

/// The next offset after the last record landed in each partition (what a consumer that processed
/// all of them commits).
pub fn next_offsets(landed: &[Landed]) -> BTreeMap<i32, i64> {
    let mut out = BTreeMap::new();
    for l in landed {
        let e = out.entry(l.partition).or_insert(0);
        *e = (*e).max(l.offset + 1);
    }
    out
}
