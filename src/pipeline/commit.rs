//! The transaction of the engine: the open batch, commit, and abort with rewind.
//!
//! ```text
//!  begin (first record of a batch) ─► … records … ─► stage: dirty states to changelog partition p,
//!        send_offsets_to_transaction(offsets, group metadata) ─► commit_transaction
//!  any abortable error ─► flush ─► abort_transaction ─► drop the in-memory state ─► seek every
//!        partition to its committed offset (the state is restored before the next record)
//! ```
//!
//! Both the processing loop ([`super::engine`]) and the rebalance callback ([`super::rebalance`],
//! which runs inside `poll`, on the same thread) come here with the [`Session`] locked, so there
//! is one path for each outcome. The lock is never contended; it exists because the callback
//! reaches the session through the consumer's context.
//!
//! The rebalance callbacks, which close the open transaction before partitions go, are in
//! [`super::rebalance`]; the overlapped commit (`--overlap-commits`: a batch's commit on a thread
//! of its own, and the outputs held back for it) is in [`super::overlap`]; the producers a batch
//! begins on in turn (`--txn-producers 2`) are in [`super::producers`].
//!
//! # Back-off
//! Every abort drops the state of every owned partition, which is restored before the next
//! record: an error that comes back on every attempt would abort, rewind and restore on every
//! poll. So every setback (an abort, whatever its cause, or a right refused outside a
//! transaction: a fetch or an offset lookup) sets a back-off that the loop waits before it polls
//! again: 100 ms after the first since the last commit, doubling per setback in a row, at most
//! 5 s; a commit resets it. That bounds how often a restore can repeat while nothing commits.
//!
//! A setback caused by a refused right (Write on an output, Read on the group or the input; the
//! right is told by the error's code and step) is also said: one WARN line per right and setback,
//! naming the principal and the right, and `alerts_not_authorised_total{right}`. The first commit
//! afterwards logs `authorised again`. A rewind refused for lack of a right is not fatal: the
//! partitions stay unrestored and unpositioned ([`super::state::StateStore`]), their records are
//! dropped, and their restore, once the right is back, seeks them to the committed offsets first.
//!
//! # The drain before the offsets
//! A batch whose records are all unacknowledged when it is staged (ticks that cross nothing: its
//! only records are the changelog's, produced right before the offsets) is drained before
//! `send_offsets_to_transaction`, so the partitions it writes are registered with the
//! transaction (AddPartitionsToTxn answered) before its AddOffsetsToTxn can fail. librdkafka 2.12
//! takes an AddPartitionsToTxn response that arrives once the transaction has failed for
//! outdated and forgets the request, although the coordinator registered the partitions; with
//! the AddOffsetsToTxn beside it refused first (Read on the group taken away), no request of the
//! transaction counted any more and the abort skipped EndTxn ("No partitions registered: not
//! sending EndTxn"). The transaction stayed open on its coordinator, which timed it out and fenced
//! the producer a transaction timeout later ("Completed rollback of ongoing transaction … due to
//! timeout" in the broker's log); the next EndTxn of that producer (the abort of the next refused
//! batch, or a commit once the group was granted) was refused as fenced, a fence of a younger
//! transaction, so fatal ([`crate::kafka::txn::Fence`]), and the pipeline exited 1
//! (tests/security.rs, `group_read_refused_past_the_transaction_timeout_leaves_no_transaction_open`;
//! alert-deliver had the same race: `crate::deliver::handoff`). While the group is refused nothing
//! but the first batch reaches the offsets (the rewind and the restores are refused too), so no
//! later transaction ended what that one left open. A batch with a record acknowledged already
//! has a partition registered, which keeps EndTxn, and is not drained; the commit drains anyway,
//! so the drain moves the wait for the acknowledgements before AddOffsetsToTxn rather than adding
//! one.
//!
//! # Counting
//! The batch's counts become [`Stats`] and metrics only when its transaction commits, so a redo
//! after an abort is never counted twice.

use super::batch::OpenBatch;
use super::overlap::Outbox;
use super::producers::Producers;
use super::rebalance::resume;
use super::settings::{EngineSettings, Guarantee};
use super::state::{PartitionState, StateStore};
use crate::backoff::Setbacks;
use crate::kafka::offsets::{seek_to_committed, GroupOffsets};
use crate::kafka::tpl::position_list;
use crate::kafka::txn::{TxnCause, TxnError, TxnErrorClass, TxnProducer, DRAIN_TIMEOUT};
use crate::kafka::Isolation;
use crate::metrics as m;
use crate::rules::live::{PartitionJoin, JOIN_KEY};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::BaseRecord;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

/// Bound on broker round trips of the rewind (committed offsets, seek).
const REWIND_TIMEOUT: Duration = Duration::from_secs(30);

/// Bound on each metadata round trip that asks whether a Write is refused, after a failed abort:
/// short, so an instance that is stopping for another reason is not held up.
const REFUSAL_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Counters of one engine; printed at shutdown (as aligned text, or JSON) and exported as metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
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

/// The counters of two engines that ran one after the other (one made again in place).
impl std::ops::Add for Stats {
    type Output = Stats;

    fn add(self, o: Stats) -> Stats {
        Stats {
            committed_records: self.committed_records + o.committed_records,
            committed_notifications: self.committed_notifications + o.committed_notifications,
            committed_dead_letters: self.committed_dead_letters + o.committed_dead_letters,
            committed_retried: self.committed_retried + o.committed_retried,
            committed_stale: self.committed_stale + o.committed_stale,
            committed_unwatched: self.committed_unwatched + o.committed_unwatched,
            commits: self.commits + o.commits,
            aborts: self.aborts + o.aborts,
            restores: self.restores + o.restores,
        }
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rows = [
            ("ticks committed", self.committed_records),
            ("  notifications", self.committed_notifications),
            ("  dead-lettered", self.committed_dead_letters),
            ("  retried", self.committed_retried),
            ("  stale", self.committed_stale),
            ("  unwatched", self.committed_unwatched),
            ("transactions committed", self.commits),
            ("transactions aborted", self.aborts),
            ("partitions restored", self.restores),
        ];
        for (i, (label, n)) in rows.iter().enumerate() {
            let end = if i + 1 < rows.len() { "\n" } else { "" };
            write!(f, "{label:<24}{n:>12}{end}")?;
        }
        Ok(())
    }
}

/// What the records of the open batch did; counted once the batch commits.
#[derive(Debug, Default)]
pub(super) struct BatchCounts {
    pub notifications: u64,
    /// Dead-lettered ticks per class.
    pub dead_letters: BTreeMap<&'static str, u64>,
    /// Ticks that succeeded after retries.
    pub retried: u64,
    pub stale: u64,
    pub unwatched: u64,
    /// One-shot live alerts that fired (each deleted by a tombstone in this transaction).
    pub one_shots: u64,
}

/// The batch inside the open transaction.
#[derive(Debug)]
pub(super) struct OpenTxn {
    started: Instant,
    /// When its oldest record arrived (see [`super::batch`]).
    oldest_arrival: Instant,
    pub(super) records: u64,
    pub counts: BatchCounts,
    /// Next offset to read, per input partition with records in this transaction.
    offsets: BTreeMap<i32, i64>,
    /// Symbols whose state changed, per partition: written to the changelog at commit, once each.
    dirty: BTreeMap<i32, BTreeSet<String>>,
    /// State and offsets are already in the transaction; only commit or abort may follow.
    staged: bool,
}

impl OpenTxn {
    fn new() -> Self {
        // Its records lower the oldest arrival; none can be later than the open.
        let now = Instant::now();
        OpenTxn {
            started: now,
            oldest_arrival: now,
            records: 0,
            counts: BatchCounts::default(),
            offsets: BTreeMap::new(),
            dirty: BTreeMap::new(),
            staged: false,
        }
    }

    /// The record at `offset` of partition `p`, which arrived at `arrived`, is done (processed or
    /// dead-lettered): the transaction's offsets move past it.
    pub fn processed(&mut self, p: i32, offset: i64, arrived: Instant) {
        self.records += 1;
        self.oldest_arrival = self.oldest_arrival.min(arrived);
        self.offsets.insert(p, offset + 1);
    }

    /// `symbol`'s state (of partition `p`) changed: its changelog record is written at commit.
    pub fn changed(&mut self, p: i32, symbol: String) {
        self.dirty.entry(p).or_default().insert(symbol);
    }
}

/// What the lock guards: the open batch, the per-partition state, a fatal error raised inside the
/// rebalance callback (reported after `poll` returns), the counters, and the back-off while a
/// right is missing.
#[derive(Default)]
pub(super) struct Session {
    pub(super) txn: Option<OpenTxn>,
    /// The batch whose commit is in flight and the open batch's outputs held back for it
    /// (`--overlap-commits`; empty otherwise).
    pub(super) outbox: Outbox,
    pub state: StateStore,
    pub(super) fatal: Option<TxnError>,
    pub(super) stats: Stats,
    /// Setbacks since the last commit: aborts, and refusals of a right seen outside an abort
    /// (a fetch or an offset lookup refused). The back-off before the next attempt grows with
    /// them ([`crate::backoff`]); a commit resets them.
    setbacks: Setbacks,
    /// The rights refused since the last commit, named again when a transaction commits.
    refused: BTreeSet<String>,
    /// How long the loop waits before the next attempt, set by a setback (taken once).
    backoff: Option<Duration>,
    /// When the last commit began, unless an abort came after it: where the next batch's commit
    /// interval may start counting (see [`super::batch`]).
    pub(super) previous_commit: Option<Instant>,
    /// A fetch of the input was refused (Read on the input), and no record of it arrived since.
    /// librdkafka reports such a refusal once per partition, then waits silently: while this is
    /// set, the engine asks the broker once per back-off step whether it still refuses, so the
    /// refusal is named as long as it lasts (`Engine::recheck_input_read`).
    pub input_refused: bool,
}

impl Session {
    /// The open batch, if any: what decides when it commits.
    pub fn open_batch(&self) -> Option<OpenBatch> {
        self.txn.as_ref().map(|t| OpenBatch {
            records: t.records,
            opened: t.started,
            oldest_arrival: t.oldest_arrival,
            previous_commit: self.previous_commit,
        })
    }

    /// The open batch, the loaded state of partition `p` and where the batch's outputs go, if a
    /// batch is open and `p` loaded.
    /// With live alerts, also `p`'s join.
    #[allow(clippy::type_complexity)]
    pub fn batch(
        &mut self,
        p: i32,
    ) -> Option<(
        &mut OpenTxn,
        &mut PartitionState,
        Option<&mut PartitionJoin>,
        &mut Outbox,
    )> {
        let (state, join) = self.state.with_join(p)?;
        Some((self.txn.as_mut()?, state, join, &mut self.outbox))
    }

    /// Whether a commit is in flight or outputs are held back for one.
    pub fn overlapping(&self) -> bool {
        self.outbox.overlapping()
    }

    /// A fatal error of the rebalance callback, once.
    pub fn take_fatal(&mut self) -> Option<TxnError> {
        self.fatal.take()
    }

    /// How long to wait before the next attempt, once, after a setback (an abort, a refused
    /// right).
    pub fn take_backoff(&mut self) -> Option<Duration> {
        self.backoff.take()
    }

    /// One more setback in a row: sets and returns the back-off before the next attempt.
    fn next_backoff(&mut self) -> Duration {
        let backoff = self.setbacks.set_back();
        self.backoff = Some(self.backoff.map_or(backoff, |b| b.max(backoff)));
        backoff
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Setbacks since the last commit.
    pub fn setbacks(&self) -> Setbacks {
        self.setbacks
    }

    /// `right` was refused before this session began, to the engine this one replaces, after
    /// `setbacks` since its last commit: the back-off goes on growing from there, and the first
    /// commit says `authorised again`, naming it.
    pub fn refused_before(&mut self, right: String, setbacks: Setbacks) {
        self.refused.insert(right);
        self.setbacks = setbacks;
    }

    /// `n` partitions were restored from the changelog, in `took`.
    pub fn restored(&mut self, n: usize, took: Duration) {
        self.stats.restores += n as u64;
        m::restored(n, took);
    }
}

/// The transactional side of one engine: the producer and the session, shared by the processing
/// loop and the rebalance callback.
pub(super) struct Committer {
    /// One producer, or two taken in turn.
    pub(super) producers: Producers,
    /// Where rewinds and restores read the group's committed offsets ([`GroupOffsets`] says why
    /// not through the group consumer).
    offsets: GroupOffsets,
    settings: EngineSettings,
    session: Mutex<Session>,
    /// The test hook `fail_commit_in_flight` fired (it fires once).
    pub(super) failed_once: AtomicBool,
}

impl Committer {
    /// Creates the producers ([`Producers::start`]) and the reader of the group's offsets.
    pub fn start(settings: EngineSettings) -> anyhow::Result<Arc<Self>> {
        let producers = Producers::start(&settings)?;
        // read_committed: a restore waits until a previous owner's pending offsets are decided.
        let offsets = GroupOffsets::new(
            &settings.kafka,
            settings.group_id(),
            Isolation::ReadCommitted,
        )?;
        Ok(Arc::new(Committer {
            producers,
            offsets,
            settings,
            session: Mutex::new(Session::default()),
            failed_once: AtomicBool::new(false),
        }))
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    /// The group's committed offsets, for rewinds and restores.
    pub fn offsets(&self) -> &GroupOffsets {
        &self.offsets
    }

    /// The producer that the open batch's outputs go through (the last batch's, between
    /// batches).
    pub fn producer(&self) -> &TxnProducer {
        self.producers.current()
    }

    /// The index in `producers` of the producer of the open batch (the last batch's, between
    /// batches).
    pub(super) fn active(&self) -> usize {
        self.producers.active()
    }

    pub fn lock(&self) -> Result<MutexGuard<'_, Session>, TxnError> {
        // A poisoned lock means a panic while the state was half-updated: nothing can be trusted.
        self.session.lock().map_err(|_| {
            TxnError::with_class("state lock", TxnErrorClass::Fatal, TxnCause::LockPoisoned)
        })
    }

    /// Opens a batch (beginning a transaction in the exactly-once mode) unless one is open.
    pub fn begin(&self, session: &mut Session) -> Result<(), TxnError> {
        if session.txn.is_none() {
            if self.settings.guarantee == Guarantee::ExactlyOnce {
                // The next producer in turn: the last one's commit markers may still be on
                // their way, and its next AddPartitionsToTxn would meet CONCURRENT_TRANSACTIONS.
                self.producers.take_turn();
                self.producer().begin()?;
            }
            session.txn = Some(OpenTxn::new());
        }
        Ok(())
    }

    /// Aborts and rewinds after `e` if it is abortable (returning false: nothing is open any
    /// more); returns it if it is fatal.
    pub(super) fn abort_after<C: ConsumerContext>(
        &self,
        session: &mut Session,
        consumer: &BaseConsumer<C>,
        rewind: &[i32],
        e: TxnError,
    ) -> Result<bool, TxnError> {
        if e.class != TxnErrorClass::Abortable {
            return Err(e);
        }
        warn!(error = %e, "commit failed; aborting and rewinding");
        self.abort_and_rewind(session, consumer, rewind, Some(&e))?;
        Ok(false)
    }

    /// Commits the open batch; on an abortable failure aborts it and rewinds `rewind` instead.
    /// Returns whether it committed (also when nothing was open).
    pub fn commit_or_abort<C: ConsumerContext>(
        &self,
        session: &mut Session,
        consumer: &BaseConsumer<C>,
        rewind: &[i32],
    ) -> Result<bool, TxnError> {
        // The batch in flight, if any, ends first: this one's offsets and state follow it.
        if !self.settle(session, consumer, rewind, true)? {
            return Ok(false);
        }
        match self.commit_open(session, consumer) {
            Ok(()) => Ok(true),
            Err(e) => self.abort_after(session, consumer, rewind, e),
        }
    }

    /// Writes the batch's changed states to the changelog and adds its offsets (with fresh group
    /// metadata) to the open transaction. Idempotent per transaction.
    pub fn stage<C: ConsumerContext>(
        &self,
        session: &mut Session,
        consumer: &BaseConsumer<C>,
    ) -> Result<(), TxnError> {
        let Session { txn, state, .. } = session;
        let Some(txn) = txn.as_mut() else {
            return Ok(());
        };
        if txn.staged {
            return Ok(());
        }
        let topics = &self.settings.topics;
        m::commit_step("state", || {
            for (&p, symbols) in &txn.dirty {
                let Some(states) = state.get(p) else { continue };
                for symbol in symbols {
                    let Some(s) = states.get(symbol) else {
                        continue;
                    };
                    // Serializing a decimal string and an integer cannot fail.
                    let value = serde_json::to_vec(s).unwrap_or_default();
                    let record = BaseRecord::to(&topics.changelog)
                        .partition(p)
                        .key(symbol.as_bytes())
                        .payload(value.as_slice());
                    self.producer()
                        .send(record)
                        .map_err(|e| TxnError::new("produce state", e))?;
                }
            }
            // Live alerts: where each partition's join stands, beside its states (see
            // `crate::rules::live`, "What a crash must not lose").
            for &p in txn.offsets.keys() {
                let Some(cp) = state.checkpoint(p) else {
                    continue;
                };
                let value = serde_json::to_vec(&cp).unwrap_or_default();
                let record = BaseRecord::to(&topics.changelog)
                    .partition(p)
                    .key(JOIN_KEY.as_bytes())
                    .payload(value.as_slice());
                self.producer()
                    .send(record)
                    .map_err(|e| TxnError::new("produce join checkpoint", e))?;
            }
            Ok(())
        })?;
        if self.settings.guarantee == Guarantee::ExactlyOnce {
            let group = consumer.group_metadata().ok_or_else(|| {
                TxnError::with_class(
                    "group_metadata",
                    TxnErrorClass::Fatal,
                    TxnCause::NoGroupMetadata,
                )
            })?;
            // Every AddPartitionsToTxn answered before the offsets go, unless a record of this
            // transaction is acknowledged already (module doc, `# The drain before the offsets`).
            // A drain that does not finish changes nothing: the commit drains again.
            if !self.producer().partition_registered() {
                m::commit_step("flush", || {
                    let _ = self.producer().flush(DRAIN_TIMEOUT);
                    Ok::<(), TxnError>(())
                })?;
            }
            // Off unless a test names the file. No stop flag here: a held engine is stopped by
            // the shutdown bound of the process.
            crate::kafka::hold::hold_before(
                self.settings.hooks.hold_send_offsets.as_deref(),
                "send_offsets_to_transaction",
                None,
                || {
                    let _ = self.producer().flush(Duration::from_secs(30));
                },
            );
            m::commit_step("send_offsets", || {
                self.producer().send_offsets(&self.offsets_of(txn)?, group)
            })?;
        }
        txn.staged = true;
        Ok(())
    }

    /// Puts the batch's state and offsets into the open transaction and waits until every record
    /// of it is in the log, uncommitted (see `Engine::stage_and_flush`).
    pub fn stage_and_flush<C: ConsumerContext>(
        &self,
        session: &mut Session,
        consumer: &BaseConsumer<C>,
    ) -> Result<(), TxnError> {
        self.stage(session, consumer)?;
        self.producer()
            .flush(Duration::from_secs(30))
            .map_err(|e| TxnError::new("flush", e))
    }

    /// At least once: waits until everything produced is acknowledged, and fails (abortable: the
    /// batch is redone) if any record could not be delivered.
    fn flush_acknowledged(&self) -> Result<(), TxnError> {
        m::commit_step("flush", || {
            let failures = self.producer().delivery_failures();
            self.producer()
                .flush(self.settings.transaction_timeout)
                .map_err(|e| TxnError::with_class("flush", TxnErrorClass::Abortable, e))?;
            let undelivered = self.producer().delivery_failures() - failures;
            if undelivered > 0 {
                return Err(TxnError::with_class(
                    "delivery",
                    TxnErrorClass::Abortable,
                    TxnCause::Undelivered(undelivered),
                ));
            }
            Ok(())
        })
    }

    fn offsets_of(&self, txn: &OpenTxn) -> Result<TopicPartitionList, TxnError> {
        let input = &self.settings.topics.input;
        position_list(
            input,
            txn.offsets
                .iter()
                .map(|(&p, &next)| (p, Offset::Offset(next))),
        )
        .map_err(|e| TxnError::new("offsets", e))
    }

    /// Exits the process abruptly if the test hook says this commit is the one to crash at.
    fn maybe_crash(&self, session: &Session) {
        if self.settings.hooks.crash_before_commit == Some(session.stats.commits + 1) {
            // Outputs first into the log, so the crash lands between produce and commit.
            let _ = self.producer().flush(Duration::from_secs(30));
            error!(
                commit = session.stats.commits + 1,
                "test hook: crashing before this commit"
            );
            std::process::abort();
        }
    }

    /// Commits the open batch, if any: dirty states, then offsets, then commit.
    fn commit_open<C: ConsumerContext>(
        &self,
        session: &mut Session,
        consumer: &BaseConsumer<C>,
    ) -> Result<(), TxnError> {
        if session.txn.is_none() {
            return Ok(());
        }
        let started = Instant::now();
        // Set before the outcome is known: an abort below clears it again.
        session.previous_commit = Some(started);
        match self.settings.guarantee {
            Guarantee::ExactlyOnce => {
                self.stage(session, consumer)?;
                self.maybe_crash(session);
                m::commit_step("end_transaction", || self.producer().commit())?;
            }
            Guarantee::AtLeastOnce => {
                // Outputs acknowledged first; state and offsets second. A crash in between repeats
                // the batch's notifications after the restart: that is at-least-once.
                self.flush_acknowledged()?;
                self.maybe_crash(session);
                self.stage(session, consumer)?;
                self.flush_acknowledged()?;
                let tpl = session
                    .txn
                    .as_ref()
                    .map(|t| self.offsets_of(t))
                    .transpose()?
                    .unwrap_or_default();
                m::commit_step("commit_offsets", || {
                    consumer.commit(&tpl, CommitMode::Sync).map_err(|e| {
                        TxnError::with_class("commit offsets", TxnErrorClass::Abortable, e)
                    })
                })?;
            }
        }
        if let Some(txn) = session.txn.take() {
            self.committed(session, txn, started);
        }
        Ok(())
    }

    /// Counts a committed batch (its commit began at `started`), and says so if it ends a run
    /// of setbacks.
    pub(super) fn committed(&self, session: &mut Session, txn: OpenTxn, started: Instant) {
        let after_setbacks = session.setbacks.reset();
        if !session.refused.is_empty() {
            let rights: Vec<&String> = session.refused.iter().collect();
            info!(
                rights = ?rights,
                after_setbacks,
                "authorised again: transactions commit"
            );
        } else if after_setbacks > 1 {
            info!(after_setbacks, "transactions commit again");
        }
        session.refused.clear();
        let (c, s) = (&txn.counts, &mut session.stats);
        s.commits += 1;
        s.committed_records += txn.records;
        s.committed_notifications += c.notifications;
        s.committed_dead_letters += c.dead_letters.values().sum::<u64>();
        s.committed_retried += c.retried;
        s.committed_stale += c.stale;
        s.committed_unwatched += c.unwatched;
        m::committed(
            &c.dead_letters,
            txn.records,
            c.notifications,
            c.stale,
            c.retried,
            started.elapsed(),
        );
        if c.one_shots > 0 {
            m::one_shots_fired(c.one_shots);
        }
        debug!(
            records = txn.records,
            notifications = c.notifications,
            commit_ms = started.elapsed().as_millis() as u64,
            offsets = ?txn.offsets,
            "transaction committed"
        );
    }

    /// The right of the pipeline that an authorisation error `code` means, if it is one, for the
    /// steps that read: the consumer's fetch, the group's offsets (OffsetFetch at a rewind or a
    /// restore), and the offsets put into a transaction (AddOffsetsToTxn and TxnOffsetCommit, which
    /// Kafka authorises as Read on the group and on the input). Those touch no topic but the
    /// input. A refused Write is named by the producer instead, per topic
    /// ([`TxnProducer::take_refused`]).
    pub fn read_refused(&self, code: Option<RDKafkaErrorCode>) -> Option<String> {
        match code? {
            RDKafkaErrorCode::GroupAuthorizationFailed => {
                Some(format!("Read on Group {}", self.settings.group_id()))
            }
            RDKafkaErrorCode::TopicAuthorizationFailed => {
                Some(format!("Read on Topic {}", self.settings.topics.input))
            }
            _ => None,
        }
    }

    /// The right whose refusal made transactional step `e` fail, if it failed for one: a group's
    /// refusal at any step, a topic's only where the step reads (the offsets step) and no Write
    /// was refused in the transaction (`write_refused`): librdkafka then fails every later step
    /// with the refused record's code, and the producer names that topic itself.
    fn refused_by(&self, e: &TxnError, write_refused: bool) -> Option<String> {
        let TxnCause::Kafka(k) = &e.cause else {
            return None;
        };
        let code = k.rdkafka_error_code();
        match code {
            Some(RDKafkaErrorCode::GroupAuthorizationFailed) => self.read_refused(code),
            Some(RDKafkaErrorCode::TopicAuthorizationFailed)
                if e.step == "send_offsets_to_transaction" && !write_refused =>
            {
                self.read_refused(code)
            }
            _ => None,
        }
    }

    /// A setback: sets the growing back-off, so the loop retries the same input now and then
    /// instead of spinning, and says which `rights` were refused, if any (one WARN line and one
    /// count of `alerts_not_authorised_total` per right and setback), until a commit succeeds.
    /// `aborted`: the setback aborted a transaction (otherwise a read was refused outside one).
    pub fn set_back(&self, session: &mut Session, rights: &BTreeSet<String>, aborted: bool) {
        let backoff = session.next_backoff();
        if rights.is_empty() {
            if session.setbacks.in_a_row() > 1 {
                debug!(setbacks = session.setbacks.in_a_row(), retry_in = ?backoff, "setback in a row; backing off");
            }
            return;
        }
        let what = if aborted {
            "transaction aborted and input rewound"
        } else {
            "input not read"
        };
        for right in rights {
            session.refused.insert(right.clone());
            crate::kafka::access::say_refused(
                &self.settings.kafka,
                right,
                what,
                session.setbacks.in_a_row(),
                backoff,
            );
        }
    }

    /// Aborts the transaction of producer `i`; returns the topics whose records were refused for
    /// lack of Write in it (empty for any other abort), making the producer again where
    /// librdkafka made such a refusal fatal ([`TxnProducer::abort_naming_refused`]).
    fn abort_open(&self, i: usize) -> Result<BTreeSet<String>, TxnError> {
        // TxnProducer::abort lets in-flight produce requests finish first (Kafka 4.4 answered
        // an EndTxn(abort) with records in flight with INVALID_TXN_STATE).
        let t = &self.settings.topics;
        let written = [t.notifications.clone(), t.dlq.clone(), t.changelog.clone()];
        let producer = self.producers.get(i);
        if self.settings.hooks.aborts_fail_fatally {
            producer.fail_next_abort();
        }
        producer.abort_naming_refused(&written, None, REFUSAL_PROBE_TIMEOUT)
    }

    /// Ends the transactions of the producers `open` (indices; at most the failed batch in flight
    /// and the open one) by aborting them; returns the topics refused Write in them.
    ///
    /// After a coordinator was lost (`lost`: a call stuck past its deadline, or a transaction
    /// its coordinator aborted for outliving its timeout) every producer is made again, whatever
    /// it holds: a stuck one by its abort, the others by a restart, whose registration aborts what
    /// they had open. What made the call stick or time out, a coordinator gone that librdkafka
    /// keeps asking (#5456, #5511), is in their cached metadata as well: each would stick again at
    /// its next call, for a whole deadline (tests/coordinator.rs's SIGKILL case took 20 s more,
    /// one deadline per producer, and missed its bound: once after a stuck call, and once under
    /// the consumer protocol after the other producer's transaction was timed out and fenced).
    fn abort_all(&self, open: &[usize], lost: bool) -> Result<BTreeSet<String>, TxnError> {
        let mut refused = BTreeSet::new();
        for (i, p) in self.producers.iter().enumerate() {
            if lost && !p.is_stuck() {
                info!(
                    producer = i + 1,
                    "making the transactional producer again after a coordinator was lost"
                );
                p.restart()?;
            } else if open.contains(&i) || (lost && p.is_stuck()) {
                refused.extend(self.abort_open(i)?);
            }
        }
        Ok(refused)
    }

    /// Aborts the open batch, and the batch in flight if its commit fails or failed, and rewinds
    /// `partitions` (input position and state) to the last commit; `cause` is the error that made
    /// the batch abort, if any. Every abort is a setback (back-off, and the refused rights named:
    /// see [`Committer::set_back`]). A rewind refused for lack of a right leaves the partitions
    /// unpositioned: their restore seeks them later, and nothing of them is processed before.
    pub fn abort_and_rewind<C: ConsumerContext>(
        &self,
        session: &mut Session,
        consumer: &BaseConsumer<C>,
        partitions: &[i32],
        cause: Option<&TxnError>,
    ) -> Result<(), TxnError> {
        // The redo reads old records again: its first batch counts from its open.
        session.previous_commit = None;
        // A coordinator lost: a call stuck past its deadline, or fenced by its coordinator's
        // timeout (abortable only then: kafka::txn, `Fence::TimedOut`).
        let mut lost = cause.is_some_and(|e| {
            e.is_stuck() || (e.is_producer_fenced() && e.class == TxnErrorClass::Abortable)
        });
        // A commit in flight ends first: its producer is not to be called meanwhile, and whether
        // it committed decides where the rewind lands.
        let (failed, failed_stuck) = self.end_overlap(session)?;
        lost |= failed_stuck;
        let mut ended: Vec<(usize, u64)> = failed.into_iter().collect();
        if let Some(txn) = session.txn.take() {
            ended.push((self.active(), txn.records));
        }
        let aborted = !ended.is_empty();
        let mut refused = BTreeSet::new();
        if aborted {
            if self.settings.guarantee == Guarantee::ExactlyOnce {
                let open: Vec<usize> = ended.iter().map(|&(i, _)| i).collect();
                refused.extend(
                    self.abort_all(&open, lost)?
                        .into_iter()
                        .map(|topic| format!("Write on Topic {topic}")),
                );
            } else {
                // At least once there is no transaction to abort: what was produced stays, and
                // the redo may repeat it. What failed to be delivered is said once, as an abort
                // does.
                self.producer().report_failures();
            }
            for (i, records) in ended {
                info!(records, producer = i + 1, "transaction aborted");
                session.stats.aborts += 1;
                m::aborted();
            }
        }
        let write_refused = !refused.is_empty();
        refused.extend(cause.and_then(|e| self.refused_by(e, write_refused)));
        session.state.invalidate_all();
        // Held partitions (live alerts) are rewound with the others: whoever paused them resumes.
        resume(
            consumer,
            &self.settings.topics.input,
            &session.state.release(None),
        );
        if let Err(e) = seek_to_committed(
            consumer,
            &self.offsets,
            &self.settings.topics.input,
            partitions,
            REWIND_TIMEOUT,
        ) {
            // Without a rewind the redo would skip records: unless a right is refused (then the
            // restore seeks once it is granted), stop rather than lose them.
            let Some(right) = self.read_refused(e.rdkafka_error_code()) else {
                return Err(TxnError::with_class("rewind", TxnErrorClass::Fatal, e));
            };
            debug!(error = %e, "rewind refused; the restore seeks instead");
            partitions.iter().for_each(|&p| session.state.unposition(p));
            refused.insert(right);
        }
        self.set_back(session, &refused, aborted);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Session;
    use std::time::Duration;

    #[test]
    fn setbacks_grow_the_backoff_and_it_is_taken_once() {
        let mut s = Session::default();
        assert_eq!(s.next_backoff(), Duration::from_millis(100));
        assert_eq!(s.next_backoff(), Duration::from_millis(200));
        // Two setbacks before the loop waited: it waits the longer one, once.
        assert_eq!(s.take_backoff(), Some(Duration::from_millis(200)));
        assert_eq!(s.take_backoff(), None);
    }
}
