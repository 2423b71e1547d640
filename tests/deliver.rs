//! alert-deliver on the real broker, with subscriber endpoints the tests control (local HTTP
//! servers): an outage longer than the first two buckets (nothing lost, the healthy subscriber's
//! latency stays bounded), the outcome classes (429 with Retry-After, 400, 410), and SIGKILLs
//! during hand-offs between buckets (no hand-off lost or doubled, counted per bucket against the
//! oracle). Bucket delays are short (`--buckets`), so each test takes seconds, not minutes.
//!
//! Every test runs under the suite's group protocol (`GROUP_PROTOCOL`, tests/common); the held
//! bucket partition moved away and back while paused also under the consumer protocol (KIP-848)
//! in every suite (`…_under_the_consumer_protocol`).

mod common;

use common::webhook::{Behaviour, Webhook};
use common::{free_addr, http_get, kafka, records_with_headers, Pipeline};
use price_alerts::kafka::config::GroupProtocol;
use price_alerts::kafka::feed::Feed;
use price_alerts::kafka::read::count_records;
use price_alerts::kafka::topics::{create_topics, Cleanup, DropTopics, TopicSpec};
use price_alerts::kafka::Isolation;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

const EXIT: Duration = Duration::from_secs(40);

/// One deliverer setup: a notifications topic, its buckets, subscribers.
struct Setup {
    prefix: String,
    topic: String,
    buckets: String,
    subscriptions: PathBuf,
    metrics_addr: String,
    /// The topic, its buckets, DLQ and parking lot go when the setup does.
    _topics: DropTopics,
}

impl Setup {
    /// Fresh topic (`partitions`), buckets, and a subscriptions file of (name, url) for every symbol.
    fn new(test: &str, partitions: i32, buckets: &str, subscribers: &[(&str, String)]) -> Self {
        Self::with_in_flight(test, partitions, buckets, subscribers, 8)
    }

    /// As [`Setup::new`], every subscriber with this `max_in_flight`.
    fn with_in_flight(
        test: &str,
        partitions: i32,
        buckets: &str,
        subscribers: &[(&str, String)],
        in_flight: usize,
    ) -> Self {
        let prefix = common::prefix(test);
        let _topics = common::drop_topics(&prefix);
        let topic = format!("{prefix}notifications");
        let spec = TopicSpec {
            name: topic.clone(),
            partitions,
            cleanup: Cleanup::Delete,
            retention: None,
        };
        futures::executor::block_on(create_topics(&kafka(), &[spec])).expect("creating the topic");
        let mut toml = String::new();
        for (name, url) in subscribers {
            toml.push_str(&format!("[subscribers.{name}]\nurl = \"{url}\"\nsymbols = [\"*\"]\nmax_in_flight = {in_flight}\n\n"));
        }
        let dir = std::env::temp_dir().join(format!("{prefix}deliver"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let subscriptions = dir.join("subscriptions.toml");
        std::fs::write(&subscriptions, toml).expect("writing subscriptions");
        Setup {
            prefix,
            topic,
            buckets: buckets.to_owned(),
            subscriptions,
            metrics_addr: free_addr(),
            _topics,
        }
    }

    fn bucket(&self, label: &str) -> String {
        format!("{}.retry.{label}", self.topic)
    }

    fn dlq(&self) -> String {
        format!("{}.dlq", self.topic)
    }

    fn parking_lot(&self) -> String {
        format!("{}.parking-lot", self.topic)
    }

    /// Starts alert-deliver (instance 0: a restart takes over its transactional id and group
    /// membership at once).
    fn spawn(&self) -> Pipeline {
        self.spawn_with(&[])
    }

    fn spawn_with(&self, extra: &[&str]) -> Pipeline {
        self.spawn_instance("0", &self.metrics_addr, extra)
    }

    /// Starts instance `instance` of alert-deliver, serving its metrics on `metrics_addr`.
    fn spawn_instance(&self, instance: &str, metrics_addr: &str, extra: &[&str]) -> Pipeline {
        let child = self
            .command(instance, metrics_addr, extra)
            .spawn()
            .expect("starting alert-deliver");
        Pipeline::from(child, instance)
    }

    /// The command line of instance `instance` (see [`Setup::spawn_instance`]).
    fn command(&self, instance: &str, metrics_addr: &str, extra: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_alert-deliver"));
        c.args(["--bootstrap", &kafka().bootstrap])
            .args([
                "--subscriptions",
                self.subscriptions.to_str().expect("utf-8 path"),
            ])
            .args(["--topic", &self.topic, "--buckets", &self.buckets])
            .args([
                "--app-id",
                &format!("{}app", self.prefix),
                "--instance-id",
                instance,
            ])
            .args([
                "--transaction-timeout",
                "30s",
                "--http-connect-timeout",
                "1s",
            ])
            .args(if extra.contains(&"--http-timeout") {
                &[][..]
            } else {
                &["--http-timeout", "2s"][..]
            })
            .args(["--metrics-addr", metrics_addr])
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,price_alerts=info".into()),
            )
            .stdin(std::process::Stdio::null());
        c
    }

    /// Waits until the deliverer answers /readyz.
    fn wait_ready(&self, p: &mut Pipeline) {
        wait_ready_at(&self.metrics_addr, p);
    }

    /// The deliverers' consumer group.
    fn group(&self) -> String {
        format!("{}app-deliver", self.prefix)
    }

    /// The topics the deliverers read: the notifications topic and every bucket.
    fn read_topics(&self) -> Vec<String> {
        let labels = self.buckets.split(',').map(|l| self.bucket(l.trim()));
        std::iter::once(self.topic.clone()).chain(labels).collect()
    }
}

/// Waits until the deliverer serving metrics on `addr` answers /readyz.
fn wait_ready_at(addr: &str, p: &mut Pipeline) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(addr, "/readyz").0 != 200 {
        assert!(
            matches!(p.child.try_wait(), Ok(None)),
            "alert-deliver exited before it was ready"
        );
        assert!(
            Instant::now() < deadline,
            "alert-deliver never became ready"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// A notification as the pipeline writes it, as far as a deliverer reads it.
fn notification(symbol: &str, seq: u64) -> (String, Vec<u8>) {
    let id = format!("{symbol}:{seq}:100:up");
    let v = serde_json::json!({"id": id, "symbol": symbol, "seq": seq, "threshold": "100", "direction": "up"});
    (id, serde_json::to_vec(&v).expect("json"))
}

/// Produces notifications `from..to` (symbols S0..S9), returning their ids.
fn produce(feed: &Feed, topic: &str, seqs: std::ops::Range<u64>) -> Vec<String> {
    let mut ids = Vec::new();
    let mut records = Vec::new();
    for seq in seqs {
        let symbol = format!("S{}", seq % 10);
        let (id, value) = notification(&symbol, seq);
        ids.push(id);
        records.push((Some(symbol.into_bytes()), value));
    }
    feed.send_raw(topic, &records)
        .expect("producing notifications");
    ids
}

fn keys(ids: &[String], subscriber: &str) -> BTreeSet<String> {
    ids.iter().map(|id| format!("{id}/{subscriber}")).collect()
}

/// Waits until `cond` holds, failing with `what` after `timeout`.
fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(100));
    }
}

/// (id, subscriber) of every record of `topic`, read_committed, with the header values `extra`.
fn handoffs(topic: &str, extra: &[&str]) -> Vec<(String, String, Vec<String>)> {
    records_with_headers(topic)
        .into_iter()
        .map(|r| {
            let v: serde_json::Value =
                serde_json::from_slice(r.value.as_deref().unwrap_or_default()).expect("json");
            let sub = r
                .headers
                .get("retry.subscriber")
                .cloned()
                .unwrap_or_default();
            let extra = extra
                .iter()
                .map(|k| r.headers.get(*k).cloned().unwrap_or_default())
                .collect();
            (v["id"].as_str().unwrap_or_default().to_owned(), sub, extra)
        })
        .collect()
}

/// Asserts `topic` holds exactly one record per id of `ids`, each for `subscriber`.
fn assert_exactly_once(topic: &str, ids: &[String], subscriber: &str) {
    assert_once(topic, ids, subscriber, true);
}

/// Asserts `topic` holds at most one record per id of `ids` (exactly one if `all`), each for
/// `subscriber`, and no other.
fn assert_once(topic: &str, ids: &[String], subscriber: &str, all: bool) {
    let got = handoffs(topic, &[]);
    let mut per: BTreeMap<&str, u32> = BTreeMap::new();
    for (id, sub, _) in &got {
        assert_eq!(sub, subscriber, "{topic}: a record for {sub}");
        *per.entry(id.as_str()).or_default() += 1;
    }
    let doubled: Vec<_> = per.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(doubled.is_empty(), "{topic}: doubled hand-offs {doubled:?}");
    let want: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let have: BTreeSet<&str> = per.keys().copied().collect();
    let unexpected: Vec<_> = have.difference(&want).take(5).collect();
    assert!(unexpected.is_empty(), "{topic}: unexpected {unexpected:?}");
    if all {
        let missing: Vec<_> = want.difference(&have).take(5).collect();
        assert!(missing.is_empty(), "{topic}: lost hand-offs {missing:?}");
        assert_eq!(got.len(), ids.len(), "{topic}: one record per notification");
    }
}

/// Nothing reached the DLQ or the parking lot.
fn assert_nothing_given_up(setup: &Setup) {
    assert_eq!(
        count_records(&kafka(), &setup.dlq(), Isolation::ReadCommitted).unwrap(),
        0,
        "the DLQ"
    );
    assert_eq!(
        count_records(&kafka(), &setup.parking_lot(), Isolation::ReadCommitted).unwrap(),
        0,
        "the parking lot"
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// A broker acknowledging a produce later than this is stalled (the shared machine's broker has
/// paused for seconds at a time: a KRaft controller event of 6.5 s, 30 s without a log line).
const BROKER_STALL: Duration = Duration::from_millis(750);
/// How long after a broker stall the deliverer may still be catching up on it (an aborted
/// transaction redone, a fetch session rebuilt).
const STALL_RECOVERY: Duration = Duration::from_secs(3);

/// A measured stream: when each notification was acknowledged, and when the broker itself stalled.
#[derive(Default)]
struct Fed {
    /// From the acknowledged produce: the deliverer's latency is measured from when it can read
    /// the record, so a slow produce does not count.
    sent_at: BTreeMap<String, SystemTime>,
    /// Windows in which a produce took longer than [`BROKER_STALL`].
    stalls: Vec<(SystemTime, SystemTime)>,
}

/// Produces 5 notifications every 100 ms (a live stream, not a burst), `chunks` times or for
/// `span` of time in which the broker did not stall (at most four times `span` in all),
/// whichever ends first, adding their ids to `ids`. A stall counts with its [`STALL_RECOVERY`],
/// as [`latencies`] leaves both out: a fresh-clone suite run had 3.3 s and 9.4 s stalls in an 8 s
/// span, and the feed, counting only the stalls, stopped with most of its stream left out.
fn produce_steadily(
    feed: &Feed,
    topic: &str,
    chunks: usize,
    span: Duration,
    ids: &mut Vec<String>,
) -> Fed {
    let started = Instant::now();
    let mut fed = Fed::default();
    let mut next = ids.len() as u64;
    let stalled = |fed: &Fed| {
        fed.stalls
            .iter()
            .map(|(a, b)| b.duration_since(*a).unwrap_or_default() + STALL_RECOVERY)
            .sum::<Duration>()
    };
    for _ in 0..chunks {
        let elapsed = started.elapsed();
        if elapsed.saturating_sub(stalled(&fed)) >= span || elapsed >= span.saturating_mul(4) {
            break;
        }
        let asked = SystemTime::now();
        let sent = produce(feed, topic, next..next + 5);
        let at = SystemTime::now();
        if at.duration_since(asked).unwrap_or_default() > BROKER_STALL {
            fed.stalls.push((asked, at));
        }
        for id in sent {
            fed.sent_at.insert(id.clone(), at);
            ids.push(id);
        }
        next += 5;
        thread::sleep(Duration::from_millis(100)); // input pacing: the stream's rate is the scenario
    }
    fed
}

/// From each notification's acknowledged produce to its first request at `hook` (for
/// `subscriber`): (count, p50, p99, max), leaving out the notifications whose wait overlapped a
/// broker stall (plus [`STALL_RECOVERY`]): those measure the broker, not the deliverer. Fails if
/// that leaves fewer than half of them.
fn latencies(hook: &Webhook, subscriber: &str, fed: &Fed) -> (usize, Duration, Duration, Duration) {
    let first_seen: BTreeMap<String, SystemTime> = hook
        .per_key()
        .into_iter()
        .map(|(k, rs)| (k, rs.iter().map(|r| r.at).min().expect("a request")))
        .collect();
    let stalled = |from: SystemTime, to: SystemTime| {
        fed.stalls
            .iter()
            .any(|(a, b)| from <= *b + STALL_RECOVERY && *a <= to)
    };
    let mut latencies: Vec<Duration> = fed
        .sent_at
        .iter()
        .map(|(id, at)| (*at, first_seen[&format!("{id}/{subscriber}")]))
        .filter(|(at, seen)| !stalled(*at, *seen))
        .map(|(at, seen)| seen.duration_since(at).unwrap_or_default())
        .collect();
    if !fed.stalls.is_empty() {
        let lost: Vec<Duration> = fed
            .stalls
            .iter()
            .map(|(a, b)| b.duration_since(*a).unwrap_or_default())
            .collect();
        eprintln!(
            "the broker stalled {lost:?}: {} of {} notifications left out of the latencies",
            fed.sent_at.len() - latencies.len(),
            fed.sent_at.len()
        );
    }
    assert!(
        latencies.len() * 2 >= fed.sent_at.len(),
        "the broker stalled through most of the measurement: {:?}",
        fed.stalls
    );
    latencies.sort();
    (
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1],
    )
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn an_outage_longer_than_two_buckets_loses_nothing_and_never_blocks_the_healthy_subscriber() {
    let mut down = Webhook::down(Behaviour::Ok);
    let healthy = Webhook::up(Behaviour::Ok);
    let setup = Setup::new(
        "deliver-outage",
        3,
        "1s,2s,10s",
        &[("down", down.url()), ("healthy", healthy.url())],
    );
    let mut deliverer = setup.spawn();
    setup.wait_ready(&mut deliverer);
    let feed = Feed::new(&kafka()).expect("feed");
    // A first notification, so the group has its partitions before the measured stream starts.
    let mut ids = produce(&feed, &setup.topic, 0..1);
    wait_until(
        "the healthy subscriber has the first notification",
        Duration::from_secs(60),
        || healthy.accepted().len() == 1,
    );

    // The measured stream: 200 notifications over about 4 s, the down subscriber refusing
    // connections throughout and for 6 s in all (longer than the first two buckets, 1 s + 2 s).
    let started = Instant::now();
    let fed = produce_steadily(&feed, &setup.topic, 40, Duration::MAX, &mut ids);
    let down_for = Duration::from_secs(6);
    thread::sleep(down_for.saturating_sub(started.elapsed())); // the outage's length is the scenario
    assert!(
        down.requests().is_empty(),
        "nothing answered while the endpoint was down"
    );
    down.start();

    wait_until(
        "both subscribers accepted every notification",
        Duration::from_secs(60),
        || down.accepted().len() == ids.len() && healthy.accepted().len() == ids.len(),
    );
    let aborted = gauge(
        &setup.metrics_addr,
        "alerts_deliver_transactions_total",
        "result",
        "aborted",
    );
    assert!(aborted >= 0.0, "the aborted transactions are counted");
    deliverer.signal("TERM");
    assert!(
        deliverer.wait(EXIT).success(),
        "alert-deliver stops cleanly"
    );

    // Every notification accepted once by key at each subscriber: 0 lost, nothing unexpected.
    assert_eq!(down.accepted(), keys(&ids, "down"));
    assert_eq!(healthy.accepted(), keys(&ids, "healthy"));
    // Every notification of the down subscriber went through the first bucket, once; only its
    // records are in any bucket; nothing reached the DLQ or the parking lot.
    // Every notification of the down subscriber went through the first bucket, once: unless a
    // hand-off transaction aborted (a broker stall timed a record out, seen on this shared
    // machine), and its batch, delivered again after the endpoint was back, needed no hand-off.
    assert_once(&setup.bucket("1s"), &ids, "down", aborted == 0.0);
    let second = handoffs(&setup.bucket("2s"), &[]);
    assert!(
        !second.is_empty() && second.iter().all(|(_, s, _)| s == "down"),
        "the second bucket was used, by `down` only"
    );
    assert!(handoffs(&setup.bucket("10s"), &[])
        .iter()
        .all(|(_, s, _)| s == "down"));
    assert_nothing_given_up(&setup);

    // No head-of-line blocking: the healthy subscriber's latency during the outage.
    let (n, p50, p99, max) = latencies(&healthy, "healthy", &fed);
    eprintln!(
        "healthy subscriber during the outage: n={n} p50={p50:?} p99={p99:?} max={max:?}; down subscriber: {} requests for {} keys",
        down.requests().len(),
        ids.len()
    );
    assert!(
        max < Duration::from_secs(2),
        "the healthy subscriber waited {max:?}: head-of-line blocking"
    );
}

/// The hanging-subscriber scenario's deliverer flags: a request timeout well above the latency
/// bound asserted below, so a batch that waits for a hanging call cannot meet it; a delivery
/// deadline of 1 s, which bounds the one batch that finds the endpoint hanging; the breaker opens
/// after 3 failures and probes every 2 s.
const HANG_ARGS: &[&str] = &[
    "--http-timeout",
    "4s",
    "--delivery-deadline",
    "1s",
    "--breaker-failures",
    "3",
    "--breaker-cooldown",
    "2s",
    // The lag watcher's second round (the one after the buckets exist) comes after this, not
    // after the default 15 s.
    "--lag-watch-interval",
    "2s",
];

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_hanging_subscriber_does_not_hold_up_the_healthy_one() {
    let hanging = Webhook::up(Behaviour::Ok);
    let healthy = Webhook::up(Behaviour::Ok);
    // The last bucket outlasts the hang plus a cool-down, so nothing needs the DLQ.
    let setup = Setup::new(
        "deliver-hang",
        3,
        "1s,2s,15s",
        &[("hanging", hanging.url()), ("healthy", healthy.url())],
    );
    let mut deliverer = setup.spawn_with(HANG_ARGS);
    setup.wait_ready(&mut deliverer);
    // The breaker's series from the first scrape, with HELP and TYPE; none of the processor's.
    let (_, exposed) = http_get(&setup.metrics_addr, "/metrics");
    for (name, kind) in [
        ("alerts_deliver_circuit_state", "gauge"),
        ("alerts_deliver_circuit_skipped_total", "counter"),
    ] {
        assert!(
            exposed.contains(&format!("# HELP {name} "))
                && exposed.contains(&format!("# TYPE {name} {kind}")),
            "{name}:\n{exposed}"
        );
        assert!(
            exposed.contains(&format!("{name}{{subscriber=\"hanging\"}} 0")),
            "{name} at zero:\n{exposed}"
        );
    }
    assert!(
        !exposed.contains("alerts_ticks_committed_total"),
        "the processor's metrics are not alert-deliver's:\n{exposed}"
    );
    // The group's lag on every partition it consumes, owned or not: the notifications and each
    // bucket, 3 partitions each (the watcher's first round may precede the buckets' creation; the
    // second comes after --lag-watch-interval, 2 s here).
    let consumed = [
        setup.topic.clone(),
        setup.bucket("1s"),
        setup.bucket("2s"),
        setup.bucket("15s"),
    ];
    wait_until(
        "alerts_group_lag for every partition the group consumes",
        Duration::from_secs(60),
        || {
            let body = http_get(&setup.metrics_addr, "/metrics").1;
            consumed.iter().all(|t| {
                body.lines()
                    .filter(|l| {
                        l.starts_with("alerts_group_lag{") && l.contains(&format!("topic=\"{t}\""))
                    })
                    .count()
                    == 3
            })
        },
    );
    let feed = Feed::new(&kafka()).expect("feed");
    // A first notification, accepted by both, so the group has its partitions before the hang.
    let mut ids = produce(&feed, &setup.topic, 0..1);
    wait_until(
        "both subscribers have the first notification",
        Duration::from_secs(60),
        || hanging.accepted().len() == 1 && healthy.accepted().len() == 1,
    );

    // The measured stream: 5 notifications every 100 ms for 8 s (not counting stalls of the
    // broker), during which one endpoint takes every request and never answers.
    hanging.hang();
    let fed = produce_steadily(
        &feed,
        &setup.topic,
        usize::MAX,
        Duration::from_secs(8),
        &mut ids,
    );
    assert_eq!(
        hanging.accepted().len(),
        1,
        "nothing answered while the endpoint hung"
    );
    let metric = |name: &str, subscriber: &str| {
        let body = http_get(&setup.metrics_addr, "/metrics").1;
        let series = format!("{name}{{subscriber=\"{subscriber}\"}} ");
        body.lines()
            .find_map(|l| l.strip_prefix(&series)?.trim().parse::<f64>().ok())
            .unwrap_or(-1.0)
    };
    // The breaker: open (1) or probing (2) for the hanging subscriber, closed for the healthy one;
    // the hanging subscriber's deliveries skipped, none of the healthy one's.
    assert!(
        metric("alerts_deliver_circuit_state", "hanging") >= 1.0,
        "the hanging subscriber's circuit is open"
    );
    assert_eq!(metric("alerts_deliver_circuit_state", "healthy"), 0.0);
    let skipped = metric("alerts_deliver_circuit_skipped_total", "hanging");
    assert!(
        skipped > 0.0,
        "deliveries to the hanging subscriber were skipped"
    );
    assert_eq!(
        metric("alerts_deliver_circuit_skipped_total", "healthy"),
        0.0
    );
    hanging.recover();

    wait_until(
        "both subscribers accepted every notification",
        Duration::from_secs(60),
        || hanging.accepted().len() == ids.len() && healthy.accepted().len() == ids.len(),
    );
    wait_until(
        "a probe closed the circuit again",
        Duration::from_secs(10),
        || metric("alerts_deliver_circuit_state", "hanging") == 0.0,
    );
    deliverer.signal("TERM");
    assert!(
        deliverer.wait(EXIT).success(),
        "alert-deliver stops cleanly"
    );

    // Every (notification, subscriber) accepted once by key: 0 lost, nothing unexpected; only the
    // hanging subscriber's records in the buckets; nothing dead-lettered or parked.
    assert_eq!(hanging.accepted(), keys(&ids, "hanging"));
    assert_eq!(healthy.accepted(), keys(&ids, "healthy"));
    for b in ["1s", "2s", "15s"] {
        assert!(
            handoffs(&setup.bucket(b), &[])
                .iter()
                .all(|(_, s, _)| s == "hanging"),
            "bucket {b}: `hanging` only"
        );
    }
    assert_nothing_given_up(&setup);

    let (n, p50, p99, max) = latencies(&healthy, "healthy", &fed);
    eprintln!(
        "healthy subscriber while the other hung for 8 s: n={n} p50={p50:?} p99={p99:?} max={max:?}; hanging subscriber: {} answered requests for {} keys, {skipped} deliveries skipped by its open circuit",
        hanging.requests().len(),
        ids.len()
    );
    // Head-of-line blocking holds up every healthy delivery of each batch that waits for a
    // hanging call (4 s, the request timeout) until the breaker opens: a batch or more of the
    // stream, over 1% of it. One wait of seconds alone is the broker's: in a fresh-clone suite run
    // (2026-12-03) the group coordinator stalled while every produce of the feed went through (a
    // hand-off commit of 9.9 s, the session timed out), and one healthy delivery waited 10.2 s
    // with p99 at 0.91 s. So the bound is on the 99th percentile.
    assert!(
        p99 < Duration::from_secs(2),
        "the healthy subscriber's p99 was {p99:?} (max {max:?}): head-of-line blocking"
    );
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn retry_after_is_honoured_400_dead_letters_at_once_and_410_parks() {
    let throttled = Webhook::up(Behaviour::TooManyOnce {
        retry_after_secs: 2,
    });
    let refusing = Webhook::up(Behaviour::Status(400));
    let gone = Webhook::up(Behaviour::Status(410));
    let subs = [
        ("throttled", throttled.url()),
        ("refusing", refusing.url()),
        ("gone", gone.url()),
    ];
    let setup = Setup::new("deliver-classes", 2, "500ms,1s,3s", &subs);
    let feed = Feed::new(&kafka()).expect("feed");
    let ids = produce(&feed, &setup.topic, 0..20);
    let deliverer = setup.spawn();
    wait_until(
        "every notification is accepted, dead-lettered or parked",
        Duration::from_secs(60),
        || {
            throttled.accepted().len() == ids.len()
                && count_records(&kafka(), &setup.dlq(), Isolation::ReadCommitted).unwrap_or(0)
                    >= ids.len() as u64
                && count_records(&kafka(), &setup.parking_lot(), Isolation::ReadCommitted)
                    .unwrap_or(0)
                    >= ids.len() as u64
        },
    );
    deliverer.signal("TERM");
    assert!(
        deliverer.wait(EXIT).success(),
        "alert-deliver stops cleanly"
    );

    // 429: tried again not before Retry-After (2 s, longer than the first bucket's 500 ms).
    assert_eq!(throttled.accepted(), keys(&ids, "throttled"));
    for (key, rs) in throttled.per_key() {
        assert_eq!(rs[0].status, 429, "{key}");
        let gap = rs[1].at.duration_since(rs[0].at).unwrap_or_default();
        assert!(
            gap >= Duration::from_millis(2000),
            "{key}: tried again {gap:?} after its 429"
        );
    }
    assert_exactly_once(&setup.bucket("500ms"), &ids, "throttled");
    // 400: the DLQ at once, one request per key; 410: the parking lot, one request per key.
    for (hook, name) in [(&refusing, "refusing"), (&gone, "gone")] {
        let per = hook.per_key();
        assert_eq!(
            per.keys().cloned().collect::<BTreeSet<_>>(),
            keys(&ids, name)
        );
        assert!(
            per.values().all(|rs| rs.len() == 1),
            "{name}: never retried"
        );
    }
    assert_exactly_once(&setup.dlq(), &ids, "refusing");
    assert_exactly_once(&setup.parking_lot(), &ids, "gone");
    for (_, _, h) in handoffs(
        &setup.dlq(),
        &["dlq.error.class", "dlq.original.topic", "retry.error.class"],
    ) {
        assert_eq!(h, ["delivery.permanent", setup.topic.as_str(), "http.4xx"]);
    }
    for (_, _, h) in handoffs(&setup.parking_lot(), &["dlq.error.class"]) {
        assert_eq!(h, ["delivery.gone"]);
    }
    for b in ["1s", "3s"] {
        assert_eq!(
            count_records(&kafka(), &setup.bucket(b), Isolation::ReadCommitted).unwrap(),
            0,
            "bucket {b}"
        );
    }
    dlq_tooling_takes_what_it_selects(&setup, ids.len() as u64);
}

/// `--exit-when-idle` (the demo's stop) waits for what the buckets still hold: every first
/// request is refused, and the first bucket's delay is three times the idle time, so the
/// deliverer polls nothing between the hand-offs and their due times and must not stop before
/// the retries are accepted.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn exit_when_idle_waits_for_the_retries_the_buckets_hold() {
    exit_when_idle_delivers_everything("deliver-idle", "1s");
}

/// The same with an idle time far shorter than a fetch: quiet for that long proves nothing. A
/// fresh-clone suite run (2026-12-03) saw the deliverer above stop 3.4 s after handing its ten
/// retries to the first bucket, none read back yet (the broker was slow), with `--exit-when-idle
/// 1s`; at 1 ms it stopped so every time.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn exit_when_idle_stops_only_once_every_partition_owned_is_read_to_its_end() {
    exit_when_idle_delivers_everything("deliver-idle-1ms", "1ms");
}

fn exit_when_idle_delivers_everything(test: &str, idle: &str) {
    let throttled = Webhook::up(Behaviour::TooManyOnce {
        retry_after_secs: 1,
    });
    let subs = [("throttled", throttled.url())];
    let setup = Setup::new(test, 2, "3s,5s", &subs);
    let feed = Feed::new(&kafka()).expect("feed");
    let ids = produce(&feed, &setup.topic, 0..10);
    let deliverer = setup.spawn_with(&["--exit-when-idle", idle]);
    let status = deliverer.wait(Duration::from_secs(60));
    assert!(status.success(), "alert-deliver stops by itself: {status}");
    assert_eq!(
        throttled.accepted(),
        keys(&ids, "throttled"),
        "every retry was delivered before it stopped"
    );
    assert_exactly_once(&setup.bucket("3s"), &ids, "throttled");
}

/// An abort that comes back on every attempt (here a hook; in production a right refused on a
/// bucket, a coordinator that keeps failing) must not turn the loop into a hot one: each abort
/// rewinds the batch, and the next attempt delivers it again, so without a back-off every
/// subscriber receives the same requests as fast as the loop spins. Once the cause goes, the
/// batch commits and nothing is handed off twice.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn an_abort_on_every_attempt_backs_off_instead_of_redelivering_in_a_hot_loop() {
    let hook = Webhook::up(Behaviour::Ok);
    let subs = [("steady", hook.url())];
    let setup = Setup::new("deliver-aborts", 1, "1s", &subs);
    let aborting = std::env::temp_dir().join(format!("{}abort", setup.prefix));
    std::fs::write(&aborting, b"").expect("the abort file");
    let feed = Feed::new(&kafka()).expect("feed");
    let ids = produce(&feed, &setup.topic, 0..5);
    let aborting_arg = aborting.to_str().expect("utf-8 path");
    let deliverer = setup.spawn_with(&["--test-abort-handoffs-while", aborting_arg]);
    wait_until("the first attempt", Duration::from_secs(60), || {
        !hook.requests().is_empty()
    });
    let first = Instant::now();
    // Six seconds of aborts: a back-off of 100 ms doubling per abort in a row allows about six
    // attempts; a loop without one makes hundreds.
    std::thread::sleep(Duration::from_secs(6));
    let during = hook.requests().len();
    let waited = first.elapsed();
    std::fs::remove_file(&aborting).expect("removing the abort file");
    wait_until(
        "every notification accepted",
        Duration::from_secs(30),
        || hook.accepted().len() == ids.len(),
    );
    deliverer.signal("TERM");
    assert!(
        deliverer.wait(EXIT).success(),
        "alert-deliver stops cleanly"
    );
    let attempts = during / ids.len();
    println!(
        "{during} requests for {} notifications in {waited:?} of aborts",
        ids.len()
    );
    assert!(
        (2..=10).contains(&attempts),
        "{attempts} attempts per notification in {waited:?} of aborts: the loop must back off"
    );
    assert_eq!(hook.accepted(), keys(&ids, "steady"));
}

/// A subscriber that is gone parks every notification: the log says so once per batch (with the
/// count and the first error), not once per record, so a batch of thousands does not flood it.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn deliveries_given_up_are_logged_once_per_batch_not_once_per_record() {
    let gone = Webhook::up(Behaviour::Status(410));
    let subs = [("gone", gone.url())];
    let setup = Setup::new("deliver-log", 2, "1s", &subs);
    let feed = Feed::new(&kafka()).expect("feed");
    let ids = produce(&feed, &setup.topic, 0..200);
    let log_path = std::env::temp_dir().join(format!("{}deliver.log", setup.prefix));
    let log = std::fs::File::create(&log_path).expect("the log file");
    let mut command = setup.command("0", &setup.metrics_addr, &["--exit-when-idle", "1s"]);
    command
        .env("RUST_LOG", "warn,price_alerts=info")
        .stderr(log);
    let deliverer = Pipeline::from(command.spawn().expect("starting alert-deliver"), "0");
    assert!(
        deliverer.wait(Duration::from_secs(60)).success(),
        "alert-deliver stops by itself"
    );
    assert_exactly_once(&setup.parking_lot(), &ids, "gone");
    let text = std::fs::read_to_string(&log_path).expect("reading the log");
    let _ = std::fs::remove_file(&log_path);
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("given up")).collect();
    let logged: u64 = lines
        .iter()
        .map(|l| {
            l.split("count=")
                .nth(1)
                .and_then(|c| c.split_whitespace().next())
                .and_then(|c| c.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("a given-up line without its count: {l}"))
        })
        .sum();
    println!(
        "{} lines for {} parked notifications",
        lines.len(),
        ids.len()
    );
    assert_eq!(
        logged,
        ids.len() as u64,
        "the lines count every parked delivery"
    );
    assert!(
        lines.len() * 10 <= ids.len(),
        "{} given-up lines for {} records: one per batch, not one per record",
        lines.len(),
        ids.len()
    );
}

/// The DLQ tooling on alert-deliver's DLQ: inspect groups by subscriber; a replay filtered by
/// subscriber with a limit takes exactly what it selects, a dry run writes nothing, and what a
/// filter did not take is replayed by the next run.
fn dlq_tooling_takes_what_it_selects(setup: &Setup, n: u64) {
    use price_alerts::tools::replay::{inspect, replay, InspectOptions, ReplayOptions, Selection};
    let look = || {
        let opts = InspectOptions {
            kafka: kafka(),
            dlq: setup.dlq(),
            select: Selection::all(),
            show: 1,
            payload: false,
        };
        inspect(&opts).expect("inspect")
    };
    let found = look();
    assert_eq!(found.by["subscriber"]["refusing"].unhandled, n);
    assert_eq!(found.by["class"]["delivery.permanent"].unhandled, n);
    assert!(found.oldest_unhandled.is_some() && found.newest_unhandled.is_some());
    assert!(found.shown[0].payload.is_none(), "no payload unless asked");
    assert!(found.shown[0]
        .headers
        .iter()
        .any(|h| h.key == "retry.subscriber" && h.value == "refusing"));

    let into_bucket = |subscriber: &str, limit: Option<u64>, dry_run: bool| {
        let opts = ReplayOptions {
            select: Selection::all().for_subscribers(&[subscriber.to_owned()]),
            limit,
            dry_run,
            to: Some(setup.bucket("500ms")),
            ..ReplayOptions::new(kafka(), setup.dlq())
        };
        replay(&opts).expect("replay")
    };
    let bucket_before =
        count_records(&kafka(), &setup.bucket("500ms"), Isolation::ReadCommitted).unwrap();
    assert_eq!(
        into_bucket("nobody", None, false).total_replayed(),
        0,
        "another subscriber's filter takes none"
    );
    assert_eq!(
        into_bucket("refusing", None, true).total_replayed(),
        n,
        "a dry run counts them all"
    );
    assert_eq!(into_bucket("refusing", Some(5), false).total_replayed(), 5);
    let after = look();
    assert_eq!(
        (after.total.handled, after.total.unhandled),
        (5, n - 5),
        "the limit left the others unhandled"
    );
    assert_eq!(
        into_bucket("refusing", None, false).total_replayed(),
        n - 5,
        "and the next run takes them"
    );
    assert_eq!(look().total.unhandled, 0);
    let copies = count_records(&kafka(), &setup.bucket("500ms"), Isolation::ReadCommitted).unwrap()
        - bucket_before;
    assert_eq!(
        copies, n,
        "each dead letter replayed once; the dry run wrote nothing"
    );
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn sigkill_during_hand_offs_neither_loses_nor_doubles_one() {
    // A slow failing endpoint (20 ms a request, 2 at a time), so every stage's hand-offs spread
    // over many transactions and the kills land while records move between buckets.
    let failing = Webhook::up(Behaviour::StatusAfter(503, Duration::from_millis(20)));
    let healthy = Webhook::up(Behaviour::Ok);
    let subs = [("failing", failing.url()), ("healthy", healthy.url())];
    let setup = Setup::with_in_flight("deliver-kill", 3, "300ms,600ms,900ms", &subs, 2);
    // No breaker: this test counts every failing subscriber's record through every bucket with
    // four real attempts; an open circuit would hand records on untried. Static membership: each
    // restart (the same instance id) takes the partitions back at once.
    // A generous HTTP timeout: on a loaded machine the healthy subscriber may take seconds to
    // answer, and a timed-out delivery to it would (rightly) go to a retry bucket, which this
    // test counts for the failing subscriber only.
    // Batches of 100 records, as the crash points below count them: each stage's hand-offs
    // spread over two transactions, so the crashes and kills land inside a stage (the default
    // batch takes all 150 records at once).
    // Under the consumer protocol (GROUP_PROTOCOL=consumer) dynamic membership: each restart
    // waits for the broker's session of the killed member (common::restart_membership).
    let protocol = common::suite_protocol();
    let no_breaker: Vec<&str> = [
        "--breaker-failures",
        "0",
        "--http-timeout",
        "10s",
        "--max-batch",
        "100",
    ]
    .into_iter()
    .chain(common::restart_membership(protocol).iter().copied())
    .collect();
    let stage_within = Duration::from_secs(60) + common::session_timeout(protocol, Duration::ZERO);
    let feed = Feed::new(&kafka()).expect("feed");
    let ids = produce(&feed, &setup.topic, 0..150);
    // Crashes inside open hand-off transactions, their records already in the log: after 30
    // hand-offs (into the first bucket), then after 180 (the 150 of the first bucket committed,
    // the 30th from the first bucket into the second).
    for after in ["30", "180"] {
        let crashed = setup
            .spawn_with(&[&no_breaker[..], &["--test-crash-after-handoffs", after]].concat())
            .wait(Duration::from_secs(90));
        assert!(!crashed.success(), "the hook crashed it");
    }
    let mut deliverer = setup.spawn_with(&no_breaker);
    // SIGKILLs once each stage is under way: hand-offs into every bucket and into the DLQ.
    let stages = [
        setup.bucket("300ms"),
        setup.bucket("300ms"),
        setup.bucket("600ms"),
        setup.bucket("900ms"),
        setup.dlq(),
    ];
    let mut kills = 2;
    for (i, topic) in stages.iter().enumerate() {
        let at_least = 20 + 40 * (i as u64 % 2);
        wait_until(
            &format!("{topic} has {at_least} hand-offs"),
            stage_within,
            || count_records(&kafka(), topic, Isolation::ReadCommitted).unwrap_or(0) >= at_least,
        );
        deliverer.signal_if_running("KILL");
        let _ = deliverer.wait(EXIT);
        kills += 1;
        deliverer = setup.spawn_with(&no_breaker);
    }
    wait_until(
        "every failing delivery reached the DLQ",
        Duration::from_secs(120) + common::session_timeout(protocol, Duration::ZERO),
        || {
            count_records(&kafka(), &setup.dlq(), Isolation::ReadCommitted).unwrap_or(0)
                >= ids.len() as u64
                && healthy.accepted().len() == ids.len()
        },
    );
    // The last restart may have come after the DLQ was full: a SIGTERM before its handler is in
    // place would end it as the default action does.
    setup.wait_ready(&mut deliverer);
    deliverer.signal("TERM");
    assert!(
        deliverer.wait(EXIT).success(),
        "alert-deliver stops cleanly"
    );
    // How many hand-offs the kills left behind in aborted transactions (visible read_uncommitted).
    let aborted: Vec<u64> = stages[1..]
        .iter()
        .map(|t| {
            count_records(&kafka(), t, Isolation::ReadUncommitted).unwrap()
                - count_records(&kafka(), t, Isolation::ReadCommitted).unwrap()
        })
        .collect();
    eprintln!(
        "{kills} crashes (2 inside a hand-off transaction, the rest SIGKILLs); aborted hand-offs per bucket and DLQ: {aborted:?}; the failing subscriber saw {} requests for {} keys",
        failing.requests().len(),
        ids.len()
    );
    // Each crash left the hand-offs of its open transaction behind, aborted: how many depends on
    // where the batches split (the first crash's 30 hand-offs may span two transactions).
    assert!(
        aborted[0] >= 1 && aborted[1] >= 1,
        "the crashes left aborted hand-offs behind: {aborted:?}"
    );

    // Each (notification, failing) passed every bucket once and reached the DLQ once.
    for b in ["300ms", "600ms", "900ms"] {
        assert_exactly_once(&setup.bucket(b), &ids, "failing");
    }
    assert_exactly_once(&setup.dlq(), &ids, "failing");
    for (_, _, h) in handoffs(
        &setup.dlq(),
        &["dlq.error.class", "dlq.attempts", "retry.error.class"],
    ) {
        assert_eq!(h, ["delivery.transient.exhausted", "4", "http.5xx"]);
    }
    assert_eq!(
        count_records(&kafka(), &setup.parking_lot(), Isolation::ReadCommitted).unwrap(),
        0
    );
    assert_eq!(
        healthy.accepted(),
        keys(&ids, "healthy"),
        "the healthy subscriber accepted each once by key"
    );
    // At least once over HTTP: every attempt of the failing subscriber was made at least once.
    let per = failing.per_key();
    assert!(
        per.len() == ids.len() && per.values().all(|rs| rs.len() >= 4),
        "four attempts per key at least"
    );
}

/// Retry records as a deliverer hands them to a bucket, for `subscriber`: (notification seq,
/// due time), all of symbol S0, written to `topic` in ONE transaction, so that a read_committed
/// reader gets them all at once (one fetch). Returns their ids.
fn produce_retries(topic: &str, subscriber: &str, records: &[(u64, SystemTime)]) -> Vec<String> {
    use price_alerts::deliver::buckets::{format_time, ATTEMPT, NEXT_DUE_AT, SUBSCRIBER};
    use price_alerts::kafka::txn::TxnProducer;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::BaseRecord;
    let producer = TxnProducer::start(
        &kafka(),
        &format!("{topic}-writer"),
        Duration::from_secs(30),
    )
    .expect("a transactional producer");
    producer.begin().expect("begin");
    let mut ids = Vec::new();
    for (seq, due) in records {
        let (id, value) = notification("S0", *seq);
        let due = format_time(*due);
        let headers = [
            (SUBSCRIBER, subscriber),
            (ATTEMPT, "1"),
            (NEXT_DUE_AT, &due),
        ]
        .into_iter()
        .fold(OwnedHeaders::new(), |h, (key, value)| {
            h.insert(Header {
                key,
                value: Some(value),
            })
        });
        let record = BaseRecord::<[u8], [u8]>::to(topic)
            .key(b"S0".as_slice())
            .payload(value.as_slice())
            .headers(headers);
        producer.send(record).expect("send");
        ids.push(id);
    }
    producer.commit().expect("commit");
    ids
}

/// The partitions of each member of a Stable `group`, as the broker assigned them (no member
/// while the group rebalances or is empty).
fn group_assignment(group: &str, protocol: GroupProtocol) -> Vec<BTreeSet<(String, i32)>> {
    if protocol == GroupProtocol::Consumer {
        return consumer_group_assignment(group);
    }
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let client: BaseConsumer = kafka().admin().create().expect("a client");
    let Ok(list) = client.fetch_group_list(Some(group), Duration::from_secs(10)) else {
        return Vec::new();
    };
    list.groups()
        .iter()
        .filter(|g| g.state() == "Stable")
        .flat_map(|g| g.members())
        .map(|m| m.assignment().map(parse_assignment).unwrap_or_default())
        .collect()
}

/// [`group_assignment`] of a group of the consumer protocol (KIP-848), which DescribeGroups does
/// not describe (ConsumerGroupDescribe does; rust-rdkafka has no call for it): each member's
/// CURRENT-ASSIGNMENT as `kafka-consumer-groups --describe --members --verbose` prints it
/// (`topic:0,1;other:0`, or `-`), none while the tool says the group is rebalancing.
fn consumer_group_assignment(group: &str) -> Vec<BTreeSet<(String, i32)>> {
    let out = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka.sh"))
        .args([
            "tool",
            "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
            "--bootstrap-server",
            &kafka().bootstrap,
            "--describe",
            "--members",
            "--verbose",
            "--group",
            group,
        ])
        .output()
        .expect("running kafka-consumer-groups");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success()
        || text.contains("is rebalancing")
        || text.contains("has no active members")
    {
        return Vec::new();
    }
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let Some(column) =
        lines.find_map(|l| l.split_whitespace().position(|h| h == "CURRENT-ASSIGNMENT"))
    else {
        return Vec::new();
    };
    lines
        .filter(|l| l.starts_with(group))
        .map(|l| {
            let cell = l.split_whitespace().nth(column).unwrap_or("-");
            let mut owned = BTreeSet::new();
            for topic in cell.split(';').filter(|t| *t != "-") {
                let (name, partitions) = topic.rsplit_once(':').expect("topic:partitions");
                for p in partitions.split(',') {
                    owned.insert((name.to_owned(), p.parse().expect("a partition")));
                }
            }
            owned
        })
        .collect()
}

/// A consumer protocol assignment (version, [topic, [partition]], user data), big-endian.
fn parse_assignment(mut b: &[u8]) -> BTreeSet<(String, i32)> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        (b.len() >= n).then(|| {
            let (head, tail) = b.split_at(n);
            *b = tail;
            head
        })
    }
    fn int(b: &mut &[u8], n: usize) -> Option<i64> {
        let bytes = take(b, n)?;
        Some(bytes.iter().fold(0i64, |acc, x| (acc << 8) | i64::from(*x)))
    }
    let mut out = BTreeSet::new();
    let parsed = (|| {
        int(&mut b, 2)?; // version
        for _ in 0..int(&mut b, 4)? {
            let len = int(&mut b, 2)? as usize;
            let topic = String::from_utf8_lossy(take(&mut b, len)?).into_owned();
            for _ in 0..int(&mut b, 4)? {
                out.insert((topic.clone(), int(&mut b, 4)? as i32));
            }
        }
        Some(())
    })();
    assert!(parsed.is_some(), "a malformed assignment");
    out
}

/// A gauge of `name{label="value"}` served at `addr` (-1 while it is not there).
fn gauge(addr: &str, name: &str, label: &str, value: &str) -> f64 {
    let body = http_get(addr, "/metrics").1;
    let series = format!("{name}{{{label}=\"{value}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse::<f64>().ok())
        .unwrap_or(-1.0)
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn an_aborted_hand_off_reads_a_held_partition_again_from_the_rewind() {
    aborted_hand_off_reads_a_held_partition_again("deliver-abort-held", &[]);
}

/// The same when librdkafka fails the abort fatally (EndTxn answered INVALID_TXN_STATE, seen on
/// the 3-broker cluster after an AddOffsetsToTxn timed out on a stalled coordinator): the hook
/// leaves the transaction open on the broker, and the deliverer makes its producer again, whose
/// registration aborts it. It goes on without a restart, and nothing is skipped or doubled.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_hand_off_abort_that_fails_fatally_is_completed_by_registering_again() {
    aborted_hand_off_reads_a_held_partition_again(
        "deliver-fatal-abort",
        &["--test-aborts-fail-fatally"],
    );
}

fn aborted_hand_off_reads_a_held_partition_again(test: &str, extra: &[&str]) {
    let failing = Webhook::up(Behaviour::Status(503));
    let setup = Setup::new(test, 1, "1s,2s,60s", &[("failing", failing.url())]);
    // The hook aborts the first hand-off transaction; no breaker, so every delivery is tried.
    let args = [
        &["--test-abort-handoff-txn", "1", "--breaker-failures", "0"],
        extra,
    ]
    .concat();
    let mut deliverer = setup.spawn_with(&args);
    setup.wait_ready(&mut deliverer);
    wait_until(
        "the deliverer owns its partitions",
        Duration::from_secs(60),
        || {
            group_assignment(&setup.group(), common::suite_protocol())
                .iter()
                .map(BTreeSet::len)
                .sum::<usize>()
                == 4
        },
    );
    // One partition of the first bucket: 10 records due already, then 10 due in 8 s, visible in
    // one fetch. The first 10 make the first batch (aborted by the hook); the 11th holds the
    // partition (paused) while that batch is delivered and aborted.
    let now = SystemTime::now();
    let later = now + Duration::from_secs(8);
    let records: Vec<(u64, SystemTime)> = (0..20)
        .map(|i| {
            (
                i,
                if i < 10 {
                    now - Duration::from_secs(1)
                } else {
                    later
                },
            )
        })
        .collect();
    let ids = produce_retries(&setup.bucket("1s"), "failing", &records);
    let second = setup.bucket("2s");
    let handed = || count_records(&kafka(), &second, Isolation::ReadCommitted).unwrap_or(0);
    // Until all 20 are handed to the second bucket, or well past the late ones' due time.
    let deadline = Instant::now() + Duration::from_secs(8 + 40);
    while handed() < 20 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(200));
    }
    let aborts = gauge(
        &setup.metrics_addr,
        "alerts_deliver_transactions_total",
        "result",
        "aborted",
    );
    deliverer.signal_if_running("TERM");
    assert!(
        deliverer.wait(EXIT).success(),
        "alert-deliver stops cleanly"
    );

    // The hook aborted the first transaction: the 10 records due at once, and only them (had the
    // late ones not been held, they would have been in the same batch).
    let aborted = count_records(&kafka(), &second, Isolation::ReadUncommitted).unwrap()
        - count_records(&kafka(), &second, Isolation::ReadCommitted).unwrap();
    if aborts == 1.0 {
        assert_eq!(aborted, 10, "the aborted transaction held the due records");
    } else {
        // A broker stall aborted another transaction too (seen on this shared machine).
        assert!(
            aborts > 1.0 && aborted >= 10,
            "{aborts} aborts, {aborted} records"
        );
    }
    // Each record handed on once: none skipped by the rewind, none doubled.
    assert_exactly_once(&second, &ids, "failing");
    // The late ones were held until due.
    let per = failing.per_key();
    for id in &ids[10..] {
        let first = per[&format!("{id}/failing")][0].at;
        assert!(
            first + Duration::from_millis(1) >= later,
            "{id} was tried before it was due"
        );
    }
}

/// The end of `topic` [0] as a read_committed reader sees it (the last stable offset).
fn committed_end(topic: &str) -> i64 {
    use rdkafka::consumer::Consumer;
    let reader =
        price_alerts::kafka::read::reader(&kafka(), Isolation::ReadCommitted).expect("a reader");
    reader
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .expect("the watermarks")
        .1
}

/// The bucket gauges: a held (paused) bucket partition's lag is its end minus the held head, and
/// it follows records that arrive while the partition stays paused; the oldest age is the held
/// head's. The ends are read beside the loop (`deliver::gauges`), not in it.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn bucket_gauges_follow_a_held_partition_while_it_stays_paused() {
    let failing = Webhook::up(Behaviour::Status(503));
    let setup = Setup::new(
        "deliver-gauges",
        1,
        "1s,2s,60s",
        &[("failing", failing.url())],
    );
    let bucket = setup.bucket("1s");
    let mut deliverer = setup.spawn_with(&[]);
    setup.wait_ready(&mut deliverer);
    let lag = || {
        gauge(
            &setup.metrics_addr,
            "alerts_deliver_bucket_lag",
            "topic",
            &bucket,
        )
    };
    let age = || {
        gauge(
            &setup.metrics_addr,
            "alerts_deliver_bucket_oldest_age_seconds",
            "topic",
            &bucket,
        )
    };
    // Retries due in two minutes: the first holds the partition, paused, at offset 0.
    let before = SystemTime::now();
    let due = before + Duration::from_secs(120);
    // Writes retries `seqs` in one transaction; once the bucket's stable end is `end` (the commit
    // marker reaches the partition after EndTxn returns), the lag must come to `end` too: a
    // refresh every 5 s, its ends read at most 5 s before it, so within 30 s on a loaded machine.
    let add = |seqs: std::ops::Range<u64>, end: i64, what: &str| {
        produce_retries(
            &bucket,
            "failing",
            &seqs.map(|i| (i, due)).collect::<Vec<_>>(),
        );
        wait_until("the bucket's stable end", Duration::from_secs(30), || {
            committed_end(&bucket) == end
        });
        wait_until(what, Duration::from_secs(30), || lag() == end as f64);
    };
    // Five records and a marker.
    add(0..5, 6, "the lag of the held partition");
    let oldest = age();
    assert!(
        oldest > 0.0 && oldest <= before.elapsed().expect("clock").as_secs_f64() + 1.0,
        "the held head's age: {oldest} s"
    );
    // Seven more and a marker behind the held head, while the partition stays paused.
    add(5..12, 14, "the lag with the records behind the head");
    assert!(failing.requests().is_empty(), "nothing was due yet");
    deliverer.signal("TERM");
    assert!(
        deliverer.wait(EXIT).success(),
        "alert-deliver stops cleanly"
    );
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_held_bucket_partition_moved_away_and_back_while_paused_is_read_again() {
    held_bucket_partition_moved_away_and_back(common::suite_protocol());
}

/// Under the consumer protocol the frozen instance 0 is expelled by the broker's session (45 s),
/// and, thawed, its heartbeat is refused (its member epoch fenced): librdkafka revokes its
/// partitions as lost, and it joins again as a new member.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_held_bucket_partition_moved_away_and_back_while_paused_is_read_again_under_the_consumer_protocol(
) {
    held_bucket_partition_moved_away_and_back(GroupProtocol::Consumer);
}

fn held_bucket_partition_moved_away_and_back(protocol: GroupProtocol) {
    // Each key fails once (429, Retry-After 0) then is accepted: every notification goes through
    // the first bucket once.
    let flaky = Webhook::up(Behaviour::TooManyOnce {
        retry_after_secs: 0,
    });
    // The last bucket's delay (5 min) bounds every retry's due time (record timestamp + it,
    // issue 43): far above the held record's, so that the record is due when the test says.
    let setup = Setup::new("deliver-moved", 1, "1s,2s,5m", &[("flaky", flaky.url())]);
    let group = setup.group();
    let all: BTreeSet<(String, i32)> = setup.read_topics().into_iter().map(|t| (t, 0)).collect();
    let owners = || group_assignment(&group, protocol);
    // Short sessions, so a frozen or stopped (static) member is expelled within seconds (classic;
    // the broker's 45 s under the consumer protocol).
    let session = common::session_timeout(protocol, Duration::from_secs(6));
    let args: Vec<String> = common::session_args(protocol, session)
        .into_iter()
        .chain(
            [
                "--breaker-failures",
                "0",
                "--group-protocol",
                protocol.as_str(),
            ]
            .map(String::from),
        )
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut a = setup.spawn_instance("0", &setup.metrics_addr, &args);
    setup.wait_ready(&mut a);
    wait_until(
        "instance 0 owns every partition",
        Duration::from_secs(60),
        || owners() == vec![all.clone()],
    );
    // A retry record due in 54 s plus the session, which must pass before instance 1 takes it,
    // plus under the consumer protocol 45 s more: its takeover waits for the broker's heartbeat
    // as well, and the group tool that sees it takes seconds a call on a loaded machine (a
    // fresh-clone run saw the takeover 45 s after the freeze and the tool 30 s later). Instance 0
    // holds the first bucket's partition (paused) at it.
    let slack = match protocol {
        GroupProtocol::Classic => Duration::ZERO,
        GroupProtocol::Consumer => Duration::from_secs(45),
    };
    let h_due = SystemTime::now() + Duration::from_secs(54) + session + slack;
    let held = produce_retries(&setup.bucket("1s"), "flaky", &[(1000, h_due)]);
    wait_until(
        "instance 0 holds the first bucket's partition",
        Duration::from_secs(30),
        || {
            gauge(
                &setup.metrics_addr,
                "alerts_deliver_bucket_oldest_age_seconds",
                "topic",
                &setup.bucket("1s"),
            ) > 0.0
        },
    );

    // Instance 1 joins; instance 0 is frozen past its session timeout, so instance 1 takes every
    // partition, the held one included; instance 0 is thawed (its partitions are lost) and
    // rejoins; instance 1 stops and every partition comes back to instance 0.
    let b_addr = free_addr();
    let mut b = setup.spawn_instance("1", &b_addr, &args);
    wait_ready_at(&b_addr, &mut b);
    let both = || {
        let o = owners();
        o.len() == 2 && o.iter().all(|p| !p.is_empty())
    };
    wait_until(
        "both instances own partitions",
        Duration::from_secs(60),
        both,
    );
    a.signal("STOP");
    let thaw = common::Thaw(a.child.id());
    wait_until(
        "instance 1 owns every partition",
        Duration::from_secs(54) + session + slack,
        || owners() == vec![all.clone()],
    );
    assert!(
        SystemTime::now() + Duration::from_secs(15) < h_due,
        "the machine was too slow for the scenario: the held record comes due before instance 0 has seen its revoke"
    );
    drop(thaw);
    wait_until("instance 0 rejoined", Duration::from_secs(60), both);
    b.signal("TERM");
    assert!(b.wait(EXIT).success(), "instance 1 stops cleanly");
    wait_until(
        "instance 0 owns every partition again",
        Duration::from_secs(60),
        || owners() == vec![all.clone()],
    );

    // After the last move: notifications that each fail once, so each waits in the first bucket
    // behind the held record, and all are delivered once it is due.
    let feed = Feed::new(&kafka()).expect("feed");
    let ids = produce(&feed, &setup.topic, 0..20);
    let every: Vec<String> = ids.iter().chain(&held).cloned().collect();
    let until_due = h_due.duration_since(SystemTime::now()).unwrap_or_default();
    wait_until(
        "the subscriber accepted every notification",
        until_due + Duration::from_secs(60),
        || flaky.accepted() == keys(&every, "flaky"),
    );
    // Every key went through the first bucket once, and is accepted at its second attempt: only
    // the held record, a retry already when it was written, failed its first attempt there.
    // Unless a broker stall aborted a hand-off: the batch, delivered again, then needed none.
    let aborts = gauge(
        &setup.metrics_addr,
        "alerts_deliver_transactions_total",
        "result",
        "aborted",
    );
    assert!(aborts >= 0.0, "the aborted transactions are counted");
    a.signal("TERM");
    assert!(a.wait(EXIT).success(), "instance 0 stops cleanly");
    assert_once(&setup.bucket("1s"), &every, "flaky", aborts == 0.0);
    assert_once(&setup.bucket("2s"), &held, "flaky", aborts == 0.0);
    assert_nothing_given_up(&setup);
}

/// Issue 43: a retry record whose `retry.next.due.at` is far in the future (an edited record, or
/// a due time and a timestamp from different clocks) at the head of a bucket partition holds the
/// partition, and every retry behind it, no longer than the last bucket's delay after the record
/// was written: its record timestamp, which no re-read moves. The hold used to be clamped to
/// "now + the last delay" at every re-read, so it never ended: 0 of 31 accepted in 37 s here.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_retry_due_far_in_the_future_holds_its_bucket_partition_no_longer_than_the_last_bucket() {
    use price_alerts::deliver::buckets::parse_time;
    let hook = Webhook::up(Behaviour::Ok);
    let setup = Setup::new("deliver-skew", 1, "2s,5s,20s", &[("sub", hook.url())]);
    let last = Duration::from_secs(20);
    let first = Duration::from_secs(2);
    let log_path = std::env::temp_dir().join(format!("{}deliver.log", setup.prefix));
    let log = std::fs::File::create(&log_path).expect("the log file");
    // No breaker: every delivery is tried, so the 30 notifications fail once, into the first
    // bucket, and nothing is handed on untried.
    let mut command = setup.command("0", &setup.metrics_addr, &["--breaker-failures", "0"]);
    command
        .env("RUST_LOG", "warn,price_alerts=info")
        .stderr(log);
    let mut deliverer = Pipeline::from(command.spawn().expect("starting alert-deliver"), "0");
    setup.wait_ready(&mut deliverer);
    wait_until(
        "the deliverer owns its partitions",
        Duration::from_secs(60),
        || {
            group_assignment(&setup.group(), common::suite_protocol())
                .iter()
                .map(BTreeSet::len)
                .sum::<usize>()
                == 4
        },
    );
    // The head of the first bucket's partition 0: due 2099-01-01 by its header.
    let far = parse_time("2099-01-01T00:00:00Z").expect("a time");
    let before = SystemTime::now();
    let head = produce_retries(&setup.bucket("2s"), "sub", &[(1000, far)]);
    let written = Instant::now();
    // 30 notifications behind it: the subscriber answers 503 until all 30 are in the bucket.
    hook.fail(503);
    let feed = Feed::new(&kafka()).expect("feed");
    let ids = produce(&feed, &setup.topic, 0..30);
    wait_until(
        "the 30 notifications are in the first bucket, behind the head",
        Duration::from_secs(60),
        || {
            count_records(&kafka(), &setup.bucket("2s"), Isolation::ReadCommitted).unwrap_or(0)
                >= 31
        },
    );
    hook.recover();
    // The head is due at its timestamp plus the last bucket's delay; the records behind it were
    // due the first bucket's delay after their hand-off, earlier. So all 31 within the last
    // delay of the head's write, plus the first delay and a margin for a loaded machine.
    let every: Vec<String> = ids.iter().chain(&head).cloned().collect();
    let bound = last + first + Duration::from_secs(15);
    let deadline = written + bound;
    while hook.accepted() != keys(&every, "sub") && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(200));
    }
    let accepted = hook.accepted();
    let took = written.elapsed();
    let clamped = gauge(
        &setup.metrics_addr,
        "alerts_deliver_due_clamped_total",
        "topic",
        &setup.bucket("2s"),
    );
    deliverer.signal("TERM");
    assert!(
        deliverer.wait(EXIT).success(),
        "alert-deliver stops cleanly"
    );
    let text = std::fs::read_to_string(&log_path).expect("reading the log");
    let _ = std::fs::remove_file(&log_path);
    assert_eq!(
        accepted.len(),
        every.len(),
        "{} of {} accepted within {bound:?} of the head's write; missing: {:?}",
        accepted.len(),
        every.len(),
        keys(&every, "sub")
            .difference(&accepted)
            .take(5)
            .collect::<Vec<_>>()
    );
    assert_eq!(accepted, keys(&every, "sub"));
    assert_nothing_given_up(&setup);
    // Held until its bound, not let go early: its first request at its timestamp (not before
    // `before`) plus the last delay.
    let per = hook.per_key();
    let head_first = per[&format!("{}/sub", head[0])][0].at;
    assert!(
        head_first + Duration::from_millis(1) >= before + last,
        "the head was tried {:?} after its write, before the last bucket's delay",
        head_first.duration_since(before).unwrap_or_default()
    );
    // Counted and logged once, the head only (the 30 behind it carry honest due times).
    assert_eq!(clamped, 1.0, "alerts_deliver_due_clamped_total");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("retry due time beyond its bound"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one WARN line for the clamped record:\n{text}"
    );
    for field in ["offset=0", "partition=0", "2099-01-01T00:00:00Z"] {
        assert!(lines[0].contains(field), "{field} in {}", lines[0]);
    }
    eprintln!(
        "{} of {} accepted {took:?} after the head's write (last bucket {last:?}); {}",
        accepted.len(),
        every.len(),
        lines[0]
    );
}

/// Live alerts name their subscriber (issue 42): a notification that names one goes to it alone,
/// whatever symbols its subscription lists; one that names a subscriber the file does not have is
/// dead-lettered with its class, never dropped; one that names none goes by symbol, as before.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_notification_naming_its_subscriber_goes_to_it_alone_and_an_unknown_one_to_the_dlq() {
    let named = Webhook::up(Behaviour::Ok);
    let every = Webhook::up(Behaviour::Ok);
    let setup = Setup::new("deliver-named", 2, "500ms,1s", &[]);
    std::fs::write(
        &setup.subscriptions,
        format!(
            "[subscribers.named]\nurl = \"{}\"\nsymbols = [\"NOPE\"]\n\n[subscribers.every]\nurl = \"{}\"\nsymbols = [\"*\"]\n",
            named.url(),
            every.url()
        ),
    )
    .expect("writing subscriptions");
    let record = |id: &str, subscriber: Option<&str>| {
        let mut v = serde_json::json!({"id": id, "symbol": "AAA", "seq": 1, "threshold": "100", "direction": "up"});
        if let Some(s) = subscriber {
            v["subscriber"] = serde_json::json!(s);
        }
        (Some(b"AAA".to_vec()), serde_json::to_vec(&v).expect("json"))
    };
    let feed = Feed::new(&kafka()).expect("feed");
    feed.send_raw(
        &setup.topic,
        &[
            record("AAA:1:a1:up", Some("named")),
            record("AAA:2:a2:up", Some("ghost")),
            record("AAA:3:100:up", None),
        ],
    )
    .expect("producing notifications");
    let deliverer = setup.spawn();
    wait_until(
        "delivered and dead-lettered",
        Duration::from_secs(60),
        || {
            named.accepted().len() == 1
                && every.accepted().len() == 1
                && count_records(&kafka(), &setup.dlq(), Isolation::ReadCommitted).unwrap_or(0) == 1
        },
    );
    deliverer.signal("TERM");
    assert!(
        deliverer.wait(EXIT).success(),
        "alert-deliver stops cleanly"
    );
    assert_eq!(
        named.accepted(),
        BTreeSet::from(["AAA:1:a1:up/named".to_owned()])
    );
    assert_eq!(
        every.accepted(),
        BTreeSet::from(["AAA:3:100:up/every".to_owned()])
    );
    let dead = handoffs(&setup.dlq(), &["dlq.error.class", "retry.subscriber"]);
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].2, ["delivery.unknown_subscriber", "ghost"]);
}

/// A deliverer stopped with SIGTERM has left its group when it exits, every time, so that the
/// others take its partitions at once rather than a session later (tests/membership.rs has the
/// pipeline's twin, and why: librdkafka loses a classic LeaveGroup in one close sequence). Each
/// round stops it at a different moment after it joined. Classic only (DescribeGroups).
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_deliverer_stopped_with_sigterm_has_left_the_group_when_it_exits() {
    let hook = Webhook::up(Behaviour::Ok);
    let setup = Setup::new("deliver-leave", 3, "1s", &[("alice", hook.url())]);
    common::assert_each_sigterm_leaves_the_group("deliverers", 6, &setup.group(), EXIT, || {
        setup.spawn_with(&["--group-protocol", "classic"])
    });
}
