//! The stored offsets in the Kafka group, for lag monitoring: committed until the group has them.
//!
//! The sink's offsets live in the database; it commits the same offsets to its Kafka group only so
//! that lag shows where operators look for it (`kafka-consumer-groups`, `alerts_group_lag`, the
//! stalled-partition rule). A commit sent once per batch is not enough: it is lost when the
//! process dies between the database commit and the Kafka commit, when a rebalance refuses it
//! (an old generation), or when the coordinator moves. The group then stays behind the database
//! for as long as the partition stays quiet, and shows lag where there is none, on an idle
//! partition for ever.
//!
//! So the offsets wait here until the group acknowledges them:
//!
//! | event                                  | pending offsets                                   |
//! |----------------------------------------|---------------------------------------------------|
//! | assign, stored offsets read            | the stored ones of the assigned partitions        |
//! | batch written                          | its next offsets (higher ones replace lower)      |
//! | commit acknowledged for (p, o)         | p removed if o is still what is pending for it    |
//! | commit refused or unanswered           | kept, committed again [`RETRY`] later             |
//! | revoke or lost                         | the partitions removed (the next owner commits)   |
//!
//! Committing what the database holds never moves the group above it: the offsets only come from
//! stored batches and from `sink_offsets`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long after a commit, answered or not, the pending offsets are committed again.
pub const RETRY: Duration = Duration::from_secs(2);

/// Offsets to commit to the group, by partition, and when they may be sent.
#[derive(Debug, Default)]
pub struct GroupOffsets {
    pending: BTreeMap<i32, i64>,
    /// None: due now (new offsets); otherwise the time of the next attempt.
    next_attempt: Option<Instant>,
}

impl GroupOffsets {
    /// New stored offsets (a batch written, or read at assignment): pending, due now.
    pub fn stored(&mut self, offsets: impl IntoIterator<Item = (i32, i64)>) {
        let mut any = false;
        for (p, o) in offsets {
            let e = self.pending.entry(p).or_insert(o);
            *e = (*e).max(o);
            any = true;
        }
        if any {
            self.next_attempt = None;
        }
    }

    /// The pending offsets if a commit is due at `now` (the next one is then [`RETRY`] away).
    pub fn take_due(&mut self, now: Instant) -> Option<BTreeMap<i32, i64>> {
        if self.next_attempt.is_some_and(|t| now < t) {
            return None;
        }
        self.take(now)
    }

    /// The pending offsets, due or not (before the partitions go, at a revoke or a shutdown).
    pub fn take(&mut self, now: Instant) -> Option<BTreeMap<i32, i64>> {
        if self.pending.is_empty() {
            return None;
        }
        self.next_attempt = Some(now + RETRY);
        Some(self.pending.clone())
    }

    /// The group acknowledged `offset` for `partition`.
    pub fn acknowledged(&mut self, partition: i32, offset: i64) {
        if self.pending.get(&partition).is_some_and(|&o| o <= offset) {
            self.pending.remove(&partition);
        }
    }

    /// Partitions revoked or lost: their offsets are the next owner's to commit.
    pub fn revoked(&mut self, partitions: &[i32]) {
        for p in partitions {
            self.pending.remove(p);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_stay_pending_until_acknowledged_and_are_retried_after_the_delay() {
        let mut g = GroupOffsets::default();
        let t0 = Instant::now();
        assert_eq!(g.take_due(t0), None, "nothing stored, nothing to commit");
        g.stored([(0, 10), (1, 5)]);
        assert_eq!(g.take_due(t0), Some(BTreeMap::from([(0, 10), (1, 5)])));
        assert_eq!(
            g.take_due(t0 + RETRY / 2),
            None,
            "in flight: not sent twice at once"
        );
        g.acknowledged(0, 10);
        assert_eq!(
            g.take_due(t0 + RETRY),
            Some(BTreeMap::from([(1, 5)])),
            "the unanswered one again, and only it"
        );
        g.acknowledged(1, 5);
        assert!(g.is_empty());
        assert_eq!(g.take_due(t0 + RETRY * 3), None);
    }

    #[test]
    fn a_new_batch_is_due_at_once_and_an_old_acknowledgement_does_not_clear_it() {
        let mut g = GroupOffsets::default();
        let t0 = Instant::now();
        g.stored([(0, 10)]);
        g.take_due(t0);
        g.stored([(0, 20)]);
        assert_eq!(
            g.take_due(t0),
            Some(BTreeMap::from([(0, 20)])),
            "due at once"
        );
        g.acknowledged(0, 10);
        assert!(!g.is_empty(), "20 is still pending");
        g.stored([(0, 15)]);
        assert_eq!(
            g.take_due(t0),
            Some(BTreeMap::from([(0, 20)])),
            "never lower"
        );
        g.acknowledged(0, 20);
        assert!(g.is_empty());
    }

    #[test]
    fn a_revoked_partition_is_not_committed_by_its_old_owner() {
        let mut g = GroupOffsets::default();
        g.stored([(0, 10), (1, 5)]);
        g.revoked(&[0]);
        assert_eq!(g.take_due(Instant::now()), Some(BTreeMap::from([(1, 5)])));
    }
}
