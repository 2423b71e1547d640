//! How fast an instance holding a large state comes back after a crash: restore and first commit.
//!
//! Each repeat uses fresh topics and the release `alert-pipeline` binary as a child process:
//! 1. **Load.** One tick for every symbol (so all of them have state), then a random walk over
//!    them, pre-loaded.
//! 2. **Steady state.** The pipeline runs until the group's committed offsets reach the end of the
//!    load: every symbol's state is in the changelog, committed.
//! 3. **Crash.** A feeder appends more ticks at a steady rate; once the pipeline has committed some
//!    of them (it is processing mid-stream, a transaction open nearly all the time) it is
//!    SIGKILLed, and the same instance (same instance id, so the same transactional id and static
//!    group member) is started again at once, while ticks keep arriving.
//! 4. **Timing**, from the restart (the spawn of the new process), by polling its Prometheus
//!    endpoint every few ms: *restored* when `alerts_partitions_restored_total` reaches the
//!    partition count, *first commit* when `alerts_transactions_committed_total` reaches 1. The
//!    pipeline's own figures come from the same endpoint: the restore's duration
//!    (`alerts_restore_seconds`, sum) and the changelog records it read
//!    (`alerts_restore_records_total`), hence restore records/s.
//!
//! The metrics are what an operator sees, and they are counted where the thing happens, so the
//! bench does not depend on log wording. The polling adds at most its period (5 ms) to each time.
//!
//! Several binaries may be given: they run interleaved (A B A B …), so a before/after comparison
//! sees the same drift of a shared machine.
//!
//! [`cli`] is `recovery-bench`'s command line and the flow its `main` runs.

pub mod cli;

use crate::child::{free_port, path_str, with_fresh_topics, ChildGuard};
use crate::stats::{max, median};
use anyhow::{bail, Context as _};
use price_alerts::kafka::feed::{next_offsets, Feed};
use price_alerts::kafka::offsets::committed_offsets;
use price_alerts::kafka::read::read_topic_to_end;
use price_alerts::kafka::topics::Topics;
use price_alerts::kafka::{Isolation, KafkaConfig};
use price_alerts::metrics as m;
use price_alerts::rules::Rules;
use price_alerts::tick::Tick;
use price_alerts::tools::generate::{generate, symbol, GenOptions};
use rdkafka::Message;
use rust_decimal::Decimal;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the restarted pipeline's metrics are read.
const POLL: Duration = Duration::from_millis(5);

/// Bound on each phase of a run.
const PHASE_TIMEOUT: Duration = Duration::from_secs(600);

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub kafka: KafkaConfig,
    /// The `alert-pipeline` binaries to compare (interleaved); usually one.
    pub binaries: Vec<PathBuf>,
    /// Extra arguments of every pipeline process (e.g. `-X` properties).
    pub pipeline_args: Vec<String>,
    pub repeats: usize,
    /// Symbols, each with state (one tick each first).
    pub symbols: usize,
    /// Random-walk ticks pre-loaded after the covering ones.
    pub ticks: usize,
    /// Ticks per second appended around the crash and the restart.
    pub live_rate: usize,
    /// Live ticks committed before the kill.
    pub kill_after: usize,
    pub partitions: i32,
    pub commit_interval: String,
    /// Where the pipelines' logs go (one file per process).
    pub log_dir: PathBuf,
    /// Live alerts (issue 42): this many alerts per symbol, loaded into the rules topic before the
    /// ticks, and the pipeline run with `--live-rules`; 0: the rules file.
    pub live_alerts: usize,
}

/// `per_symbol` live alerts for every symbol of `rules`, around its thresholds (each threshold
/// again a cent higher per round), the directions in turn.
pub fn live_alerts(
    rules: &Rules,
    per_symbol: usize,
) -> Vec<(String, price_alerts::rules::live::Alert)> {
    use price_alerts::rules::live::{Alert, Watch};
    let mut out = Vec::with_capacity(rules.len() * per_symbol);
    for s in rules.symbols() {
        let ts = rules.thresholds(s).unwrap_or_default();
        for k in 0..per_symbol {
            let Some(base) = ts.get(k % ts.len().max(1)) else {
                continue;
            };
            out.push((
                format!("{s}-a{k}"),
                Alert {
                    symbol: s.to_owned(),
                    threshold: base + Decimal::new((k / ts.len()) as i64, 2),
                    direction: [Watch::Up, Watch::Down, Watch::Both][k % 3],
                    subscriber: None,
                    one_shot: false,
                    rearm_band: None,
                },
            ));
        }
    }
    out
}

/// The figures of one repeat.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// The binary's file name (its label).
    pub binary: String,
    pub repeat: usize,
    /// From the restart to every partition restored (s).
    pub restored_s: f64,
    /// From the restart to the first committed transaction (s).
    pub first_commit_s: f64,
    /// The restore's own duration, as the pipeline measured it (s).
    pub restore_s: f64,
    /// Changelog records the restore read.
    pub restore_records: f64,
    /// Changelog records (committed) and their key+value bytes, read after the run.
    pub changelog_records: u64,
    pub changelog_bytes: u64,
    /// Symbols in the committed state, after the run.
    pub symbols: usize,
    /// Peak RSS of the restarted process (MiB) when it reached its first commit.
    pub peak_rss_mib: f64,
}

impl RunResult {
    pub fn restore_records_per_s(&self) -> f64 {
        if self.restore_s > 0.0 {
            self.restore_records / self.restore_s
        } else {
            f64::NAN
        }
    }
}

impl std::fmt::Display for RunResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} #{}: restored {:.2} s, first commit {:.2} s after restart; restore {:.2} s for {:.0} records ({:.0}/s); changelog {} records, {:.1} MiB; {} symbols; peak RSS {:.0} MiB",
            self.binary,
            self.repeat,
            self.restored_s,
            self.first_commit_s,
            self.restore_s,
            self.restore_records,
            self.restore_records_per_s(),
            self.changelog_records,
            self.changelog_bytes as f64 / (1024.0 * 1024.0),
            self.symbols,
            self.peak_rss_mib,
        )
    }
}

/// Medians and maxima over the repeats of one binary.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub binary: String,
    pub repeats: usize,
    pub restored_p50_s: f64,
    pub restored_max_s: f64,
    pub first_commit_p50_s: f64,
    pub first_commit_max_s: f64,
    pub restore_p50_s: f64,
    pub restore_records_per_s_p50: f64,
    pub changelog_records_p50: f64,
    pub changelog_mib_p50: f64,
}

/// Runs every binary `repeats` times, interleaved; `progress` is told of each run.
pub fn run(opts: &Options, mut progress: impl FnMut(&RunResult)) -> anyhow::Result<Vec<RunResult>> {
    let mut results = Vec::new();
    for repeat in 0..opts.repeats {
        for binary in &opts.binaries {
            let r = run_one(opts, binary, repeat)
                .with_context(|| format!("run {} #{repeat}", label(binary)))?;
            progress(&r);
            results.push(r);
        }
    }
    Ok(results)
}

fn label(binary: &Path) -> String {
    binary
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| binary.display().to_string())
}

/// p50 and max per binary, in the order given.
pub fn summarize(binaries: &[PathBuf], results: &[RunResult]) -> Vec<Summary> {
    binaries
        .iter()
        .map(|b| label(b))
        .filter_map(|b| {
            let of = |f: fn(&RunResult) -> f64| -> Vec<f64> {
                results.iter().filter(|r| r.binary == b).map(f).collect()
            };
            let restored = of(|r| r.restored_s);
            let first = of(|r| r.first_commit_s);
            Some(Summary {
                repeats: restored.len(),
                restored_p50_s: median(&restored)?,
                restored_max_s: max(&restored)?,
                first_commit_p50_s: median(&first)?,
                first_commit_max_s: max(&first)?,
                restore_p50_s: median(&of(|r| r.restore_s))?,
                restore_records_per_s_p50: median(&of(RunResult::restore_records_per_s))?,
                changelog_records_p50: median(&of(|r| r.changelog_records as f64))?,
                changelog_mib_p50: median(&of(|r| r.changelog_bytes as f64 / 1048576.0))?,
                binary: b,
            })
        })
        .collect()
}

/// The summary as a Markdown table.
pub fn table(summaries: &[Summary]) -> String {
    let mut out = String::from(
        "| binary | repeats | restored p50 / max | first commit p50 / max | restore (pipeline's) p50 | restore records/s p50 | changelog records p50 | changelog MiB p50 |\n|---|---|---|---|---|---|---|---|\n",
    );
    for s in summaries {
        out.push_str(&format!(
            "| {} | {} | {:.2} / {:.2} s | {:.2} / {:.2} s | {:.2} s | {:.0} | {:.0} | {:.1} |\n",
            s.binary,
            s.repeats,
            s.restored_p50_s,
            s.restored_max_s,
            s.first_commit_p50_s,
            s.first_commit_max_s,
            s.restore_p50_s,
            s.restore_records_per_s_p50,
            s.changelog_records_p50,
            s.changelog_mib_p50,
        ));
    }
    out
}

/// Writes `results.json` and `results.md` into `dir`; returns the table.
pub fn write_outputs(
    dir: &Path,
    binaries: &[PathBuf],
    results: &[RunResult],
) -> anyhow::Result<String> {
    let summary = summarize(binaries, results);
    let table = table(&summary);
    crate::write_results(dir, &(&summary, results), &table)?;
    Ok(table)
}

/// One tick for every symbol (seq 0, between its middle thresholds, so every symbol has state),
/// then the random walk (whose seqs start at 1), and the rules.
pub fn covering_stream(symbols: usize, ticks: usize, seed: u64) -> (Rules, Vec<Tick>) {
    let (rules, walk) = generate(&GenOptions {
        symbols,
        ticks,
        seed,
        stale_every: 0,
    });
    let mut all = Vec::with_capacity(symbols + walk.len());
    for i in 0..symbols {
        let name = symbol(i);
        let price = match rules.thresholds(&name) {
            Some(t) if t.len() >= 3 => (t[1] + t[2]) / Decimal::from(2),
            Some(t) if !t.is_empty() => t[0],
            _ => Decimal::ONE,
        };
        all.push(Tick {
            symbol: name,
            price: price.round_dp(2),
            seq: 0,
            ts: None,
        });
    }
    all.extend(walk);
    (rules, all)
}

fn run_one(opts: &Options, binary: &Path, repeat: usize) -> anyhow::Result<RunResult> {
    with_fresh_topics(&opts.kafka, "rbench", opts.partitions, |app_id, topics| {
        measure(opts, binary, repeat, app_id, topics)
    })
}

/// Starts one pipeline process (instance 0) with its metrics on `metrics_addr` and its log in
/// `log`.
fn spawn(
    opts: &Options,
    binary: &Path,
    rules: &Path,
    app_id: &str,
    topics: &Topics,
    metrics_addr: &str,
    log: &Path,
) -> anyhow::Result<ChildGuard> {
    let log = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let alerts: Vec<&str> = match opts.live_alerts {
        0 => vec!["--rules", path_str(rules)?],
        _ => vec!["--live-rules"],
    };
    let child = Command::new(binary)
        .args(alerts)
        .args(["--app-id", app_id])
        // The same instance, restarted: static membership takes its partitions back at once
        // (under the dynamic default a restart waits out the dead member's session first).
        .args(["--bootstrap", &opts.kafka.bootstrap, "--instance-id", "0"])
        .arg("--static-membership")
        .args(["--input", &topics.input, "--output", &topics.notifications])
        .args(["--commit-interval", &opts.commit_interval])
        .args(["--metrics-addr", metrics_addr])
        .args(&opts.pipeline_args)
        .env("RUST_LOG", "warn,price_alerts=info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    Ok(ChildGuard(child))
}

/// Sum of the group's committed offsets over the input's partitions.
fn committed_sum(kafka: &KafkaConfig, group: &str, topic: &str) -> anyhow::Result<i64> {
    Ok(committed_offsets(kafka, group, topic)?
        .into_iter()
        .flatten()
        .sum())
}

fn measure(
    opts: &Options,
    binary: &Path,
    repeat: usize,
    app_id: &str,
    topics: &Topics,
) -> anyhow::Result<RunResult> {
    let kafka = &opts.kafka;
    // Live ticks for as long as the crash and restart may take: two minutes at the rate.
    let live_len = opts.live_rate * 120;
    let (rules, ticks) = covering_stream(opts.symbols, opts.ticks + live_len, 2000 + repeat as u64);
    let rules_path = std::env::temp_dir().join(format!("{app_id}-rules.toml"));
    std::fs::write(&rules_path, rules.to_toml())?;
    std::fs::create_dir_all(&opts.log_dir)?;
    let name = label(binary);
    let (load, live) = ticks.split_at(opts.symbols + opts.ticks);
    if opts.live_alerts > 0 {
        let alerts = live_alerts(&rules, opts.live_alerts);
        price_alerts::tools::alerts::load_blocking(kafka, app_id, &topics.input, &alerts)?;
    }
    let feed = Feed::new(kafka)?;
    let landed = feed.send_ticks(&topics.input, load)?;
    let loaded: i64 = next_offsets(&landed).values().sum();

    // Steady state: everything loaded is committed, so every symbol's state is in the changelog.
    let first_addr = format!("127.0.0.1:{}", free_port()?);
    let first = spawn(
        opts,
        binary,
        &rules_path,
        app_id,
        topics,
        &first_addr,
        &opts.log_dir.join(format!("{name}-{repeat}-first.log")),
    )?;
    let deadline = Instant::now() + PHASE_TIMEOUT;
    while committed_sum(kafka, app_id, &topics.input)? < loaded {
        if Instant::now() > deadline {
            bail!("the pipeline did not commit the {loaded} loaded ticks");
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    // Live ticks from a thread of their own, in 50 ms slices, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (kafka, topic, stop) = (kafka.clone(), topics.input.clone(), Arc::clone(&stop));
        let live = live.to_vec();
        let per_slice = (opts.live_rate / 20).max(1);
        std::thread::spawn(move || -> anyhow::Result<()> {
            let feed = Feed::new(&kafka)?;
            let started = Instant::now();
            for (i, chunk) in live.chunks(per_slice).enumerate() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                feed.send_ticks(&topic, chunk)?;
                let next = started + Duration::from_millis(50 * (i as u64 + 1));
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            Ok(())
        })
    };
    let result = crash_and_restart(
        opts,
        binary,
        &rules_path,
        app_id,
        topics,
        first,
        loaded,
        repeat,
    );
    stop.store(true, Ordering::Relaxed);
    let fed = feeder.join();
    let _ = std::fs::remove_file(&rules_path);
    let mut r = result?;
    match fed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.context("feeding live ticks")),
        Err(_) => bail!("the feeder thread panicked"),
    }

    // The changelog, as a restoring instance reads it: records, bytes, symbols.
    let mut symbols = std::collections::HashSet::new();
    let (mut records, mut bytes) = (0u64, 0u64);
    read_topic_to_end(
        kafka,
        &topics.changelog,
        Isolation::ReadCommitted,
        PHASE_TIMEOUT,
        |m| {
            records += 1;
            bytes += (m.key_len() + m.payload_len()) as u64;
            if let Some(k) = m.key() {
                symbols.insert(k.to_vec());
            }
            Ok(())
        },
    )?;
    r.changelog_records = records;
    r.changelog_bytes = bytes;
    r.symbols = symbols.len();
    Ok(r)
}

#[allow(clippy::too_many_arguments)]
fn crash_and_restart(
    opts: &Options,
    binary: &Path,
    rules: &Path,
    app_id: &str,
    topics: &Topics,
    first: ChildGuard,
    loaded: i64,
    repeat: usize,
) -> anyhow::Result<RunResult> {
    let kafka = &opts.kafka;
    let name = label(binary);
    // Mid-stream: some live ticks are committed, so the feeder and the pipeline are both running.
    let deadline = Instant::now() + PHASE_TIMEOUT;
    while committed_sum(kafka, app_id, &topics.input)? < loaded + opts.kill_after as i64 {
        if Instant::now() > deadline {
            bail!("the pipeline did not commit live ticks");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    first.signal("KILL")?;
    let mut first = first;
    first.0.wait()?;

    let addr = format!("127.0.0.1:{}", free_port()?);
    let restarted_at = Instant::now();
    let mut second = spawn(
        opts,
        binary,
        rules,
        app_id,
        topics,
        &addr,
        &opts.log_dir.join(format!("{name}-{repeat}-restart.log")),
    )?;
    let mut restored_s = None;
    let first_commit_s = loop {
        let elapsed = restarted_at.elapsed();
        if restored_s.is_none()
            && m::scrape(&addr, m::PARTITIONS_RESTORED) >= f64::from(opts.partitions)
        {
            restored_s = Some(elapsed.as_secs_f64());
        }
        if m::scrape(&addr, m::TRANSACTIONS_COMMITTED) >= 1.0 {
            break elapsed.as_secs_f64();
        }
        if elapsed > PHASE_TIMEOUT {
            bail!("the restarted pipeline never committed");
        }
        if let Some(status) = second.0.try_wait()? {
            bail!("the restarted pipeline exited with {status}");
        }
        std::thread::sleep(POLL);
    };
    let peak_rss_mib = second.peak_rss_mib();
    let restore_s = m::scrape(&addr, &format!("{}_sum", m::RESTORE_SECONDS));
    let restore_records = m::scrape(&addr, m::RESTORE_RECORDS);
    drop(second);
    Ok(RunResult {
        binary: name,
        repeat,
        // Restored no later than its first commit (a commit needs restored partitions).
        restored_s: restored_s.unwrap_or(first_commit_s),
        first_commit_s,
        restore_s,
        restore_records,
        changelog_records: 0,
        changelog_bytes: 0,
        symbols: 0,
        peak_rss_mib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    #[test]
    fn the_covering_stream_gives_every_symbol_state_before_its_walk() {
        let (rules, ticks) = covering_stream(50, 500, 7);
        assert_eq!(rules.len(), 50);
        let first: HashSet<&str> = ticks[..50].iter().map(|t| t.symbol.as_str()).collect();
        assert_eq!(first.len(), 50, "one tick per symbol first");
        // Per symbol, seqs only grow: no tick of the walk is stale against the covering one.
        let mut last: HashMap<&str, u64> = HashMap::new();
        for t in &ticks {
            if let Some(&prev) = last.get(t.symbol.as_str()) {
                assert!(t.seq > prev, "{} seq {} after {prev}", t.symbol, t.seq);
            }
            last.insert(&t.symbol, t.seq);
        }
        assert_eq!(ticks.len(), 550);
    }
}
