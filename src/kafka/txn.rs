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
//! # Retries
//! A retriable error repeats the same call with the same arguments, with a short backoff, at most
//! [`MAX_RETRIES`] times; past that the error is returned, classified fatal.
//!
//! # Blocking
//! Every transactional call blocks until the coordinator answers. The pipeline runs its whole
//! consume-process-commit loop on a dedicated thread (never an async worker), so these calls are
//! plain blocking calls here. Commit and abort take no client-side timeout: they are bounded by
//! `transaction.timeout.ms`, and a client-side timeout would leave the outcome unknown.

use crate::kafka::access::{self, AccessError};
use crate::kafka::KafkaConfig;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::util::Timeout;
use rdkafka::{ClientContext, Message, TopicPartitionList};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// How often a retriable transactional call is repeated before giving up.
pub const MAX_RETRIES: u32 = 10;

/// Bound on waiting for in-flight records before a commit.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Bound on `init_transactions`: at start the coordinator may be loading, but an instance that
/// cannot register at all should say so rather than hang.
const INIT_TIMEOUT: Duration = Duration::from_secs(60);

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
        _ if matches!(
            err.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                    | RDKafkaErrorCode::ClusterAuthorizationFailed
            )
        ) =>
        {
            TxnErrorClass::Fatal
        }
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

    /// Whether a newer instance with the same transactional id (or group instance id) took over:
    /// this one must stop, and a restart would only fence the newer one in turn.
    pub fn is_fenced(&self) -> bool {
        let TxnCause::Kafka(e) = &self.cause else {
            return false;
        };
        matches!(
            e.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::Fenced
                    | RDKafkaErrorCode::ProducerFenced
                    | RDKafkaErrorCode::InvalidProducerEpoch
                    | RDKafkaErrorCode::FencedInstanceId
            )
        )
    }
}

/// Counts delivery failures, which in a transaction show up again as an abortable commit error;
/// the at-least-once mode reads them to decide whether offsets may be committed. Notes the topics
/// a record was refused for (TOPIC_AUTHORIZATION_FAILED), so the abort that follows can name the
/// missing right without asking the broker.
#[derive(Default)]
pub struct DeliveryContext {
    failures: AtomicU64,
    last_error: Mutex<Option<String>>,
    refused: Mutex<BTreeSet<String>>,
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        crate::kafka::logging::log(level, fac, log_message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        crate::kafka::logging::error(&error, reason);
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
            if e.rdkafka_error_code() == Some(RDKafkaErrorCode::TopicAuthorizationFailed) {
                // Every record of the batch fails alike: the abort that follows names the refused
                // right once (`Committer::report_refused`), instead of a line per record.
                debug!(topic = m.topic(), error = %e, "delivery refused");
                self.note_refused(m.topic());
            } else {
                warn!(topic = m.topic(), partition = m.partition(), error = %e, "delivery failed");
            }
            if let Ok(mut last) = self.last_error.lock() {
                *last = Some(e.to_string());
            }
        }
    }
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
}

/// A producer whose transactional calls retry and classify in one place.
pub struct TxnProducer {
    /// The librdkafka producer; replaced by [`TxnProducer::restart`], hence the lock (never
    /// contended: one thread drives the producer).
    inner: RwLock<ThreadedProducer<DeliveryContext>>,
    /// What it was made from, to make it again.
    config: rdkafka::ClientConfig,
}

impl TxnProducer {
    /// Creates the producer and registers its transactional.id (fencing any predecessor and
    /// aborting what it left open).
    pub fn new(config: &rdkafka::ClientConfig) -> Result<Arc<Self>, TxnError> {
        let p = TxnProducer {
            inner: RwLock::new(Self::registered(config)?),
            config: config.clone(),
        };
        Ok(Arc::new(p))
    }

    fn registered(
        config: &rdkafka::ClientConfig,
    ) -> Result<ThreadedProducer<DeliveryContext>, TxnError> {
        let inner: ThreadedProducer<DeliveryContext> = config
            .create_with_context(DeliveryContext::default())
            .map_err(|e| TxnError::with_class("create producer", TxnErrorClass::Fatal, e))?;
        retrying(&inner, "init_transactions", |p| {
            p.init_transactions(INIT_TIMEOUT)
        })?;
        Ok(inner)
    }

    /// Replaces the librdkafka producer by a new one with the same transactional id, registered
    /// again: what a restart of the process would do, without losing the consumer's place in the
    /// group. `init_transactions` aborts whatever this id left open and bumps its epoch, so it is
    /// as safe for exactly-once as a crash and restart; the caller rewinds input and state as
    /// after any abort. Used only where librdkafka made an error fatal that leaves nothing open
    /// on the broker (see `Committer::abort_open`).
    pub fn restart(&self) -> Result<(), TxnError> {
        let fresh = Self::registered(&self.config)?;
        *self.inner.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }

    fn producer(&self) -> RwLockReadGuard<'_, ThreadedProducer<DeliveryContext>> {
        // The guarded value is a client handle, never left half-updated: a poisoned lock is fine.
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The topics whose records were refused for lack of Write (TOPIC_AUTHORIZATION_FAILED, in a
    /// delivery report or at once from `send`) since the last call.
    pub fn take_refused(&self) -> BTreeSet<String> {
        let producer = self.producer();
        let refused = producer
            .context()
            .refused
            .lock()
            .map(|mut r| std::mem::take(&mut *r));
        refused.unwrap_or_default()
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
        let inner: ThreadedProducer<DeliveryContext> =
            config.create_with_context(DeliveryContext::default())?;
        Ok(Arc::new(TxnProducer {
            inner: RwLock::new(inner),
            config: config.clone(),
        }))
    }

    fn retrying(
        &self,
        step: &'static str,
        call: impl FnMut(&ThreadedProducer<DeliveryContext>) -> Result<(), KafkaError>,
    ) -> Result<(), TxnError> {
        retrying(&self.producer(), step, call)
    }

    pub fn begin(&self) -> Result<(), TxnError> {
        self.retrying("begin_transaction", |p| p.begin_transaction())
    }

    /// Adds the consumed offsets (next offset to read, per partition) to the transaction, with the
    /// group metadata that lets the coordinator fence a zombie of an older generation.
    pub fn send_offsets(
        &self,
        offsets: &TopicPartitionList,
        group: &ConsumerGroupMetadata,
    ) -> Result<(), TxnError> {
        self.retrying("send_offsets_to_transaction", |p| {
            p.send_offsets_to_transaction(offsets, group, Timeout::Never)
        })
    }

    /// Commits the transaction (flushing what is still queued).
    pub fn commit(&self) -> Result<(), TxnError> {
        // Drain first: rust-rdkafka's own flush inside commit_transaction waits in 100 ms poll
        // steps that the polling thread answers instead, so every commit with records in flight
        // would take at least 100 ms. After a drain its flush returns at once. A drain that does
        // not finish changes nothing: commit_transaction flushes (and fails) on its own.
        let _ = self.flush(DRAIN_TIMEOUT);
        self.retrying("commit_transaction", |p| {
            p.commit_transaction(Timeout::Never)
        })
    }

    /// Aborts the transaction, once what is in flight has been answered. With records still in
    /// flight, Kafka 4.4 answered librdkafka's EndTxn(abort) with INVALID_TXN_STATE, a fatal
    /// error, in the pipeline's forced-abort test (the open librdkafka issue #4849 reports the
    /// same); every caller aborts through here, so none can forget the flush. Delivery errors
    /// of that flush are expected and change nothing: the transaction is aborted anyway.
    pub fn abort(&self) -> Result<(), TxnError> {
        if let Err(e) = self.flush(self.abort_drain_timeout()) {
            debug!(error = %e, "flush before abort did not complete");
        }
        self.retrying("abort_transaction", |p| p.abort_transaction(Timeout::Never))
    }

    /// How long [`TxnProducer::abort`] waits for what is in flight: the transaction timeout,
    /// past which the coordinator aborts the transaction itself ([`DRAIN_TIMEOUT`] if unset).
    fn abort_drain_timeout(&self) -> Duration {
        self.config
            .get("transaction.timeout.ms")
            .and_then(|ms| ms.parse().ok())
            .map_or(DRAIN_TIMEOUT, Duration::from_millis)
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

    /// Waits until every enqueued record is acknowledged (or failed), in 1 ms steps: see
    /// [`TxnProducer::commit`] for why not in one call.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        let deadline = Instant::now() + timeout;
        let producer = self.producer();
        loop {
            match producer.flush(Duration::from_millis(1)) {
                Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut))
                    if Instant::now() < deadline => {}
                other => return other,
            }
        }
    }

    /// Delivery failures seen so far.
    pub fn delivery_failures(&self) -> u64 {
        self.producer().context().failures()
    }
}

/// Calls `call` until it succeeds or fails for good: a retriable error repeats it with a short
/// backoff, at most [`MAX_RETRIES`] times (then it is fatal); any other error is returned with its
/// class.
fn retrying(
    producer: &ThreadedProducer<DeliveryContext>,
    step: &'static str,
    mut call: impl FnMut(&ThreadedProducer<DeliveryContext>) -> Result<(), KafkaError>,
) -> Result<(), TxnError> {
    let mut attempt = 0;
    loop {
        match call(producer) {
            Ok(()) => return Ok(()),
            Err(e) => {
                let err = TxnError::new(step, e);
                if err.class == TxnErrorClass::Retriable && attempt < MAX_RETRIES {
                    attempt += 1;
                    warn!(step, attempt, error = %err.cause, "retriable transactional error; retrying");
                    std::thread::sleep(Duration::from_millis(100 * u64::from(attempt)));
                    continue;
                }
                if err.class == TxnErrorClass::Retriable {
                    return Err(TxnError {
                        class: TxnErrorClass::Fatal,
                        ..err
                    });
                }
                return Err(err);
            }
        }
    }
}

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
