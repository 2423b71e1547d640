//! What alert-sink costs and delivers: rows/s into PostgreSQL, batched against one row per
//! transaction, and the end-to-end latency from a tick's append to its row being visible.
//!
//! Every run uses a fresh topic and a fresh database, and the release binaries as child processes,
//! as they are deployed:
//! 1. **Throughput.** N notifications are pre-loaded; `alert-sink` starts. The clock starts when
//!    the sink owns every partition (its metrics endpoint), and stops when it has committed all N
//!    records in the database (`alerts_sink_records_total`). Batched: the defaults (up to 5,000 rows
//!    per transaction). Naive: `--max-batch 1`, one row and its offset per transaction, the same
//!    guarantee without batching.
//! 2. **Latency.** `alert-pipeline` and `alert-sink` run on fresh topics; ticks are appended at a
//!    steady rate; a trigger on the bench's own database (not part of the migrations) NOTIFYs each
//!    row's id and tick time, and PostgreSQL delivers a NOTIFY only when its transaction commits, so
//!    its arrival is when the row became visible. Latency = arrival - the tick's append time (its
//!    record timestamp, carried as `tick_ts`).
//!
//! The configurations are interleaved per repeat (batched, naive, latency, batched, …) so drift on
//! a shared machine hits them alike; medians are reported with their spread.
//!
//! [`cli`] is `sink-bench`'s command line and the flow its `main` runs.

pub mod cli;

use crate::child::wait_until;
use crate::stats::{median, percentile};
use anyhow::{bail, Context as _};
use price_alerts::alert::Notification;
use price_alerts::kafka::feed::Feed;
use price_alerts::kafka::read::reader;
use price_alerts::kafka::topics::{
    create_topics, delete_topics, unique_suffix, Cleanup, TopicSpec,
};
use price_alerts::kafka::tpl::position_list;
use price_alerts::kafka::{Isolation, KafkaConfig};
use price_alerts::metrics::scrape;
use price_alerts::tools::generate::{generate, GenOptions};
use rdkafka::consumer::Consumer as _;
use rdkafka::message::Message as _;
use rdkafka::Offset;
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub kafka: KafkaConfig,
    /// An admin connection string; each run creates (and drops) a database of its own there.
    pub admin_url: String,
    /// The folder of the release binaries (`alert-sink`, `alert-pipeline`).
    pub bin_dir: PathBuf,
    pub repeats: usize,
    /// Pre-loaded notifications of a batched run, and of a naive run.
    pub rows: usize,
    pub naive_rows: usize,
    /// Ticks appended during the latency phase, and their rate per second.
    pub latency_ticks: usize,
    pub latency_rate: usize,
    pub partitions: i32,
    /// The pipeline's commit interval in the latency phase.
    pub pipeline_commit_ms: u64,
}

/// The figures of one repeat.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub repeat: usize,
    pub batched_rows_per_sec: f64,
    pub naive_rows_per_sec: f64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub latency_samples: usize,
    /// The sink's own share: the notification visible to a read_committed reader -> its row
    /// visible. The rest of the tick-to-row time is the pipeline's.
    pub sink_share_p50_ms: f64,
    pub sink_share_p99_ms: f64,
}

/// Medians over the repeats.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub batched_rows_per_sec: (f64, f64, f64),
    pub naive_rows_per_sec: (f64, f64, f64),
    /// Median of the per-repeat batched/naive ratios.
    pub paired_ratio: f64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub latency_p99_range: (f64, f64),
    pub sink_share_p50_ms: f64,
    pub sink_share_p99_ms: f64,
    pub sink_share_p99_range: (f64, f64),
}

/// Runs the repeats, interleaved; `progress` is told of each.
pub fn run(opts: &Options, mut progress: impl FnMut(&RunResult)) -> anyhow::Result<Vec<RunResult>> {
    let mut out = Vec::new();
    for repeat in 0..opts.repeats {
        let batched = throughput(opts, opts.rows, &[], repeat).context("batched run")?;
        let naive = throughput(opts, opts.naive_rows, &["--max-batch", "1"], repeat)
            .context("naive run")?;
        let Latency {
            total: lat,
            sink_share,
        } = latency(opts, repeat).context("latency run")?;
        let r = RunResult {
            repeat,
            batched_rows_per_sec: batched,
            naive_rows_per_sec: naive,
            latency_p50_ms: percentile(&lat, 50.0).unwrap_or(f64::NAN),
            latency_p99_ms: percentile(&lat, 99.0).unwrap_or(f64::NAN),
            latency_samples: lat.len(),
            sink_share_p50_ms: percentile(&sink_share, 50.0).unwrap_or(f64::NAN),
            sink_share_p99_ms: percentile(&sink_share, 99.0).unwrap_or(f64::NAN),
        };
        progress(&r);
        out.push(r);
    }
    Ok(out)
}

fn spread(v: &[f64]) -> (f64, f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    (median(v).unwrap_or(f64::NAN), min, max)
}

pub fn summarize(results: &[RunResult]) -> Summary {
    let of = |f: fn(&RunResult) -> f64| results.iter().map(f).collect::<Vec<f64>>();
    let p99 = of(|r| r.latency_p99_ms);
    let share_p99 = of(|r| r.sink_share_p99_ms);
    Summary {
        batched_rows_per_sec: spread(&of(|r| r.batched_rows_per_sec)),
        naive_rows_per_sec: spread(&of(|r| r.naive_rows_per_sec)),
        paired_ratio: median(&of(|r| r.batched_rows_per_sec / r.naive_rows_per_sec))
            .unwrap_or(f64::NAN),
        latency_p50_ms: median(&of(|r| r.latency_p50_ms)).unwrap_or(f64::NAN),
        latency_p99_ms: median(&p99).unwrap_or(f64::NAN),
        latency_p99_range: (spread(&p99).1, spread(&p99).2),
        sink_share_p50_ms: median(&of(|r| r.sink_share_p50_ms)).unwrap_or(f64::NAN),
        sink_share_p99_ms: median(&share_p99).unwrap_or(f64::NAN),
        sink_share_p99_range: (spread(&share_p99).1, spread(&share_p99).2),
    }
}

pub fn table(s: &Summary, opts: &Options) -> String {
    format!(
        "| measure | median | min-max |\n|---|---|---|\n\
         | batched rows/s (defaults, {} rows) | {:.0} | {:.0}-{:.0} |\n\
         | naive rows/s (--max-batch 1, {} rows) | {:.0} | {:.0}-{:.0} |\n\
         | batched / naive (paired) | {:.1}x | |\n\
         | tick append -> row visible p50 | {:.0} ms | |\n\
         | tick append -> row visible p99 | {:.0} ms | {:.0}-{:.0} |\n\
         | notification visible -> row visible (the sink's share) p50 | {:.0} ms | |\n\
         | notification visible -> row visible (the sink's share) p99 | {:.0} ms | {:.0}-{:.0} |\n",
        opts.rows,
        s.batched_rows_per_sec.0,
        s.batched_rows_per_sec.1,
        s.batched_rows_per_sec.2,
        opts.naive_rows,
        s.naive_rows_per_sec.0,
        s.naive_rows_per_sec.1,
        s.naive_rows_per_sec.2,
        s.paired_ratio,
        s.latency_p50_ms,
        s.latency_p99_ms,
        s.latency_p99_range.0,
        s.latency_p99_range.1,
        s.sink_share_p50_ms,
        s.sink_share_p99_ms,
        s.sink_share_p99_range.0,
        s.sink_share_p99_range.1,
    )
}

/// A child process, killed if the run fails half-way.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl ChildGuard {
    /// SIGTERM, then wait for a clean exit.
    fn stop(mut self) -> anyhow::Result<()> {
        let pid = self.0.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        let status = self.0.wait()?;
        if !status.success() {
            bail!("child exited with {status}");
        }
        Ok(())
    }
}

/// A database of one run, dropped at the end.
struct BenchDb {
    admin: String,
    name: String,
    url: String,
}

impl BenchDb {
    fn create(admin: &str) -> anyhow::Result<Self> {
        let name = format!("sinkbench_{}", unique_suffix());
        sql(admin, &format!("CREATE DATABASE {name}"))?;
        let base = admin.split('?').next().unwrap_or(admin);
        let url = format!("{}/{name}", base.rsplit_once('/').map_or(base, |(b, _)| b));
        Ok(BenchDb {
            admin: admin.to_owned(),
            name,
            url,
        })
    }
}

impl Drop for BenchDb {
    fn drop(&mut self) {
        let _ = sql(
            &self.admin,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn sql(url: &str, statement: &str) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        client.batch_execute(statement).await?;
        Ok(())
    })
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn sink(
    opts: &Options,
    db: &BenchDb,
    topic: &str,
    metrics: &str,
    extra: &[&str],
) -> anyhow::Result<ChildGuard> {
    let child = Command::new(opts.bin_dir.join("alert-sink"))
        .args([
            "--bootstrap",
            &opts.kafka.bootstrap,
            "--topic",
            topic,
            "--group",
            &format!("{topic}-sink"),
        ])
        .args(["--metrics-addr", metrics])
        .args(extra)
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .context("starting alert-sink")?;
    Ok(ChildGuard(child))
}

/// `n` notification records, each a distinct crossing (200 symbols, increasing seqs), with decimal
/// prices as the pipeline writes them. Throughput does not depend on which crossings they are.
pub(crate) fn notifications(n: usize, seed: u64) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
    use price_alerts::alert::{Crossing, Direction, Notification, Source};
    use rust_decimal::Decimal;
    (0..n)
        .map(|i| {
            let symbol = price_alerts::tools::generate::symbol(i % 200);
            let price = Decimal::new(100_000 + ((i as i64 * 7919 + seed as i64) % 5_000), 2);
            let tick = price_alerts::tick::Tick {
                symbol: symbol.clone(),
                price,
                seq: (i / 200) as u64 + 1,
                ts: None,
            };
            let up = i % 2 == 0;
            let crossing = Crossing {
                threshold: Decimal::new(100_000, 2),
                direction: if up { Direction::Up } else { Direction::Down },
                previous_price: Decimal::new(99_950, 2),
            };
            let source = Source {
                topic: "market-updates".into(),
                partition: 0,
                offset: i as i64,
            };
            let note =
                Notification::new(&tick, &crossing, price_alerts::dlq::now_rfc3339(), source);
            (
                Some(symbol.into_bytes()),
                serde_json::to_vec(&note).unwrap_or_default(),
            )
        })
        .collect()
}

/// Rows/s of one sink run over `rows` pre-loaded notifications.
fn throughput(opts: &Options, rows: usize, extra: &[&str], repeat: usize) -> anyhow::Result<f64> {
    let topic = format!("sbench-{}-notifications", unique_suffix());
    let spec = TopicSpec {
        name: topic.clone(),
        partitions: opts.partitions,
        cleanup: Cleanup::Delete,
        retention: None,
    };
    futures::executor::block_on(create_topics(&opts.kafka, &[spec]))?;
    let result = (|| {
        let records = notifications(rows, 7000 + repeat as u64);
        Feed::new(&opts.kafka)?.send_raw(&topic, &records)?;
        let db = BenchDb::create(&opts.admin_url)?;
        let metrics = format!("127.0.0.1:{}", free_port()?);
        let child = sink(opts, &db, &topic, &metrics, extra)?;
        let parts = f64::from(opts.partitions);
        wait_until(
            Duration::from_secs(120),
            "the sink owning every partition",
            || scrape(&metrics, "alerts_sink_assigned_partitions") == parts,
        )?;
        let started = Instant::now();
        wait_until(Duration::from_secs(900), "the backlog stored", || {
            scrape(&metrics, "alerts_sink_records_total") >= rows as f64
        })?;
        let took = started.elapsed();
        child.stop()?;
        Ok(rows as f64 / took.as_secs_f64())
    })();
    let _ = futures::executor::block_on(delete_topics(&opts.kafka, &[&topic]));
    result
}

/// Tick append -> row visible, in ms, of every row of a paced run behind the pipeline.
/// Latency samples of one run, in ms.
struct Latency {
    /// Tick append -> row visible (NOTIFY arrival).
    total: Vec<f64>,
    /// Notification first seen by a read_committed reader -> row visible: what the sink adds.
    sink_share: Vec<f64>,
}

/// A read_committed reader of every partition of `topic` on a thread of its own, recording when
/// each notification id first becomes visible, until `stop` is set.
fn watch_visible(
    kafka: &KafkaConfig,
    topic: &str,
    partitions: i32,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<HashMap<String, SystemTime>>> {
    let reader = reader(kafka, Isolation::ReadCommitted)?;
    reader.assign(&position_list(
        topic,
        (0..partitions).map(|p| (p, Offset::Beginning)),
    )?)?;
    Ok(std::thread::spawn(move || {
        let mut seen = HashMap::new();
        while !stop.load(Ordering::Relaxed) {
            let Some(Ok(m)) = reader.poll(Duration::from_millis(5)) else {
                continue;
            };
            let at = SystemTime::now();
            if let Some(n) = m
                .payload()
                .and_then(|p| serde_json::from_slice::<Notification>(p).ok())
            {
                seen.entry(n.id).or_insert(at);
            }
        }
        seen
    }))
}

fn latency(opts: &Options, repeat: usize) -> anyhow::Result<Latency> {
    let prefix = format!("slat-{}-", unique_suffix());
    let (input, output) = (
        format!("{prefix}market-updates"),
        format!("{prefix}notifications"),
    );
    let app = format!("{prefix}app");
    let topics = price_alerts::kafka::topics::Topics::with(input.clone(), output.clone(), &app);
    futures::executor::block_on(price_alerts::kafka::topics::ensure(
        &opts.kafka,
        &topics,
        Some(opts.partitions),
    ))?;
    let result = (|| {
        let (rules, ticks) = generate(&GenOptions {
            symbols: 200,
            ticks: opts.latency_ticks,
            seed: 9000 + repeat as u64,
            stale_every: 0,
        });
        let rules_path = std::env::temp_dir().join(format!("{app}-rules.toml"));
        std::fs::write(&rules_path, rules.to_toml())?;
        let db = BenchDb::create(&opts.admin_url)?;
        // A worker thread of its own: the listening connection is driven while this thread paces.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        // The bench's own trigger: NOTIFY at commit, with the row's id and tick time.
        let (tx, rx) = std::sync::mpsc::channel::<(String, SystemTime)>();
        let listener = rt.block_on(async {
            let (client, mut conn) =
                tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await?;
            let stream = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
            let task = tokio::spawn(async move {
                use futures::StreamExt;
                futures::pin_mut!(stream);
                while let Some(Ok(msg)) = stream.next().await {
                    if let tokio_postgres::AsyncMessage::Notification(n) = msg {
                        let _ = tx.send((n.payload().to_owned(), SystemTime::now()));
                    }
                }
            });
            Ok::<_, anyhow::Error>((client, task))
        })?;
        let pipeline = ChildGuard(
            Command::new(opts.bin_dir.join("alert-pipeline"))
                .args([
                    "--rules",
                    rules_path.to_str().context("utf-8 path")?,
                    "--app-id",
                    &app,
                ])
                .args([
                    "--bootstrap",
                    &opts.kafka.bootstrap,
                    "--input",
                    &input,
                    "--output",
                    &output,
                ])
                .args([
                    "--commit-interval",
                    &format!("{}ms", opts.pipeline_commit_ms),
                ])
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .spawn()
                .context("starting alert-pipeline")?,
        );
        let metrics = format!("127.0.0.1:{}", free_port()?);
        let sink = sink(opts, &db, &output, &metrics, &[])?;
        let stop = Arc::new(AtomicBool::new(false));
        let visible = watch_visible(&opts.kafka, &output, opts.partitions, stop.clone())?;
        let parts = f64::from(opts.partitions);
        wait_until(
            Duration::from_secs(120),
            "the sink owning every partition",
            || scrape(&metrics, "alerts_sink_assigned_partitions") == parts,
        )?;
        // The schema exists once the sink owns partitions (it migrates before subscribing).
        rt.block_on(listener.0.batch_execute(
            "CREATE FUNCTION bench_notify() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_notify('bench', NEW.id || ' ' || (extract(epoch FROM NEW.tick_ts) * 1000)::bigint); RETURN NEW; END $$;
             CREATE TRIGGER bench_notify AFTER INSERT ON alerts FOR EACH ROW EXECUTE FUNCTION bench_notify();
             LISTEN bench;",
        ))?;
        // Warm-up: the pipeline joins and restores; its first notifications reach the table.
        let feed = Feed::new(&opts.kafka)?;
        let (warm, paced) = ticks.split_at(ticks.len() / 10);
        feed.send_ticks(&input, warm)?;
        wait_until(Duration::from_secs(120), "the first rows", || {
            rx.try_recv().is_ok()
        })?;
        while rx.try_recv().is_ok() {}
        let step = Duration::from_millis(10);
        let per_step = (opts.latency_rate / 100).max(1);
        let start = Instant::now();
        for (i, chunk) in paced.chunks(per_step).enumerate() {
            feed.send_ticks(&input, chunk)?;
            let next = start + step * (i as u32 + 1);
            std::thread::sleep(next.saturating_duration_since(Instant::now())); // pacing the input
        }
        // Everything visible by now plus a margin: collect what arrived.
        std::thread::sleep(Duration::from_secs(2)); // pacing: the last commits' margin, not a condition
        stop.store(true, Ordering::Relaxed);
        let visible = visible
            .join()
            .map_err(|_| anyhow::anyhow!("the visibility reader panicked"))?;
        let millis = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0)
        };
        let (mut total, mut sink_share) = (Vec::new(), Vec::new());
        while let Ok((payload, seen)) = rx.try_recv() {
            let Some((id, ms)) = payload.rsplit_once(' ') else {
                continue;
            };
            let Ok(ms) = ms.parse::<i64>() else { continue };
            total.push((millis(seen) - ms) as f64);
            if let Some(&at) = visible.get(id) {
                sink_share.push((millis(seen) - millis(at)) as f64);
            }
        }
        sink.stop()?;
        pipeline.stop()?;
        listener.1.abort();
        Ok(Latency { total, sink_share })
    })();
    let names = [
        &topics.input,
        &topics.notifications,
        &topics.changelog,
        &topics.dlq,
    ];
    let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let _ = futures::executor::block_on(delete_topics(&opts.kafka, &names));
    result
}
