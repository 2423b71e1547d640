//! The long-running sink: start-up (connect, migrate), the poll loop, and shutdown.
//!
//! ```text
//!  connect (waiting out an unavailable database, up to --db-start-timeout) ─► migrate ─► subscribe
//!  ┌──────────────── dedicated thread (rdkafka's poll and the rebalance callback) ─────────────┐
//!  │ loop: reconnect if an outage's next attempt is due ─► write the batch if due ─► poll ≤100 ms│
//!  │       (batch due: max-batch records, or commit-interval old, or linger without a record)  │
//!  └──────────────────────────────────────────────▲───────────────────────────────────────────┘
//!                      stop flag set by ──────────┘ the async side: SIGINT/SIGTERM (any future)
//! ```
//! At start the database has `db_start_timeout` to answer: one that never has is more likely a
//! wrong URL than an outage, and the start fails naming it. From the first connection on, an
//! outage pauses the partitions instead, however long it lasts.
//!
//! The loop never sleeps: during an outage it keeps polling (paused partitions deliver nothing, but
//! the consumer serves rebalances and stays in the group) with the poll's timeout ending at the
//! next reconnection attempt.
//!
//! Shutdown is a parameter: [`run`] takes any future. On shutdown the loop stops polling, writes the
//! open batch (if the database answers; otherwise its records stay unstored and are read again by
//! the next owner), leaves the group and returns; past the shutdown timeout [`run`] returns an error.
//!
//! # The watchdog
//! Every call of the loop has a deadline of its own (the write timeout, the connect timeout, the
//! poll slice), but a librdkafka call can still block for ever (librdkafka #5456, #5511), and
//! so can the close that a consumer's drop runs. Nothing else would end such a stall: the async
//! side waits for the thread without a bound until a shutdown is requested (only then does the
//! shutdown timeout reach it), and `/healthz` only says it. So, as in alert-pipeline and
//! alert-deliver, a watchdog ([`Health::watchdog`]) is armed once the start-up is over and the
//! thread starts, and ends the process with [`EXIT_STUCK`] (75: a supervisor restarts it) when the
//! thread has not beaten for [`watchdog_bound`]: over the loop, the drop of a consumer stopped by
//! a refused group read (the wait for the right beats), the close, and the drop of the consumer
//! after it. On a requested shutdown the shutdown timeout (30 s by default) normally ends a stuck
//! close first (status 3); the watchdog is what bounds it when the sink stops by itself
//! (`--exit-when-idle`) or on an error. A redo after the restart is harmless: the rows and the
//! offsets are stored together.

use super::db;
use super::metrics as m;
use super::options::SinkOptions;
use super::partitions::Shared;
use super::rebalance::SinkContext;
use super::record::Entry;
use super::state::SinkStats;
use super::store::Store;
use crate::backoff::Setbacks;
use crate::health::Health;
use crate::kafka::access::{self, Needs};
use crate::kafka::config::DEFAULT_TRANSACTION_TIMEOUT;
use crate::kafka::group::{is_group_refused, wait_for_group_read, FatalConsumerError};
use crate::kafka::txn::{stuck_bound, CALL_MARGIN, EXIT_STUCK};
use anyhow::{bail, Context as _};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// Longest single poll: bounds how late a batch, a reconnection or a stop request is noticed.
const POLL_SLICE: Duration = Duration::from_millis(100);

/// The watchdog's bound (module doc, `# The watchdog`): how long the sink's thread may go without
/// a beat before it counts as stuck where no deadline of its own reaches.
///
/// The sink has no transactions: what bounds it is the longest stretch its loop legitimately
/// goes without a beat, every step of it on a timeout of the sink's own. One iteration of the loop
/// at worst reconnects after an outage (the connection, `--db-connect-timeout` + 1 s; then the
/// stored offsets read, the seek to them and the waiting batch, `--write-timeout` each), then polls
/// into a rebalance whose callbacks write the revoked partitions' batch and read the assigned
/// ones' stored offsets (`--write-timeout` each), and asks the broker about a refused right (2 s).
/// With the defaults that is 6 s + 5 × 10 s = 56 s, under the other stages' default bound
/// ([`stuck_bound`] of the default transaction timeout: 90 s), which the sink keeps, so that every
/// stage counts as stuck after the same time; longer timeouts raise it to that stretch and
/// [`CALL_MARGIN`] (10 s, more than the probe). The close is shorter (the batch, `--write-timeout`;
/// leaving the group, 5 s), and a wait for a refused group read beats every 100 ms between checks
/// of 10 s at most. Preparing the statements on a reconnection has no deadline of its own: this
/// bound is its bound.
pub fn watchdog_bound(opts: &SinkOptions) -> Duration {
    let reconnect = opts.db.connect_timeout + Duration::from_secs(1);
    let longest = reconnect + opts.write_timeout.saturating_mul(5);
    stuck_bound(DEFAULT_TRANSACTION_TIMEOUT).max(longest + CALL_MARGIN)
}

/// Runs the sink until `shutdown` resolves (or it idles out, or fails), reporting its liveness and
/// readiness to `health`.
pub async fn run(
    opts: SinkOptions,
    health: Health,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<SinkStats> {
    tokio::pin!(shutdown);
    m::ready(false);
    health.not_ready("connecting to the database");
    info!(db = %db::describe(&opts.db), topic = %opts.topic, group = %opts.group_id, "alert-sink starting");
    let needs = Needs {
        read: vec![opts.topic.clone()],
        write: vec![],
        group: Some(opts.group_id.clone()),
    };
    access::check_async(&opts.kafka, needs).await?;
    let first = db::connect_waiting(&opts.db, opts.backoff, opts.db_start_timeout, &mut shutdown);
    let Some(mut client) = first.await? else {
        info!("shutdown requested while waiting for the database");
        return Ok(SinkStats::default());
    };
    db::migrate(&mut client).await?;
    let store = Store::new(client)
        .await
        .context("preparing the statements")?;
    let stop = Arc::new(AtomicBool::new(false));
    let shutdown_timeout = opts.shutdown_timeout;
    let worker = {
        let stop = Arc::clone(&stop);
        let rt = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || run_blocking(opts, rt, store, health, &stop))
    };
    tokio::pin!(worker);
    tokio::select! {
        // The worker's own end (error or idle exit) wins over a shutdown arriving at the same
        // moment, so its result is never dropped.
        biased;
        done = &mut worker => return done.context("the sink thread panicked")?,
        () = &mut shutdown => info!("shutdown requested"),
    }
    stop.store(true, Ordering::Relaxed);
    match tokio::time::timeout(shutdown_timeout, worker).await {
        Ok(done) => done.context("the sink thread panicked")?,
        Err(_) => bail!("shutdown did not finish within {shutdown_timeout:?}"),
    }
}

/// Applies the migrations and returns the versions applied now (`alert-sink migrate`).
pub async fn migrate_only(opts: &super::options::DbOptions) -> anyhow::Result<Vec<String>> {
    let mut client = db::connect(opts)
        .await
        .with_context(|| format!("connecting to {}", db::describe(opts)))?;
    db::migrate(&mut client).await
}

/// The consumer loop. Blocking: run it on a thread of its own.
fn run_blocking(
    opts: SinkOptions,
    rt: tokio::runtime::Handle,
    store: Store,
    health: Health,
    stop: &AtomicBool,
) -> anyhow::Result<SinkStats> {
    let mut cfg = opts.kafka.group_consumer(
        &opts.group_id,
        opts.group_instance_id.as_deref(),
        // No transactions here; the default bounds the loop's longest call all the same.
        crate::kafka::config::DEFAULT_TRANSACTION_TIMEOUT,
    );
    if cfg.get("fetch.wait.max.ms").is_none() {
        // Notifications become visible in bursts, when a pipeline transaction commits; a fetch
        // that waits for more data delays the burst's delivery by up to this bound (librdkafka's
        // default is 500 ms), which is most of the sink's latency. -X overrides it.
        cfg.set("fetch.wait.max.ms", "20");
    }
    let shared = Shared::new(opts, rt, store, health);
    // Armed here, once the start-up waits (connection, migrations, access check) are over, and
    // kept until the consumer is dropped: module doc, `# The watchdog`.
    let bound = shared
        .opts
        .test_watchdog_bound
        .unwrap_or_else(|| watchdog_bound(&shared.opts));
    let watchdog = shared.health.watchdog(bound, EXIT_STUCK);
    let mut refusals = Setbacks::default();
    let (consumer, result) = loop {
        let consumer: BaseConsumer<SinkContext> = cfg
            .create_with_context(shared.context())
            .context("creating the sink's consumer")?;
        consumer
            .subscribe(&[&shared.opts.topic])
            .context("subscribing to the notifications topic")?;
        m::ready(true);
        shared.health.ready();
        let result = consume_until_stopped(&shared, &consumer, stop);
        m::ready(false);
        if !result.as_ref().is_err_and(is_group_refused) {
            break (consumer, result);
        }
        // Under the consumer protocol a heartbeat refused for lack of Read on the group stops the
        // consumer for good (kafka::group, "Fatal errors"): drop it and what its partitions hold,
        // as a crash would (the records are read again from the stored offsets), and make it
        // again once the right is granted.
        let (owned, dropped) = {
            let mut st = shared.lock()?;
            let owned = st.owned();
            let dropped = st.revoked(&owned);
            (owned, dropped)
        };
        // Closing the dead consumer is librdkafka's: the watchdog still bounds it.
        drop(consumer);
        warn!(
            partitions = ?owned,
            dropped,
            "the group consumer stopped: Read on the group refused (consumer protocol); made again once granted"
        );
        if !owned.is_empty() {
            refusals.reset();
        }
        shared.health.not_ready("Read on the group refused");
        let granted = wait_for_group_read(
            &shared.opts.kafka,
            &shared.opts.group_id,
            &shared.opts.topic,
            &mut refusals,
            stop,
            || shared.health.beat(),
            |_, _| shared.rights.group_refused(),
        );
        if !granted {
            let stats = shared.stats(&*shared.lock()?);
            info!(records = stats.records, "alert-sink stopped");
            return Ok(stats);
        }
    };
    shared
        .health
        .not_ready(if result.is_ok() { "stopping" } else { "failed" });
    let stats = shared.stats(&*shared.lock()?);
    match result {
        Ok(()) => {
            let closed = close(&shared, &consumer);
            // The consumer's own close (in its drop, librdkafka's) is still under the watchdog.
            drop(consumer);
            drop(watchdog);
            closed?;
            let stats = shared.stats(&*shared.lock()?);
            info!(
                records = stats.records,
                inserted = stats.rows_inserted,
                dead_letters = stats.dead_letters,
                outages = stats.outages,
                "alert-sink stopped"
            );
            Ok(stats)
        }
        Err(e) => {
            warn!(
                error = format!("{e:#}"),
                records = stats.records,
                "alert-sink failed"
            );
            // As above: a failed consumer's close is bounded too.
            drop(consumer);
            drop(watchdog);
            Err(e)
        }
    }
}

fn consume_until_stopped(
    shared: &Shared,
    consumer: &BaseConsumer<SinkContext>,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let max_bytes = shared.opts.max_record_bytes;
    let mut quiet = false;
    while !stop.load(Ordering::Relaxed) {
        shared.health.beat();
        let timeout = {
            let mut st = shared.lock()?;
            if let Some(e) = shared.take_fatal(&mut st) {
                return Err(e);
            }
            shared.try_recover(&mut st, consumer)?;
            if shared.batch_due(&st, quiet) {
                shared.flush(&mut st, consumer)?;
            }
            shared.commit_group(&mut st, consumer, false)?;
            if shared
                .opts
                .exit_when_idle
                .is_some_and(|idle| shared.idle(&st, idle))
            {
                info!("idle; stopping");
                break;
            }
            shared.poll_timeout(&st, POLL_SLICE)
        };
        // Unlocked while polling: the rebalance callback runs inside poll and locks the state.
        match consumer.poll(timeout) {
            Some(Ok(m)) => {
                quiet = false;
                shared.rights.fetched(&shared.opts.topic);
                let entry = Entry::of(&m, max_bytes);
                shared.push(&mut *shared.lock()?, entry, rdkafka::Message::offset(&m));
            }
            // The consumer is unusable after a fatal error (a static member refused or fenced):
            // stop, as the pipeline does, instead of polling a dead consumer for ever.
            Some(Err(KafkaError::MessageConsumptionFatal(code))) => {
                return Err(FatalConsumerError(code).into());
            }
            // A right taken away while running: librdkafka retries; said per back-off step.
            Some(Err(e)) => {
                if !shared
                    .rights
                    .on_error(consumer.client(), e.rdkafka_error_code())
                {
                    warn!(error = %e, "consumer error");
                }
            }
            None => {
                quiet = true;
                shared.rights.recheck(consumer.client());
            }
        }
    }
    Ok(())
}

/// Writes what is open, leaves the group (which revokes every partition) and serves that revoke.
fn close(shared: &Shared, consumer: &BaseConsumer<SinkContext>) -> anyhow::Result<()> {
    {
        let mut st = shared.lock()?;
        shared.flush(&mut st, consumer)?;
    }
    // The revoke that leaving serves commits the group's offsets.
    let left = crate::kafka::group::leave(
        consumer,
        shared.opts.kafka.group_protocol,
        || Ok(shared.owns_partitions(&*shared.lock()?)),
        Duration::from_secs(5),
    )?;
    if !(left.revoked && left.leave_sent) {
        warn!(
            ?left,
            "closing: the group was not left within 5 s; closing the consumer anyway"
        );
    }
    let mut st = shared.lock()?;
    if let Some(e) = shared.take_fatal(&mut st) {
        return Err(e);
    }
    Ok(())
}
