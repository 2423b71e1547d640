//! Who paused which partition of a consumer, and what becomes of that pause on every group event.
//!
//! librdkafka keeps two pause flags per partition: its own (`LIB_PAUSE`), which it clears when the
//! partition is unassigned, and the application's (`APP_PAUSE`), which it keeps for as long as the
//! client lives, across an unassign and a later assign of the same partition. A stage that paused
//! a partition, lost it in a rebalance and forgot the pause would get the partition back still
//! paused, log "partitions assigned" and never read it again (alert-sink lost 109 of 600 rows
//! that way: a database outage paused every partition, and partitions moved meanwhile).
//!
//! So a stage never calls `pause`/`resume` on its consumer itself: every pause goes through one
//! [`Pauses`] per consumer, which knows the partitions the stage owns and which of them it wants
//! paused, and sets librdkafka's flag explicitly on every assign.
//!
//! | event                        | owned and paused                        | owned, not paused  | not owned     |
//! |------------------------------|-----------------------------------------|--------------------|---------------|
//! | [`Pauses::pause`]            | stays paused                            | paused             | ignored       |
//! | [`Pauses::resume`]           | resumed                                 | resumed (no-op)    | ignored       |
//! | [`Pauses::assigned`]`(w)`    | -                                       | -                  | owned; paused if `w`, else resumed (a flag left from an earlier ownership is cleared) |
//! | [`Pauses::revoked`]          | forgotten (librdkafka keeps the flag; the next assign sets it again) | forgotten | ignored |
//!
//! What a stage keeps about why a partition is paused (a database outage, a held head record) is
//! its own; this type keeps only what the consumer must be told.

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::TopicPartitionList;
use std::collections::BTreeSet;

/// A partition: topic and number.
pub type Tp = (String, i32);

/// What [`Pauses`] needs of a consumer: librdkafka's application pause flag.
pub trait PauseFlag {
    fn pause(&self, tpl: &TopicPartitionList) -> KafkaResult<()>;
    fn resume(&self, tpl: &TopicPartitionList) -> KafkaResult<()>;
}

impl<C: ConsumerContext> PauseFlag for BaseConsumer<C> {
    fn pause(&self, tpl: &TopicPartitionList) -> KafkaResult<()> {
        Consumer::pause(self, tpl)
    }

    fn resume(&self, tpl: &TopicPartitionList) -> KafkaResult<()> {
        Consumer::resume(self, tpl)
    }
}

/// The owned partitions of one consumer and which of them are paused (see the module doc).
#[derive(Debug, Default)]
pub struct Pauses {
    owned: BTreeSet<Tp>,
    paused: BTreeSet<Tp>,
}

impl Pauses {
    /// Partitions were assigned: owned from now on, and paused when `paused`, resumed otherwise,
    /// whatever librdkafka kept from an earlier ownership. Call it right after the assign.
    pub fn assigned(
        &mut self,
        consumer: &impl PauseFlag,
        parts: impl IntoIterator<Item = Tp>,
        paused: bool,
    ) -> KafkaResult<()> {
        let parts: Vec<Tp> = parts.into_iter().collect();
        self.owned.extend(parts.iter().cloned());
        if paused {
            self.paused.extend(parts.iter().cloned());
            consumer.pause(&list(&parts))
        } else {
            for tp in &parts {
                self.paused.remove(tp);
            }
            consumer.resume(&list(&parts))
        }
    }

    /// Partitions were revoked (or lost): forgotten. Their librdkafka flag is left as it is: the
    /// next [`Pauses::assigned`] of the same partition sets it.
    pub fn revoked<'a>(&mut self, parts: impl IntoIterator<Item = &'a Tp>) {
        for tp in parts {
            self.owned.remove(tp);
            self.paused.remove(tp);
        }
    }

    /// Pauses those of `parts` that are owned; returns them.
    pub fn pause<'a>(
        &mut self,
        consumer: &impl PauseFlag,
        parts: impl IntoIterator<Item = &'a Tp>,
    ) -> KafkaResult<Vec<Tp>> {
        let parts = self.owned_of(parts);
        if !parts.is_empty() {
            consumer.pause(&list(&parts))?;
            self.paused.extend(parts.iter().cloned());
        }
        Ok(parts)
    }

    /// Resumes those of `parts` that are owned; returns them.
    pub fn resume<'a>(
        &mut self,
        consumer: &impl PauseFlag,
        parts: impl IntoIterator<Item = &'a Tp>,
    ) -> KafkaResult<Vec<Tp>> {
        let parts = self.owned_of(parts);
        if !parts.is_empty() {
            consumer.resume(&list(&parts))?;
            for tp in &parts {
                self.paused.remove(tp);
            }
        }
        Ok(parts)
    }

    /// Pauses every owned partition.
    pub fn pause_all(&mut self, consumer: &impl PauseFlag) -> KafkaResult<Vec<Tp>> {
        let all: Vec<Tp> = self.owned.iter().cloned().collect();
        self.pause(consumer, &all)
    }

    /// Resumes every owned partition.
    pub fn resume_all(&mut self, consumer: &impl PauseFlag) -> KafkaResult<Vec<Tp>> {
        let all: Vec<Tp> = self.owned.iter().cloned().collect();
        self.resume(consumer, &all)
    }

    /// Those of `parts` that are owned.
    fn owned_of<'a>(&self, parts: impl IntoIterator<Item = &'a Tp>) -> Vec<Tp> {
        parts
            .into_iter()
            .filter(|tp| self.owned.contains(*tp))
            .cloned()
            .collect()
    }

    pub fn is_owned(&self, tp: &Tp) -> bool {
        self.owned.contains(tp)
    }

    pub fn is_paused(&self, tp: &Tp) -> bool {
        self.paused.contains(tp)
    }

    /// The owned partitions, in order.
    pub fn owned(&self) -> impl Iterator<Item = &Tp> + '_ {
        self.owned.iter()
    }

    /// The owned partitions that are paused, in order.
    pub fn paused(&self) -> impl Iterator<Item = &Tp> + '_ {
        self.paused.iter()
    }
}

fn list(parts: &[Tp]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (topic, p) in parts {
        tpl.add_partition(topic, *p);
    }
    tpl
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// librdkafka's application flag as it behaves: set by pause, cleared by resume, and
    /// untouched by assign and unassign.
    #[derive(Default)]
    struct Flags(RefCell<BTreeSet<Tp>>);

    fn tps(tpl: &TopicPartitionList) -> Vec<Tp> {
        tpl.elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect()
    }

    impl PauseFlag for Flags {
        fn pause(&self, tpl: &TopicPartitionList) -> KafkaResult<()> {
            self.0.borrow_mut().extend(tps(tpl));
            Ok(())
        }
        fn resume(&self, tpl: &TopicPartitionList) -> KafkaResult<()> {
            for tp in tps(tpl) {
                self.0.borrow_mut().remove(&tp);
            }
            Ok(())
        }
    }

    fn tp(p: i32) -> Tp {
        ("t".to_owned(), p)
    }

    #[test]
    fn a_partition_revoked_while_paused_comes_back_resumed() {
        let flags = Flags::default();
        let mut pauses = Pauses::default();
        pauses.assigned(&flags, [tp(0), tp(1)], false).unwrap();
        pauses.pause_all(&flags).unwrap();
        pauses.revoked(&[tp(1)]);
        // The outage ends while p1 belongs to another member.
        pauses.resume_all(&flags).unwrap();
        assert!(
            flags.0.borrow().contains(&tp(1)),
            "librdkafka kept the flag"
        );
        // p1 comes back after the outage: it must be read.
        pauses.assigned(&flags, [tp(1)], false).unwrap();
        assert!(flags.0.borrow().is_empty());
        assert!(!pauses.is_paused(&tp(1)));
    }

    #[test]
    fn a_partition_assigned_during_a_pause_is_paused_and_resumed_with_the_others() {
        let flags = Flags::default();
        let mut pauses = Pauses::default();
        pauses.assigned(&flags, [tp(0)], false).unwrap();
        pauses.pause_all(&flags).unwrap();
        pauses.assigned(&flags, [tp(1)], true).unwrap();
        assert_eq!(pauses.paused().count(), 2);
        assert_eq!(flags.0.borrow().len(), 2);
        assert_eq!(pauses.resume_all(&flags).unwrap(), vec![tp(0), tp(1)]);
        assert!(flags.0.borrow().is_empty());
    }

    #[test]
    fn partitions_not_owned_are_neither_paused_nor_resumed() {
        let flags = Flags::default();
        let mut pauses = Pauses::default();
        pauses.assigned(&flags, [tp(0)], false).unwrap();
        assert!(pauses.pause(&flags, &[tp(0), tp(5)]).unwrap() == vec![tp(0)]);
        pauses.revoked(&[tp(0)]);
        assert!(pauses.resume(&flags, &[tp(0)]).unwrap().is_empty());
        assert!(!pauses.is_owned(&tp(0)) && pauses.paused().next().is_none());
    }
}
