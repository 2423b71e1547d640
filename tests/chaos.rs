//! The short chaos run on the local 3-broker cluster (`scripts/kafka.sh up --brokers 3`, which
//! scripts/test.sh starts), carried through every stage: three pipeline instances (dynamic
//! membership: see `ChaosOptions::short` for why) over a live stream with fault injection, two
//! alert-sink instances writing to a fresh database on the PostgreSQL of scripts/postgres.sh, two
//! alert-deliver instances posting to the runner's webhook subscribers (one fails for 10 s).
//! Each stage's instances get SIGKILLs, SIGTERMs and a zombie paused beyond its transaction
//! timeout; a hard and a clean broker bounce (the first of a transaction coordinator, the second
//! of the group coordinator); two immediate PostgreSQL shutdowns. Then exactly-once is checked
//! as the runner does: the pipeline's (offsets, verifier, hanging transactions, DLQ), the alerts
//! table against the oracle, every subscriber's accepted keys, the deliverer's given-up records,
//! and every group's progress.
//!
//! The seed is printed; `CHAOS_SEED=<seed>` replays the same stream and schedule.

use price_alerts::kafka::KafkaConfig;
use price_alerts::tools::chaos::cluster::{Cluster, DEFAULT_CLUSTER_BOOTSTRAP};
use price_alerts::tools::chaos::plan::Stage;
use price_alerts::tools::chaos::{self, ChaosOptions};
use std::path::{Path, PathBuf};

/// The PostgreSQL server: `DATABASE_URL` (scripts/test.sh sets it), or the URL
/// scripts/postgres.sh wrote.
fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(".postgres/url");
        std::fs::read_to_string(file)
            .map(|s| s.trim().to_owned())
            .expect("no DATABASE_URL and no .postgres/url: run scripts/postgres.sh up")
    })
}

#[test]
#[ignore = "needs the 3-broker cluster and PostgreSQL: run scripts/test.sh"]
fn short_chaos_through_every_stage_loses_and_doubles_nothing() {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("chaos seed {seed} (replay with CHAOS_SEED={seed})");
    let bootstrap = std::env::var("KAFKA_CLUSTER_BOOTSTRAP")
        .unwrap_or_else(|_| DEFAULT_CLUSTER_BOOTSTRAP.to_owned());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cluster = Cluster {
        kafka_sh: root.join("scripts/kafka.sh"),
        kafka: KafkaConfig::new(bootstrap),
        brokers: 3,
    };
    let binaries = PathBuf::from(env!("CARGO_BIN_EXE_alert-pipeline"));
    let opts = ChaosOptions::short_all_stages(
        cluster,
        binaries.parent().expect("the binaries' folder"),
        seed,
        root.join("scripts/postgres.sh"),
        database_url(),
    );
    let report = chaos::run(&opts).expect("the chaos run is carried out");
    println!("{report}");
    for (stage, fig) in &report.stages {
        assert_eq!(
            (fig.sigkills, fig.sigterms, fig.sigstops),
            (3, 3, 1),
            "every planned instance fault of {stage:?} was fired"
        );
    }
    assert_eq!(
        report.stages.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        Stage::ALL,
        "every stage ran"
    );
    assert_eq!(
        report.figures.zombies_fenced, 1,
        "the pipeline's zombie was fenced after SIGCONT: {:?}",
        report.figures.zombie_outcomes
    );
    let roles: Vec<&str> = report.bounces.iter().map(|b| b.role.as_str()).collect();
    assert_eq!(
        report.bounces.len(),
        2,
        "both planned broker bounces happened"
    );
    assert!(
        roles[0].starts_with("transaction coordinator") && roles[1] == "group coordinator",
        "bounce targets: {roles:?}"
    );
    assert!(
        report.verify.expected > 1_000,
        "the stream crosses often: {} expected",
        report.verify.expected
    );
    assert!(
        report.dead_letters.expected > 500,
        "fault injection made poison ticks"
    );
    let down = report.downstream.as_ref().expect("an all-stage report");
    assert_eq!(
        down.database_downs.len(),
        2,
        "both planned PostgreSQL shutdowns happened"
    );
    assert_eq!(
        down.checks.table.expected, report.verify.expected,
        "the table is checked against the same oracle"
    );
    let flaky = down
        .checks
        .subscribers
        .iter()
        .find(|s| s.name == down.checks.failing)
        .expect("the failing subscriber's check");
    assert!(
        flaky.refused > 0,
        "the failing subscriber refused deliveries during its outage"
    );
    assert!(
        report.ok(),
        "exactly-once did not hold under chaos (seed {seed}); instance logs in {}",
        opts.work_dir.display()
    );
}
