//! The engine's side of live alerts ([`crate::rules::live`] has the join's rule): reading the rules
//! topic, restoring each owned partition's join with its state, holding a tick whose join is not
//! ready, and the barriers that end such a hold.
//!
//! ```text
//!  rules reader (read_committed, assigned the owned partitions at each join's read position)
//!        └─► PartitionJoin::push                        (records read, not applied)
//!  tick of p ─► join(p).ready(ts, offset)? ── yes ─► evaluated against join(p)'s table
//!                   │ no
//!                   ▼
//!        seek p back to the tick, pause p, send a barrier {input_offset} to rules partition p
//!        … the barrier (or a later record) is read ─► ready ─► resume p: the tick is read again
//! ```
//!
//! # State across polls
//! | state              | abort                         | revoke              | restore               |
//! |--------------------|-------------------------------|---------------------|-----------------------|
//! | join of p          | dropped (restored again)      | dropped             | rebuilt: rules read   |
//! |                    |                               |                     | from 0, checkpoint    |
//! | hold of p (paused) | ended, p resumed (rewound)    | ended, p resumed    | -                     |
//! | reader position    | reassigned at the next restore| left (records of p  | every loaded join at  |
//! |                    |                               | dropped)            | its read position     |
//!
//! Why an abort and a revoke end a hold themselves instead of leaving it to its barrier (broker
//! tests in tests/live_rules.rs, each seen failing without it): after an abort the restored join
//! holds the hold's barrier, so a hold kept through the abort would end at the next poll and
//! resume its partition at the held tick, past the ticks of the aborted batch before it: lost. A
//! revoked partition left paused stays paused in librdkafka, which keeps a pause across a revoke
//! and a later assignment: given back to this instance, it would never be fetched again. A
//! restart keeps nothing of a hold: the new instance's restore reads the hold's barrier, and the
//! held tick is processed at once.
//!
//! A hold whose barrier is not read within [`BARRIER_RESEND`] (a lost produce, a rules partition
//! held by an open transaction) sends another and says so: the first barrier for the tick in the
//! log is the one that counts, for the pipeline and the oracle alike. A transaction of this
//! instance that wrote a one-shot's tombstone to rules partition p holds p's last stable offset
//! until it commits; the loop commits it within the commit interval, whatever is held.
//!
//! # Freezing the rules reader (test only)
//! A hold lasts a barrier's round trip, milliseconds, so a broker test cannot place an abort, a
//! revoke or a SIGKILL inside one by timing. With `--test-freeze-rules FILE`, while FILE exists the
//! loop does not read the rules topic ([`LiveRules::poll`] skips its reads; a restore and its
//! priming still read): a tick newer than every rules record read stays held until an abort, a
//! revoke or a restart ends its hold, which is what tests/live_rules.rs asks of each. Whenever the
//! set of held partitions changes, it is written to `FILE.held` (ascending, comma-separated; empty
//! when none), so the test knows when the hold began and sees it end.

use super::state::{Held, StateStore};
use crate::kafka::read::{partition_count, read_partitions_to_end, End, Reader};
use crate::kafka::tpl::position_list;
use crate::kafka::{Isolation, KafkaConfig};
use crate::rules::live::{barrier_value, JoinCheckpoint, PartitionJoin, BARRIER_KEY};
use anyhow::Context as _;
use rdkafka::consumer::Consumer;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How long a hold waits for its barrier before sending another.
pub const BARRIER_RESEND: Duration = Duration::from_secs(5);
/// Records read from the rules per poll, at most: a burst of changes does not stall the ticks.
const RULES_PER_POLL: usize = 10_000;
/// Bound on the metadata round trips of the rules reader.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// Records read and not applied, per partition, past which the rules reader pauses that
/// partition (resumed below half of it): a burst of puts newer than the ticks being processed
/// (a load of a million alerts while a backlog is worked off) is not read into memory whole. A
/// tick needs only the first unapplied record to know its prefix.
pub const MAX_PENDING: usize = 50_000;

/// The rules topic's reader and the barriers' producer.
pub struct LiveRules {
    pub topic: String,
    pub partitions: i32,
    reader: Reader,
    barriers: FutureProducer<crate::kafka::logging::Logged>,
    /// Rules partitions the reader paused for [`MAX_PENDING`].
    paused: std::sync::Mutex<std::collections::BTreeSet<i32>>,
    /// When the reader was last polled (see [`LiveRules::due`]).
    polled: std::sync::Mutex<Instant>,
    /// TEST ONLY: `--test-freeze-rules` (see "Freezing the rules reader" above).
    freeze: Option<Freeze>,
}

/// TEST ONLY: the file whose existence freezes the rules reader, and the held partitions last
/// written to `<file>.held`.
struct Freeze {
    file: PathBuf,
    said: std::sync::Mutex<Option<Vec<i32>>>,
}

impl Freeze {
    /// Whether the loop is not to read the rules now.
    fn frozen(&self) -> bool {
        self.file.exists()
    }

    /// Writes `held` to `<file>.held` if it changed since the last write: whole, then renamed into
    /// place, so a reader never sees a half-written list.
    fn say(&self, held: Vec<i32>) {
        let Ok(mut said) = self.said.lock() else {
            return;
        };
        if said.as_ref() == Some(&held) {
            return;
        }
        let text = held
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let path = crate::kafka::hold::held_path(&self.file);
        let mut partial = path.clone().into_os_string();
        partial.push(".partial");
        match std::fs::write(&partial, &text).and_then(|()| std::fs::rename(&partial, &path)) {
            Ok(()) => {
                info!(held = %text, frozen = self.frozen(), "test hook: held partitions written");
                *said = Some(held);
            }
            // The test waits for this file and fails with its own message without it.
            Err(e) => {
                warn!(path = %path.display(), error = %e, "test hook: cannot write the held partitions")
            }
        }
    }
}

/// How often the rules reader is polled while no partition is held: a poll per tick (the loop
/// takes one record per poll) halved the pipeline's backlog throughput (pipeline-bench, 1,000
/// symbols: 85,859 ticks/s against 153,303 with a rules file). While a partition is held it is
/// polled on every turn of the loop.
const RULES_POLL_EVERY: Duration = Duration::from_millis(10);

impl LiveRules {
    /// The reader and producer of `topic`, which has `partitions` partitions (checked at start);
    /// `freeze` is the test hook `--test-freeze-rules` (`None` but in tests).
    pub fn start(kafka: &KafkaConfig, topic: &str, freeze: Option<&Path>) -> anyhow::Result<Self> {
        let reader = crate::kafka::read::reader(kafka, Isolation::ReadCommitted)
            .context("creating the rules reader")?;
        let partitions = partition_count(&reader, topic, METADATA_TIMEOUT)
            .with_context(|| format!("reading the partition count of rules topic {topic}"))?;
        let barriers = kafka
            .idempotent_producer()
            .create_with_context(crate::kafka::logging::Logged)
            .context("creating the barrier producer")?;
        Ok(LiveRules {
            topic: topic.to_owned(),
            partitions,
            reader,
            barriers,
            paused: Default::default(),
            polled: std::sync::Mutex::new(Instant::now()),
            freeze: freeze.map(|file| Freeze {
                file: file.to_owned(),
                said: Default::default(),
            }),
        })
    }

    /// Rebuilds the joins of `partitions` from their checkpoints: each rules partition read from its
    /// start to its end (every transaction before it decided) with `restore_reader`.
    pub fn restore(
        &self,
        restore_reader: &Reader,
        partitions: &[i32],
        checkpoints: &BTreeMap<i32, JoinCheckpoint>,
        timeout: Duration,
    ) -> anyhow::Result<BTreeMap<i32, PartitionJoin>> {
        let none = JoinCheckpoint::default();
        let mut joins: BTreeMap<i32, PartitionJoin> = partitions
            .iter()
            .map(|&p| {
                (
                    p,
                    PartitionJoin::resuming(checkpoints.get(&p).unwrap_or(&none)),
                )
            })
            .collect();
        let mut full = std::collections::BTreeSet::new();
        let n = read_partitions_to_end(
            restore_reader,
            &self.topic,
            partitions,
            End::Decided,
            timeout,
            |m| {
                let p = m.partition();
                if full.contains(&p) {
                    return Ok(());
                }
                if let Some(j) = joins.get_mut(&p) {
                    if j.pending() >= MAX_PENDING {
                        // The rest is read by the rules reader, from the join's read position,
                        // as the ticks need it (see MAX_PENDING).
                        full.insert(p);
                        return Ok(());
                    }
                    j.push(crate::kafka::rules::rule_record(m, self.partitions));
                }
                Ok(())
            },
        )
        .with_context(|| format!("restoring the alerts of rules topic {}", self.topic))?;
        for (p, j) in &mut joins {
            let cp = checkpoints.get(p).unwrap_or(&none);
            let read_to = j.read_to();
            j.restored(cp, read_to);
            let (applied, invalid) = j.take_applied();
            for (offset, reason) in invalid {
                warn!(topic = %self.topic, partition = p, offset, reason, "invalid rules record ignored");
            }
            crate::metrics::rules_applied(applied);
        }
        info!(
            topic = %self.topic,
            partitions = ?partitions,
            records = n,
            alerts = joins.values().map(|j| j.table().len()).sum::<usize>(),
            "alerts restored"
        );
        Ok(joins)
    }

    /// Assigns the rules reader every loaded join's partition at its read position.
    pub fn reassign(&self, state: &mut StateStore) -> anyhow::Result<()> {
        let positions: Vec<(i32, Offset)> = state
            .joins_mut()
            .map(|(p, j)| (p, Offset::Offset(j.read_to())))
            .collect();
        let tpl = position_list(&self.topic, positions).context("rules positions")?;
        self.reader
            .assign(&tpl)
            .context("assigning the rules reader")?;
        // A new assignment starts unpaused: what the bound paused before is judged again.
        if let Ok(mut paused) = self.paused.lock() {
            let _ = self.reader.resume(&tpl);
            paused.clear();
        }
        Ok(())
    }

    /// Takes what the rules reader has (without waiting) into the joins, then ends the holds whose
    /// join is ready and sends a barrier again for those that waited too long. Returns the
    /// partitions to resume, each with the offset of its held tick.
    pub fn poll(&self, state: &mut StateStore) -> Vec<(i32, i64)> {
        if let Ok(mut polled) = self.polled.lock() {
            *polled = Instant::now();
        }
        let reads = match &self.freeze {
            Some(f) if f.frozen() => 0,
            _ => RULES_PER_POLL,
        };
        for _ in 0..reads {
            match self.reader.poll(Duration::ZERO) {
                None => break,
                Some(Ok(m)) => {
                    let record = crate::kafka::rules::rule_record(&m, self.partitions);
                    if let Some(j) = state.join_mut(m.partition()) {
                        // A record before the join's read position was read by its restore.
                        if record.offset >= j.read_to() {
                            j.push(record);
                        }
                    }
                }
                // The end of a partition, reported as an error by librdkafka: nothing to say.
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => {}
                Some(Err(e)) => warn!(topic = %self.topic, error = %e, "rules reader error"),
            }
        }
        self.bound_pending(state);
        let held: Vec<(i32, Held)> = state.held_mut().map(|(p, h)| (p, *h)).collect();
        let mut ready = Vec::new();
        for (p, h) in held {
            let Some(j) = state.join_mut(p) else { continue };
            let is_ready = j.ready(h.ts, h.offset);
            let (applied, invalid) = j.take_applied();
            self.said(p, applied, invalid);
            if is_ready {
                crate::metrics::tick_hold_ended(h.since.elapsed());
                ready.push((p, h.offset));
            } else if h.barrier_sent.elapsed() >= BARRIER_RESEND {
                warn!(
                    partition = p,
                    offset = h.offset,
                    held_s = h.since.elapsed().as_secs(),
                    topic = %self.topic,
                    "a tick still waits for its rules barrier (a rules partition held by an open \
                     transaction, or the rules topic unreachable); sending another"
                );
                self.barrier(p, h.offset);
                if let Some((_, h)) = state.held_mut().find(|(q, _)| *q == p) {
                    h.barrier_sent = Instant::now();
                }
            }
        }
        for (p, _) in &ready {
            state.release(Some(&[*p]));
        }
        if let Some(f) = &self.freeze {
            f.say(state.held_mut().map(|(p, _)| p).collect());
        }
        ready
    }

    /// After a restore of `partitions`: sends each a barrier for no tick (a negative offset, drawn
    /// afresh) and reads until every one is back, for at most `timeout`. The ticks stamped before
    /// it (a backlog) then find their prefix ended without a hold: a first hold per partition
    /// cost the backlog a second (pipeline-bench, 1,000 symbols: 75,636 ticks/s against 145,306
    /// with a rules file), since a resumed partition waits for librdkafka's next fetch. A barrier
    /// for no tick is a record like any other for the join's rule: the oracle sees it too.
    pub fn prime(&self, state: &mut StateStore, partitions: &[i32], timeout: Duration) {
        use rand::Rng;
        let marker = -1 - i64::from(rand::rng().random::<u32>());
        for &p in partitions {
            self.barrier(p, marker);
        }
        let deadline = Instant::now() + timeout;
        loop {
            let missing: Vec<i32> = partitions
                .iter()
                .copied()
                .filter(|&p| state.join_mut(p).is_some_and(|j| !j.has_barrier(marker)))
                .collect();
            if missing.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                debug!(partitions = ?missing, "primed barriers not back in time; their ticks hold instead");
                return;
            }
            match self.reader.poll(Duration::from_millis(5)) {
                Some(Ok(m)) => {
                    let record = crate::kafka::rules::rule_record(&m, self.partitions);
                    if let Some(j) = state.join_mut(m.partition()) {
                        if record.offset >= j.read_to() {
                            j.push(record);
                        }
                    }
                }
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) | None => {}
                Some(Err(e)) => warn!(topic = %self.topic, error = %e, "rules reader error"),
            }
        }
    }

    /// Whether the reader is due a poll: a partition is held, or [`RULES_POLL_EVERY`] passed.
    pub fn due(&self, held: bool) -> bool {
        held || self
            .polled
            .lock()
            .map_or(true, |p| p.elapsed() >= RULES_POLL_EVERY)
    }

    /// Pauses the reader on partitions with [`MAX_PENDING`] records not applied, and resumes
    /// those below half of it.
    fn bound_pending(&self, state: &mut StateStore) {
        let Ok(mut paused) = self.paused.lock() else {
            return;
        };
        let (mut pause, mut resume) = (Vec::new(), Vec::new());
        for (p, j) in state.joins_mut() {
            let n = j.pending();
            if n >= MAX_PENDING && !paused.contains(&p) {
                pause.push(p);
            } else if n < MAX_PENDING / 2 && paused.contains(&p) {
                resume.push(p);
            }
        }
        for (ps, pausing) in [(pause, true), (resume, false)] {
            if ps.is_empty() {
                continue;
            }
            let tpl = crate::kafka::tpl::partition_list(&self.topic, ps.iter().copied());
            let result = if pausing {
                self.reader.pause(&tpl)
            } else {
                self.reader.resume(&tpl)
            };
            match result {
                Ok(()) if pausing => paused.extend(ps),
                Ok(()) => ps.iter().for_each(|p| {
                    paused.remove(p);
                }),
                Err(e) => {
                    warn!(partitions = ?ps, pausing, error = %e, "rules reader pause/resume failed")
                }
            }
        }
    }

    /// Logs the invalid records a join applied and counts what it applied.
    pub fn said(&self, p: i32, applied: crate::rules::live::Applied, invalid: Vec<(i64, String)>) {
        for (offset, reason) in invalid {
            warn!(topic = %self.topic, partition = p, offset, reason, "invalid rules record ignored");
        }
        crate::metrics::rules_applied(applied);
    }

    /// Sends a barrier for the tick at `input_offset` of partition `p` (not waited for: the reader
    /// sees it come back).
    pub fn barrier(&self, p: i32, input_offset: i64) {
        let value = barrier_value(input_offset);
        let record = FutureRecord::to(&self.topic)
            .partition(p)
            .key(BARRIER_KEY)
            .payload(&value);
        match self.barriers.send_result(record) {
            // Delivered in the background; a lost one is sent again after BARRIER_RESEND.
            Ok(_delivery) => crate::metrics::barrier_sent(),
            Err((e, _)) => warn!(partition = p, error = %e, "rules barrier not sent"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Freeze;

    #[test]
    fn the_freeze_hook_says_the_held_partitions_when_they_change() {
        let dir =
            std::env::temp_dir().join(format!("freeze-{}", crate::kafka::topics::unique_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = Freeze {
            file: dir.join("freeze"),
            said: Default::default(),
        };
        let held = crate::kafka::hold::held_path(&f.file);
        assert!(!f.frozen(), "no file, not frozen");
        std::fs::write(&f.file, b"").unwrap();
        assert!(f.frozen());
        f.say(vec![]);
        assert_eq!(std::fs::read_to_string(&held).unwrap(), "");
        f.say(vec![0, 2]);
        assert_eq!(std::fs::read_to_string(&held).unwrap(), "0,2");
        // Unchanged: not written again.
        std::fs::remove_file(&held).unwrap();
        f.say(vec![0, 2]);
        assert!(!held.exists());
        f.say(vec![2]);
        assert_eq!(std::fs::read_to_string(&held).unwrap(), "2");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
