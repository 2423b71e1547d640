//! The long-running deliverer: start-up (topics, HTTP client, transactional producer), the poll
//! loop with its due-time pauses, one batch per transaction, and shutdown.
//!
//! ```text
//!  ┌──────────── dedicated thread (rdkafka's poll; HTTP on the async runtime) ─────────────────┐
//!  │ loop: resume held partitions now due (seek to the held record) ─► poll ≤100 ms, drain ≤ max │
//!  │   per record: a bucket record not due yet ─► pause its partition, hold it until its due time │
//!  │   the rest: deliver (dispatch: bounded, breakers, deadline) ─► ONE transaction: hand-offs    │
//!  │             + every consumed offset ─► commit                                               │
//!  └──────────────────────────────────────────────▲──────────────────────────────────────────────┘
//!                        stop flag set by ────────┘ the async side: SIGINT/SIGTERM (any future)
//! ```
//! The loop never sleeps: a partition whose head record is not due is paused (the consumer goes on
//! polling its other partitions, serves rebalances and keeps its group membership) and resumed at
//! the head's due time, from the head's offset. Its later records wait behind it: a bucket is a
//! queue in due order, since every record of a bucket is due the same delay after its hand-off.
//! A due time no hand-off writes (an edited record) is bounded by the record's timestamp plus
//! the last bucket's delay ([`super::buckets::Buckets::due_of`]), so no record holds its
//! partition longer; such a record is logged and counted once
//! ([`super::metrics::due_clamped`]).
//! What becomes of a held partition on a rebalance or an abort is [`super::partitions`]' business:
//! the loop pauses, resumes and seeks only through it.
//!
//! # Error handling
//! A transaction that must be aborted rewinds every partition of the batch to its first record
//! (dropping a head held further on), so the batch is delivered again (the HTTP side is
//! at-least-once) and handed off once. A fatal one (fenced by a newer instance, say) stops the
//! deliverer non-zero. Aborts in a row back off before the next attempt ([`crate::backoff`]):
//! each one would otherwise call every subscriber of the batch again at once, and an abort that
//! comes back on every attempt would hammer them in a hot loop.

use super::buckets::{from_millis, Next, RetryState, Stage};
use super::dispatch::{Dispatcher, Job, Lane};
use super::gauges::BucketEnds;
use super::handoff::{self, rewind_positions, Batch, Failed, Handoff, Target, TestHooks};
use super::http::{self, Outcome};
use super::metrics as m;
use super::options::DeliverOptions;
use super::partitions::{DeliverContext, Held, Partitions};
use super::subscriptions::Subscriber;
use crate::backoff::Setbacks;
use crate::dlq::Watcher;
use crate::health::Health;
use crate::kafka::access::{self, Needs, ReadRights};
use crate::kafka::group::FatalConsumerError;
use crate::kafka::read::{Ends, END_TIMEOUT};
use crate::kafka::topics::{ensure_topic, partition_count_of, Cleanup, TopicSpec};
use crate::kafka::txn::{TxnCause, TxnErrorClass, TxnProducer};
use anyhow::{anyhow, bail, Context as _};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, OwnedMessage};
use rdkafka::{Message, Offset};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tracing::{debug, info, warn};

/// Longest single poll: bounds how late a due record, a stop request or a metrics refresh is noticed.
const POLL_SLICE: Duration = Duration::from_millis(100);
/// How often the bucket gauges are refreshed.
const GAUGES_EVERY: Duration = Duration::from_secs(5);
/// A batch slower than this is logged with where its time went (deliveries or the commit).
const SLOW_BATCH: Duration = Duration::from_secs(1);
/// Bound on reading the committed offsets after a commit in doubt.
const REWIND_TIMEOUT: Duration = Duration::from_secs(30);

/// What a deliverer did, for its exit line and the tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliverStats {
    /// Records consumed inside committed transactions.
    pub records: u64,
    pub delivered: u64,
    /// Hand-offs to a retry bucket.
    pub retried: u64,
    pub dead_lettered: u64,
    pub parked: u64,
    pub transactions: u64,
    pub aborted: u64,
}

/// The counters of two deliverers that ran one after the other (one made again in place).
impl std::ops::Add for DeliverStats {
    type Output = DeliverStats;

    fn add(self, o: DeliverStats) -> DeliverStats {
        DeliverStats {
            records: self.records + o.records,
            delivered: self.delivered + o.delivered,
            retried: self.retried + o.retried,
            dead_lettered: self.dead_lettered + o.dead_lettered,
            parked: self.parked + o.parked,
            transactions: self.transactions + o.transactions,
            aborted: self.aborted + o.aborted,
        }
    }
}

impl fmt::Display for DeliverStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "records={} delivered={} retried={} dead_lettered={} parked={} transactions={} aborted={}",
            self.records, self.delivered, self.retried, self.dead_lettered, self.parked, self.transactions, self.aborted
        )
    }
}

/// Runs the deliverer until `shutdown` resolves (or it fails), reporting to `health`.
pub async fn run(
    opts: DeliverOptions,
    health: Health,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<DeliverStats> {
    tokio::pin!(shutdown);
    health.not_ready("checking access");
    // The rights it needs, asked of the broker before anything is read or written, so a missing
    // ACL fails the start naming it (docs/security.md, role `deliver`).
    let buckets = opts.buckets.bucket_topics();
    let needs = Needs {
        read: std::iter::once(opts.buckets.topic.clone())
            .chain(buckets.iter().cloned())
            .collect(),
        write: buckets
            .into_iter()
            .chain([opts.buckets.dlq(), opts.buckets.parking_lot()])
            .collect(),
        group: Some(opts.group_id.clone()),
    };
    access::check_async(&opts.kafka, needs).await?;
    health.not_ready("creating topics");
    let partitions = create_topics(&opts).await?;
    let client = http::client(opts.connect_timeout, opts.request_timeout)?;
    let ends = [opts.buckets.dlq(), opts.buckets.parking_lot()];
    m::describe(&opts.subscriptions, &opts.buckets.bucket_topics(), &ends);
    // The DLQ and parking-lot gauges: what is there and not replayed yet; only where they are
    // scraped (the watchers need rights that the deliverer itself does not).
    let _watchers = ends
        .iter()
        .filter(|_| opts.backlog_gauges)
        .map(|t| Watcher::spawn_reporting(opts.kafka.clone(), t.clone(), GAUGES_EVERY, m::backlog))
        .collect::<anyhow::Result<Vec<_>>>()?;
    info!(
        topic = %opts.buckets.topic,
        partitions,
        buckets = ?opts.buckets.bucket_topics(),
        subscribers = opts.subscriptions.len(),
        group = %opts.group_id,
        "alert-deliver starting"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let shutdown_timeout = opts.shutdown_timeout;
    let worker = {
        let stop = Arc::clone(&stop);
        let rt = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || run_blocking(opts, rt, client, health, stop))
    };
    tokio::pin!(worker);
    tokio::select! {
        // The worker's own end (an error) wins over a shutdown arriving at the same moment.
        biased;
        done = &mut worker => return done.context("the deliver thread panicked")?,
        () = &mut shutdown => info!("shutdown requested"),
    }
    stop.store(true, Ordering::Relaxed);
    match tokio::time::timeout(shutdown_timeout, worker).await {
        Ok(done) => done.context("the deliver thread panicked")?,
        Err(_) => bail!("shutdown did not finish within {shutdown_timeout:?}"),
    }
}

/// Creates the buckets, the DLQ and the parking lot when missing, with the notifications topic's
/// partition count (which must exist). Returns that count. The metadata round trips run off the
/// runtime ([`crate::kafka::blocking`]): a slow broker must not silence `/healthz`.
async fn create_topics(opts: &DeliverOptions) -> anyhow::Result<i32> {
    let kafka = &opts.kafka;
    let main = opts.buckets.topic.clone();
    let partitions = partition_count_of(kafka, &main)
        .await
        .with_context(|| format!("the notifications topic {main}"))?;
    let mut names = opts.buckets.bucket_topics();
    names.extend([opts.buckets.dlq(), opts.buckets.parking_lot()]);
    for name in names {
        let spec = TopicSpec {
            name,
            partitions,
            cleanup: Cleanup::Delete,
            retention: Some(opts.retention),
        };
        ensure_topic(kafka, &spec).await?;
    }
    Ok(partitions)
}

/// What a notification's JSON must have for a delivery.
#[derive(Deserialize)]
struct Head {
    id: String,
    symbol: String,
    /// The subscriber a live alert names: the notification goes to it alone.
    #[serde(default)]
    subscriber: Option<String>,
}

struct Deliverer {
    opts: DeliverOptions,
    rt: tokio::runtime::Handle,
    client: reqwest::Client,
    /// Its context owns the per-partition state (held heads, pauses): [`Deliverer::partitions`].
    consumer: BaseConsumer<DeliverContext>,
    producer: Arc<TxnProducer>,
    /// Per subscriber: itself, its `max_in_flight` bound and its circuit breaker.
    lanes: HashMap<String, Lane>,
    stats: DeliverStats,
    /// The buckets' ends, read beside the loop, where the gauges are served ([`BucketEnds`]).
    bucket_ends: Option<BucketEnds>,
    gauges_at: Instant,
    hook: TestHooks,
    /// The last poll that returned a record, or the last change of assignment
    /// (`--exit-when-idle`).
    active_at: Instant,
    /// The assignment stamp seen at `active_at`.
    active_stamp: u64,
    /// Whether every partition owned is read to its end (`--exit-when-idle`).
    ends: Ends,
    /// Aborts since the last commit, and until when the loop waits before the next attempt.
    setbacks: Setbacks,
    backoff_until: Option<Instant>,
    /// The rights refused since the last commit ("Write on Topic …"), said again when one commits.
    refused: BTreeSet<String>,
    /// Its Read rights (on the notifications, the buckets, the group), watched while it runs:
    /// librdkafka retries refused fetches itself, and says each once.
    rights: ReadRights,
}

/// The consumer loop. Blocking: run it on a thread of its own.
///
/// Under the consumer protocol a heartbeat refused for lack of Read on the group stops the
/// consumer for good (`kafka::group`, "Fatal errors"): the deliverer is then dropped, as a crash
/// would drop it (its open hand-off transaction is aborted by the next registration of the same
/// transactional id), the right named once per back-off step while the broker refuses the group,
/// and made again once it does not.
fn run_blocking(
    opts: DeliverOptions,
    rt: tokio::runtime::Handle,
    client: reqwest::Client,
    health: Health,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<DeliverStats> {
    let mut earlier = DeliverStats::default();
    let mut carried: Option<(String, Setbacks)> = None;
    loop {
        let (right, stats, mut setbacks) =
            match run_once(&opts, &rt, &client, &health, &stop, carried.take())? {
                Ran::Done(stats) => return Ok(earlier + stats),
                Ran::GroupRefused {
                    right,
                    stats,
                    setbacks,
                } => (right, stats, setbacks),
            };
        earlier = earlier + stats;
        health.not_ready("Read on the group refused");
        let granted = crate::kafka::group::wait_for_group_read(
            &opts.kafka,
            &opts.group_id,
            &opts.buckets.topic,
            &mut setbacks,
            &stop,
            || health.beat(),
            |attempts, retry_in| {
                crate::kafka::access::say_refused(
                    &opts.kafka,
                    &right,
                    "the group consumer stopped (consumer protocol); made again once granted",
                    attempts,
                    retry_in,
                )
            },
        );
        if !granted {
            info!(stats = %earlier, "alert-deliver stopped");
            return Ok(earlier);
        }
        carried = Some((right, setbacks));
    }
}

/// How one deliverer's run ended.
enum Ran {
    /// Stopped, with its counters.
    Done(DeliverStats),
    /// Its consumer was stopped for good by a refused Read on the group (`right`); the deliverer
    /// is dropped, its counters and setbacks since its last commit kept.
    GroupRefused {
        right: String,
        stats: DeliverStats,
        setbacks: Setbacks,
    },
}

/// One deliverer, from its clients to its end; `carried`: the right refused to the one it
/// replaces and that one's setbacks, which it goes on from (its first commit says `authorised
/// again`).
fn run_once(
    opts: &DeliverOptions,
    rt: &tokio::runtime::Handle,
    client: &reqwest::Client,
    health: &Health,
    stop: &Arc<AtomicBool>,
    carried: Option<(String, Setbacks)>,
) -> anyhow::Result<Ran> {
    let opts = opts.clone();
    let (rt, client) = (rt.clone(), client.clone());
    let mut cfg = opts.kafka.group_consumer(
        &opts.group_id,
        opts.group_instance_id.as_deref(),
        opts.transaction_timeout,
    );
    if cfg.get("fetch.wait.max.ms").is_none() {
        // Notifications become visible in bursts, when a transaction commits; librdkafka's 500 ms
        // default would be most of a delivery's latency. -X overrides it.
        cfg.set("fetch.wait.max.ms", "20");
    }
    let consumer: BaseConsumer<DeliverContext> = cfg
        .create_with_context(DeliverContext::default())
        .context("creating the deliverer's consumer")?;
    // A refused transactional id is named as the start-up check names a right.
    let producer = TxnProducer::start(
        &opts.kafka,
        &opts.transactional_id,
        opts.transaction_timeout,
    )?;
    let mut topics = vec![opts.buckets.topic.clone()];
    topics.extend(opts.buckets.bucket_topics());
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let rights = ReadRights::new(
        &opts.kafka,
        topics.clone(),
        &opts.group_id,
        "fetches refused; its records wait until it is granted",
        "the group refuses its heartbeats; hand-offs cannot commit until it is granted",
    );
    consumer
        .subscribe(&names)
        .context("subscribing to the notifications and bucket topics")?;
    let lanes = opts
        .subscriptions
        .iter()
        .map(|s| (s.name.clone(), Lane::new(s.clone(), opts.breaker)))
        .collect();
    let hook = TestHooks {
        crash_after: opts.test_crash_after_handoffs,
        abort_txn: opts.test_abort_handoff_txn,
        abort_while: opts.test_abort_handoffs_while.clone(),
        hold_send_offsets: opts.test_hold_send_offsets.clone(),
        aborts_fail_fatally: opts.test_aborts_fail_fatally,
        stop: Arc::clone(stop),
        ..TestHooks::default()
    };
    let bucket_ends = opts
        .backlog_gauges
        .then(|| BucketEnds::spawn(&opts.kafka, opts.buckets.bucket_topics(), GAUGES_EVERY))
        .transpose()?;
    let mut d = Deliverer {
        ends: Ends::new(&opts.kafka),
        bucket_ends,
        opts,
        rt,
        client,
        consumer,
        producer,
        lanes,
        stats: DeliverStats::default(),
        gauges_at: Instant::now(),
        hook,
        active_at: Instant::now(),
        active_stamp: 0,
        setbacks: Setbacks::default(),
        backoff_until: None,
        refused: BTreeSet::new(),
        rights,
    };
    if let Some((right, setbacks)) = carried {
        d.refused.insert(right);
        d.setbacks = setbacks;
    }
    health.ready();
    let watchdog = health.watchdog(
        crate::kafka::txn::stuck_bound(d.opts.transaction_timeout),
        crate::kafka::txn::EXIT_STUCK,
    );
    let result = d.consume_until_stopped(health, stop);
    if result
        .as_ref()
        .is_err_and(crate::kafka::group::is_group_refused)
    {
        let right = format!("Read on Group {}", d.opts.group_id);
        let (stats, setbacks) = (d.stats, d.setbacks);
        // Closing the dead consumer and the producer is librdkafka's: the watchdog still bounds
        // it.
        drop(d);
        drop(watchdog);
        return Ok(Ran::GroupRefused {
            right,
            stats,
            setbacks,
        });
    }
    drop(watchdog);
    health.not_ready(if result.is_ok() { "stopping" } else { "failed" });
    match result {
        Ok(()) => {
            info!(stats = %d.stats, "alert-deliver stopped");
            Ok(Ran::Done(d.stats))
        }
        Err(e) => {
            warn!(error = format!("{e:#}"), stats = %d.stats, "alert-deliver failed");
            Err(e)
        }
    }
}

impl Deliverer {
    fn consume_until_stopped(&mut self, health: &Health, stop: &AtomicBool) -> anyhow::Result<()> {
        while !stop.load(Ordering::Relaxed) {
            health.beat();
            if let Some(until) = self.backoff_until {
                // In poll-sized steps, so a stop request is seen at once.
                let left = until.saturating_duration_since(Instant::now());
                if !left.is_zero() {
                    std::thread::sleep(left.min(POLL_SLICE));
                    continue;
                }
                self.backoff_until = None;
            }
            self.partitions()?
                .resume_due(&self.consumer, SystemTime::now())?;
            if self.gauges_at <= Instant::now() {
                self.bucket_gauges();
                self.gauges_at = Instant::now() + GAUGES_EVERY;
            }
            let batch = self.poll_batch()?;
            if !batch.is_empty() {
                self.process(batch)?;
            }
            if self.idle()? {
                info!("idle; stopping");
                break;
            }
        }
        Ok(())
    }

    /// Whether `--exit-when-idle` is due: partitions owned, none held (no retry waits for its
    /// due time), nothing polled and no assignment change for that long, and every partition
    /// owned read to its end ([`Ends`]). A record read back from a bucket holds its partition
    /// until due, so nothing handed off is left behind. Not at its end: quiet for another spell,
    /// then asked again.
    fn idle(&mut self) -> anyhow::Result<bool> {
        let Some(idle) = self.opts.exit_when_idle else {
            return Ok(false);
        };
        let (stamp, settled) = {
            let p = self.partitions()?;
            (p.stamp(), p.settled())
        };
        if stamp != self.active_stamp {
            self.active_stamp = stamp;
            self.active_at = Instant::now();
        }
        if !settled || self.active_at.elapsed() < idle {
            return Ok(false);
        }
        let at_end = self
            .ends
            .reached(&self.consumer, END_TIMEOUT)
            .unwrap_or_else(|e| {
                debug!(
                    error = format!("{e:#}"),
                    "--exit-when-idle: the partitions' ends not read"
                );
                false
            });
        if !at_end {
            self.active_at = Instant::now();
        }
        Ok(at_end)
    }

    /// The per-partition state (never held across a poll: the rebalance callbacks lock it).
    fn partitions(&self) -> anyhow::Result<std::sync::MutexGuard<'_, Partitions>> {
        let p = self.consumer.context().partitions()?;
        if let Some(e) = p.failure() {
            bail!("{e}");
        }
        Ok(p)
    }

    /// Polls up to `max_batch` records, waiting at most until the next due time; keeps those of
    /// owned partitions that are due, holding (pausing) a partition at its first record that is not.
    fn poll_batch(&mut self) -> anyhow::Result<Vec<OwnedMessage>> {
        let now = SystemTime::now();
        let until_due = self
            .partitions()?
            .next_due()
            .map(|due| due.duration_since(now).unwrap_or_default());
        let wait = until_due.map_or(POLL_SLICE, |d| d.min(POLL_SLICE));
        let mut polled = Vec::new();
        let mut deliveries = 0;
        while polled.len() < self.opts.max_batch && deliveries < self.opts.max_batch_deliveries {
            match self.consumer.poll(if polled.is_empty() {
                wait
            } else {
                Duration::ZERO
            }) {
                // Stamped after the poll, whose rebalance callbacks ran before it returned.
                Some(Ok(m)) => {
                    self.active_at = Instant::now();
                    self.rights.fetched(m.topic());
                    deliveries += self.deliveries_of(&m);
                    polled.push((self.partitions()?.stamp(), m.detach()));
                }
                // The consumer is unusable after a fatal error (a static member refused or
                // fenced): stop, as the pipeline does, instead of polling a dead consumer.
                Some(Err(KafkaError::MessageConsumptionFatal(code))) => {
                    return Err(FatalConsumerError(code).into());
                }
                // A right taken away while running: librdkafka retries; said per back-off step.
                Some(Err(e)) => {
                    if !self
                        .rights
                        .on_error(self.consumer.client(), e.rdkafka_error_code())
                    {
                        warn!(error = %e, "consumer error");
                    }
                }
                None => break,
            }
        }
        if polled.is_empty() {
            self.rights.recheck(self.consumer.client());
        }
        let mut partitions = self.partitions()?;
        let now = SystemTime::now();
        let mut batch = Vec::with_capacity(polled.len());
        for (stamp, m) in polled {
            let tp = (m.topic().to_owned(), m.partition());
            if !partitions.is_current(&tp, stamp) {
                // Read again: from the held head once due, from the committed offset after a
                // re-assign, or by the new owner.
                continue;
            }
            if let Some(Stage::Bucket(i)) = self.opts.buckets.stage_of(m.topic()) {
                let due = self.opts.buckets.due_of(&m, i, now);
                if let Some(header) = &due.clamped {
                    if partitions.clamp_is_news(&tp, m.offset()) {
                        m::due_clamped(m.topic(), m.partition(), m.offset(), header, due.at);
                    }
                }
                if due.at > now {
                    let held = Held {
                        due: due.at,
                        offset: m.offset(),
                        timestamp: m.timestamp().to_millis(),
                    };
                    partitions
                        .hold(&self.consumer, tp, held)
                        .context("pausing a partition")?;
                    continue;
                }
            }
            batch.push(m);
        }
        Ok(batch)
    }

    /// How many deliveries `m` makes, for the batch's bound: a retry's one, a notification's one
    /// per subscriber of its key (the symbol; `process` reads the payload's), at least one.
    fn deliveries_of(&self, m: &BorrowedMessage<'_>) -> usize {
        match self.opts.buckets.stage_of(m.topic()) {
            Some(Stage::Main) => self.opts.subscriptions.deliveries_of_key(m.key()),
            _ => 1,
        }
    }

    /// Delivers a batch and commits its hand-offs and offsets in one transaction.
    fn process(&mut self, records: Vec<OwnedMessage>) -> anyhow::Result<()> {
        let now = SystemTime::now();
        let states: Vec<Option<RetryState>> =
            records.iter().map(|m| RetryState::of(m, now)).collect();
        let mut handoffs = Vec::new();
        let mut jobs = Vec::new();
        for (i, m) in records.iter().enumerate() {
            let stage = self
                .opts
                .buckets
                .stage_of(m.topic())
                .ok_or_else(|| anyhow!("a record of {}", m.topic()))?;
            let bad = |subscriber: &str, class: &'static str, why: String| Handoff {
                record: i,
                subscriber: subscriber.to_owned(),
                target: Target::Dlq(class),
                error_class: class.to_owned(),
                error_message: why,
                not_before: None,
                // Examined once, as the pipeline counts a bad input's one attempt.
                tried: true,
                untried_pass: false,
            };
            let head = match m.payload().map(serde_json::from_slice::<Head>) {
                Some(Ok(h)) => h,
                Some(Err(e)) => {
                    handoffs.push(bad(
                        states[i].as_ref().map_or("-", |s| &s.subscriber),
                        "delivery.bad_record",
                        format!("not a notification: {e}"),
                    ));
                    continue;
                }
                None => {
                    handoffs.push(bad("-", "delivery.bad_record", "empty record".into()));
                    continue;
                }
            };
            let targets: Vec<Arc<Subscriber>> = match (&states[i], stage) {
                // A retry, or a replayed dead letter: its one subscriber.
                (Some(s), _) => match self.lanes.get(&s.subscriber) {
                    Some(lane) => vec![Arc::clone(&lane.subscriber)],
                    None => {
                        let why =
                            format!("subscriber {} is not in the subscriptions", s.subscriber);
                        handoffs.push(bad(&s.subscriber, "delivery.unknown_subscriber", why));
                        continue;
                    }
                },
                // A live alert's notification: the subscriber it names, whatever its symbols.
                (None, Stage::Main) if head.subscriber.is_some() => {
                    let name = head.subscriber.as_deref().unwrap_or_default();
                    match self.lanes.get(name) {
                        Some(lane) => vec![Arc::clone(&lane.subscriber)],
                        None => {
                            let why = format!("subscriber {name} is not in the subscriptions");
                            handoffs.push(bad(name, "delivery.unknown_subscriber", why));
                            continue;
                        }
                    }
                }
                (None, Stage::Main) => self
                    .opts
                    .subscriptions
                    .of_symbol(&head.symbol)
                    .filter_map(|s| {
                        self.lanes
                            .get(&s.name)
                            .map(|lane| Arc::clone(&lane.subscriber))
                    })
                    .collect(),
                (None, Stage::Bucket(_)) => {
                    handoffs.push(bad(
                        "-",
                        "delivery.bad_record",
                        "a retry record without retry.subscriber".into(),
                    ));
                    continue;
                }
            };
            for subscriber in targets {
                let key = format!("{}/{}", head.id, subscriber.name);
                jobs.push(Job {
                    record: i,
                    subscriber,
                    key,
                });
            }
        }
        let started = Instant::now();
        let dispatcher = Dispatcher {
            rt: &self.rt,
            client: &self.client,
            lanes: &self.lanes,
            partition_concurrency: self.opts.partition_concurrency,
            deadline: self.opts.delivery_deadline,
        };
        let attempts = dispatcher.deliver(&records, &jobs);
        let http_took = started.elapsed();
        let mut outcomes: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut latencies = Vec::new();
        let now = SystemTime::now();
        for (job, attempt) in jobs.iter().zip(attempts) {
            let outcome = http::classify(&attempt, now);
            *outcomes.entry(outcome.label()).or_default() += 1;
            let stage = self
                .opts
                .buckets
                .stage_of(records[job.record].topic())
                .unwrap_or(Stage::Main);
            // A delivery not tried (circuit open, no turn) is not dead-lettered for that alone: it
            // goes round the last bucket again a few times, counted on the record, not by the clock.
            let next = if attempt.tried() {
                self.opts.buckets.next(stage)
            } else {
                let passes = states[job.record].as_ref().map_or(0, |s| s.untried_passes);
                self.opts.buckets.next_untried(stage, passes)
            };
            let untried_pass = !attempt.tried() && self.opts.buckets.is_untried_pass(stage, next);
            let (target, class, message, not_before) = match outcome {
                Outcome::Delivered => {
                    let written = records[job.record].timestamp().to_millis().map(from_millis);
                    latencies.extend(written.and_then(|t| now.duration_since(t).ok()));
                    continue;
                }
                Outcome::Transient {
                    class,
                    reason,
                    not_before,
                } => match next {
                    Next::Bucket(b) => (Target::Bucket(b), class, reason, not_before),
                    Next::Exhausted => (
                        Target::Dlq("delivery.transient.exhausted"),
                        class,
                        reason,
                        None,
                    ),
                },
                Outcome::Permanent { class, reason } => {
                    (Target::Dlq("delivery.permanent"), class, reason, None)
                }
                Outcome::Gone { reason } => (Target::ParkingLot, "http.410", reason, None),
            };
            handoffs.push(Handoff {
                record: job.record,
                subscriber: job.subscriber.name.clone(),
                target,
                error_class: class.to_owned(),
                error_message: message,
                not_before,
                tried: attempt.tried(),
                untried_pass,
            });
        }
        let committing = Instant::now();
        let done = self.commit(
            &records, &states, &handoffs, &outcomes, &latencies, http_took,
        );
        let commit_took = committing.elapsed();
        if http_took + commit_took > SLOW_BATCH {
            warn!(records = records.len(), deliveries = jobs.len(), http = ?http_took, commit = ?commit_took, "slow batch");
        }
        done
    }

    /// One transaction for the batch; an abortable failure rewinds its partitions instead.
    fn commit(
        &mut self,
        records: &[OwnedMessage],
        states: &[Option<RetryState>],
        handoffs: &[Handoff],
        outcomes: &BTreeMap<&'static str, u64>,
        latencies: &[Duration],
        http_took: Duration,
    ) -> anyhow::Result<()> {
        let committing = Instant::now();
        let group = self
            .consumer
            .group_metadata()
            .context("the consumer has no group metadata")?;
        let batch = Batch {
            records,
            states,
            handoffs,
        };
        match handoff::commit(
            &self.producer,
            group,
            &self.opts.group_id,
            &self.opts.buckets,
            &batch,
            &mut self.hook,
        ) {
            Ok(()) => {}
            Err(Failed { error: e, refused }) if e.class == TxnErrorClass::Abortable => {
                let backoff = self.setbacks.set_back();
                self.backoff_until = Some(Instant::now() + backoff);
                let mut rights: BTreeSet<String> = refused
                    .iter()
                    .map(|topic| format!("Write on Topic {topic}"))
                    .collect();
                let group_refused = matches!(&e.cause, TxnCause::Kafka(k)
                    if k.rdkafka_error_code() == Some(RDKafkaErrorCode::GroupAuthorizationFailed));
                if group_refused {
                    // AddOffsetsToTxn or TxnOffsetCommit: Kafka authorises both as Read on the
                    // group, which a classic member's refused heartbeats name only at its
                    // session's end.
                    rights.insert(format!("Read on Group {}", self.opts.group_id));
                }
                if rights.is_empty() {
                    warn!(error = %e, records = records.len(), aborts_in_a_row = self.setbacks.in_a_row(), retry_in = ?backoff, "hand-off transaction aborted; the batch is read and delivered again");
                } else {
                    self.not_authorised(&rights, backoff);
                }
                m::aborted();
                self.stats.aborted += 1;
                let mut rewind = rewind_positions(records);
                if e.outcome_unknown() {
                    // The stuck commit may have landed (its EndTxn reached the coordinator before
                    // the new producer fenced it): where the group stands says which.
                    rewind = self.committed_or(rewind)?;
                }
                self.partitions()?.rewind(&self.consumer, &rewind)?;
                return Ok(());
            }
            Err(Failed { error: e, .. }) => {
                if e.is_fenced() {
                    crate::metrics::fenced();
                }
                return Err(anyhow!(e).context("committing a hand-off transaction"));
            }
        }
        let aborts = self.setbacks.reset();
        self.rights
            .group_answered("hand-off transaction committed its offsets");
        if !self.refused.is_empty() {
            let rights = std::mem::take(&mut self.refused);
            info!(rights = ?rights, after_aborts = aborts, "authorised again: hand-off transactions commit");
        } else if aborts > 1 {
            info!(after_aborts = aborts, "hand-off transactions commit again");
        }
        let mut by_topic: BTreeMap<String, u64> = BTreeMap::new();
        let mut given_up: BTreeMap<(&str, String, &str), (u64, &str)> = BTreeMap::new();
        for h in handoffs {
            *by_topic.entry(h.topic(&self.opts.buckets)).or_default() += 1;
            match h.target {
                Target::Bucket(_) => self.stats.retried += 1,
                Target::Dlq(_) => self.stats.dead_lettered += 1,
                Target::ParkingLot => self.stats.parked += 1,
            }
            if !matches!(h.target, Target::Bucket(_)) {
                debug!(subscriber = %h.subscriber, target = %h.topic(&self.opts.buckets), class = %h.error_class, error = %h.error_message, "delivery given up");
                given_up
                    .entry((
                        h.subscriber.as_str(),
                        h.topic(&self.opts.buckets),
                        h.error_class.as_str(),
                    ))
                    .or_insert((0, h.error_message.as_str()))
                    .0 += 1;
            }
        }
        // One line per subscriber, target and class in a batch, not one per record: a subscriber
        // that is gone parks every notification of every batch (the records are at debug level).
        for ((subscriber, target, class), (count, first)) in given_up {
            warn!(subscriber, target = %target, class, count, first_error = first, "deliveries given up");
        }
        for l in latencies {
            m::delivered(*l);
        }
        self.stats.records += records.len() as u64;
        self.stats.delivered += outcomes.get("delivered").copied().unwrap_or(0);
        self.stats.transactions += 1;
        // A line per batch at debug level (the chaos runner counts them: progress after a kill),
        // with where its time went: the deliveries, then the transaction.
        debug!(
            records = records.len(),
            handoffs = handoffs.len(),
            http_ms = http_took.as_millis() as u64,
            commit_ms = committing.elapsed().as_millis() as u64,
            "hand-off transaction committed"
        );
        m::committed(
            &outcomes.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>(),
            &by_topic.into_iter().collect::<Vec<_>>(),
        );
        Ok(())
    }

    /// Says that the hand-off transaction aborted because `rights` were refused (Write on a
    /// topic, Read on the group): one WARN line and one count of
    /// `alerts_not_authorised_total{right}` per right and abort, as the pipeline says it, until a
    /// commit succeeds (`authorised again`). The batch is retried after the growing back-off;
    /// nothing is skipped meanwhile.
    fn not_authorised(&mut self, rights: &BTreeSet<String>, backoff: Duration) {
        for right in rights {
            crate::kafka::access::say_refused(
                &self.opts.kafka,
                right,
                "hand-off transaction aborted and its batch rewound",
                self.setbacks.in_a_row(),
                backoff,
            );
            self.refused.insert(right.clone());
        }
    }

    /// The group's committed offset of each partition of `first` (read as stable, so after the
    /// transaction in doubt is decided), or the given offset where nothing is committed yet.
    fn committed_or(
        &self,
        first: BTreeMap<(String, i32), i64>,
    ) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
        let tpl = crate::kafka::tpl::positions_list(&first)?;
        let committed =
            crate::kafka::offsets::fetch_committed(&self.consumer, &tpl, REWIND_TIMEOUT)
                .context("reading the committed offsets after a commit in doubt")?;
        Ok(first
            .into_iter()
            .map(|((topic, p), at)| {
                let stored = committed
                    .find_partition(&topic, p)
                    .and_then(|e| match e.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    });
                ((topic, p), stored.unwrap_or(at))
            })
            .collect())
    }

    /// Sets each bucket's lag (owned partitions) and the age of its oldest held record, from the
    /// ends last read beside the loop: nothing here waits on the broker.
    fn bucket_gauges(&self) {
        let Some(ends) = &self.bucket_ends else {
            return;
        };
        let Ok(assigned) = self.consumer.assignment() else {
            return;
        };
        let positions = self.consumer.position().ok();
        // A copy: the watermark requests below are not made under the lock.
        let held: BTreeMap<(String, i32), Held> = match self.partitions() {
            Ok(p) => p.held().map(|(tp, h)| (tp.clone(), *h)).collect(),
            Err(_) => return,
        };
        let now = SystemTime::now();
        for topic in self.opts.buckets.bucket_topics() {
            let mut lag = 0;
            for e in assigned.elements().iter().filter(|e| e.topic() == topic) {
                let p = e.partition();
                let held = held.get(&(topic.clone(), p)).map(|h| h.offset);
                let position = held.or_else(|| {
                    positions
                        .as_ref()?
                        .find_partition(&topic, p)
                        .and_then(|x| match x.offset() {
                            Offset::Offset(o) => Some(o),
                            _ => None,
                        })
                });
                // A partition whose end has not been read yet is left out.
                if let (Some(end), Some(pos)) = (ends.end(&topic, p), position) {
                    lag += (end - pos).max(0);
                }
            }
            let oldest = held
                .iter()
                .filter(|((t, _), _)| *t == topic)
                .filter_map(|(_, h)| h.timestamp)
                .map(|ts| now.duration_since(from_millis(ts)).unwrap_or_default())
                .max()
                .unwrap_or_default();
            m::bucket(&topic, lag, oldest);
        }
    }
}
