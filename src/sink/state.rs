//! The sink's state, one struct shared by the loop and the rebalance callback: the partitions
//! owned and paused, those not yet at their stored offsets, the open batch and its age, an
//! outage, the offsets the Kafka group has yet to acknowledge, and the counters.
//!
//! The events below need neither the database nor the broker's answer: [`super::partitions`]
//! (the batch, outages) and [`super::rebalance`] (assign, revoke) call them once the database or
//! the group has answered, and unit tests walk the table on them. tests/sink.rs drives the same
//! rows on a broker.
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

use super::group_offsets::GroupOffsets;
use super::metrics as m;
use super::record::Entry;
use super::store::{Batch, Store};
use crate::kafka::pause::{PauseFlag, Pauses, Tp};
use rdkafka::error::KafkaResult;
use std::collections::BTreeSet;
use std::time::Instant;
use tracing::warn;

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
pub(super) struct Outage {
    pub(super) since: Instant,
    /// Reconnection attempts so far.
    pub(super) attempts: u32,
    pub(super) next_attempt: Instant,
}

/// The sink's state, shared by the loop and the rebalance callback.
pub(super) struct State {
    /// The connection; None during an outage.
    pub(super) store: Option<Store>,
    pub(super) outage: Option<Outage>,
    /// The open batch: everything consumed and not stored yet.
    pub(super) batch: Batch,
    /// When the open batch got its first record.
    pub(super) batch_since: Option<Instant>,
    /// When the last record arrived.
    pub(super) last_record: Instant,
    /// The notifications topic (the partitions' topic in `pauses`).
    topic: String,
    /// Owned partitions and which of them are paused: the only way the sink pauses or resumes
    /// its consumer (see [`Pauses`]: librdkafka's flag outlives an unassign).
    pauses: Pauses,
    /// Partitions assigned while the database was down: not yet at their stored offsets.
    pub(super) unsynced: BTreeSet<i32>,
    /// Batches committed so far (numbers the test hold).
    pub(super) batches_written: u64,
    /// Stored offsets of owned partitions not yet acknowledged by the Kafka group.
    pub(super) group: GroupOffsets,
    pub(super) stats: SinkStats,
    /// An error of the rebalance callback, reported after `poll` returns.
    pub(super) fatal: Option<anyhow::Error>,
}

/// The events of the table in the module doc that need neither the database nor the broker's
/// answer: what each does to the per-partition state. `flag` is the consumer's pause flag.
impl State {
    pub(super) fn new(topic: String, store: Option<Store>) -> Self {
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
    pub(super) fn push(&mut self, entry: Entry, offset: i64) {
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
    pub(super) fn owned(&self) -> Vec<i32> {
        self.pauses.owned().map(|(_, p)| *p).collect()
    }

    pub(super) fn owns_partitions(&self) -> bool {
        self.pauses.owned().next().is_some()
    }

    /// Assign (after the consumer's assign): owned; during an outage paused, and not at their
    /// stored offsets yet (unsynced); otherwise resumed, whatever librdkafka kept from an earlier
    /// ownership.
    pub(super) fn assigned(&mut self, flag: &impl PauseFlag, parts: &[i32]) -> KafkaResult<()> {
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
    pub(super) fn revoked(&mut self, parts: &[i32]) -> usize {
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
    pub(super) fn pause_all(&mut self, flag: &impl PauseFlag) -> KafkaResult<()> {
        let result = self.pauses.pause_all(flag).map(drop);
        self.gauges();
        result
    }

    /// The outage ended (the batch written): every owned partition resumed.
    pub(super) fn resume_all(&mut self, flag: &impl PauseFlag) -> KafkaResult<()> {
        let result = self.pauses.resume_all(flag).map(drop);
        self.gauges();
        result
    }

    /// The partitions assigned during the outage, now to be moved to their stored offsets: no
    /// longer unsynced, and what was read of them from the committed offsets out of the batch.
    pub(super) fn take_unsynced(&mut self) -> Vec<i32> {
        let unsynced: Vec<i32> = std::mem::take(&mut self.unsynced).into_iter().collect();
        self.drop_records(&unsynced);
        unsynced
    }

    /// The batch was written: it leaves the state, and a new one opens with the next record.
    pub(super) fn written(&mut self) -> Batch {
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

#[cfg(test)]
mod tests {
    //! The rows of the module doc's table that need neither a broker nor a database, walked on
    //! [`State`] with librdkafka's application pause flag as it behaves (set by pause, cleared by
    //! resume, untouched by assign and unassign). tests/sink.rs drives the same rows on a broker.
    use super::*;
    use crate::sink::record::{DeadLetter, RawRecord, RecordError};
    use rdkafka::TopicPartitionList;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

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
