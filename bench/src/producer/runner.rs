//! One measured run: one mode, one record size, one fresh topic, fresh producers (one; two in the
//! overlapped mode).
//!
//! ```text
//!   create producer (init_transactions) ─► warm-up (acked / committed, untimed)
//!     ─► t0 ─► send, send, ... (commit every interval) ─► flush / last commit ─► t1
//!
//!   overlapped:  producer A  [ txn 1 ][ commit 1 ]      [ txn 3 ][ commit 3 ]
//!                producer B           [ txn 2   ][ commit 2 ]      [ txn 4 ] ...
//!                (txn n+1 is handed to its commit only after n's outcome is known)
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
//! - overlapped: as transactional; a transaction whose predecessor aborted is aborted too.
//!
//! The same producer type and send path as the pipeline ([`TxnProducer`]) is used in every mode,
//! so the modes differ only in their configuration and the commits.
//!
//! # Waiting for the outstanding records
//! [`TxnProducer::flush`] and [`TxnProducer::commit`] wait for outstanding records in 1 ms steps
//! (rust-rdkafka's own flush waits in 100 ms steps; see `price_alerts::kafka::txn`), so a commit costs what
//! librdkafka and the broker cost. That time is inside the measured time and inside the commit
//! latency, as with Java's `commitTransaction`, which flushes too.

use super::mode::Mode;
use super::options::Limit;
use crate::stats;
use anyhow::{anyhow, Context as _};
use price_alerts::kafka::txn::{TxnErrorClass, TxnProducer};
use price_alerts::kafka::KafkaConfig;
use rdkafka::producer::BaseRecord;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
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
/// `commit_latencies_ms` is drain + end; `blocked_ms` is the part of it the sending loop waited
/// for.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct TxnTimes {
    pub open_ms: f64,
    pub records: u64,
    pub drain_ms: f64,
    pub end_ms: f64,
    /// How long the sending loop waited for this transaction's outcome: its whole commit when
    /// commits are sequential, only what was left of it at the next hand-off when they overlap.
    #[serde(default)]
    pub blocked_ms: f64,
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
    let mut producers = Vec::with_capacity(spec.mode.producers());
    for i in 0..spec.mode.producers() {
        // The second producer of the overlapped mode has an id of its own: two producers with one
        // transactional id would fence each other.
        let id = match i {
            0 => spec.transactional_id.clone(),
            i => format!("{}-{i}", spec.transactional_id),
        };
        let config = spec.mode.producer_config(kafka, &id)?;
        producers.push(match spec.mode.commit_interval() {
            Some(_) => TxnProducer::new(&config).context("creating the transactional producer")?,
            None => TxnProducer::non_transactional(&config).context("creating the producer")?,
        });
    }
    // One payload per run, uppercase letters as ProducerPerformance's (no compression is set, so
    // the content changes nothing on the wire).
    let payload: Vec<u8> = (0..spec.size).map(|i| b'A' + (i % 26) as u8).collect();
    let warm = if spec.warmup > 0 {
        produce(
            &producers,
            spec,
            &payload,
            Limit::Records(spec.warmup),
            stop,
        )
        .context("warm-up")?
    } else {
        Phase::default()
    };
    if warm.counted < warm.sent {
        warn!(topic = %spec.topic, counted = warm.counted, sent = warm.sent, "warm-up records lost");
    }
    let start = Instant::now();
    let measured =
        produce(&producers, spec, &payload, spec.limit, stop).context("measured phase")?;
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
/// With two producers (the overlapped mode) transactions alternate between them and each commit
/// runs on a thread of its own while the next transaction is produced; see [`Overlap`].
fn produce(
    producers: &[Arc<TxnProducer>],
    spec: &RunSpec,
    payload: &[u8],
    limit: Limit,
    stop: &AtomicBool,
) -> anyhow::Result<Phase> {
    let failures_before: u64 = producers.iter().map(|p| p.delivery_failures()).sum();
    let mut phase = Phase::default();
    let start = Instant::now();
    let interval = spec.mode.commit_interval();
    let mut overlap = Overlap::default();
    let mut current = 0;
    // Records of the open transaction and when it began (transactional modes).
    let mut in_txn: u64 = 0;
    let mut txn_start = start;
    // Sends refused inside a transaction so far (see below).
    let mut refused = 0;
    loop {
        let now = Instant::now();
        if done(limit, phase.sent, start, now) {
            break;
        }
        if phase.sent % STOP_CHECK_EVERY == 0 && stop.load(Ordering::Relaxed) {
            phase.interrupted = true;
            break;
        }
        let p = &producers[current];
        if interval.is_some() && in_txn == 0 {
            p.begin()?;
            txn_start = now;
        }
        let record = BaseRecord::<[u8], [u8]>::to(&spec.topic).payload(payload);
        if let Err(e) = p.send(record) {
            // In a transaction that has hit an abortable error (the coordinator aborted it for
            // outliving its timeout while this machine stalled, say) librdkafka refuses every
            // send with ERR__STATE until it is aborted. One producer: abort it, count it aborted
            // (none of its records count) and go on, a bounded number of times. Seen once in a
            // fresh-clone suite run at a load where the test took 40 s instead of 10-22 s.
            if interval.is_some() && producers.len() == 1 && refused < MAX_REFUSED_SENDS {
                refused += 1;
                warn!(error = %e, records = in_txn, "a send was refused inside the transaction; aborting it, its records are not counted");
                p.abort().context("aborting after a refused send")?;
                phase.settle(Outcome::Aborted, Duration::ZERO);
                in_txn = 0;
                continue;
            }
            return Err(anyhow!(e).context(format!("producing to {}", spec.topic)));
        }
        phase.sent += 1;
        in_txn += 1;
        // As ProducerPerformance: commit once the transaction is at least one interval old.
        if let Some(interval) = interval {
            if now.duration_since(txn_start) >= interval {
                let txn = Open {
                    records: in_txn,
                    begun: txn_start,
                };
                if producers.len() > 1 {
                    overlap.hand_off(Arc::clone(p), txn, &mut phase)?;
                    current = (current + 1) % producers.len();
                } else {
                    let blocked = Instant::now();
                    let outcome = commit(p, txn, blocked)?;
                    phase.settle(outcome, blocked.elapsed());
                }
                in_txn = 0;
            }
        }
    }
    // The last transaction commits in the foreground, after its predecessor's outcome.
    let waiting = Instant::now();
    let previous = overlap.wait()?;
    if let Some(outcome) = previous {
        phase.settle(outcome, waiting.elapsed());
    }
    if interval.is_some() {
        if in_txn > 0 {
            let txn = Open {
                records: in_txn,
                begun: txn_start,
            };
            let p = &producers[current];
            let blocked = Instant::now();
            let outcome = match previous {
                Some(Outcome::Aborted) => abort_after_predecessor(p, txn.records)?,
                _ => commit(p, txn, blocked)?,
            };
            phase.settle(outcome, blocked.elapsed());
        }
    } else {
        for p in producers {
            p.flush(FLUSH_TIMEOUT)
                .with_context(|| format!("flushing the records to {}", spec.topic))?;
        }
    }
    let failures: u64 = producers.iter().map(|p| p.delivery_failures()).sum();
    phase.failed = failures - failures_before;
    if interval.is_none() {
        phase.counted = phase.sent - phase.failed;
    }
    Ok(phase)
}

/// Sends refused inside a transaction (each aborts it) before a run gives up.
const MAX_REFUSED_SENDS: u32 = 10;

/// A transaction handed to its commit: how many records, and when it began.
#[derive(Debug, Clone, Copy)]
struct Open {
    records: u64,
    begun: Instant,
}

/// How a transaction ended.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    Committed(TxnTimes),
    /// Aborted; its records are not counted.
    Aborted,
}

impl Phase {
    /// Counts a transaction's outcome; `blocked` is how long the sending loop waited for it.
    fn settle(&mut self, outcome: Outcome, blocked: Duration) {
        match outcome {
            Outcome::Committed(mut t) => {
                t.blocked_ms = blocked.as_secs_f64() * 1000.0;
                self.commits
                    .push(Duration::from_secs_f64((t.drain_ms + t.end_ms) / 1000.0));
                self.counted += t.records;
                self.transactions.push(t);
            }
            Outcome::Aborted => self.aborted += 1,
        }
    }
}

/// The commit in flight of the overlapped mode.
///
/// Two producers with transactional ids of their own take turns: transaction n commits on a
/// thread of its own while n+1 is produced on the other producer. What keeps that as exactly-once
/// as one producer:
/// - at most one commit is in flight: n+1 is handed to its commit only after n's outcome is
///   known, so commits complete in transaction order;
/// - n+1 commits only if n committed, and is aborted if n aborted (in the pipeline, n+1's offsets
///   and state build on n's);
/// - order per key: a record of n+1 may land before a record of n in the same partition, since
///   they come from two producers. The benchmark's records have no key (as ProducerPerformance's),
///   so nothing is held back here; a user of this pattern holds n+1's records of keys that n wrote
///   until n's commit has returned (its records are acknowledged by then).
#[derive(Default)]
struct Overlap {
    in_flight: Option<JoinHandle<anyhow::Result<Outcome>>>,
}

impl Overlap {
    /// Waits for the commit in flight, if any; returns its outcome.
    fn wait(&mut self) -> anyhow::Result<Option<Outcome>> {
        let Some(handle) = self.in_flight.take() else {
            return Ok(None);
        };
        let outcome = handle
            .join()
            .map_err(|_| anyhow!("the commit thread panicked"))??;
        Ok(Some(outcome))
    }

    /// Hands `txn` of producer `p` to its commit once its predecessor's outcome is known: a
    /// commit thread if the predecessor committed, an abort if it aborted.
    fn hand_off(
        &mut self,
        p: Arc<TxnProducer>,
        txn: Open,
        phase: &mut Phase,
    ) -> anyhow::Result<()> {
        let blocked = Instant::now();
        let previous = self.wait()?;
        let waited = blocked.elapsed();
        if let Some(outcome) = previous {
            phase.settle(outcome, waited);
        }
        if let Some(Outcome::Aborted) = previous {
            let outcome = abort_after_predecessor(&p, txn.records)?;
            phase.settle(outcome, waited);
            return Ok(());
        }
        let handed = Instant::now();
        let handle = std::thread::Builder::new()
            .name("commit".into())
            .spawn(move || commit(&p, txn, handed))
            .context("starting a commit thread")?;
        self.in_flight = Some(handle);
        Ok(())
    }
}

/// Aborts a transaction because the one before it aborted.
fn abort_after_predecessor(p: &TxnProducer, records: u64) -> anyhow::Result<Outcome> {
    warn!(
        records,
        "the previous transaction aborted; aborting this one too"
    );
    // Records still in flight made Kafka answer EndTxn(abort) with INVALID_TXN_STATE in the
    // pipeline's tests: let them finish first (failures change nothing, the abort follows).
    let _ = p.flush(FLUSH_TIMEOUT);
    p.abort()
        .context("aborting after the previous transaction aborted")?;
    Ok(Outcome::Aborted)
}

/// Commits `txn`: drains it first, timed on its own (the commit's own drain then finds nothing
/// left), so the drain and EndTxn parts of a commit are told apart. On an abortable failure
/// aborts it (none of its records count); any other failure ends the run.
fn commit(p: &TxnProducer, txn: Open, called: Instant) -> anyhow::Result<Outcome> {
    // A drain that times out changes nothing: the commit flushes (and fails) on its own.
    let _ = p.flush(FLUSH_TIMEOUT);
    let drained = Instant::now();
    match p.commit() {
        Ok(()) => {
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            Ok(Outcome::Committed(TxnTimes {
                open_ms: ms(called - txn.begun),
                records: txn.records,
                drain_ms: ms(drained - called),
                end_ms: ms(drained.elapsed()),
                blocked_ms: 0.0,
            }))
        }
        Err(e) if e.class == TxnErrorClass::Abortable => {
            warn!(error = %e, records = txn.records, "commit failed; aborting the transaction, its records are not counted");
            p.abort().context("aborting after a failed commit")?;
            Ok(Outcome::Aborted)
        }
        Err(e) => Err(e.into()),
    }
}
