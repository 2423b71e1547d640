//! producer-bench against a real broker: a short run of every mode whose reported counts must
//! equal what each run's topic holds when read back (read_committed for the transactional runs),
//! so the benchmark's records/s rest on records that really landed (and, for transactions, that
//! really committed).

use price_alerts::kafka::read::count_records;
use price_alerts::kafka::topics::{delete_topics, unique_suffix};
use price_alerts::kafka::{Isolation, KafkaConfig};
use price_alerts_bench::producer::mode::{expand, ModeKind};
use price_alerts_bench::producer::options::{BenchOptions, Workload};
use price_alerts_bench::producer::{self as bench, write_outputs};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

fn kafka() -> KafkaConfig {
    KafkaConfig::new(std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into()))
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn reported_counts_equal_the_records_read_back() {
    let started = Instant::now();
    let kafka = kafka();
    let ms = Duration::from_millis;
    let opts = BenchOptions {
        kafka: kafka.clone(),
        sizes: vec![100],
        // Enough records that the 10 ms mode commits more than once (the first transaction
        // closes at its first send after 10 ms, long before 50,000 records are enqueued).
        workload: Workload::Records(vec![50_000]),
        partitions: 2,
        repeats: 1,
        modes: expand(
            &[
                ModeKind::Plain,
                ModeKind::Idempotent,
                ModeKind::Transactional,
                ModeKind::Overlapped,
            ],
            &[ms(10), ms(100)],
        ),
        warmup: 500,
        out_dir: None,
        prefix: format!("pb-test-{}-", unique_suffix()),
        // The topics are read back below, then deleted here.
        cleanup: false,
        progress: false,
    };
    let report = bench::run(&opts, &AtomicBool::new(false)).expect("benchmark run");
    let topics: Vec<String> = report.runs.iter().map(|r| r.topic.clone()).collect();

    // Read everything back before asserting, so that a failed assertion still deletes the topics.
    let mut checks = Vec::new();
    for r in &report.runs {
        let committed = count_records(&kafka, &r.topic, Isolation::ReadCommitted);
        let uncommitted = count_records(&kafka, &r.topic, Isolation::ReadUncommitted);
        checks.push((r.clone(), committed, uncommitted));
    }
    let out = std::env::temp_dir().join(format!("producer-bench-test-{}", unique_suffix()));
    let written = write_outputs(&report, &out);
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    futures::executor::block_on(delete_topics(&kafka, &names)).expect("deleting the test topics");

    assert_eq!(
        report.runs.len(),
        6,
        "plain, idempotent, txn-10ms, overlap-10ms, txn-100ms, overlap-100ms"
    );
    assert!(!report.interrupted);
    for (r, committed, uncommitted) in checks {
        let committed = committed.expect("read_committed count");
        let uncommitted = uncommitted.expect("read_uncommitted count");
        assert_eq!(r.failed_deliveries, 0, "{}: {r:?}", r.mode);
        assert_eq!(r.aborted_transactions, 0, "{}: {r:?}", r.mode);
        assert_eq!(r.warmup_records, 500, "{}", r.mode);
        assert_eq!(r.sent, 50_000, "{}", r.mode);
        assert_eq!(r.records, 50_000, "{}", r.mode);
        assert!(r.records_per_s > 0.0, "{}", r.mode);
        // The property: what the bench counts is what a reader of the topic sees.
        assert_eq!(
            committed,
            r.warmup_records + r.records,
            "{} read_committed",
            r.mode
        );
        // No aborts, so nothing beyond the committed records is in the log.
        assert_eq!(uncommitted, committed, "{} read_uncommitted", r.mode);
        match r.commit_interval_ms {
            Some(interval) => {
                assert!(r.commits >= 1, "{}", r.mode);
                assert_eq!(r.commit_latencies_ms.len() as u64, r.commits);
                if interval == 10 {
                    assert!(r.commits >= 2, "{} committed {} times", r.mode, r.commits);
                }
                assert_eq!(r.transactions.len() as u64, r.commits, "{}", r.mode);
                let in_txns: u64 = r.transactions.iter().map(|t| t.records).sum();
                assert_eq!(
                    in_txns, r.records,
                    "{}: records of the committed transactions",
                    r.mode
                );
            }
            None => assert_eq!(r.commits, 0),
        }
    }
    for mode in ["txn-100ms", "overlap-100ms"] {
        let txn = report.summary(mode, 100).expect("summary");
        assert!(txn.ratio_to_idempotent.is_some(), "{mode}");
        assert!(
            txn.commit_p50_ms.is_some() && txn.commit_p99_ms.is_some(),
            "{mode}"
        );
    }

    let written = written.expect("writing the outputs");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).expect("results.json"))
            .expect("valid JSON");
    assert_eq!(json["runs"].as_array().map(Vec::len), Some(6));
    let png = std::fs::read(out.join("throughput.png")).expect("throughput.png");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(written.len(), 4);
    let _ = std::fs::remove_dir_all(&out);
    eprintln!("smoke run took {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
#[ignore = "waits out the 10 s broker check: run scripts/test.sh"]
fn no_broker_is_a_clear_error() {
    // Port 1 on loopback: nothing listens there.
    let opts = BenchOptions {
        kafka: KafkaConfig::new("127.0.0.1:1"),
        sizes: vec![100],
        workload: Workload::Records(vec![10]),
        partitions: 1,
        repeats: 1,
        modes: expand(&[ModeKind::Plain], &[]),
        warmup: 0,
        out_dir: None,
        prefix: format!("pb-test-{}-", unique_suffix()),
        cleanup: true,
        progress: false,
    };
    let err = bench::run(&opts, &AtomicBool::new(false)).expect_err("no broker at port 1");
    let err = format!("{err:#}");
    assert!(
        err.contains("no Kafka broker to benchmark") && err.contains("127.0.0.1:1 refused"),
        "{err}"
    );
}
