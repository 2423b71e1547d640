//! Per-symbol state, kept per input partition, and its restore from the changelog.
//!
//! The state of a symbol read from input partition p lives in changelog partition p (key =
//! symbol, value = [`SymbolState`] as JSON). Keeping it per partition is what makes rebalances
//! and aborts cheap and exact: a revoked partition's map is dropped, an assigned one is restored
//! from its own changelog partition, and after an abort every owned partition is restored, so the
//! state in force is always exactly the committed one.
//!
//! # Where a restore ends
//! At the changelog partition's high watermark, every transaction before it decided, not at its
//! last stable offset ([`End::Decided`], see [`crate::kafka::read`]): the previous owner's commit
//! returns, and its group offsets can become stable, before the changelog leader has the commit
//! marker, and a restore that stopped at the last stable offset would miss that batch's state and
//! redo the batch with stale crossing state. The same wait covers a transaction still open for
//! real (a crashed or frozen previous owner's, or a fenced predecessor's): its abort marker ends it.
//! That end is never below the high watermark the partition's leader answers to ListOffsets: right
//! after a leader election, the fetch responses of the new leader report a high watermark that can
//! lag below records already acknowledged and committed (see [`crate::kafka::read`], "A new
//! leader's high watermark"; issue 43, item 7).
//! The wait ends on the marker; it is bounded by [`restore_timeout`], which lets a transaction
//! left open by a crashed writer run into its timeout and be aborted by its coordinator.
//!
//! # A restore held by an undecided transaction
//! A transaction that stays open longer (a hanging one, which no coordinator ends, or one of
//! another writer with a longer timeout) holds every read_committed reader of its partition until
//! it is decided: restarting the instance cannot help, and failing the restore would only start
//! a crash loop. So the engine's restore ([`restore_watched`]) watches its wait: it asks the leader
//! of each partition waiting below its end for the last stable offset every few seconds, and a
//! partition still below is held ([`Hold`]). Held partitions do not fail the restore at its bound:
//! every [`HOLD_SLICE`] they go back to the caller, which keeps them pending (not ready), says
//! what holds them and how to end it ([`super::held`]), polls its consumer, and reads them again;
//! the partitions that reached their end meanwhile are installed and processed. The restore ends
//! by itself once the transaction is decided (an operator's `kafka-transactions abort`, or its
//! coordinator at its timeout). The bound still ends a read that is not held: records that do not
//! come, a leader that does not answer.

use crate::alert::SymbolState;
use crate::kafka::read::{
    read_partitions_to_end, read_partitions_to_end_watched, End, Hold, Reader, Watch,
};
use crate::rules::live::{JoinCheckpoint, PartitionJoin, JOIN_KEY};
use anyhow::Context as _;
use rdkafka::Message;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;
use tracing::{info, warn};

/// Bound on reading one batch of partitions from the changelog (a large state on a slow machine).
pub const RESTORE_TIMEOUT: Duration = Duration::from_secs(120);

/// How often a transaction coordinator looks for transactions past their timeout to abort them
/// (`transaction.abort.timed.out.transaction.cleanup.interval.ms`, the broker's default).
const COORDINATOR_ABORT_CHECK: Duration = Duration::from_secs(10);

/// Bound on one restore of instances whose transactions time out after `transaction_timeout`:
/// reading ([`RESTORE_TIMEOUT`]), plus the longest a transaction found open on the changelog can
/// hold its last stable offset when its writer is gone: its timeout, then the coordinator's next
/// check. A transaction open longer than that is hanging (no coordinator will end it): the restore
/// fails and says so, the process stops, and waiting more or restoring again would not help;
/// `kafka-transactions find-hanging` / `abort` is the operator's cure.
pub fn restore_timeout(transaction_timeout: Duration) -> Duration {
    RESTORE_TIMEOUT + transaction_timeout + COORDINATOR_ABORT_CHECK
}

/// How long a restore held by an undecided transaction ([`restore_watched`]) waits before it
/// gives the held partitions back to the engine's loop, which polls its group consumer and then
/// reads them again: far inside `max.poll.interval.ms` (the transaction timeout + 50 s, at least
/// 51 s), past which the consumer would leave its group and its partitions would move to an
/// instance that meets the same hold; and long enough that reading the held partitions again
/// each time is a small share of the wait.
pub const HOLD_SLICE: Duration = Duration::from_secs(20);

/// Symbol -> state of one partition.
pub type PartitionState = HashMap<String, SymbolState>;

/// An input partition paused because its next tick waits for the rules ([`crate::rules::live`]):
/// the consumer was sought back to the tick, which is read again once its join is ready.
#[derive(Debug, Clone, Copy)]
pub struct Held {
    /// The tick's input offset and record timestamp (ms).
    pub offset: i64,
    pub ts: i64,
    /// When the hold began, and when its barrier was last sent.
    pub since: std::time::Instant,
    pub barrier_sent: std::time::Instant,
}

/// State of every owned partition; `None` until restored.
///
/// | event                    | state        | unpositioned                                  |
/// |--------------------------|--------------|-----------------------------------------------|
/// | assign                   | `None`       | no: the consumer starts at the committed offset|
/// | abort                    | `None` (all) | if the rewind was refused                      |
/// | record dropped (pending) | `None`       | yes: the consumer has moved past it            |
/// | restore                  | loaded       | no: sought to the committed offset first       |
/// | revoke                   | gone         | gone                                           |
///
/// With live alerts each loaded partition also has its join ([`PartitionJoin`]), restored and
/// dropped with the state, and may be held ([`Held`]): a hold ends when its join is ready, and on
/// an abort or a revoke (the caller resumes the partition: whoever paused it).
#[derive(Debug, Default)]
pub struct StateStore {
    partitions: BTreeMap<i32, Option<PartitionState>>,
    joins: BTreeMap<i32, PartitionJoin>,
    held: BTreeMap<i32, Held>,
    /// Owned partitions whose consumer position may be past their committed offset: a rewind was
    /// refused (a right is missing), or records of them were dropped while their state was not
    /// loaded. Their restore seeks them to the committed offset first.
    unpositioned: BTreeSet<i32>,
}

impl StateStore {
    /// Takes ownership of `p`; its state must be restored before use.
    pub fn assign(&mut self, p: i32) {
        self.partitions.insert(p, None);
        self.unpositioned.remove(&p);
    }

    /// Gives `p` up.
    pub fn revoke(&mut self, p: i32) {
        self.partitions.remove(&p);
        self.unpositioned.remove(&p);
        self.joins.remove(&p);
        self.held.remove(&p);
    }

    /// The consumer's position on owned partition `p` is not known to be its committed offset:
    /// seek there before its records are processed again.
    pub fn unposition(&mut self, p: i32) {
        if self.is_owned(p) {
            self.unpositioned.insert(p);
        }
    }

    /// Of `partitions`, those that must be sought to their committed offsets before use.
    pub fn unpositioned(&self, partitions: &[i32]) -> Vec<i32> {
        partitions
            .iter()
            .copied()
            .filter(|p| self.unpositioned.contains(p))
            .collect()
    }

    /// `partitions` were sought to their committed offsets.
    pub fn positioned(&mut self, partitions: &[i32]) {
        for p in partitions {
            self.unpositioned.remove(p);
        }
    }

    /// Forgets the in-memory state of every owned partition (after an abort).
    pub fn invalidate_all(&mut self) {
        for s in self.partitions.values_mut() {
            *s = None;
        }
        self.joins.clear();
    }

    /// Installs the restored join of an owned partition.
    pub fn install_join(&mut self, p: i32, join: PartitionJoin) {
        if self.partitions.contains_key(&p) {
            self.joins.insert(p, join);
        }
    }

    pub fn join_mut(&mut self, p: i32) -> Option<&mut PartitionJoin> {
        self.joins.get_mut(&p)
    }

    pub fn joins_mut(&mut self) -> impl Iterator<Item = (i32, &mut PartitionJoin)> {
        self.joins.iter_mut().map(|(p, j)| (*p, j))
    }

    /// The loaded state of `p` and its join (if live), borrowed together.
    pub fn with_join(
        &mut self,
        p: i32,
    ) -> Option<(&mut PartitionState, Option<&mut PartitionJoin>)> {
        let state = self.partitions.get_mut(&p)?.as_mut()?;
        Some((state, self.joins.get_mut(&p)))
    }

    /// The join checkpoint of `p`, if live and loaded.
    pub fn checkpoint(&self, p: i32) -> Option<JoinCheckpoint> {
        self.joins.get(&p).map(PartitionJoin::checkpoint)
    }

    /// `p` is paused, its tick at `held.offset` waiting for the rules.
    pub fn hold(&mut self, p: i32, held: Held) {
        if self.is_owned(p) {
            self.held.insert(p, held);
        }
    }

    pub fn held_mut(&mut self) -> impl Iterator<Item = (i32, &mut Held)> {
        self.held.iter_mut().map(|(p, h)| (*p, h))
    }

    /// Ends the holds of `partitions` (all when `None`); returns those that were held, which the
    /// caller resumes.
    pub fn release(&mut self, partitions: Option<&[i32]>) -> Vec<i32> {
        let ended: Vec<i32> = self
            .held
            .keys()
            .copied()
            .filter(|p| partitions.is_none_or(|ps| ps.contains(p)))
            .collect();
        for p in &ended {
            self.held.remove(p);
        }
        ended
    }

    pub fn is_held(&self, p: i32) -> bool {
        self.held.contains_key(&p)
    }

    pub fn owned(&self) -> impl Iterator<Item = i32> + '_ {
        self.partitions.keys().copied()
    }

    pub fn is_owned(&self, p: i32) -> bool {
        self.partitions.contains_key(&p)
    }

    /// Owned partitions whose state is not loaded.
    pub fn pending(&self) -> Vec<i32> {
        self.partitions
            .iter()
            .filter(|(_, s)| s.is_none())
            .map(|(p, _)| *p)
            .collect()
    }

    /// Loaded state of `p`.
    pub fn get_mut(&mut self, p: i32) -> Option<&mut PartitionState> {
        self.partitions.get_mut(&p).and_then(Option::as_mut)
    }

    pub fn get(&self, p: i32) -> Option<&PartitionState> {
        self.partitions.get(&p).and_then(Option::as_ref)
    }

    /// Installs restored state for an owned partition (ignored if `p` was revoked meanwhile).
    pub fn install(&mut self, p: i32, state: PartitionState) {
        if let Some(slot) = self.partitions.get_mut(&p) {
            *slot = Some(state);
        }
    }

    /// Number of symbols held, over all partitions.
    pub fn symbols(&self) -> usize {
        self.partitions.values().flatten().map(HashMap::len).sum()
    }

    /// A copy of every loaded partition's state (tests compare restored and uninterrupted runs).
    pub fn snapshot(&self) -> BTreeMap<i32, PartitionState> {
        self.partitions
            .iter()
            .filter_map(|(p, s)| s.clone().map(|s| (*p, s)))
            .collect()
    }
}

/// Reads changelog partitions (read_committed) to their high watermark, every transaction before it
/// decided, and returns each one's state; fails after `timeout` (see [`restore_timeout`]).
pub fn restore(
    reader: &Reader,
    changelog: &str,
    partitions: &[i32],
    timeout: Duration,
) -> anyhow::Result<BTreeMap<i32, PartitionState>> {
    Ok(restore_read(reader, changelog, partitions, timeout, None)?.states)
}

/// What a watched restore read.
#[derive(Debug, Default)]
pub struct Restored {
    /// The state of each partition read to its end.
    pub states: BTreeMap<i32, PartitionState>,
    /// The join checkpoint of each of them that has one (live alerts; key [`JOIN_KEY`]).
    pub joins: BTreeMap<i32, JoinCheckpoint>,
    /// The partitions not read to their end, each held by an undecided transaction: not restored.
    pub held: Vec<Hold>,
}

/// [`restore`], the join checkpoints too, watched: `report` hears every few seconds of the
/// records read and the partitions held (see the module doc), and held partitions come back in
/// [`Restored::held`] after [`HOLD_SLICE`] instead of failing the restore at `timeout`.
pub fn restore_watched(
    reader: &Reader,
    changelog: &str,
    partitions: &[i32],
    timeout: Duration,
    report: &mut dyn FnMut(u64, &[Hold]),
) -> anyhow::Result<Restored> {
    let watch = Watch {
        slice: HOLD_SLICE,
        report,
    };
    restore_read(reader, changelog, partitions, timeout, Some(watch))
}

fn restore_read(
    reader: &Reader,
    changelog: &str,
    partitions: &[i32],
    timeout: Duration,
    watch: Option<Watch<'_>>,
) -> anyhow::Result<Restored> {
    let mut out: BTreeMap<i32, PartitionState> =
        partitions.iter().map(|&p| (p, HashMap::new())).collect();
    let mut joins = BTreeMap::new();
    let mut skipped = 0u64;
    let apply = |m: &rdkafka::message::BorrowedMessage<'_>| {
        let (Some(key), Some(value)) = (m.key(), m.payload()) else {
            // A tombstone or a keyless record: nothing to restore (this code writes neither).
            skipped += 1;
            return Ok(());
        };
        if key == JOIN_KEY.as_bytes() {
            let cp: JoinCheckpoint = serde_json::from_slice(value).with_context(|| {
                format!(
                    "changelog {changelog}/{} offset {} is not a join checkpoint",
                    m.partition(),
                    m.offset()
                )
            })?;
            joins.insert(m.partition(), cp);
            return Ok(());
        }
        let state: SymbolState = serde_json::from_slice(value).with_context(|| {
            format!(
                "changelog {changelog}/{} offset {} is not a state record",
                m.partition(),
                m.offset()
            )
        })?;
        if let Some(map) = out.get_mut(&m.partition()) {
            // A symbol is in the changelog once per batch that changed it: most records replace a
            // state already restored, and need no new key.
            let symbol = String::from_utf8_lossy(key);
            match map.get_mut(symbol.as_ref()) {
                Some(slot) => *slot = state,
                None => {
                    map.insert(symbol.into_owned(), state);
                }
            }
        }
        Ok(())
    };
    let ended = match watch {
        Some(watch) => {
            read_partitions_to_end_watched(reader, changelog, partitions, timeout, watch, apply)?
        }
        None => crate::kafka::read::Ended {
            records: read_partitions_to_end(
                reader,
                changelog,
                partitions,
                End::Decided,
                timeout,
                apply,
            )?,
            held: Vec::new(),
        },
    };
    crate::metrics::restore_read(ended.records);
    if skipped > 0 {
        warn!(
            changelog,
            skipped, "changelog records without key or value ignored"
        );
    }
    // What a held partition's read found so far is not its state: it is read again.
    for hold in &ended.held {
        out.remove(&hold.partition);
        joins.remove(&hold.partition);
    }
    if !out.is_empty() {
        info!(
            changelog,
            partitions = ?out.keys().collect::<Vec<_>>(),
            records = ended.records,
            symbols = out.values().map(HashMap::len).sum::<usize>(),
            "state restored"
        );
    }
    Ok(Restored {
        states: out,
        joins,
        held: ended.held,
    })
}

#[cfg(test)]
mod tests {
    use super::StateStore;

    /// The rows of the table on [`StateStore`] about positions.
    #[test]
    fn unpositioned_partitions_until_sought_reassigned_or_revoked() {
        let mut s = StateStore::default();
        s.assign(0);
        s.assign(1);
        assert_eq!(s.unpositioned(&[0, 1]), Vec::<i32>::new(), "assign");
        s.unposition(0);
        s.unposition(1);
        s.unposition(7);
        assert_eq!(s.unpositioned(&[0, 1, 7]), [0, 1], "only owned ones");
        s.positioned(&[0]);
        assert_eq!(s.unpositioned(&[0, 1]), [1], "sought");
        s.revoke(1);
        s.assign(1);
        assert_eq!(
            s.unpositioned(&[0, 1]),
            Vec::<i32>::new(),
            "revoked, assigned again"
        );
    }
}
