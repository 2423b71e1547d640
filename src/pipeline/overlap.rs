//! Overlapped commits (`--overlap-commits`, two producers): a due batch's drain and EndTxn go to
//! a thread of their own while the next batch fills on the other producer.
//!
//! ```text
//!  loop's thread:  batch n due ─► settle n-1 ─► stage n (states; offsets with the group metadata
//!                  of this moment) ─► hand off ─► batch n+1 begins on the other producer, its
//!                  outputs held until n has drained, then sent in order ─► … ─► settle n
//!  commit thread:  flush n ─► Drained ─► commit_transaction ─► Done(outcome)
//! ```
//!
//! A due batch puts its states and its offsets (with the group metadata of that moment) into its
//! transaction on the loop's thread, then hands its drain and EndTxn to a thread of their own
//! ([`Committer::hand_off`]), and the loop goes on: the next
//! batch begins on the other producer while the first one commits. At most one commit is in
//! flight: the next hand-off, a revoke, an abort and the shutdown wait for it first
//! ([`Committer::settle`]), so offsets and states still commit in order. The records of the two
//! producers are not ordered with each other, so the open batch's outputs are held back until
//! every record of the batch in flight is in the log (its drain). A commit in flight that fails
//! aborts the open batch too, whose state and offsets follow from it, and the rewind goes back to
//! the last commit: an abort or a stall rewinds both ([`Committer::abort_and_rewind`]).
//!
//! Without `--overlap-commits` the [`Outbox`] stays empty, outputs go straight to the producer and
//! a due batch commits on the loop's thread ([`Committer::commit_or_abort`]).

use super::commit::{Committer, OpenTxn, Session};
use crate::kafka::txn::{TxnCause, TxnError, TxnErrorClass, TxnProducer};
use crate::metrics as m;
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::BaseRecord;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tracing::{error, warn};

/// What the commit thread of a batch in flight says (`--overlap-commits`).
enum Progress {
    /// Every record of the batch has been answered: a record of the next batch can no longer
    /// overtake one of it.
    Drained,
    /// How its commit (offsets, then EndTxn) ended.
    Done(Result<(), TxnError>),
}

/// A batch whose offsets and commit are on their way on a thread of their own, while the next
/// batch fills on the other producer.
struct InFlight {
    /// Index in `Committer::producers` of the producer whose transaction it is.
    producer: usize,
    txn: OpenTxn,
    /// When its commit began.
    started: Instant,
    /// The commit thread said [`Progress::Drained`].
    drained: bool,
    /// The commit thread said [`Progress::Done`].
    done: Option<Result<(), TxnError>>,
    said: mpsc::Receiver<Progress>,
}

impl InFlight {
    /// Takes what the commit thread said; with `wait`, until it has said how the commit ended.
    /// A thread that ends without saying it (a panic) is a fatal error: whether the batch
    /// committed is unknown.
    fn hear(&mut self, wait: bool) {
        while self.done.is_none() {
            let said = if wait {
                self.said
                    .recv()
                    .map_err(|_| mpsc::TryRecvError::Disconnected)
            } else {
                self.said.try_recv()
            };
            match said {
                Ok(Progress::Drained) => self.drained = true,
                Ok(Progress::Done(outcome)) => self.done = Some(outcome),
                Err(mpsc::TryRecvError::Empty) => return,
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.done = Some(Err(TxnError::with_class(
                        "commit thread",
                        TxnErrorClass::Fatal,
                        TxnCause::CommitThread("ended without an answer"),
                    )));
                }
            }
        }
    }

    /// Whether every record of the batch is in the log (or failed, which fails its commit).
    fn drained(&self) -> bool {
        self.drained || matches!(self.done, Some(Ok(())))
    }
}

/// An output of the open batch, held back until the batch in flight has drained.
struct Held {
    topic: String,
    partition: Option<i32>,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: Option<OwnedHeaders>,
}

impl Held {
    fn of(record: &BaseRecord<'_, [u8], [u8]>) -> Self {
        Held {
            topic: record.topic.to_owned(),
            partition: record.partition,
            key: record.key.map(<[u8]>::to_vec),
            payload: record.payload.map(<[u8]>::to_vec),
            headers: record.headers.clone(),
        }
    }

    fn record(&self) -> BaseRecord<'_, [u8], [u8]> {
        let mut record = BaseRecord::to(&self.topic);
        record.partition = self.partition;
        record.key = self.key.as_deref();
        record.payload = self.payload.as_deref();
        record.headers = self.headers.clone();
        record
    }
}

/// Where the open batch's outputs go (`--overlap-commits`; with one transaction at a time it
/// stays empty and outputs go straight to the producer).
#[derive(Default)]
pub(super) struct Outbox {
    /// The batch whose commit is in flight.
    in_flight: Option<InFlight>,
    /// Outputs of the open batch, in the order it made them, until the batch in flight drained.
    held: Vec<Held>,
    /// A batch whose commit failed and that is still to be aborted, with its producer's index
    /// and its number of records.
    failed: Option<(usize, u64)>,
}

impl Outbox {
    /// Whether an output made now must wait: the batch in flight still has records on their way.
    fn holding(&self) -> bool {
        self.in_flight.as_ref().is_some_and(|f| !f.drained())
    }

    /// Whether a commit is in flight or outputs are held back for one.
    pub(super) fn overlapping(&self) -> bool {
        self.in_flight.is_some() || !self.held.is_empty()
    }

    /// Whether a commit is in flight.
    pub(super) fn has_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }
}

impl Committer {
    /// Sends an output of the open batch, or holds it back while the batch in flight still has
    /// records on their way: the two producers' requests are not ordered with each other, so a
    /// notification could overtake an earlier one of its symbol. (State records need no hold: a
    /// batch writes them at its commit, after the batch before it has committed.)
    pub fn output(
        &self,
        outbox: &mut Outbox,
        record: BaseRecord<'_, [u8], [u8]>,
    ) -> Result<(), KafkaError> {
        self.release(outbox, false)?;
        if outbox.holding() {
            outbox.held.push(Held::of(&record));
            m::overlap_held();
            return Ok(());
        }
        self.producer().send(record)
    }

    /// Hears from the commit thread (until the commit ended, with `wait`), and sends the held
    /// outputs, in order, once the batch in flight has drained.
    fn release(&self, outbox: &mut Outbox, wait: bool) -> Result<(), KafkaError> {
        if let Some(f) = outbox.in_flight.as_mut() {
            f.hear(wait);
        }
        if outbox.holding() {
            return Ok(());
        }
        for held in outbox.held.drain(..) {
            self.producer().send(held.record())?;
        }
        Ok(())
    }

    /// Ends the batch in flight if its commit has answered (waiting for the answer with `wait`):
    /// counts it if it committed; if it failed, aborts it and the open batch, whose state and
    /// offsets follow from it, and rewinds `rewind`. Returns whether the open batch may go on
    /// (false after such an abort). Nothing in flight: true at once.
    pub(super) fn settle<C: ConsumerContext>(
        &self,
        session: &mut Session,
        consumer: &BaseConsumer<C>,
        rewind: &[i32],
        wait: bool,
    ) -> Result<bool, TxnError> {
        if !session.overlapping() {
            return Ok(true);
        }
        if let Err(e) = self.release(&mut session.outbox, wait) {
            return self.abort_after(session, consumer, rewind, TxnError::new("produce", e));
        }
        let Some(f) = session.outbox.in_flight.take_if(|f| f.done.is_some()) else {
            return Ok(true);
        };
        match self.end_in_flight(session, f) {
            Ok(()) => Ok(true),
            Err(e) => self.abort_after(session, consumer, rewind, e),
        }
    }

    /// Ends a batch in flight whose commit has answered: counts it if it committed; returns the
    /// error if it failed, the batch noted for the abort that follows (`Outbox::failed`) when the
    /// error is abortable.
    fn end_in_flight(&self, session: &mut Session, f: InFlight) -> Result<(), TxnError> {
        match f.done {
            Some(Ok(())) => {
                self.committed(session, f.txn, f.started);
                Ok(())
            }
            Some(Err(e)) => {
                if e.class == TxnErrorClass::Abortable {
                    session.outbox.failed = Some((f.producer, f.txn.records));
                }
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Before an abort ([`Committer::abort_and_rewind`]): waits for the commit in flight, if
    /// any, and ends it (counted if it committed), and drops the outputs held back for it.
    /// Returns the batch whose commit failed and is still to be aborted (its producer's index and
    /// its number of records) and whether that failure was a stuck call; a fatal failure is
    /// returned as the error.
    pub(super) fn end_overlap(
        &self,
        session: &mut Session,
    ) -> Result<(Option<(usize, u64)>, bool), TxnError> {
        let mut stuck = false;
        if let Some(mut f) = session.outbox.in_flight.take() {
            f.hear(true);
            if let Err(e) = self.end_in_flight(session, f) {
                if e.class != TxnErrorClass::Abortable {
                    return Err(e);
                }
                warn!(error = %e, "the commit in flight failed too");
                stuck = e.is_stuck();
            }
        }
        session.outbox.held.clear();
        Ok((session.outbox.failed.take(), stuck))
    }

    /// The batch is due: with `--overlap-commits`, once the batch in flight has ended, puts its
    /// states and offsets into the transaction and hands its drain and EndTxn to a thread of their own,
    /// and returns: the next batch fills on the other producer meanwhile. Otherwise commits it
    /// ([`Committer::commit_or_abort`]). Returns false if something aborted.
    pub fn hand_off<C: ConsumerContext>(
        &self,
        session: &mut Session,
        consumer: &BaseConsumer<C>,
        rewind: &[i32],
    ) -> Result<bool, TxnError> {
        if !self.settings().overlap_commits {
            return self.commit_or_abort(session, consumer, rewind);
        }
        // At most one commit in flight, and this batch's offsets and state follow from it.
        if !self.settle(session, consumer, rewind, true)? {
            return Ok(false);
        }
        if session.txn.is_none() {
            return Ok(true);
        }
        let started = Instant::now();
        session.previous_commit = Some(started);
        // The offsets go in here, not on the commit thread: their group metadata must be the
        // consumer's of this moment. The loop polls while a commit is in flight, so the consumer
        // may rejoin meanwhile, and offsets sent with the generation of the hand-off would be
        // refused (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID), aborting both batches: in a chaos run
        // that was 59 of 71 aborts. EndTxn does not look at the generation.
        if let Err(e) = self.stage(session, consumer) {
            return self.abort_after(session, consumer, rewind, e);
        }
        let producer = self.active();
        let (tell, said) = mpsc::channel();
        let commit = {
            let next = Arc::clone(self.producers.after(producer));
            let producer = Arc::clone(self.producers.get(producer));
            let n = Some(session.stats.commits + 1);
            let hooks = InFlightHooks {
                crash: self.settings().hooks.crash_before_commit == n,
                fail_once: (self.settings().hooks.fail_commit_in_flight == n
                    && !self.failed_once.swap(true, Ordering::Relaxed))
                .then_some(next),
            };
            move || commit_in_flight(&producer, &hooks, &tell)
        };
        if let Err(e) = std::thread::Builder::new()
            .name("txn-commit".into())
            .spawn(commit)
        {
            error!(error = %e, "could not start a commit thread");
            return Err(TxnError::with_class(
                "commit thread",
                TxnErrorClass::Fatal,
                TxnCause::CommitThread("could not be started"),
            ));
        }
        if let Some(txn) = session.txn.take() {
            session.outbox.in_flight = Some(InFlight {
                producer,
                txn,
                started,
                drained: false,
                done: None,
                said,
            });
        }
        Ok(true)
    }
}

/// What the commit thread of a batch in flight does (`--overlap-commits`): drains the batch's
/// records (then the next batch's may leave), commits, and tells the loop each. Its states and
/// offsets are in the transaction already.
fn commit_in_flight(producer: &TxnProducer, hooks: &InFlightHooks, tell: &mpsc::Sender<Progress>) {
    let started = Instant::now();
    // A drain that fails or passes its bound leaves the next batch's outputs held; the commit
    // fails on its own then (it drains again first).
    if producer.flush(crate::kafka::txn::DRAIN_TIMEOUT).is_ok() {
        let _ = tell.send(Progress::Drained);
    }
    if hooks.crash {
        error!("test hook: crashing before this commit");
        std::process::abort();
    }
    let done = match &hooks.fail_once {
        Some(next) => fail_once_the_next_began(next, started),
        None => m::commit_step("end_transaction", || producer.commit()),
    };
    let _ = tell.send(Progress::Done(done));
}

/// The test hooks of a commit in flight ([`super::settings::TestHooks`]).
struct InFlightHooks {
    /// `crash_before_commit` names this commit.
    crash: bool,
    /// `fail_commit_in_flight` names this commit: the other producer, whose next batch must have
    /// begun before it fails.
    fail_once: Option<Arc<TxnProducer>>,
}

/// Test hook: fails the commit in flight, abortably, once `next` has begun a transaction after
/// `started` (at most 10 s later: a stream that brought nothing more fails it alone).
fn fail_once_the_next_began(next: &TxnProducer, started: Instant) -> Result<(), TxnError> {
    let deadline = started + Duration::from_secs(10);
    while next.began().is_none_or(|b| b < started) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    error!(
        next_began = next.began().is_some_and(|b| b >= started),
        "test hook: the commit in flight fails"
    );
    Err(TxnError::with_class(
        "commit_transaction",
        TxnErrorClass::Abortable,
        TxnCause::Injected("test hook: the commit in flight fails"),
    ))
}
