//! The chaos runner: exactly-once under crashes, zombies and broker failover, on a real cluster.
//!
//! A run creates fresh topics on the local cluster (`scripts/kafka.sh up --brokers 3`), feeds a
//! seeded tick stream while it runs, and starts N `alert-pipeline` instances with fault injection
//! on (so dead letters happen). Then it plays a seeded schedule ([`plan`]): SIGKILL and SIGTERM
//! of instances (restarted with the same id), one instance SIGSTOPped beyond its transaction
//! timeout and woken up (a zombie: the group has moved on and its transaction was aborted), and
//! hard (SIGKILL) and clean (SIGTERM) bounces of brokers, the first aimed at the transaction
//! coordinator of an instance, the next at the group coordinator ([`bounce`], [`cluster`]), and
//! coordinator kills: the group coordinator's broker SIGKILLed and kept down beyond the bound
//! within which every instance of the stage must have moved on by itself, which then is checked:
//! no instance stuck ([`coordinator`]).
//!
//! ```text
//!   feed thread ──► input ──► instances 0..N (restarted on exit) ──► notifications, state, DLQ
//!   main loop (every 100 ms): reap/restart/escalate/resume instances ([`instances`]),
//!                             fire the faults that are due ([`plan`]; `main_loop`)
//!   bounce thread (one at a time): wait until fully replicated ─► locate the target ─► stop/kill
//!                             ─► down for a while ─► start ─► wait until fully replicated
//!                             ([`bounce`])
//!   kill thread (instead of a bounce, never beside one): the same with the group coordinator,
//!                             SIGKILL, down past the stuck bound; at the kill the stage's running
//!                             instances are watched ([`instances`])
//!   end: input fed and faults done ─► committed offsets reach the input's end ─► SIGTERM all
//!        ─► checks ([`checks`]) ─► figures ([`ChaosReport`], [`report`])
//! ```
//!
//! An all-stage run ([`ChaosOptions::downstream`], the short run's and the binary's default)
//! carries the notifications on through every stage: alert-sink instances write them to a fresh
//! PostgreSQL database, alert-deliver instances post them to the runner's own webhook
//! subscribers, one of which fails (503) for a while so the retry buckets carry its deliveries
//! ([`downstream`], [`subscribers`]). Each stage's instances ([`stages`]) get the same kinds and
//! counts of faults as the pipeline's (the zombies paused beyond the transaction timeout and
//! beyond their stage's session: [`ChaosOptions::zombie_pause`]), and PostgreSQL is shut down at
//! once (`pg_ctl -m immediate`) and started again a few seconds later ([`database`]).
//!
//! ```text
//!   feed ──► input ──► pipeline × N ──► notifications ─┬─► sink × N ──► PostgreSQL (alerts)
//!                                                      └─► deliver × N ──► subscribers (+ buckets)
//!   main loop: tick every stage's instances; fire due faults: instance faults of any stage,
//!              broker bounces (bounce thread), PostgreSQL shutdowns (database thread)
//!   end: pipeline drained ─► sink and deliver drained (their groups at their inputs' data ends)
//!        ─► SIGTERM all ─► checks of every stage ─► figures
//! ```
//!
//! Each stage's instances speak the group protocol [`ChaosOptions::group_protocols`] gives that
//! stage: `classic` (the default, with the run's short client session) or KIP-848's `consumer`
//! (the broker's session, read from the cluster at the start); the zombies' pause follows it,
//! and the report says which protocol each stage ran ([`stages`], `# The group protocol of each
//! stage`).
//!
//! Bounded in time: the whole run fails past `limit`. Only one broker is down at a time, and the
//! next bounce waits until every partition's ISR is complete again, so no partition drops below
//! min.insync.replicas by the runner's doing: what is tested is failover, not an outage.
//!
//! # The files
//! One concept each, in the order of a run; [`run`] here wires them together.
//!
//! - [`options`]: what to run ([`ChaosOptions`]), and what follows from it for each stage;
//! - [`plan`]: the seeded schedule of faults;
//! - [`stages`], [`instances`]: every stage's supervised instances and their signals;
//! - `main_loop`: the chaos played (the due faults fired, the instances kept alive), then the
//!   drains until every stage has consumed its input;
//! - the faults that take a thread of their own: [`bounce`] (a broker), [`coordinator`] (the
//!   group coordinator's broker, kept down), [`database`] (PostgreSQL's shutdowns), and the live
//!   alert changes ([`alerts`]);
//! - [`downstream`], [`subscribers`]: the stages after the pipeline, their database and webhooks;
//! - [`cluster`]: the brokers driven through `scripts/kafka.sh`, and the coordinators located;
//! - [`checks`]: what a run must leave behind; [`report`]: what it found, and the verdict.

pub mod alerts;
pub mod bounce;
pub mod checks;
pub mod cluster;
pub mod coordinator;
pub mod database;
pub mod downstream;
pub mod instances;
mod main_loop;
pub mod options;
pub mod plan;
pub mod report;
pub mod stages;
pub mod subscribers;

pub use bounce::Bounce;
pub use options::{ChaosOptions, BROKER_CONSUMER_SESSION};
pub use report::ChaosReport;

use crate::dlq::FaultInjection;
use crate::kafka::config::GroupProtocol;
use crate::kafka::feed::next_offsets;
use crate::kafka::offsets::committed_offsets;
use crate::kafka::topics::{self, Topics};
use crate::oracle::{expected_from_input, expected_from_live, verify, verify_live, VerifyReport};
use crate::tick::DEFAULT_MAX_TICK_BYTES;
use crate::tools::generate::{generate, GenOptions};
use anyhow::Context as _;
use database::ServerGuard;
use downstream::{Downstream, DownstreamReport};
use instances::Launch;
use main_loop::{drain, drain_downstream, play, spawn_feed};
use plan::Stage;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use stages::Stages;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Bound on waiting for every ISR to be complete, before and after a bounce.
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(180);
/// From a coordinator kill's moment in the schedule to the broker's death: the replication wait
/// and the coordinator's look-up. The kills are planned this much (and the stuck bound) before
/// the feed ends, so that the stage has input to commit while it is watched.
const KILL_LEAD: Duration = Duration::from_secs(10);

/// Runs the chaos and checks what it left. An `Err` means the run itself could not be carried
/// out (cluster control failed, the limit passed); a finished run returns its report, whose
/// [`ChaosReport::ok`] is the verdict.
pub fn run(opts: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    let started = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let kafka = &opts.cluster.kafka;
    let prefix = format!("chaos-{}-{}-", opts.seed, topics::unique_suffix());
    let app_id = format!("{prefix}app");
    let topics = Topics::with(
        format!("{prefix}market-updates"),
        format!("{prefix}notifications"),
        &app_id,
    );
    info!(seed = opts.seed, prefix, "chaos run");
    let (rules, ticks) = generate(&GenOptions {
        symbols: opts.symbols,
        ticks: opts.ticks,
        seed: opts.seed,
        stale_every: 97,
    });
    std::fs::create_dir_all(&opts.work_dir)
        .with_context(|| format!("creating {}", opts.work_dir.display()))?;
    let rules_path = opts.work_dir.join("rules.toml");
    std::fs::write(&rules_path, rules.to_toml())
        .with_context(|| format!("writing {}", rules_path.display()))?;

    // Every broker up and every ISR complete first: topics get the cluster's replication factor
    // only with all brokers registered.
    opts.cluster.wait_fully_replicated(REPLICATION_TIMEOUT)?;
    // A consumer-protocol stage's session is the broker's: the zombies' pause must outlast it.
    let read;
    let opts = if opts
        .group_protocols
        .any(&opts.stages(), GroupProtocol::Consumer)
    {
        read = ChaosOptions {
            consumer_session_timeout: opts.cluster.consumer_session_timeout()?,
            ..opts.clone()
        };
        &read
    } else {
        opts
    };
    let group_protocols: Vec<(Stage, GroupProtocol, Duration)> = (opts.stages().into_iter())
        .map(|s| (s, opts.group_protocols.of(s), opts.session(s)))
        .collect();
    for (stage, protocol, session) in &group_protocols {
        info!(
            stage = stage.name(),
            %protocol,
            session_s = session.as_secs_f64(),
            "group protocol"
        );
    }
    futures::executor::block_on(topics::ensure(kafka, &topics, Some(opts.partitions)))?;
    let rules_topic = match opts.alert_changes {
        Some(_) => Some(alerts::load(kafka, &app_id, &topics.input, &rules)?),
        None => None,
    };
    let mut replication = checks::replication_problems(
        &opts.cluster,
        topics.names().into_iter().chain(rules_topic.as_deref()),
    )?;

    // The stages after the pipeline: their database, subscribers and launches. The guard starts
    // PostgreSQL again however the run ends.
    let downstream = match &opts.downstream {
        Some(d) => {
            let name = format!("chaos_{}_{}", opts.seed, topics::unique_suffix());
            let set_up =
                Downstream::set_up(d, &app_id, &topics.notifications, &name, &opts.work_dir)?;
            Some((set_up, d))
        }
        None => None,
    };
    let _database_guard = downstream.as_ref().map(|(d, _)| ServerGuard(d.db.clone()));
    let mut launches = vec![(
        launch(
            opts,
            rules_topic.is_none().then_some(rules_path.as_path()),
            &app_id,
            &topics,
        )?,
        opts.instances,
    )];
    if let Some((d, o)) = &downstream {
        launches.extend(d.launches(opts, o)?);
    }

    let kill_span = opts.span.saturating_sub(opts.stuck_bound() + KILL_LEAD);
    let schedule = plan::plan(&opts.faults, &opts.stages(), opts.span, kill_span, &mut rng);
    info!(plan = plan::summary(&schedule), "the faults");
    let seqs: Vec<u64> = ticks.iter().map(|t| t.seq).collect();
    let feed = spawn_feed(kafka.clone(), topics.input.clone(), ticks, opts.span)?;
    let stop_changes = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let changer = opts.alert_changes.map(|count| {
        alerts::spawn(
            alerts::Changer {
                kafka: kafka.clone(),
                app_id: app_id.clone(),
                input: topics.input.clone(),
                rules: rules.clone(),
                count,
                span: opts.span,
                seed: opts.seed,
            },
            std::sync::Arc::clone(&stop_changes),
        )
    });
    let mut stages = Stages::start(launches)?;
    if let Some((d, o)) = &downstream {
        d.subscribers.chaos_started(o.subscriber_outage);
    }
    let played = play(
        opts,
        &app_id,
        schedule,
        feed,
        &mut stages,
        downstream.as_ref().map(|(d, _)| d),
        &mut rng,
        started,
    )?;
    stop_changes.store(true, std::sync::atomic::Ordering::Relaxed);
    let alert_changes = changer.map(|c| c.join().unwrap_or_default());
    let end = next_offsets(&played.landed);
    info!(
        chaos_s = played.chaos.as_secs(),
        "chaos over; waiting for the committed offsets to reach the input's end"
    );
    drain(
        kafka,
        &app_id,
        &topics.input,
        &end,
        &mut stages,
        opts.limit.saturating_sub(started.elapsed()),
    )?;
    // The oracle of every stage: the notifications the input implies.
    let faults = FaultInjection { enabled: true };
    let mut oracle = VerifyReport::default();
    let expected = match &rules_topic {
        Some(rt) => expected_from_live(
            kafka,
            &topics.input,
            rt,
            DEFAULT_MAX_TICK_BYTES,
            faults,
            &mut oracle,
        )?,
        None => expected_from_input(
            kafka,
            &topics.input,
            &rules,
            DEFAULT_MAX_TICK_BYTES,
            faults,
            &mut oracle,
        )?,
    };
    if let Some((d, _)) = &downstream {
        info!(
            expected = expected.len(),
            "pipeline drained; waiting for the sink and the deliverer"
        );
        drain_downstream(
            kafka,
            d,
            &mut stages,
            opts.limit.saturating_sub(started.elapsed()),
        )?;
    }
    // How each watched instance came out of its kill, judged before the stop (which SIGTERMs all).
    let mut coordinator_kills = played.coordinator_kills;
    for k in &mut coordinator_kills {
        if let Some(instances) = stages.get(k.stage) {
            k.instances = instances.progress(k.kill);
        }
    }
    let final_exits = stages.stop_all(opts.shutdown_timeout + Duration::from_secs(10))?;
    stages.finish_zombies();

    // The checks, once every instance has stopped.
    let mut outputs = vec![
        topics.notifications.clone(),
        topics.changelog.clone(),
        topics.dlq.clone(),
    ];
    // Live alerts: the one-shots' tombstones are written in the pipeline's transactions.
    outputs.extend(rules_topic.clone());
    if let Some((d, _)) = &downstream {
        outputs.extend(d.deliver_topics());
        let deliver_topics = d.deliver_topics();
        replication.extend(checks::replication_problems(
            &opts.cluster,
            deliver_topics.iter().map(String::as_str),
        )?);
    }
    let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    let open_transactions = checks::wait_no_open_transactions(
        kafka,
        &outputs,
        opts.transaction_timeout + Duration::from_secs(30),
    )?;
    let mut hanging = Vec::new();
    for b in 1..=opts.cluster.brokers {
        hanging.extend(
            opts.cluster
                .find_hanging(b)?
                .into_iter()
                .map(|row| format!("broker {b}: {row}")),
        );
    }
    let verify = match &rules_topic {
        Some(rt) => verify_live(
            kafka,
            &topics.input,
            &topics.notifications,
            rt,
            DEFAULT_MAX_TICK_BYTES,
            faults,
        )?,
        None => verify(
            kafka,
            &topics.input,
            &topics.notifications,
            &rules,
            DEFAULT_MAX_TICK_BYTES,
            faults,
        )?,
    };
    let poison: BTreeSet<(i32, i64)> = (played.landed.iter().zip(&seqs))
        .filter(|(_, s)| faults.is_poison(**s))
        .map(|(l, _)| (l.partition, l.offset))
        .collect();
    let dead_letters = checks::dead_letters_once(kafka, &topics.dlq, &poison)?;
    let pipeline_ids: Vec<String> = (0..opts.instances).map(|i| i.to_string()).collect();
    let (commits, aborts) = report::logged_transactions(&opts.work_dir, &pipeline_ids);
    let downstream_report = match &downstream {
        Some((d, _)) => Some(DownstreamReport {
            database_downs: played.database_downs.clone(),
            checks: d.check(kafka, &expected)?,
        }),
        None => None,
    };
    let report = ChaosReport {
        seed: opts.seed,
        prefix,
        ticks: opts.ticks,
        instances: opts.instances,
        figures: stages.figures(Stage::Pipeline),
        stages: stages.all_figures(),
        group_protocols,
        bounces: played.bounces,
        coordinator_kills,
        commits,
        aborts,
        replication,
        committed: committed_offsets(kafka, &app_id, &topics.input)?,
        end,
        verify,
        dead_letters,
        open_transactions,
        hanging,
        final_exits,
        chaos: played.chaos,
        total: started.elapsed(),
        downstream: downstream_report,
        alert_changes,
    };
    if report.ok() && !opts.keep_topics {
        let mut names: Vec<String> = topics.names().map(str::to_owned).to_vec();
        names.extend(rules_topic.clone());
        if let Some((d, _)) = &downstream {
            names.extend(d.deliver_topics());
            if let Err(e) = d.db.drop_database() {
                warn!(
                    error = format!("{e:#}"),
                    "could not drop the run's database"
                );
            }
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        if let Err(e) = futures::executor::block_on(topics::delete_topics(kafka, &names)) {
            warn!(
                error = format!("{e:#}"),
                "could not delete the run's topics"
            );
        }
    }
    Ok(report)
}

/// How the pipeline's instances are started ([`stages::launch`]): the rules, app id and topics,
/// fault injection, and the run's transaction timeout and commit interval.
fn launch(
    opts: &ChaosOptions,
    rules: Option<&std::path::Path>,
    app_id: &str,
    topics: &Topics,
) -> anyhow::Result<Launch> {
    // A rules file, or live alerts (the rules topic, loaded before the start).
    let mut args: Vec<String> = match rules {
        Some(path) => vec!["--rules".to_owned(), path.display().to_string()],
        None => vec!["--live-rules".to_owned()],
    };
    args.extend(
        [
            "--app-id",
            app_id,
            "--input",
            &topics.input,
            "--output",
            &topics.notifications,
            "--inject-faults",
            "--transaction-timeout",
            &stages::ms(opts.transaction_timeout),
            "--commit-interval",
            &stages::ms(opts.commit_interval),
        ]
        .map(str::to_owned),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    stages::launch(opts, Stage::Pipeline, &opts.pipeline, &args, Vec::new())
}
