//! The transactional consume-process-produce step: one consumer, one transactional producer, the
//! per-partition state, and what happens on commit, abort and rebalance.
//!
//! ```text
//!  poll ──► record of partition p ──► (restore p if needed) ──► begin if no txn open
//!             │
//!             ├─ tick ok ─► crossing rule ─► notifications (send) + p's symbol marked dirty
//!             ├─ bad tick ─► DLQ record (send)
//!             └─ offsets[p] = offset + 1
//!  commit ──► dirty states to changelog partition p ─► send_offsets_to_transaction(offsets,
//!             group metadata) ─► commit_transaction
//! ```
//!
//! # Invariants
//! - Everything a batch produces (notifications, DLQ records, state) and the offsets that move past
//!   its input commit in one transaction, or not at all.
//! - The in-memory state of a partition is the committed one plus the effects of the open
//!   transaction. After an abort it is dropped and restored from the changelog, and the consumer is
//!   rewound to the committed offsets, so the redo sees exactly the committed world.
//! - A partition's state is restored (read_committed, to its end) before any of its ticks is
//!   processed, and only after its committed offset could be fetched as stable: an open transaction
//!   of a previous owner is resolved first.
//!
//! # Rebalances
//! The consumer uses cooperative-sticky assignment. On revoke, the open transaction is committed
//! (aborted if the assignment was lost) before the partitions go, inside the rebalance callback, as
//! librdkafka's `transactions.c` does; the callback gets the consumer, so it sends fresh group
//! metadata. On assign, the new partitions are marked for restore.
//!
//! # Error handling
//! Transactional errors are classified by [`crate::txn::classify`]: abortable ones lead to
//! [`Engine::abort`] (abort, rewind, restore) and processing goes on; fatal ones stop the engine
//! with the error. All of this runs on one thread: the rebalance callback runs inside `poll`, so
//! the mutex around the shared state is never contended; it exists because the callback reaches
//! that state through the consumer's context.

use crate::alert::{apply_rules, Notification, Outcome, Source};
use crate::config::{Isolation, KafkaConfig};
use crate::dlq;
use crate::failure::{Failure, FaultInjection, RetryPolicy};
use crate::metrics as m;
use crate::reader::{reader, Reader};
use crate::rules::Rules;
use crate::state::{self, StateStore};
use crate::tick;
use crate::topics::Topics;
use crate::txn::{TxnError, TxnErrorClass, TxnProducer};
use anyhow::{anyhow, Context as _};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::BaseRecord;
use rdkafka::{Message, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tracing::{debug, info, warn};

/// Bound on broker round trips of the rewind (committed offsets, seek).
const REWIND_TIMEOUT: Duration = Duration::from_secs(30);

/// What one processor instance is.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Connection and pass-through properties.
    pub kafka: KafkaConfig,
    /// Application id: the consumer group, and the prefix of the transactional id.
    pub app_id: String,
    /// Instance id, stable across restarts of this instance: with the app id it makes the
    /// transactional id, so a restart fences its predecessor.
    pub instance_id: String,
    /// Topics read and written.
    pub topics: Topics,
    /// Alert thresholds per symbol.
    pub rules: Arc<Rules>,
    /// Largest tick payload accepted; larger ones are dead-lettered as oversize.
    pub max_tick_bytes: usize,
    /// transaction.timeout.ms of the producer.
    pub transaction_timeout: Duration,
    /// Use static group membership (group.instance.id = transactional id).
    pub static_membership: bool,
    /// Exactly-once (transactions) or at-least-once (idempotent producer, offsets committed after
    /// the outputs are acknowledged); the latter exists to compare against.
    pub guarantee: Guarantee,
    /// Bounds of the inline retry of a failing tick.
    pub retry: RetryPolicy,
    /// Deterministic fault injection (off by default).
    pub faults: FaultInjection,
    /// TEST ONLY: exit abruptly at the n-th commit, after the batch's outputs are in the log and
    /// before its offsets are committed: a crash placed between produce and commit.
    pub crash_before_commit: Option<u64>,
}

/// The delivery guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Guarantee {
    /// Outputs, state and offsets in one transaction.
    #[default]
    ExactlyOnce,
    /// No transaction: outputs acknowledged, then offsets committed; a crash in between repeats
    /// the batch's outputs.
    AtLeastOnce,
}

impl EngineSettings {
    /// Settings with the defaults of everything but the deployment's names and rules.
    pub fn new(kafka: KafkaConfig, app_id: &str, instance_id: &str, topics: Topics, rules: Arc<Rules>) -> Self {
        EngineSettings {
            kafka,
            app_id: app_id.to_owned(),
            instance_id: instance_id.to_owned(),
            topics,
            rules,
            max_tick_bytes: crate::tick::DEFAULT_MAX_TICK_BYTES,
            transaction_timeout: crate::config::DEFAULT_TRANSACTION_TIMEOUT,
            static_membership: true,
            guarantee: Guarantee::ExactlyOnce,
            retry: RetryPolicy::default(),
            faults: FaultInjection::default(),
            crash_before_commit: None,
        }
    }

    pub fn group_id(&self) -> &str {
        &self.app_id
    }

    pub fn transactional_id(&self) -> String {
        format!("{}-{}", self.app_id, self.instance_id)
    }
}

/// Counters of one engine; logged at shutdown and exported as metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Input records processed inside committed transactions.
    pub committed_records: u64,
    /// Notifications inside committed transactions.
    pub committed_notifications: u64,
    /// Dead-lettered ticks inside committed transactions.
    pub committed_dead_letters: u64,
    /// Ticks that succeeded only after retries, inside committed transactions.
    pub committed_retried: u64,
    /// Stale ticks (seq not newer) inside committed transactions.
    pub committed_stale: u64,
    /// Ticks of symbols without rules inside committed transactions.
    pub committed_unwatched: u64,
    pub commits: u64,
    pub aborts: u64,
    /// Partition restores from the changelog.
    pub restores: u64,
}

/// The batch inside the open transaction.
#[derive(Debug)]
struct OpenTxn {
    started: Instant,
    records: u64,
    notifications: u64,
    /// Dead-lettered ticks per class.
    dead_letters: BTreeMap<&'static str, u64>,
    /// Ticks that succeeded after retries.
    retried: u64,
    stale: u64,
    unwatched: u64,
    /// Next offset to read, per input partition with records in this transaction.
    offsets: BTreeMap<i32, i64>,
    /// Symbols whose state changed, per partition: written to the changelog at commit, once each.
    dirty: BTreeMap<i32, BTreeSet<String>>,
    /// State and offsets are already in the transaction; only commit or abort may follow.
    staged: bool,
}

impl OpenTxn {
    fn new() -> Self {
        OpenTxn {
            started: Instant::now(),
            records: 0,
            notifications: 0,
            dead_letters: BTreeMap::new(),
            retried: 0,
            stale: 0,
            unwatched: 0,
            offsets: BTreeMap::new(),
            dirty: BTreeMap::new(),
            staged: false,
        }
    }
}

#[derive(Default)]
struct Inner {
    txn: Option<OpenTxn>,
    state: StateStore,
    /// A fatal error raised inside the rebalance callback, reported after `poll` returns.
    fatal: Option<TxnError>,
    stats: Stats,
}

/// What the engine and its rebalance callback share.
struct Shared {
    producer: Arc<TxnProducer>,
    settings: EngineSettings,
    inner: Mutex<Inner>,
}

mod transaction;

pub use transaction::RebalanceHandler;

/// One processor instance: consumer, transactional producer, state.
pub struct Engine {
    consumer: BaseConsumer<RebalanceHandler>,
    shared: Arc<Shared>,
    /// Reads the changelog on restores; kept so each restore does not pay a new connection.
    restore_reader: Reader,
}

impl Engine {
    /// Creates the clients, registers the transactional id (fencing a predecessor) and subscribes.
    /// Blocking: call it off the async runtime.
    pub fn start(settings: EngineSettings) -> anyhow::Result<Self> {
        let txn_id = settings.transactional_id();
        let producer = match settings.guarantee {
            Guarantee::ExactlyOnce => {
                let cfg = settings.kafka.transactional_producer(&txn_id, settings.transaction_timeout)?;
                TxnProducer::new(&cfg).context("starting the transactional producer")?
            }
            Guarantee::AtLeastOnce => TxnProducer::non_transactional(&settings.kafka.idempotent_producer())
                .context("starting the idempotent producer")?,
        };
        let instance = settings.static_membership.then_some(txn_id.as_str());
        let consumer_cfg = settings.kafka.group_consumer(settings.group_id(), instance);
        let restore_reader = reader(&settings.kafka, Isolation::ReadCommitted).context("creating the restore reader")?;
        let input = settings.topics.input.clone();
        let shared = Arc::new(Shared { producer, settings, inner: Mutex::new(Inner::default()) });
        let consumer: BaseConsumer<RebalanceHandler> = consumer_cfg
            .create_with_context(RebalanceHandler::new(Arc::clone(&shared)))
            .context("creating the consumer")?;
        consumer.subscribe(&[&input]).context("subscribing")?;
        info!(
            transactional_id = %txn_id,
            group = shared.settings.group_id(),
            input = %input,
            guarantee = ?shared.settings.guarantee,
            "engine started"
        );
        Ok(Engine { consumer, shared, restore_reader })
    }

    /// Polls once (rebalance callbacks run here), restores newly owned partitions, and processes
    /// the record polled, if any. Returns whether a record was processed.
    pub fn poll_once(&self, timeout: Duration) -> anyhow::Result<bool> {
        let polled = self.consumer.poll(timeout);
        if let Some(e) = self.shared.lock()?.fatal.take() {
            return Err(e.into());
        }
        self.restore_pending()?;
        match polled {
            None => Ok(false),
            Some(Ok(m)) => match self.process(&m) {
                Ok(()) => Ok(true),
                Err(e) => {
                    self.handle(e)?;
                    Ok(false)
                }
            },
            Some(Err(KafkaError::MessageConsumptionFatal(code))) => {
                Err(anyhow!("fatal consumer error: {code}"))
            }
            Some(Err(e)) => {
                // Broker transport errors and the like: librdkafka recovers by itself.
                warn!(error = %e, "consumer error");
                Ok(false)
            }
        }
    }

    /// Polls until `n` records have been processed, or fails after `timeout`: how the demo and the
    /// tests drive the engine batch by batch, ending each transaction themselves.
    pub fn process_records(&self, n: u64, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut done = 0;
        while done < n {
            if Instant::now() > deadline {
                anyhow::bail!("only {done} of {n} records arrived within {timeout:?}");
            }
            if self.poll_once(Duration::from_millis(100))? {
                done += 1;
            }
        }
        Ok(())
    }

    /// Restores the state of owned partitions that have none loaded.
    fn restore_pending(&self) -> anyhow::Result<()> {
        let pending = self.shared.lock()?.state.pending();
        if pending.is_empty() {
            return Ok(());
        }
        let topics = &self.shared.settings.topics;
        // Fetching the committed offsets of a read_committed consumer waits until no transaction
        // holds pending offsets on these partitions (KIP-447 "require stable"): a previous owner's
        // last transaction is resolved before its changelog is read.
        let mut tpl = TopicPartitionList::new();
        for &p in &pending {
            tpl.add_partition(&topics.input, p);
        }
        let committed = crate::reader::fetch_committed(&self.consumer, &tpl, state::RESTORE_TIMEOUT)
            .context("fetching committed offsets")?;
        let restored = state::restore(&self.restore_reader, &topics.changelog, &pending)?;
        let mut inner = self.shared.lock()?;
        for (p, s) in restored {
            inner.state.install(p, s);
        }
        inner.stats.restores += pending.len() as u64;
        m::restored(pending.len());
        debug!(committed = ?committed.to_topic_map(), "restore done");
        Ok(())
    }

    /// Applies one input record inside the open transaction (beginning one if none is open).
    fn process(&self, m: &BorrowedMessage<'_>) -> Result<(), TxnError> {
        let shared = &self.shared;
        let settings = &shared.settings;
        let p = m.partition();
        let mut inner = shared.lock().map_err(|_| poisoned())?;
        if m.topic() != settings.topics.input || inner.state.get(p).is_none() {
            // Not ours (any more): librdkafka drops fetched records of revoked partitions, so this
            // is a safety net, and the record is not acknowledged.
            warn!(topic = m.topic(), partition = p, offset = m.offset(), "record of a partition not owned; ignored");
            return Ok(());
        }
        if inner.txn.is_none() {
            if settings.guarantee == Guarantee::ExactlyOnce {
                shared.producer.begin()?;
            }
            inner.txn = Some(OpenTxn::new());
        }
        let Inner { txn, state, .. } = &mut *inner;
        let txn = txn.as_mut().expect("begun above");
        let states = state.get_mut(p).expect("checked above");
        let decoded = tick::decode(m.payload(), settings.max_tick_bytes).map_err(Failure::Permanent).and_then(|tick| {
            // The processing step proper. It cannot fail today but for injected faults; the retry
            // is where a real transient dependency (an enrichment lookup, say) would be retried.
            let mut rng = rand::rng();
            let ((), attempts) =
                settings.retry.run(&mut rng, std::thread::sleep, |n| settings.faults.check(tick.seq, n))?;
            Ok((tick, attempts))
        });
        match decoded {
            Err(failure) => {
                warn!(
                    partition = p,
                    offset = m.offset(),
                    class = failure.class(),
                    attempts = failure.attempts(),
                    error = %failure.message(),
                    "tick dead-lettered"
                );
                let rec = dlq::record(m, settings.group_id(), &failure);
                let mut record = BaseRecord::to(&settings.topics.dlq).headers(rec.headers);
                if let Some(k) = rec.key.as_deref() {
                    record = record.key(k);
                }
                if let Some(v) = rec.value.as_deref() {
                    record = record.payload(v);
                }
                shared.producer.send(record).map_err(|e| TxnError::new("produce dead letter", e))?;
                *txn.dead_letters.entry(failure.class()).or_default() += 1;
            }
            Ok((tick, attempts)) => {
                if attempts > 1 {
                    debug!(symbol = %tick.symbol, seq = tick.seq, attempts, "tick succeeded after retries");
                    txn.retried += 1;
                }
                let mut current = states.get(&tick.symbol).cloned();
                match apply_rules(&settings.rules, &mut current, &tick) {
                    Outcome::Accepted { crossings } => {
                        let tick_ts = tick.ts.clone().unwrap_or_else(|| record_ts(m));
                        for c in &crossings {
                            let source = Source { topic: m.topic().to_owned(), partition: p, offset: m.offset() };
                            let n = Notification::new(&tick, c, tick_ts.clone(), source);
                            let value = serde_json::to_vec(&n).unwrap_or_default();
                            let record = BaseRecord::to(&settings.topics.notifications)
                                .key(tick.symbol.as_bytes())
                                .payload(value.as_slice());
                            shared.producer.send(record).map_err(|e| TxnError::new("produce notification", e))?;
                            txn.notifications += 1;
                        }
                        if let Some(s) = current {
                            states.insert(tick.symbol.clone(), s);
                        }
                        txn.dirty.entry(p).or_default().insert(tick.symbol);
                    }
                    Outcome::Stale { last_seq } => {
                        debug!(symbol = %tick.symbol, seq = tick.seq, last_seq, "stale tick ignored");
                        txn.stale += 1;
                    }
                    Outcome::Unwatched => txn.unwatched += 1,
                }
            }
        }
        txn.records += 1;
        txn.offsets.insert(p, m.offset() + 1);
        Ok(())
    }

    /// Handles a transactional error: abortable ones abort and rewind, others stop the engine.
    fn handle(&self, e: TxnError) -> anyhow::Result<()> {
        if e.class != TxnErrorClass::Abortable {
            return Err(e.into());
        }
        warn!(error = %e, "abortable transactional error; aborting and rewinding");
        self.abort()
    }

    /// Whether a transaction is open, and since when.
    pub fn open_since(&self) -> anyhow::Result<Option<(Instant, u64)>> {
        Ok(self.shared.lock()?.txn.as_ref().map(|t| (t.started, t.records)))
    }

    /// Commits the open transaction (if any). An abortable failure aborts and rewinds, and is not
    /// an error; a fatal one is.
    pub fn commit(&self) -> anyhow::Result<bool> {
        let mut inner = self.shared.lock()?;
        match self.shared.commit_open(&mut inner, &self.consumer) {
            Ok(()) => Ok(true),
            Err(e) if e.class == TxnErrorClass::Abortable => {
                warn!(error = %e, "commit failed; aborting and rewinding");
                let owned: Vec<i32> = inner.state.owned().collect();
                self.shared.abort_and_rewind(&mut inner, &self.consumer, &owned)?;
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Puts the batch's state and offsets into the open transaction and waits until every record of
    /// it is in the log, uncommitted: what the demo does before aborting, so that the aborted
    /// records stay in the log behind an abort marker instead of being purged from the local
    /// queue. Processing must not continue in this transaction afterwards; commit or abort.
    pub fn stage_and_flush(&self) -> anyhow::Result<()> {
        let mut inner = self.shared.lock()?;
        self.shared.stage(&mut inner, &self.consumer)?;
        self.shared.producer.flush(Duration::from_secs(30))?;
        Ok(())
    }

    /// Aborts the open transaction (if any), rewinds every owned partition to its committed offset
    /// and drops the state, which is restored before the next record.
    pub fn abort(&self) -> anyhow::Result<()> {
        let mut inner = self.shared.lock()?;
        let owned: Vec<i32> = inner.state.owned().collect();
        self.shared.abort_and_rewind(&mut inner, &self.consumer, &owned)?;
        Ok(())
    }

    /// Counters so far.
    pub fn stats(&self) -> anyhow::Result<Stats> {
        Ok(self.shared.lock()?.stats.clone())
    }

    /// A copy of the state of every owned, loaded partition.
    pub fn state_snapshot(&self) -> anyhow::Result<BTreeMap<i32, state::PartitionState>> {
        Ok(self.shared.lock()?.state.snapshot())
    }

    /// Owned input partitions.
    pub fn owned_partitions(&self) -> anyhow::Result<Vec<i32>> {
        Ok(self.shared.lock()?.state.owned().collect())
    }

    /// The settings the engine runs with.
    pub fn settings(&self) -> &EngineSettings {
        &self.shared.settings
    }

    /// Commits what is open, then leaves the group (which revokes every partition).
    pub fn close(self) -> anyhow::Result<Stats> {
        let committed = self.commit();
        self.consumer.unsubscribe();
        // Serve the revoke triggered by unsubscribe, so the group sees us go now.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && self.shared.lock()?.state.owned().next().is_some() {
            let _ = self.consumer.poll(Duration::from_millis(100));
        }
        committed?;
        if let Some(e) = self.shared.lock()?.fatal.take() {
            return Err(e.into());
        }
        self.stats()
    }
}

fn poisoned() -> TxnError {
    TxnError {
        step: "state lock",
        class: TxnErrorClass::Fatal,
        source: KafkaError::Global(RDKafkaErrorCode::Fail),
    }
}

/// The record timestamp as RFC 3339 (stands in for a tick without `ts`).
fn record_ts(m: &BorrowedMessage<'_>) -> String {
    let ms = m.timestamp().to_millis().unwrap_or_else(|| {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
    });
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}
