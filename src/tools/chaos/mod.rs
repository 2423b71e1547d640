//! The chaos runner: exactly-once under crashes, zombies and broker failover, on a real cluster.
//!
//! A run creates fresh topics on the local cluster (`scripts/kafka.sh up --brokers 3`), feeds a
//! seeded tick stream while it runs, and starts N `alert-pipeline` instances with fault injection
//! on (so dead letters happen). Then it plays a seeded schedule ([`plan`]): SIGKILL and SIGTERM
//! of instances (restarted with the same id), one instance SIGSTOPped beyond its transaction
//! timeout and woken up (a zombie: the group has moved on and its transaction was aborted), and
//! hard (SIGKILL) and clean (SIGTERM) bounces of brokers, the first aimed at the transaction
//! coordinator of an instance, the next at the group coordinator ([`cluster`]), and coordinator
//! kills: the group coordinator's broker SIGKILLed and kept down beyond the bound within which
//! every instance of the stage must have moved on by itself, which then is checked: no instance
//! stuck ([`coordinator`]).
//!
//! ```text
//!   feed thread ──► input ──► instances 0..N (restarted on exit) ──► notifications, state, DLQ
//!   main loop (every 100 ms): reap/restart/escalate/resume instances ([`instances`]),
//!                             fire the faults that are due ([`plan`])
//!   bounce thread (one at a time): wait until fully replicated ─► locate the target ─► stop/kill
//!                             ─► down for a while ─► start ─► wait until fully replicated
//!   kill thread (instead of a bounce, never beside one): the same with the group coordinator,
//!                             SIGKILL, down past the stuck bound; at the kill the stage's running
//!                             instances are watched ([`instances`])
//!   end: input fed and faults done ─► committed offsets reach the input's end ─► SIGTERM all
//!        ─► checks ([`checks`]) ─► figures ([`ChaosReport`])
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

pub mod alerts;
pub mod bounce;
pub mod checks;
pub mod cluster;
pub mod coordinator;
pub mod database;
pub mod downstream;
pub mod instances;
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
use crate::kafka::feed::{next_offsets, Feed, Landed};
use crate::kafka::offsets::committed_offsets;
use crate::kafka::topics::{self, Topics};
use crate::oracle::{expected_from_input, expected_from_live, verify, verify_live, VerifyReport};
use crate::tick::DEFAULT_MAX_TICK_BYTES;
use crate::tools::generate::{generate, GenOptions};
use anyhow::{anyhow, bail, Context as _};
use bounce::bounce;
use cluster::Stop;
use coordinator::{CoordinatorKill, Killed};
use database::{DatabaseDown, ServerGuard};
use downstream::{Downstream, DownstreamReport};
use instances::Launch;
use plan::{Fault, Stage};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stages::Stages;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Bound on waiting for every ISR to be complete, before and after a bounce.
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(180);
/// Main-loop period: how late a due fault or an exited instance is noticed.
const STEP: Duration = Duration::from_millis(100);
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

/// What the chaos phase leaves: where the input landed, the bounces, how long it took.
struct Played {
    landed: Vec<Landed>,
    bounces: Vec<Bounce>,
    coordinator_kills: Vec<CoordinatorKill>,
    database_downs: Vec<DatabaseDown>,
    chaos: Duration,
}

/// The chaos: fires the due faults (in order, where one can be fired now) and keeps the instances
/// alive, until every fault is done, the input is fed and every instance runs.
#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
fn play(
    opts: &ChaosOptions,
    app_id: &str,
    mut pending: Vec<plan::Planned>,
    feed: JoinHandle<anyhow::Result<Vec<Landed>>>,
    stages: &mut Stages,
    downstream: Option<&Downstream>,
    rng: &mut ChaCha8Rng,
    started: Instant,
) -> anyhow::Result<Played> {
    let chaos_started = Instant::now();
    let mut bg = Background::default();
    let mut bounces = Vec::new();
    let mut coordinator_kills = Vec::new();
    let mut database_downs = Vec::new();
    let mut feed = Some(feed);
    let mut landed = None;
    loop {
        if started.elapsed() > opts.limit {
            bail!(
                "the chaos did not finish within {:?} ({} faults still pending)",
                opts.limit,
                pending.len()
            );
        }
        stages.tick(true)?;
        if let Some(b) = finished(&mut bg.bouncing, "bounce")? {
            info!(broker = b.broker, hard = b.hard, role = %b.role, "broker bounced");
            bounces.push(b);
        }
        // The kill's moment first: the thread sends it long before it finishes.
        if let Some(k) = bg.killed.as_ref().and_then(|rx| rx.try_recv().ok()) {
            let watched = stages
                .get(k.stage)
                .map_or(0, |i| i.watch(k.kill, opts.stuck_bound()));
            info!(
                broker = k.broker,
                stage = k.stage.name(),
                watched,
                "group coordinator killed; watching the stage's instances"
            );
        }
        if let Some(k) = finished(&mut bg.killing, "coordinator kill")? {
            info!(
                broker = k.broker,
                stage = k.stage.name(),
                "killed coordinator started again"
            );
            bg.killed = None;
            coordinator_kills.push(k);
        }
        if let Some(d) = finished(&mut bg.database, "database")? {
            info!(
                down_ms = d.down.as_millis() as u64,
                "PostgreSQL shut down and started"
            );
            database_downs.push(d);
        }
        if feed.as_ref().is_some_and(JoinHandle::is_finished) {
            let fed = feed
                .take()
                .map(JoinHandle::join)
                .transpose()
                .map_err(|_| anyhow!("the feed thread panicked"))?;
            landed = fed.transpose()?;
        }
        let now = chaos_started.elapsed();
        let mut fired = Vec::new();
        for (i, p) in pending.iter().enumerate().filter(|(_, p)| p.at <= now) {
            if fire(p.fault, opts, app_id, stages, downstream, &mut bg, rng)? {
                fired.push(i);
            }
        }
        for i in fired.into_iter().rev() {
            pending.remove(i);
        }
        let quiet = bg.bouncing.is_none() && bg.killing.is_none() && bg.database.is_none();
        if pending.is_empty() && quiet && stages.all_running() {
            if let Some(landed) = landed.take() {
                return Ok(Played {
                    landed,
                    bounces,
                    coordinator_kills,
                    database_downs,
                    chaos: chaos_started.elapsed(),
                });
            }
        }
        std::thread::sleep(STEP);
    }
}

/// Keeps the instances alive until the group's committed offsets are the input's `end`, or
/// `timeout` passed (then the checks report the difference).
fn drain(
    kafka: &crate::kafka::KafkaConfig,
    group: &str,
    input: &str,
    end: &BTreeMap<i32, i64>,
    stages: &mut Stages,
    timeout: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        stages.tick(true)?;
        // An observer's failed fetch (a coordinator still moving after a bounce) means "not yet":
        // ask again until the deadline; the checks fetch once more and report what they find.
        match committed_offsets(kafka, group, input) {
            Ok(committed)
                if end
                    .iter()
                    .all(|(p, o)| committed.get(*p as usize).copied().flatten() == Some(*o)) =>
            {
                return Ok(())
            }
            Ok(committed) if started.elapsed() > timeout => {
                warn!(
                    ?committed,
                    ?end,
                    "the committed offsets did not reach the input's end in time"
                );
                return Ok(());
            }
            Err(e) if started.elapsed() > timeout => {
                return Err(e.context("the committed offsets could not be fetched"))
            }
            Err(e) => warn!(
                error = format!("{e:#}"),
                "fetching the committed offsets failed; asking again"
            ),
            Ok(_) => {}
        }
        std::thread::sleep(Duration::from_millis(500));
    }
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

/// Keeps every stage alive until the sink and the deliverer have consumed their inputs to the
/// data ends, or `timeout` passed (then the checks report what is left). The deliverer commits a
/// record's offset with its outcome (accepted, or handed to the next bucket, the DLQ or the
/// parking lot), so once its notifications and every bucket are consumed, every key is settled.
fn drain_downstream(
    kafka: &crate::kafka::KafkaConfig,
    downstream: &Downstream,
    stages: &mut Stages,
    timeout: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    // Reading the topics to their ends costs more than a committed-offsets fetch: not too often.
    let every = Duration::from_secs(2);
    let mut asked = Instant::now() - every;
    loop {
        stages.tick(true)?;
        if asked.elapsed() >= every {
            asked = Instant::now();
            // As in `drain`: a failed read (a database still recovering, a coordinator moving)
            // means "not yet" until the deadline.
            match downstream.left_behind(kafka) {
                Ok(behind) if behind.is_empty() => return Ok(()),
                Ok(behind) if started.elapsed() > timeout => {
                    warn!(
                        ?behind,
                        "the sink and the deliverer did not finish their inputs in time"
                    );
                    return Ok(());
                }
                Err(e) if started.elapsed() > timeout => {
                    return Err(e.context("the downstream progress could not be read"))
                }
                Err(e) => warn!(
                    error = format!("{e:#}"),
                    "reading the downstream progress failed; asking again"
                ),
                Ok(_) => {}
            }
        }
        std::thread::sleep(STEP);
    }
}

/// The faults that run on threads of their own, one of each kind at a time (and one broker down
/// at a time: a bounce and a coordinator kill wait for each other).
#[derive(Default)]
struct Background {
    bouncing: Option<JoinHandle<anyhow::Result<Bounce>>>,
    killing: Option<JoinHandle<anyhow::Result<CoordinatorKill>>>,
    /// Where the kill's thread says that the broker is dead.
    killed: Option<Receiver<Killed>>,
    /// Coordinator kills fired so far (the next one's number).
    kills: usize,
    database: Option<JoinHandle<anyhow::Result<DatabaseDown>>>,
}

impl Background {
    /// Whether a broker is down or about to be, by a bounce or a kill.
    fn broker_fault(&self) -> bool {
        self.bouncing.is_some() || self.killing.is_some()
    }
}

impl Drop for Background {
    /// A run that fails while a broker or PostgreSQL is down waits for its thread, which starts
    /// it again (bounded: the down time and the replication wait), so that the run never ends
    /// with the shared services down.
    fn drop(&mut self) {
        // The outcomes are the run's, which has failed already: only the wait matters here.
        if let Some(h) = self.bouncing.take() {
            let _ = h.join();
        }
        if let Some(h) = self.killing.take() {
            let _ = h.join();
        }
        if let Some(h) = self.database.take() {
            let _ = h.join();
        }
    }
}

/// The outcome of `thread` if it has finished (taking it), `None` while it runs or if none.
fn finished<T>(
    thread: &mut Option<JoinHandle<anyhow::Result<T>>>,
    what: &str,
) -> anyhow::Result<Option<T>> {
    if !thread.as_ref().is_some_and(JoinHandle::is_finished) {
        return Ok(None);
    }
    let done = thread
        .take()
        .map(JoinHandle::join)
        .transpose()
        .map_err(|_| anyhow!("the {what} thread panicked"))?;
    done.transpose()
}

/// Feeds `ticks` to `input` evenly over `span`, on a thread of its own; returns where each landed.
fn spawn_feed(
    kafka: crate::kafka::KafkaConfig,
    input: String,
    ticks: Vec<crate::tick::Tick>,
    span: Duration,
) -> anyhow::Result<JoinHandle<anyhow::Result<Vec<Landed>>>> {
    let per_second = (ticks.len() as u64).div_ceil(span.as_secs().max(1));
    let feed = Feed::new(&kafka)?;
    Ok(std::thread::spawn(move || {
        feed.send_ticks_at_rate(&input, &ticks, per_second)
    }))
}

/// Fires `fault` if it can be now; returns whether it did (a bounce or a database shutdown waits
/// for the previous one, a signal for a running instance of its stage).
fn fire(
    fault: Fault,
    opts: &ChaosOptions,
    app_id: &str,
    stages: &mut Stages,
    downstream: Option<&Downstream>,
    bg: &mut Background,
    rng: &mut ChaCha8Rng,
) -> anyhow::Result<bool> {
    let pick = |rng: &mut ChaCha8Rng, from: &[usize]| from[rng.random_range(0..from.len())];
    match fault {
        Fault::Kill(stage) | Fault::Term(stage) | Fault::Zombie(stage) => {
            let Some(instances) = stages.get(stage) else {
                bail!("a fault of {stage:?}, which this run does not start");
            };
            let running = instances.targets();
            let processing = instances.processing();
            match fault {
                Fault::Kill(_) | Fault::Term(_) if running.is_empty() => Ok(false),
                Fault::Zombie(_) if processing.is_empty() => Ok(false),
                Fault::Kill(_) => instances.kill(pick(rng, &running)).map(|()| true),
                Fault::Term(_) => instances.terminate(pick(rng, &running)).map(|()| true),
                // Beyond the transaction timeout and the stage's session (the sink's database
                // session too: its write timeout is shorter).
                _ => instances
                    .pause(pick(rng, &processing), opts.zombie_pause(stage))
                    .map(|()| true),
            }
        }
        Fault::DatabaseDown if bg.database.is_some() => Ok(false),
        Fault::DatabaseDown => {
            let (Some(d), Some(o)) = (downstream, &opts.downstream) else {
                bail!("a database shutdown in a run without the sink");
            };
            let down = Duration::from_millis(
                rng.random_range(1_000..=o.max_database_down.as_millis().max(1_000) as u64),
            );
            let db = d.db.clone();
            bg.database = Some(std::thread::spawn(move || db.bounce(down)));
            Ok(true)
        }
        Fault::Bounce { .. } if bg.broker_fault() => Ok(false),
        Fault::Bounce { hard, target } => {
            let how = if hard { Stop::Hard } else { Stop::Clean };
            let down = Duration::from_millis(
                rng.random_range(1_000..=opts.max_down.as_millis().max(1_000) as u64),
            );
            let instance = rng.random_range(0..opts.instances);
            let txn_id = format!("{app_id}-{instance}");
            let any = rng.random_range(1..=opts.cluster.brokers);
            let (cluster, group) = (opts.cluster.clone(), app_id.to_owned());
            bg.bouncing = Some(std::thread::spawn(move || {
                bounce(&cluster, how, target, down, &txn_id, &group, any)
            }));
            Ok(true)
        }
        Fault::CoordinatorKill(_) if bg.broker_fault() => Ok(false),
        Fault::CoordinatorKill(stage) => {
            let Some(instances) = stages.get(stage) else {
                bail!("a coordinator kill of {stage:?}'s group, which this run does not start");
            };
            // Every instance of the stage up, and some committing (progress lately): the kill is
            // to land while they commit, and is judged on the busy ones.
            if !instances.all_running() || instances.busy(Duration::from_secs(5)).is_empty() {
                return Ok(false);
            }
            let group = match stage {
                Stage::Pipeline => app_id.to_owned(),
                _ => downstream
                    .and_then(|d| d.group(stage))
                    .map(str::to_owned)
                    .ok_or_else(|| anyhow!("no group of {stage:?} in a pipeline-only run"))?,
            };
            let (tx, rx) = mpsc::channel();
            let (cluster, down, kill) = (opts.cluster.clone(), opts.coordinator_down, bg.kills);
            bg.kills += 1;
            bg.killed = Some(rx);
            bg.killing = Some(std::thread::spawn(move || {
                coordinator::kill(&cluster, kill, stage, &group, down, &tx)
            }));
            Ok(true)
        }
    }
}
