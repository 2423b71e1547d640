//! The reference deliverer (`deliver-bench reference`): a plain at-most-once loop with alert-deliver's
//! own HTTP client ([`price_alerts::deliver::http::client`] and [`post`]) and its bound per
//! subscriber (`max_in_flight`). It reads the notifications read_committed from the beginning of
//! every partition and POSTs each to each subscriber with the same `Idempotency-Key`; it has no
//! buckets, no transactions, no breaker, commits nothing and never retries: what is left of a
//! deliverer without its guarantees. It runs as a child process, as alert-deliver does, so the two
//! are measured alike, and stops when it is killed.

use anyhow::Context as _;
use price_alerts::deliver::http::{client, post};
use price_alerts::kafka::read::reader;
use price_alerts::kafka::tpl::position_list;
use price_alerts::kafka::{Isolation, KafkaConfig};
use rdkafka::consumer::Consumer as _;
use rdkafka::message::Message as _;
use rdkafka::Offset;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// What the reference runs with.
pub struct Reference {
    pub kafka: KafkaConfig,
    pub topic: String,
    pub partitions: i32,
    /// (name, URL) of each subscriber; every notification goes to each.
    pub subscribers: Vec<(String, reqwest::Url)>,
    pub max_in_flight: usize,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
}

#[derive(serde::Deserialize)]
struct Id {
    id: String,
}

/// Runs until the process is killed (or the reader fails).
pub fn run(r: Reference) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let http = client(r.connect_timeout, r.request_timeout)?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4096);
    let consumer = reader(&r.kafka, Isolation::ReadCommitted)?;
    consumer
        .assign(&position_list(
            &r.topic,
            (0..r.partitions).map(|p| (p, Offset::Beginning)),
        )?)
        .context("assigning the notifications")?;
    let reading = std::thread::spawn(move || -> anyhow::Result<()> {
        loop {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    if let Some(p) = m.payload() {
                        if tx.blocking_send(p.to_vec()).is_err() {
                            return Ok(());
                        }
                    }
                }
                Some(Err(e)) => eprintln!("deliver-bench reference: reading: {e}"),
                None => {}
            }
        }
    });
    runtime.block_on(async move {
        let bounds: Vec<Arc<Semaphore>> = r
            .subscribers
            .iter()
            .map(|_| Arc::new(Semaphore::new(r.max_in_flight)))
            .collect();
        while let Some(payload) = rx.recv().await {
            let Ok(Id { id }) = serde_json::from_slice::<Id>(&payload) else {
                eprintln!("deliver-bench reference: a record without an id, skipped");
                continue;
            };
            for ((name, url), bound) in r.subscribers.iter().zip(&bounds) {
                let permit = bound.clone().acquire_owned().await?;
                let (http, url, key, body) = (
                    http.clone(),
                    url.clone(),
                    format!("{id}/{name}"),
                    payload.clone(),
                );
                tokio::spawn(async move {
                    let _ = post(&http, &url, &key, body).await;
                    drop(permit);
                });
            }
        }
        anyhow::Ok(())
    })?;
    reading
        .join()
        .map_err(|_| anyhow::anyhow!("the reader thread panicked"))?
}
