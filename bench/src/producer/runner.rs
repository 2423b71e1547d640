//! One measured run: one mode, one record size, one fresh topic, one fresh producer.
//!
//! ```text
//!   create producer (init_transactions) ─► warm-up (acked / committed, untimed)
//!     ─► t0 ─► send, send, ... (commit every interval) ─► flush / last commit ─► t1
//! ```
//!
//! # What is counted
//! The producer's queue is kept full: records are enqueued without waiting for any of them
//! ([`TxnProducer::send`] only waits when librdkafka's local queue is full), so throughput is the
//! client's and broker's, not a round trip per record.
//! - plain and idempotent: a record counts once its delivery succeeded. After the final flush,
//!   every record has had its delivery report (librdkafka's flush returns when no message is left,
//!   and a message is freed only after its report has been handled), so
//!   `counted = sent - delivery failures`.
//! - transactional: a record counts only when the transaction holding it committed. A failed
//!   delivery makes the commit fail (abortable): that transaction is aborted and none of its
//!   records count. The commit time is inside the measured time, and the last commit is too.
//!
//! The same producer type and send path as the pipeline ([`TxnProducer`]) is used in every mode,
//! so the modes differ only in their configuration and the commits.
//!
//! # Waiting for the outstanding records
//! [`TxnProducer::flush`] and [`TxnProducer::commit`] wait for outstanding records in 1 ms steps
//! (rust-rdkafka's own flush waits in 100 ms steps; see `price_alerts::pipeline::producer`), so a commit costs what
//! librdkafka and the broker cost. That time is inside the measured time and inside the commit
//! latency, as with Java's `commitTransaction`, which flushes too.

use super::mode::Mode;
use super::options::Limit;
use crate::stats;
use anyhow::{anyhow, Context as _};
use price_alerts::kafka::KafkaConfig;
use price_alerts::pipeline::producer::{TxnErrorClass, TxnProducer};
use rdkafka::producer::BaseRecord;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Bound on the final flush of a non-transactional run: librdkafka's message.timeout.ms (300 s by
/// default) bounds each record, this only keeps a wedged run from hanging forever.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(600);

/// How many sends between two looks at the stop flag.
const STOP_CHECK_EVERY: u64 = 1024;

/// What one run does.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub mode: Mode,
    /// Value size in bytes (records have no key, as ProducerPerformance's).
    pub size: usize,
    /// A fresh topic, created beforehand.
    pub topic: String,
    pub limit: Limit,
    /// Warm-up records sent before timing starts.
    pub warmup: u64,
    /// transactional.id of the transactional mode (fresh per run).
    pub transactional_id: String,
    /// Which repeat of this configuration (0-based).
    pub repeat: u32,
    /// Position in the interleaved schedule (0-based).
    pub sequence: usize,
}

/// The figures of one run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunResult {
    /// `plain`, `idempotent`, `txn-100ms`.
    pub mode: String,
    /// The commit interval of a transactional mode, in milliseconds.
    pub commit_interval_ms: Option<u64>,
    pub record_size: usize,
    /// Which repeat of this configuration (0-based).
    pub repeat: u32,
    /// Position of the run in the interleaved schedule (0-based).
    pub sequence: usize,
    pub topic: String,
    /// Warm-up records acknowledged (or committed): they are in the topic too.
    pub warmup_records: u64,
    /// Measured records enqueued.
    pub sent: u64,
    /// Measured records acknowledged (plain, idempotent) or committed (transactional).
    pub records: u64,
    /// Measured records whose delivery failed.
    pub failed_deliveries: u64,
    /// Transactions aborted after a failed commit (their records are not counted).
    pub aborted_transactions: u64,
    /// Committed transactions of the measured phase.
    pub commits: u64,
    /// Measured time: first send to the end of the final flush or commit, in seconds.
    pub elapsed_s: f64,
    pub records_per_s: f64,
    /// Payload mebibytes (2^20 B) per second, as ProducerPerformance's "MB/sec".
    pub mb_per_s: f64,
    /// Duration of each commit of the measured phase, in milliseconds.
    pub commit_latencies_ms: Vec<f64>,
    /// The life of each committed transaction of the measured phase, in order.
    #[serde(default)]
    pub transactions: Vec<TxnTimes>,
    /// The run was cut short by a stop request.
    pub interrupted: bool,
}

/// Where one transaction's time went, from the application's side: open (begin to the commit
/// call, records being enqueued), drain (waiting until every record of it is acknowledged), and
/// end (`commit_transaction` after the drain: EndTxn to the coordinator and its markers).
/// `commit_latencies_ms` is drain + end.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct TxnTimes {
    pub open_ms: f64,
    pub records: u64,
    pub drain_ms: f64,
    pub end_ms: f64,
}

/// What one phase (warm-up or measurement) achieved.
#[derive(Debug, Default)]
struct Phase {
    sent: u64,
    counted: u64,
    failed: u64,
    aborted: u64,
    commits: Vec<Duration>,
    transactions: Vec<TxnTimes>,
    interrupted: bool,
}

/// Runs one configuration. `kafka` carries the producer settings (see `mode::producer_kafka`).
pub fn run_once(
    kafka: &KafkaConfig,
    spec: &RunSpec,
    stop: &AtomicBool,
) -> anyhow::Result<RunResult> {
    let config = spec.mode.producer_config(kafka, &spec.transactional_id)?;
    let producer = match spec.mode {
        Mode::Transactional { .. } => {
            TxnProducer::new(&config).context("creating the transactional producer")?
        }
        _ => TxnProducer::non_transactional(&config).context("creating the producer")?,
    };
    // One payload per run, uppercase letters as ProducerPerformance's (no compression is set, so
    // the content changes nothing on the wire).
    let payload: Vec<u8> = (0..spec.size).map(|i| b'A' + (i % 26) as u8).collect();
    let warm = if spec.warmup > 0 {
        produce(&producer, spec, &payload, Limit::Records(spec.warmup), stop).context("warm-up")?
    } else {
        Phase::default()
    };
    if warm.counted < warm.sent {
        warn!(topic = %spec.topic, counted = warm.counted, sent = warm.sent, "warm-up records lost");
    }
    let start = Instant::now();
    let measured =
        produce(&producer, spec, &payload, spec.limit, stop).context("measured phase")?;
    let elapsed = start.elapsed().as_secs_f64();
    debug!(topic = %spec.topic, mode = %spec.mode, elapsed, counted = measured.counted, "run finished");
    let records_per_s = stats::per_second(measured.counted as f64, elapsed).unwrap_or(0.0);
    let result = RunResult {
        mode: spec.mode.label(),
        commit_interval_ms: spec.mode.commit_interval().map(|d| d.as_millis() as u64),
        record_size: spec.size,
        repeat: spec.repeat,
        sequence: spec.sequence,
        topic: spec.topic.clone(),
        warmup_records: warm.counted,
        sent: measured.sent,
        records: measured.counted,
        failed_deliveries: measured.failed,
        aborted_transactions: measured.aborted,
        commits: measured.commits.len() as u64,
        elapsed_s: elapsed,
        records_per_s,
        mb_per_s: records_per_s * spec.size as f64 / (1024.0 * 1024.0),
        commit_latencies_ms: measured
            .commits
            .iter()
            .map(|d| d.as_secs_f64() * 1000.0)
            .collect(),
        transactions: measured.transactions,
        interrupted: warm.interrupted || measured.interrupted,
    };
    Ok(result)
}

/// Is the phase over?
fn done(limit: Limit, sent: u64, start: Instant, now: Instant) -> bool {
    match limit {
        Limit::Records(n) => sent >= n,
        Limit::Duration(d) => now.duration_since(start) >= d,
    }
}

/// Sends records until `limit`, keeping the queue full, and waits for the outcome of every one.
fn produce(
    p: &TxnProducer,
    spec: &RunSpec,
    payload: &[u8],
    limit: Limit,
    stop: &AtomicBool,
) -> anyhow::Result<Phase> {
    let failures_before = p.delivery_failures();
    let mut phase = Phase::default();
    let start = Instant::now();
    let interval = spec.mode.commit_interval();
    // Records of the open transaction and when it began (transactional mode).
    let mut in_txn: u64 = 0;
    let mut txn_start = start;
    loop {
        let now = Instant::now();
        if done(limit, phase.sent, start, now) {
            break;
        }
        if phase.sent % STOP_CHECK_EVERY == 0 && stop.load(Ordering::Relaxed) {
            phase.interrupted = true;
            break;
        }
        if interval.is_some() && in_txn == 0 {
            p.begin()?;
            txn_start = now;
        }
        let record = BaseRecord::<[u8], [u8]>::to(&spec.topic).payload(payload);
        p.send(record)
            .map_err(|e| anyhow!(e).context(format!("producing to {}", spec.topic)))?;
        phase.sent += 1;
        in_txn += 1;
        // As ProducerPerformance: commit once the transaction is at least one interval old.
        if let Some(interval) = interval {
            if now.duration_since(txn_start) >= interval {
                commit(p, &mut phase, in_txn, txn_start)?;
                in_txn = 0;
            }
        }
    }
    if interval.is_some() {
        if in_txn > 0 {
            commit(p, &mut phase, in_txn, txn_start)?;
        }
    } else {
        p.flush(FLUSH_TIMEOUT)
            .with_context(|| format!("flushing the records to {}", spec.topic))?;
    }
    phase.failed = p.delivery_failures() - failures_before;
    if interval.is_none() {
        phase.counted = phase.sent - phase.failed;
    }
    Ok(phase)
}

/// Commits the open transaction of `records` records; on an abortable failure aborts it and
/// counts none of them. Any other failure ends the run.
/// Commits the open transaction: drains it first, timed on its own (the commit's own drain then
/// finds nothing left), so the drain and EndTxn parts of a commit are told apart.
fn commit(p: &TxnProducer, phase: &mut Phase, records: u64, begun: Instant) -> anyhow::Result<()> {
    let t = Instant::now();
    // A drain that times out changes nothing: the commit flushes (and fails) on its own.
    let _ = p.flush(FLUSH_TIMEOUT);
    let drained = Instant::now();
    match p.commit() {
        Ok(()) => {
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            phase.commits.push(t.elapsed());
            phase.transactions.push(TxnTimes {
                open_ms: ms(t - begun),
                records,
                drain_ms: ms(drained - t),
                end_ms: ms(drained.elapsed()),
            });
            phase.counted += records;
            Ok(())
        }
        Err(e) if e.class == TxnErrorClass::Abortable => {
            warn!(error = %e, records, "commit failed; aborting the transaction, its records are not counted");
            p.abort().context("aborting after a failed commit")?;
            phase.aborted += 1;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}
