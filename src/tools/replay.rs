//! Replaying dead letters: once the cause of a failure is fixed, put the dead-lettered ticks back
//! on their source topic, exactly once.
//!
//! The replay is a transactional copy: the DLQ is read read_committed with a consumer group of
//! its own, and each batch of copies is committed in one transaction together with that group's
//! offsets on the DLQ. Running the replay twice therefore replays nothing twice, and a replay that
//! crashes half-way resumes where its last transaction ended.
//!
//! A replayed record keeps the original key, value and headers; the `dlq.*` headers are dropped
//! and `replay.origin` (`dlq-topic/partition/offset`) is added, so a record that fails again can
//! be traced to its earlier dead letter. Records whose class does not match the filter are passed
//! over, and the group's offsets move past them too: a replay group answers "which dead letters
//! have been handled", so use one group per purpose (`--group`).
//!
//! Replayed ticks go through the pipeline like any other: one whose seq is no longer newer than
//! its symbol's state is stale and only counted, which is right for late price data.

use crate::dlq::{copy_headers, header};
use crate::kafka::config::DEFAULT_TRANSACTION_TIMEOUT;
use crate::kafka::offsets::{committed_positions, position_list};
use crate::kafka::logging::Logged;
use crate::kafka::read::{partition_count, Reader};
use crate::kafka::{Isolation, KafkaConfig};
use crate::pipeline::producer::TxnProducer;
use anyhow::{anyhow, bail, Context as _};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header};
use rdkafka::producer::BaseRecord;
use rdkafka::{Message, Offset};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tracing::info;

/// Records copied per transaction.
const BATCH: usize = 500;
/// Bound on reaching the end of the DLQ.
const TIMEOUT: Duration = Duration::from_secs(120);

/// What to replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub kafka: KafkaConfig,
    /// The dead-letter topic.
    pub dlq: String,
    /// Consumer group whose committed offsets on the DLQ say what has been handled.
    pub group: String,
    /// Classes to replay (`poison`, `permanent.bad_decimal`, or a prefix ending in `*`, e.g.
    /// `permanent.*`); empty for every class.
    pub classes: Vec<String>,
    /// Target topic; default: each record's `dlq.original.topic`.
    pub to: Option<String>,
    /// Count what would be replayed; produce and commit nothing.
    pub dry_run: bool,
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Dead letters read, per class.
    pub read: BTreeMap<String, u64>,
    /// Dead letters replayed (or, in a dry run, that would be), per class.
    pub replayed: BTreeMap<String, u64>,
    pub transactions: u64,
}

impl ReplayReport {
    pub fn total_replayed(&self) -> u64 {
        self.replayed.values().sum()
    }
}

/// Whether `class` matches one of `filters` (all classes when there is none).
pub fn class_matches(filters: &[String], class: &str) -> bool {
    filters.is_empty()
        || filters.iter().any(|f| match f.strip_suffix('*') {
            Some(prefix) => class.starts_with(prefix),
            None => f == class,
        })
}

/// Replays the DLQ from the group's committed offsets to its end. Blocking.
pub fn replay(opts: &ReplayOptions) -> anyhow::Result<ReplayReport> {
    let mut cfg = opts.kafka.reader(Isolation::ReadCommitted);
    cfg.set("group.id", &opts.group);
    let consumer: Reader = cfg.create_with_context(Logged).context("creating the DLQ reader")?;
    let partitions = partition_count(&consumer, &opts.dlq, TIMEOUT)?;
    let all: Vec<i32> = (0..partitions).collect();
    let start = committed_positions(&consumer, &opts.dlq, &all, TIMEOUT).context("reading the replay group's offsets")?;
    consumer.assign(&start)?;

    let producer = if opts.dry_run {
        None
    } else {
        let txn_id = format!("{}-replay", opts.group);
        let cfg = opts.kafka.transactional_producer(&txn_id, DEFAULT_TRANSACTION_TIMEOUT)?;
        Some(TxnProducer::new(&cfg).context("starting the replay producer")?)
    };
    let group = consumer.group_metadata().ok_or_else(|| anyhow!("the DLQ reader has no group metadata"))?;

    let mut report = ReplayReport::default();
    let mut pending: BTreeSet<i32> = (0..partitions).collect();
    let mut offsets: BTreeMap<i32, i64> = BTreeMap::new();
    let mut in_txn = 0usize;
    let deadline = Instant::now() + TIMEOUT;
    while !pending.is_empty() {
        if Instant::now() > deadline {
            bail!("the DLQ {} was not read to its end within {TIMEOUT:?}", opts.dlq);
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                pending.remove(&p);
            }
            Some(Err(e)) => return Err(anyhow!(e).context(format!("reading {}", opts.dlq))),
            Some(Ok(m)) => {
                let class = header(&m, "dlq.error.class").unwrap_or("unknown").to_owned();
                *report.read.entry(class.clone()).or_default() += 1;
                offsets.insert(m.partition(), m.offset() + 1);
                if !class_matches(&opts.classes, &class) {
                    continue;
                }
                *report.replayed.entry(class).or_default() += 1;
                let Some(producer) = &producer else { continue };
                if in_txn == 0 {
                    producer.begin()?;
                }
                copy(producer, &m, opts.to.as_deref())?;
                in_txn += 1;
                if in_txn >= BATCH {
                    commit(producer, &opts.dlq, &offsets, &group)?;
                    report.transactions += 1;
                    in_txn = 0;
                    offsets.clear();
                }
            }
        }
    }
    if let Some(producer) = &producer {
        if !offsets.is_empty() {
            // Also a batch of passed-over records only: their offsets must move too.
            if in_txn == 0 {
                producer.begin()?;
            }
            commit(producer, &opts.dlq, &offsets, &group)?;
            report.transactions += 1;
        }
    }
    info!(dlq = %opts.dlq, ?report, "replay done");
    Ok(report)
}

/// Copies one dead letter back: original key, value and headers, without `dlq.*`, plus
/// `replay.origin`.
fn copy(producer: &TxnProducer, m: &BorrowedMessage<'_>, to: Option<&str>) -> anyhow::Result<()> {
    let target = match to {
        Some(t) => t,
        None => header(m, "dlq.original.topic")
            .ok_or_else(|| anyhow!("{}/{} offset {} has no dlq.original.topic", m.topic(), m.partition(), m.offset()))?,
    };
    let origin = format!("{}/{}/{}", m.topic(), m.partition(), m.offset());
    let headers = copy_headers(m, |key| !key.starts_with("dlq."))
        .insert(Header { key: "replay.origin", value: Some(origin.as_str()) });
    let mut record = BaseRecord::to(target).headers(headers);
    if let Some(k) = m.key() {
        record = record.key(k);
    }
    if let Some(v) = m.payload() {
        record = record.payload(v);
    }
    producer.send(record).map_err(|e| anyhow!(e).context(format!("replaying {origin} to {target}")))
}

fn commit(
    producer: &TxnProducer,
    dlq: &str,
    offsets: &BTreeMap<i32, i64>,
    group: &rdkafka::consumer::ConsumerGroupMetadata,
) -> anyhow::Result<()> {
    let tpl = position_list(dlq, offsets.iter().map(|(&p, &o)| (p, Offset::Offset(o))))?;
    // A replay is a short batch job: any transactional error ends it, and a rerun resumes at
    // the last committed batch.
    producer.send_offsets(&tpl, group)?;
    producer.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_filters() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(class_matches(&[], "poison"));
        assert!(class_matches(&f(&["poison"]), "poison"));
        assert!(!class_matches(&f(&["poison"]), "permanent.not_json"));
        assert!(class_matches(&f(&["permanent.*"]), "permanent.not_json"));
        assert!(!class_matches(&f(&["permanent.*"]), "transient.exhausted"));
        assert!(class_matches(&f(&["transient.exhausted", "poison"]), "poison"));
    }
}
