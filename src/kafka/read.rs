//! Reading topics to their end: the verifier, the demo's counters, the replay tools and the state
//! restore.
//!
//! # Where "the end" is
//! librdkafka reports the end of a partition with its EOF event, when the reader has fetched up to
//! the end the broker gives it: the high watermark for a read_uncommitted reader, the last stable
//! offset (LSO) for a read_committed one. The LSO stops before the first record of the oldest
//! transaction that is not decided yet, and "not decided" includes a transaction already
//! committed by its coordinator: EndTxn returns once the coordinator has written PrepareCommit, and
//! the markers reach each partition leader afterwards. A read_committed reader that stopped at
//! the first EOF would miss a commit that its writer already saw succeed, e.g. a restore would
//! miss the previous owner's last state records and redo its batch with stale crossing state.
//!
//! So a read ends, by default ([`End::Decided`]), when the reader's position reaches the high
//! watermark that the fetch response of its first EOF reported: everything written before the
//! reader got there, each transaction decided (committed records read, aborted ones skipped).
//!
//! # A new leader's high watermark
//! That fetch response can come from a leader elected a moment ago, whose high watermark still
//! lags its predecessor's: a follower learns the high watermark from the fetch response after the
//! one that moved it, and a new leader moves its own only once its followers fetch from it. Fetch
//! responses report it as it is, below records that every replica had and that were
//! acknowledged; the read would end below a transaction already committed (seen in every round of
//! tests/restore_leader.rs: the leader SIGKILLed right after a batch was acknowledged). So under
//! [`End::Decided`] the end is at least the high watermark the partition's leader answers to
//! ListOffsets "latest" (read_uncommitted, [`leader_high_watermarks`]), asked when the read
//! begins: Kafka refuses that request (OFFSET_NOT_AVAILABLE) until a new leader's high watermark
//! reaches the start offset of its epoch, so an answer is at or above every record acknowledged
//! before the election. A refused partition is asked again every [`FLOOR_RETRY`] and does not end
//! meanwhile; the read's deadline bounds the wait.
//! Markers occupy offsets, and librdkafka moves the position past them, so the position reaches
//! the high watermark exactly when the last marker is read. A transaction still open for real (a
//! crashed or frozen writer's, which its coordinator aborts after the transaction timeout, or one
//! that a successor's registration fences and aborts) holds the read the same way, and its abort
//! marker ends the wait: the read ends on the EOF that follows the marker, never on a timer.
//! [`End::Visible`] keeps the plain EOF, for the one question it answers: what do committed readers
//! see right now?
//!
//! # Watching a wait
//! A transaction that nobody decides (a hanging one, or one whose writer's timeout is long) holds
//! such a read for as long as it stays open, and the caller (the state restore) must tell that
//! wait from a read that does not progress at all. A watched read
//! ([`read_partitions_to_end_watched`]) asks the leader of each partition that has reached its
//! last stable offset below its end for the last stable offset again every [`WATCH_EVERY`]: an
//! answer still below the end is a [`Hold`], observed afresh. It hands the caller, at the same
//! pace, the records read since and the holds seen, so that the caller can count either as
//! progress and say what holds it; a read whose leader stops answering reports no hold. Once
//! every partition left is held, its deadline no longer ends it with an error: at the deadline,
//! or after its `slice` already, it returns with the holds, and the caller decides.
//!
//! Records are counted as they arrive; offsets are only compared with the watermark, never
//! subtracted, because transaction markers occupy offsets and an aborted batch leaves offsets that
//! no committed reader sees.

use super::config::{Isolation, KafkaConfig};
use super::logging::Logged;
use super::tpl::position_list;
use anyhow::{anyhow, bail, Context as _};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::Offset;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// A standalone reader. Its context logs through [`super::logging`], where the end-of-partition
/// event that librdkafka also reports as an error is logged at debug level.
pub type Reader = BaseConsumer<Logged>;

/// Creates a reader of the given isolation.
pub fn reader(kafka: &KafkaConfig, isolation: Isolation) -> anyhow::Result<Reader> {
    kafka
        .reader(isolation)
        .create_with_context(Logged)
        .context("creating a reader")
}

/// Whether `e` is the broker refusing a reader's nominal group (`price-alerts-reader`, see
/// [`KafkaConfig::reader`]). librdkafka wants a group.id even for assign() and then looks up that
/// group's coordinator, which a least-privilege principal is refused; a reader never uses the
/// group (it commits nothing), so the refusal is noise, not an error worth a warning.
pub fn is_nominal_group_refused(e: &KafkaError) -> bool {
    e.rdkafka_error_code() == Some(rdkafka::error::RDKafkaErrorCode::GroupAuthorizationFailed)
}

/// Default bound on reading a topic to its end.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Number of partitions of `topic`, or an error if it does not exist.
pub fn partition_count<X: ConsumerContext, C: Consumer<X>>(
    consumer: &C,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<i32> {
    partition_count_if_exists(consumer, topic, timeout)?
        .ok_or_else(|| anyhow!("topic {topic} does not exist"))
}

/// Number of partitions of `topic`, or `None` if it does not exist (yet): for readers that may
/// start before a topic is created (the DLQ backlog watcher, the replay ledger).
pub fn partition_count_if_exists<X: ConsumerContext, C: Consumer<X>>(
    consumer: &C,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<Option<i32>> {
    let md = consumer
        .fetch_metadata(Some(topic), timeout)
        .with_context(|| format!("fetching metadata of {topic}"))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    match t.error().map(rdkafka::error::RDKafkaErrorCode::from) {
        None => {}
        Some(rdkafka::error::RDKafkaErrorCode::UnknownTopicOrPartition) => return Ok(None),
        Some(code) => bail!("topic {topic}: {code:?}"),
    }
    Ok((!t.partitions().is_empty()).then(|| t.partitions().len() as i32))
}

/// Where a read "to the end" of a partition stops (see the module doc). Under read_uncommitted both
/// are the high watermark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The high watermark seen when the reader first reached the end, every transaction before it
    /// decided: all that was written before the read got there, as committed readers will see it.
    Decided,
    /// The first EOF: the last stable offset, what committed readers see at this moment. Records of
    /// a transaction not decided yet (still open, or committed with its marker not yet written)
    /// are neither read nor waited for.
    Visible,
}

/// How often a watched read asks the leaders of its held partitions for their last stable offset,
/// and reports to its caller ([`Watch`]): often enough that the caller's liveness beats stay far
/// inside any watchdog bound (81 s at the least), rarely enough that the requests cost nothing.
pub const WATCH_EVERY: Duration = Duration::from_secs(2);

/// Bound on one of those requests: past it the partition is not seen held this round (a leader
/// that does not answer is not an undecided transaction).
const HOLD_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A partition whose read to [`End::Decided`] waits on an undecided transaction, as its leader
/// answered a moment ago.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub partition: i32,
    /// The partition's leader (broker id) when the read began, -1 if unknown: where
    /// `kafka-transactions find-hanging --broker-id` looks.
    pub leader: i32,
    /// The last stable offset the leader answered: the first offset of the oldest transaction on
    /// the partition that is not decided (`kafka-transactions abort --start-offset`).
    pub last_stable: i64,
    /// The end the read waits for: the high watermark of its first end-of-partition event, or the
    /// leader's answer to ListOffsets if higher.
    pub high_watermark: i64,
}

/// What a watched read ([`read_partitions_to_end_watched`]) does while it waits.
pub struct Watch<'a> {
    /// Once every partition left is held and the read has gone on this long, it returns (with
    /// [`Ended::held`]) instead of waiting on.
    pub slice: Duration,
    /// Called every [`WATCH_EVERY`] with the records read since the last call and the partitions
    /// seen held in this round (none: not held, or their leaders did not answer).
    pub report: &'a mut dyn FnMut(u64, &[Hold]),
}

/// How a watched read ended.
#[derive(Debug, Default)]
pub struct Ended {
    /// Records read (those of held partitions included).
    pub records: u64,
    /// The partitions not at their end, each held by an undecided transaction; the others are.
    pub held: Vec<Hold>,
}

/// One partition's way to its end.
#[derive(Debug, Default)]
struct Progress {
    /// The high watermark reported with the partition's first EOF of this read; `None` until that
    /// EOF.
    target: Option<i64>,
    /// The high watermark the partition's leader answered to ListOffsets after the read began
    /// ([`leader_high_watermarks`]); `None` until it answered. Under [`End::Decided`] the end is
    /// the larger of the two.
    floor: Option<i64>,
    /// The leader's latest refusal of that request (OFFSET_NOT_AVAILABLE: a new leader whose high
    /// watermark lags), for the error that says why a read did not end.
    refused: Option<String>,
    /// The reader's position at its latest EOF, i.e. the last stable offset then; for the error
    /// that says why a read did not end.
    stable: Option<i64>,
}

impl Progress {
    /// At an EOF of `partition` (or when its leader's high watermark arrives after one): whether
    /// the read of it has reached `end`.
    fn at_eof(
        &mut self,
        consumer: &Reader,
        topic: &str,
        partition: i32,
        end: End,
    ) -> anyhow::Result<bool> {
        if end == End::Visible {
            return Ok(true);
        }
        let (low, high) = fetched_watermarks(consumer, topic, partition)?;
        let position = position_of(consumer, topic, partition)?;
        Ok(self.reached(position, low, high))
    }

    /// The decision at an EOF, from the reader's `position` (`None`: nothing delivered since the
    /// assign) and the `low` and `high` watermarks of the latest fetch response.
    fn reached(&mut self, position: Option<i64>, low: i64, high: i64) -> bool {
        // Nothing delivered yet, not even a marker: the reader is where it started, at the log
        // start (the fetch response's, like the high watermark).
        let position = position.unwrap_or(low);
        // The first EOF's high watermark, kept: records written after the read got there do not
        // move its end, so a writer that keeps a transaction open at all times cannot starve it.
        self.target.get_or_insert(high);
        self.stable = Some(position);
        self.end().is_some_and(|end| position >= end)
    }

    /// The end under [`End::Decided`], once both high watermarks are known.
    fn end(&self) -> Option<i64> {
        Some(self.target?.max(self.floor?))
    }
}

/// The next offset `consumer` will deliver of `topic`/`partition` (past any marker it read), or
/// `None` if it delivered nothing since it was assigned. A local call.
fn position_of(consumer: &Reader, topic: &str, partition: i32) -> anyhow::Result<Option<i64>> {
    let positions = consumer
        .position()
        .context("reading the reader's position")?;
    Ok(
        match positions
            .find_partition(topic, partition)
            .map(|e| e.offset())
        {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        },
    )
}

/// The log start offset and high watermark of `topic`/`partition` as the latest fetch response
/// reported them; librdkafka keeps both, so no request is made.
///
/// Why not [`Consumer::fetch_watermarks`]: it asks the leader with the reader's isolation level,
/// and a read_committed reader is then answered with the last stable offset as its "high"
/// watermark, the very offset it has to look past. rust-rdkafka does not wrap
/// `rd_kafka_get_watermark_offsets`, hence the one `unsafe` call.
fn fetched_watermarks(
    consumer: &Reader,
    topic: &str,
    partition: i32,
) -> anyhow::Result<(i64, i64)> {
    let topic_c = CString::new(topic).context("topic name with a NUL byte")?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client handle is valid while `consumer` is borrowed, `topic_c` is a
    // NUL-terminated string that outlives the call, and `low`/`high` are valid for writes.
    // librdkafka only reads its partition state, under the partition's lock, and keeps no pointer.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic_c.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    match RDKafkaErrorCode::from(err) {
        RDKafkaErrorCode::NoError => Ok((low, high)),
        code => bail!("watermarks of {topic}/{partition}: {code}"),
    }
}

/// How long a request for the leaders' high watermarks ([`leader_high_watermarks`]) may take.
const FLOOR_TIMEOUT: Duration = Duration::from_secs(5);

/// How soon a partition whose leader refused its high watermark is asked again: a new leader's
/// high watermark catches up as soon as its followers fetch from it, within milliseconds unless
/// one of them stalls.
const FLOOR_RETRY: Duration = Duration::from_millis(100);

/// The high watermark of each of `partitions` of `topic`, as its leader answers ListOffsets
/// "latest" under read_uncommitted, or why it did not (its error, or a timeout as an error of the
/// whole call). Asked through `consumer`'s own connections with librdkafka's admin ListOffsets,
/// whose isolation level is per request (the reader's watermark request would be answered with
/// the last stable offset).
///
/// Why not the high watermark of a fetch response: after a leader election the new leader's high
/// watermark lags the old one's until the remaining followers fetch from it (a follower learns the
/// high watermark from the fetch response after the one that moved it), and Fetch responses report
/// it as it is, below records that every replica had and that were acknowledged. ListOffsets
/// "latest" is refused (OFFSET_NOT_AVAILABLE) until the new leader's high watermark reaches the
/// start offset of its leader epoch, i.e. its own log end when it was elected: an answer is at or
/// above every record acknowledged before the election (issue 43, item 7).
fn leader_high_watermarks(
    consumer: &Reader,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
) -> anyhow::Result<BTreeMap<i32, Result<i64, RDKafkaErrorCode>>> {
    use rdkafka::bindings as rd;
    let topic_c = CString::new(topic).context("topic name with a NUL byte")?;
    let timeout_ms = i32::try_from(timeout.as_millis())
        .unwrap_or(i32::MAX)
        .max(1);
    let mut answers = BTreeMap::new();
    // SAFETY: the client handle is valid while `consumer` is borrowed. Every object made here is
    // destroyed here, once: the partition list and the options after rd_kafka_ListOffsets, which
    // copies what it needs; the event after it is read; the queue last (a reply that comes after
    // the poll gave up holds its own reference to the queue, and librdkafka drops it). The result
    // infos and their partitions belong to the event and are read before it is destroyed.
    unsafe {
        let rk = consumer.client().native_ptr();
        let list = rd::rd_kafka_topic_partition_list_new(partitions.len().max(1) as i32);
        for &p in partitions {
            let e = rd::rd_kafka_topic_partition_list_add(list, topic_c.as_ptr(), p);
            (*e).offset = rd::rd_kafka_OffsetSpec_t::RD_KAFKA_OFFSET_SPEC_LATEST as i64;
        }
        let options = rd::rd_kafka_AdminOptions_new(
            rk,
            rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_LISTOFFSETS,
        );
        let mut errstr = [0 as std::ffi::c_char; 256];
        let set_timeout = rd::rd_kafka_AdminOptions_set_request_timeout(
            options,
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        let set_isolation = rd::rd_kafka_AdminOptions_set_isolation_level(
            options,
            rd::rd_kafka_IsolationLevel_t::RD_KAFKA_ISOLATION_LEVEL_READ_UNCOMMITTED,
        );
        let options_set = RDKafkaErrorCode::from(set_timeout) == RDKafkaErrorCode::NoError
            && set_isolation.is_null();
        if !set_isolation.is_null() {
            rd::rd_kafka_error_destroy(set_isolation);
        }
        if !options_set {
            rd::rd_kafka_AdminOptions_destroy(options);
            rd::rd_kafka_topic_partition_list_destroy(list);
            bail!("setting the options of a ListOffsets request on {topic}");
        }
        let queue = rd::rd_kafka_queue_new(rk);
        rd::rd_kafka_ListOffsets(rk, list, options, queue);
        rd::rd_kafka_AdminOptions_destroy(options);
        rd::rd_kafka_topic_partition_list_destroy(list);
        // A little longer than the request's own timeout, after which librdkafka answers with it.
        let event = rd::rd_kafka_queue_poll(queue, timeout_ms.saturating_add(1000));
        if event.is_null() {
            rd::rd_kafka_queue_destroy(queue);
            bail!("the high watermarks of {topic}: no answer within {timeout:?}");
        }
        let err = RDKafkaErrorCode::from(rd::rd_kafka_event_error(event));
        let result = rd::rd_kafka_event_ListOffsets_result(event);
        if err == RDKafkaErrorCode::NoError && !result.is_null() {
            let mut n = 0usize;
            let infos = rd::rd_kafka_ListOffsets_result_infos(result, &mut n);
            for i in 0..n {
                let tp = rd::rd_kafka_ListOffsetsResultInfo_topic_partition(*infos.add(i));
                if tp.is_null() {
                    continue;
                }
                let code = RDKafkaErrorCode::from((*tp).err);
                answers.insert(
                    (*tp).partition,
                    match code {
                        RDKafkaErrorCode::NoError => Ok((*tp).offset),
                        code => Err(code),
                    },
                );
            }
        }
        rd::rd_kafka_event_destroy(event);
        rd::rd_kafka_queue_destroy(queue);
        if err != RDKafkaErrorCode::NoError {
            bail!("the high watermarks of {topic}: {err}");
        }
    }
    Ok(answers)
}

/// Reads the given partitions of `topic` from the beginning up to their [`End`], calling `f` for
/// each record; returns the number of records read. Fails after `timeout`, saying which partitions
/// did not get there and why.
pub fn read_partitions_to_end(
    consumer: &Reader,
    topic: &str,
    partitions: &[i32],
    end: End,
    timeout: Duration,
    f: impl FnMut(&BorrowedMessage<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    read(consumer, topic, partitions, end, timeout, None, f).map(|ended| ended.records)
}

/// [`read_partitions_to_end`] to [`End::Decided`], watched (see the module doc): reports to
/// `watch` every [`WATCH_EVERY`], and returns the partitions held by an undecided transaction
/// instead of failing once they are all that is left, after `watch.slice` or at the deadline.
/// Fails after `timeout` only if a partition left is not held.
pub fn read_partitions_to_end_watched(
    consumer: &Reader,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
    watch: Watch<'_>,
    f: impl FnMut(&BorrowedMessage<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<Ended> {
    read(
        consumer,
        topic,
        partitions,
        End::Decided,
        timeout,
        Some(watch),
        f,
    )
}

fn read(
    consumer: &Reader,
    topic: &str,
    partitions: &[i32],
    end: End,
    timeout: Duration,
    mut watch: Option<Watch<'_>>,
    mut f: impl FnMut(&BorrowedMessage<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<Ended> {
    let tpl = position_list(topic, partitions.iter().map(|&p| (p, Offset::Beginning)))?;
    // Leaders first: a partition assigned at a logical offset (the beginning) before its leader is
    // known waits for librdkafka's offset-query retry timer (500 ms) instead of asking at once.
    // One metadata round trip makes a fresh reader (every restore after a start) start reading
    // in milliseconds.
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .with_context(|| format!("fetching metadata of {topic}"))?;
    let leaders: BTreeMap<i32, i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| (p.id(), p.leader())))
        .collect();
    consumer
        .assign(&tpl)
        .context("assigning partitions to the reader")?;
    let mut pending: BTreeMap<i32, Progress> = partitions
        .iter()
        .map(|&p| (p, Progress::default()))
        .collect();
    let started = Instant::now();
    let deadline = started + timeout;
    let mut next_watch = started + WATCH_EVERY;
    // Under End::Decided, the leaders' high watermarks are asked for at once, and again every
    // FLOOR_RETRY for the partitions whose leader has not answered.
    let mut next_floor = (end == End::Decided).then_some(started);
    let mut count = 0;
    let mut since_report = 0;
    let result = loop {
        if pending.is_empty() {
            break Ok(Ended {
                records: count,
                held: Vec::new(),
            });
        }
        if next_floor.is_some_and(|due| Instant::now() >= due) {
            let bound = FLOOR_TIMEOUT.min(deadline.saturating_duration_since(Instant::now()));
            match take_floors(consumer, topic, &mut pending, end, bound) {
                Ok(true) => next_floor = Some(Instant::now() + FLOOR_RETRY),
                Ok(false) => next_floor = None,
                Err(e) => break Err(e),
            }
            continue;
        }
        let now = Instant::now();
        if let Some(w) = watch
            .as_mut()
            .filter(|_| now >= next_watch || now >= deadline)
        {
            next_watch = now + WATCH_EVERY;
            let held = holds(consumer, topic, &pending, &leaders);
            (w.report)(since_report, &held);
            since_report = 0;
            if held.len() == pending.len() && (now >= started + w.slice || now >= deadline) {
                break Ok(Ended {
                    records: count,
                    held,
                });
            }
        }
        if now >= deadline {
            break Err(not_at_end(topic, timeout, &pending));
        }
        let mut wait = deadline;
        if watch.is_some() {
            wait = wait.min(next_watch);
        }
        if let Some(due) = next_floor {
            wait = wait.min(due);
        }
        match consumer.poll(wait.saturating_duration_since(now)) {
            None => {}
            Some(Ok(m)) => {
                count += 1;
                since_report += 1;
                if let Err(e) = f(&m) {
                    break Err(e);
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                let Some(progress) = pending.get_mut(&p) else {
                    continue;
                };
                match progress.at_eof(consumer, topic, p, end) {
                    Ok(true) => {
                        pending.remove(&p);
                    }
                    // Below the target: the next EOF comes once the LSO moves (a marker).
                    Ok(false) => debug!(
                        topic,
                        partition = p,
                        stable = progress.stable,
                        high_watermark = progress.target,
                        "at the last stable offset, below the high watermark: waiting for a transaction to be decided"
                    ),
                    Err(e) => break Err(e),
                }
            }
            Some(Err(e)) if is_nominal_group_refused(&e) => {
                debug!(topic, error = %e, "reader's nominal group refused")
            }
            // Connection trouble is retried by librdkafka; the deadline bounds the wait.
            Some(Err(e)) => warn!(topic, error = %e, "error while reading; retrying"),
        }
    };
    // Leave the reader free for the next call whatever happened.
    let _ = consumer.unassign();
    result
}

/// Asks the leaders of the partitions of `pending` whose high watermark is not known yet for it
/// ([`leader_high_watermarks`], bounded by `bound`), and ends the read of those that have had
/// their EOF and are at their end with it. Returns whether some are still without one (refused,
/// or not answered).
fn take_floors(
    consumer: &Reader,
    topic: &str,
    pending: &mut BTreeMap<i32, Progress>,
    end: End,
    bound: Duration,
) -> anyhow::Result<bool> {
    let missing: Vec<i32> = pending
        .iter()
        .filter(|(_, p)| p.floor.is_none())
        .map(|(&p, _)| p)
        .collect();
    if missing.is_empty() {
        return Ok(false);
    }
    let answers = match leader_high_watermarks(consumer, topic, &missing, bound) {
        Ok(answers) => answers,
        Err(e) => {
            // A leader that does not answer is asked again; the read's deadline bounds it.
            debug!(topic, error = %e, "high watermarks not answered");
            return Ok(true);
        }
    };
    let mut reached = Vec::new();
    for (partition, answer) in answers {
        let Some(progress) = pending.get_mut(&partition) else {
            continue;
        };
        match answer {
            Ok(high) => {
                progress.floor = Some(high);
                if progress.stable.is_some() && progress.at_eof(consumer, topic, partition, end)? {
                    reached.push(partition);
                }
            }
            Err(code) => {
                debug!(topic, partition, error = %code, "high watermark refused by the leader");
                progress.refused = Some(code.to_string());
            }
        }
    }
    for p in reached {
        pending.remove(&p);
    }
    Ok(pending.values().any(|p| p.floor.is_none()))
}

/// The partitions of `pending` held by an undecided transaction, as their leaders answer now: those
/// that have had their first end-of-partition event (so their end is known) and whose last stable
/// offset is still below it. A read_committed reader's watermark request is answered with the last
/// stable offset as its high watermark (see [`fetched_watermarks`]), which is what is asked here;
/// a request not answered in time leaves its partition out.
fn holds(
    consumer: &Reader,
    topic: &str,
    pending: &BTreeMap<i32, Progress>,
    leaders: &BTreeMap<i32, i32>,
) -> Vec<Hold> {
    let mut held = Vec::new();
    for (&partition, progress) in pending {
        let Some(end) = progress.end() else {
            continue;
        };
        match consumer.fetch_watermarks(topic, partition, HOLD_PROBE_TIMEOUT) {
            Ok((_, stable)) if stable < end => held.push(Hold {
                partition,
                leader: leaders.get(&partition).copied().unwrap_or(-1),
                last_stable: stable,
                high_watermark: end,
            }),
            Ok(_) => {}
            Err(e) => debug!(topic, partition, error = %e, "last stable offset not answered"),
        }
    }
    held
}

/// The error of a read that did not reach the end of `pending` within `timeout`: per partition,
/// whether it is held below the high watermark by an undecided transaction or not at its end at all.
fn not_at_end(topic: &str, timeout: Duration, pending: &BTreeMap<i32, Progress>) -> anyhow::Error {
    let mut why = String::new();
    for (p, progress) in pending {
        let _ = match (progress.stable, progress.end()) {
            (Some(stable), None) => write!(
                why,
                "; partition {p}: at offset {stable}, its leader's high watermark not known{}",
                match &progress.refused {
                    Some(code) => format!(
                        " (refused: {code}; a new leader whose high watermark lags, waiting for \
                         its followers?)"
                    ),
                    None => " (not answered)".to_owned(),
                }
            ),
            (Some(stable), Some(high)) => write!(
                why,
                "; partition {p}: at the last stable offset {stable}, below the high watermark {high}: \
                 a transaction on it was not decided (a hanging transaction? see \
                 `kafka-transactions find-hanging`)"
            ),
            _ => write!(why, "; partition {p}: not at its end (no end-of-partition event)"),
        };
    }
    anyhow!("reading {topic} to its end took longer than {timeout:?}{why}")
}

/// Reads every partition of `topic` to its end ([`End::Decided`]) with a fresh reader of the given
/// isolation.
pub fn read_topic_to_end(
    kafka: &KafkaConfig,
    topic: &str,
    isolation: Isolation,
    timeout: Duration,
    f: impl FnMut(&BorrowedMessage<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    read_topic(kafka, topic, isolation, End::Decided, timeout, f)
}

fn read_topic(
    kafka: &KafkaConfig,
    topic: &str,
    isolation: Isolation,
    end: End,
    timeout: Duration,
    f: impl FnMut(&BorrowedMessage<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let consumer = reader(kafka, isolation)?;
    let n = partition_count(&consumer, topic, timeout)?;
    let partitions: Vec<i32> = (0..n).collect();
    read_partitions_to_end(&consumer, topic, &partitions, end, timeout, f)
}

/// Counts the records of `topic` visible under `isolation` once every transaction written before
/// the count is decided ([`End::Decided`]).
pub fn count_records(
    kafka: &KafkaConfig,
    topic: &str,
    isolation: Isolation,
) -> anyhow::Result<u64> {
    read_topic(
        kafka,
        topic,
        isolation,
        End::Decided,
        DEFAULT_READ_TIMEOUT,
        |_| Ok(()),
    )
}

/// Counts the records of `topic` that readers of `isolation` see at this moment ([`End::Visible`]):
/// under read_committed, not those of a transaction not decided yet. For tests that look for an
/// open transaction.
pub fn count_visible_records(
    kafka: &KafkaConfig,
    topic: &str,
    isolation: Isolation,
) -> anyhow::Result<u64> {
    read_topic(
        kafka,
        topic,
        isolation,
        End::Visible,
        DEFAULT_READ_TIMEOUT,
        |_| Ok(()),
    )
}

/// Bound on each broker request of [`Ends::reached`] (a partition's end, the group's committed
/// offsets): a request not answered in time means "not known to be at the end, look again".
pub const END_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether a group member has read every partition assigned to it to its end: the check behind
/// alert-deliver's `--exit-when-idle`. Quiet for a while proves nothing on a slow broker: a
/// fresh-clone suite run saw alert-deliver stop 3.4 s after handing ten retries to its first
/// bucket, none fetched back yet. A member that has been quiet asks this, and stops only on `true`.
///
/// The end is the high watermark, read by a read_uncommitted probe of its own: a transaction
/// committed whose markers are not written yet still counts as unread (a read_committed member's
/// own watermark requests would give the last stable offset). librdkafka moves a member's
/// position past transaction markers, so a partition read to its end has its position there. A
/// partition the member has read nothing of yet is at its end when empty, or when the group's
/// committed offset is there already.
pub struct Ends {
    kafka: KafkaConfig,
    probe: Option<Reader>,
}

impl Ends {
    /// Ends read through clients of `kafka`; the probe is made at the first [`Ends::reached`].
    pub fn new(kafka: &KafkaConfig) -> Self {
        Ends {
            kafka: kafka.clone(),
            probe: None,
        }
    }

    /// Whether `member` has read each partition assigned to it to its end. Each broker request
    /// is bounded by `timeout`; an error means "not known to be at the end".
    pub fn reached<C: ConsumerContext>(
        &mut self,
        member: &BaseConsumer<C>,
        timeout: Duration,
    ) -> anyhow::Result<bool> {
        let probe = match &mut self.probe {
            Some(probe) => probe,
            slot @ None => slot.insert(reader(&self.kafka, Isolation::ReadUncommitted)?),
        };
        let positions = member.position().context("the member's positions")?;
        let mut unread = rdkafka::TopicPartitionList::new();
        let mut ends = BTreeMap::new();
        for e in positions.elements() {
            let (low, high) = probe
                .fetch_watermarks(e.topic(), e.partition(), timeout)
                .with_context(|| format!("the end of {} [{}]", e.topic(), e.partition()))?;
            match e.offset() {
                Offset::Offset(at) if at >= high => {}
                Offset::Offset(_) => return Ok(false),
                _ if low == high => {}
                _ => {
                    unread.add_partition(e.topic(), e.partition());
                    ends.insert((e.topic().to_owned(), e.partition()), high);
                }
            }
        }
        if unread.count() == 0 {
            return Ok(true);
        }
        let committed = member
            .committed_offsets(unread, timeout)
            .context("the group's committed offsets")?;
        Ok(committed.elements().iter().all(|e| {
            let end = ends.get(&(e.topic().to_owned(), e.partition()));
            matches!((e.offset(), end), (Offset::Offset(at), Some(&end)) if at >= end)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::Progress;

    /// A partition's progress whose leader answered `high` as its high watermark.
    fn led(high: i64) -> Progress {
        Progress {
            floor: Some(high),
            ..Progress::default()
        }
    }

    #[test]
    fn an_empty_partition_ends_at_its_first_eof() {
        assert!(led(0).reached(None, 0, 0));
        // Everything deleted by retention: the log starts at its high watermark.
        assert!(led(40).reached(None, 40, 40));
    }

    #[test]
    fn a_partition_holding_only_an_open_transaction_waits() {
        let mut p = led(3);
        // Records 0..3 of a transaction without its marker: the LSO is 0, nothing delivered.
        assert!(!p.reached(None, 0, 3));
        // Aborted: the records are skipped, the marker at 3 moves the position to 4.
        assert!(p.reached(Some(4), 0, 4));
    }

    #[test]
    fn a_commit_without_its_marker_holds_the_read_until_its_records_are_read() {
        let mut p = led(5);
        // Committed batch at 0..2, marker at 2; the next batch at 3..5, its marker not written:
        // the LSO (and the position) is 3, the high watermark 5.
        assert!(!p.reached(Some(3), 0, 5));
        // The marker at 5 arrives: records 3 and 4 are delivered, the position passes the marker.
        assert_eq!(p.stable, Some(3));
        assert!(p.reached(Some(6), 0, 6));
    }

    #[test]
    fn the_end_is_the_first_eofs_high_watermark_not_a_later_one() {
        let mut p = led(5);
        assert!(!p.reached(Some(3), 0, 5));
        // Meanwhile a zombie opened another transaction at 7..9: the end stays at 5.
        assert!(p.reached(Some(7), 0, 9));
        assert_eq!(p.target, Some(5));
    }

    #[test]
    fn a_stale_high_watermark_of_a_new_leader_does_not_end_the_read() {
        // The new leader's fetch response says 401 (its high watermark as a follower), the
        // batch at 401..801 is in its log, its marker not yet: the LSO is 401.
        let mut p = Progress::default();
        assert!(
            !p.reached(Some(401), 0, 401),
            "no answer from the leader yet"
        );
        // ListOffsets answered once the leader's high watermark caught up: 801.
        p.floor = Some(801);
        assert!(!p.reached(Some(401), 0, 401));
        assert_eq!(p.end(), Some(801));
        // The marker at 801: the batch is delivered, the position passes the marker.
        assert!(p.reached(Some(802), 0, 802));
    }
}
