//! The commit/abort experiment and its two halves, on the real broker: what read_committed and
//! read_uncommitted readers see, and where the group's committed offsets stand.

mod common;

use price_alerts::kafka::feed::{next_offsets, produce_ticks};
use price_alerts::kafka::offsets::committed_offsets;
use price_alerts::kafka::read::count_records;
use price_alerts::kafka::Isolation;
use price_alerts::pipeline::Engine;
use price_alerts::rules::Rules;
use price_alerts::tick::Tick;
use price_alerts::tools::demo::{self, DemoOptions};
use rust_decimal::Decimal;
use std::time::Duration;

fn rules(n: usize) -> Rules {
    Rules::from_pairs((0..n).map(|i| (format!("S{i}"), vec![Decimal::from(100)])))
}

/// Ticks for symbols 0..n at `price` with `seq`.
fn ticks(n: usize, price: i64, seq: u64) -> Vec<Tick> {
    (0..n)
        .map(|i| Tick {
            symbol: format!("S{i}"),
            price: Decimal::from(price),
            seq,
            ts: None,
        })
        .collect()
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn demo_figures_five_versus_ten_then_ten_versus_fifteen() {
    let prefix = common::prefix("demo");
    // The demo deletes its topics when it succeeds; this, when it fails.
    let _topics = common::drop_topics(&prefix);
    let report = demo::run(&DemoOptions {
        kafka: common::kafka(),
        prefix: prefix.clone(),
        partitions: 3,
        cleanup: true,
    })
    .expect("demo runs");
    println!("{report}");
    let a = report.phase("batch A").unwrap();
    assert_eq!((a.read_committed, a.read_uncommitted), (5, 5));
    let b = report.phase("batch B").unwrap();
    assert_eq!((b.read_committed, b.read_uncommitted), (5, 10));
    assert_eq!(
        b.committed, a.committed,
        "the abort leaves the committed offsets at the end of batch A"
    );
    assert_eq!(b.committed, b.expected_offsets);
    let r = report.phase("restart").unwrap();
    assert_eq!((r.read_committed, r.read_uncommitted), (10, 15));
    assert_eq!(
        r.committed, r.expected_offsets,
        "after the redo the offsets stand at the end of batch B"
    );
    assert_eq!(
        r.committed.values().sum::<i64>(),
        20,
        "20 ticks, no transactional input: offsets are counts here"
    );
    assert!(report.ok());
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn abort_only_shows_nothing_to_committed_readers_and_keeps_offsets() {
    let prefix = common::prefix("abort");
    let _topics = common::drop_topics(&prefix);
    let s = common::settings(&prefix, rules(8));
    common::create_topics(&s, 2);
    let engine = Engine::start(s.clone()).unwrap();
    // Below the threshold first (no notification), then all cross: 8 notifications, aborted.
    produce_ticks(&s.kafka, &s.topics.input, &ticks(8, 90, 1)).unwrap();
    produce_ticks(&s.kafka, &s.topics.input, &ticks(8, 120, 2)).unwrap();
    engine
        .process_records(16, Duration::from_secs(60))
        .expect("records processed");
    engine.stage_and_flush().unwrap();
    engine.abort().unwrap();
    assert_eq!(
        count_records(&s.kafka, &s.topics.notifications, Isolation::ReadCommitted).unwrap(),
        0
    );
    assert_eq!(
        count_records(
            &s.kafka,
            &s.topics.notifications,
            Isolation::ReadUncommitted
        )
        .unwrap(),
        8
    );
    assert_eq!(
        count_records(&s.kafka, &s.topics.changelog, Isolation::ReadCommitted).unwrap(),
        0
    );
    assert_eq!(
        committed_offsets(&s.kafka, s.group_id(), &s.topics.input).unwrap(),
        vec![None, None],
        "nothing was ever committed"
    );
    let stats = engine.close().unwrap();
    assert_eq!((stats.commits, stats.aborts), (0, 1));
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn commit_makes_outputs_state_and_offsets_visible_together() {
    let prefix = common::prefix("commit");
    let _topics = common::drop_topics(&prefix);
    let s = common::settings(&prefix, rules(6));
    common::create_topics(&s, 3);
    let engine = Engine::start(s.clone()).unwrap();
    let mut landed = produce_ticks(&s.kafka, &s.topics.input, &ticks(6, 90, 1)).unwrap();
    landed.extend(produce_ticks(&s.kafka, &s.topics.input, &ticks(6, 150, 2)).unwrap());
    engine
        .process_records(12, Duration::from_secs(60))
        .expect("records processed");
    assert!(engine.commit().unwrap());
    assert_eq!(
        count_records(&s.kafka, &s.topics.notifications, Isolation::ReadCommitted).unwrap(),
        6
    );
    assert_eq!(
        count_records(
            &s.kafka,
            &s.topics.notifications,
            Isolation::ReadUncommitted
        )
        .unwrap(),
        6
    );
    // One state record per symbol: the batch's changes are coalesced.
    assert_eq!(
        count_records(&s.kafka, &s.topics.changelog, Isolation::ReadCommitted).unwrap(),
        6
    );
    let committed: Vec<Option<i64>> =
        committed_offsets(&s.kafka, s.group_id(), &s.topics.input).unwrap();
    let expected = next_offsets(&landed);
    for (p, o) in committed.iter().enumerate() {
        assert_eq!(*o, expected.get(&(p as i32)).copied(), "partition {p}");
    }
    let stats = engine.close().unwrap();
    assert_eq!(
        (
            stats.commits,
            stats.committed_records,
            stats.committed_notifications
        ),
        (1, 12, 6)
    );
}

/// A restarted instance checks its rights before it fences its crashed predecessor, so a
/// transaction of the predecessor may still hold pending offsets for the group. The group check
/// must not wait for that transaction to end (up to its timeout): the restart would stall.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn access_check_does_not_wait_for_a_transaction_holding_the_groups_offsets() {
    use price_alerts::kafka::access::{check, Needs};
    let prefix = common::prefix("access-open");
    let _topics = common::drop_topics(&prefix);
    let s = common::settings(&prefix, rules(3));
    common::create_topics(&s, 3);
    let engine = Engine::start(s.clone()).unwrap();
    produce_ticks(&s.kafka, &s.topics.input, &ticks(3, 90, 1)).unwrap();
    engine
        .process_records(3, Duration::from_secs(60))
        .expect("records processed");
    // Offsets in the open transaction: the group's offsets are pending until it ends.
    engine.stage_and_flush().unwrap();
    let needs = Needs {
        read: vec![s.topics.input.clone()],
        write: vec![],
        group: Some(s.group_id().to_owned()),
    };
    let started = std::time::Instant::now();
    check(&s.kafka, &needs).unwrap();
    let took = started.elapsed();
    engine.abort().unwrap();
    assert!(
        took < s.transaction_timeout / 2,
        "the access check waited {took:?} for the open transaction (its timeout is {:?})",
        s.transaction_timeout
    );
}
