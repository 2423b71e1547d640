//! Topic set-up on the real broker: what the processor creates, and what it refuses.

mod common;

use common::kafka;
use price_alerts::kafka::topics::{self, Cleanup, TopicSpec, Topics};
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

fn topic_config(topic: &str, name: &str) -> String {
    let admin: AdminClient<DefaultClientContext> = kafka().admin().create().unwrap();
    let res = futures::executor::block_on(
        admin.describe_configs([&ResourceSpecifier::Topic(topic)], &AdminOptions::new()),
    )
    .unwrap();
    let config = res.into_iter().next().unwrap().unwrap();
    config
        .get(name)
        .and_then(|e| e.value.clone())
        .unwrap_or_default()
}

/// Creates `t`'s input and a changelog made beforehand: compacted, with the broker's segment
/// settings.
fn create_input_and_changelog(t: &Topics, input: i32, changelog: i32) {
    let spec = |name: &str, partitions, cleanup| TopicSpec {
        name: name.to_owned(),
        partitions,
        cleanup,
        retention: None,
    };
    // ensure_topic waits until the broker's metadata shows the topic: a DescribeConfigs sent
    // earlier is answered UNKNOWN_TOPIC_OR_PARTITION (seen under load in a suite run).
    for s in [
        spec(&t.input, input, Cleanup::Delete),
        spec(&t.changelog, changelog, Cleanup::Compact),
    ] {
        futures::executor::block_on(topics::ensure_topic(&kafka(), &s)).unwrap();
    }
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn missing_topics_are_created_with_a_compacted_partition_aligned_changelog() {
    let prefix = common::prefix("topics");
    let _topics = common::drop_topics(&prefix);
    let t = Topics::prefixed(&prefix, "app");
    let n = futures::executor::block_on(topics::ensure(&kafka(), &t, Some(5))).unwrap();
    assert_eq!(n, 5);
    let probe: rdkafka::consumer::BaseConsumer = kafka().admin().create().unwrap();
    for name in [&t.input, &t.notifications, &t.changelog, &t.dlq] {
        let parts = price_alerts::kafka::read::partition_count(
            &probe,
            name,
            std::time::Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(parts, 5, "{name}");
    }
    assert_eq!(topic_config(&t.changelog, "cleanup.policy"), "compact");
    // Segments small enough that the cleaner reaches recent state, so a restore reads about one
    // record per symbol, not the history (the broker's 1 GiB / 7 days are never cleaned).
    assert_eq!(topic_config(&t.changelog, "segment.ms"), "600000");
    assert_eq!(topic_config(&t.changelog, "segment.bytes"), "16777216");
    assert_eq!(
        topic_config(&t.changelog, "min.cleanable.dirty.ratio"),
        "0.1"
    );
    assert_eq!(topic_config(&t.notifications, "cleanup.policy"), "delete");
    // Dead letters are raw payloads: kept two weeks by default, not at the broker's default.
    assert_eq!(
        topic_config(&t.dlq, "retention.ms"),
        (14 * 24 * 3600 * 1000u64).to_string()
    );
    // A second start finds everything in place.
    assert_eq!(
        futures::executor::block_on(topics::ensure(&kafka(), &t, None)).unwrap(),
        5
    );
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_changelog_with_another_partition_count_is_refused() {
    let prefix = common::prefix("misaligned");
    let _topics = common::drop_topics(&prefix);
    let t = Topics::prefixed(&prefix, "app");
    create_input_and_changelog(&t, 4, 2);
    let err = futures::executor::block_on(topics::ensure(&kafka(), &t, None)).unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("has 2 partitions but input") && msg.contains("must match"),
        "{msg}"
    );
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn an_existing_changelog_with_the_brokers_segments_is_reported_and_used_unaltered() {
    let prefix = common::prefix("drift");
    let _topics = common::drop_topics(&prefix);
    let t = Topics::prefixed(&prefix, "app");
    // As the processor created it before: compacted, the broker's segment settings.
    create_input_and_changelog(&t, 2, 2);
    let drift = futures::executor::block_on(price_alerts::kafka::changelog::changelog_drift(
        &kafka(),
        &t.changelog,
    ))
    .unwrap();
    let settings: Vec<&str> = drift.iter().map(|d| d.setting).collect();
    assert_eq!(
        settings,
        ["segment.ms", "segment.bytes", "min.cleanable.dirty.ratio"]
    );
    // Warned about, not refused and not altered.
    assert_eq!(
        futures::executor::block_on(topics::ensure(&kafka(), &t, None)).unwrap(),
        2
    );
    assert_eq!(topic_config(&t.changelog, "segment.ms"), "604800000");

    // A changelog the processor creates has nothing to report.
    let fresh = Topics::prefixed(&format!("{prefix}fresh-"), "app");
    futures::executor::block_on(topics::ensure(&kafka(), &fresh, Some(1))).unwrap();
    assert_eq!(
        futures::executor::block_on(price_alerts::kafka::changelog::changelog_drift(
            &kafka(),
            &fresh.changelog
        ))
        .unwrap(),
        []
    );
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_missing_input_is_refused_when_no_partition_count_is_given() {
    let prefix = common::prefix("noinput");
    let _topics = common::drop_topics(&prefix);
    let t = Topics::prefixed(&prefix, "app");
    let err = futures::executor::block_on(topics::ensure(&kafka(), &t, None)).unwrap_err();
    assert!(format!("{err:#}").contains("is missing"), "{err:#}");
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn the_dlq_is_created_with_the_retention_asked_for() {
    let prefix = common::prefix("retention");
    let _topics = common::drop_topics(&prefix);
    let t = Topics {
        dlq_retention: std::time::Duration::from_secs(3 * 24 * 3600),
        ..Topics::prefixed(&prefix, "app")
    };
    futures::executor::block_on(topics::ensure(&kafka(), &t, Some(1))).unwrap();
    assert_eq!(topic_config(&t.dlq, "retention.ms"), "259200000");
}

/// The settings at work: with the changelog's dirty ratio and a rolled segment, the cleaner
/// leaves a restore about one record per symbol of what is outside the active segment, and the
/// restored state is still the last one written. Time is compressed: 1 s segments instead of
/// 10 min (the only change), so the test need not wait ten minutes for a roll. The broker's cleaner
/// checks every 15 s (`log.cleaner.backoff.ms`), hence the bound of a minute and a half.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_restore_reads_about_one_record_per_symbol_once_the_cleaner_ran() {
    use price_alerts::alert::SymbolState;
    use price_alerts::kafka::read::{read_partitions_to_end, reader, End};
    use rdkafka::admin::AlterConfig;
    use std::time::{Duration, Instant};

    let prefix = common::prefix("compaction");
    let _topics = common::drop_topics(&prefix);
    let t = Topics::prefixed(&prefix, "app");
    futures::executor::block_on(topics::ensure(&kafka(), &t, Some(1))).unwrap();
    // AlterConfigs replaces every config of the topic: the others are set again as created.
    let created = |name: &str| topic_config(&t.changelog, name);
    let (policy, bytes, ratio) = (
        created("cleanup.policy"),
        created("segment.bytes"),
        created("min.cleanable.dirty.ratio"),
    );
    let admin: AdminClient<DefaultClientContext> = kafka().admin().create().unwrap();
    let alter = AlterConfig::new(ResourceSpecifier::Topic(&t.changelog))
        .set("cleanup.policy", &policy)
        .set("segment.bytes", &bytes)
        .set("min.cleanable.dirty.ratio", &ratio)
        .set("segment.ms", "1000");
    futures::executor::block_on(admin.alter_configs([&alter], &AdminOptions::new()))
        .unwrap()
        .into_iter()
        .for_each(|r| {
            r.unwrap();
        });
    assert_eq!(
        topic_config(&t.changelog, "min.cleanable.dirty.ratio"),
        "0.1"
    );

    // 20 symbols, 50 changes each, in 5 slices a segment apart.
    let (symbols, rounds, slices) = (20u64, 50u64, 5u64);
    let feed = price_alerts::kafka::feed::Feed::new(&kafka()).unwrap();
    for slice in 0..slices {
        let records: Vec<_> = (slice * rounds / slices..(slice + 1) * rounds / slices)
            .flat_map(|round| {
                (0..symbols).map(move |s| {
                    let state = format!(r#"{{"price":"{round}","seq":{round}}}"#);
                    (Some(format!("S{s}").into_bytes()), state.into_bytes())
                })
            })
            .collect();
        feed.send_raw(&t.changelog, &records).unwrap();
        std::thread::sleep(Duration::from_millis(1200)); // input pacing: one segment per slice
    }
    let written = symbols * rounds;

    let restore_reader = reader(&kafka(), price_alerts::kafka::Isolation::ReadCommitted).unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let read = loop {
        let mut last = std::collections::HashMap::new();
        let n = read_partitions_to_end(
            &restore_reader,
            &t.changelog,
            &[0],
            End::Decided,
            Duration::from_secs(30),
            |m| {
                use rdkafka::Message;
                let state: SymbolState = serde_json::from_slice(m.payload().unwrap()).unwrap();
                last.insert(m.key().unwrap().to_vec(), state.seq);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(last.len() as u64, symbols);
        assert!(
            last.values().all(|&seq| seq == rounds - 1),
            "the last state of every symbol survives: {last:?}"
        );
        // The last slice stays in the active segment, uncleaned; the others clean down to one
        // record per symbol.
        if n <= written / slices + symbols {
            break n;
        }
        assert!(
            Instant::now() < deadline,
            "a restore still reads {n} of {written} records"
        );
        std::thread::sleep(Duration::from_secs(1)); // poll interval of the condition above
    };
    println!("a restore reads {read} records of the {written} written");
}

/// `ensure` and `ensure_topic` wait on metadata round trips that a slow broker stretches to their
/// 30 s bound. They must not hold up the runtime thread that polls them meanwhile (issue 43, item
/// 6): with one worker, what `tokio::runtime::Runtime::new` gives a process pinned to one CPU, a
/// task beside them (the HTTP endpoint's, say) must go on. The "broker" is a listener that never
/// accepts: the kernel completes the connection, and no request is ever answered.
#[test]
fn topic_set_up_leaves_the_runtime_free_while_a_silent_broker_keeps_it_waiting() {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    // How long the tasks beside the set-up are watched, and the longest gap allowed between two
    // of their 10 ms ticks: far above a loaded machine's scheduling delay, far below the 30 s a
    // set-up call blocks for.
    const WATCH: Duration = Duration::from_secs(3);
    const GAP: Duration = Duration::from_millis(1000);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a local port");
    let kafka = price_alerts::kafka::KafkaConfig::new(silent.local_addr().unwrap().to_string());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let started = Instant::now();
    let ticks = Arc::new(Mutex::new(vec![started]));
    let seen = Arc::clone(&ticks);
    runtime.spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            seen.lock().unwrap().push(Instant::now());
        }
    });
    let topics = Topics::prefixed(&common::prefix("silent"), "app");
    let spec = TopicSpec {
        name: topics.dlq.clone(),
        partitions: 1,
        cleanup: Cleanup::Delete,
        retention: None,
    };
    let k = kafka.clone();
    runtime.spawn(async move { topics::ensure(&k, &topics, Some(1)).await });
    runtime.spawn(async move { topics::ensure_topic(&kafka, &spec).await });
    std::thread::sleep(WATCH);
    let mut stamps = ticks.lock().unwrap().clone();
    stamps.push(Instant::now());
    // The set-up calls are still waiting on their threads: nothing waits for them.
    runtime.shutdown_background();
    let longest = stamps
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .max()
        .unwrap_or_default();
    println!(
        "longest gap between ticks beside the set-up: {longest:?} ({} ticks in {WATCH:?})",
        stamps.len() - 2
    );
    assert!(
        longest < GAP,
        "a task beside the topic set-up stood still for {longest:?} of {WATCH:?} ({} ticks)",
        stamps.len() - 2
    );
}
