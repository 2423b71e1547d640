//! What exactly-once costs the pipeline: throughput, end-to-end latency and memory, by mode.
//!
//! Each run uses fresh topics and the release `alert-pipeline` binary as a child process, as it
//! is deployed:
//! 1. **Throughput.** N ticks are pre-loaded and the pipeline starts. The clock starts when the
//!    pipeline is ready to consume (its metrics endpoint reports every partition restored), so
//!    process start-up and group join are not counted, and stops when the group's committed
//!    offsets reach the end of the backlog: a long commit interval pays for its last commit.
//! 2. **Latency.** With the backlog done, L more ticks are appended at a steady rate while a
//!    read_committed consumer tails `notifications`; a notification's latency is the time it
//!    became visible to that consumer minus the append time of its tick (the record timestamp,
//!    carried in `tick_ts`). That is what a downstream reader waits: batching plus commit.
//! 3. **Memory.** Peak RSS of the child (`VmHWM`) before it is stopped with SIGTERM.
//!
//! Configurations are interleaved (A B C D A B C D …) and repeated, so drift on a shared machine
//! hits all of them alike; medians are reported with their spread, and each one's ticks/s as a
//! ratio to the at-least-once run of the same repeat (paired). Exactly-once runs with and without
//! `--overlap-commits` (a batch's commit overlapping the next batch's processing).

use crate::stats::{median, percentile};
use anyhow::{anyhow, bail, Context as _};
use price_alerts::alert::Notification;
use price_alerts::kafka::feed::{next_offsets, Feed};
use price_alerts::kafka::offsets::committed_offsets;
use price_alerts::kafka::read::{reader, Reader};
use price_alerts::kafka::topics::{self, unique_suffix, Topics};
use price_alerts::kafka::{Isolation, KafkaConfig};
use price_alerts::tools::generate::{generate, GenOptions};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// One configuration of the pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Config {
    /// `exactly-once` or `at-least-once`.
    pub guarantee: &'static str,
    /// Exactly-once with `--overlap-commits` (a batch's commit overlaps the next batch).
    pub overlap: bool,
    pub commit_interval_ms: u64,
}

impl Config {
    /// The mode: the guarantee, `+overlap` for overlapped commits.
    pub fn mode(&self) -> String {
        match self.overlap {
            true => format!("{}+overlap", self.guarantee),
            false => self.guarantee.to_owned(),
        }
    }

    pub fn label(&self) -> String {
        format!("{} {}ms", self.mode(), self.commit_interval_ms)
    }

    /// Exactly-once at each commit interval (ms), each followed by exactly-once with overlapped
    /// commits if asked for; then at-least-once at 100 ms if asked for.
    pub fn list(intervals_ms: &[u64], overlap: bool, at_least_once: bool) -> Vec<Config> {
        let mut configs: Vec<Config> = intervals_ms
            .iter()
            .flat_map(|&ms| {
                [false, true]
                    .into_iter()
                    .filter(move |&o| !o || overlap)
                    .map(move |o| Config {
                        guarantee: "exactly-once",
                        overlap: o,
                        commit_interval_ms: ms,
                    })
            })
            .collect();
        if at_least_once {
            configs.push(Config {
                guarantee: "at-least-once",
                overlap: false,
                commit_interval_ms: 100,
            });
        }
        configs
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub kafka: KafkaConfig,
    /// The `alert-pipeline` binary.
    pub binary: PathBuf,
    pub configs: Vec<Config>,
    pub repeats: usize,
    /// Pre-loaded ticks (throughput phase).
    pub ticks: usize,
    /// Paced ticks (latency phase) and their rate per second.
    pub latency_ticks: usize,
    pub latency_rate: usize,
    pub symbols: usize,
    pub partitions: i32,
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub config: Config,
    pub repeat: usize,
    pub ticks_per_sec: f64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub latency_samples: usize,
    pub peak_rss_mib: f64,
}

impl std::fmt::Display for RunResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} #{}: {:.0} ticks/s, latency p50 {:.0} ms p99 {:.0} ms ({} samples), peak RSS {:.0} MiB",
            self.config.label(),
            self.repeat,
            self.ticks_per_sec,
            self.latency_p50_ms,
            self.latency_p99_ms,
            self.latency_samples,
            self.peak_rss_mib
        )
    }
}

/// Medians over the repeats of one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub config: Config,
    pub ticks_per_sec: f64,
    pub ticks_per_sec_min: f64,
    pub ticks_per_sec_max: f64,
    /// Median over the repeats of ticks/s divided by the at-least-once run's of the same repeat
    /// (paired, so drift between repeats cancels out); `None` without at-least-once runs.
    pub paired_vs_alo: Option<f64>,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub peak_rss_mib: f64,
}

/// Runs every configuration `repeats` times, interleaved; `progress` is told of each run.
pub fn run(opts: &Options, mut progress: impl FnMut(&RunResult)) -> anyhow::Result<Vec<RunResult>> {
    let mut results = Vec::new();
    for repeat in 0..opts.repeats {
        for config in &opts.configs {
            let r = run_one(opts, config, repeat)
                .with_context(|| format!("run {} #{repeat}", config.label()))?;
            progress(&r);
            results.push(r);
        }
    }
    Ok(results)
}

/// Medians per configuration, in the order of `configs`.
pub fn summarize(configs: &[Config], results: &[RunResult]) -> Vec<Summary> {
    let alo = |repeat: usize| {
        results
            .iter()
            .find(|r| r.repeat == repeat && r.config.guarantee == "at-least-once")
            .map(|r| r.ticks_per_sec)
    };
    configs
        .iter()
        .filter_map(|c| {
            let of = |f: fn(&RunResult) -> f64| -> Vec<f64> {
                results.iter().filter(|r| &r.config == c).map(f).collect()
            };
            let tps = of(|r| r.ticks_per_sec);
            let paired: Vec<f64> = results
                .iter()
                .filter(|r| &r.config == c)
                .filter_map(|r| Some(r.ticks_per_sec / alo(r.repeat)?))
                .collect();
            Some(Summary {
                config: c.clone(),
                ticks_per_sec: median(&tps)?,
                ticks_per_sec_min: tps.iter().copied().fold(f64::INFINITY, f64::min),
                ticks_per_sec_max: tps.iter().copied().fold(0.0, f64::max),
                paired_vs_alo: median(&paired),
                latency_p50_ms: median(&of(|r| r.latency_p50_ms))?,
                latency_p99_ms: median(&of(|r| r.latency_p99_ms))?,
                peak_rss_mib: median(&of(|r| r.peak_rss_mib))?,
            })
        })
        .collect()
}

/// Writes `results.json` (summaries and every run) and `results.md` (the table) into `dir`;
/// returns the table.
pub fn write_outputs(
    dir: &Path,
    configs: &[Config],
    results: &[RunResult],
) -> anyhow::Result<String> {
    let summary = summarize(configs, results);
    let table = table(&summary);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_vec_pretty(&(&summary, results))?,
    )?;
    std::fs::write(dir.join("results.md"), &table)?;
    Ok(table)
}

/// The summary as a Markdown table.
pub fn table(summaries: &[Summary]) -> String {
    let mut out = String::from(
        "| mode | commit interval | ticks/s (median) | min-max | paired / at-least-once | latency p50 | latency p99 | peak RSS |\n|---|---|---|---|---|---|---|---|\n",
    );
    for s in summaries {
        let paired = s
            .paired_vs_alo
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.3}"));
        out.push_str(&format!(
            "| {} | {} ms | {:.0} | {:.0}-{:.0} | {paired} | {:.0} ms | {:.0} ms | {:.0} MiB |\n",
            s.config.mode(),
            s.config.commit_interval_ms,
            s.ticks_per_sec,
            s.ticks_per_sec_min,
            s.ticks_per_sec_max,
            s.latency_p50_ms,
            s.latency_p99_ms,
            s.peak_rss_mib
        ));
    }
    out
}

fn run_one(opts: &Options, config: &Config, repeat: usize) -> anyhow::Result<RunResult> {
    let prefix = format!("pbench-{}-", unique_suffix());
    let app_id = format!("{prefix}app");
    let topics = Topics::with(
        format!("{prefix}market-updates"),
        format!("{prefix}notifications"),
        &app_id,
    );
    let kafka = &opts.kafka;
    futures::executor::block_on(topics::ensure(kafka, &topics, Some(opts.partitions)))?;
    let result = measure(opts, config, repeat, &app_id, &topics);
    let _ = futures::executor::block_on(topics::delete_topics(kafka, &topics.names()));
    result
}

/// The child process, killed if the run fails half-way.
struct ChildGuard(Child);

impl ChildGuard {
    /// Fails at once if the pipeline has exited (instead of waiting out a deadline for progress
    /// that cannot come); its own error is on stderr just before.
    fn exited(&mut self) -> anyhow::Result<()> {
        match self.0.try_wait()? {
            Some(status) => bail!("the pipeline exited early with {status}"),
            None => Ok(()),
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn measure(
    opts: &Options,
    config: &Config,
    repeat: usize,
    app_id: &str,
    topics: &Topics,
) -> anyhow::Result<RunResult> {
    let kafka = &opts.kafka;
    let (rules, ticks) = generate(&GenOptions {
        symbols: opts.symbols,
        ticks: opts.ticks + opts.latency_ticks,
        seed: 1000 + repeat as u64,
        stale_every: 0,
    });
    let rules_path = std::env::temp_dir().join(format!("{app_id}-rules.toml"));
    std::fs::write(&rules_path, rules.to_toml())?;
    let feed = Feed::new(kafka)?;
    let (backlog, paced) = ticks.split_at(opts.ticks);
    let metrics_addr = format!("127.0.0.1:{}", free_port()?);
    let mut landed = feed.send_ticks(&topics.input, backlog)?;

    let child = Command::new(&opts.binary)
        .args([
            "--rules",
            path_str(&rules_path)?,
            "--app-id",
            app_id,
            "--bootstrap",
            &kafka.bootstrap,
        ])
        .args(["--input", &topics.input, "--output", &topics.notifications])
        .args([
            "--guarantee",
            config.guarantee,
            "--commit-interval",
            &format!("{}ms", config.commit_interval_ms),
        ])
        .args(config.overlap.then_some("--overlap-commits"))
        .args(["--metrics-addr", &metrics_addr])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", opts.binary.display()))?;
    let mut child = ChildGuard(child);

    // Throughput: from ready to the backlog committed.
    let target = next_offsets(&landed);
    let total: i64 = target.values().sum();
    let deadline = Instant::now() + Duration::from_secs(600);
    while price_alerts::metrics::scrape(&metrics_addr, "alerts_partitions_restored_total")
        < f64::from(opts.partitions)
    {
        child.exited()?;
        if Instant::now() > deadline {
            bail!("the pipeline never reported its partitions restored");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let ready = Instant::now();
    let ticks_per_sec = loop {
        let pos: i64 = committed_offsets(kafka, app_id, &topics.input)?
            .into_iter()
            .flatten()
            .sum();
        if pos >= total {
            break total as f64 / ready.elapsed().as_secs_f64();
        }
        child.exited()?;
        if Instant::now() > deadline {
            bail!("the pipeline did not catch up with {total} ticks");
        }
        std::thread::sleep(Duration::from_millis(10));
    };

    // Latency: paced ticks while a read_committed consumer tails the notifications.
    let stop = Arc::new(AtomicBool::new(false));
    let tail = {
        let (kafka, topic, partitions, stop) = (
            kafka.clone(),
            topics.notifications.clone(),
            opts.partitions,
            stop.clone(),
        );
        std::thread::spawn(move || tail_latencies(&kafka, &topic, partitions, &stop))
    };
    let slices = 20usize;
    let per_slice = (opts.latency_rate / slices).max(1);
    let started = Instant::now();
    for (i, chunk) in paced.chunks(per_slice).enumerate() {
        landed.extend(feed.send_ticks(&topics.input, chunk)?);
        let next = started + Duration::from_secs_f64((i + 1) as f64 / slices as f64);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let target = next_offsets(&landed);
    loop {
        let committed = committed_offsets(kafka, app_id, &topics.input)?;
        if target
            .iter()
            .all(|(p, o)| committed.get(*p as usize).copied().flatten() == Some(*o))
        {
            break;
        }
        child.exited()?;
        if Instant::now() > deadline {
            bail!("the pipeline did not catch up with the paced ticks");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let latencies = tail
        .join()
        .map_err(|_| anyhow!("latency reader panicked"))??;

    let peak_rss_mib = peak_rss_kib(child.0.id()).unwrap_or(0) as f64 / 1024.0;
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()?;
    if !status.success() {
        bail!("could not stop the pipeline");
    }
    let exit = child.0.wait()?;
    if !exit.success() {
        bail!("the pipeline exited with {exit}");
    }
    let _ = std::fs::remove_file(&rules_path);
    Ok(RunResult {
        config: config.clone(),
        repeat,
        ticks_per_sec,
        latency_p50_ms: percentile(&latencies, 50.0).unwrap_or(f64::NAN),
        latency_p99_ms: percentile(&latencies, 99.0).unwrap_or(f64::NAN),
        latency_samples: latencies.len(),
        peak_rss_mib,
    })
}

fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str()
        .ok_or_else(|| anyhow!("path {} is not UTF-8", p.display()))
}

/// Tails `topic` read_committed from its current end until `stop` is set and every partition is
/// at its end; returns the latency of each notification in milliseconds.
fn tail_latencies(
    kafka: &KafkaConfig,
    topic: &str,
    partitions: i32,
    stop: &AtomicBool,
) -> anyhow::Result<Vec<f64>> {
    let consumer = reader(kafka, Isolation::ReadCommitted)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::End)?;
    }
    consumer.assign(&tpl)?;
    let mut latencies = Vec::new();
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let seen = now_ms();
                let n: Notification = serde_json::from_slice(m.payload().unwrap_or_default())?;
                let appended = OffsetDateTime::parse(&n.tick_ts, &Rfc3339)?.unix_timestamp_nanos()
                    as f64
                    / 1e6;
                latencies.push(seen - appended);
            }
            Some(Err(KafkaError::PartitionEOF(_))) | None => {
                // Done once told to stop and every partition's position is at its end (all output
                // is committed by then, so the end is the high watermark).
                if stop.load(Ordering::Relaxed) && caught_up(&consumer, topic, partitions)? {
                    return Ok(latencies);
                }
            }
            Some(Err(e)) => return Err(e.into()),
        }
    }
}

fn caught_up(consumer: &Reader, topic: &str, partitions: i32) -> anyhow::Result<bool> {
    let positions = consumer.position()?;
    for p in 0..partitions {
        let (_, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        let at = match positions.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            _ => return Ok(high == 0),
        };
        if at < high {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A port nothing listens on right now, for the child's metrics endpoint.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

/// Peak resident set of a process, from /proc (Linux).
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
