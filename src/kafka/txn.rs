//! The transactional producer and the one function that decides what a transactional error means.
//!
//! ```text
//!   init_transactions ─► begin ─► send* ─► send_offsets_to_transaction ─► commit ─┐
//!                          ▲                                                      │
//!                          └──────────────────────────────────────────────────────┘
//!   any step: Retriable ─► the same call again, same offsets (bounded)
//!             Abortable ─► abort; the caller rewinds its input and state, then begins again
//!             Fatal     ─► stop: this instance is fenced or not allowed; exit non-zero
//! ```
//!
//! # Error handling
//! librdkafka flags every transactional error: `is_fatal`, `txn_requires_abort`, `is_retriable`.
//! [`classify`] maps those flags, in that order of precedence, to [`TxnErrorClass`]. An error with
//! no flag is treated as fatal: when the library cannot say the state is safe, continuing could
//! break exactly-once, and a supervisor restart (which re-runs `init_transactions`) is the safe
//! move.
//!
//! Authorisation errors are classified in [`classify`] too: a refused transactional id or cluster
//! right is fatal, a refused topic right abortable (docs/security.md). One librdkafka fatal error
//! is mended in place: see [`TxnProducer::restart`].
//!
//! # Fences
//! A producer refused as fenced was fenced either by its coordinator, which aborted a transaction
//! that outlived its timeout and bumped the epoch (a frozen or lost coordinator kept the call
//! waiting), or by a newer producer that registered the same transactional id (a replacement of
//! this instance). Registering the id again is right in the first case and steals it in the
//! second: the replacement is fenced in turn and exits. The error does not tell them apart.
//! librdkafka 2.12 speaks the first transaction protocol (EndTxn v0-1, AddPartitionsToTxn v0,
//! no KIP-890 TRANSACTION_ABORTABLE); the broker compares epochs only, so it refuses an old one
//! alike whoever bumped it (INVALID_PRODUCER_EPOCH to AddPartitionsToTxn v0 and Produce,
//! PRODUCER_FENCED to newer requests: "Producer attempted an operation with an old epoch" in
//! tests/pipeline.rs's thawed zombie), and librdkafka folds both into `_FENCED`
//! (`rd_kafka_txn_normalize_err`, `rd_kafka_idemp_check_error`). The epoch the coordinator holds
//! now would tell (one more than ours: its timeout; more: a registration), but only
//! DescribeTransactions (KIP-664) shows it, which librdkafka does not implement, or a new
//! registration, which is the theft itself.
//!
//! What this process can tell is whether it was there ([`super::away`]): [`Fence::of`] calls a
//! fence the coordinator's timeout only if the transaction outlived its timeout while the process
//! was away for at most half of it; it was then waiting on the broker, and no replacement was
//! started for an instance that never stopped answering. That fence is mended once between
//! commits, by making the producer again at the abort. A fence of a younger transaction, a second
//! one before a commit, and one that came after the process was away longer (stopped, paused: a
//! thawed zombie whose replacement may hold the id) are fatal: the process exits non-zero, and
//! the newer instance keeps the id. For the same reason a call's deadline does not count the
//! time the process was away ([`Generation::call`]): a call that a SIGSTOP kept from its answer
//! is not stuck, and making the producer again for it would register the id anew too.
//!
//! # Retries
//! A retriable error repeats the same call with the same arguments, with a short backoff, at most
//! [`MAX_RETRIES`] times and while the call's deadline leaves room for the backoff. An error still
//! retriable after that is a call that did not get done in time, as one that did not return
//! (below): abortable, and the producer made again at the abort. It was fatal, and a timeout that
//! librdkafka answered 33 ms before the deadline of `send_offsets_to_transaction` (the group
//! coordinator's broker SIGKILLed, tests/coordinator.rs) ended an instance that could heal in
//! place.
//!
//! # Deadlines
//! librdkafka's transactional calls can block for ever: `send_offsets_to_transaction` ignores its
//! timeout while the group coordinator is down (librdkafka #5456) and waits on a stale coordinator
//! that is gone for good (#5511); neither fix is in a release. So no call into it is trusted to
//! return. Each transactional call of a producer runs on a thread of that producer's own
//! ([`Calls`]), and the caller waits for its answer at most [`call_deadline`] (the transaction
//! timeout plus [`CALL_MARGIN`]; [`INIT_TIMEOUT`] for `init_transactions`; half the transaction
//! timeout, but at least [`COORDINATOR_FAILOVER`], for `send_offsets_to_transaction`, which
//! waits only on coordinators: [`send_offsets_deadline`]). Past a commit's or an abort's deadline
//! the broker has aborted the transaction on its own (or committed it, if EndTxn got through), so
//! waiting longer buys nothing; past send_offsets' shorter one the transaction may still be open,
//! and nothing of it is committed: the new producer's registration below aborts it. Then:
//!
//! ```text
//!   deadline passed ─► one WARN line (call, transaction coordinator last seen, elapsed) + metric
//!                  ─► the producer is marked stuck: every call but abort fails at once
//!                  ─► the caller's abortable path: abort() throws the librdkafka producer away
//!                     and registers a new one with the same transactional.id; its
//!                     init_transactions bumps the epoch, fences the stuck one and finishes what
//!                     it left open ─► the caller rewinds to the committed offsets, as after any
//!                     abort (after a stuck commit, whether it committed is read back from them)
//!   new producer's registration fails or passes its deadline too ─► fatal: the process exits
//!                     with [`EXIT_STUCK`] (a supervisor restarts it; the README states the bound)
//! ```
//!
//! The stuck call's thread keeps the old producer alive until the call returns, if ever; it holds
//! nothing else. Commit and abort pass no client-side timeout to librdkafka (an expired one would
//! leave the transaction in a state only an abort may follow): the deadline is ours, and it ends
//! the producer rather than the call.

use crate::kafka::access::{self, AccessError};
use crate::kafka::away;
use crate::kafka::KafkaConfig;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::util::Timeout;
use rdkafka::{ClientContext, Message, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tracing::{debug, error, warn};

/// How often a retriable transactional call is repeated before giving up.
pub const MAX_RETRIES: u32 = 10;

/// Bound on waiting for in-flight records before a commit.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Bound on `init_transactions` (retries included): at start, or after a stuck call, the
/// coordinator may be loading or moving, but an instance that cannot register at all should say
/// so rather than hang.
pub const INIT_TIMEOUT: Duration = Duration::from_secs(60);

/// How much longer than the transaction timeout a transactional call may take before it counts as
/// stuck: by then the coordinator has aborted the transaction itself (module doc, `# Deadlines`).
pub const CALL_MARGIN: Duration = Duration::from_secs(10);

/// How long a call that waits only on coordinators gets at least ([`send_offsets_deadline`]):
/// long enough for the coordinator to move and for the producer made again after it to find the
/// new one. KRaft fences a silent broker after `broker.session.timeout.ms` (9 s by default), and
/// only then does FindCoordinator stop naming it. With 10 s, tests/coordinator.rs's SIGKILL
/// case made its producer again 10.3 s after the kill; the new producer was still given the dead
/// broker and took 25 s to register.
pub const COORDINATOR_FAILOVER: Duration = Duration::from_secs(20);

/// The exit status of a process whose transactional producer could not be made again after a
/// call stuck past its deadline (EX_TEMPFAIL: a restart is expected to mend it).
pub const EXIT_STUCK: u8 = 75;

/// How long a transactional call (other than `init_transactions`) may take, for a producer whose
/// `transaction.timeout.ms` is `txn_timeout`.
pub fn call_deadline(txn_timeout: Duration) -> Duration {
    txn_timeout + CALL_MARGIN
}

/// How long `send_offsets_to_transaction` may take: half the transaction timeout, at least
/// [`COORDINATOR_FAILOVER`], at most [`call_deadline`]. The call does no work that grows with the
/// transaction (AddOffsetsToTxn, then TxnOffsetCommit to the group coordinator), so a slow one is
/// a coordinator that is moving or gone (librdkafka #5456, #5511), and the full call deadline
/// would be added to whatever the loss already cost before the call began: in the first long
/// all-stage chaos run with coordinator kills, a pipeline instance's commit in flight at the kill
/// came back after 24.9 s and its next send_offsets then waited its 40 s; a deliverer made its
/// first call 28 s after the kill and waited as long. Both moved on 65-69 s after the kill, past
/// the transaction timeout + 30 s that issue 20 allows; with this deadline (20 s there) they
/// would have made their producers again 45-48 s after it.
pub fn send_offsets_deadline(txn_timeout: Duration) -> Duration {
    (txn_timeout / 2)
        .max(COORDINATOR_FAILOVER)
        .min(call_deadline(txn_timeout))
}

/// The longest a stage's loop can legitimately go without coming back: a call stuck to its
/// deadline, then a new producer's registration. Past it, the process is stuck where no
/// deadline of its own reaches, and its watchdog ends it ([`crate::health::Health::watchdog`]).
pub fn stuck_bound(txn_timeout: Duration) -> Duration {
    call_deadline(txn_timeout) + INIT_TIMEOUT + CALL_MARGIN
}

/// What the caller must do about a transactional error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnErrorClass {
    /// Repeat the same call.
    Retriable,
    /// Abort the transaction, rewind input and state to the last commit, begin again.
    Abortable,
    /// Stop this instance (fenced, unauthorized, or a state librdkafka cannot vouch for).
    Fatal,
}

/// What [`Generation::call`] does after an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterFailure {
    /// The same call again after this backoff.
    Retry(Duration),
    /// A retriable error with no retry left, in count or in time.
    GiveUp,
    /// The error is the caller's, with its class.
    Return,
}

/// After the `attempt`th retry failed with an error of `class`, `left` before the call's deadline.
fn after_failure(class: TxnErrorClass, attempt: u32, left: Duration) -> AfterFailure {
    let backoff = Duration::from_millis(100 * u64::from(attempt + 1));
    match class {
        TxnErrorClass::Retriable if attempt < MAX_RETRIES && backoff < left => {
            AfterFailure::Retry(backoff)
        }
        TxnErrorClass::Retriable => AfterFailure::GiveUp,
        _ => AfterFailure::Return,
    }
}

/// Who fenced a producer, as far as this process can tell (module doc, `# Fences`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// The open transaction outlived its timeout while this process was there: its coordinator
    /// aborted it, and the transactional id is still this producer's.
    TimedOut,
    /// A newer producer registered the transactional id: the open transaction (if any) is
    /// younger than its timeout, so no coordinator aborted it.
    Newer,
    /// The open transaction outlived its timeout while this process was away (stopped, paused)
    /// for this long, more than half the timeout: a replacement may have registered the id
    /// meanwhile, and taking it back would fence the replacement.
    WhileAway(Duration),
}

impl Fence {
    /// The fence of a transaction `age` old (`None`: none was begun), during which this process
    /// was away for `away`, for a producer whose transactions time out after `txn_timeout`.
    pub fn of(age: Option<Duration>, away: Duration, txn_timeout: Duration) -> Fence {
        match age {
            Some(age) if age > txn_timeout && away <= txn_timeout / 2 => Fence::TimedOut,
            Some(age) if age > txn_timeout => Fence::WhileAway(away),
            _ => Fence::Newer,
        }
    }
}

/// The single decision point for transactional errors.
///
/// Authorisation: a transactional id or cluster right that is missing is fatal whatever the flags
/// say (nothing this instance does can mend it; the operator must grant it, and the start-up check
/// names it). A topic right that is missing (TOPIC_AUTHORIZATION_FAILED, e.g. Write revoked on the
/// output while running) keeps librdkafka's class, abortable: the transaction aborts, the input
/// is rewound, and the loop retries with a backoff, reporting it, until the right is back
/// (docs/security.md has the reasoning).
pub fn classify(err: &KafkaError) -> TxnErrorClass {
    match err {
        _ if lacks_a_right(err) => TxnErrorClass::Fatal,
        KafkaError::Transaction(e) if e.is_fatal() => TxnErrorClass::Fatal,
        KafkaError::Transaction(e) if e.txn_requires_abort() => TxnErrorClass::Abortable,
        KafkaError::Transaction(e) if e.is_retriable() => TxnErrorClass::Retriable,
        // A produce call refused locally (e.g. unknown partition) leaves the transaction usable
        // only after an abort; it never fences us.
        KafkaError::MessageProduction(code) if *code != RDKafkaErrorCode::Fatal => {
            TxnErrorClass::Abortable
        }
        _ => TxnErrorClass::Fatal,
    }
}

/// Whether `err` refuses this instance a transactional id or cluster right, which only an
/// operator can grant.
fn lacks_a_right(err: &KafkaError) -> bool {
    matches!(
        err.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
        )
    )
}

/// What went wrong under a transactional step. Most causes are Kafka's; the others are named for
/// what they are instead of being dressed up as Kafka errors.
#[derive(Debug, thiserror::Error)]
pub enum TxnCause {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A panic left the engine's state half-updated; nothing in it can be trusted.
    #[error("the engine state lock was poisoned by an earlier panic")]
    LockPoisoned,
    /// The consumer has no group metadata to fence zombies with (it always has one when it has a
    /// group.id, so this is a bug, not a runtime condition).
    #[error("the consumer has no group metadata")]
    NoGroupMetadata,
    /// At least once: records of the batch could not be delivered, so its offsets must not move.
    #[error("{0} record(s) of the batch were not delivered")]
    Undelivered(u64),
    /// A fault a test hook injected (off by default; the hidden `--test-*` options).
    #[error("{0}")]
    Injected(&'static str),
    /// The call did not return within its deadline (module doc, `# Deadlines`).
    #[error("{0}")]
    Stuck(StuckCall),
    /// The thread that makes the producer's calls is gone (a panic inside librdkafka's call).
    #[error("the transactional call thread stopped")]
    CallThreadGone,
    /// The pipeline's commit thread (`--overlap-commits`) could not be started, or ended without
    /// an answer (a panic).
    #[error("the commit thread {0}")]
    CommitThread(&'static str),
}

/// A transactional call that did not get done within its deadline: it did not return, or its
/// error was still retriable when its retries ran out.
#[derive(Debug, Clone)]
pub struct StuckCall {
    pub call: &'static str,
    pub elapsed: Duration,
    /// The transaction coordinator as librdkafka's statistics last named it (`host:port`).
    pub coordinator: Option<String>,
    /// The retriable error of its last attempt; `None` when the call did not return.
    pub last_error: Option<String>,
}

impl std::fmt::Display for StuckCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let coordinator = self.coordinator.as_deref().unwrap_or("unknown");
        let s = self.elapsed.as_secs_f64();
        match &self.last_error {
            None => write!(
                f,
                "{} did not return within {s:.1} s (transaction coordinator last seen: {coordinator})",
                self.call
            ),
            Some(e) => write!(
                f,
                "{} still failed after {s:.1} s and its retries: {e} (transaction coordinator \
                 last seen: {coordinator})",
                self.call
            ),
        }
    }
}

/// A transactional error with its class and the step that raised it.
#[derive(Debug, thiserror::Error)]
#[error("{step} failed ({class:?}): {cause}")]
pub struct TxnError {
    pub step: &'static str,
    pub class: TxnErrorClass,
    #[source]
    pub cause: TxnCause,
}

impl TxnError {
    /// A Kafka error, classified by [`classify`].
    pub fn new(step: &'static str, source: KafkaError) -> Self {
        TxnError {
            step,
            class: classify(&source),
            cause: TxnCause::Kafka(source),
        }
    }

    /// An error whose class the caller knows better than [`classify`] would.
    pub fn with_class(
        step: &'static str,
        class: TxnErrorClass,
        cause: impl Into<TxnCause>,
    ) -> Self {
        TxnError {
            step,
            class,
            cause: cause.into(),
        }
    }

    /// Whether a transactional call passed its deadline (here or when the producer was made
    /// again): the process exits with [`EXIT_STUCK`] when this is fatal.
    pub fn is_stuck(&self) -> bool {
        matches!(self.cause, TxnCause::Stuck(_))
    }

    /// Whether the transaction may have committed although the call failed: `commit_transaction`
    /// passed its deadline, and its EndTxn may have reached the coordinator. The caller then
    /// rewinds to the committed offsets (read after the new producer registered), never to the
    /// batch's own first offsets.
    pub fn outcome_unknown(&self) -> bool {
        matches!(&self.cause, TxnCause::Stuck(s) if s.call == "commit_transaction")
    }

    /// Whether the producer was refused as fenced (a newer epoch of its transactional id exists:
    /// another producer registered it, or its coordinator aborted a timed-out transaction).
    pub fn is_producer_fenced(&self) -> bool {
        let TxnCause::Kafka(e) = &self.cause else {
            return false;
        };
        matches!(
            e.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::Fenced
                    | RDKafkaErrorCode::ProducerFenced
                    | RDKafkaErrorCode::InvalidProducerEpoch
            )
        )
    }

    /// Whether the transactional id or a cluster right is refused ([`classify`]): registering
    /// again would be refused too.
    pub fn is_unauthorized(&self) -> bool {
        matches!(&self.cause, TxnCause::Kafka(e) if lacks_a_right(e))
    }

    /// Whether a newer instance with the same transactional id (or group instance id) took over:
    /// this one must stop, and a restart would only fence the newer one in turn.
    pub fn is_fenced(&self) -> bool {
        self.is_producer_fenced()
            || matches!(&self.cause, TxnCause::Kafka(e)
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::FencedInstanceId))
    }
}

/// Counts delivery failures, which in a transaction show up again as an abortable commit error;
/// the at-least-once mode reads them to decide whether offsets may be committed. Notes the topics
/// a record was refused for (TOPIC_AUTHORIZATION_FAILED), so the abort that follows can name the
/// missing right without asking the broker, and sums up the other failures per partition, so the
/// abort says once what failed ([`TxnProducer::report_failures`]) instead of a line per record.
#[derive(Default)]
pub struct DeliveryContext {
    failures: AtomicU64,
    refused: Mutex<BTreeSet<String>>,
    failed: Mutex<Failed>,
    /// The transaction coordinator's `host:port`, from librdkafka's statistics.
    coordinator: Mutex<Option<String>>,
}

/// Delivery failures since the last report: how many per topic and partition, and the first.
#[derive(Default)]
struct Failed {
    per_partition: BTreeMap<(String, i32), u64>,
    first: Option<String>,
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        if let Some(topic) = refused_add_partition(fac, log_message) {
            self.note_refused(topic);
        }
        crate::kafka::logging::log(level, fac, log_message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        crate::kafka::logging::error(&error, reason);
    }

    /// librdkafka's statistics: the transaction coordinator is its logical broker
    /// "TxnCoordinator", whose node name is that of the broker it stands for.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let coordinator = statistics
            .brokers
            .values()
            .find(|b| b.source == "logical" && b.name.starts_with("TxnCoordinator"))
            .map(|b| b.nodename.clone())
            .filter(|n| !n.is_empty());
        if let (Some(c), Ok(mut known)) = (coordinator, self.coordinator.lock()) {
            *known = Some(c);
        }
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result {
            if matches!(
                e.rdkafka_error_code(),
                Some(RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight)
            ) {
                // Purged by our own abort: the record was meant to vanish with its transaction.
                debug!(topic = m.topic(), "record purged by abort");
                return;
            }
            self.failures.fetch_add(1, Ordering::Relaxed);
            crate::metrics::delivery_failed(m.topic());
            // Per record at debug level only: a batch of thousands fails alike, and the abort
            // that follows says it once (`report_failures`, or the refused right).
            debug!(topic = m.topic(), partition = m.partition(), error = %e, "delivery failed");
            if e.rdkafka_error_code() == Some(RDKafkaErrorCode::TopicAuthorizationFailed) {
                self.note_refused(m.topic());
            } else if let Ok(mut failed) = self.failed.lock() {
                *failed
                    .per_partition
                    .entry((m.topic().to_owned(), m.partition()))
                    .or_default() += 1;
                failed.first.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// The topic of librdkafka's line for an AddPartitionsToTxn refused for lack of Write (facility
/// ADDPARTS): `TxnCoordinator/1: Failed to add partition "<topic>" [<p>] to transaction: Broker:
/// Topic authorization failed`. The transaction then fails with TOPIC_AUTHORIZATION_FAILED and its
/// records are purged by the abort, so no delivery report names the topic: this line is the only
/// place librdkafka does (a metadata probe cannot tell either while Read still grants Describe).
fn refused_add_partition<'a>(fac: &str, message: &'a str) -> Option<&'a str> {
    const PREFIX: &str = "Failed to add partition \"";
    if fac != "ADDPARTS" || !message.contains("Topic authorization failed") {
        return None;
    }
    let start = message.find(PREFIX)? + PREFIX.len();
    let len = message[start..].find('"')?;
    Some(&message[start..start + len])
}

impl DeliveryContext {
    fn note_refused(&self, topic: &str) {
        if let Ok(mut refused) = self.refused.lock() {
            if !refused.contains(topic) {
                refused.insert(topic.to_owned());
            }
        }
    }

    /// Delivery failures so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    fn coordinator(&self) -> Option<String> {
        self.coordinator.lock().ok().and_then(|c| c.clone())
    }
}

type Client = ThreadedProducer<DeliveryContext>;

/// A job for a producer's call thread.
type Job = Box<dyn FnOnce(&Client) + Send>;

/// The thread that makes one librdkafka producer's transactional calls, so that the caller can
/// stop waiting for one ([`Calls::call`]). It holds the producer until its last call returns:
/// when a call never does, the thread and the producer are what is left behind, and nothing
/// else waits on them.
struct Calls {
    jobs: mpsc::Sender<Job>,
}

/// Why a call made through [`Calls`] has no answer.
enum NoAnswer {
    Deadline,
    Gone,
}

impl Calls {
    fn spawn(producer: Arc<Client>) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("txn-calls".into())
            .spawn(move || {
                for job in queue {
                    job(&producer);
                }
            })?;
        Ok(Calls { jobs })
    }

    /// Runs `f` on the call thread and waits for its answer until `deadline`, moved on by
    /// whatever time `away` says the process was away meanwhile (module doc, `# Fences`).
    fn call<T: Send + 'static>(
        &self,
        mut deadline: Instant,
        away: Option<&away::Clock>,
        f: impl FnOnce(&Client) -> T + Send + 'static,
    ) -> Result<T, NoAnswer> {
        let (tx, rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |p| {
            let _ = tx.send(f(p));
        });
        let away_then = away.map(|c| c.away(Instant::now()));
        self.jobs.send(job).map_err(|_| NoAnswer::Gone)?;
        let mut allowed = Duration::ZERO;
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(answer) => return Ok(answer),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(NoAnswer::Gone),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let gone = match (away, away_then) {
                        (Some(c), Some(then)) => c.away(Instant::now()).saturating_sub(then),
                        _ => Duration::ZERO,
                    };
                    if gone <= allowed {
                        return Err(NoAnswer::Deadline);
                    }
                    debug!(
                        away_s = format!("{:.1}", gone.as_secs_f64()),
                        "the process was away during a transactional call; its deadline moves on as much"
                    );
                    deadline += gone - allowed;
                    allowed = gone;
                }
            }
        }
    }
}

/// One registered librdkafka producer, its call thread, and whether a call of it got stuck.
struct Generation {
    producer: Arc<Client>,
    calls: Calls,
    stuck: Mutex<Option<StuckCall>>,
    /// A call of it was refused as fenced, and it is to be made again ([`TxnProducer::fenced`]).
    fenced: AtomicBool,
    /// The process's time away, which a call's deadline does not count ([`Generation::call`]).
    away: Option<Arc<away::Clock>>,
}

impl Generation {
    fn new(producer: Client) -> Result<Self, TxnError> {
        let producer = Arc::new(producer);
        let calls = Calls::spawn(Arc::clone(&producer)).map_err(|e| {
            TxnError::with_class(
                "spawn call thread",
                TxnErrorClass::Fatal,
                KafkaError::ClientCreation(e.to_string()),
            )
        })?;
        Ok(Generation {
            producer,
            calls,
            stuck: Mutex::new(None),
            fenced: AtomicBool::new(false),
            away: away::process(),
        })
    }

    /// The process's time away so far (zero without the clock).
    fn away(&self, now: Instant) -> Duration {
        self.away.as_ref().map_or(Duration::ZERO, |c| c.away(now))
    }

    fn stuck(&self) -> Option<StuckCall> {
        self.stuck.lock().ok().and_then(|s| s.clone())
    }

    /// Calls `call` on the call thread until it succeeds or fails for good, within `bound` for all
    /// attempts: a retriable error repeats it with a short backoff, at most [`MAX_RETRIES`] times
    /// (then it is fatal); any other error is returned with its class. A call that does not
    /// return in time marks this producer stuck (module doc, `# Deadlines`). Time the process
    /// was away (stopped, paused) does not count against `bound`: it is the broker's slowness that
    /// the deadline bounds, and a call kept from its answer by a SIGSTOP would otherwise be taken
    /// for stuck on thaw, and the producer made again, registering the transactional id anew
    /// (module doc, `# Fences`).
    fn call(
        &self,
        step: &'static str,
        bound: Duration,
        call: impl Fn(&Client) -> Result<(), KafkaError> + Send + Sync + 'static,
    ) -> Result<(), TxnError> {
        if let Some(stuck) = self.stuck() {
            return Err(TxnError::with_class(
                step,
                TxnErrorClass::Abortable,
                TxnCause::Stuck(stuck),
            ));
        }
        let started = Instant::now();
        let deadline = started + bound;
        let call = Arc::new(call);
        let mut attempt = 0;
        loop {
            let c = Arc::clone(&call);
            let err = match self
                .calls
                .call(deadline, self.away.as_deref(), move |p| c(p))
            {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => TxnError::new(step, e),
                Err(NoAnswer::Deadline) => return Err(self.mark_stuck(step, started.elapsed())),
                Err(NoAnswer::Gone) => {
                    return Err(TxnError::with_class(
                        step,
                        TxnErrorClass::Fatal,
                        TxnCause::CallThreadGone,
                    ))
                }
            };
            match after_failure(
                err.class,
                attempt,
                deadline.saturating_duration_since(Instant::now()),
            ) {
                AfterFailure::Retry(backoff) => {
                    attempt += 1;
                    warn!(step, attempt, error = %err.cause, "retriable transactional error; retrying");
                    std::thread::sleep(backoff);
                }
                AfterFailure::GiveUp => {
                    return Err(self.give_up(step, started.elapsed(), &err.cause.to_string()))
                }
                AfterFailure::Return => return Err(err),
            }
        }
    }

    /// A call whose error was still retriable (`last_error`) when its retries ran out, in count
    /// or in time: it did not get done within its deadline, as one that did not return, and is
    /// taken as stuck ([`Generation::mark_stuck`]). Fatal, it ended the process where a new
    /// producer mends it (module doc, `# Retries`).
    fn give_up(&self, step: &'static str, elapsed: Duration, last_error: &str) -> TxnError {
        self.stuck_with(step, elapsed, Some(last_error.to_owned()))
    }

    fn mark_stuck(&self, step: &'static str, elapsed: Duration) -> TxnError {
        self.stuck_with(step, elapsed, None)
    }

    fn stuck_with(
        &self,
        step: &'static str,
        elapsed: Duration,
        last_error: Option<String>,
    ) -> TxnError {
        let stuck = StuckCall {
            call: step,
            elapsed,
            coordinator: self.producer.context().coordinator(),
            last_error,
        };
        warn!(
            call = step,
            coordinator = stuck.coordinator.as_deref().unwrap_or("unknown"),
            elapsed_s = format!("{:.1}", elapsed.as_secs_f64()),
            last_error = stuck.last_error.as_deref().unwrap_or("(no answer)"),
            "transactional call not done by its deadline; the producer will be made again"
        );
        crate::metrics::transactional_call_stuck(step);
        if let Ok(mut s) = self.stuck.lock() {
            *s = Some(stuck.clone());
        }
        TxnError::with_class(step, TxnErrorClass::Abortable, TxnCause::Stuck(stuck))
    }
}

/// When a transaction began, and the process's time away at that moment.
#[derive(Debug, Clone, Copy)]
struct Began {
    at: Instant,
    away: Duration,
}

/// A producer whose transactional calls retry, classify and end by a deadline in one place.
pub struct TxnProducer {
    /// The registered librdkafka producer; replaced when it must be made again (a stuck call,
    /// [`TxnProducer::restart`]), hence the lock (never contended: one thread drives it).
    current: RwLock<Arc<Generation>>,
    /// What it was made from, to make it again.
    config: rdkafka::ClientConfig,
    /// Its `transaction.timeout.ms`, which every call's deadline derives from ([`call_deadline`],
    /// [`send_offsets_deadline`]).
    txn_timeout: Duration,
    /// Producers made again because one was fenced, since the last commit.
    fences_in_a_row: AtomicU32,
    /// When the open transaction began (the last `begin`), and the process's time away then.
    began: Mutex<Option<Began>>,
    /// The next abort fails fatally without asking the broker ([`TxnProducer::fail_next_abort`]).
    fail_next_abort: AtomicBool,
}

impl TxnProducer {
    /// Creates the producer and registers its transactional.id (fencing any predecessor and
    /// aborting what it left open).
    pub fn new(config: &rdkafka::ClientConfig) -> Result<Arc<Self>, TxnError> {
        let txn_timeout = config
            .get("transaction.timeout.ms")
            .and_then(|ms| ms.parse().ok())
            .map_or(DRAIN_TIMEOUT, Duration::from_millis);
        let p = TxnProducer {
            current: RwLock::new(Arc::new(Self::registered(config)?)),
            config: config.clone(),
            txn_timeout,
            fences_in_a_row: AtomicU32::new(0),
            began: Mutex::new(None),
            fail_next_abort: AtomicBool::new(false),
        };
        Ok(Arc::new(p))
    }

    fn registered(config: &rdkafka::ClientConfig) -> Result<Generation, TxnError> {
        let inner: Client = config
            .create_with_context(DeliveryContext::default())
            .map_err(|e| TxnError::with_class("create producer", TxnErrorClass::Fatal, e))?;
        let generation = Generation::new(inner)?;
        generation
            .call("init_transactions", INIT_TIMEOUT, |p| {
                p.init_transactions(INIT_TIMEOUT)
            })
            .map_err(|e| TxnError {
                // Nothing to abort here: a registration that fails or sticks is the end.
                class: TxnErrorClass::Fatal,
                ..e
            })?;
        Ok(generation)
    }

    /// Replaces the librdkafka producer by a new one with the same transactional id, registered
    /// again: what a restart of the process would do, without losing the consumer's place in the
    /// group. `init_transactions` aborts whatever this id left open (or completes a commit that
    /// reached the coordinator) and bumps its epoch, which fences the old producer, so it is as
    /// safe for exactly-once as a crash and restart; the caller rewinds input and state as after
    /// any abort. Used after a stuck call, and where librdkafka made an error fatal that leaves
    /// nothing open on the broker (see `Committer::abort_open`).
    pub fn restart(&self) -> Result<(), TxnError> {
        let fresh = Arc::new(Self::registered(&self.config)?);
        let old = std::mem::replace(
            &mut *self.current.write().unwrap_or_else(PoisonError::into_inner),
            fresh,
        );
        // Destroying a librdkafka producer waits for its threads: never on the caller's thread
        // (a stuck call's thread holds it anyway, and destroys it when, if ever, the call returns).
        let _ = std::thread::Builder::new()
            .name("txn-drop".into())
            .spawn(move || drop(old));
        Ok(())
    }

    /// When the open (or last) transaction began.
    pub fn began(&self) -> Option<Instant> {
        self.began.lock().ok().and_then(|b| *b).map(|b| b.at)
    }

    /// Whether a call of the current producer passed its deadline: it is made again at the next
    /// [`TxnProducer::abort`].
    pub fn is_stuck(&self) -> bool {
        self.generation().stuck().is_some()
    }

    fn generation(&self) -> Arc<Generation> {
        // The guarded value is a handle, never left half-updated: a poisoned lock is fine.
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn producer(&self) -> Arc<Client> {
        Arc::clone(&self.generation().producer)
    }

    /// The topics whose records `generation` saw refused for lack of Write
    /// (TOPIC_AUTHORIZATION_FAILED, in a delivery report or at once from `send`) since the last
    /// call.
    fn take_refused(generation: &Generation) -> BTreeSet<String> {
        let refused = generation
            .producer
            .context()
            .refused
            .lock()
            .map(|mut r| std::mem::take(&mut *r));
        refused.unwrap_or_default()
    }

    /// Logs, in one WARN line, the delivery failures since the last report (other than refused
    /// Writes, which the refusal report names): the number per topic and partition and the first
    /// error. Every abort reports through here; nothing is logged when nothing failed.
    pub fn report_failures(&self) {
        let producer = self.producer();
        let Ok(mut failed) = producer.context().failed.lock() else {
            return;
        };
        let Failed {
            per_partition,
            first,
        } = std::mem::take(&mut *failed);
        if per_partition.is_empty() {
            return;
        }
        let total: u64 = per_partition.values().sum();
        let counts: Vec<String> = per_partition
            .iter()
            .map(|((t, p), n)| format!("{t}/{p}: {n}"))
            .collect();
        warn!(
            records = total,
            per_partition = %counts.join(", "),
            first_error = first.as_deref().unwrap_or(""),
            "records of the transaction were not delivered"
        );
    }

    /// Of `topics`, those this producer's principal may not even Describe, hence not Write
    /// ([`access::refused`]; a metadata round trip each, bounded by `timeout`). Errors other than
    /// a refusal count as not refused: this only names a refusal, it does not detect outages.
    pub fn refused_writes(&self, topics: &[String], timeout: Duration) -> BTreeSet<String> {
        let producer = self.producer();
        topics
            .iter()
            .filter(|t| access::refused(producer.client(), t, timeout).unwrap_or(false))
            .cloned()
            .collect()
    }

    /// The transactional producer of `transactional_id`, registered ([`TxnProducer::new`]). A
    /// registration refused for lack of a right is returned as the [`AccessError`] naming it
    /// ("Write on TransactionalId <id>").
    pub fn start(
        kafka: &KafkaConfig,
        transactional_id: &str,
        txn_timeout: Duration,
    ) -> anyhow::Result<Arc<Self>> {
        let cfg = kafka.transactional_producer(transactional_id, txn_timeout)?;
        Self::new(&cfg).map_err(
            |e| match authorization_failure(kafka, &e, transactional_id) {
                Some(denied) => denied.into(),
                None => anyhow::Error::new(e).context(format!(
                    "registering the transactional id {transactional_id}"
                )),
            },
        )
    }

    /// A producer without transactions (at-least-once mode): same send path, no init.
    pub fn non_transactional(config: &rdkafka::ClientConfig) -> Result<Arc<Self>, KafkaError> {
        let inner: Client = config.create_with_context(DeliveryContext::default())?;
        let generation =
            Generation::new(inner).map_err(|e| KafkaError::ClientCreation(e.to_string()))?;
        Ok(Arc::new(TxnProducer {
            current: RwLock::new(Arc::new(generation)),
            config: config.clone(),
            txn_timeout: DRAIN_TIMEOUT,
            fences_in_a_row: AtomicU32::new(0),
            began: Mutex::new(None),
            fail_next_abort: AtomicBool::new(false),
        }))
    }

    /// Begins a transaction: a local state change in librdkafka, made here, not on the call
    /// thread. Refused at once while the producer is stuck.
    pub fn begin(&self) -> Result<(), TxnError> {
        let generation = self.generation();
        if let Some(stuck) = generation.stuck() {
            return Err(TxnError::with_class(
                "begin_transaction",
                TxnErrorClass::Abortable,
                TxnCause::Stuck(stuck),
            ));
        }
        if let Ok(mut began) = self.began.lock() {
            let at = Instant::now();
            *began = Some(Began {
                at,
                away: generation.away(at),
            });
        }
        generation
            .producer
            .begin_transaction()
            .map_err(|e| TxnError::new("begin_transaction", e))
    }

    /// Adds the consumed offsets (next offset to read, per partition) to the transaction, with the
    /// group metadata that lets the coordinator fence a zombie of an older generation.
    pub fn send_offsets(
        &self,
        offsets: &TopicPartitionList,
        group: ConsumerGroupMetadata,
    ) -> Result<(), TxnError> {
        let offsets = offsets.clone();
        let generation = self.generation();
        let sent = generation.call(
            "send_offsets_to_transaction",
            send_offsets_deadline(self.txn_timeout),
            move |p| p.send_offsets_to_transaction(&offsets, &group, Timeout::Never),
        );
        self.fenced(&generation, sent)
    }

    /// Commits the transaction (flushing what is still queued).
    pub fn commit(&self) -> Result<(), TxnError> {
        // Drain first: rust-rdkafka's own flush inside commit_transaction waits in 100 ms poll
        // steps that the polling thread answers instead, so every commit with records in flight
        // would take at least 100 ms. After a drain its flush returns at once. A drain that does
        // not finish changes nothing: commit_transaction flushes (and fails) on its own.
        let generation = self.generation();
        if generation.stuck().is_none() {
            let _ = self.flush(DRAIN_TIMEOUT);
        }
        let committed =
            generation.call("commit_transaction", call_deadline(self.txn_timeout), |p| {
                p.commit_transaction(Timeout::Never)
            });
        if committed.is_ok() {
            self.fences_in_a_row.store(0, Ordering::Relaxed);
        }
        self.fenced(&generation, committed)
    }

    /// A call refused because this producer is fenced is abortable once since the last commit,
    /// when the fence is its coordinator's timeout ([`Fence::TimedOut`]): the producer is made
    /// again at the abort. librdkafka says "fenced" (or "old epoch") also when the coordinator
    /// aborted a transaction of ours that outlived its timeout, e.g. while the group coordinator's
    /// broker was frozen or gone (tests/coordinator.rs): the instance still owns its partitions,
    /// and a restart would register the same transactional id anyway. A fence of a younger
    /// transaction, or a second one before a commit, means another live producer holds the id (a
    /// second dlq-replay of the same DLQ, a replacement of this instance): that stays fatal, so
    /// two holders of one id do not take it from each other. So does a fence that came after
    /// this process was away past the timeout (a thawed zombie): its replacement may hold the id
    /// (module doc, `# Fences`).
    fn fenced(
        &self,
        generation: &Generation,
        result: Result<(), TxnError>,
    ) -> Result<(), TxnError> {
        match result {
            Err(e) if e.is_producer_fenced() && e.class == TxnErrorClass::Fatal => {
                match self.fence(generation, Instant::now()) {
                    Fence::TimedOut
                        if self.fences_in_a_row.fetch_add(1, Ordering::Relaxed) == 0 =>
                    {
                        warn!(call = e.step, error = %e.cause, "transactional producer fenced; registering the transactional id again, once (a coordinator fences a transaction that outlived its timeout)");
                        generation.fenced.store(true, Ordering::Relaxed);
                        Err(TxnError {
                            class: TxnErrorClass::Abortable,
                            ..e
                        })
                    }
                    Fence::WhileAway(away) => {
                        error!(call = e.step, error = %e.cause, away_s = format!("{:.1}", away.as_secs_f64()), transaction_timeout_s = self.txn_timeout.as_secs_f64(), "transactional producer fenced after this process was away past its transaction timeout: a replacement may hold the transactional id, which is not taken back");
                        Err(e)
                    }
                    _ => Err(e),
                }
            }
            other => other,
        }
    }

    /// What a fence seen at `now` is: the open transaction's age and the time the process was
    /// away since it began, judged by [`Fence::of`].
    fn fence(&self, generation: &Generation, now: Instant) -> Fence {
        let began = self.began.lock().ok().and_then(|b| *b);
        let age = began.map(|b| now.saturating_duration_since(b.at));
        let away = match (&generation.away, began) {
            (Some(clock), Some(b)) => clock.away(now).saturating_sub(b.away),
            // Without the clock nothing shows the process was there: away all along.
            (None, _) => age.unwrap_or_default(),
            (Some(_), None) => Duration::ZERO,
        };
        Fence::of(age, away, self.txn_timeout)
    }

    /// Aborts the transaction, once what is in flight has been answered. With records still in
    /// flight, Kafka 4.4 answered librdkafka's EndTxn(abort) with INVALID_TXN_STATE, a fatal
    /// error, in the pipeline's forced-abort test (the open librdkafka issue #4849 reports the
    /// same); every caller aborts through here, so none can forget the flush. Delivery errors
    /// of that flush are expected and change nothing: the transaction is aborted anyway.
    ///
    /// An abort that does not complete is completed by making the producer again
    /// ([`TxnProducer::restart`]): its registration aborts what the old one left open. So is a
    /// producer with a stuck call, or one fenced once since the last commit. That includes an
    /// abort librdkafka failed fatally: EndTxn answered INVALID_TXN_STATE on the 3-broker cluster,
    /// after an AddOffsetsToTxn had timed out on a stalled coordinator, and alert-deliver used to
    /// exit there. Whatever is wrong with the old producer's state, a new registration starts from
    /// the broker's. Only a fence by another holder of the transactional id, or a missing right,
    /// is returned: registering again would take the id back, or be refused.
    pub fn abort(&self) -> Result<(), TxnError> {
        self.abort_or_restart().map(|_| ())
    }

    /// [`TxnProducer::abort`]; returns whether the abort itself failed (not stuck, not fenced
    /// after a timeout) and the producer was made again for it.
    fn abort_or_restart(&self) -> Result<bool, TxnError> {
        self.report_failures();
        let generation = self.generation();
        if generation.stuck().is_none() && !generation.fenced.load(Ordering::Relaxed) {
            if let Err(e) = self.flush(self.txn_timeout) {
                debug!(error = %e, "flush before abort did not complete");
            }
            let aborted = if self.fail_next_abort.swap(false, Ordering::Relaxed) {
                Err(TxnError::with_class(
                    "abort_transaction",
                    TxnErrorClass::Fatal,
                    TxnCause::Injected("test hook: the abort fails fatally"),
                ))
            } else {
                generation.call("abort_transaction", call_deadline(self.txn_timeout), |p| {
                    p.abort_transaction(Timeout::Never)
                })
            };
            match self.fenced(&generation, aborted) {
                Ok(()) => return Ok(false),
                // A fence after a timed-out transaction is abortable ([`TxnProducer::fenced`]).
                Err(e) if e.is_stuck() || e.class == TxnErrorClass::Abortable => {}
                Err(e) if e.is_fenced() || e.is_unauthorized() => return Err(e),
                Err(e) => {
                    warn!(error = %e, "the abort failed; making the transactional producer again, which aborts what is left open");
                    self.restart_after_abort()?;
                    return Ok(true);
                }
            }
        }
        self.restart_after_abort()?;
        Ok(false)
    }

    fn restart_after_abort(&self) -> Result<(), TxnError> {
        self.restart().inspect_err(|e| {
            error!(error = %e, "the transactional producer could not be made again after an abort that did not complete");
        })
    }

    /// TEST ONLY (the stages' hidden `--test-aborts-fail-fatally`): the next [`TxnProducer::abort`]
    /// fails fatally instead of sending EndTxn, as one answered INVALID_TXN_STATE does, leaving
    /// the transaction open on the broker.
    pub fn fail_next_abort(&self) {
        self.fail_next_abort.store(true, Ordering::Relaxed);
    }

    /// Aborts the open transaction, as [`TxnProducer::abort`], and returns the topics of
    /// `written` (those the transaction writes) whose records were refused for lack of Write in
    /// it: empty for any other abort. `cause` is the error the transaction failed with: a refused
    /// AddPartitionsToTxn fails it with TOPIC_AUTHORIZATION_FAILED, and purges its records
    /// without a delivery report that names the topic, so the broker is asked which it refuses.
    ///
    /// An abort that fails is completed by making the producer again ([`TxnProducer::abort`]);
    /// the broker is then asked too, `probe` bounding each question. A transaction whose only
    /// AddPartitionsToTxn was refused (TOPIC_AUTHORIZATION_FAILED) has nothing registered on the
    /// broker, yet librdkafka 2.12 still sends EndTxn (it counts the request, not what it added);
    /// the broker answers INVALID_TXN_STATE, librdkafka makes that fatal, and the records of such
    /// a transaction may have been purged without a report that names their topic.
    pub fn abort_naming_refused(
        &self,
        written: &[String],
        cause: Option<&TxnError>,
        probe: Duration,
    ) -> Result<BTreeSet<String>, TxnError> {
        // The refusals are the aborted producer's, even when the abort makes a new one.
        let generation = self.generation();
        let failed = self.abort_or_restart()?;
        let mut refused = Self::take_refused(&generation);
        let topic_refused = cause.is_some_and(|e| {
            matches!(&e.cause, TxnCause::Kafka(k)
                if k.rdkafka_error_code() == Some(RDKafkaErrorCode::TopicAuthorizationFailed))
        });
        if refused.is_empty() && (topic_refused || failed) {
            refused = self.refused_writes(written, probe);
        }
        Ok(refused)
    }

    /// Enqueues one record. A full local queue is waited out (the polling thread drains it);
    /// any other refusal is returned for the caller to classify.
    pub fn send(&self, mut record: BaseRecord<'_, [u8], [u8]>) -> Result<(), KafkaError> {
        let producer = self.producer();
        loop {
            match producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    debug!("producer queue full; waiting");
                    record = r;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, r)) => {
                    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::TopicAuthorizationFailed) {
                        producer.context().note_refused(r.topic);
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Waits until every enqueued record is acknowledged (or failed): see [`drain`].
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        drain(&self.producer(), timeout)
    }

    /// Delivery failures seen so far.
    pub fn delivery_failures(&self) -> u64 {
        self.producer().context().failures()
    }
}

/// Waits until every record enqueued on `producer` is acknowledged (or failed), for at most
/// `timeout`, asleep.
///
/// Why librdkafka's `rd_kafka_flush` itself rather than rust-rdkafka's `flush`: the latter polls
/// the delivery reports' queue in steps of up to 100 ms that end only at their deadline, while
/// the producer's own polling thread takes the reports, so every flush with records in flight
/// lasted at least 100 ms ([`TxnProducer::commit`]). In steps of 1 ms, it span: a step's poll is
/// asked for the milliseconds left, rounded down to 0, until the step's end (40 % of the
/// pipeline's CPU samples in `clock_gettime` during a backlog, a core that the broker lacked on a
/// 2-core machine). `rd_kafka_flush` with delivery reports as events (rust-rdkafka's mode) only
/// waits on librdkafka's count of messages in flight, woken as the polling thread releases them,
/// and counts as flushing meanwhile (`linger.ms` taken as 0). Called in steps of at most
/// [`DRAIN_STEP`], so the deadline is the process's.
pub fn drain(producer: &Client, timeout: Duration) -> Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let step = i32::try_from(left.min(DRAIN_STEP).as_millis()).unwrap_or(0);
        // SAFETY: the client handle is valid while `producer` is borrowed; rd_kafka_flush takes
        // no pointer from the caller and keeps none, and is safe to call from any thread.
        let err =
            unsafe { rdkafka::bindings::rd_kafka_flush(producer.client().native_ptr(), step) };
        match RDKafkaErrorCode::from(err) {
            RDKafkaErrorCode::NoError => return Ok(()),
            RDKafkaErrorCode::OperationTimedOut if Instant::now() < deadline => {}
            code => return Err(KafkaError::Flush(code)),
        }
    }
}

/// The longest single wait of [`drain`] inside librdkafka.
const DRAIN_STEP: Duration = Duration::from_millis(100);

/// The missing right behind a transactional error, if it is an authorisation failure:
/// `Write on TransactionalId <id>` for a refused `init_transactions`, and so on
/// ([`access::from_kafka_error`]).
fn authorization_failure(
    kafka: &KafkaConfig,
    err: &TxnError,
    transactional_id: &str,
) -> Option<AccessError> {
    let TxnCause::Kafka(e) = &err.cause else {
        return None;
    };
    access::from_kafka_error(kafka, e, transactional_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A producer that is never asked anything of the broker (its bootstrap answers nothing):
    /// the calls below are closures that stand for librdkafka's, so no broker is needed.
    fn generation() -> Generation {
        let producer: Client = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .create_with_context(DeliveryContext::default())
            .expect("a producer can be made without a broker");
        Generation::new(producer).expect("call thread")
    }

    /// CPU time of the calling thread so far, from `/proc/thread-self/stat` (utime + stime, in
    /// clock ticks of 10 ms).
    fn thread_cpu() -> Duration {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("thread stat");
        // The fields after the command name in parentheses: state is the 3rd field of the
        // line, utime the 14th, stime the 15th.
        let after = &stat[stat.rfind(')').expect("comm") + 2..];
        let fields: Vec<u64> = after
            .split_whitespace()
            .skip(11)
            .take(2)
            .map(|f| f.parse().expect("a tick count"))
            .collect();
        Duration::from_millis(10 * (fields[0] + fields[1]))
    }

    /// A commit drains the producer first, and the drain waits while the broker has not answered:
    /// it must wait asleep. Spinning, it took a whole core for as long as the commits' flushes
    /// lasted (most of a backlog's run: perf of pipeline-bench found 40 % of the pipeline's
    /// samples in `clock_gettime`), which on a 2-core machine is the broker's other core.
    #[test]
    fn a_drain_waits_asleep_for_the_broker() {
        let producer: Client = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .create_with_context(DeliveryContext::default())
            .expect("a producer can be made without a broker");
        producer
            .send(BaseRecord::<[u8], [u8]>::to("t").payload(b"never delivered".as_slice()))
            .map_err(|(e, _)| e)
            .expect("queued");
        let wait = Duration::from_millis(600);
        let (cpu, started) = (thread_cpu(), Instant::now());
        let drained = drain(&producer, wait);
        let (waited, spent) = (started.elapsed(), thread_cpu().saturating_sub(cpu));
        assert!(
            matches!(
                drained,
                Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut))
            ),
            "nothing can be delivered: {drained:?}"
        );
        assert!(waited >= wait, "waited {waited:?} of {wait:?}");
        assert!(
            spent < wait / 4,
            "the drain spent {spent:?} of CPU in a wait of {waited:?}"
        );
    }

    /// A retriable error repeats the call while the deadline leaves room; one that is still
    /// retriable when the room or the retries run out is a call that did not get done in time, as
    /// a call that did not return: abortable, and the producer made again, not the end of the
    /// process. Seen in tests/coordinator.rs (the group coordinator's broker SIGKILLed inside
    /// send_offsets_to_transaction): librdkafka answered "Failed to add offsets to transaction:
    /// Local: Timed out" 19,967 ms into a 20 s deadline, no retry fitted, and the instance exited
    /// instead of healing in place.
    #[test]
    fn a_retriable_error_without_time_or_retries_left_gives_up_as_stuck() {
        let ms = Duration::from_millis;
        assert_eq!(
            after_failure(TxnErrorClass::Retriable, 0, ms(10_000)),
            AfterFailure::Retry(ms(100))
        );
        assert_eq!(
            after_failure(TxnErrorClass::Retriable, 3, ms(10_000)),
            AfterFailure::Retry(ms(400))
        );
        assert_eq!(
            after_failure(TxnErrorClass::Retriable, 0, ms(33)),
            AfterFailure::GiveUp
        );
        assert_eq!(
            after_failure(TxnErrorClass::Retriable, MAX_RETRIES, ms(10_000)),
            AfterFailure::GiveUp
        );
        for class in [TxnErrorClass::Abortable, TxnErrorClass::Fatal] {
            assert_eq!(after_failure(class, 0, ms(10_000)), AfterFailure::Return);
        }
        // Given up, the producer is stuck: the call's error is abortable, and the abort makes the
        // producer again.
        let g = generation();
        let err = g.give_up(
            "send_offsets_to_transaction",
            ms(19_967),
            "Local: Timed out",
        );
        assert_eq!(err.class, TxnErrorClass::Abortable);
        assert!(err.is_stuck(), "{err}");
        assert!(g.stuck().is_some());
        assert!(
            err.to_string().contains("Local: Timed out"),
            "the last error is named: {err}"
        );
    }

    #[test]
    fn a_refused_add_partition_names_its_topic() {
        let line = "TxnCoordinator/1: Failed to add partition \"n.parking-lot\" [0] to transaction: Broker: Topic authorization failed";
        assert_eq!(
            refused_add_partition("ADDPARTS", line),
            Some("n.parking-lot")
        );
        assert_eq!(refused_add_partition("TXNERR", line), None);
        let other = "TxnCoordinator/1: Failed to add partition \"n\" [0] to transaction: Broker: Not coordinator";
        assert_eq!(refused_add_partition("ADDPARTS", other), None);
    }

    #[test]
    fn send_offsets_waits_half_the_transaction_timeout_but_long_enough_for_a_failover() {
        let s = Duration::from_secs;
        assert_eq!(send_offsets_deadline(s(60)), s(30));
        assert_eq!(send_offsets_deadline(s(120)), s(60));
        // A coordinator failover still fits: alert-chaos's 30 s, the default 10 s.
        assert_eq!(send_offsets_deadline(s(30)), COORDINATOR_FAILOVER);
        assert_eq!(send_offsets_deadline(s(10)), call_deadline(s(10)));
        // Never longer than any other call.
        for t in [1, 5, 10, 30, 60, 900] {
            assert!(send_offsets_deadline(s(t)) <= call_deadline(s(t)));
        }
    }

    #[test]
    fn a_call_past_its_deadline_is_abortable_and_marks_the_producer_stuck() {
        let g = generation();
        let started = Instant::now();
        let err = g
            .call(
                "send_offsets_to_transaction",
                Duration::from_millis(200),
                |_| {
                    // librdkafka #5456: the call does not come back (for the test: 30 s).
                    std::thread::sleep(Duration::from_secs(30));
                    Ok(())
                },
            )
            .expect_err("the call never answers in time");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_secs(5),
            "waited {waited:?}"
        );
        assert_eq!(err.class, TxnErrorClass::Abortable);
        assert!(err.is_stuck(), "{err}");
        assert!(
            !err.outcome_unknown(),
            "send_offsets stuck: nothing can have committed"
        );
        assert!(err
            .to_string()
            .contains("send_offsets_to_transaction did not return within"));
        // Every later call but the restart fails at once, without reaching librdkafka.
        let started = Instant::now();
        let later = g
            .call("commit_transaction", Duration::from_secs(60), |_| {
                panic!("a stuck producer is never called again")
            })
            .expect_err("stuck");
        assert!(later.is_stuck());
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_fence_of_a_timed_out_transaction_is_abortable_once_between_commits_then_fatal() {
        let config = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .clone();
        let p = TxnProducer::non_transactional(&config).expect("producer");
        let fenced = || {
            Err(TxnError::with_class(
                "commit_transaction",
                TxnErrorClass::Fatal,
                KafkaError::MessageProduction(RDKafkaErrorCode::Fenced),
            ))
        };
        let g = p.generation();
        // A young transaction fenced: another producer holds the id.
        began_ago(&p, Duration::ZERO);
        assert_eq!(
            p.fenced(&g, fenced()).expect_err("fenced").class,
            TxnErrorClass::Fatal
        );
        // One older than its timeout: the coordinator aborted it; made again once.
        began_ago(&p, call_deadline(p.txn_timeout));
        let first = p.fenced(&g, fenced()).expect_err("fenced");
        assert_eq!(
            first.class,
            TxnErrorClass::Abortable,
            "the first fence is mended"
        );
        assert!(
            g.fenced.load(Ordering::Relaxed),
            "the producer is made again at the abort"
        );
        let second = p.fenced(&g, fenced()).expect_err("fenced");
        assert_eq!(second.class, TxnErrorClass::Fatal, "another holds the id");
        // A commit in between starts the count again.
        p.fences_in_a_row.store(0, Ordering::Relaxed);
        assert_eq!(
            p.fenced(&g, fenced()).expect_err("fenced").class,
            TxnErrorClass::Abortable
        );
        // Other fatal errors are left as they are.
        let other = p
            .fenced(
                &g,
                Err(TxnError::with_class(
                    "commit_transaction",
                    TxnErrorClass::Fatal,
                    TxnCause::LockPoisoned,
                )),
            )
            .expect_err("fatal");
        assert_eq!(other.class, TxnErrorClass::Fatal);
    }

    /// Says that `p`'s transaction began `ago`, with the process's time away of that moment.
    fn began_ago(p: &TxnProducer, ago: Duration) {
        let at = Instant::now() - ago;
        let away = p.generation().away(at);
        *p.began.lock().unwrap() = Some(Began { at, away });
    }

    #[test]
    fn a_fence_is_told_by_the_transactions_age_and_the_time_away() {
        let s = Duration::from_secs;
        let timeout = s(6);
        // Younger than its timeout: no coordinator aborted it, a newer producer registered.
        assert_eq!(Fence::of(Some(s(2)), s(0), timeout), Fence::Newer);
        assert_eq!(Fence::of(Some(s(6)), s(0), timeout), Fence::Newer);
        assert_eq!(Fence::of(None, s(0), timeout), Fence::Newer);
        // Older, the process there all along (waiting on a frozen coordinator): its timeout.
        assert_eq!(Fence::of(Some(s(16)), s(0), timeout), Fence::TimedOut);
        assert_eq!(Fence::of(Some(s(16)), s(3), timeout), Fence::TimedOut);
        // Older because the process was stopped (issue 43: frozen 15 s, replaced meanwhile).
        assert_eq!(
            Fence::of(Some(s(16)), s(15), timeout),
            Fence::WhileAway(s(15))
        );
        assert_eq!(
            Fence::of(Some(s(16)), s(4), timeout),
            Fence::WhileAway(s(4))
        );
    }

    #[test]
    fn a_fence_after_the_process_was_away_past_the_timeout_is_fatal_and_not_counted() {
        let config = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .clone();
        let p = TxnProducer::non_transactional(&config).expect("producer");
        // A transaction begun 40 s ago (the timeout is 30 s), of which the process was stopped
        // 20 s, as the clock's thread saw it.
        let now = Instant::now();
        let at = now - Duration::from_secs(40);
        let clock = Arc::new(away::Clock::new(at));
        let ticking = |from: Instant, to: Instant| {
            let mut t = from;
            while t < to {
                t += away::TICK;
                clock.wake(t);
            }
        };
        ticking(at, at + Duration::from_secs(5));
        ticking(at + Duration::from_secs(25), now);
        let mut g = generation();
        g.away = Some(Arc::clone(&clock));
        let g = Arc::new(g);
        *p.current.write().unwrap() = Arc::clone(&g);
        *p.began.lock().unwrap() = Some(Began {
            at,
            away: Duration::ZERO,
        });
        assert_eq!(p.fence(&g, now), Fence::WhileAway(Duration::from_secs(20)));
        let err = p
            .fenced(
                &g,
                Err(TxnError::with_class(
                    "commit_transaction",
                    TxnErrorClass::Fatal,
                    KafkaError::MessageProduction(RDKafkaErrorCode::Fenced),
                )),
            )
            .expect_err("fenced");
        assert_eq!(
            err.class,
            TxnErrorClass::Fatal,
            "the replacement keeps the id"
        );
        assert!(err.is_fenced());
        assert!(!g.fenced.load(Ordering::Relaxed), "not made again");
        assert_eq!(p.fences_in_a_row.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_call_kept_from_its_answer_while_the_process_was_away_is_not_stuck() {
        let clock = Arc::new(away::Clock::new(Instant::now()));
        let mut g = generation();
        g.away = Some(Arc::clone(&clock));
        let answered = g.call(
            "commit_transaction",
            Duration::from_millis(200),
            move |_| {
                // The process is stopped 2 s right after the call went out (as the clock's thread
                // will see it on thaw), and the answer comes 500 ms after the call began.
                clock.wake(Instant::now() + Duration::from_secs(2));
                std::thread::sleep(Duration::from_millis(500));
                Ok(())
            },
        );
        assert!(answered.is_ok(), "{answered:?}");
        assert!(g.stuck().is_none());
    }

    #[test]
    fn a_stuck_commit_leaves_the_outcome_unknown() {
        let g = generation();
        let err = g
            .call("commit_transaction", Duration::from_millis(100), |_| {
                std::thread::sleep(Duration::from_secs(30));
                Ok(())
            })
            .expect_err("stuck");
        assert!(err.outcome_unknown());
    }

    #[test]
    fn answered_calls_return_their_result() {
        let g = generation();
        assert!(g
            .call("abort_transaction", Duration::from_secs(5), |_| Ok(()))
            .is_ok());
        let err = g
            .call("abort_transaction", Duration::from_secs(5), |_| {
                Err(KafkaError::MessageProduction(
                    RDKafkaErrorCode::UnknownPartition,
                ))
            })
            .expect_err("refused");
        assert!(!err.is_stuck());
        assert_eq!(err.class, TxnErrorClass::Abortable);
        assert!(g.stuck().is_none());
    }
}
