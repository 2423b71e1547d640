//! `replay`: put dead letters back on their source topic, exactly once, whatever the filters.
//!
//! ```text
//!  1. init_transactions(<dlq>.replay)  fences a replay of the same DLQ still running; the
//!                                      broker aborts its open transaction
//!  2. read <dlq>.replayed to its end   read_committed: all that any earlier replay committed
//!  3. scan <dlq> from the beginning    read_committed
//!       selected, not in the ledger ─► copy to its target + ledger entry, in one transaction
//!       anything else               ─► nothing at all is written
//!  4. commit every `batch` dead letters, and at the end
//! ```
//!
//! The order of 1 and 2 is what makes concurrent replays safe: once step 1 returns, a predecessor
//! can commit nothing more, and whatever it did commit is in the ledger read in step 2. Without
//! the fence, two replays that read the ledger at the same time would both copy the same dead
//! letters.
//!
//! # Exactly once across interruptions
//! A copy and its ledger entry commit together or not at all. A replay that dies mid-batch leaves
//! an open transaction, which the broker aborts (at once when the next replay registers the same
//! transactional id, else at the transaction timeout): its copies and entries vanish together, and
//! the rerun replays exactly the dead letters that are still unhandled. Unselected dead letters are
//! never written anywhere, so no filter, limit or misspelling can make them unreplayable.
//!
//! # Dry run
//! Reads and counts what a replay would do, and writes nothing: no ledger created, no
//! `init_transactions`, so it fences no replay that is running. The price: a transaction being
//! committed at that very moment may not be in its view yet (a commit returns before the broker
//! has written the markers that make it visible; a real replay waits for them in
//! `init_transactions`).
//!
//! # Error handling
//! A transaction that must be aborted (a record timed out while the broker stalled, say) ends the
//! attempt; the replay then starts again from step 1, at most [`ATTEMPTS`] times in all: a new
//! producer fences whatever the failed attempt left open, and the ledger says what it committed.
//! Any other error ends the replay (the open transaction is aborted when that is still possible),
//! and a rerun continues where the last commit ended. Fenced by a newer replay, it says so and
//! stops; the newer one replays what this one did not commit.
//!
//! A copy keeps the dead letter's key, value and headers, loses the `dlq.*` headers and gains
//! `replay.origin` (its ledger key), so a record that fails again can be traced to its earlier
//! dead letter. Replayed ticks go through the pipeline like any other: one whose seq is no longer
//! newer than its symbol's state is stale and only counted, which is right for late price data.

use super::select::Selection;
use super::{class_of, subscriber_of, table};
use crate::dlq::ledger;
use crate::dlq::{copy_headers, header};
use crate::kafka::access::{self, Needs};
use crate::kafka::config::DEFAULT_TRANSACTION_TIMEOUT;
use crate::kafka::read::{
    partition_count, partition_count_if_exists, read_partitions_to_end, reader, End, Reader,
    DEFAULT_READ_TIMEOUT,
};
use crate::kafka::txn::{TxnError, TxnErrorClass, TxnProducer};
use crate::kafka::{Isolation, KafkaConfig};
use anyhow::{anyhow, bail, Context as _};
use rdkafka::message::{BorrowedMessage, Header};
use rdkafka::producer::BaseRecord;
use rdkafka::Message;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;
use tracing::{debug, error, info, warn};

/// Dead letters replayed per transaction by default.
pub const DEFAULT_BATCH: usize = 500;

/// Attempts of a replay whose transaction had to be aborted.
pub const ATTEMPTS: u32 = 3;

/// Bound on the scan of the DLQ, commits included. A replay cut short by it has committed what it
/// committed; a rerun continues.
const SCAN_TIMEOUT: Duration = Duration::from_secs(600);

/// What to replay, and how.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub kafka: KafkaConfig,
    /// The dead-letter topic.
    pub dlq: String,
    /// Which dead letters.
    pub select: Selection,
    /// Replay at most this many (the first ones the scan meets); the rest stay unhandled.
    pub limit: Option<u64>,
    /// Target topic; default: each dead letter's `dlq.original.topic`.
    pub to: Option<String>,
    /// Count what would be replayed; write nothing, fence nothing.
    pub dry_run: bool,
    /// Dead letters per transaction.
    pub batch: usize,
    /// `transaction.timeout.ms` of the replay's producer; a batch must be written within it.
    pub transaction_timeout: Duration,
    pub hooks: ReplayHooks,
}

impl ReplayOptions {
    /// Every dead letter of `dlq` to its source topic, in batches of [`DEFAULT_BATCH`].
    pub fn new(kafka: KafkaConfig, dlq: impl Into<String>) -> Self {
        ReplayOptions {
            kafka,
            dlq: dlq.into(),
            select: Selection::all(),
            limit: None,
            to: None,
            dry_run: false,
            batch: DEFAULT_BATCH,
            transaction_timeout: DEFAULT_TRANSACTION_TIMEOUT,
            hooks: ReplayHooks::default(),
        }
    }
}

/// Switches only tests use. All off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayHooks {
    /// Exit abruptly once this many dead letters are copied in this run, after their records are
    /// in the log: a crash inside an open transaction (mid-batch unless it is a multiple of the
    /// batch size).
    pub crash_after: Option<u64>,
}

/// Counts of one class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ClassCounts {
    /// Dead letters read.
    pub read: u64,
    /// Already replayed before this run (in the ledger).
    pub handled: u64,
    /// Replayed by this run (in a dry run: that would be).
    pub replayed: u64,
    /// Still unhandled after this run: not selected, or past the limit.
    pub left: u64,
}

impl ClassCounts {
    fn add(&mut self, o: &ClassCounts) {
        self.read += o.read;
        self.handled += o.handled;
        self.replayed += o.replayed;
        self.left += o.left;
    }
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    pub dlq: String,
    pub dry_run: bool,
    /// Per `dlq.error.class`.
    pub classes: BTreeMap<String, ClassCounts>,
    /// Transactions committed.
    pub transactions: u64,
}

impl ReplayReport {
    /// The counts over every class.
    pub fn total(&self) -> ClassCounts {
        let mut t = ClassCounts::default();
        self.classes.values().for_each(|c| t.add(c));
        t
    }

    pub fn total_replayed(&self) -> u64 {
        self.total().replayed
    }

    /// An aligned table for people.
    pub fn to_text(&self) -> String {
        let replayed = if self.dry_run {
            "to replay"
        } else {
            "replayed"
        };
        let row = |name: &str, c: &ClassCounts| {
            vec![
                name.to_owned(),
                c.read.to_string(),
                c.handled.to_string(),
                c.replayed.to_string(),
                c.left.to_string(),
            ]
        };
        let mut rows: Vec<Vec<String>> = self
            .classes
            .iter()
            .map(|(class, c)| row(class, c))
            .collect();
        rows.push(row("total", &self.total()));
        let mut out = table(
            &["class", "read", "handled before", replayed, "left"],
            &rows,
        );
        if self.dry_run {
            out.push_str("dry run: nothing written\n");
        } else {
            out.push_str(&format!(
                "{} replayed in {} transaction(s)\n",
                self.total_replayed(),
                self.transactions
            ));
        }
        out
    }
}

/// Replays the selected, unhandled dead letters of the DLQ. Blocking.
///
/// After an attempt whose transaction had to be aborted, the report is the last attempt's: what
/// the earlier ones committed counts as "handled before".
pub fn replay(opts: &ReplayOptions) -> anyhow::Result<ReplayReport> {
    let mut attempt = 1;
    loop {
        match replay_once(opts) {
            Err(e) if attempt < ATTEMPTS && must_abort(&e) => {
                warn!(dlq = %opts.dlq, attempt, error = format!("{e:#}"), "replay transaction aborted; starting again from the ledger");
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// Whether `e` is a transaction that had to be aborted (worth another attempt), not a fence, a
/// fatal error or a mistake in the request.
fn must_abort(e: &anyhow::Error) -> bool {
    e.downcast_ref::<TxnError>()
        .is_some_and(|t| t.class == TxnErrorClass::Abortable)
}

fn replay_once(opts: &ReplayOptions) -> anyhow::Result<ReplayReport> {
    if opts.batch == 0 {
        bail!("the batch size must be at least 1");
    }
    let ledger_topic = ledger::topic(&opts.dlq);
    if let Some(to) = opts
        .to
        .as_deref()
        .filter(|&to| to == opts.dlq || to == ledger_topic)
    {
        bail!("cannot replay {} into {to}", opts.dlq);
    }
    let mut needs = Needs {
        read: vec![opts.dlq.clone()],
        ..Needs::default()
    };
    if !opts.dry_run {
        needs.read.push(ledger_topic.clone());
        needs.write.push(ledger_topic.clone());
        needs.write.extend(opts.to.clone());
    }
    access::check(&opts.kafka, &needs)?;
    let consumer = reader(&opts.kafka, Isolation::ReadCommitted)?;
    let count = partition_count(&consumer, &opts.dlq, DEFAULT_READ_TIMEOUT)
        .with_context(|| format!("the DLQ {}", opts.dlq))?;
    let partitions = opts.select.partitions_of(&opts.dlq, count)?;

    // 1. Fence first, 2. then read the ledger (see the module header for why in this order).
    let producer = if opts.dry_run {
        None
    } else {
        ledger::ensure(&opts.kafka, &opts.dlq)?;
        Some(TxnProducer::start(
            &opts.kafka,
            &ledger::transactional_id(&opts.dlq),
            opts.transaction_timeout,
        )?)
    };
    let ledger = ledger::read(&opts.kafka, &opts.dlq)?;
    info!(dlq = %opts.dlq, handled = ledger.len(), dry_run = opts.dry_run, "replay starting");

    let mut report = ReplayReport {
        dlq: opts.dlq.clone(),
        dry_run: opts.dry_run,
        ..ReplayReport::default()
    };
    let mut batches = producer
        .as_deref()
        .map(|p| Batches::new(p, &consumer, opts));
    let mut replayed = 0u64;
    let scanned = read_partitions_to_end(
        &consumer,
        &opts.dlq,
        &partitions,
        End::Decided,
        SCAN_TIMEOUT,
        |m| {
            let class = class_of(m);
            let counts = report.classes.entry(class.to_owned()).or_default();
            counts.read += 1;
            if ledger.contains(m.partition(), m.offset(), m.timestamp().to_millis()) {
                counts.handled += 1;
                return Ok(());
            }
            if !opts
                .select
                .matches(m.partition(), m.offset(), class, subscriber_of(m))
                || opts.limit.is_some_and(|limit| replayed >= limit)
            {
                counts.left += 1;
                return Ok(());
            }
            counts.replayed += 1;
            replayed += 1;
            match &mut batches {
                Some(b) => b.add(m, class, opts.to.as_deref()),
                None => Ok(()),
            }
        },
    );
    let finished = scanned.and_then(|_| batches.as_mut().map_or(Ok(()), Batches::commit));
    if let Err(e) = finished {
        if let Some(b) = &mut batches {
            b.abandon();
        }
        return Err(explain(e, &opts.dlq));
    }
    report.transactions = batches.map_or(0, |b| b.transactions);
    let total = report.total();
    info!(
        dlq = %opts.dlq,
        read = total.read,
        replayed = total.replayed,
        left = total.left,
        transactions = report.transactions,
        dry_run = opts.dry_run,
        "replay done"
    );
    Ok(report)
}

/// Says what being fenced means for a replay; other errors pass through.
fn explain(e: anyhow::Error, dlq: &str) -> anyhow::Error {
    if e.downcast_ref::<TxnError>()
        .is_some_and(TxnError::is_fenced)
    {
        e.context(format!("another replay of {dlq} started and fenced this one; it replays what this one did not commit"))
    } else {
        e
    }
}

/// The transactions of a replay: copies with their ledger entries, committed every `size`.
struct Batches<'a> {
    producer: &'a TxnProducer,
    /// Asks the broker whether a target topic exists.
    probe: &'a Reader,
    /// Target topics known to exist.
    targets: HashSet<String>,
    size: usize,
    /// Dead letters in the open transaction (0: none open).
    open: usize,
    /// Dead letters copied by this run, committed or not.
    copied: u64,
    transactions: u64,
    hooks: ReplayHooks,
}

impl<'a> Batches<'a> {
    fn new(producer: &'a TxnProducer, probe: &'a Reader, opts: &ReplayOptions) -> Self {
        let (size, hooks) = (opts.batch, opts.hooks);
        Batches {
            producer,
            probe,
            targets: HashSet::new(),
            size,
            open: 0,
            copied: 0,
            transactions: 0,
            hooks,
        }
    }

    /// Copies dead letter `m` and writes its ledger entry, in the open transaction.
    fn add(
        &mut self,
        m: &BorrowedMessage<'_>,
        class: &str,
        to: Option<&str>,
    ) -> anyhow::Result<()> {
        let target = target_of(m, to)?;
        self.check(target, m)?;
        if self.open == 0 {
            self.producer.begin()?;
        }
        self.open += 1;
        copy(self.producer, m, target)?;
        ledger::send(self.producer, m, class, target)
            .with_context(|| format!("writing the ledger entry of {}", ledger::key_of(m)))?;
        self.copied += 1;
        if self.hooks.crash_after == Some(self.copied) {
            // Records first into the log, so the crash lands inside an open transaction.
            let _ = self.producer.flush(Duration::from_secs(30));
            error!(
                copied = self.copied,
                "test hook: crashing inside an open transaction"
            );
            std::process::abort();
        }
        if self.open >= self.size {
            self.commit()?;
        }
        Ok(())
    }

    /// Refuses a target topic that does not exist: a record sent there would only time out, and
    /// the batch with it, after `message.timeout.ms`.
    fn check(&mut self, target: &str, m: &BorrowedMessage<'_>) -> anyhow::Result<()> {
        if self.targets.contains(target) {
            return Ok(());
        }
        if partition_count_if_exists(self.probe, target, DEFAULT_READ_TIMEOUT)?.is_none() {
            bail!("the target topic {target} of {} does not exist: create it, or choose another with --to", ledger::key_of(m));
        }
        self.targets.insert(target.to_owned());
        Ok(())
    }

    /// Commits the open transaction, if any.
    fn commit(&mut self) -> anyhow::Result<()> {
        if self.open > 0 {
            self.producer.commit()?;
            self.transactions += 1;
            debug!(
                records = self.open,
                transactions = self.transactions,
                "replay batch committed"
            );
            self.open = 0;
        }
        Ok(())
    }

    /// After an error: aborts the open transaction if the producer still can (fenced or fatal, it
    /// cannot: the broker aborts it instead).
    fn abandon(&mut self) {
        if self.open == 0 {
            return;
        }
        self.open = 0;
        if let Err(e) = self.producer.abort() {
            debug!(error = %e, "no abort after the failed replay; the broker aborts the transaction");
        }
    }
}

/// Where dead letter `m` goes: `to`, or its `dlq.original.topic`.
fn target_of<'m>(m: &'m BorrowedMessage<'_>, to: Option<&'m str>) -> anyhow::Result<&'m str> {
    match to {
        Some(t) => Ok(t),
        None => header(m, "dlq.original.topic").ok_or_else(|| {
            anyhow!(
                "{} has no dlq.original.topic: replay it with --to",
                ledger::key_of(m)
            )
        }),
    }
}

/// Copies one dead letter back: original key, value and headers, without `dlq.*`, plus
/// `replay.origin`.
fn copy(producer: &TxnProducer, m: &BorrowedMessage<'_>, target: &str) -> anyhow::Result<()> {
    let origin = ledger::key_of(m);
    let headers = copy_headers(m, |key| !key.starts_with("dlq.")).insert(Header {
        key: "replay.origin",
        value: Some(origin.as_str()),
    });
    let mut record = BaseRecord::to(target).headers(headers);
    if let Some(k) = m.key() {
        record = record.key(k);
    }
    if let Some(v) = m.payload() {
        record = record.payload(v);
    }
    producer
        .send(record)
        .map_err(|e| anyhow!(e).context(format!("replaying {origin} to {target}")))
}
