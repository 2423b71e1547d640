//! The processor as an operator meets it: stopping when idle, stopping on request within its
//! bound, refusing settings that cannot work. Each test here failed before its fix.

mod common;

use common::{kafka, Run};
use price_alerts::kafka::feed::{next_offsets, produce_raw, produce_ticks};
use price_alerts::rules::Rules;
use price_alerts::tick::Tick;
use rust_decimal::Decimal;
use std::time::Duration;

const EXIT: Duration = Duration::from_secs(120);

/// `--exit-when-idle` must not count the wait for an assignment or a state restore as idle time:
/// with a large state to restore and ticks waiting behind it, the processor must process the
/// ticks before it stops.
#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn exit_when_idle_waits_for_the_restore_and_the_waiting_ticks() {
    let rules = Rules::from_pairs((0..10).map(|i| (format!("SYM{i:03}"), vec![Decimal::from(100)])));
    let mut run = Run::new("idle", rules);
    run.create_topics(1);
    // 100,000 symbols of state in the changelog (a restore of a few seconds here), then 1,000
    // ticks in the input.
    let state: Vec<_> = (0..100_000)
        .map(|i| (Some(format!("OLD{i:06}").into_bytes()), br#"{"price":"1","seq":1}"#.to_vec()))
        .collect();
    produce_raw(&kafka(), &run.topics().changelog, &state).expect("loading the changelog");
    let ticks: Vec<Tick> = (0..1_000u64)
        .map(|n| Tick { symbol: format!("SYM{:03}", n % 10), price: Decimal::from(90 + (n % 20) as i64), seq: n + 1, ts: None })
        .collect();
    let landed = produce_ticks(&kafka(), &run.input, &ticks).expect("loading ticks");
    run.extra = vec!["--exit-when-idle".into(), "300ms".into()];
    let status = run.spawn("0").wait(EXIT);
    assert!(status.success(), "stopped cleanly: {status}");
    let expected: Vec<i64> = next_offsets(&landed).into_values().collect();
    assert_eq!(run.committed_per_partition(), expected, "every waiting tick committed before the idle exit");
}
