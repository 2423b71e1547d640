//! What the sink owns and what happens to it: the open batch, writing it, a database outage
//! (pause, reconnect, resume), and rebalances (where an assigned partition starts, what happens to
//! a revoked partition's records).
//!
//! ```text
//!            write ok                              write fails: unavailable
//!   ┌──────────────────────┐            ┌───────────────────────────────────────┐
//!   ▼                      │            │                                       ▼
//! CONSUMING ── batch due ──┴── write ───┘         PAUSED: every partition paused, polling goes on,
//!   ▲                                             the batch kept; reconnect at backoff deadlines
//!   └───── reconnected, batch written, partitions resumed ◄───────────────────┘
//! ```
//!
//! # Invariants
//! - The stored offsets (`sink_offsets`) are the truth. An assigned partition starts at its stored
//!   offset (the beginning when none is stored), never at the Kafka group's committed offset.
//! - A record's offset is stored only in the transaction that stores its row or dead letter.
//! - An outage never drops or dead-letters a record: the batch waits in memory, the partitions are
//!   paused (the consumer keeps polling, so it stays in the group and serves rebalances), and the
//!   same batch is written once the database answers.
//! - A revoked partition's records are either stored before the revoke completes (the batch is
//!   written inside the rebalance callback while the database answers and the assignment was not
//!   lost) or dropped; the next owner starts at the stored offsets, so dropped records are read
//!   again and nothing is lost.
//! - If the database is down when a partition is assigned, it starts at the Kafka group's
//!   committed offset, which is never above the stored one (it is committed only after the
//!   database commit of the same offsets, and stored offsets never move back), and is paused; once
//!   the database answers it is moved to its stored offset before it resumes.
//!
//! # What each event does to a partition
//! The per-partition state lives in [`State`], one method per event; `=` is "unchanged".
//!
//! | event                                   | owned | paused (the only pauses: [`Pauses`])        | unsynced | its records in the open batch |
//! |-----------------------------------------|-------|----------------------------------------------|----------|-------------------------------|
//! | assign, the database answers            | yes, from its stored offset | no: resumed, whatever librdkafka kept from an earlier ownership | no | none yet |
//! | assign during an outage                 | yes, from the group's committed offset | yes | yes | none yet |
//! | record consumed                         | =     | = (a paused partition delivers none)          | =        | added (the batch's age starts with the first) |
//! | batch written                           | =     | =                                             | =        | none (the batch and its age go) |
//! | outage begins (a write, read or connect finds the database unavailable) | = | every owned partition | = | kept |
//! | outage ends (reconnected)               | =     | no: every owned partition resumed, once the batch is written | no: moved to its stored offset | those of unsynced partitions dropped (read again from the stored offset), the rest written |
//! | revoke, the database answers            | no    | forgotten                                     | no       | written first                 |
//! | revoke during an outage, or lost        | no    | forgotten                                     | no       | dropped (the next owner reads them again from the stored offset) |
//!
//! "Forgotten" is the row of issue 19's defect: librdkafka keeps its application pause flag
//! across an unassign, so a partition revoked during an outage came back after it still paused
//! and was never read again. [`Pauses`] sets the flag on every assign, either way.
//!
//! The batch's age (`batch_since`) is set exactly while the batch holds a record, whichever row
//! empties it: a stale age would make every poll a 1 ms one and keep `--exit-when-idle` from ever
//! firing.
//!
//! Everything here runs on the consumer's thread: the rebalance callback runs inside `poll`, so the
//! mutex around [`State`] is never contended; it exists because the callback reaches the state
//! through the consumer's context. Database calls are async; this thread drives them with
//! `Handle::block_on`, bounded by the write timeout.

use super::db::{self, DbError};
use super::group_offsets::GroupOffsets;
use super::metrics as m;
use super::options::{HoldAt, SinkOptions};
use super::record::Entry;
use super::store::{hold_if, Batch, Store};
use crate::health::Health;
use crate::kafka::access::ReadRights;
use crate::kafka::logging;
use crate::kafka::pause::{PauseFlag, Pauses, Tp};
use anyhow::{anyhow, Context as _};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

/// Counters of one sink instance; logged at shutdown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SinkStats {
    /// Batches committed in the database.
    pub batches: u64,
    /// Records of those batches.
    pub records: u64,
    /// Rows new to the table.
    pub rows_inserted: u64,
    /// Rows that were there already (redone work).
    pub rows_conflicted: u64,
    pub dead_letters: u64,
    /// Database outages (each paused the partitions until the database answered again).
    pub outages: u64,
}

impl std::fmt::Display for SinkStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rows = [
            ("records stored", self.records),
            ("  rows inserted", self.rows_inserted),
            ("  rows already there", self.rows_conflicted),
            ("  dead-lettered", self.dead_letters),
            ("batches", self.batches),
            ("database outages", self.outages),
        ];
        for (i, (label, n)) in rows.iter().enumerate() {
            let end = if i + 1 < rows.len() { "\n" } else { "" };
            write!(f, "{label:<24}{n:>12}{end}")?;
        }
        Ok(())
    }
}

/// An ongoing database outage.
#[derive(Debug)]
struct Outage {
    since: Instant,
    /// Reconnection attempts so far.
    attempts: u32,
    next_attempt: Instant,
}

/// The sink's state, shared by the loop and the rebalance callback.
pub(super) struct State {
    /// The connection; None during an outage.
    store: Option<Store>,
    outage: Option<Outage>,
    /// The open batch: everything consumed and not stored yet.
    batch: Batch,
    /// When the open batch got its first record.
    batch_since: Option<Instant>,
    /// When the last record arrived.
    pub(super) last_record: Instant,
    /// The notifications topic (the partitions' topic in `pauses`).
    topic: String,
    /// Owned partitions and which of them are paused: the only way the sink pauses or resumes
    /// its consumer (see [`Pauses`]: librdkafka's flag outlives an unassign).
    pauses: Pauses,
    /// Partitions assigned while the database was down: not yet at their stored offsets.
    unsynced: BTreeSet<i32>,
    /// Batches committed so far (numbers the test hold).
    batches_written: u64,
    /// Stored offsets of owned partitions not yet acknowledged by the Kafka group.
    group: GroupOffsets,
    stats: SinkStats,
    /// An error of the rebalance callback, reported after `poll` returns.
    fatal: Option<anyhow::Error>,
}

/// The events of the table in the module doc that need neither the database nor the broker's
/// answer: what each does to the per-partition state. `flag` is the consumer's pause flag.
impl State {
    fn new(topic: String, store: Option<Store>) -> Self {
        State {
            topic,
            store,
            outage: None,
            batch: Batch::default(),
            batch_since: None,
            last_record: Instant::now(),
            pauses: Pauses::default(),
            unsynced: BTreeSet::new(),
            batches_written: 0,
            group: GroupOffsets::default(),
            stats: SinkStats::default(),
            fatal: None,
        }
    }

    /// Record consumed: into the open batch.
    fn push(&mut self, entry: Entry, offset: i64) {
        let p = entry.partition();
        match entry {
            Entry::Row(row, raw) => self.batch.rows.push((row, raw)),
            Entry::Dead(d) => {
                // Logged here (never the payload) and counted once stored.
                warn!(partition = d.partition, offset = d.offset, class = d.class, error = %d.message, "notification dead-lettered");
                self.batch.dead.push(d);
            }
        }
        self.batch.next_offsets.insert(p, offset + 1);
        let now = Instant::now();
        self.batch_since.get_or_insert(now);
        self.last_record = now;
    }

    fn tps(&self, parts: &[i32]) -> Vec<Tp> {
        parts.iter().map(|&p| (self.topic.clone(), p)).collect()
    }

    /// The owned partitions, in order.
    fn owned(&self) -> Vec<i32> {
        self.pauses.owned().map(|(_, p)| *p).collect()
    }

    fn owns_partitions(&self) -> bool {
        self.pauses.owned().next().is_some()
    }

    /// Assign (after the consumer's assign): owned; during an outage paused, and not at their
    /// stored offsets yet (unsynced); otherwise resumed, whatever librdkafka kept from an earlier
    /// ownership.
    fn assigned(&mut self, flag: &impl PauseFlag, parts: &[i32]) -> KafkaResult<()> {
        let outage = self.outage.is_some();
        if outage {
            self.unsynced.extend(parts);
        }
        let result = self.pauses.assigned(flag, self.tps(parts), outage);
        self.last_record = Instant::now();
        self.gauges();
        result
    }

    /// Revoke or lost (after the batch was written, if it could be): not owned, not paused, not
    /// unsynced, and their records out of the open batch; returns how many records were dropped.
    fn revoked(&mut self, parts: &[i32]) -> usize {
        let dropped = self.drop_records(parts);
        for p in parts {
            self.unsynced.remove(p);
        }
        self.group.revoked(parts);
        self.pauses.revoked(&self.tps(parts));
        self.gauges();
        dropped
    }

    /// An outage begins (or goes on): every owned partition paused.
    fn pause_all(&mut self, flag: &impl PauseFlag) -> KafkaResult<()> {
        let result = self.pauses.pause_all(flag).map(drop);
        self.gauges();
        result
    }

    /// The outage ended (the batch written): every owned partition resumed.
    fn resume_all(&mut self, flag: &impl PauseFlag) -> KafkaResult<()> {
        let result = self.pauses.resume_all(flag).map(drop);
        self.gauges();
        result
    }

    /// The partitions assigned during the outage, now to be moved to their stored offsets: no
    /// longer unsynced, and what was read of them from the committed offsets out of the batch.
    fn take_unsynced(&mut self) -> Vec<i32> {
        let unsynced: Vec<i32> = std::mem::take(&mut self.unsynced).into_iter().collect();
        self.drop_records(&unsynced);
        unsynced
    }

    /// The batch was written: it leaves the state, and a new one opens with the next record.
    fn written(&mut self) -> Batch {
        self.batch_since = None;
        std::mem::take(&mut self.batch)
    }

    /// Drops the records of `parts` from the open batch (the batch's age with them when none
    /// remain); returns how many.
    fn drop_records(&mut self, parts: &[i32]) -> usize {
        let dropped = self.batch.drop_partitions(parts);
        if self.batch.next_offsets.is_empty() {
            self.batch_since = None;
        }
        dropped
    }

    fn gauges(&self) {
        m::partitions(self.pauses.owned().count(), self.pauses.paused().count());
    }
}

/// What the loop and the rebalance callback share.
pub(super) struct Shared {
    pub(super) opts: SinkOptions,
    rt: tokio::runtime::Handle,
    /// Readiness: not while a database outage keeps the partitions paused.
    pub(super) health: Health,
    state: Mutex<State>,
    /// Its Read rights (on the topic, on the group), watched while it runs: librdkafka retries
    /// refused fetches and commits itself.
    pub(super) rights: ReadRights,
}

/// The consumer's context: the rebalance callbacks.
pub struct SinkContext {
    shared: Arc<Shared>,
}

impl Shared {
    pub(super) fn new(
        opts: SinkOptions,
        rt: tokio::runtime::Handle,
        store: Store,
        health: Health,
    ) -> Arc<Self> {
        Arc::new(Shared {
            rt,
            health,
            state: Mutex::new(State::new(opts.topic.clone(), Some(store))),
            rights: ReadRights::new(
                &opts.kafka,
                vec![opts.topic.clone()],
                &opts.group_id,
                "fetches refused; nothing is stored until it is granted",
                "the group refuses its heartbeats and offsets (lag monitoring only: the database holds the sink's offsets)",
            ),
            opts,
        })
    }

    pub(super) fn context(self: &Arc<Self>) -> SinkContext {
        SinkContext {
            shared: Arc::clone(self),
        }
    }

    pub(super) fn lock(&self) -> anyhow::Result<MutexGuard<'_, State>> {
        // A poisoned lock means a panic while the state was half-updated: nothing can be trusted.
        self.state
            .lock()
            .map_err(|_| anyhow!("sink state lock poisoned by an earlier panic"))
    }

    /// Adds a consumed record to the open batch.
    pub(super) fn push(&self, st: &mut State, entry: Entry, offset: i64) {
        st.push(entry, offset);
    }

    /// Whether the open batch should be written now; `quiet` says the last poll found nothing.
    pub(super) fn batch_due(&self, st: &State, quiet: bool) -> bool {
        let Some(since) = st.batch_since else {
            return false;
        };
        st.store.is_some()
            && (st.batch.records() >= self.opts.max_batch
                || since.elapsed() >= self.opts.commit_interval
                || (quiet && st.last_record.elapsed() >= self.opts.linger))
    }

    /// How long the next poll may wait: until the batch or a reconnection is due, at most `slice`.
    pub(super) fn poll_timeout(&self, st: &State, slice: Duration) -> Duration {
        let now = Instant::now();
        let mut t = slice;
        if let Some(since) = st.batch_since {
            t = t
                .min(self.opts.linger)
                .min((since + self.opts.commit_interval).saturating_duration_since(now));
        }
        if let Some(o) = &st.outage {
            t = t.min(o.next_attempt.saturating_duration_since(now));
        }
        t.max(Duration::from_millis(1))
    }

    /// Nothing arrived for `idle` since the last record or assignment, and nothing is open. Only
    /// once partitions are owned: a slow group join is not idleness.
    pub(super) fn idle(&self, st: &State, idle: Duration) -> bool {
        st.owns_partitions()
            && st.batch_since.is_none()
            && st.outage.is_none()
            && st.last_record.elapsed() >= idle
    }

    pub(super) fn take_fatal(&self, st: &mut State) -> Option<anyhow::Error> {
        st.fatal.take()
    }

    pub(super) fn stats(&self, st: &State) -> SinkStats {
        st.stats.clone()
    }

    pub(super) fn owns_partitions(&self, st: &State) -> bool {
        st.owns_partitions()
    }

    /// Writes the open batch in one database transaction. An unavailable database starts (or
    /// continues) an outage and is not an error; anything else the database says is.
    pub(super) fn flush(
        &self,
        st: &mut State,
        consumer: &BaseConsumer<SinkContext>,
    ) -> anyhow::Result<()> {
        if st.batch.next_offsets.is_empty() {
            return Ok(());
        }
        let State {
            store,
            batch,
            batches_written,
            ..
        } = st;
        let Some(store) = store.as_mut() else {
            return Ok(());
        };
        let n = *batches_written + 1;
        let hold = self.opts.test_hold.as_ref().map(|h| (h, n));
        let started = Instant::now();
        let (group, topic) = (&self.opts.group_id, &self.opts.topic);
        let result = self
            .rt
            .block_on(tokio::time::timeout(
                self.opts.write_timeout,
                store.write(group, topic, batch, hold),
            ))
            .unwrap_or_else(|_| {
                Err(DbError::Unavailable(format!(
                    "batch not written within {:?}",
                    self.opts.write_timeout
                )))
            });
        let written = match result {
            Ok(w) => w,
            Err(e) if e.is_unavailable() => {
                self.enter_outage(st, consumer, &e);
                return Ok(());
            }
            Err(e) => return Err(anyhow!(e).context("writing a batch")),
        };
        let took = started.elapsed();
        st.batches_written = n;
        let records = st.batch.records();
        let s = &mut st.stats;
        s.batches += 1;
        s.records += records as u64;
        s.rows_inserted += written.inserted;
        s.rows_conflicted += written.conflicted;
        s.dead_letters += written.dead_letters.values().sum::<u64>();
        m::batch_written(&written, records, took);
        debug!(
            records,
            inserted = written.inserted,
            conflicted = written.conflicted,
            dead_letters = ?written.dead_letters,
            offsets = ?st.batch.next_offsets,
            write_ms = took.as_millis() as u64,
            "batch stored"
        );
        hold_if(hold, HoldAt::AfterDbCommit, &st.batch);
        let batch = st.written();
        // Committed to the group by the loop's next `commit_group`, or by the revoke or the
        // shutdown that wrote the batch.
        st.group.stored(batch.next_offsets);
        Ok(())
    }

    /// Commits the stored offsets the Kafka group does not have yet, for lag monitoring only
    /// (the sink starts from the stored offsets, never from these): when due (new offsets, or
    /// [`group_offsets::RETRY`](super::group_offsets::RETRY) after an unanswered or refused
    /// commit), or at once with `now` (the partitions are about to go).
    pub(super) fn commit_group(
        &self,
        st: &mut State,
        consumer: &BaseConsumer<SinkContext>,
        now: bool,
    ) -> anyhow::Result<()> {
        if !self.opts.commit_to_kafka {
            return Ok(());
        }
        let at = Instant::now();
        let due = if now {
            st.group.take(at)
        } else {
            st.group.take_due(at)
        };
        let Some(offsets) = due else { return Ok(()) };
        let mut tpl = TopicPartitionList::new();
        for (p, o) in offsets {
            tpl.add_partition_offset(&self.opts.topic, p, Offset::Offset(o))?;
        }
        if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
            debug!(error = %e, "offsets not committed to the Kafka group (lag monitoring only); trying again");
        }
        Ok(())
    }

    /// The database is unavailable: drop the connection, pause every owned partition, schedule a
    /// reconnection. The open batch stays.
    fn enter_outage(&self, st: &mut State, consumer: &BaseConsumer<SinkContext>, e: &DbError) {
        st.store = None;
        // Paused before the outage is counted, so whoever sees it counted sees them paused.
        if let Err(e) = st.pause_all(consumer) {
            warn!(error = %e, "pausing partitions failed");
        }
        let now = Instant::now();
        match &mut st.outage {
            Some(o) => {
                o.attempts += 1;
                o.next_attempt = now
                    + self
                        .opts
                        .backoff
                        .delay(o.attempts, rand::random_range(0.5..=1.0));
            }
            None => {
                st.outage = Some(Outage {
                    since: now,
                    attempts: 0,
                    next_attempt: now + self.opts.backoff.delay(1, rand::random_range(0.5..=1.0)),
                });
                st.stats.outages += 1;
                m::outage_started();
                self.health
                    .not_ready("database unavailable: partitions paused");
                warn!(error = %e, partitions = ?st.owned(), buffered = st.batch.records(), "database unavailable: partitions paused, reconnecting");
            }
        }
    }

    /// During an outage, once the next attempt is due: reconnect, move the partitions assigned
    /// meanwhile to their stored offsets, write the waiting batch, resume every partition.
    pub(super) fn try_recover(
        &self,
        st: &mut State,
        consumer: &BaseConsumer<SinkContext>,
    ) -> anyhow::Result<()> {
        let Some(o) = &st.outage else { return Ok(()) };
        if Instant::now() < o.next_attempt {
            return Ok(());
        }
        let connected = self.rt.block_on(async {
            let client = db::connect(&self.opts.db).await?;
            Store::new(client).await
        });
        match connected {
            Ok(store) => st.store = Some(store),
            Err(e) if e.is_unavailable() => {
                debug!(error = %e, "database still unavailable");
                self.enter_outage(st, consumer, &e);
                return Ok(());
            }
            Err(e) => return Err(anyhow!(e).context("reconnecting to the database")),
        }
        if !st.unsynced.is_empty() {
            self.sync_unsynced(st, consumer)?;
        }
        self.flush(st, consumer)?;
        if st.store.is_none() {
            return Ok(()); // down again while writing: the outage goes on
        }
        st.resume_all(consumer)
            .context("resuming partitions after the outage")?;
        if let Some(o) = st.outage.take() {
            m::outage_ended(o.since.elapsed());
            self.health.ready();
            info!(
                outage_ms = o.since.elapsed().as_millis() as u64,
                attempts = o.attempts + 1,
                partitions = ?st.owned(),
                "database back: batch stored, partitions resumed"
            );
        }
        Ok(())
    }

    /// Moves the partitions assigned during the outage to their stored offsets (dropping what was
    /// read of them from the Kafka-committed position meanwhile).
    fn sync_unsynced(
        &self,
        st: &mut State,
        consumer: &BaseConsumer<SinkContext>,
    ) -> anyhow::Result<()> {
        let Some(store) = st.store.as_ref() else {
            return Ok(());
        };
        let stored = match self.rt.block_on(self.read_offsets(store)) {
            Ok(s) => s,
            Err(e) if e.is_unavailable() => {
                self.enter_outage(st, consumer, &e);
                return Ok(());
            }
            Err(e) => return Err(anyhow!(e).context("reading the stored offsets")),
        };
        let unsynced = st.take_unsynced();
        st.group
            .stored(unsynced.iter().filter_map(|p| Some((*p, *stored.get(p)?))));
        let mut tpl = TopicPartitionList::new();
        for &p in &unsynced {
            tpl.add_partition_offset(
                &self.opts.topic,
                p,
                stored
                    .get(&p)
                    .map_or(Offset::Beginning, |&o| Offset::Offset(o)),
            )?;
        }
        match consumer.seek_partitions(tpl, self.opts.write_timeout) {
            Ok(r) if r.elements().iter().all(|e| e.error().is_ok()) => {
                info!(partitions = ?unsynced, "partitions assigned during the outage moved to their stored offsets")
            }
            // Still correct from the committed offset (never above the stored one): only redone.
            other => {
                warn!(result = ?other.map(|r| r.elements().len()), "seeking to the stored offsets failed; reading on from the committed ones")
            }
        }
        Ok(())
    }

    async fn read_offsets(&self, store: &Store) -> Result<BTreeMap<i32, i64>, DbError> {
        tokio::time::timeout(
            self.opts.write_timeout,
            store.offsets(&self.opts.group_id, &self.opts.topic),
        )
        .await
        .unwrap_or_else(|_| {
            Err(DbError::Unavailable(
                "stored offsets not read in time".into(),
            ))
        })
    }

    /// Assignment: start each partition at its stored offset (the beginning when none is stored).
    fn on_assign(
        &self,
        st: &mut State,
        consumer: &BaseConsumer<SinkContext>,
        tpl: &mut TopicPartitionList,
    ) -> anyhow::Result<()> {
        let parts: Vec<i32> = partitions_of(tpl, &self.opts.topic);
        let stored = match &st.store {
            Some(store) => self.rt.block_on(self.read_offsets(store)),
            None => Err(DbError::Unavailable(
                "database unavailable at assignment".into(),
            )),
        };
        match stored {
            Ok(stored) => {
                for &p in &parts {
                    let at = stored
                        .get(&p)
                        .map_or(Offset::Beginning, |&o| Offset::Offset(o));
                    tpl.set_partition_offset(&self.opts.topic, p, at)?;
                }
                // The group may lag them (a crash between the two commits): it gets them too.
                st.group
                    .stored(parts.iter().filter_map(|p| Some((*p, *stored.get(p)?))));
                info!(partitions = ?parts, stored = ?stored, "partitions assigned: starting at the stored offsets");
            }
            Err(e) if e.is_unavailable() => {
                // The committed offsets (a lower bound of the stored ones) until the database
                // answers; paused and unsynced (`State::assigned`), moved to the stored offsets
                // on recovery.
                self.enter_outage(st, consumer, &e);
                warn!(partitions = ?parts, "partitions assigned during a database outage: paused");
            }
            Err(e) => return Err(anyhow!(e).context("reading the stored offsets")),
        }
        assign(consumer, tpl).context("assigning partitions")?;
        st.assigned(consumer, &parts)
            .context("pausing or resuming the assigned partitions")
    }

    /// Revocation: store the open batch first when the database answers and the assignment is
    /// still ours; otherwise drop the revoked partitions' records (the next owner reads them again
    /// from the stored offsets).
    fn on_revoke(
        &self,
        st: &mut State,
        consumer: &BaseConsumer<SinkContext>,
        tpl: &TopicPartitionList,
    ) -> anyhow::Result<()> {
        let parts = partitions_of(tpl, &self.opts.topic);
        let lost = consumer.assignment_lost();
        let buffered = st.batch.records();
        // A failed write still lets the partitions go (below); its error is reported after.
        let stored = if !lost && st.store.is_some() {
            self.flush(st, consumer)
        } else {
            Ok(())
        };
        if !lost {
            // Still this member's to commit, under the generation that owned them.
            self.commit_group(st, consumer, true)?;
        }
        let dropped = st.revoked(&parts);
        info!(partitions = ?parts, lost, buffered, dropped, "partitions revoked");
        unassign(consumer, tpl).context("unassigning partitions")?;
        stored
    }
}

fn partitions_of(tpl: &TopicPartitionList, topic: &str) -> Vec<i32> {
    tpl.elements()
        .iter()
        .filter(|e| e.topic() == topic)
        .map(|e| e.partition())
        .collect()
}

fn assign(consumer: &BaseConsumer<SinkContext>, tpl: &TopicPartitionList) -> KafkaResult<()> {
    match consumer.rebalance_protocol() {
        RebalanceProtocol::Cooperative => consumer.incremental_assign(tpl),
        _ => consumer.assign(tpl),
    }
}

fn unassign(consumer: &BaseConsumer<SinkContext>, tpl: &TopicPartitionList) -> KafkaResult<()> {
    match consumer.rebalance_protocol() {
        RebalanceProtocol::Cooperative => consumer.incremental_unassign(tpl),
        _ => consumer.unassign(),
    }
}

impl ClientContext for SinkContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        logging::log(level, fac, log_message);
    }

    /// A refused right reaches the loop too, as a consumer error, which says it once per
    /// back-off step ([`ReadRights::on_error`]); everything else as every client logs it.
    fn error(&self, error: KafkaError, reason: &str) {
        if ReadRights::is_refusal(error.rdkafka_error_code()) {
            return debug!(error = %error, reason, "not authorised");
        }
        logging::error(&error, reason);
    }
}

impl ConsumerContext for SinkContext {
    /// Replaces rdkafka's default rebalance: the assigned partitions' start offsets come from the
    /// database, and a revoked partition's batch is stored (or dropped) before it goes.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let shared = &self.shared;
        let mut st = match shared.lock() {
            Ok(g) => g,
            Err(e) => return error!(error = %e, "rebalance with a poisoned state"),
        };
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                shared
                    .rights
                    .group_answered("partitions assigned by the group");
                shared.on_assign(&mut st, consumer, tpl)
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                shared.on_revoke(&mut st, consumer, tpl)
            }
            other => {
                // librdkafka asks for the assignment to be dropped on a rebalance error.
                warn!(error = ?other, "rebalance error; dropping the assignment");
                let mut all = TopicPartitionList::new();
                for p in st.owned() {
                    all.add_partition(&shared.opts.topic, p);
                }
                shared.on_revoke(&mut st, consumer, &all)
            }
        };
        if let Err(e) = result {
            error!(error = format!("{e:#}"), "rebalance failed");
            st.fatal.get_or_insert(e);
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        // A refusal can come as the commit's error or only as its partitions' errors.
        let rights = &self.shared.rights;
        let mut refused = false;
        if let Err(e) = &result {
            if e.rdkafka_error_code() == Some(RDKafkaErrorCode::GroupAuthorizationFailed) {
                rights.group_refused();
                refused = true;
            }
        }
        for e in offsets.elements() {
            match e.error().err().and_then(|e| e.rdkafka_error_code()) {
                Some(RDKafkaErrorCode::TopicAuthorizationFailed) => rights.topic_refused(e.topic()),
                Some(RDKafkaErrorCode::GroupAuthorizationFailed) => rights.group_refused(),
                _ => continue,
            }
            refused = true;
        }
        if result.is_ok() {
            // `try_lock`: a commit answered while the state is held (never expected: callbacks
            // run inside `poll`, which the loop calls unlocked) is simply committed again.
            if let Ok(mut st) = self.shared.state.try_lock() {
                for e in offsets.elements() {
                    if let (true, Offset::Offset(o)) = (e.error().is_ok(), e.offset()) {
                        if e.topic() == self.shared.opts.topic {
                            st.group.acknowledged(e.partition(), o);
                        }
                    }
                }
            }
        }
        match result {
            _ if refused => {}
            Ok(()) => rights.group_answered("offsets committed to the group"),
            Err(e) => {
                debug!(error = %e, "offset commit to the Kafka group failed (lag monitoring only)")
            }
        }
    }
}

impl Batch {
    /// Drops the records of `partitions`; returns how many.
    pub fn drop_partitions(&mut self, partitions: &[i32]) -> usize {
        let before = self.records();
        self.rows
            .retain(|(r, _)| !partitions.contains(&r.partition));
        self.dead.retain(|d| !partitions.contains(&d.partition));
        for p in partitions {
            self.next_offsets.remove(p);
        }
        before - self.records()
    }
}

#[cfg(test)]
mod tests {
    //! The rows of the module doc's table that need neither a broker nor a database, walked on
    //! [`State`] with librdkafka's application pause flag as it behaves (set by pause, cleared by
    //! resume, untouched by assign and unassign). tests/sink.rs drives the same rows on a broker.
    use super::*;
    use crate::sink::record::{DeadLetter, RawRecord, RecordError};
    use rdkafka::TopicPartitionList;
    use std::cell::RefCell;

    #[derive(Default)]
    struct Flags(RefCell<BTreeSet<i32>>);

    impl PauseFlag for Flags {
        fn pause(&self, tpl: &TopicPartitionList) -> KafkaResult<()> {
            let mut f = self.0.borrow_mut();
            f.extend(tpl.elements().iter().map(|e| e.partition()));
            Ok(())
        }
        fn resume(&self, tpl: &TopicPartitionList) -> KafkaResult<()> {
            let mut f = self.0.borrow_mut();
            for e in tpl.elements() {
                f.remove(&e.partition());
            }
            Ok(())
        }
    }

    impl Flags {
        fn set(&self) -> Vec<i32> {
            self.0.borrow().iter().copied().collect()
        }
    }

    fn state() -> State {
        State::new("n".into(), None)
    }

    fn outage(st: &mut State, flags: &Flags) {
        let now = Instant::now();
        st.outage = Some(Outage {
            since: now,
            attempts: 0,
            next_attempt: now,
        });
        st.pause_all(flags).unwrap();
    }

    /// The outage ends as `Shared::try_recover` ends it: unsynced partitions moved (their records
    /// dropped), the batch written, every partition resumed.
    fn recover(st: &mut State, flags: &Flags) -> (Vec<i32>, Batch) {
        let synced = st.take_unsynced();
        let written = st.written();
        st.resume_all(flags).unwrap();
        st.outage = None;
        (synced, written)
    }

    fn record(st: &mut State, partition: i32, offset: i64) {
        let raw = RawRecord {
            key: None,
            value: None,
            headers: serde_json::json!([]),
            timestamp: None,
        };
        let d = DeadLetter::new(partition, offset, raw, &RecordError::Empty);
        st.push(Entry::Dead(d), offset);
    }

    fn paused(st: &State) -> Vec<i32> {
        st.pauses.paused().map(|(_, p)| *p).collect()
    }

    #[test]
    fn assign_when_the_database_answers_owns_and_resumes() {
        let (flags, mut st) = (Flags::default(), state());
        st.assigned(&flags, &[0, 1]).unwrap();
        assert_eq!(st.owned(), vec![0, 1]);
        assert!(paused(&st).is_empty() && flags.set().is_empty());
        assert!(st.unsynced.is_empty());
    }

    #[test]
    fn assign_during_an_outage_owns_pauses_and_leaves_unsynced() {
        let (flags, mut st) = (Flags::default(), state());
        st.assigned(&flags, &[0]).unwrap();
        outage(&mut st, &flags);
        st.assigned(&flags, &[1]).unwrap();
        assert_eq!((paused(&st), flags.set()), (vec![0, 1], vec![0, 1]));
        assert_eq!(st.unsynced, BTreeSet::from([1]));
    }

    #[test]
    fn a_partition_revoked_during_an_outage_is_resumed_when_it_comes_back_after_it() {
        // Instance B of the issue: its partitions paused by the outage, one taken away meanwhile.
        let (flags, mut st) = (Flags::default(), state());
        st.assigned(&flags, &[3, 4, 5]).unwrap();
        outage(&mut st, &flags);
        st.assigned(&flags, &[0, 1, 2]).unwrap();
        assert_eq!(st.revoked(&[0, 1, 2]), 0);
        assert_eq!(st.owned(), vec![3, 4, 5]);
        assert!(st.unsynced.is_empty(), "a revoked partition is not synced");
        recover(&mut st, &flags);
        assert_eq!(
            flags.set(),
            vec![0, 1, 2],
            "librdkafka kept the revoked ones' flag"
        );
        // They come back with no outage going on: they must be read.
        st.assigned(&flags, &[0, 1, 2]).unwrap();
        assert!(flags.set().is_empty(), "still paused: {:?}", flags.set());
        assert!(paused(&st).is_empty() && st.unsynced.is_empty());
    }

    #[test]
    fn a_partition_revoked_while_running_comes_back_paused_during_an_outage() {
        let (flags, mut st) = (Flags::default(), state());
        st.assigned(&flags, &[0, 1]).unwrap();
        st.revoked(&[1]);
        outage(&mut st, &flags);
        st.assigned(&flags, &[1]).unwrap();
        assert_eq!(flags.set(), vec![0, 1]);
        let (synced, _) = recover(&mut st, &flags);
        assert_eq!(synced, vec![1]);
        assert!(flags.set().is_empty() && paused(&st).is_empty());
    }

    #[test]
    fn revoke_and_lost_drop_the_partitions_records_and_the_age_with_the_last() {
        let (flags, mut st) = (Flags::default(), state());
        st.assigned(&flags, &[0, 1]).unwrap();
        record(&mut st, 0, 10);
        record(&mut st, 1, 20);
        record(&mut st, 1, 21);
        assert_eq!(st.revoked(&[1]), 2);
        assert_eq!(st.batch.next_offsets, BTreeMap::from([(0, 11)]));
        assert!(
            st.batch_since.is_some(),
            "partition 0's record is still open"
        );
        assert_eq!(st.revoked(&[0]), 1);
        assert_eq!(st.batch.records(), 0);
        assert!(st.batch_since.is_none());
        assert!(!st.owns_partitions());
    }

    #[test]
    fn outage_begins_pauses_every_owned_partition_and_keeps_the_batch() {
        let (flags, mut st) = (Flags::default(), state());
        st.assigned(&flags, &[0, 1]).unwrap();
        record(&mut st, 0, 5);
        outage(&mut st, &flags);
        assert_eq!((paused(&st), flags.set()), (vec![0, 1], vec![0, 1]));
        assert_eq!(st.batch.records(), 1);
        assert!(st.batch_since.is_some());
    }

    #[test]
    fn outage_ends_drops_the_unsynced_records_writes_the_rest_and_resumes_all() {
        let (flags, mut st) = (Flags::default(), state());
        st.assigned(&flags, &[0]).unwrap();
        record(&mut st, 0, 7);
        outage(&mut st, &flags);
        st.assigned(&flags, &[1]).unwrap();
        // Read from the committed offset before the pause took (a race librdkafka allows).
        record(&mut st, 1, 3);
        let (synced, written) = recover(&mut st, &flags);
        assert_eq!(synced, vec![1]);
        assert_eq!(written.next_offsets, BTreeMap::from([(0, 8)]));
        assert!(flags.set().is_empty() && paused(&st).is_empty());
        assert!(st.batch_since.is_none());
    }

    #[test]
    fn an_outage_whose_batch_held_only_unsynced_records_leaves_no_batch_age() {
        let (flags, mut st) = (Flags::default(), state());
        outage(&mut st, &flags);
        st.assigned(&flags, &[1]).unwrap();
        record(&mut st, 1, 3);
        st.take_unsynced();
        assert_eq!(st.batch.records(), 0);
        assert!(
            st.batch_since.is_none(),
            "an empty batch with an age: every poll 1 ms, never idle"
        );
    }

    #[test]
    fn batch_written_takes_the_batch_and_its_age() {
        let (flags, mut st) = (Flags::default(), state());
        st.assigned(&flags, &[0]).unwrap();
        record(&mut st, 0, 1);
        let b = st.written();
        assert_eq!(b.records(), 1);
        assert_eq!(st.batch.records(), 0);
        assert!(st.batch_since.is_none());
        assert_eq!(st.owned(), vec![0], "ownership and pauses unchanged");
    }
}
