//! rebalance-bench against a real broker: one short repeat of both protocols must give an idle
//! figure for every partition of every event under every protocol, every event settled, and
//! figures that could only come from watching the group: after the SIGKILL the killed member's
//! partitions cannot have moved before its session expired (at the earliest a session timeout
//! less a heartbeat interval after the kill, the member's last heartbeat being that old at most),
//! so a run that measured nothing, or measured the wrong thing, fails here.
//!
//! The classic session is shortened to 10 s to keep the run short; the consumer protocol's is the
//! broker's (45 s at the least). About 2 minutes in all.
//!
//! Needs the release or debug `alert-pipeline` beside the test's own folder (`cargo build
//! --workspace --bins`, which scripts/test.sh does), or ALERT_PIPELINE naming one.

use price_alerts::kafka::config::GroupProtocol;
use price_alerts::kafka::topics::unique_suffix;
use price_alerts::kafka::KafkaConfig;
use price_alerts_bench::rebalance::{self, idle::Settle, Event, Options};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 6;
const CLASSIC_SESSION: Duration = Duration::from_secs(10);

fn kafka() -> KafkaConfig {
    KafkaConfig::new(std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into()))
}

/// `target/<profile>/alert-pipeline`, beside the `deps` folder of this test binary.
fn pipeline_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("ALERT_PIPELINE") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let bin = profile_dir.join("alert-pipeline");
    assert!(
        bin.exists(),
        "{} is missing: cargo build --workspace --bins (or set ALERT_PIPELINE)",
        bin.display()
    );
    bin
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn every_partition_of_every_event_and_protocol_has_a_sane_idle_figure() {
    let started = Instant::now();
    let out = std::env::temp_dir().join(format!("rebalance-bench-test-{}", unique_suffix()));
    let opts = Options {
        kafka: kafka(),
        binary: pipeline_binary(),
        protocols: vec![GroupProtocol::Classic, GroupProtocol::Consumer],
        repeats: 1,
        partitions: PARTITIONS,
        rate: 300,
        symbols: 60,
        commit_interval: Duration::from_millis(100),
        classic_session_timeout: CLASSIC_SESSION,
        pipeline_args: Vec::new(),
        poll: Duration::from_millis(50),
        settle: Settle {
            quiet: 1.0,
            hold: 2.0,
        },
        event_timeout: Duration::from_secs(60),
        start_timeout: Duration::from_secs(120),
        log_dir: out.join("logs"),
    };
    let report = rebalance::run(&opts, |line| eprintln!("{line}")).expect("benchmark run");
    let table = rebalance::write_outputs(&out, &report).expect("outputs");
    eprintln!("{table}");

    assert_eq!(report.runs.len(), 2, "one run per protocol");
    for protocol in ["classic", "consumer"] {
        let session = report.session(protocol).expect("session settings");
        let session_s = session.session_timeout_ms as f64 / 1e3;
        let heartbeat_s = session.heartbeat_interval_ms as f64 / 1e3;
        if protocol == "classic" {
            assert_eq!(session_s, CLASSIC_SESSION.as_secs_f64());
        } else {
            // The broker's, read from it: at least its minimum, 45 s unless lowered.
            assert!(session_s >= 1.0, "{session:?}");
        }
        for event in Event::ALL {
            let results: Vec<_> = report
                .events()
                .filter(|e| e.protocol == protocol && e.event == event)
                .collect();
            assert_eq!(results.len(), 1, "{protocol} {event}");
            let e = results[0];
            assert!(e.settled, "{e}");
            assert_eq!(e.idle_s.len(), PARTITIONS as usize, "{e}");
            let idle: Vec<f64> = e.idle_s.iter().map(|s| s.expect("a figure")).collect();
            assert!(
                idle.iter().all(|s| s.is_finite() && *s > 0.0),
                "{protocol} {event}: {idle:?}"
            );
            let max = e.max_idle_s().expect("figures");
            match event {
                Event::Sigterm => {
                    // A clean stop: the instance committed, left and exited 0.
                    assert_eq!(e.exit.as_deref(), Some("exit status: 0"), "{e}");
                }
                Event::Sigkill => {
                    assert!(
                        max >= session_s - heartbeat_s,
                        "{protocol}: a killed member's partitions idled {max:.2} s, less than its session ({session_s} s) less a heartbeat ({heartbeat_s} s): {e}"
                    );
                    assert!(max <= session_s + 60.0, "{e}");
                    // The survivor's own partitions kept going: not every partition waited.
                    let waited = idle
                        .iter()
                        .filter(|s| **s >= session_s - heartbeat_s)
                        .count();
                    assert!(waited < idle.len(), "{e}");
                }
                Event::Join => {
                    assert!(e.anchor_s.is_some(), "the new instance committed: {e}");
                }
            }
        }
    }
    for file in [
        "results.json",
        "results.md",
        "idle.csv",
        "summary.csv",
        "idle.png",
    ] {
        assert!(out.join(file).exists(), "{file} written");
    }
    let rows = std::fs::read_to_string(out.join("idle.csv")).expect("idle.csv");
    // A header, and a row per partition, event and protocol.
    assert_eq!(rows.lines().count(), 1 + PARTITIONS as usize * 3 * 2);
    let _ = std::fs::remove_dir_all(&out);
    eprintln!("took {:.0} s", started.elapsed().as_secs_f64());
}
