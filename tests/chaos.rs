//! The short chaos run on the local 3-broker cluster (`scripts/kafka.sh up --brokers 3`, which
//! scripts/test.sh starts): three pipeline instances (dynamic membership: see
//! `ChaosOptions::short` for why) over a live stream with fault injection,
//! SIGKILLs and SIGTERMs of instances, a zombie paused beyond its transaction timeout, a hard and
//! a clean broker bounce (the first of a transaction coordinator, the second of the group
//! coordinator). Then
//! exactly-once is checked as the runner does (offsets, verifier, hanging transactions, DLQ).
//!
//! The seed is printed; `CHAOS_SEED=<seed>` replays the same stream and schedule.
//!
//! Why the suite runs the pipeline-only short run and not the all-stage one (`alert-chaos`'s
//! default, which also carries notifications through alert-sink and alert-deliver): in a
//! fresh-clone run of scripts/test.sh the all-stage run found alert-deliver's group making no
//! progress after a hard bounce of the group coordinator (both deliverers and two pipeline
//! instances hung until their shutdown timeout, the pipeline output still exactly once). That is
//! the transactional hang of issue 20 (librdkafka #5456/#5511: no deadline on the hand-off's
//! transactional calls yet). Until that issue gives every transactional call a deadline, the
//! all-stage run is `alert-chaos` without `--pipeline-only`, run by hand (README, "Chaos").

use price_alerts::kafka::KafkaConfig;
use price_alerts::tools::chaos::cluster::{Cluster, DEFAULT_CLUSTER_BOOTSTRAP};
use price_alerts::tools::chaos::{self, ChaosOptions};
use std::path::PathBuf;

#[test]
#[ignore = "needs the 3-broker cluster: run scripts/test.sh"]
fn short_chaos_on_three_brokers_loses_and_doubles_nothing() {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("chaos seed {seed} (replay with CHAOS_SEED={seed})");
    let bootstrap = std::env::var("KAFKA_CLUSTER_BOOTSTRAP")
        .unwrap_or_else(|_| DEFAULT_CLUSTER_BOOTSTRAP.to_owned());
    let cluster = Cluster {
        kafka_sh: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka.sh")),
        kafka: KafkaConfig::new(bootstrap),
        brokers: 3,
    };
    let opts = ChaosOptions::short(
        cluster,
        PathBuf::from(env!("CARGO_BIN_EXE_alert-pipeline")),
        seed,
    );
    let report = chaos::run(&opts).expect("the chaos run is carried out");
    println!("{report}");
    let fig = &report.figures;
    assert_eq!(
        (fig.sigkills, fig.sigterms, fig.sigstops),
        (3, 3, 1),
        "every planned instance fault was fired"
    );
    assert_eq!(
        fig.zombies_fenced, 1,
        "the zombie was fenced after SIGCONT: {:?}",
        fig.zombie_outcomes
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
    assert!(
        report.ok(),
        "exactly-once did not hold under chaos (seed {seed}); instance logs in {}",
        opts.work_dir.display()
    );
}
