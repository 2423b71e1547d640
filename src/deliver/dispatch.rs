//! A batch's HTTP calls: concurrent, bounded per subscriber (`max_in_flight`) and per partition,
//! each subscriber behind its circuit breaker ([`super::breaker`]), and the batch waiting for them
//! no longer than its delivery deadline.
//!
//! ```text
//!  per job: breaker.admit ─► Skip ─────────────────────────────► CircuitOpen (next bucket, untried)
//!                        └─► Call | Probe ─► task: turn (permits) ─► POST ─► result ─► channel
//!  batch: wait for the Call results until the deadline, for a Probe's a little longer (PROBE_GRACE)
//!         then: still waiting for a turn ─► NotStarted (never sent)   still sending ─► Unfinished
//! ```
//!
//! Why tasks: the batch's transaction waits for its deliveries, so a call that hangs must not
//! hold the batch. Each call is a spawned task that reports through a channel; the batch takes
//! what arrived by its deadline and moves on. A call still sending then runs on, detached, to its
//! own request timeout, holding its subscriber's permit (so `max_in_flight` still bounds what a
//! hanging endpoint is sent); its late answer only counts in the attempts metric. A call still
//! waiting for its turn is given up atomically (`Turn`) so it is never sent after the batch has
//! handed its record on.
//!
//! The breaker hears every call the batch waited for (an unfinished one is a failure) in job
//! order, and a probe's task reports the probe itself whenever it ends, so a probe to a hanging
//! endpoint costs the batch at most [`PROBE_GRACE`], not a request timeout.

use super::breaker::{Admission, Breaker, BreakerConfig};
use super::http::{self, Attempt};
use super::metrics as m;
use super::subscriptions::Subscriber;
use rdkafka::message::OwnedMessage;
use rdkafka::Message;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, Semaphore};

/// How long a batch waits for a half-open probe when its other calls are done sooner: enough for
/// a healthy endpoint to answer (the probe's answer is then the record's outcome), short enough
/// that a hanging endpoint's probe every cool-down costs the other subscribers little.
const PROBE_GRACE: Duration = Duration::from_millis(250);

/// A call's turn: waiting for its permits, sending, or given up by the batch before it was sent.
const WAITING: u8 = 0;
const SENDING: u8 = 1;
const GIVEN_UP: u8 = 2;

/// One HTTP delivery of a batch.
pub(super) struct Job {
    /// Index of the record in the batch.
    pub record: usize,
    pub subscriber: Arc<Subscriber>,
    /// `Idempotency-Key`.
    pub key: String,
}

/// A subscriber as the dispatcher sees it.
pub(super) struct Lane {
    pub subscriber: Arc<Subscriber>,
    /// Its `max_in_flight` bound; detached calls hold their permit until they end.
    permits: Arc<Semaphore>,
    /// Shared with the probe tasks, which report after the batch has moved on.
    breaker: Arc<Mutex<Breaker>>,
}

impl Lane {
    pub fn new(subscriber: Subscriber, breaker: BreakerConfig) -> Self {
        let permits = Arc::new(Semaphore::new(subscriber.max_in_flight));
        Lane {
            subscriber: Arc::new(subscriber),
            permits,
            breaker: Arc::new(Mutex::new(Breaker::new(breaker))),
        }
    }
}

/// Applies `f` to a subscriber's breaker and publishes its state.
fn judge<T>(breaker: &Mutex<Breaker>, subscriber: &str, f: impl FnOnce(&mut Breaker) -> T) -> T {
    // A poisoned lock still holds a consistent breaker: every update is one assignment.
    let mut b = breaker
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let out = f(&mut b);
    m::circuit(subscriber, b.state().gauge());
    out
}

/// What the batch runs its calls with.
pub(super) struct Dispatcher<'a> {
    pub rt: &'a tokio::runtime::Handle,
    pub client: &'a reqwest::Client,
    pub lanes: &'a HashMap<String, Lane>,
    pub partition_concurrency: usize,
    /// How long the batch waits for its calls.
    pub deadline: Duration,
}

/// A call of the batch, as the batch tracks it.
enum Call {
    Skipped,
    Running { turn: Arc<AtomicU8>, probe: bool },
}

impl Dispatcher<'_> {
    /// Runs the batch's deliveries; one [`Attempt`] per job, in job order.
    pub fn deliver(&self, records: &[OwnedMessage], jobs: &[Job]) -> Vec<Attempt> {
        let per_partition: HashMap<(&str, i32), Arc<Semaphore>> = records
            .iter()
            .map(|m| {
                (
                    (m.topic(), m.partition()),
                    Arc::new(Semaphore::new(self.partition_concurrency)),
                )
            })
            .collect();
        let started = tokio::time::Instant::now();
        let deadline = started + self.deadline;
        let now = Instant::now();
        let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Attempt)>();
        let calls: Vec<Call> = jobs
            .iter()
            .enumerate()
            .map(|(i, job)| {
                let name = &job.subscriber.name;
                let lane = &self.lanes[name];
                let probe = match judge(&lane.breaker, name, |b| b.admit(now)) {
                    Admission::Skip => {
                        m::circuit_skipped(name);
                        return Call::Skipped;
                    }
                    Admission::Call => false,
                    Admission::Probe => true,
                };
                let turn = Arc::new(AtomicU8::new(WAITING));
                let m = &records[job.record];
                let call = Send {
                    subscriber: Arc::clone(&job.subscriber),
                    key: job.key.clone(),
                    body: m.payload().unwrap_or_default().to_vec(),
                    client: self.client.clone(),
                    permits: (
                        Arc::clone(&lane.permits),
                        Arc::clone(&per_partition[&(m.topic(), m.partition())]),
                    ),
                    turn: Arc::clone(&turn),
                    probe: probe.then(|| Arc::clone(&lane.breaker)),
                };
                let tx = tx.clone();
                self.rt.spawn(async move {
                    let attempt = call.run(deadline).await;
                    let _ = tx.send((i, attempt)); // the batch may have moved on: then only metrics count it
                });
                Call::Running { turn, probe }
            })
            .collect();
        drop(tx);
        let mut out: Vec<Option<Attempt>> = calls
            .iter()
            .map(|c| matches!(c, Call::Skipped).then_some(Attempt::CircuitOpen))
            .collect();
        let is_probe = |c: &Call| matches!(c, Call::Running { probe: true, .. });
        let mut calls_left = calls
            .iter()
            .filter(|c| matches!(c, Call::Running { probe: false, .. }))
            .count();
        let mut probes_left = calls.iter().filter(|c| is_probe(c)).count();
        self.rt.block_on(async {
            let mut until = deadline;
            while calls_left + probes_left > 0 {
                if calls_left == 0 {
                    // Only probes left: a little longer for them, never past the deadline.
                    until = until.min((started + PROBE_GRACE).max(tokio::time::Instant::now()));
                }
                let Ok(Some((i, attempt))) = tokio::time::timeout_at(until, rx.recv()).await else {
                    break;
                };
                if is_probe(&calls[i]) {
                    probes_left -= 1;
                } else {
                    calls_left -= 1;
                }
                out[i] = Some(attempt);
            }
        });
        // Give up what has not answered: a call not sent yet never will be; one being sent runs on.
        for (i, call) in calls.iter().enumerate() {
            if let (None, Call::Running { turn, .. }) = (&out[i], call) {
                let given_up = turn
                    .compare_exchange(WAITING, GIVEN_UP, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok();
                out[i] = Some(if given_up {
                    Attempt::NotStarted
                } else {
                    Attempt::Unfinished
                });
            }
        }
        // Results that came in meanwhile are the real ones.
        while let Ok((i, attempt)) = rx.try_recv() {
            out[i] = Some(attempt);
        }
        let attempts: Vec<Attempt> = out
            .into_iter()
            .map(|a| a.unwrap_or(Attempt::NotStarted))
            .collect();
        let now = Instant::now();
        for ((job, call), attempt) in jobs.iter().zip(&calls).zip(&attempts) {
            if let (Call::Running { probe: false, .. }, Some(ok)) = (call, attempt.responsive()) {
                judge(
                    &self.lanes[&job.subscriber.name].breaker,
                    &job.subscriber.name,
                    |b| b.call_done(ok, now),
                );
            }
        }
        attempts
    }
}

/// One call, owned by its task (it may outlive the batch).
struct Send {
    subscriber: Arc<Subscriber>,
    key: String,
    body: Vec<u8>,
    client: reqwest::Client,
    /// The subscriber's and the partition's semaphores.
    permits: (Arc<Semaphore>, Arc<Semaphore>),
    turn: Arc<AtomicU8>,
    /// The breaker, when this call is its probe: the task reports the probe whenever it ends.
    probe: Option<Arc<Mutex<Breaker>>>,
}

impl Send {
    /// Waits for its turn (until `deadline`), sends unless the batch gave it up, and reports.
    async fn run(self, deadline: tokio::time::Instant) -> Attempt {
        let (subscriber, partition) = self.permits;
        let permits = tokio::time::timeout_at(deadline, async {
            (
                subscriber.acquire_owned().await,
                partition.acquire_owned().await,
            )
        })
        .await;
        let attempt = match permits {
            Ok((Ok(_s), Ok(_p)))
                if self
                    .turn
                    .compare_exchange(WAITING, SENDING, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok() =>
            {
                let attempt =
                    http::post(&self.client, &self.subscriber.url, &self.key, self.body).await;
                m::attempt(
                    &self.subscriber.name,
                    http::classify(&attempt, SystemTime::now()).label(),
                );
                attempt
            }
            _ => Attempt::NotStarted,
        };
        if let Some(breaker) = &self.probe {
            // A probe that could not be made counts as failed: no turn within the deadline means
            // the subscriber's earlier calls still hold its permits.
            let ok = attempt.responsive().unwrap_or(false);
            judge(breaker, &self.subscriber.name, |b| {
                b.probe_done(ok, Instant::now())
            });
        }
        attempt
    }
}
