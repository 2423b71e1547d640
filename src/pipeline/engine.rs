//! The transactional consume-process-produce step: poll, decode, apply the crossing rule,
//! produce. One consumer, one transactional producer, the per-partition state.
//!
//! ```text
//!  poll ──► record of partition p ──► (restore p if needed) ──► begin if no txn open
//!             │
//!             ├─ tick ok ─► crossing rule ─► notifications (send) + p's symbol marked dirty
//!             ├─ bad tick ─► DLQ record (send)
//!             └─ offsets[p] = offset + 1
//!  commit ──► dirty states to changelog partition p ─► send_offsets_to_transaction(offsets,
//!             group metadata) ─► commit_transaction                       (see [`super::commit`])
//! ```
//!
//! # Invariants
//! - Everything a batch produces (notifications, DLQ records, state) and the offsets that move past
//!   its input commit in one transaction, or not at all.
//! - The in-memory state of a partition is the committed one plus the effects of the open
//!   transaction. After an abort it is dropped and restored from the changelog, and the consumer is
//!   rewound to the committed offsets, so the redo sees exactly the committed world.
//! - A partition's state is restored (read_committed, to its high watermark with every transaction
//!   before it decided) before any of its ticks is processed, and only after its committed offset
//!   could be fetched as stable: an open transaction of a previous owner is resolved first, and
//!   its commit marker on the changelog is read, not just its offsets.
//!
//! # Error handling
//! Transactional errors are classified by [`crate::kafka::txn::classify`]: abortable ones lead to
//! [`Engine::abort`] (abort, rewind, restore) and processing goes on; fatal ones stop the engine
//! with the error. Everything runs on one thread: the rebalance callbacks run inside `poll`.

use super::batch::{self, OpenBatch};
use super::commit::{Committer, Stats};
use super::held::RestoreHolds;
use super::live::LiveRules;
use super::rebalance::RebalanceHandler;
use super::settings::EngineSettings;
use super::state::{self, Held, PartitionState};
use crate::alert::{apply_alerts, apply_rules, LiveOutcome, Notification, Outcome, Source};
use crate::backoff::Setbacks;
use crate::dlq;
use crate::health::Health;
use crate::kafka::access;
use crate::kafka::offsets::seek_to_committed;
use crate::kafka::read::{reader, Hold, Reader};
use crate::kafka::tpl::partition_list;
use crate::kafka::txn::{TxnError, TxnErrorClass};
use crate::kafka::Isolation;
use crate::rules::live::FIRED_HEADER;
use crate::trace;
use anyhow::{anyhow, Context as _};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, OwnedHeaders};
use rdkafka::producer::BaseRecord;
use rdkafka::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tracing::{debug, info, warn};

/// Bound on the metadata round trip that asks whether Read on the input is still refused: short,
/// since the loop waits for it.
const REFUSAL_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Bound on leaving the group at close: the revoke served, the leave sent
/// ([`crate::kafka::group::leave`]).
const LEAVE_BOUND: Duration = Duration::from_secs(5);

/// What one [`Engine::poll_once`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Polled {
    /// A record was processed (or dead-lettered) in the open batch.
    pub record: bool,
    /// Partitions whose state was restored from the changelog.
    pub restored: usize,
}

/// What a tick did, by the rules file or the live alerts, ready to be written.
enum Evaluated {
    /// Accepted: its notifications, and the one-shot alerts (id, version) that fired.
    Accepted(Vec<Notification>, Vec<(String, i64)>),
    Stale(u64),
    Unwatched,
}

/// What one restore of pending partitions did.
#[derive(Debug, Default)]
struct Restore {
    /// Partitions restored.
    restored: usize,
    /// Partitions sought back to their committed offsets first: a record of them polled before
    /// is dropped (it is read again).
    sought: Vec<i32>,
}

/// One processor instance: consumer, transactional producer, state.
pub struct Engine {
    consumer: BaseConsumer<RebalanceHandler>,
    committer: Arc<Committer>,
    /// Reads the changelog on restores; kept so each restore does not pay a new connection, and
    /// made again when it does not answer ([`Engine::restore_reader`]).
    restore_reader: Mutex<Reader>,
    /// Live alerts: the rules topic's reader and the barriers (`None` with a rules file).
    live: Option<LiveRules>,
    /// Changelog partitions whose restore is held by an undecided transaction ([`super::held`]).
    holds: Mutex<RestoreHolds>,
    /// Where a held restore beats and says what holds it ([`Engine::with_health`]); without it
    /// (the demo, library tests) a hold is still logged and counted.
    health: Option<Health>,
}

/// How long a restore waits for its primed rules barriers ([`LiveRules::prime`]).
const PRIME_TIMEOUT: Duration = Duration::from_secs(5);

/// The fetch long-poll of the consumer with live alerts (see `Engine::start`).
const FETCH_WAIT: &str = "fetch.wait.max.ms";
const LIVE_FETCH_WAIT_MS: &str = "20";

/// Longest poll while a partition is held for its rules: the barrier's return is noticed soon.
const HELD_POLL: Duration = Duration::from_millis(5);

/// How long the restore reader has to answer a metadata request before it is made again
/// ([`Engine::restore_reader`]). Healthy brokers answer in milliseconds, and a reader made again
/// for nothing costs one new connection. With 5 s, the probe was 5.2 s of the 37.5 s that an
/// instance took to commit again in the freeze case (tests/coordinator.rs, against a bound of
/// 40 s).
const READER_PROBE: Duration = Duration::from_secs(2);

/// A reader of the changelog for restores: read_committed, so an aborted batch's state records
/// are never restored.
fn reader_of(kafka: &crate::kafka::KafkaConfig) -> anyhow::Result<Reader> {
    reader(kafka, Isolation::ReadCommitted).context("creating the restore reader")
}

impl Engine {
    /// Creates the clients, registers the transactional id (fencing a predecessor) and subscribes.
    /// Blocking: call it off the async runtime.
    pub fn start(settings: EngineSettings) -> anyhow::Result<Self> {
        let txn_id = settings.transactional_id();
        let instance = settings.static_membership.then_some(txn_id.as_str());
        let mut consumer_cfg = settings.kafka.group_consumer(
            settings.group_id(),
            instance,
            settings.transaction_timeout,
        );
        if settings.rules_topic.is_some() && !settings.kafka.properties.contains_key(FETCH_WAIT) {
            // Live alerts pause a partition for its rules and resume it a barrier's round trip
            // later; librdkafka adds a resumed partition to the broker's next fetch, which waits
            // for the one in flight: up to fetch.wait.max.ms (500 ms by default) when the other
            // partitions are quiet or held too. 20 ms bounds that wait; an idle consumer asks its
            // brokers 50 times a second instead of twice.
            consumer_cfg.set(FETCH_WAIT, LIVE_FETCH_WAIT_MS);
        }
        let restore_reader = reader_of(&settings.kafka)?;
        let live = settings
            .rules_topic
            .as_deref()
            .map(|topic| {
                LiveRules::start(
                    &settings.kafka,
                    topic,
                    settings.hooks.freeze_rules.as_deref(),
                )
            })
            .transpose()?;
        let holds = Mutex::new(RestoreHolds::new(&settings.topics.changelog));
        let committer = Committer::start(settings)?;
        let consumer: BaseConsumer<RebalanceHandler> = consumer_cfg
            .create_with_context(RebalanceHandler::new(Arc::clone(&committer)))
            .context("creating the consumer")?;
        let settings = committer.settings();
        consumer
            .subscribe(&[&settings.topics.input])
            .context("subscribing")?;
        info!(
            transactional_ids = ?settings.transactional_ids(),
            group = settings.group_id(),
            input = %settings.topics.input,
            guarantee = ?settings.guarantee,
            overlap_commits = settings.overlap_commits,
            rules_topic = settings.rules_topic.as_deref().unwrap_or("(rules file)"),
            "engine started"
        );
        Ok(Engine {
            consumer,
            committer,
            restore_reader: Mutex::new(restore_reader),
            live,
            holds,
            health: None,
        })
    }

    /// Reports a restore held by an undecided transaction to `health` ([`super::held`]): the
    /// loop's own beats and readiness go there too.
    pub fn with_health(mut self, health: Health) -> Self {
        self.health = Some(health);
        self
    }

    /// The restore reader, made again when it gets no metadata of the changelog within
    /// [`READER_PROBE`]. A broker that went silent with its connections open (frozen, a hung VM)
    /// stays "up" for librdkafka until a request to it times out (`socket.timeout.ms`, 60 s), and
    /// librdkafka sends a metadata request to the broker it used last. The reader, idle since the
    /// previous restore, asked a frozen broker and waited 19 s, past the bound an instance has to
    /// heal in (tests/coordinator.rs, the freeze case; issue 20). A new client connects to the
    /// brokers that answer, and learns from them that the silent one is gone.
    fn restore_reader(&self) -> anyhow::Result<MutexGuard<'_, Reader>> {
        let mut reader = self
            .restore_reader
            .lock()
            .map_err(|_| anyhow!("restore reader lock poisoned"))?;
        let changelog = &self.committer.settings().topics.changelog;
        if let Err(e) = reader.fetch_metadata(Some(changelog), READER_PROBE) {
            warn!(
                error = %e,
                probe_s = READER_PROBE.as_secs(),
                "the restore reader got no metadata in time (a silent broker?); making a new one"
            );
            *reader = reader_of(&self.committer.settings().kafka)?;
        }
        Ok(reader)
    }

    /// Polls once (rebalance callbacks run here), restores newly owned partitions, and processes
    /// the record polled, if any.
    pub fn poll_once(&self, timeout: Duration) -> anyhow::Result<Polled> {
        let timeout = match self.poll_rules()? {
            true => timeout.min(HELD_POLL),
            false => timeout,
        };
        let polled = self.consumer.poll(timeout);
        if let Some(e) = self.committer.lock()?.take_fatal() {
            return Err(e.into());
        }
        let restore = self.restore_pending()?;
        let polled_nothing = polled.is_none();
        let record = match polled {
            None => false,
            // Polled before its partition was sought back to the committed offset: it is read
            // again from there.
            Some(Ok(m)) if restore.sought.contains(&m.partition()) => false,
            Some(Ok(m)) => match self.process(&m) {
                Ok(processed) => processed,
                Err(e) if e.class == TxnErrorClass::Abortable => {
                    warn!(error = %e, "abortable transactional error; aborting and rewinding");
                    self.abort_after(Some(&e))?;
                    false
                }
                Err(e) => return Err(e.into()),
            },
            Some(Err(KafkaError::MessageConsumptionFatal(code))) => {
                return Err(crate::kafka::group::FatalConsumerError(code).into())
            }
            Some(Err(e)) => {
                match self.committer.read_refused(e.rdkafka_error_code()) {
                    // A right taken away while running: said once per back-off step, which the
                    // loop waits before polling again (the consumer reports it per partition and
                    // fetch).
                    Some(right) => {
                        debug!(error = %e, "consumer error: not authorised");
                        let mut session = self.committer.lock()?;
                        session.input_refused |= e.rdkafka_error_code()
                            == Some(RDKafkaErrorCode::TopicAuthorizationFailed);
                        self.committer
                            .set_back(&mut session, &BTreeSet::from([right]), false);
                    }
                    // Broker transport errors and the like: librdkafka recovers by itself.
                    None => warn!(error = %e, "consumer error"),
                }
                false
            }
        };
        if record {
            self.committer.lock()?.input_refused = false;
        } else if polled_nothing {
            self.recheck_input_read()?;
        }
        Ok(Polled {
            record,
            restored: restore.restored,
        })
    }

    /// While Read on the input is refused (`Session::input_refused`) and the poll brought nothing,
    /// asks the broker whether it still refuses: if so, that is a setback like the first refusal
    /// (named, counted, the back-off grows), which the loop waits out before the next poll, so
    /// this asks once per back-off step. Once granted, librdkafka fetches again by itself.
    fn recheck_input_read(&self) -> anyhow::Result<()> {
        if !self.committer.lock()?.input_refused {
            return Ok(());
        }
        let input = &self.committer.settings().topics.input;
        let refused = access::refused(self.consumer.client(), input, REFUSAL_PROBE_TIMEOUT);
        let mut session = self.committer.lock()?;
        match refused {
            Ok(true) => {
                let right = self
                    .committer
                    .read_refused(Some(RDKafkaErrorCode::TopicAuthorizationFailed));
                self.committer
                    .set_back(&mut session, &right.into_iter().collect(), false);
            }
            Ok(false) => {
                info!(input = %input, "the input may be read again");
                session.input_refused = false;
            }
            Err(e) => {
                // Unknown (the broker did not answer in time): ask again after a back-off.
                debug!(error = %e, "could not ask whether the input is refused");
                self.committer
                    .set_back(&mut session, &BTreeSet::new(), false);
            }
        }
        Ok(())
    }

    /// Why the engine cannot process whatever arrives yet (`None` once it owns partitions and
    /// has every one of them restored); a restore held by an undecided transaction says what holds
    /// it.
    pub fn unsettled(&self) -> anyhow::Result<Option<String>> {
        let session = self.committer.lock()?;
        Ok(if session.state.owned().next().is_none() {
            Some("no partitions assigned".to_owned())
        } else if !session.state.pending().is_empty() {
            let held = self.lock_holds()?.describe(Instant::now());
            Some(held.unwrap_or_else(|| "restoring state".to_owned()))
        } else {
            None
        })
    }

    fn lock_holds(&self) -> anyhow::Result<MutexGuard<'_, RestoreHolds>> {
        self.holds
            .lock()
            .map_err(|_| anyhow!("restore holds lock poisoned"))
    }

    /// The changelog partitions held now are `holds` (none: no hold left): said every
    /// [`super::held::SAY_EVERY`], counted, and shown by the health, whose beat this is.
    fn holds_now(&self, holds: &[Hold]) -> anyhow::Result<()> {
        let now = Instant::now();
        let mut held = self.lock_holds()?;
        if holds.is_empty() && held.is_empty() {
            return Ok(());
        }
        if held.observed(holds, now) {
            held.say(now);
        }
        crate::metrics::restore_held(held.len());
        if let Some(health) = &self.health {
            match held.describe(now) {
                Some(what) => {
                    health.held(&what);
                    health.not_ready(&what);
                }
                None => health.unheld(),
            }
        }
        Ok(())
    }

    /// What a restore's read reports every few seconds ([`crate::kafka::read::WATCH_EVERY`]): a
    /// sighting of its holds, and records read, are progress; a read that sees neither does not
    /// beat, so the watchdog still ends one that never returns.
    fn restore_waited(&self, records: u64, holds: &[Hold]) {
        if !holds.is_empty() {
            if let Err(e) = self.holds_now(holds) {
                warn!(error = format!("{e:#}"), "restore hold not reported");
            }
        } else if records > 0 {
            if let Some(health) = &self.health {
                health.beat();
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
            if self.poll_once(Duration::from_millis(100))?.record {
                done += 1;
            }
        }
        Ok(())
    }

    /// Live alerts: takes what the rules reader has into the joins and resumes the held partitions
    /// whose join is ready. Returns whether a partition is still held.
    fn poll_rules(&self) -> anyhow::Result<bool> {
        let Some(live) = &self.live else {
            return Ok(false);
        };
        let mut session = self.committer.lock()?;
        let held = session.state.held_mut().next().is_some();
        if !live.due(held) {
            return Ok(false);
        }
        let ready = live.poll(&mut session.state);
        let input = &self.committer.settings().topics.input;
        let partitions: Vec<i32> = ready.iter().map(|&(p, _)| p).collect();
        super::rebalance::resume(&self.consumer, input, &partitions);
        for (p, offset) in ready {
            // The partition is at its held tick already (sought when the hold began). Seeking
            // there again, without waiting, wakes librdkafka's fetcher: a resume alone leaves the
            // partition to the broker thread's next wake-up, which came a second later (measured
            // with rules-bench: every hold ended, then 1.00 s without a record of the partition).
            if let Err(e) =
                self.consumer
                    .seek(input, p, rdkafka::Offset::Offset(offset), Duration::ZERO)
            {
                debug!(partition = p, offset, error = %e, "seek on resume (a wake-up) refused");
            }
        }
        let held = session.state.held_mut().next().is_some();
        Ok(held)
    }

    /// Holds partition `p` at its tick at `offset` (timestamp `ts`) until its join is ready:
    /// paused, sought back to the tick, and a barrier sent (see [`super::live`]).
    fn hold(
        &self,
        live: &LiveRules,
        state: &mut state::StateStore,
        p: i32,
        offset: i64,
        ts: i64,
    ) -> Result<(), TxnError> {
        let input = &self.committer.settings().topics.input;
        let tpl = crate::kafka::tpl::partition_list(input, [p]);
        let abortable =
            |step, e| TxnError::with_class(step, crate::kafka::txn::TxnErrorClass::Abortable, e);
        self.consumer
            .pause(&tpl)
            .map_err(|e| abortable("pause a held partition", e))?;
        let now = Instant::now();
        state.hold(
            p,
            Held {
                offset,
                ts,
                since: now,
                barrier_sent: now,
            },
        );
        self.consumer
            .seek(
                input,
                p,
                rdkafka::Offset::Offset(offset),
                Duration::from_secs(5),
            )
            .map_err(|e| abortable("seek a held partition", e))?;
        live.barrier(p, offset);
        debug!(
            partition = p,
            offset, ts, "tick held until its rules are known"
        );
        Ok(())
    }

    /// Restores the state of owned partitions that have none loaded, seeking those that are
    /// unpositioned to their committed offsets first. A refused right (Read on the group or the
    /// input, for the committed offsets) is a setback, not an error: the partitions stay pending
    /// (and unpositioned, since their records are dropped meanwhile) until a later attempt, after
    /// the back-off, succeeds. So are partitions held by an undecided transaction on the changelog
    /// ([`state::restore_watched`]): the others are installed, the held ones stay pending and are
    /// read again at the next poll, and the hold is said and shown ([`super::held`]).
    fn restore_pending(&self) -> anyhow::Result<Restore> {
        let (pending, unpositioned) = {
            let session = self.committer.lock()?;
            let pending = session.state.pending();
            let unpositioned = session.state.unpositioned(&pending);
            (pending, unpositioned)
        };
        if pending.is_empty() {
            // Held partitions revoked meanwhile hold nothing any more.
            self.holds_now(&[])?;
            return Ok(Restore::default());
        }
        let topics = &self.committer.settings().topics;
        // Fetching the committed offsets of a read_committed consumer waits until no transaction
        // holds pending offsets on these partitions (KIP-447 "require stable"): a previous owner's
        // last transaction is resolved before its changelog is read.
        // Both waits are for a transaction to be decided: one bound.
        let timeout = state::restore_timeout(self.committer.settings().transaction_timeout);
        let offsets = self.committer.offsets();
        let positioned = seek_to_committed(
            &self.consumer,
            offsets,
            &topics.input,
            &unpositioned,
            timeout,
        )
        .and_then(|()| {
            let committed = offsets.fetch(
                &partition_list(&topics.input, pending.iter().copied()),
                timeout,
            )?;
            // A partition the broker answered with an error has no offset to trust.
            for e in committed.elements() {
                e.error()?;
            }
            Ok(committed)
        });
        let committed = match positioned {
            Ok(committed) => committed,
            Err(e) => {
                let Some(right) = self.committer.read_refused(e.rdkafka_error_code()) else {
                    return Err(e).context("fetching committed offsets");
                };
                debug!(error = %e, "committed offsets refused; restoring later");
                let mut session = self.committer.lock()?;
                pending.iter().for_each(|&p| session.state.unposition(p));
                self.committer
                    .set_back(&mut session, &BTreeSet::from([right]), false);
                return Ok(Restore::default());
            }
        };
        self.committer.lock()?.state.positioned(&unpositioned);
        let started = Instant::now();
        // The committed offsets being stable does not mean the changelog has its marker: the
        // restore waits for it itself (see `state`).
        let reader = self.restore_reader()?;
        let restored = state::restore_watched(
            &reader,
            &topics.changelog,
            &pending,
            timeout,
            &mut |records, holds| self.restore_waited(records, holds),
        )?;
        let done: Vec<i32> = restored.states.keys().copied().collect();
        let joins = match &self.live {
            Some(live) if !done.is_empty() => {
                Some(live.restore(&reader, &done, &restored.joins, timeout)?)
            }
            _ => None,
        };
        drop(reader);
        self.holds_now(&restored.held)?;
        let mut session = self.committer.lock()?;
        for (p, s) in restored.states {
            session.state.install(p, s);
        }
        if let (Some(live), Some(joins)) = (&self.live, joins) {
            let primed: Vec<i32> = joins.keys().copied().collect();
            for (p, j) in joins {
                session.state.install_join(p, j);
            }
            live.reassign(&mut session.state)?;
            live.prime(&mut session.state, &primed, PRIME_TIMEOUT);
        }
        if !done.is_empty() {
            session.restored(done.len(), started.elapsed());
        }
        debug!(committed = ?committed.to_topic_map(), restored = ?done, "restore done");
        Ok(Restore {
            restored: done.len(),
            sought: unpositioned,
        })
    }

    /// Applies one input record inside the open transaction (beginning one if none is open).
    /// Returns false if it was not processed (dropped, or held for its rules: read again later).
    fn process(&self, m: &BorrowedMessage<'_>) -> Result<bool, TxnError> {
        let c = &self.committer;
        let settings = c.settings();
        let p = m.partition();
        let mut session = c.lock()?;
        if m.topic() == settings.topics.input
            && session.state.is_owned(p)
            && session.state.get(p).is_none()
        {
            // Owned, its state not restored (a right needed for that is refused): dropped, and
            // read again once the restore has sought the partition back to its committed offset.
            debug!(
                partition = p,
                offset = m.offset(),
                "record of a partition awaiting its restore; dropped"
            );
            session.state.unposition(p);
            return Ok(false);
        }
        if m.topic() != settings.topics.input || session.state.get(p).is_none() {
            // Not ours (any more): librdkafka drops fetched records of revoked partitions, so this
            // is a safety net, and the record is not acknowledged.
            warn!(
                topic = m.topic(),
                partition = p,
                offset = m.offset(),
                "record of a partition not owned; ignored"
            );
            return Ok(false);
        }
        if let Some(live) = &self.live {
            if session.state.is_held(p) {
                // Fetched before the hold paused and sought its partition back: read again from
                // the held tick once the hold ends.
                return Ok(false);
            }
            let ts = m.timestamp().to_millis().unwrap_or(0);
            let Some(join) = session.state.join_mut(p) else {
                // Loaded with its state, always; a safety net like the one above.
                session.state.unposition(p);
                return Ok(false);
            };
            let ready = join.ready(ts, m.offset());
            let (applied, invalid) = join.take_applied();
            live.said(p, applied, invalid);
            if !ready {
                self.hold(live, &mut session.state, p, m.offset(), ts)?;
                return Ok(false);
            }
        }
        c.begin(&mut session)?;
        let arrived = batch::arrival(m.timestamp().to_millis(), Instant::now());
        let (txn, states, join, outbox) = session
            .batch(p)
            .expect("a batch was begun and partition p is loaded (checked above)");
        match dlq::admit(
            m.payload(),
            settings.max_tick_bytes,
            &settings.retry,
            settings.faults,
        ) {
            Err(failure) => {
                dlq::send(
                    |record| c.output(outbox, record),
                    &settings.topics.dlq,
                    m,
                    settings.group_id(),
                    &failure,
                )
                .map_err(|e| TxnError::new("produce dead letter", e))?;
                *txn.counts.dead_letters.entry(failure.class()).or_default() += 1;
            }
            Ok((tick, attempts)) => {
                if attempts > 1 {
                    debug!(symbol = %tick.symbol, seq = tick.seq, attempts, "tick succeeded after retries");
                    txn.counts.retried += 1;
                }
                let mut current = states.get(&tick.symbol).cloned();
                // The crossing rule, against the live alerts in force or the rules file: what
                // fired as notifications, and the one-shot alerts to delete with them.
                let source = || Source {
                    topic: m.topic().to_owned(),
                    partition: p,
                    offset: m.offset(),
                };
                let tick_ts = || tick.ts.clone().unwrap_or_else(|| record_ts(m));
                let evaluated = match join {
                    Some(join) => match apply_alerts(
                        join.table().of_symbol(&tick.symbol),
                        &mut current,
                        &tick,
                    ) {
                        LiveOutcome::Accepted { fired } => {
                            let ts = tick_ts();
                            let mut one_shots = Vec::new();
                            let ns = fired
                                .iter()
                                .map(|f| {
                                    if f.one_shot {
                                        join.fire_one_shot(&f.id, f.version);
                                        one_shots.push((f.id.clone(), f.version));
                                    }
                                    Notification::of_alert(&tick, f, ts.clone(), source())
                                })
                                .collect();
                            Evaluated::Accepted(ns, one_shots)
                        }
                        LiveOutcome::Stale { last_seq } => Evaluated::Stale(last_seq),
                    },
                    None => match apply_rules(&settings.rules, &mut current, &tick) {
                        Outcome::Accepted { crossings } => {
                            let ts = tick_ts();
                            let ns = crossings
                                .iter()
                                .map(|c| Notification::new(&tick, c, ts.clone(), source()))
                                .collect();
                            Evaluated::Accepted(ns, Vec::new())
                        }
                        Outcome::Stale { last_seq } => Evaluated::Stale(last_seq),
                        Outcome::Unwatched => Evaluated::Unwatched,
                    },
                };
                match evaluated {
                    Evaluated::Accepted(notifications, one_shots) => {
                        let headers = if notifications.is_empty() {
                            OwnedHeaders::new()
                        } else {
                            trace::headers(m)
                        };
                        for n in &notifications {
                            // Serializing strings, decimals and integers cannot fail.
                            let value = serde_json::to_vec(n).unwrap_or_default();
                            let record = BaseRecord::to(&settings.topics.notifications)
                                .key(tick.symbol.as_bytes())
                                .payload(value.as_slice())
                                .headers(headers.clone());
                            c.output(outbox, record)
                                .map_err(|e| TxnError::new("produce notification", e))?;
                            txn.counts.notifications += 1;
                        }
                        // Deleted in the same transaction as its notification: a one-shot alert
                        // fires once, whatever crashes.
                        for (id, version) in one_shots {
                            let version = version.to_string();
                            let record = BaseRecord::<[u8], [u8]>::to(
                                settings.rules_topic.as_deref().unwrap_or_default(),
                            )
                            .partition(p)
                            .key(id.as_bytes())
                            .headers(OwnedHeaders::new().insert(Header {
                                key: FIRED_HEADER,
                                value: Some(version.as_bytes()),
                            }));
                            c.output(outbox, record)
                                .map_err(|e| TxnError::new("produce one-shot tombstone", e))?;
                            txn.counts.one_shots += 1;
                        }
                        if let Some(s) = current {
                            states.insert(tick.symbol.clone(), s);
                        }
                        txn.changed(p, tick.symbol);
                    }
                    Evaluated::Stale(last_seq) => {
                        debug!(symbol = %tick.symbol, seq = tick.seq, last_seq, "stale tick ignored");
                        txn.counts.stale += 1;
                    }
                    Evaluated::Unwatched => txn.counts.unwatched += 1,
                }
            }
        }
        txn.processed(p, m.offset(), arrived);
        Ok(true)
    }

    /// How long to wait before going on, once, after a transaction aborted for a missing right.
    pub fn take_backoff(&self) -> anyhow::Result<Option<Duration>> {
        Ok(self.committer.lock()?.take_backoff())
    }

    /// The open batch, if any: what decides when it commits.
    pub fn open_batch(&self) -> anyhow::Result<Option<OpenBatch>> {
        Ok(self.committer.lock()?.open_batch())
    }

    /// Commits the open transaction (if any). An abortable failure aborts and rewinds, and is not
    /// an error; a fatal one is. Returns whether it committed.
    pub fn commit(&self) -> anyhow::Result<bool> {
        let mut session = self.committer.lock()?;
        let owned: Vec<i32> = session.state.owned().collect();
        Ok(self
            .committer
            .commit_or_abort(&mut session, &self.consumer, &owned)?)
    }

    /// The open batch is due: commits it, or with `--overlap-commits` hands its commit to a thread
    /// of its own and goes on ([`super::commit::Committer::hand_off`]). Returns false if
    /// something aborted.
    pub fn hand_off(&self) -> anyhow::Result<bool> {
        let mut session = self.committer.lock()?;
        let owned: Vec<i32> = session.state.owned().collect();
        Ok(self
            .committer
            .hand_off(&mut session, &self.consumer, &owned)?)
    }

    /// With a commit in flight: sends the held outputs once it has drained, and counts it, or
    /// aborts and rewinds, once it has ended. Does not wait.
    pub fn progress(&self) -> anyhow::Result<()> {
        let mut session = self.committer.lock()?;
        if !session.overlapping() {
            return Ok(());
        }
        let owned: Vec<i32> = session.state.owned().collect();
        self.committer
            .settle(&mut session, &self.consumer, &owned, false)?;
        Ok(())
    }

    /// Puts the batch's state and offsets into the open transaction and waits until every record of
    /// it is in the log, uncommitted: what the demo does before aborting, so that the aborted
    /// records stay in the log behind an abort marker instead of being purged from the local
    /// queue. Processing must not continue in this transaction afterwards; commit or abort.
    pub fn stage_and_flush(&self) -> anyhow::Result<()> {
        let mut session = self.committer.lock()?;
        Ok(self
            .committer
            .stage_and_flush(&mut session, &self.consumer)?)
    }

    /// Aborts the open transaction (if any), rewinds every owned partition to its committed offset
    /// and drops the state, which is restored before the next record.
    pub fn abort(&self) -> anyhow::Result<()> {
        self.abort_after(None)
    }

    /// [`Engine::abort`] because of `cause`, which may name a refused right.
    fn abort_after(&self, cause: Option<&TxnError>) -> anyhow::Result<()> {
        let mut session = self.committer.lock()?;
        let owned: Vec<i32> = session.state.owned().collect();
        Ok(self
            .committer
            .abort_and_rewind(&mut session, &self.consumer, &owned, cause)?)
    }

    /// The right whose refusal `e` is, if `e` is the consumer's fatal GROUP_AUTHORIZATION_FAILED:
    /// under the consumer protocol librdkafka makes a refused ConsumerGroupHeartbeat fatal, where
    /// the classic protocol reports it and retries. The loop then makes the engine again
    /// ([`super::run_blocking`]).
    pub fn group_refused(&self, e: &anyhow::Error) -> Option<String> {
        crate::kafka::group::is_group_refused(e)
            .then(|| {
                self.committer
                    .read_refused(Some(RDKafkaErrorCode::GroupAuthorizationFailed))
            })
            .flatten()
    }

    /// `right` was refused to the engine this one replaces, after `setbacks` since its last
    /// commit ([`super::commit::Session::refused_before`]).
    pub fn refused_before(&self, right: String, setbacks: Setbacks) -> anyhow::Result<()> {
        self.committer.lock()?.refused_before(right, setbacks);
        Ok(())
    }

    /// Setbacks since the last commit: carried to the engine made again in this one's place.
    pub fn setbacks(&self) -> anyhow::Result<Setbacks> {
        Ok(self.committer.lock()?.setbacks())
    }

    /// Counters so far.
    pub fn stats(&self) -> anyhow::Result<Stats> {
        Ok(self.committer.lock()?.stats().clone())
    }

    /// A copy of the state of every owned, loaded partition.
    pub fn state_snapshot(&self) -> anyhow::Result<BTreeMap<i32, PartitionState>> {
        Ok(self.committer.lock()?.state.snapshot())
    }

    /// Owned input partitions.
    pub fn owned_partitions(&self) -> anyhow::Result<Vec<i32>> {
        Ok(self.committer.lock()?.state.owned().collect())
    }

    /// The settings the engine runs with.
    pub fn settings(&self) -> &EngineSettings {
        self.committer.settings()
    }

    /// Commits what is open, then leaves the group (which revokes every partition). Each step
    /// logs how long it took, so that a slow shutdown shows where its time went.
    pub fn close(self) -> anyhow::Result<Stats> {
        let started = Instant::now();
        let committed = self.commit();
        info!(
            took_ms = started.elapsed().as_millis() as u64,
            committed = committed.is_ok(),
            "closing: open transaction ended"
        );
        let step = Instant::now();
        let left = crate::kafka::group::leave(
            &self.consumer,
            self.settings().kafka.group_protocol,
            || Ok(self.committer.lock()?.state.owned().next().is_some()),
            LEAVE_BOUND,
        )?;
        info!(
            took_ms = step.elapsed().as_millis() as u64,
            revoked = left.revoked,
            leave_sent = left.leave_sent,
            "closing: left the group; closing the consumer"
        );
        // The consumer's drop closes it (leaves the group, waits for what librdkafka still has
        // in flight, serving callbacks); timed here, since nothing else would say that the time
        // went there.
        let step = Instant::now();
        drop(self.consumer);
        info!(
            took_ms = step.elapsed().as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "closing: consumer closed"
        );
        committed?;
        let mut session = self.committer.lock()?;
        if let Some(e) = session.take_fatal() {
            return Err(e.into());
        }
        Ok(session.stats().clone())
    }
}

/// The record timestamp as RFC 3339 (stands in for a tick without `ts`).
fn record_ts(m: &BorrowedMessage<'_>) -> String {
    let ms = m.timestamp().to_millis().unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    });
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}
