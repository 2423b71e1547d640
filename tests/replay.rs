//! DLQ replay on the real broker: the poison ticks of a fault-injected run go back to the input
//! exactly once, with their original bytes, and the pipeline takes them in.

mod common;

use common::{kafka, Run};
use price_alerts::kafka::Isolation;
use price_alerts::dlq::FaultInjection;
use price_alerts::tools::generate::{generate, GenOptions};
use price_alerts::kafka::feed::{next_offsets, Feed};
use price_alerts::kafka::read::{count_records, read_topic_to_end, DEFAULT_READ_TIMEOUT};
use price_alerts::tools::replay::{replay, ReplayOptions};
use rdkafka::message::Headers;
use rdkafka::Message;
use std::collections::BTreeMap;
use std::time::Duration;

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn poison_ticks_are_replayed_once_with_their_original_bytes() {
    let (rules, ticks) = generate(&GenOptions { symbols: 10, ticks: 1_000, seed: 8, stale_every: 0 });
    let mut run = Run::new("replay", rules);
    run.faults = FaultInjection { enabled: true };
    run.create_topics(2);
    let landed = Feed::new(&kafka()).unwrap().send_ticks(&run.input, &ticks).unwrap();
    let p = run.spawn("0");
    run.wait_committed(&next_offsets(&landed), Duration::from_secs(120));
    p.signal("TERM");
    assert!(p.wait(Duration::from_secs(40)).success());
    let dlq = run.topics().dlq;
    let poison = ticks.iter().filter(|t| t.seq % 25 == 0).count() as u64;
    assert_eq!(count_records(&kafka(), &dlq, Isolation::ReadCommitted).unwrap(), poison);

    let opts = ReplayOptions {
        kafka: kafka(),
        dlq: dlq.clone(),
        group: format!("{}replay", run.prefix),
        classes: vec!["poison".into()],
        to: None,
        dry_run: true,
    };
    let dry = replay(&opts).unwrap();
    assert_eq!(dry.total_replayed(), poison);
    assert_eq!(dry.transactions, 0);
    assert_eq!(count_records(&kafka(), &run.input, Isolation::ReadCommitted).unwrap(), 1_000, "a dry run writes nothing");

    let done = replay(&ReplayOptions { dry_run: false, ..opts.clone() }).unwrap();
    assert_eq!(done.total_replayed(), poison);
    let again = replay(&ReplayOptions { dry_run: false, ..opts.clone() }).unwrap();
    assert_eq!(again.total_replayed(), 0, "a second replay in the same group replays nothing");

    // The input now holds each poison tick twice: the original and its replay, byte for byte.
    let mut copies: BTreeMap<Vec<u8>, (u64, u64)> = BTreeMap::new();
    let mut replayed_landed = Vec::new();
    read_topic_to_end(&kafka(), &run.input, Isolation::ReadCommitted, DEFAULT_READ_TIMEOUT, |m| {
        let replayed = m.headers().is_some_and(|h| h.iter().any(|h| h.key == "replay.origin"));
        if replayed {
            assert!(m.headers().unwrap().iter().all(|h| !h.key.starts_with("dlq.")), "dlq.* headers dropped");
            replayed_landed.push(price_alerts::kafka::feed::Landed { partition: m.partition(), offset: m.offset() });
        }
        let e = copies.entry(m.payload().unwrap_or_default().to_vec()).or_default();
        if replayed { e.1 += 1 } else { e.0 += 1 }
        Ok(())
    })
    .unwrap();
    assert_eq!(replayed_landed.len() as u64, poison);
    assert!(copies.values().all(|&(orig, rep)| orig == 1 && rep <= 1), "each replay is a copy of one original");

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
    assert_eq!(count_records(&kafka(), &dlq, Isolation::ReadCommitted).unwrap(), poison, "nothing new in the DLQ");
}
