//! The short chaos run on the local 3-broker cluster (`scripts/kafka.sh up --brokers 3`, which
//! scripts/test.sh starts): three pipeline instances (dynamic membership: see
//! `ChaosOptions::short` for why) over a live stream with fault injection,
//! SIGKILLs and SIGTERMs of instances, a zombie paused beyond its transaction timeout, a hard and
//! a clean broker bounce (the first of a transaction coordinator, the second of the group
//! coordinator). Then
//! exactly-once is checked as the runner does (offsets, verifier, hanging transactions, DLQ).
//! The short run joins live alerts (the rules topic) and changes 40 of them while it plays.
//!
//! It is a command docs/testing.md shows (issue 45: every shown command runs): the long
//! pipeline-only run with live alerts, parsed by alert-chaos's own parser, with every count and
//! duration dropped so that they are alert-chaos's defaults, the short run's
//! ([`NOT_FROM_THE_PAGE`]). tests/doc_runs.rs counts that command as run here.
//!
//! Under both group protocols: the suite's (`GROUP_PROTOCOL`, classic by default) and KIP-848's
//! consumer protocol (`…_under_the_consumer_protocol`), where no client session is given, a
//! SIGKILLed instance's partitions wait for the broker's 45 s session and the zombie is paused
//! past it. The two take turns at the cluster. scripts/test.sh skips the second by name, for
//! time (169 s against the classic one's 128 s, 2026-12-06, on the cluster lane, the suite's
//! longest): `GROUP_PROTOCOL=consumer scripts/test.sh` runs the first under the consumer protocol,
//! and by hand `cargo test --test chaos short_chaos -- --include-ignored` runs both.
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
//! all-stage run is `alert-chaos` without `--pipeline-only`, run by hand (docs/testing.md,
//! "Chaos").
//! The second test, the all-stage run with a coordinator kill, shows that hang as a check (an
//! instance stuck) and runs only when asked for: see its doc.

mod common;
mod doc_commands;

use clap::Parser as _;
use common::cluster::{cluster, cluster_to_myself};
use common::suite_protocol;
use doc_commands::{LaneTest, Shown};
use price_alerts::cli::chaos::ChaosArgs;
use price_alerts::kafka::config::GroupProtocol;
use price_alerts::tools::chaos::plan::Stage;
use price_alerts::tools::chaos::stages::GroupProtocols;
use price_alerts::tools::chaos::{self, ChaosOptions};
use std::path::PathBuf;
use std::time::Duration;

/// The seed of a run: `CHAOS_SEED`, or a random one (printed).
fn seed() -> u64 {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("chaos seed {seed} (replay with CHAOS_SEED={seed})");
    seed
}

#[test]
#[ignore = "needs the 3-broker cluster: run scripts/test.sh"]
fn short_chaos_on_three_brokers_loses_and_doubles_nothing() {
    short_chaos(suite_protocol());
}

/// The same under KIP-848's consumer protocol: no client session is given, a SIGKILLed
/// instance's partitions wait for the broker's session (45 s), the zombie is paused past it, and
/// the bounced group coordinator is the consumer group's. Skipped by name in scripts/test.sh
/// (module doc).
#[test]
#[ignore = "needs the 3-broker cluster; skipped by scripts/test.sh for time: run by hand"]
fn short_chaos_on_three_brokers_loses_and_doubles_nothing_under_the_consumer_protocol() {
    short_chaos(GroupProtocol::Consumer);
}

/// What the short run takes from the command docs/testing.md shows (issue 45): all of it but
/// these, each dropped with its value so that it takes alert-chaos's default, which is the short
/// run's ([`ChaosOptions::short`]): its counts and durations (a shown run takes 9 to 34 minutes,
/// the short one about two), its work folder and seed (the test's: `CHAOS_SEED` or random), and
/// what the test gives instead: the cluster, the binary, the group protocol.
const NOT_FROM_THE_PAGE: &[&str] = &[
    "--ticks",
    "--symbols",
    "--partitions",
    "--instances",
    "--span",
    "--kills",
    "--terms",
    "--zombies",
    "--hard-bounces",
    "--clean-bounces",
    "--coordinator-kills",
    "--coordinator-down",
    "--database-downs",
    "--sink-instances",
    "--deliver-instances",
    "--subscriber-outage",
    "--alert-changes",
    "--limit",
    "--work-dir",
    "--seed",
    "--bootstrap",
    "--brokers",
    "--kafka-sh",
    "--pipeline",
    "--group-protocol",
    "--pipeline-group-protocol",
];

/// The alert-chaos command of the pages that the short run is: the one
/// [`doc_commands::lane_test`] gives to [`LaneTest::ShortChaos`] (a pipeline-only run with live
/// alerts, docs/testing.md's long one), so that tests/doc_runs.rs counts it as run.
fn shown_short_run() -> Shown {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let binaries = doc_commands::binaries(&root.join("src/bin"));
    let shown: Vec<Shown> = doc_commands::shown_commands(&root, &binaries)
        .into_iter()
        .filter(|s| doc_commands::lane_test(s) == Some(LaneTest::ShortChaos))
        .collect();
    assert_eq!(
        shown.len(),
        1,
        "one shown command for the short run, not {shown:#?}"
    );
    shown.into_iter().next().expect("one")
}

/// The short run's options: `shown`'s arguments but [`NOT_FROM_THE_PAGE`], parsed by
/// alert-chaos's own parser, with the test's cluster, pipeline binary, seed and group protocol.
fn short_run_options(shown: &Shown, seed: u64, protocol: GroupProtocol) -> ChaosOptions {
    assert!(
        shown.env.is_empty() && !shown.partial,
        "{shown}: show the run whole, without environment words"
    );
    let mut args: Vec<String> = Vec::new();
    let mut words = shown.args.iter();
    while let Some(w) = words.next() {
        let flag = w.split_once('=').map_or(w.as_str(), |(f, _)| f);
        if NOT_FROM_THE_PAGE.contains(&flag) {
            if !w.contains('=') {
                words.next();
            }
        } else {
            args.push(w.clone());
        }
    }
    let cluster = cluster();
    let protocol = match protocol {
        GroupProtocol::Classic => "classic",
        GroupProtocol::Consumer => "consumer",
    };
    args.extend(
        [
            "--bootstrap",
            &cluster.kafka.bootstrap,
            "--brokers",
            &cluster.brokers.to_string(),
            "--kafka-sh",
            &cluster.kafka_sh.display().to_string(),
            "--pipeline",
            env!("CARGO_BIN_EXE_alert-pipeline"),
            "--seed",
            &seed.to_string(),
            "--group-protocol",
            protocol,
        ]
        .map(str::to_owned),
    );
    eprintln!("{shown}\n    run as: alert-chaos {}", args.join(" "));
    ChaosArgs::try_parse_from(std::iter::once("alert-chaos".to_owned()).chain(args))
        .unwrap_or_else(|e| panic!("{shown}: alert-chaos refuses it: {e}"))
        .options()
        .unwrap_or_else(|e| panic!("{shown}: no run options: {e:#}"))
}

/// Without a broker: the page's command gives the short run, and only its mode comes from the
/// page (a pipeline-only run with live alerts).
#[test]
fn the_short_run_is_the_pages_command_with_the_short_runs_sizes() {
    let shown = shown_short_run();
    let opts = short_run_options(&shown, 7, GroupProtocol::Classic);
    let short = ChaosOptions::short(cluster(), opts.pipeline.clone(), 7);
    assert_eq!(
        (opts.ticks, opts.symbols, opts.partitions, opts.instances),
        (
            short.ticks,
            short.symbols,
            short.partitions,
            short.instances
        )
    );
    assert_eq!((opts.span, opts.limit), (short.span, short.limit));
    assert_eq!(opts.faults, short.faults);
    assert_eq!(opts.work_dir, short.work_dir);
    assert!(opts.downstream.is_none(), "the pipeline alone");
    assert_eq!(opts.alert_changes, Some(40), "live alerts, 40 changes");
    assert_eq!(
        opts.group_protocols,
        GroupProtocols::all(GroupProtocol::Classic)
    );
}

fn short_chaos(protocol: GroupProtocol) {
    // Both runs bounce brokers of the one cluster: one at a time.
    let _cluster = cluster_to_myself();
    let seed = seed();
    // Live alerts (issue 42): the rules in the rules topic, 40 alert changes during the chaos;
    // the file's path stays covered by the pipeline's and the failure tests.
    let opts = short_run_options(&shown_short_run(), seed, protocol);
    let report = chaos::run(&opts).expect("the chaos run is carried out");
    println!("{report}");
    let ran: Vec<(Stage, GroupProtocol)> = report
        .group_protocols
        .iter()
        .map(|(s, p, _)| (*s, *p))
        .collect();
    assert_eq!(ran, [(Stage::Pipeline, protocol)], "the protocol asked for");
    let changes = report.alert_changes.expect("a live-alerts run");
    assert!(
        changes.total() >= 30,
        "alerts were changed while the chaos played: {changes:?}"
    );
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

/// The short all-stage run with coordinator kills (issue 20): the group coordinator's broker
/// SIGKILLed while the instances commit and kept down past the transaction timeout + 30 s, within
/// which every instance that was running must make progress or exit by itself (and be
/// restarted). One kill takes the pipeline's group; `CHAOS_COORDINATOR_KILLS=3` takes the sink's
/// and the deliverer's in turn. Over 150 s per kill instead of 60 s, so that the input still
/// flows through each kill's check window; no PostgreSQL shutdowns, so that the run judges the
/// kills (the all-stage short run has them).
///
/// By hand, not in scripts/test.sh (which skips it by name: with one kill it takes about five
/// minutes, and tests/coordinator.rs covers each stage's call at a coordinator's loss):
/// `cargo test --test chaos a_coordinator_kill -- --include-ignored` with the cluster and
/// PostgreSQL up; `CHAOS_COORDINATOR_KILLS=<kills>` (default 1).
#[test]
#[ignore = "needs the 3-broker cluster and PostgreSQL; run by hand (about 5 minutes a kill)"]
fn a_coordinator_kill_leaves_no_instance_stuck() {
    let _cluster = cluster_to_myself();
    let kills = std::env::var("CHAOS_COORDINATOR_KILLS")
        .ok()
        .and_then(|k| k.parse::<u32>().ok())
        .unwrap_or(1);
    let seed = seed();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let database_url = std::env::var("DATABASE_URL")
        .ok()
        .or_else(|| std::fs::read_to_string(root.join(".postgres/url")).ok())
        .map(|u| u.trim().to_owned())
        .expect("no DATABASE_URL and no .postgres/url: run scripts/postgres.sh up");
    let binaries = PathBuf::from(env!("CARGO_BIN_EXE_alert-pipeline"));
    let mut opts = ChaosOptions::short_all_stages(
        cluster(),
        binaries.parent().expect("the binaries' folder"),
        seed,
        root.join("scripts/postgres.sh"),
        database_url,
    );
    opts.group_protocols = GroupProtocols::all(suite_protocol());
    // 150 s of input per kill at 400 ticks a second: the kills take turns (one broker down at a
    // time, 70 s each and the recovery), and each needs input flowing through its check window.
    opts.span = Duration::from_secs(150) * kills.max(1);
    opts.ticks = 400 * opts.span.as_secs() as usize;
    opts.faults.database_downs = 0;
    opts.faults.coordinator_kills = kills;
    if let Some(d) = &mut opts.downstream {
        d.subscriber_outage.after = opts.span / 4;
    }
    // Each kill holds the broker down for 70 s, and bounces wait for it.
    opts.limit = opts.span + Duration::from_secs(900);
    let report = chaos::run(&opts).expect("the chaos run is carried out");
    println!("{report}");
    let stages: Vec<Stage> = report.coordinator_kills.iter().map(|k| k.stage).collect();
    let turn = [Stage::Pipeline, Stage::Sink, Stage::Deliver];
    assert_eq!(
        stages,
        turn.iter()
            .cycle()
            .take(kills as usize)
            .copied()
            .collect::<Vec<_>>(),
        "every planned coordinator kill happened, the stages' groups in turn"
    );
    for k in &report.coordinator_kills {
        assert!(
            !k.instances.is_empty(),
            "the kill watched the instances running then: {k}"
        );
    }
    assert_eq!(
        report.stuck(),
        0,
        "instances stuck after a coordinator kill (seed {seed}; logs in {}): {:#?}",
        opts.work_dir.display(),
        report.coordinator_kills
    );
    assert!(
        report.ok(),
        "exactly-once did not hold through every stage (seed {seed}); instance logs in {}",
        opts.work_dir.display()
    );
}
