//! What alert-deliver keeps about each partition it reads, from one poll to the next, and what
//! becomes of it on every event: one owner per consumer ([`Partitions`]), one method per event,
//! reached by the rebalance callbacks of the deliverer's own consumer context
//! ([`DeliverContext`]) as well as by the poll loop.
//!
//! A partition of a retry bucket whose head record is not due yet is *held*: paused at that
//! record (librdkafka's application pause flag, set and cleared only through [`Pauses`]) and
//! sought back to it when it is due. That state outlives a poll, so each event that changes who
//! owns a partition or where it is read from decides its fate here; a held head that outlives its
//! event either skips records (sought past them) or strands a partition (paused for ever):
//!
//! | event                                   | not owned                    | owned, reading     | owned, held at `o` (paused)             |
//! |-----------------------------------------|------------------------------|--------------------|-----------------------------------------|
//! | assign ([`Partitions::assigned`])       | reading, from the committed offset; resumed, since librdkafka keeps an application pause from an earlier ownership | - | - |
//! | revoke ([`Partitions::revoked`])        | -                            | not owned          | not owned; `o` forgotten at once: another owner may commit past it |
//! | lost ([`Partitions::lost`])             | -                            | not owned          | not owned; `o` forgotten                |
//! | a record at `o` not due ([`Partitions::hold`]) | ignored               | held at `o`        | (records behind the head are not looked at) |
//! | due ([`Partitions::resume_due`])        | -                            | -                  | sought to `o`, resumed: reading         |
//! | abort, rewound to `r` ([`Partitions::rewind`]) | -                     | sought to `r`      | `o` dropped, sought to `r`, resumed: reading, so `[r, o)` is read again |
//!
//! Beside its head, a partition keeps the highest offset whose clamped due time was reported
//! ([`Partitions::clamp_is_news`]): a held record is read again when it comes due, and a rewind
//! reads records again, so without it one record would be reported at every read. It goes with
//! the ownership (revoke, lost, assign: the next owner reports the record once more) and
//! outlives hold, due and rewind.
//!
//! Revoke and assign are handled inside the rebalance callback, not at the next look at the
//! assignment: a partition revoked and assigned again within one poll would otherwise keep a
//! held offset from before, and be sought to it past hand-offs another owner committed since.
//! For the same reason a record polled before its partition's latest assign belongs to an
//! earlier ownership and is left out of a batch ([`Partitions::is_current`]): the partition is
//! read again from its committed offset.
//!
//! A batch needs no state here: it is delivered and committed between two polls, so no
//! rebalance falls inside one.

use crate::kafka::access::ReadRights;
use crate::kafka::logging;
use crate::kafka::pause::{PauseFlag, Pauses, Tp};
use anyhow::Context as _;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::{ClientContext, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tracing::{debug, error, info, warn};

/// Bound on seeking partitions (a local operation once they are assigned).
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

/// The head of a held partition: its first record that is not due yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub due: SystemTime,
    pub offset: i64,
    /// Its record timestamp (ms), for the oldest-age gauge.
    pub timestamp: Option<i64>,
}

/// What [`Partitions`] needs of a consumer: the pause flag and a seek.
pub trait Position: PauseFlag {
    /// Moves each partition to its offset.
    fn seek_to(&self, positions: &BTreeMap<Tp, i64>) -> anyhow::Result<()>;
}

impl<C: ConsumerContext> Position for BaseConsumer<C> {
    fn seek_to(&self, positions: &BTreeMap<Tp, i64>) -> anyhow::Result<()> {
        if positions.is_empty() {
            return Ok(());
        }
        let list = crate::kafka::tpl::positions_list(positions)?;
        let result = self
            .seek_partitions(list, SEEK_TIMEOUT)
            .context("seeking")?;
        for e in result.elements() {
            e.error()
                .with_context(|| format!("seeking {}/{}", e.topic(), e.partition()))?;
        }
        Ok(())
    }
}

/// The per-partition state of one deliverer's consumer (see the module doc).
#[derive(Debug, Default)]
pub struct Partitions {
    /// The owned partitions and librdkafka's application pause flag of each.
    pauses: Pauses,
    /// The held partitions (all paused) and their head.
    held: BTreeMap<Tp, Held>,
    /// Counts assigns: a poll is stamped with it ([`Partitions::stamp`]).
    assigns: u64,
    /// The value of `assigns` at each owned partition's latest assign.
    assigned_at: BTreeMap<Tp, u64>,
    /// The highest offset of each owned partition whose clamped due time was reported.
    reported: BTreeMap<Tp, i64>,
    /// A pause or resume that failed inside a rebalance callback, which cannot return it: the
    /// poll loop stops on it ([`Partitions::failure`]), since a partition could stay paused.
    failed: Option<String>,
}

impl Partitions {
    /// Assign: the partitions are owned from now on and read from their committed offset, not
    /// held and not paused, whatever librdkafka kept from an earlier ownership.
    pub fn assigned(&mut self, consumer: &impl PauseFlag, parts: Vec<Tp>) -> KafkaResult<()> {
        self.assigns += 1;
        for tp in &parts {
            self.held.remove(tp);
            self.reported.remove(tp);
            self.assigned_at.insert(tp.clone(), self.assigns);
        }
        self.pauses.assigned(consumer, parts, false)
    }

    /// Revoke: the partitions and their held heads are forgotten. librdkafka keeps their pause
    /// flag; the next [`Partitions::assigned`] clears it.
    pub fn revoked(&mut self, parts: &[Tp]) {
        for tp in parts {
            self.held.remove(tp);
            self.reported.remove(tp);
            self.assigned_at.remove(tp);
        }
        self.pauses.revoked(parts);
    }

    /// Lost (expelled from the group): every partition, as revoked.
    pub fn lost(&mut self) {
        let all: Vec<Tp> = self.pauses.owned().cloned().collect();
        self.revoked(&all);
    }

    /// A record at `held.offset` is not due: the partition is paused and held there. Returns
    /// whether it is (a partition not owned is not).
    pub fn hold(&mut self, consumer: &impl PauseFlag, tp: Tp, held: Held) -> KafkaResult<bool> {
        if self.pauses.pause(consumer, [&tp])?.is_empty() {
            return Ok(false);
        }
        debug!(topic = %tp.0, partition = tp.1, offset = held.offset, "head not due: partition paused");
        self.held.insert(tp, held);
        Ok(true)
    }

    /// A record of `tp` at `offset` had its due time clamped: whether that is news, to be
    /// reported. Records are read in offset order, so one at or below the highest reported was
    /// reported by this ownership already (read again once due, or after a rewind).
    pub fn clamp_is_news(&mut self, tp: &Tp, offset: i64) -> bool {
        if !self.pauses.is_owned(tp) {
            return false;
        }
        match self.reported.get(tp) {
            Some(at) if *at >= offset => false,
            _ => {
                self.reported.insert(tp.clone(), offset);
                true
            }
        }
    }

    /// Due: each held partition whose head is due at `now` is sought to the head and resumed.
    /// Returns them.
    pub fn resume_due(
        &mut self,
        consumer: &impl Position,
        now: SystemTime,
    ) -> anyhow::Result<Vec<Tp>> {
        let due: BTreeMap<Tp, i64> = self
            .held
            .iter()
            .filter(|(_, h)| h.due <= now)
            .map(|(tp, h)| (tp.clone(), h.offset))
            .collect();
        self.read_from(consumer, &due)
    }

    /// Abort: each owned partition of `positions` is sought back to its position (the first
    /// record of the aborted batch) and read from there: a held head further on is dropped and
    /// its pause lifted, since the records before it are to be read again.
    pub fn rewind(
        &mut self,
        consumer: &impl Position,
        positions: &BTreeMap<Tp, i64>,
    ) -> anyhow::Result<Vec<Tp>> {
        let owned: BTreeMap<Tp, i64> = positions
            .iter()
            .filter(|(tp, _)| self.pauses.is_owned(tp))
            .map(|(tp, o)| (tp.clone(), *o))
            .collect();
        self.read_from(consumer, &owned)
    }

    /// Seeks then resumes (in that order: resumed first, the fetcher would go on from where it
    /// had fetched to); the partitions are no longer held.
    fn read_from(
        &mut self,
        consumer: &impl Position,
        positions: &BTreeMap<Tp, i64>,
    ) -> anyhow::Result<Vec<Tp>> {
        if positions.is_empty() {
            return Ok(Vec::new());
        }
        consumer.seek_to(positions)?;
        for tp in positions.keys() {
            self.held.remove(tp);
        }
        self.pauses
            .resume(consumer, positions.keys())
            .context("resuming partitions")
    }

    /// A stamp for the records of a poll, taken right after it returns (the rebalance callbacks
    /// run inside it, before it returns a record of the new assignment).
    pub fn stamp(&self) -> u64 {
        self.assigns
    }

    /// Whether a record of `tp` polled with `stamp` is to be processed: its partition is owned
    /// and was not assigned again since, and is not held (records behind a held head are read
    /// again from the head).
    pub fn is_current(&self, tp: &Tp, stamp: u64) -> bool {
        self.assigned_at.get(tp).is_some_and(|at| *at <= stamp) && !self.held.contains_key(tp)
    }

    /// The earliest due time of a held head.
    pub fn next_due(&self) -> Option<SystemTime> {
        self.held.values().map(|h| h.due).min()
    }

    /// Whether partitions are owned and none is held: nothing waits for a due time, so a
    /// deliverer that polls nothing more is done with what it was given (`--exit-when-idle`).
    pub fn settled(&self) -> bool {
        self.held.is_empty() && self.pauses.owned().next().is_some()
    }

    /// The held partitions and their heads.
    pub fn held(&self) -> impl Iterator<Item = (&Tp, &Held)> + '_ {
        self.held.iter()
    }

    /// Whether `tp` is paused (librdkafka's application flag, as set through here).
    pub fn is_paused(&self, tp: &Tp) -> bool {
        self.pauses.is_paused(tp)
    }

    /// A pause or resume a rebalance callback could not make.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }
}

/// alert-deliver's consumer context: librdkafka's logs and errors routed as every client routes
/// them ([`crate::kafka::logging`]), and the rebalance events, which reach [`Partitions`] inside
/// the callback.
#[derive(Debug, Default)]
pub struct DeliverContext {
    /// Locked by the poll loop between polls and by the callbacks inside a poll (one thread:
    /// never contended; the loop must not hold it across a poll).
    partitions: Mutex<Partitions>,
}

impl DeliverContext {
    /// The per-partition state.
    pub fn partitions(&self) -> anyhow::Result<MutexGuard<'_, Partitions>> {
        self.partitions
            .lock()
            .map_err(|_| anyhow::anyhow!("the partition state lock was poisoned by a panic"))
    }
}

fn tps(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

impl ClientContext for DeliverContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        logging::log(level, fac, log_message);
    }

    /// A refused Read reaches the loop too, as a consumer error, which says it once per back-off
    /// step ([`ReadRights::on_error`]); everything else as every client logs it.
    fn error(&self, error: KafkaError, reason: &str) {
        if ReadRights::is_refusal(error.rdkafka_error_code()) {
            return tracing::debug!(error = %error, reason, "not authorised");
        }
        logging::error(&error, reason);
    }
}

impl ConsumerContext for DeliverContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let parts = tps(tpl);
        let lost = consumer.assignment_lost();
        info!(partitions = ?parts, lost, "partitions revoked");
        match self.partitions() {
            Ok(mut p) if lost => p.lost(),
            Ok(mut p) => p.revoked(&parts),
            Err(e) => error!(error = %e, "partitions revoked"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let mut p = match self.partitions() {
            Ok(p) => p,
            Err(e) => return error!(error = %e, "rebalance"),
        };
        match rebalance {
            Rebalance::Assign(tpl) => {
                let parts = tps(tpl);
                info!(partitions = ?parts, "partitions assigned");
                if let Err(e) = p.assigned(consumer, parts) {
                    error!(error = %e, "resuming assigned partitions failed");
                    p.failed
                        .get_or_insert(format!("resuming assigned partitions: {e}"));
                }
            }
            Rebalance::Error(e) => {
                // librdkafka unassigned what it could not assign or revoke: forget what this
                // consumer no longer has.
                warn!(error = %e, "rebalance error");
                match consumer.assignment() {
                    Ok(tpl) => {
                        let now: BTreeSet<Tp> = tps(&tpl).into_iter().collect();
                        let gone: Vec<Tp> = p
                            .pauses
                            .owned()
                            .filter(|tp| !now.contains(*tp))
                            .cloned()
                            .collect();
                        p.revoked(&gone);
                    }
                    Err(e) => {
                        p.failed.get_or_insert(format!(
                            "reading the assignment after a rebalance error: {e}"
                        ));
                    }
                }
            }
            Rebalance::Revoke(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::time::UNIX_EPOCH;

    /// A consumer as librdkafka behaves for this: the application pause flag (set by pause,
    /// cleared by resume, kept across unassign and assign) and where each partition is read from.
    #[derive(Default)]
    struct Fake {
        paused: RefCell<BTreeSet<Tp>>,
        at: RefCell<BTreeMap<Tp, i64>>,
    }

    impl PauseFlag for Fake {
        fn pause(&self, tpl: &TopicPartitionList) -> KafkaResult<()> {
            self.paused.borrow_mut().extend(tps(tpl));
            Ok(())
        }
        fn resume(&self, tpl: &TopicPartitionList) -> KafkaResult<()> {
            for tp in tps(tpl) {
                self.paused.borrow_mut().remove(&tp);
            }
            Ok(())
        }
    }

    impl Position for Fake {
        fn seek_to(&self, positions: &BTreeMap<Tp, i64>) -> anyhow::Result<()> {
            self.at.borrow_mut().extend(positions.clone());
            Ok(())
        }
    }

    impl Fake {
        fn reading(&self, tp: &Tp) -> bool {
            !self.paused.borrow().contains(tp)
        }
    }

    fn tp(p: i32) -> Tp {
        ("n.retry.1s".to_owned(), p)
    }

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    fn held(offset: i64, due: u64) -> Held {
        Held {
            due: at(due),
            offset,
            timestamp: None,
        }
    }

    /// Owns p0 (and p1), held at offset 20 (due at 100 s).
    fn holding() -> (Fake, Partitions) {
        let c = Fake::default();
        let mut p = Partitions::default();
        p.assigned(&c, vec![tp(0), tp(1)]).unwrap();
        assert!(p.hold(&c, tp(0), held(20, 100)).unwrap());
        (c, p)
    }

    #[test]
    fn a_record_not_due_holds_its_partition_and_what_follows_it() {
        let (c, p) = holding();
        assert!(!c.reading(&tp(0)) && p.is_paused(&tp(0)));
        assert!(!p.is_current(&tp(0), p.stamp()), "records behind the head");
        assert!(p.is_current(&tp(1), p.stamp()));
        assert_eq!(p.next_due(), Some(at(100)));
    }

    #[test]
    fn settled_once_owned_and_nothing_held() {
        let (fake, mut p) = holding();
        assert!(!p.settled(), "a held head waits for its due time");
        p.resume_due(&fake, at(100)).unwrap();
        assert!(p.settled());
        p.lost();
        assert!(
            !p.settled(),
            "nothing owned: not settled (a slow join is not idleness)"
        );
    }

    #[test]
    fn a_due_head_is_sought_to_and_resumed() {
        let (c, mut p) = holding();
        assert!(p.resume_due(&c, at(99)).unwrap().is_empty());
        assert_eq!(p.resume_due(&c, at(100)).unwrap(), vec![tp(0)]);
        assert_eq!(c.at.borrow()[&tp(0)], 20);
        assert!(c.reading(&tp(0)) && p.held().next().is_none());
    }

    #[test]
    fn an_abort_reads_a_held_partition_again_from_the_rewind() {
        // The aborted batch had p0's records from offset 12; p0 was held at 20 meanwhile.
        let (c, mut p) = holding();
        let rewind = BTreeMap::from([(tp(0), 12), (tp(1), 5)]);
        p.rewind(&c, &rewind).unwrap();
        assert_eq!(*c.at.borrow(), rewind);
        assert!(c.reading(&tp(0)) && !p.is_paused(&tp(0)));
        assert!(p.is_current(&tp(0), p.stamp()), "[12, 20) is read again");
        // The old head is not sought to when its due time comes: that would skip [12, 20).
        assert!(p.resume_due(&c, at(1000)).unwrap().is_empty());
        assert_eq!(c.at.borrow()[&tp(0)], 12);
    }

    #[test]
    fn a_partition_revoked_while_held_comes_back_read_from_its_committed_offset() {
        let (c, mut p) = holding();
        p.revoked(&[tp(0)]);
        assert!(!c.reading(&tp(0)), "librdkafka keeps the flag");
        assert!(p.next_due().is_none(), "the head is forgotten at once");
        assert!(!p.is_current(&tp(0), p.stamp()));
        assert!(
            p.hold(&c, tp(0), held(30, 5)).is_ok_and(|h| !h),
            "not owned"
        );
        p.assigned(&c, vec![tp(0)]).unwrap();
        assert!(c.reading(&tp(0)), "resumed on assign");
        assert!(p.resume_due(&c, at(1000)).unwrap().is_empty());
        assert!(c.at.borrow().is_empty(), "never sought to the stale head");
    }

    #[test]
    fn a_lost_assignment_forgets_every_partition_and_head() {
        let (c, mut p) = holding();
        p.lost();
        assert!(p.held().next().is_none());
        assert!(!p.is_current(&tp(1), p.stamp()));
        p.assigned(&c, vec![tp(0), tp(1)]).unwrap();
        assert!(c.reading(&tp(0)) && c.reading(&tp(1)));
    }

    #[test]
    fn records_polled_before_a_reassign_are_not_current() {
        let c = Fake::default();
        let mut p = Partitions::default();
        p.assigned(&c, vec![tp(0)]).unwrap();
        let before = p.stamp();
        assert!(p.is_current(&tp(0), before));
        // Revoked and assigned again inside one poll: read again from the committed offset.
        p.revoked(&[tp(0)]);
        p.assigned(&c, vec![tp(0)]).unwrap();
        assert!(!p.is_current(&tp(0), before));
        assert!(p.is_current(&tp(0), p.stamp()));
    }

    #[test]
    fn a_clamped_record_is_news_once_per_ownership() {
        let (c, mut p) = holding();
        assert!(p.clamp_is_news(&tp(0), 20), "first read: held at it");
        p.resume_due(&c, at(100)).unwrap();
        assert!(!p.clamp_is_news(&tp(0), 20), "read again once due");
        assert!(p.clamp_is_news(&tp(0), 23), "a later one");
        p.rewind(&c, &BTreeMap::from([(tp(0), 12)])).unwrap();
        assert!(
            !p.clamp_is_news(&tp(0), 20) && !p.clamp_is_news(&tp(0), 23),
            "read again after an abort"
        );
        assert!(p.clamp_is_news(&tp(1), 20), "each partition its own");
        p.revoked(&[tp(0)]);
        assert!(!p.clamp_is_news(&tp(0), 30), "not owned");
        p.assigned(&c, vec![tp(0)]).unwrap();
        assert!(
            p.clamp_is_news(&tp(0), 20),
            "a new ownership reports it once more"
        );
    }

    #[test]
    fn a_rewind_leaves_partitions_no_longer_owned_alone() {
        let (c, mut p) = holding();
        p.revoked(&[tp(1)]);
        p.rewind(&c, &BTreeMap::from([(tp(1), 3)])).unwrap();
        assert!(c.at.borrow().is_empty());
        assert_eq!(p.next_due(), Some(at(100)), "p0 still held");
    }
}
