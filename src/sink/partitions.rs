//! What the sink owns and what happens to it: the open batch, writing it, and a database outage
//! (pause, reconnect, resume). The rebalances (where an assigned partition starts, what happens to
//! a revoked partition's records) are in [`super::rebalance`]; the state they all change, and
//! the table of what each event does to a partition, in [`super::state`].
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
//! Everything here runs on the consumer's thread: the rebalance callback runs inside `poll`, so the
//! mutex around [`State`] is never contended; it exists because the callback reaches the state
//! through the consumer's context. Database calls are async; this thread drives them with
//! `Handle::block_on`, bounded by the write timeout.

use super::db::{self, DbError};
use super::metrics as m;
use super::options::{HoldAt, SinkOptions};
use super::rebalance::SinkContext;
use super::record::Entry;
use super::state::{Outage, SinkStats, State};
use super::store::{hold_if, Store};
use crate::health::Health;
use crate::kafka::access::ReadRights;
use crate::kafka::config::GroupProtocol;
use anyhow::{anyhow, Context as _};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// What the loop and the rebalance callback share.
pub(super) struct Shared {
    pub(super) opts: SinkOptions,
    pub(super) rt: tokio::runtime::Handle,
    /// Readiness: not while a database outage keeps the partitions paused.
    pub(super) health: Health,
    pub(super) state: Mutex<State>,
    /// Its Read rights (on the topic, on the group), watched while it runs: librdkafka retries
    /// refused fetches and commits itself.
    pub(super) rights: ReadRights,
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
                match opts.kafka.group_protocol {
                    GroupProtocol::Classic => "the group refuses its heartbeats and offsets (lag monitoring only: the database holds the sink's offsets)",
                    // A refused heartbeat stops the consumer (kafka::group, "Fatal errors").
                    GroupProtocol::Consumer => "the group refuses its heartbeats, which stops the consumer under the consumer protocol: nothing is stored until it is granted",
                },
            ),
            opts,
        })
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
    pub(super) fn enter_outage(
        &self,
        st: &mut State,
        consumer: &BaseConsumer<SinkContext>,
        e: &DbError,
    ) {
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

    pub(super) async fn read_offsets(&self, store: &Store) -> Result<BTreeMap<i32, i64>, DbError> {
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
}
