//! DLQ replay on the real broker: the poison ticks of a fault-injected run go back to the input
//! exactly once, with their original bytes, and the pipeline takes them in; filters never make the
//! dead letters they did not select unreplayable; an interrupted replay, rerun, replays each dead
//! letter once; `inspect` and the backlog gauge count what is still unhandled.

mod common;

use common::{kafka, Run};
use price_alerts::dlq::FaultInjection;
use price_alerts::kafka::feed::{next_offsets, Feed};
use price_alerts::kafka::read::{
    count_records, count_visible_records, read_topic_to_end, DEFAULT_READ_TIMEOUT,
};
use price_alerts::kafka::Isolation;
use price_alerts::tools::generate::{generate, GenOptions};
use price_alerts::tools::replay::{replay, ReplayOptions, Selection};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

/// One dead letter seeded by [`Seeded::new`].
#[derive(Debug, Clone)]
struct Letter {
    /// `dlq-topic/partition/offset`: the `replay.origin` of its copy and its ledger key.
    coords: String,
    class: &'static str,
    partition: i32,
    offset: i64,
}

/// A DLQ filled with dead letters written as the pipeline writes them (the `dlq.*` headers), and
/// the topic they go back to.
struct Seeded {
    dlq: String,
    target: String,
    letters: Vec<Letter>,
    /// The DLQ, its source topic and the replay ledger go when the seeding does.
    _topics: price_alerts::kafka::topics::DropTopics,
}

impl Seeded {
    /// A fresh DLQ of `partitions` partitions holding one dead letter per `(class, dlq partition)`,
    /// in that order, and its (empty) source topic.
    fn new(test: &str, partitions: i32, letters: &[(&'static str, i32)]) -> Seeded {
        let prefix = common::prefix(test);
        let _topics = common::drop_topics(&prefix);
        let topics = price_alerts::kafka::topics::Topics::prefixed(&prefix, "app");
        futures::executor::block_on(price_alerts::kafka::topics::ensure(
            &kafka(),
            &topics,
            Some(partitions),
        ))
        .expect("topics");
        let producer: FutureProducer = kafka().idempotent_producer().create().expect("producer");
        let records: Vec<(i32, Vec<u8>, Vec<u8>, OwnedHeaders)> = letters
            .iter()
            .enumerate()
            .map(|(i, &(class, partition))| {
                let (source_partition, source_offset) =
                    ((i % 3).to_string(), (1000 + i).to_string());
                let origin = format!("{}/{source_partition}/{source_offset}", topics.input);
                let correlation = format!("c-{i}");
                let mut headers = OwnedHeaders::new().insert(Header {
                    key: "correlation-id",
                    value: Some(&correlation),
                });
                for (k, v) in [
                    ("dlq.origin", origin.as_str()),
                    ("dlq.original.topic", topics.input.as_str()),
                    ("dlq.original.partition", source_partition.as_str()),
                    ("dlq.original.offset", source_offset.as_str()),
                    ("dlq.error.class", class),
                    ("dlq.error.message", "seeded by the test"),
                    ("dlq.failed.at", "2026-11-30T09:15:00Z"),
                ] {
                    headers = headers.insert(Header {
                        key: k,
                        value: Some(v),
                    });
                }
                (
                    partition,
                    format!("K{i}").into_bytes(),
                    format!("{{\"letter\":{i}}}").into_bytes(),
                    headers,
                )
            })
            .collect();
        let sends = records.iter().map(|(partition, key, payload, headers)| {
            let record = FutureRecord::to(&topics.dlq)
                .partition(*partition)
                .key(key)
                .payload(payload)
                .headers(headers.clone());
            producer.send(record, Duration::from_secs(30))
        });
        let delivered = futures::executor::block_on(futures::future::join_all(sends));
        let letters = letters
            .iter()
            .zip(delivered)
            .map(|(&(class, _), d)| {
                let d = d.map_err(|(e, _)| e).expect("seeding the DLQ");
                Letter {
                    coords: format!("{}/{}/{}", topics.dlq, d.partition, d.offset),
                    class,
                    partition: d.partition,
                    offset: d.offset,
                }
            })
            .collect();
        Seeded {
            dlq: topics.dlq,
            target: topics.input,
            letters,
            _topics,
        }
    }

    /// `dlq-replay ARGS --dlq <dlq> --bootstrap <broker>`, run to its end.
    fn run(&self, args: &[&str]) -> Output {
        let out = self.command(args).output().expect("runs dlq-replay");
        eprintln!(
            "dlq-replay {args:?}: {:?}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Like [`Seeded::run`], and asserts it succeeded.
    fn run_ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "dlq-replay {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_dlq-replay"));
        c.args(args)
            .args(["--dlq", &self.dlq, "--bootstrap", &kafka().bootstrap])
            .env("RUST_LOG", "warn,price_alerts=info")
            .stdin(Stdio::null());
        if args.first() != Some(&"inspect") {
            // As the pipeline tests do (tests/common `Run`): a loaded machine has stalled the
            // broker for about 9 s, longer than the default lets a batch take.
            c.args(["--transaction-timeout", "30s"]);
        }
        c
    }

    /// The `replay.origin` of every copy in the target, read_committed, with how often each came.
    fn copies(&self) -> BTreeMap<String, u64> {
        copies_in(&self.target, Isolation::ReadCommitted)
    }

    /// The copies once at least `n` are visible. A commit returns before the broker has written
    /// the transaction's markers, so a read_committed reader may see the last one a moment later.
    fn copies_at_least(&self, n: usize) -> BTreeMap<String, u64> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let copies = self.copies();
            if copies.values().sum::<u64>() as usize >= n || Instant::now() >= deadline {
                return copies;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Asserts that the target holds a copy of each of `expected` exactly once and nothing else.
    fn assert_once(&self, expected: &BTreeSet<String>, what: &str) {
        assert_exactly(&self.copies_at_least(expected.len()), expected, what);
    }

    /// Coordinates of the seeded letters `pick` accepts.
    fn coords(&self, pick: impl Fn(&Letter) -> bool) -> BTreeSet<String> {
        self.letters
            .iter()
            .filter(|l| pick(l))
            .map(|l| l.coords.clone())
            .collect()
    }
}

/// The `replay.origin` of every replayed record in `topic` under `isolation`, with its count.
fn copies_in(topic: &str, isolation: Isolation) -> BTreeMap<String, u64> {
    let mut seen = BTreeMap::new();
    read_topic_to_end(&kafka(), topic, isolation, DEFAULT_READ_TIMEOUT, |m| {
        if let Some(origin) = price_alerts::dlq::header(m, "replay.origin") {
            *seen.entry(origin.to_owned()).or_insert(0) += 1;
        }
        Ok(())
    })
    .expect("reading the copies");
    seen
}

/// Asserts that `copies` holds each of `expected` exactly once and nothing else.
fn assert_exactly(copies: &BTreeMap<String, u64>, expected: &BTreeSet<String>, what: &str) {
    let twice: Vec<_> = copies.iter().filter(|(_, &n)| n > 1).collect();
    assert!(
        twice.is_empty(),
        "{what}: replayed more than once: {twice:?}"
    );
    let got: BTreeSet<String> = copies.keys().cloned().collect();
    let missing: Vec<_> = expected.difference(&got).collect();
    let extra: Vec<_> = got.difference(expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: missing {missing:?}, unexpected {extra:?}"
    );
}

/// A mix of classes over two DLQ partitions.
const MIX: &[(&str, i32)] = &[
    ("poison", 0),
    ("permanent.not_json", 1),
    ("permanent.bad_decimal", 0),
    ("poison", 1),
    ("transient.exhausted", 0),
    ("permanent.not_json", 0),
    ("poison", 0),
    ("permanent.empty", 1),
    ("transient.exhausted", 1),
    ("permanent.bad_symbol", 1),
];

/// Issue 13: `--class poison` used to commit the shared replay group past every other dead letter,
/// so the complementary `--class 'permanent.*'` afterwards found nothing left to replay.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_narrow_filter_leaves_every_other_dead_letter_replayable() {
    let s = Seeded::new("narrow", 2, MIX);
    s.run_ok(&["--class", "poison"]);
    s.assert_once(&s.coords(|l| l.class == "poison"), "after --class poison");
    s.run_ok(&["--class", "permanent.*"]);
    s.assert_once(
        &s.coords(|l| l.class != "transient.exhausted"),
        "after --class permanent.*",
    );
    s.run_ok(&[]);
    s.assert_once(&s.coords(|_| true), "after an unfiltered replay");
    let last: serde_json::Value = serde_json::from_str(&s.run_ok(&["--json"])).unwrap();
    assert!(
        last["classes"]
            .as_object()
            .unwrap()
            .values()
            .all(|c| c["replayed"] == 0 && c["left"] == 0),
        "{last}"
    );
    s.assert_once(
        &s.coords(|_| true),
        "a replay with nothing left replays nothing",
    );
}

/// Issue 13: a misspelt class used to exit 0 (and commit past everything). A missing target
/// topic is refused too, before anything is sent.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn unknown_classes_and_missing_targets_are_refused() {
    let s = Seeded::new("unknown", 1, &[("poison", 0)]);
    for class in ["nonsense.class", "nonsense.*", "Poison"] {
        let out = s.run(&["--class", class]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "--class {class} must be refused: {err}"
        );
        assert!(err.contains(class), "names what was given: {err}");
        for known in price_alerts::dlq::CLASSES {
            assert!(err.contains(known), "lists the known class {known}: {err}");
        }
    }
    let out = s.run(&["--to", "no-such-topic"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no-such-topic") && err.contains("does not exist"),
        "{err}"
    );
    assert!(s.copies().is_empty(), "nothing replayed");
    s.run_ok(&["--class", "poison"]);
    s.assert_once(
        &s.coords(|_| true),
        "the refusals left the dead letter replayable",
    );
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn poison_ticks_are_replayed_once_with_their_original_bytes() {
    let (rules, ticks) = generate(&GenOptions {
        symbols: 10,
        ticks: 1_000,
        seed: 8,
        stale_every: 0,
    });
    let mut run = Run::new("replay", rules);
    run.faults = FaultInjection { enabled: true };
    run.create_topics(2);
    let landed = Feed::new(&kafka())
        .unwrap()
        .send_ticks(&run.input, &ticks)
        .unwrap();
    let p = run.spawn("0");
    run.wait_committed(&next_offsets(&landed), Duration::from_secs(120));
    p.signal("TERM");
    assert!(p.wait(Duration::from_secs(40)).success());
    let dlq = run.topics().dlq;
    let poison = ticks.iter().filter(|t| t.seq % 25 == 0).count() as u64;
    assert_eq!(
        count_records(&kafka(), &dlq, Isolation::ReadCommitted).unwrap(),
        poison
    );

    let poison_only = Selection::classes(&["poison".to_owned()]).unwrap();
    let opts = ReplayOptions {
        select: poison_only,
        dry_run: true,
        ..options(&dlq)
    };
    let dry = replay(&opts).unwrap();
    assert_eq!(dry.total_replayed(), poison);
    assert_eq!(dry.transactions, 0);
    assert_eq!(
        count_records(&kafka(), &run.input, Isolation::ReadCommitted).unwrap(),
        1_000,
        "a dry run writes nothing"
    );

    let done = replay(&ReplayOptions {
        dry_run: false,
        ..opts.clone()
    })
    .unwrap();
    assert_eq!(done.total_replayed(), poison);
    let again = replay(&ReplayOptions {
        dry_run: false,
        ..opts.clone()
    })
    .unwrap();
    assert_eq!(
        again.total_replayed(),
        0,
        "a second replay replays nothing: the ledger holds them all"
    );
    assert_eq!(again.total().handled, poison);
    let deadline = Instant::now() + Duration::from_secs(30);
    while count_records(&kafka(), &run.input, Isolation::ReadCommitted).unwrap() < 1_000 + poison {
        assert!(
            Instant::now() < deadline,
            "the replayed copies never became visible"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The input now holds each poison tick twice: the original and its replay, byte for byte.
    let mut copies: BTreeMap<Vec<u8>, (u64, u64)> = BTreeMap::new();
    let mut replayed_landed = Vec::new();
    read_topic_to_end(
        &kafka(),
        &run.input,
        Isolation::ReadCommitted,
        DEFAULT_READ_TIMEOUT,
        |m| {
            let replayed = m
                .headers()
                .is_some_and(|h| h.iter().any(|h| h.key == "replay.origin"));
            if replayed {
                assert!(
                    m.headers()
                        .unwrap()
                        .iter()
                        .all(|h| !h.key.starts_with("dlq.")),
                    "dlq.* headers dropped"
                );
                replayed_landed.push(price_alerts::kafka::feed::Landed {
                    partition: m.partition(),
                    offset: m.offset(),
                });
            }
            let e = copies
                .entry(m.payload().unwrap_or_default().to_vec())
                .or_default();
            if replayed {
                e.1 += 1
            } else {
                e.0 += 1
            }
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(replayed_landed.len() as u64, poison);
    assert!(
        copies.values().all(|&(orig, rep)| orig == 1 && rep <= 1),
        "each replay is a copy of one original"
    );

    // Without faults, the pipeline takes the replayed ticks in (they are stale by now: counted,
    // never alerting) and dead-letters nothing more.
    run.faults = FaultInjection::default();
    let p = run.spawn("0");
    let mut end = next_offsets(&landed);
    for (part, o) in next_offsets(&replayed_landed) {
        let e = end.entry(part).or_insert(0);
        *e = (*e).max(o);
    }
    run.wait_committed(&end, Duration::from_secs(120));
    p.signal("TERM");
    assert!(p.wait(Duration::from_secs(40)).success());
    assert_eq!(
        count_records(&kafka(), &dlq, Isolation::ReadCommitted).unwrap(),
        poison,
        "nothing new in the DLQ"
    );
}

/// `--partition`, an offset range and `--limit` take what they select and nothing else: a later
/// unfiltered replay replays exactly the rest. A dry run writes nothing, not even the ledger.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn partition_offset_range_and_limit_leave_the_rest_replayable() {
    let letters: Vec<(&str, i32)> = (0..12)
        .map(|i| {
            (
                if i % 2 == 0 {
                    "poison"
                } else {
                    "permanent.not_json"
                },
                i % 2,
            )
        })
        .collect();
    let s = Seeded::new("ranges", 2, &letters);
    let dry: serde_json::Value =
        serde_json::from_str(&s.run_ok(&["--dry-run", "--partition", "1", "--json"])).unwrap();
    let to_replay: u64 = dry["classes"]
        .as_object()
        .unwrap()
        .values()
        .map(|c| c["replayed"].as_u64().unwrap())
        .sum();
    assert_eq!(to_replay, 6, "{dry}");
    assert!(s.copies().is_empty(), "a dry run copies nothing");
    let probe: rdkafka::consumer::BaseConsumer = kafka().admin().create().unwrap();
    let ledger = format!("{}.replayed", s.dlq);
    assert_eq!(
        price_alerts::kafka::read::partition_count_if_exists(
            &probe,
            &ledger,
            Duration::from_secs(10)
        )
        .unwrap(),
        None
    );

    s.run_ok(&["--partition", "1"]);
    let mut expected = s.coords(|l| l.partition == 1);
    s.assert_once(&expected, "after --partition 1");
    s.run_ok(&["--partition", "0", "--from-offset", "2", "--to-offset", "3"]);
    expected.extend(s.coords(|l| l.partition == 0 && (2..=3).contains(&l.offset)));
    s.assert_once(
        &expected,
        "after --partition 0 --from-offset 2 --to-offset 3",
    );

    s.run_ok(&["--limit", "2"]);
    let copies = s.copies_at_least(expected.len() + 2);
    let new: BTreeSet<String> = copies
        .keys()
        .filter(|k| !expected.contains(*k))
        .cloned()
        .collect();
    assert_eq!(new.len(), 2, "--limit 2 replays two: {new:?}");
    assert!(copies.values().all(|&n| n == 1));
    s.run_ok(&[]);
    s.assert_once(
        &s.coords(|_| true),
        "an unfiltered replay replays exactly the rest",
    );
}

/// A replay that dies inside a transaction (a crash placed there, then a SIGKILL at a random
/// moment), rerun, replays every dead letter exactly once: copies and ledger entries commit
/// together or vanish together.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_replay_killed_mid_way_then_rerun_replays_each_dead_letter_once() {
    const N: usize = 1_200;
    let classes = price_alerts::dlq::CLASSES;
    let letters: Vec<(&str, i32)> = (0..N)
        .map(|i| (classes[i % classes.len()], (i % 3) as i32))
        .collect();
    let s = Seeded::new("interrupt", 3, &letters);

    // A crash inside the 10th transaction: 9 batches of 10 committed, 5 copies left open.
    let out = s.run(&["--batch-size", "10", "--test-crash-after", "95"]);
    assert!(!out.status.success(), "the test hook crashed the replay");
    // What read_committed readers see while the crashed batch is still open (End::Visible). A
    // read to the decided end would wait for the broker to abort it at the transaction timeout
    // (30 s, most of this test's time in a suite run); the next replay's fence aborts it instead.
    let deadline = Instant::now() + Duration::from_secs(30);
    let visible = loop {
        let n = count_visible_records(&kafka(), &s.target, Isolation::ReadCommitted)
            .expect("counting the visible copies");
        if n >= 90 || Instant::now() >= deadline {
            break n;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        visible, 90,
        "the open batch is invisible to read_committed readers"
    );
    assert!(
        copies_in(&s.target, Isolation::ReadUncommitted)
            .values()
            .sum::<u64>()
            >= 95,
        "the crash left records in the log"
    );

    // A SIGKILL while a slow replay (one dead letter per transaction) is half-way.
    let log = std::env::temp_dir().join(format!("{}.killed.log", s.dlq));
    let stderr = std::fs::File::create(&log).unwrap();
    let mut child = s
        .command(&["--batch-size", "1"])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while s.copies().len() < 300 {
        assert!(Instant::now() < deadline, "the replay made no progress");
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the replay ended ({status}) before it was killed:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    assert!(!child.wait().unwrap().success());
    let killed = s.copies();
    assert!(killed.len() < N, "killed half-way: {} of {N}", killed.len());
    assert!(killed.values().all(|&n| n == 1), "nothing doubled so far");

    s.run_ok(&[]);
    s.assert_once(&s.coords(|_| true), "after the rerun");
    let ledger = format!("{}.replayed", s.dlq);
    assert_eq!(
        count_records(&kafka(), &ledger, Isolation::ReadCommitted).unwrap(),
        N as u64,
        "one ledger entry each"
    );
}

/// A replay that starts while another runs fences it (same transactional id per DLQ): one of the
/// two stops with a clear message, the other finishes, and every dead letter is replayed once.
///
/// Usually the first is the one fenced. Not always, by design: a producer fenced while its open
/// transaction is older than the transaction timeout registers its id again, once, because that
/// is also how a coordinator that aborted a timed-out transaction answers (the coordinator-loss
/// heal of issue 20, `TxnProducer::fenced`). When the broker stalls while the first replay has a
/// transaction open (a fresh-clone suite run: the broker silent for 20 s), the first therefore
/// fences the second in return, and the second, whose transaction is young, stops. Which replay
/// stops is timing; so is whether one stops at all (see the last case below): that nothing is
/// replayed twice is the property.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_second_replay_fences_the_first() {
    let letters: Vec<(&str, i32)> = (0..600).map(|i| ("poison", i % 2)).collect();
    let s = Seeded::new("fence", 2, &letters);
    let first = s
        .command(&["--batch-size", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while s.copies().len() < 50 {
        assert!(
            Instant::now() < deadline,
            "the first replay made no progress"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let second = s.run(&[]);
    let first = first.wait_with_output().unwrap();
    let first_err = String::from_utf8_lossy(&first.stderr);
    eprintln!("the first replay: {:?}\n{first_err}", first.status);
    let second_err = String::from_utf8_lossy(&second.stderr);
    let codes = (first.status.code(), second.status.code());
    match codes {
        (Some(1), Some(0)) => assert!(
            first_err.contains("fenced"),
            "the one stopped says so: {first_err}"
        ),
        (Some(0), Some(1)) => assert!(
            second_err.contains("fenced"),
            "the one stopped says so: {second_err}"
        ),
        // Both finished: the fence met a transaction that was failing already (a fresh-clone
        // suite run: the broker stalled, the first replay's record timed out 32 s after its
        // start, and its epoch bump found the second's newer producer). A replay whose
        // transaction fails abortably starts again from the ledger, fencing in its turn; it found
        // every dead letter handled by the other and replayed nothing.
        (Some(0), Some(0)) => assert!(
            [&first_err, &second_err]
                .iter()
                .any(|e| e.contains("starting again from the ledger")),
            "both finished, neither started again from the ledger:\n{first_err}\n{second_err}"
        ),
        _ => panic!(
            "one replay stops fenced (exit 1) or starts again from the ledger, the other \
             finishes (exit 0): {codes:?}"
        ),
    }
    s.assert_once(&s.coords(|_| true), "two replays, each dead letter once");
}

/// `inspect` counts what the ledger and the DLQ hold, by class and by source partition, handled
/// or not; `--json` parses; `--show` prints headers and the payload only when asked.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn inspect_counts_match_the_ledger_and_the_dlq() {
    let s = Seeded::new("inspect", 2, MIX);
    s.run_ok(&["--class", "poison"]);
    s.assert_once(&s.coords(|l| l.class == "poison"), "after --class poison");
    let counts = |c: &serde_json::Value| {
        (
            c["handled"].as_u64().unwrap(),
            c["unhandled"].as_u64().unwrap(),
        )
    };
    let inspect = || -> serde_json::Value {
        serde_json::from_str(&s.run_ok(&["inspect", "--json"])).unwrap()
    };
    // The ledger's transaction markers may land a moment after the copies'.
    let mut v = inspect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while counts(&v["total"]).0 < 3 && Instant::now() < deadline {
        v = inspect();
    }
    assert_eq!(counts(&v["total"]), (3, 7), "{v}");
    for (class, _) in MIX {
        let n = MIX.iter().filter(|(c, _)| c == class).count() as u64;
        let want = if *class == "poison" { (n, 0) } else { (0, n) };
        assert_eq!(counts(&v["by"]["class"][class]), want, "{class}: {v}");
    }
    for p in 0..3 {
        // The seeded dead letter i came from source partition i % 3.
        let of = |pick: &dyn Fn(&str) -> bool| {
            MIX.iter()
                .enumerate()
                .filter(|(i, (c, _))| i % 3 == p && pick(c))
                .count() as u64
        };
        let want = (of(&|c| c == "poison"), of(&|c| c != "poison"));
        assert_eq!(
            counts(&v["by"]["source_partition"][p.to_string()]),
            want,
            "partition {p}: {v}"
        );
    }
    let (oldest, newest) = (
        v["oldest_unhandled"]["age_seconds"].as_f64().unwrap(),
        v["newest_unhandled"]["age_seconds"].as_f64().unwrap(),
    );
    assert!(oldest >= newest && newest >= 0.0, "{v}");
    assert_eq!(v["shown"].as_array().unwrap().len(), 0);

    let filtered: serde_json::Value =
        serde_json::from_str(&s.run_ok(&["inspect", "--json", "--class", "permanent.*"])).unwrap();
    assert_eq!(counts(&filtered["total"]), (0, 5), "{filtered}");

    let text = s.run_ok(&["inspect", "--show", "2"]);
    assert!(
        text.contains("3 handled") && text.contains("7 unhandled"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().eq(["class", "handled", "unhandled"])),
        "{text}"
    );
    assert_eq!(
        text.matches("dlq.error.class: ").count(),
        2,
        "two shown: {text}"
    );
    assert!(text.contains("correlation-id: c-"), "{text}");
    assert!(
        !text.contains("payload") && !text.contains("{\"letter\""),
        "no payload unless asked: {text}"
    );
    let text = s.run_ok(&["inspect", "--show", "1", "--payload"]);
    assert!(text.contains("payload: {\"letter\":"), "{text}");
}

/// The pipeline's DLQ gauges: after a fault-injected run they count the unhandled dead letters
/// (records, exactly) with a positive oldest age; after a full replay, 0.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn the_backlog_gauges_count_unhandled_dead_letters_until_replayed() {
    let (rules, ticks) = generate(&GenOptions {
        symbols: 10,
        ticks: 500,
        seed: 9,
        stale_every: 0,
    });
    let mut run = Run::new("backlog", rules);
    run.faults = FaultInjection { enabled: true };
    let addr = common::free_addr();
    run.extra = ["--metrics-addr", &addr, "--dlq-watch-interval", "300ms"]
        .map(String::from)
        .to_vec();
    run.create_topics(2);
    let landed = Feed::new(&kafka())
        .unwrap()
        .send_ticks(&run.input, &ticks)
        .unwrap();
    let p = run.spawn("0");
    run.wait_committed(&next_offsets(&landed), Duration::from_secs(120));
    let poison = ticks.iter().filter(|t| t.seq % 25 == 0).count() as f64;
    let gauge = |name| price_alerts::metrics::scrape(&addr, name);
    wait_until("the gauge counts every dead letter", || {
        gauge("alerts_dlq_unhandled") == poison
    });
    assert!(gauge("alerts_dlq_oldest_unhandled_age_seconds") > 0.0);

    // To a scratch topic: with its faults on, the running pipeline would dead-letter them again.
    let scratch = format!("{}scratch", run.prefix);
    let spec = price_alerts::kafka::topics::TopicSpec {
        name: scratch.clone(),
        partitions: 1,
        cleanup: price_alerts::kafka::topics::Cleanup::Delete,
        retention: None,
    };
    futures::executor::block_on(price_alerts::kafka::topics::ensure_topic(&kafka(), &spec))
        .unwrap();
    let done = replay(&ReplayOptions {
        to: Some(scratch),
        ..options(&run.topics().dlq)
    })
    .unwrap();
    assert_eq!(done.total_replayed() as f64, poison);
    wait_until("the gauges fall to 0 once all are replayed", || {
        gauge("alerts_dlq_unhandled") == 0.0
            && gauge("alerts_dlq_oldest_unhandled_age_seconds") == 0.0
    });
    assert_eq!(
        common::http_get(&addr, "/metrics").0,
        200,
        "the endpoint answered, so 0 is a reading"
    );
    p.signal("TERM");
    assert!(p.wait(Duration::from_secs(40)).success());
}

/// Options of a replay of `dlq` by the library, with the tests' transaction timeout.
fn options(dlq: &str) -> ReplayOptions {
    ReplayOptions {
        transaction_timeout: Duration::from_secs(30),
        ..ReplayOptions::new(kafka(), dlq)
    }
}

/// Polls `condition` until it holds, failing after a minute.
fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
