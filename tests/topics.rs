//! Topic set-up on the real broker: what the processor creates, and what it refuses.

mod common;

use common::kafka;
use price_alerts::kafka::topics::{self, create_topics, Cleanup, TopicSpec, Topics};
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
    futures::executor::block_on(create_topics(
        &kafka(),
        &[
            spec(&t.input, input, Cleanup::Delete),
            spec(&t.changelog, changelog, Cleanup::Compact),
        ],
    ))
    .unwrap();
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
