//! One registration of a transactional id ([`Generation`]): its librdkafka producer, the thread
//! that makes its calls, and the rule every call follows: bounded retries, then a deadline the
//! process enforces itself.
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
//!                     with [`EXIT_STUCK`] (a supervisor restarts it; bound: docs/pipeline.md)
//! ```
//!
//! The stuck call's thread keeps the old producer alive until the call returns, if ever; it holds
//! nothing else. Commit and abort pass no client-side timeout to librdkafka (an expired one would
//! leave the transaction in a state only an abort may follow): the deadline is ours, and it ends
//! the producer rather than the call.

use super::delivery::Client;
use super::error::{StuckCall, TxnCause, TxnError, TxnErrorClass};
use crate::kafka::away;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// How often a retriable transactional call is repeated before giving up.
pub const MAX_RETRIES: u32 = 10;

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
    /// whatever time `away` says the process was away meanwhile ([`super::error`], `# Fences`).
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
pub(super) struct Generation {
    pub(super) producer: Arc<Client>,
    calls: Calls,
    pub(super) stuck: Mutex<Option<StuckCall>>,
    /// A call of it was refused as fenced, and it is to be made again ([`super::TxnProducer::fenced`]).
    pub(super) fenced: AtomicBool,
    /// The process's time away, which a call's deadline does not count ([`Generation::call`]).
    pub(super) away: Option<Arc<away::Clock>>,
}

impl Generation {
    pub(super) fn new(producer: Client) -> Result<Self, TxnError> {
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
    pub(super) fn away(&self, now: Instant) -> Duration {
        self.away.as_ref().map_or(Duration::ZERO, |c| c.away(now))
    }

    pub(super) fn stuck(&self) -> Option<StuckCall> {
        self.stuck.lock().ok().and_then(|s| s.clone())
    }

    /// Calls `call` on the call thread until it succeeds or fails for good, within `bound` for all
    /// attempts: a retriable error repeats it with a short backoff, at most [`MAX_RETRIES`] times
    /// (then it is fatal); any other error is returned with its class. A call that does not
    /// return in time marks this producer stuck (module doc, `# Deadlines`). Time the process
    /// was away (stopped, paused) does not count against `bound`: it is the broker's slowness that
    /// the deadline bounds, and a call kept from its answer by a SIGSTOP would otherwise be taken
    /// for stuck on thaw, and the producer made again, registering the transactional id anew
    /// ([`super::error`], `# Fences`).
    pub(super) fn call(
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
    pub(super) fn give_up(
        &self,
        step: &'static str,
        elapsed: Duration,
        last_error: &str,
    ) -> TxnError {
        self.stuck_with(step, elapsed, Some(last_error.to_owned()))
    }

    pub(super) fn mark_stuck(&self, step: &'static str, elapsed: Duration) -> TxnError {
        self.stuck_with(step, elapsed, None)
    }

    pub(super) fn stuck_with(
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

/// A producer that is never asked anything of the broker (its bootstrap answers nothing): the
/// tests' calls are closures that stand for librdkafka's, so no broker is needed.
#[cfg(test)]
pub(super) fn unregistered_generation() -> Generation {
    let producer: Client = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", "127.0.0.1:1")
        .create_with_context(super::delivery::DeliveryContext::default())
        .expect("a producer can be made without a broker");
    Generation::new(producer).expect("call thread")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::RDKafkaErrorCode;

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
        let g = unregistered_generation();
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
        let g = unregistered_generation();
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
    fn a_call_kept_from_its_answer_while_the_process_was_away_is_not_stuck() {
        let clock = Arc::new(away::Clock::new(Instant::now()));
        let mut g = unregistered_generation();
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
        let g = unregistered_generation();
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
        let g = unregistered_generation();
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
