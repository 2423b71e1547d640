//! The runner's main loop: the one thread that keeps every stage's instances alive
//! ([`Stages::tick`]: reap, restart, escalate a SIGTERM, resume a zombie) and in between does
//! what is due, in two phases.
//!
//! ```text
//!   play (the chaos), every 100 ms: tick the instances ─► take what the fault threads finished
//!        (bounce, coordinator kill, database) ─► at a kill's Killed, watch its stage's instances
//!        ─► fire the due faults that can be fired now; until no fault is pending, no fault
//!        thread runs, the feed is done and every instance runs ─► Played
//!   drain: tick the instances until the pipeline's committed offsets are the input's end, then
//!        (all-stage run) until the sink and the deliverer are at their inputs' data ends
//! ```
//!
//! A due fault that cannot be fired yet waits for a later step ([`fire`]): an instance fault for
//! an instance of its stage it may hit, a bounce or a coordinator kill for the broker fault
//! before it (one broker down at a time), a database shutdown for the one before it. The faults
//! that take time run on threads of their own ([`Background`]); a run that fails meanwhile waits
//! for them, so that it never leaves a broker or PostgreSQL down.
//!
//! Past the run's limit play fails; a drain that times out leaves what is missing to the checks,
//! which come after it ([`run`](super::run)), and fails only if it could not read the progress
//! at all. Nothing here judges the run.

use super::bounce::{bounce, Bounce};
use super::cluster::Stop;
use super::coordinator::{self, CoordinatorKill, Killed};
use super::database::DatabaseDown;
use super::downstream::Downstream;
use super::plan::{self, Fault, Stage};
use super::stages::Stages;
use super::ChaosOptions;
use crate::kafka::feed::{Feed, Landed};
use crate::kafka::offsets::committed_offsets;
use anyhow::{anyhow, bail};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Main-loop period: how late a due fault or an exited instance is noticed.
const STEP: Duration = Duration::from_millis(100);

/// What the chaos phase leaves: where the input landed, the bounces, how long it took.
pub(super) struct Played {
    pub(super) landed: Vec<Landed>,
    pub(super) bounces: Vec<Bounce>,
    pub(super) coordinator_kills: Vec<CoordinatorKill>,
    pub(super) database_downs: Vec<DatabaseDown>,
    pub(super) chaos: Duration,
}

/// The chaos: fires the due faults (in order, where one can be fired now) and keeps the instances
/// alive, until every fault is done, the input is fed and every instance runs.
#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
pub(super) fn play(
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
            stages.coordinator_moved(Instant::now(), opts);
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
            stages.coordinator_moved(Instant::now(), opts);
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
pub(super) fn drain(
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

/// Keeps every stage alive until the sink and the deliverer have consumed their inputs to the
/// data ends, or `timeout` passed (then the checks report what is left). The deliverer commits a
/// record's offset with its outcome (accepted, or handed to the next bucket, the DLQ or the
/// parking lot), so once its notifications and every bucket are consumed, every key is settled.
pub(super) fn drain_downstream(
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
pub(super) fn spawn_feed(
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
