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
//! # Retries
//! A retriable error repeats the same call with the same arguments, with a short backoff, at most
//! [`MAX_RETRIES`] times; past that the error is returned, classified fatal.
//!
//! # Blocking
//! Every transactional call blocks until the coordinator answers. The pipeline runs its whole
//! consume-process-commit loop on a dedicated thread (never an async worker), so these calls are
//! plain blocking calls here. Commit and abort take no client-side timeout: they are bounded by
//! `transaction.timeout.ms`, and a client-side timeout would leave the outcome unknown.

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::util::Timeout;
use rdkafka::{ClientContext, Message, TopicPartitionList};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
pub fn classify(err: &KafkaError) -> TxnErrorClass {
    match err {
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
/// the at-least-once mode reads them to decide whether offsets may be committed.
#[derive(Default)]
pub struct DeliveryContext {
    failures: AtomicU64,
    last_error: Mutex<Option<String>>,
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
            warn!(topic = m.topic(), partition = m.partition(), error = %e, "delivery failed");
            if let Ok(mut last) = self.last_error.lock() {
                *last = Some(e.to_string());
            }
        }
    }
}

impl DeliveryContext {
    /// Delivery failures so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

/// A producer whose transactional calls retry and classify in one place.
pub struct TxnProducer {
    inner: ThreadedProducer<DeliveryContext>,
}

impl TxnProducer {
    /// Creates the producer and registers its transactional.id (fencing any predecessor and
    /// aborting what it left open).
    pub fn new(config: &rdkafka::ClientConfig) -> Result<Arc<Self>, TxnError> {
        let inner: ThreadedProducer<DeliveryContext> = config
            .create_with_context(DeliveryContext::default())
            .map_err(|e| TxnError::with_class("create producer", TxnErrorClass::Fatal, e))?;
        let p = TxnProducer { inner };
        p.retrying("init_transactions", |p| p.init_transactions(INIT_TIMEOUT))?;
        Ok(Arc::new(p))
    }

    /// A producer without transactions (at-least-once mode): same send path, no init.
    pub fn non_transactional(config: &rdkafka::ClientConfig) -> Result<Arc<Self>, KafkaError> {
        let inner: ThreadedProducer<DeliveryContext> =
            config.create_with_context(DeliveryContext::default())?;
        Ok(Arc::new(TxnProducer { inner }))
    }

    fn retrying(
        &self,
        step: &'static str,
        mut call: impl FnMut(&ThreadedProducer<DeliveryContext>) -> Result<(), KafkaError>,
    ) -> Result<(), TxnError> {
        let mut attempt = 0;
        loop {
            match call(&self.inner) {
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

    pub fn abort(&self) -> Result<(), TxnError> {
        self.retrying("abort_transaction", |p| p.abort_transaction(Timeout::Never))
    }

    /// Enqueues one record. A full local queue is waited out (the polling thread drains it);
    /// any other refusal is returned for the caller to classify.
    pub fn send(&self, mut record: BaseRecord<'_, [u8], [u8]>) -> Result<(), KafkaError> {
        loop {
            match self.inner.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    debug!("producer queue full; waiting");
                    record = r;
                    self.inner.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Waits until every enqueued record is acknowledged (or failed), in 1 ms steps: see
    /// [`TxnProducer::commit`] for why not in one call.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.inner.flush(Duration::from_millis(1)) {
                Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut))
                    if Instant::now() < deadline => {}
                other => return other,
            }
        }
    }

    /// Delivery failures seen so far.
    pub fn delivery_failures(&self) -> u64 {
        self.inner.context().failures()
    }
}
