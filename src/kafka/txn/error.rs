//! What a transactional error means: the one [`classify`], the causes, and who fenced a producer.
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
//! is mended in place: see [`super::TxnProducer::restart`].
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
//! What this process can tell is whether it was there ([`crate::kafka::away`]): [`Fence::of`] calls a
//! fence the coordinator's timeout only if the transaction outlived its timeout while the process
//! was away for at most half of it; it was then waiting on the broker, and no replacement was
//! started for an instance that never stopped answering. That fence is mended once between
//! commits, by making the producer again at the abort. A fence of a younger transaction, a second
//! one before a commit, and one that came after the process was away longer (stopped, paused: a
//! thawed zombie whose replacement may hold the id) are fatal: the process exits non-zero, and
//! the newer instance keeps the id. For the same reason a call's deadline does not count the
//! time the process was away ([`Generation::call`]): a call that a SIGSTOP kept from its answer
//! is not stuck, and making the producer again for it would register the id anew too.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::time::Duration;

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
    /// The call did not return within its deadline ([`super::call`], `# Deadlines`).
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
