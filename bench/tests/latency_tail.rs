//! pipeline-bench's latency reader against a real broker. It must count every notification that
//! becomes visible after it started, and it must finish once told that no more output is coming,
//! also when some partition received nothing while it ran: with a small latency phase (500 ticks,
//! notifications visible at once under at-least-once) that used to keep it waiting for ever.

use price_alerts::alert::{Direction, Notification, Source};
use price_alerts::kafka::feed::Feed;
use price_alerts::kafka::topics::{create_topics, unique_suffix, Cleanup, DropTopics, TopicSpec};
use price_alerts::kafka::KafkaConfig;
use price_alerts_bench::tail::LatencyTail;
use rust_decimal::Decimal;
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Far more than a healthy finish takes (one poll and a watermark query per partition).
const FINISH_BOUND: Duration = Duration::from_secs(30);

fn kafka() -> KafkaConfig {
    KafkaConfig::new(std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into()))
}

/// A notification of `symbol` as the pipeline writes it, its tick appended now.
fn notification(symbol: &str, seq: u64) -> (Option<Vec<u8>>, Vec<u8>) {
    let n = Notification {
        id: Notification::id_of(symbol, seq, Decimal::from(100), Direction::Up),
        symbol: symbol.to_owned(),
        threshold: Decimal::from(100),
        direction: Direction::Up,
        price: Decimal::from(101),
        previous_price: Decimal::from(99),
        seq,
        tick_ts: OffsetDateTime::now_utc().format(&Rfc3339).unwrap(),
        source: Source {
            topic: "market-updates".into(),
            partition: 0,
            offset: seq as i64,
        },
        alert: None,
        subscriber: None,
    };
    (
        Some(symbol.as_bytes().to_vec()),
        serde_json::to_vec(&n).unwrap(),
    )
}

/// A fresh notifications topic of `partitions` partitions holding one notification per symbol
/// A..Z (so that every partition has records before the reader starts), and its cleanup guard.
fn topic_with_history(test: &str, partitions: i32) -> (String, DropTopics) {
    let prefix = format!("bt-{test}-{}-", unique_suffix());
    let guard = DropTopics::with_prefix(&kafka(), &prefix);
    let topic = format!("{prefix}notifications");
    futures::executor::block_on(create_topics(
        &kafka(),
        &[TopicSpec {
            name: topic.clone(),
            partitions,
            cleanup: Cleanup::Delete,
            retention: None,
        }],
    ))
    .expect("creating the topic");
    let history: Vec<_> = (b'A'..=b'Z')
        .map(|c| notification(&char::from(c).to_string(), 1))
        .collect();
    let landed = Feed::new(&kafka())
        .unwrap()
        .send_raw(&topic, &history)
        .unwrap();
    let used: std::collections::BTreeSet<i32> = landed.iter().map(|l| l.partition).collect();
    assert_eq!(used.len() as i32, partitions, "history on every partition");
    (topic, guard)
}

/// Finishes `tail` on a helper thread, so that a reader that never finishes fails the test
/// instead of hanging it.
fn finish_within(tail: LatencyTail, bound: Duration) -> Vec<f64> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(tail.finish());
    });
    match rx.recv_timeout(bound) {
        Ok(result) => result.expect("the latency reader fails"),
        Err(_) => panic!("the latency reader did not finish within {bound:?}"),
    }
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn a_reader_that_saw_nothing_new_finishes() {
    let (topic, _topics) = topic_with_history("tail-idle", 2);
    let tail = LatencyTail::start(&kafka(), &topic, 2).expect("starting the reader");
    let latencies = finish_within(tail, FINISH_BOUND);
    assert!(latencies.is_empty(), "{latencies:?}");
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn every_notification_after_the_start_is_measured_once() {
    let (topic, _topics) = topic_with_history("tail-count", 2);
    let tail = LatencyTail::start(&kafka(), &topic, 2).expect("starting the reader");
    // One symbol, so one partition gets all of them and the other none.
    let fresh: Vec<_> = (2..=51).map(|seq| notification("BBCA", seq)).collect();
    Feed::new(&kafka())
        .unwrap()
        .send_raw(&topic, &fresh)
        .unwrap();
    let latencies = finish_within(tail, FINISH_BOUND);
    assert_eq!(latencies.len(), fresh.len());
    assert!(latencies.iter().all(|&ms| ms >= 0.0), "{latencies:?}");
}
