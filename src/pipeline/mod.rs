//! The exactly-once processor: everything from poll to commit lives in this folder.
//!
//! - `mod.rs` (this file): the driver: set-up, the run loop that batches the engine's steps into
//!   transactions, shutdown.
//! - [`batch`]: when the open batch is due to commit.
//! - [`engine`]: poll, decode, crossing rule, produce; the invariants are stated at its top.
//! - [`commit`]: the open transaction, commit, abort-and-rewind, the back-off after a setback,
//!   stats; [`producers`]: one transactional producer, or two taken in turn.
//! - [`overlap`]: the overlapped commit (`--overlap-commits`): a batch's commit on a thread of its
//!   own while the next batch fills, and the outputs held back for it.
//! - [`rebalance`]: the consumer's context: the rebalance callbacks that close the open
//!   transaction before partitions go.
//! - [`crate::kafka::txn`] (shared with alert-deliver and dlq-replay): the transactional producer
//!   wrapper and the one [`crate::kafka::txn::classify`].
//! - [`state`]: per-partition symbol state and its restore from the changelog; [`held`]: what an
//!   instance says and shows while that restore is held by an undecided transaction.
//! - [`live`]: live alerts: the rules reader, each partition's join restored with its state, the
//!   holds and their barriers.
//! - [`settings`]: what an instance is ([`EngineSettings`]) and how it batches
//!   ([`PipelineOptions`]), test hooks included.
//!
//! ```text
//!   ┌─────────────── dedicated thread (transactional calls block) ────────────────┐
//!   │ loop: poll ≤100 ms ─► process ─► commit when the batch is commit-interval   │
//!   │       old (from its oldest record's arrival) or max-batch records big;      │
//!   │       no transaction begins without data                                    │
//!   │       (--overlap-commits: the commit goes to a thread of its own and the    │
//!   │       loop goes on; see overlap.rs)                                         │
//!   └──────────────────────────────▲───────────────────────────────────────────────┘
//!            stop flag set by ─────┘  the async side: SIGINT/SIGTERM (any future)
//! ```
//!
//! Shutdown is a parameter: [`run`] takes any future, the binary passes the signals and tests
//! pass what they like. On shutdown the loop stops polling, commits the open transaction (aborting
//! it if the commit fails), leaves the group and returns; if that takes longer than the shutdown
//! timeout, [`run`] returns an error so the process exits non-zero, and the broker aborts the open
//! transaction when its timeout expires or when this instance restarts.

pub mod batch;
pub mod commit;
pub mod engine;
pub mod held;
pub mod live;
pub mod overlap;
pub mod producers;
pub mod rebalance;
pub mod settings;
pub mod state;

pub use commit::Stats;
pub use engine::Engine;
pub use settings::{
    EngineSettings, Guarantee, PipelineOptions, TestHooks, DEFAULT_COMMIT_INTERVAL,
    DEFAULT_MAX_BATCH,
};

use crate::backoff::Setbacks;
use crate::health::Health;
use crate::kafka::access::{self, Needs};
use crate::kafka::topics;
use crate::kafka::txn::TxnError;
use anyhow::{bail, Context as _};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Longest single poll: bounds how late a commit deadline or a stop request is noticed.
const POLL_SLICE: Duration = Duration::from_millis(100);

/// Runs the processor until `shutdown` resolves (or it idles out, or fails), reporting its
/// liveness and readiness to `health`.
pub async fn run(
    opts: PipelineOptions,
    health: Health,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<Stats> {
    let t = &opts.engine.topics;
    let mut needs = Needs {
        read: vec![t.input.clone(), t.changelog.clone()],
        write: vec![t.notifications.clone(), t.dlq.clone(), t.changelog.clone()],
        group: Some(opts.engine.group_id().to_owned()),
    };
    if let Some(rules) = &opts.engine.rules_topic {
        // Read for the join; Write for the barriers and the one-shots' tombstones.
        needs.read.push(rules.clone());
        needs.write.push(rules.clone());
    }
    health.not_ready("checking access");
    access::check_async(&opts.engine.kafka, needs).await?;
    health.not_ready("creating topics");
    let partitions = topics::ensure(
        &opts.engine.kafka,
        &opts.engine.topics,
        opts.input_partitions,
    )
    .await?;
    if let Some(rules) = &opts.engine.rules_topic {
        topics::ensure_rules(
            &opts.engine.kafka,
            rules,
            &opts.engine.topics.input,
            partitions,
        )
        .await?;
    }
    info!(input = %opts.engine.topics.input, partitions, "topics ready");
    let t = &opts.engine.topics;
    crate::metrics::topics_written(&[&t.notifications, &t.changelog, &t.dlq]);
    let stop = Arc::new(AtomicBool::new(false));
    let shutdown_timeout = opts.shutdown_timeout;
    let worker = {
        let stop = Arc::clone(&stop);
        tokio::task::spawn_blocking(move || run_blocking(&opts, &health, &stop))
    };
    tokio::pin!(worker);
    tokio::select! {
        // The worker's own end (error or idle exit) wins over a shutdown that arrives at the same
        // moment, so its result is never dropped.
        biased;
        done = &mut worker => return done.context("the processing thread panicked")?,
        () = shutdown => info!("shutdown requested"),
    }
    stop.store(true, Ordering::Relaxed);
    match tokio::time::timeout(shutdown_timeout, worker).await {
        Ok(done) => done.context("the processing thread panicked")?,
        Err(_) => bail!("shutdown did not finish within {shutdown_timeout:?}; the broker will abort the open transaction"),
    }
}

/// The processing loop. Blocking: run it on a thread of its own.
///
/// # Read on the group refused under the consumer protocol
/// librdkafka 2.12 makes a ConsumerGroupHeartbeat refused with GROUP_AUTHORIZATION_FAILED fatal
/// to the consumer, where the classic protocol reports the refusal and retries. A right taken
/// away while the stage runs is an operator's doing that is undone by granting it again, so the
/// stage does not exit: the engine is dropped, as a crash would drop it; once per step of the
/// growing back-off ([`crate::backoff`]) the right is named (`alerts_not_authorised_total{right}`)
/// and the broker asked whether it still refuses the group; once it does not, the engine is made
/// again. Nothing is lost or doubled: what the dropped engine had open was never committed (the
/// group refused its offsets), and the new engine's registration of the same transactional ids
/// aborts it; the new engine restores its partitions from the committed state, as after a
/// restart. The dropped member could not leave the group (its leave needs the right too), so the
/// new member gets the partitions when the broker expires the old one: its session
/// (`group.consumer.session.timeout.ms`, 45 s) after its last heartbeat, at once if the refusal
/// lasted longer.
pub fn run_blocking(
    opts: &PipelineOptions,
    health: &Health,
    stop: &AtomicBool,
) -> anyhow::Result<Stats> {
    let mut refusals = Setbacks::default();
    let mut earlier = Stats::default();
    let mut refused: Option<String> = None;
    loop {
        let engine = Engine::start(opts.engine.clone())?.with_health(health.clone());
        if let Some(right) = refused.take() {
            engine.refused_before(right, refusals)?;
        }
        match run_engine(engine, opts, health, stop)? {
            Ran::Done(stats) => {
                let stats = earlier + stats;
                info!(
                    ticks = stats.committed_records,
                    notifications = stats.committed_notifications,
                    dead_letters = stats.committed_dead_letters,
                    commits = stats.commits,
                    aborts = stats.aborts,
                    "processor stopped"
                );
                return Ok(stats);
            }
            Ran::GroupRefused {
                right,
                stats,
                setbacks,
            } => {
                refusals = setbacks;
                earlier = earlier + stats;
                health.not_ready("Read on the group refused");
                let e = &opts.engine;
                let granted = crate::kafka::group::wait_for_group_read(
                    &e.kafka,
                    e.group_id(),
                    &e.topics.input,
                    &mut refusals,
                    stop,
                    || health.beat(),
                    |attempts, retry_in| {
                        access::say_refused(
                            &e.kafka,
                            &right,
                            "the group consumer stopped (consumer protocol); made again once granted",
                            attempts,
                            retry_in,
                        )
                    },
                );
                if !granted {
                    return Ok(earlier);
                }
                refused = Some(right);
            }
        }
    }
}

/// How one engine's run ended.
enum Ran {
    /// Stopped (and closed), with its counters.
    Done(Stats),
    /// Its consumer was stopped for good by a refused Read on the group (`right`); the engine
    /// is dropped, its counters kept.
    GroupRefused {
        right: String,
        stats: Stats,
        /// Its setbacks since its last commit, which the wait and the next engine go on from.
        setbacks: Setbacks,
    },
}

/// Runs `engine` until stopped, closes it, and returns how it ended.
fn run_engine(
    engine: Engine,
    opts: &PipelineOptions,
    health: &Health,
    stop: &AtomicBool,
) -> anyhow::Result<Ran> {
    let bound = opts
        .engine
        .hooks
        .watchdog_bound
        .unwrap_or_else(|| crate::kafka::txn::stuck_bound(opts.engine.transaction_timeout));
    let watchdog = health.watchdog(bound, crate::kafka::txn::EXIT_STUCK);
    let result = process_until_stopped(&engine, opts, health, stop);
    if let Some(right) = result.as_ref().err().and_then(|e| engine.group_refused(e)) {
        let (stats, setbacks) = (engine.stats()?, engine.setbacks()?);
        // Closing the dead consumer and the producers is librdkafka's: the watchdog still bounds
        // it.
        drop(engine);
        drop(watchdog);
        return Ok(Ran::GroupRefused {
            right,
            stats,
            setbacks,
        });
    }
    drop(watchdog);
    health.not_ready(match &result {
        Ok(()) => "stopping",
        Err(e)
            if e.downcast_ref::<TxnError>()
                .is_some_and(TxnError::is_fenced) =>
        {
            crate::metrics::fenced();
            "fenced by a newer instance"
        }
        Err(_) => "failed",
    });
    if opts.engine.hooks.stall_on_shutdown {
        warn!("test hook: stalling the shutdown");
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    // Close (commit what is open, leave the group) also after an error, unless it was fatal to
    // the transaction: then closing would only fail again.
    match result {
        Ok(()) => Ok(Ran::Done(engine.close()?)),
        Err(e) => {
            warn!(error = format!("{e:#}"), "processor failed");
            Err(e)
        }
    }
}

/// Waits out the back-off the engine asks for after a setback (an abort, a refused right; see
/// [`commit`]'s `# Back-off`), in poll-slice steps so that a stop request is seen at once.
fn back_off(engine: &Engine, stop: &AtomicBool) -> anyhow::Result<()> {
    let Some(backoff) = engine.take_backoff()? else {
        return Ok(());
    };
    let until = Instant::now() + backoff;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        std::thread::sleep(POLL_SLICE.min(until.saturating_duration_since(Instant::now())));
    }
    Ok(())
}

fn process_until_stopped(
    engine: &Engine,
    opts: &PipelineOptions,
    health: &Health,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let mut transactions = 0u64;
    // Idle means: assigned, restored, and nothing to read. Waiting for an assignment or a restore,
    // a restore, and a record all restart the clock.
    let mut last_activity = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let timeout = match engine.open_batch()? {
            Some(batch) => batch
                .deadline(opts.commit_interval)
                .saturating_duration_since(Instant::now()),
            None => POLL_SLICE,
        };
        let polled = engine.poll_once(timeout.clamp(Duration::from_millis(1), POLL_SLICE))?;
        engine.progress()?;
        back_off(engine, stop)?;
        health.beat();
        let unsettled = engine.unsettled()?;
        match &unsettled {
            None => health.ready(),
            Some(reason) => health.not_ready(reason),
        }
        if polled.record || polled.restored > 0 || unsettled.is_some() {
            last_activity = Instant::now();
        }
        match engine.open_batch()? {
            Some(batch)
                if Instant::now() >= batch.deadline(opts.commit_interval)
                    || batch.records >= opts.max_batch =>
            {
                transactions += 1;
                if opts
                    .engine
                    .hooks
                    .abort_every
                    .is_some_and(|n| n > 0 && transactions.is_multiple_of(n))
                {
                    info!(
                        transaction = transactions,
                        "test hook: aborting this transaction"
                    );
                    engine.abort()?;
                } else {
                    engine.hand_off()?;
                    back_off(engine, stop)?;
                }
            }
            Some(_) => {}
            None => {
                if opts
                    .exit_when_idle
                    .is_some_and(|idle| last_activity.elapsed() >= idle)
                {
                    info!("idle; stopping");
                    break;
                }
            }
        }
    }
    Ok(())
}
