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
//!
//! The producer is in this file; its parts, each with its reasons:
//! - [`error`]: what an error means ([`classify`]: retriable, abortable, fatal) and who fenced a
//!   producer ([`Fence`]).
//! - [`call`]: one registration of the transactional id (its librdkafka producer and call thread), the bounded
//!   retries of each call and the deadline the process enforces on it ([`call_deadline`]).
//! - [`delivery`]: the delivery reports' context and the drain before a commit ([`drain`]).
//!
//! One librdkafka fatal error is mended in place: see [`TxnProducer::restart`]. A fence is mended
//! once between commits when this process can tell it was its coordinator's timeout
//! ([`Fence::of`]); otherwise it is fatal, and the newer instance keeps the id.

pub mod call;
pub mod delivery;
pub mod error;

use call::Generation;
pub use call::{
    call_deadline, send_offsets_deadline, stuck_bound, CALL_MARGIN, COORDINATOR_FAILOVER,
    EXIT_STUCK, INIT_TIMEOUT, MAX_RETRIES,
};
pub use delivery::{drain, DeliveryContext, DRAIN_TIMEOUT};
use delivery::{Client, Failed};
pub use error::{classify, Fence, StuckCall, TxnCause, TxnError, TxnErrorClass};

use crate::kafka::access::{self, AccessError};
use crate::kafka::KafkaConfig;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::util::Timeout;
use rdkafka::TopicPartitionList;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tracing::{debug, error, warn};

/// When a transaction began, and the process's time away at that moment.
#[derive(Debug, Clone, Copy)]
struct Began {
    at: Instant,
    away: Duration,
    /// Records its producer had acknowledged then ([`TxnProducer::partition_registered`]).
    delivered: u64,
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
                delivered: generation.producer.context().delivered(),
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

    /// Whether a partition of the open transaction is surely registered with its coordinator: a
    /// record of it was acknowledged, which librdkafka sends only once its AddPartitionsToTxn
    /// was answered. Until then an abort after a failed AddOffsetsToTxn may skip EndTxn and
    /// leave the transaction open on the coordinator (librdkafka 2.12; see the pipeline's
    /// `commit` module doc, `# The drain before the offsets`): a caller drains first.
    pub fn partition_registered(&self) -> bool {
        let began = self.began.lock().ok().and_then(|b| *b);
        began.is_some_and(|b| self.producer().context().delivered() > b.delivered)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::away;

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
        *p.began.lock().unwrap() = Some(Began {
            at,
            away,
            delivered: 0,
        });
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
        let mut g = call::unregistered_generation();
        g.away = Some(Arc::clone(&clock));
        let g = Arc::new(g);
        *p.current.write().unwrap() = Arc::clone(&g);
        *p.began.lock().unwrap() = Some(Began {
            at,
            away: Duration::ZERO,
            delivered: 0,
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
}
