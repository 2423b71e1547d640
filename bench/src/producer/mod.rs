//! Producer throughput by mode (see `producer-bench`).
//!
//! The question is what exactly-once costs on the producing side: how much slower is a
//! transactional producer committing every 10, 100 or 1000 ms than an idempotent one (which every
//! transactional producer already is), and than a plain acks=1 producer? Confluent's published
//! anchor (KIP-98, "Transactions in Apache Kafka") is about 3% lower throughput with 1 KB records
//! and 100 ms commits for the Java producer; `bench/compare.sh` holds librdkafka against Kafka's own
//! ProducerPerformance with the same settings.
//!
//! ```text
//!   schedule: repeat 1 [size 1: plain, idempotent, txn-10ms, overlap-10ms, txn-100ms, ...] [size 2: ...]
//!             repeat 2 [...] ...          (modes interleaved: drift hits every mode alike)
//!   each run: fresh topic, fresh producer, warm-up, timed phase  ([`runner`])
//!   end:      delete the topics, summarise ([`report`]), write JSON/CSV/PNG ([`plot`])
//! ```
//!
//! # Honest counting
//! Only acknowledged records count (plain, idempotent), and in the transactional mode only
//! records of committed transactions, with the commit time inside the measured time; see
//! [`runner`]. The broker test `bench/tests/producer_bench.rs` checks the reported counts against the
//! records read back from each run's topic (read_committed for the transactional runs).
//!
//! # Error handling
//! A failed run ends the benchmark with its error (after deleting the topics): a benchmark that
//! skipped a failing configuration would report a comparison that did not happen. An abortable
//! commit failure is not an error: that transaction is aborted, counted as aborted, and its
//! records are not counted.
//!
//! # Module map
//! - [`options`]: the command line and the validated options.
//! - [`mode`]: the modes and the batching settings shared by all of them (and by compare.sh).
//! - [`runner`]: one timed run.
//! - [`crate::stats`]: median, range, percentiles, ratios (pure).
//! - [`report`]: summaries, the table, JSON and CSV.
//! - [`plot`]: the PNG.

pub mod mode;
pub mod options;
pub mod plot;
pub mod report;
pub mod runner;

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use mode::Mode;
use options::{BenchOptions, Workload};
use price_alerts::kafka::topics::{create_topics, delete_topics, Cleanup, TopicSpec};
use price_alerts::kafka::{connect, KafkaConfig};
use report::{summarize, BenchReport, Machine, Settings};
use runner::{run_once, RunResult, RunSpec};
use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::{error, info};

/// How long the broker has to answer the first metadata request before the benchmark gives up.
const BROKER_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// One run of the interleaved schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedRun {
    /// Position in the schedule.
    pub sequence: usize,
    pub repeat: u32,
    /// Index into the options' sizes.
    pub size_index: usize,
    pub size: usize,
    pub mode: Mode,
    /// Fresh topic (and transactional.id) of this run.
    pub topic: String,
}

/// The interleaved schedule: for each repeat, for each size, every mode in turn (A B C A B C ...),
/// so a slow minute of a shared machine lands on all modes rather than on one.
pub fn schedule(modes: &[Mode], sizes: &[usize], repeats: u32, prefix: &str) -> Vec<PlannedRun> {
    let mut plan = Vec::new();
    for repeat in 0..repeats {
        for (size_index, &size) in sizes.iter().enumerate() {
            for &mode in modes {
                plan.push(PlannedRun {
                    sequence: plan.len(),
                    repeat,
                    size_index,
                    size,
                    mode,
                    topic: format!("{prefix}{}-{size}b-r{repeat}", mode.label()),
                });
            }
        }
    }
    plan
}

/// Fails with a clear message unless a broker answers a metadata request at the bootstrap address.
pub fn check_broker(kafka: &KafkaConfig) -> anyhow::Result<()> {
    connect::check(kafka, BROKER_CHECK_TIMEOUT)
        .context("no Kafka broker to benchmark (start one with scripts/kafka.sh up)")
}

/// Runs the whole benchmark. `stop` (set by Ctrl-C in the binary) ends it after the current run's
/// next check: the runs so far are reported, marked interrupted, and the topics are still deleted.
pub fn run(opts: &BenchOptions, stop: &AtomicBool) -> anyhow::Result<BenchReport> {
    check_broker(&opts.kafka)?;
    let producers = mode::producer_kafka(&opts.kafka)?;
    let settings = settings(opts, &producers)?;
    // Formatting the current UTC time as RFC 3339 cannot fail for years 0-9999; a blank stamp
    // would still leave a valid report.
    let started_at = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let plan = schedule(&opts.modes, &opts.sizes, opts.repeats, &opts.prefix);
    let specs: Vec<TopicSpec> = plan
        .iter()
        .map(|r| TopicSpec {
            name: r.topic.clone(),
            partitions: opts.partitions,
            cleanup: Cleanup::Delete,
            retention: None,
        })
        .collect();
    // All topics up front: topic creation is controller work that would otherwise land between
    // (or inside) runs.
    futures::executor::block_on(create_topics(&opts.kafka, &specs))
        .context("creating the benchmark topics")?;
    info!(topics = plan.len(), prefix = %opts.prefix, "benchmark topics created");

    let outcome = run_plan(opts, &producers, &plan, stop);

    if opts.cleanup {
        let names: Vec<&str> = plan.iter().map(|r| r.topic.as_str()).collect();
        if let Err(e) = futures::executor::block_on(delete_topics(&opts.kafka, &names)) {
            // The runs' outcome matters more than a leftover topic: report, do not mask.
            error!(error = format!("{e:#}"), prefix = %opts.prefix, "deleting the benchmark topics failed");
        }
    }
    let runs = outcome?;
    Ok(BenchReport {
        started_at,
        interrupted: runs.len() < plan.len() || runs.iter().any(|r| r.interrupted),
        summaries: summarize(&runs, &opts.modes, &opts.sizes),
        settings,
        machine: Machine::this(),
        runs,
    })
}

fn run_plan(
    opts: &BenchOptions,
    producers: &KafkaConfig,
    plan: &[PlannedRun],
    stop: &AtomicBool,
) -> anyhow::Result<Vec<RunResult>> {
    let bar = if opts.progress && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(plan.len() as u64);
        // The template is a constant; if indicatif ever refused it, the default style is fine.
        if let Ok(style) =
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} runs  {msg}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut results = Vec::with_capacity(plan.len());
    for p in plan {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        bar.set_message(format!("{} {} B (repeat {})", p.mode, p.size, p.repeat + 1));
        let spec = RunSpec {
            mode: p.mode,
            size: p.size,
            topic: p.topic.clone(),
            limit: opts.limit(p.size_index),
            warmup: opts.warmup,
            transactional_id: p.topic.clone(),
            repeat: p.repeat,
            sequence: p.sequence,
        };
        let r = run_once(producers, &spec, stop).with_context(|| {
            format!(
                "run {} of {} ({} B, {})",
                p.sequence + 1,
                plan.len(),
                p.size,
                p.mode
            )
        })?;
        if bar.is_hidden() {
            info!(mode = %p.mode, size = p.size, repeat = p.repeat, records = r.records,
                records_per_s = r.records_per_s.round(), "run done");
        } else {
            bar.println(format!(
                "{:>11} {:>5} B  repeat {}  {:>10} records/s  {:>8.2} MB/s",
                p.mode.label(),
                p.size,
                p.repeat + 1,
                report::thousands(r.records_per_s),
                r.mb_per_s
            ));
        }
        results.push(r);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(results)
}

fn settings(opts: &BenchOptions, producers: &KafkaConfig) -> anyhow::Result<Settings> {
    let mut producer_properties = BTreeMap::new();
    for &m in &opts.modes {
        let c = m.producer_config(producers, "producer-bench")?;
        let props = c
            .config_map()
            .into_iter()
            .filter(|(k, _)| !matches!(*k, "bootstrap.servers" | "transactional.id"))
            .map(|(k, v)| {
                (
                    k.to_owned(),
                    if is_secret(k) {
                        "[redacted]".to_owned()
                    } else {
                        v.to_owned()
                    },
                )
            })
            .collect();
        producer_properties.insert(m.label(), props);
    }
    let (records, duration_s) = match &opts.workload {
        Workload::Records(r) => (Some(r.clone()), None),
        Workload::Duration(d) => (None, Some(d.as_secs_f64())),
    };
    Ok(Settings {
        bootstrap: opts.kafka.bootstrap.clone(),
        partitions: opts.partitions,
        repeats: opts.repeats,
        warmup_records: opts.warmup,
        record_sizes: opts.sizes.clone(),
        records,
        duration_s,
        modes: opts.modes.iter().map(|m| m.label()).collect(),
        producer_properties,
        librdkafka_version: rdkafka::util::get_rdkafka_version().1,
    })
}

/// Properties whose values must not end up in a results file.
fn is_secret(key: &str) -> bool {
    [
        "password", "secret", "jaas", "token", "key.pem", "keystore", "ssl.key",
    ]
    .iter()
    .any(|s| key.contains(s))
}

/// Writes results.json, summary.csv, runs.csv and throughput.png into `dir` (created if
/// missing); returns the paths written.
pub fn write_outputs(report: &BenchReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    let mut write = |name: &str, bytes: &[u8]| -> anyhow::Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    let json = serde_json::to_vec_pretty(report).context("encoding the report as JSON")?;
    write("results.json", &json)?;
    write("summary.csv", report.summary_csv().as_bytes())?;
    write("runs.csv", report.runs_csv().as_bytes())?;
    let png = dir.join("throughput.png");
    if plot::write_png(report, &png)? {
        written.push(png);
    } else {
        info!("no transactional result: no plot drawn");
    }
    Ok(written)
}

/// Redraws throughput.png and rewrites the CSV files from a results.json, into its folder.
pub fn replot(results_json: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let bytes = std::fs::read(results_json)
        .with_context(|| format!("reading {}", results_json.display()))?;
    let report: BenchReport = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a producer-bench report", results_json.display()))?;
    let dir = results_json.parent().unwrap_or_else(|| Path::new("."));
    write_outputs(&report, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_interleaves_modes_within_each_repeat() {
        let txn = Mode::Transactional {
            commit_interval: Duration::from_millis(100),
        };
        let plan = schedule(&[Mode::Plain, Mode::Idempotent, txn], &[100, 1024], 2, "p-");
        assert_eq!(plan.len(), 12);
        let order: Vec<(u32, usize, Mode)> =
            plan.iter().map(|r| (r.repeat, r.size, r.mode)).collect();
        assert_eq!(
            &order[..6],
            &[
                (0, 100, Mode::Plain),
                (0, 100, Mode::Idempotent),
                (0, 100, txn),
                (0, 1024, Mode::Plain),
                (0, 1024, Mode::Idempotent),
                (0, 1024, txn),
            ]
        );
        assert_eq!(order[6], (1, 100, Mode::Plain));
        assert!(plan.iter().enumerate().all(|(i, r)| r.sequence == i));
        // A fresh topic per configuration-run.
        let mut topics: Vec<&str> = plan.iter().map(|r| r.topic.as_str()).collect();
        topics.sort_unstable();
        topics.dedup();
        assert_eq!(topics.len(), plan.len());
        assert_eq!(plan[2].topic, "p-txn-100ms-100b-r0");
    }

    #[test]
    fn secrets_are_redacted() {
        assert!(is_secret("sasl.password"));
        assert!(is_secret("ssl.key.password"));
        assert!(is_secret("sasl.oauthbearer.client.secret"));
        assert!(!is_secret("linger.ms"));
    }
}
