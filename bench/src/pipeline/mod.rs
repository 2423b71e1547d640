//! What exactly-once costs the pipeline: throughput, end-to-end latency and memory, by mode.
//!
//! Each run uses fresh topics and the release `alert-pipeline` binary as a child process, as it
//! is deployed:
//! 1. **Throughput.** N ticks are pre-loaded and the pipeline starts. The clock starts when the
//!    pipeline is ready to consume (its metrics endpoint reports every partition restored), so
//!    process start-up and group join are not counted, and stops when the group's committed
//!    offsets reach the end of the backlog: a long commit interval pays for its last commit.
//! 2. **Latency.** With the backlog done, a read_committed consumer ([`crate::tail`]) is placed
//!    at the end of `notifications`, and only then are L more ticks appended at a steady rate; a
//!    notification's latency is the time it became visible to that consumer minus the append
//!    time of its tick (the record timestamp, carried in `tick_ts`). That is what a downstream
//!    reader waits: batching plus commit.
//! 3. **Memory.** Peak RSS of the child (`VmHWM`) before it is stopped with SIGTERM, and the
//!    peak of the processing alone: the high-water mark is read and reset when the pipeline is
//!    ready, so start-up (the rules file, the restore) and processing are told apart.
//!
//! Configurations are interleaved (A B C D A B C D …) and repeated, so drift on a shared machine
//! hits all of them alike; medians are reported with their spread, and [`plot`] draws the latency
//! distribution of each configuration, pooled over its repeats. [`cli`] is `pipeline-bench`'s
//! command line and the flow its `main` runs.

pub mod cli;
pub mod plot;

use crate::child::{free_port, path_str, with_fresh_topics, ChildGuard};
use crate::stats::{median, percentile};
use crate::tail::LatencyTail;
use anyhow::{bail, Context as _};
use price_alerts::kafka::feed::{next_offsets, Feed};
use price_alerts::kafka::offsets::committed_offsets;
use price_alerts::kafka::topics::Topics;
use price_alerts::kafka::KafkaConfig;
use price_alerts::tools::generate::{generate, GenOptions};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One configuration of the pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Config {
    /// `exactly-once` or `at-least-once`.
    pub guarantee: &'static str,
    pub commit_interval_ms: u64,
    /// Extra arguments of the child (e.g. `-X` properties) and their name, so settings can be
    /// compared in interleaved runs of the same binary; empty for the pipeline as it ships.
    pub variant: Variant,
}

/// A named set of extra arguments for the child process, environment variables
/// (`env:KEY=VALUE` tokens, e.g. `env:MALLOC_ARENA_MAX=2` to compare allocator settings), and
/// another build of the pipeline (a `bin:PATH` token, to compare builds in interleaved runs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Variant {
    pub name: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub binary: Option<PathBuf>,
}

impl std::str::FromStr for Variant {
    type Err = String;

    /// `NAME=ARGS`, the arguments separated by whitespace: `small=-X queued.min.messages=1000`;
    /// an argument `env:KEY=VALUE` sets an environment variable of the child instead, and
    /// `bin:PATH` runs the `alert-pipeline` at PATH.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, args) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: a variant is NAME=ARGS"))?;
        let mut v = Variant {
            name: name.trim().to_owned(),
            ..Variant::default()
        };
        for token in args.split_whitespace() {
            if let Some(kv) = token.strip_prefix("env:") {
                let (k, val) = kv
                    .split_once('=')
                    .ok_or_else(|| format!("{token:?}: write env:KEY=VALUE"))?;
                v.env.push((k.to_owned(), val.to_owned()));
            } else if let Some(path) = token.strip_prefix("bin:") {
                v.binary = Some(PathBuf::from(path));
            } else {
                v.args.push(token.to_owned());
            }
        }
        Ok(v)
    }
}

impl Variant {
    /// The child's extra arguments under `guarantee`. At least once there are no transactions to
    /// overlap, and the pipeline refuses `--overlap-commits` with it: a variant that names it runs
    /// at least once without it, so it can be paired with its own at-least-once run.
    pub fn args_for<'a>(&'a self, guarantee: &'a str) -> impl Iterator<Item = &'a String> {
        self.args
            .iter()
            .filter(move |a| guarantee == "exactly-once" || *a != "--overlap-commits")
    }
}

impl Config {
    pub fn label(&self) -> String {
        let base = format!("{} {}ms", self.guarantee, self.commit_interval_ms);
        if self.variant.name.is_empty() {
            base
        } else {
            format!("{base} [{}]", self.variant.name)
        }
    }

    /// Exactly-once at each of `intervals_ms`, then at-least-once at each of `alo_intervals_ms`;
    /// each once per variant (once as shipped when there are none).
    pub fn list(
        intervals_ms: &[u64],
        alo_intervals_ms: &[u64],
        variants: &[Variant],
    ) -> Vec<Config> {
        let shipped = [Variant::default()];
        let variants = if variants.is_empty() {
            &shipped[..]
        } else {
            variants
        };
        let mut configs = Vec::new();
        for variant in variants {
            for &ms in intervals_ms {
                configs.push(Config {
                    guarantee: "exactly-once",
                    commit_interval_ms: ms,
                    variant: variant.clone(),
                });
            }
            for &ms in alo_intervals_ms {
                configs.push(Config {
                    guarantee: "at-least-once",
                    commit_interval_ms: ms,
                    variant: variant.clone(),
                });
            }
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
    /// Where the backlog's time went: commits per second, the share of the time spent inside
    /// commits (the loop neither polls nor processes meanwhile), and each commit step's mean per
    /// commit in ms (the pipeline's `alerts_commit_step_seconds`).
    pub backlog: CommitTimeline,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub latency_samples: usize,
    /// Commits per second and their mean duration (the pipeline's `alerts_commit_seconds`) while
    /// the paced ticks arrived: how much of the latency is the commit.
    pub paced_commits_per_sec: f64,
    pub paced_commit_mean_ms: f64,
    /// Commits of the paced phase that took longer than 100 ms (the histogram's bucket).
    pub paced_slow_commits: f64,
    /// Every latency sample of the run (ms), for the plot.
    pub latencies_ms: Vec<f64>,
    /// Peak RSS over the whole run (start-up included).
    pub peak_rss_mib: f64,
    /// Peak RSS until the pipeline was ready (start-up: rules, clients, restore).
    pub startup_peak_rss_mib: f64,
    /// Peak RSS from ready to the end (processing the backlog and the paced ticks).
    pub processing_peak_rss_mib: f64,
}

impl std::fmt::Display for RunResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} #{}: {:.0} ticks/s ({}), latency p50 {:.0} ms p99 {:.0} ms ({} samples; {:.1} commits/s of {:.1} ms, {} over 100 ms), peak RSS {:.0} MiB (start-up {:.0}, processing {:.0})",
            self.config.label(),
            self.repeat,
            self.ticks_per_sec,
            self.backlog,
            self.latency_p50_ms,
            self.latency_p99_ms,
            self.latency_samples,
            self.paced_commits_per_sec,
            self.paced_commit_mean_ms,
            self.paced_slow_commits,
            self.peak_rss_mib,
            self.startup_peak_rss_mib,
            self.processing_peak_rss_mib
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
    /// Medians of the repeats' backlog timelines, field by field.
    pub backlog: CommitTimeline,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub paced_commits_per_sec: f64,
    pub paced_commit_mean_ms: f64,
    pub paced_slow_commits: f64,
    pub peak_rss_mib: f64,
    pub startup_peak_rss_mib: f64,
    pub processing_peak_rss_mib: f64,
    /// For an exactly-once configuration, against its at-least-once partner ([`partner`]):
    /// the median of the per-repeat ratios of ticks/s and of latency p99 (runs of the same
    /// repeat ran next to each other, so drift on the machine hits both alike).
    pub paired: Option<Paired>,
}

/// Exactly-once over at-least-once, as medians of per-repeat ratios.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Paired {
    pub at_least_once_interval_ms: u64,
    pub ticks_per_sec: f64,
    pub latency_p99: f64,
}

/// The at-least-once configuration an exactly-once one is compared with: the one of the same
/// variant and interval, else the first of the same variant.
pub fn partner<'a>(configs: &'a [Config], c: &Config) -> Option<&'a Config> {
    if c.guarantee != "exactly-once" {
        return None;
    }
    let alo = || {
        configs
            .iter()
            .filter(|o| o.guarantee == "at-least-once" && o.variant == c.variant)
    };
    alo()
        .find(|o| o.commit_interval_ms == c.commit_interval_ms)
        .or_else(|| alo().next())
}

fn paired(configs: &[Config], c: &Config, results: &[RunResult]) -> Option<Paired> {
    let alo = partner(configs, c)?;
    let ratios = |f: fn(&RunResult) -> f64| -> Vec<f64> {
        results
            .iter()
            .filter(|r| &r.config == c)
            .filter_map(|r| {
                let other = results
                    .iter()
                    .find(|o| &o.config == alo && o.repeat == r.repeat)?;
                (f(other) > 0.0).then(|| f(r) / f(other))
            })
            .collect()
    };
    Some(Paired {
        at_least_once_interval_ms: alo.commit_interval_ms,
        ticks_per_sec: median(&ratios(|r| r.ticks_per_sec))?,
        latency_p99: median(&ratios(|r| r.latency_p99_ms))?,
    })
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
    configs
        .iter()
        .filter_map(|c| {
            let of = |f: fn(&RunResult) -> f64| -> Vec<f64> {
                results.iter().filter(|r| &r.config == c).map(f).collect()
            };
            let tps = of(|r| r.ticks_per_sec);
            Some(Summary {
                config: c.clone(),
                ticks_per_sec: median(&tps)?,
                ticks_per_sec_min: tps.iter().copied().fold(f64::INFINITY, f64::min),
                ticks_per_sec_max: tps.iter().copied().fold(0.0, f64::max),
                backlog: CommitTimeline::median(
                    results
                        .iter()
                        .filter(|r| &r.config == c)
                        .map(|r| &r.backlog),
                )?,
                latency_p50_ms: median(&of(|r| r.latency_p50_ms))?,
                latency_p99_ms: median(&of(|r| r.latency_p99_ms))?,
                paced_commits_per_sec: median(&of(|r| r.paced_commits_per_sec))?,
                paced_commit_mean_ms: median(&of(|r| r.paced_commit_mean_ms))?,
                paced_slow_commits: median(&of(|r| r.paced_slow_commits))?,
                peak_rss_mib: median(&of(|r| r.peak_rss_mib))?,
                startup_peak_rss_mib: median(&of(|r| r.startup_peak_rss_mib))?,
                processing_peak_rss_mib: median(&of(|r| r.processing_peak_rss_mib))?,
                paired: paired(configs, c, results),
            })
        })
        .collect()
}

/// Writes `results.json` (summaries and every run), `results.md` (the table) and `latency.png`
/// (the latency distributions) into `dir`; returns the table.
pub fn write_outputs(
    dir: &Path,
    configs: &[Config],
    results: &[RunResult],
) -> anyhow::Result<String> {
    let summary = summarize(configs, results);
    let table = table(&summary);
    crate::write_results(dir, &(&summary, results), &table)?;
    plot::write_png(configs, results, &dir.join("latency.png"))?;
    Ok(table)
}

/// The summary as a Markdown table.
pub fn table(summaries: &[Summary]) -> String {
    let mut out = String::from(
        "| mode | commit interval | variant | ticks/s (median) | min-max | paired / at-least-once: ticks/s, p99 | backlog: commits/s, time in commits, steps (mean ms) | latency p50 | latency p99 | paced commits/s | paced commit mean | paced commits > 100 ms | peak RSS | start-up peak | processing peak |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in summaries {
        out.push_str(&format!(
            "| {} | {} ms | {} | {:.0} | {:.0}-{:.0} | {} | {} | {:.0} ms | {:.0} ms | {:.1} | {:.1} ms | {:.0} | {:.0} MiB | {:.0} MiB | {:.0} MiB |\n",
            s.config.guarantee,
            s.config.commit_interval_ms,
            if s.config.variant.name.is_empty() { "as shipped" } else { &s.config.variant.name },
            s.ticks_per_sec,
            s.ticks_per_sec_min,
            s.ticks_per_sec_max,
            s.paired.map_or("-".to_owned(), |p| format!(
                "{:.3}, {:.2} (vs {} ms)",
                p.ticks_per_sec, p.latency_p99, p.at_least_once_interval_ms
            )),
            s.backlog,
            s.latency_p50_ms,
            s.latency_p99_ms,
            s.paced_commits_per_sec,
            s.paced_commit_mean_ms,
            s.paced_slow_commits,
            s.peak_rss_mib,
            s.startup_peak_rss_mib,
            s.processing_peak_rss_mib
        ));
    }
    out
}

fn run_one(opts: &Options, config: &Config, repeat: usize) -> anyhow::Result<RunResult> {
    with_fresh_topics(&opts.kafka, "pbench", opts.partitions, |app_id, topics| {
        measure(opts, config, repeat, app_id, topics)
    })
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
    // A variant with --live-rules joins the rules topic: the same rules, loaded as alerts before
    // the ticks are written (so that they are in force for them), and no file.
    let live = config.variant.args.iter().any(|a| a == "--live-rules");
    if live {
        let alerts = price_alerts::tools::alerts::alerts_of_file(&rules, None);
        price_alerts::tools::alerts::load_blocking(kafka, app_id, &topics.input, &alerts)?;
    }
    let rules_args: Vec<&str> = if live {
        Vec::new()
    } else {
        vec!["--rules", path_str(&rules_path)?]
    };
    let feed = Feed::new(kafka)?;
    let (backlog, paced) = ticks.split_at(opts.ticks);
    let metrics_addr = format!("127.0.0.1:{}", free_port()?);
    let mut landed = feed.send_ticks(&topics.input, backlog)?;

    let binary = config.variant.binary.as_ref().unwrap_or(&opts.binary);
    let child = Command::new(binary)
        .args(&rules_args)
        .args(["--app-id", app_id, "--bootstrap", &kafka.bootstrap])
        .args(["--input", &topics.input, "--output", &topics.notifications])
        .args([
            "--guarantee",
            config.guarantee,
            "--commit-interval",
            &format!("{}ms", config.commit_interval_ms),
        ])
        .args(["--metrics-addr", &metrics_addr])
        .args(config.variant.args_for(config.guarantee))
        .envs(config.variant.env.iter().map(|(k, v)| (k, v)))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let child = ChildGuard(child);

    // Throughput: from ready to the backlog committed.
    let target = next_offsets(&landed);
    let total: i64 = target.values().sum();
    let deadline = Instant::now() + Duration::from_secs(600);
    while price_alerts::metrics::scrape(&metrics_addr, "alerts_partitions_restored_total")
        < f64::from(opts.partitions)
    {
        if Instant::now() > deadline {
            bail!("the pipeline never reported its partitions restored");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let ready = Instant::now();
    let startup_peak_rss_mib = child.peak_rss_mib();
    child.reset_peak_rss()?;
    let at_ready = CommitTotals::scrape(&metrics_addr);
    let ticks_per_sec = loop {
        let pos: i64 = committed_offsets(kafka, app_id, &topics.input)?
            .into_iter()
            .flatten()
            .sum();
        if pos >= total {
            break total as f64 / ready.elapsed().as_secs_f64();
        }
        if Instant::now() > deadline {
            bail!("the pipeline did not catch up with {total} ticks");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let backlog = CommitTimeline::between(
        &at_ready,
        &CommitTotals::scrape(&metrics_addr),
        total as f64 / ticks_per_sec,
    );

    // Latency: paced ticks while a read_committed consumer tails the notifications.
    let tail = LatencyTail::start(kafka, &topics.notifications, opts.partitions)?;
    let slices = PACED_SLICES_PER_SEC;
    let per_slice = (opts.latency_rate / slices).max(1);
    let commits_before = CommitTotals::scrape(&metrics_addr);
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
        if Instant::now() > deadline {
            bail!("the pipeline did not catch up with the paced ticks");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (paced_commits_per_sec, paced_commit_mean_ms, paced_slow_commits) = {
        let now = CommitTotals::scrape(&metrics_addr);
        let (count, sum) = (
            now.count - commits_before.count,
            now.sum - commits_before.sum,
        );
        let fast = now.within_100ms - commits_before.within_100ms;
        let mean_ms = if count > 0.0 {
            sum / count * 1e3
        } else {
            f64::NAN
        };
        (
            count / started.elapsed().as_secs_f64(),
            mean_ms,
            count - fast,
        )
    };
    let latencies = tail.finish()?;

    let processing_peak_rss_mib = child.peak_rss_mib();
    let peak_rss_mib = startup_peak_rss_mib.max(processing_peak_rss_mib);
    child.signal("TERM")?;
    let mut child = child;
    let exit = child.0.wait()?;
    if !exit.success() {
        bail!("the pipeline exited with {exit}");
    }
    let _ = std::fs::remove_file(&rules_path);
    Ok(RunResult {
        config: config.clone(),
        repeat,
        ticks_per_sec,
        backlog,
        latency_p50_ms: percentile(&latencies, 50.0).unwrap_or(f64::NAN),
        latency_p99_ms: percentile(&latencies, 99.0).unwrap_or(f64::NAN),
        latency_samples: latencies.len(),
        latencies_ms: latencies,
        paced_commits_per_sec,
        paced_commit_mean_ms,
        paced_slow_commits,
        peak_rss_mib,
        startup_peak_rss_mib,
        processing_peak_rss_mib,
    })
}

/// The paced ticks go out in this many slices a second (each sent and acknowledged, then a wait
/// for the next): 100, 10 ms apart, is close to a steady stream. With 20 slices, bursts 50 ms
/// apart, the burst that opened a batch made up half of it and waited the whole interval, which
/// measured the pacing as much as the pipeline.
const PACED_SLICES_PER_SEC: usize = 100;

/// The pipeline's commits so far: how many, their total duration in seconds, how many took at
/// most 100 ms, and each step's total duration in seconds.
#[derive(Debug)]
struct CommitTotals {
    count: f64,
    sum: f64,
    within_100ms: f64,
    steps: BTreeMap<&'static str, f64>,
}

impl CommitTotals {
    fn scrape(metrics_addr: &str) -> CommitTotals {
        use price_alerts::metrics::{COMMIT_SECONDS, COMMIT_STEPS, COMMIT_STEP_SECONDS};
        let scrape = |series: String| price_alerts::metrics::scrape(metrics_addr, &series);
        CommitTotals {
            count: scrape(format!("{COMMIT_SECONDS}_count")),
            sum: scrape(format!("{COMMIT_SECONDS}_sum")),
            within_100ms: scrape(format!("{COMMIT_SECONDS}_bucket{{le=\"0.1\"}}")),
            steps: COMMIT_STEPS
                .iter()
                .map(|&step| {
                    let sum = scrape(format!("{COMMIT_STEP_SECONDS}_sum{{step=\"{step}\"}}"));
                    (step, sum)
                })
                .collect(),
        }
    }
}

/// Where a phase's time went, from the commit totals at its start and end and its length.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CommitTimeline {
    pub commits_per_sec: f64,
    /// Seconds inside commits per second of the phase.
    pub share_in_commits: f64,
    /// Each step's mean per commit, in ms; steps the mode does not take are left out.
    pub steps_ms: BTreeMap<String, f64>,
}

impl CommitTimeline {
    fn between(before: &CommitTotals, after: &CommitTotals, seconds: f64) -> CommitTimeline {
        let commits = after.count - before.count;
        let per_commit_ms = |sum: f64| {
            if commits > 0.0 {
                sum / commits * 1e3
            } else {
                f64::NAN
            }
        };
        CommitTimeline {
            commits_per_sec: commits / seconds,
            share_in_commits: (after.sum - before.sum) / seconds,
            steps_ms: after
                .steps
                .iter()
                .map(|(&step, &sum)| (step, sum - before.steps.get(step).copied().unwrap_or(0.0)))
                .filter(|&(_, took)| took > 0.0)
                .map(|(step, took)| (step.to_owned(), per_commit_ms(took)))
                .collect(),
        }
    }

    /// Field by field, the median over `timelines`; `None` when there are none.
    fn median<'a>(timelines: impl Iterator<Item = &'a CommitTimeline>) -> Option<CommitTimeline> {
        let all: Vec<&CommitTimeline> = timelines.collect();
        let of = |f: &dyn Fn(&CommitTimeline) -> Option<f64>| -> Option<f64> {
            median(&all.iter().filter_map(|t| f(t)).collect::<Vec<f64>>())
        };
        let steps: BTreeSet<&String> = all.iter().flat_map(|t| t.steps_ms.keys()).collect();
        Some(CommitTimeline {
            commits_per_sec: of(&|t| Some(t.commits_per_sec))?,
            share_in_commits: of(&|t| Some(t.share_in_commits))?,
            steps_ms: steps
                .into_iter()
                .filter_map(|step| Some((step.clone(), of(&|t| t.steps_ms.get(step).copied())?)))
                .collect(),
        })
    }
}

impl std::fmt::Display for CommitTimeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} commits/s, {:.1} % in commits",
            self.commits_per_sec,
            self.share_in_commits * 100.0
        )?;
        // In the order a commit takes them.
        let mut steps: Vec<(&String, &f64)> = self.steps_ms.iter().collect();
        steps.sort_by_key(|(step, _)| {
            price_alerts::metrics::COMMIT_STEPS
                .iter()
                .position(|s| s == step)
                .unwrap_or(usize::MAX)
        });
        for (i, (step, ms)) in steps.into_iter().enumerate() {
            write!(f, "{} {step} {ms:.1}", if i == 0 { ":" } else { "," })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variant_is_a_name_arguments_and_environment() {
        let v: Variant = "small=-X queued.min.messages=1000 env:MALLOC_ARENA_MAX=2"
            .parse()
            .unwrap();
        assert_eq!(v.name, "small");
        assert_eq!(v.args, ["-X", "queued.min.messages=1000"]);
        assert_eq!(v.env, [("MALLOC_ARENA_MAX".to_owned(), "2".to_owned())]);
        let shipped: Variant = "shipped=".parse().unwrap();
        assert!(shipped.args.is_empty() && shipped.env.is_empty() && shipped.binary.is_none());
        let before: Variant = "before=bin:/tmp/old/alert-pipeline".parse().unwrap();
        assert_eq!(
            before.binary,
            Some(PathBuf::from("/tmp/old/alert-pipeline"))
        );
        assert!(before.args.is_empty());
        assert!("no-equals".parse::<Variant>().is_err());
        assert!("bad=env:NOVALUE".parse::<Variant>().is_err());
    }

    #[test]
    fn a_timeline_is_the_difference_of_two_scrapes_per_commit_and_per_second() {
        let before = CommitTotals {
            count: 10.0,
            sum: 0.5,
            within_100ms: 10.0,
            steps: [
                ("state", 0.1),
                ("send_offsets", 0.1),
                ("end_transaction", 0.3),
                ("flush", 0.0),
            ]
            .into_iter()
            .collect(),
        };
        let after = CommitTotals {
            count: 30.0,
            sum: 1.5,
            within_100ms: 30.0,
            steps: [
                ("state", 0.2),
                ("send_offsets", 0.3),
                ("end_transaction", 1.0),
                ("flush", 0.0),
            ]
            .into_iter()
            .collect(),
        };
        let t = CommitTimeline::between(&before, &after, 4.0);
        assert_eq!(t.commits_per_sec, 5.0);
        assert_eq!(t.share_in_commits, 0.25);
        // 0.1 s, 0.2 s and 0.7 s over 20 commits; a step not taken is left out.
        let ms: Vec<(&str, i64)> = t
            .steps_ms
            .iter()
            .map(|(k, v)| (k.as_str(), v.round() as i64))
            .collect();
        assert_eq!(
            ms,
            [("end_transaction", 35), ("send_offsets", 10), ("state", 5)]
        );
        assert_eq!(
            t.to_string(),
            "5.0 commits/s, 25.0 % in commits: state 5.0, send_offsets 10.0, end_transaction 35.0"
        );
        let other = CommitTimeline {
            commits_per_sec: 7.0,
            share_in_commits: 0.35,
            steps_ms: [("state".to_owned(), 1.0)].into_iter().collect(),
        };
        let third = CommitTimeline {
            commits_per_sec: 6.0,
            ..other.clone()
        };
        let m = CommitTimeline::median([&t, &other, &third].into_iter()).unwrap();
        assert_eq!(m.commits_per_sec, 6.0);
        assert_eq!(m.share_in_commits, 0.35);
        assert_eq!(m.steps_ms["state"], 1.0);
        // A step only one repeat took: the median of what there is.
        assert_eq!(m.steps_ms["end_transaction"].round(), 35.0);
        assert!(CommitTimeline::median(std::iter::empty()).is_none());
    }

    fn run_of(config: &Config, repeat: usize, ticks_per_sec: f64, p99: f64) -> RunResult {
        RunResult {
            config: config.clone(),
            repeat,
            ticks_per_sec,
            backlog: CommitTimeline::default(),
            latency_p50_ms: 0.0,
            latency_p99_ms: p99,
            latency_samples: 1,
            paced_commits_per_sec: 0.0,
            paced_commit_mean_ms: 0.0,
            paced_slow_commits: 0.0,
            latencies_ms: Vec::new(),
            peak_rss_mib: 0.0,
            startup_peak_rss_mib: 0.0,
            processing_peak_rss_mib: 0.0,
        }
    }

    #[test]
    fn exactly_once_is_paired_with_at_least_once_of_its_interval_and_repeat() {
        let configs = Config::list(&[20, 50], &[20, 100], &[]);
        let (eos20, eos50, alo20) = (&configs[0], &configs[1], &configs[2]);
        // Interval 50 has no at-least-once run of its own: the first listed stands in.
        assert_eq!(partner(&configs, eos20), Some(alo20));
        assert_eq!(partner(&configs, eos50), Some(alo20));
        assert_eq!(partner(&configs, alo20), None);
        let results = vec![
            run_of(eos20, 0, 90.0, 40.0),
            run_of(alo20, 0, 100.0, 20.0),
            // Repeat 1 ran on a slower machine: the ratio, not the raw figure, counts.
            run_of(eos20, 1, 45.0, 60.0),
            run_of(alo20, 1, 50.0, 20.0),
            run_of(eos20, 2, 80.0, 30.0),
            run_of(alo20, 2, 100.0, 30.0),
        ];
        let summary = summarize(&configs, &results);
        let p = summary[0].paired.expect("paired");
        assert_eq!(p.at_least_once_interval_ms, 20);
        assert!((p.ticks_per_sec - 0.9).abs() < 1e-9, "{p:?}");
        assert!((p.latency_p99 - 2.0).abs() < 1e-9, "{p:?}");
        // Summaries exist only for configurations that ran, and at-least-once has no pair.
        assert_eq!(summary.len(), 2);
        assert!(summary[1].paired.is_none());
    }

    #[test]
    fn the_overlap_is_left_out_of_at_least_once_runs() {
        let v: Variant = "ov=--overlap-commits --max-batch 100".parse().unwrap();
        let eos: Vec<&String> = v.args_for("exactly-once").collect();
        let alo: Vec<&String> = v.args_for("at-least-once").collect();
        assert_eq!(eos, ["--overlap-commits", "--max-batch", "100"]);
        assert_eq!(alo, ["--max-batch", "100"]);
    }

    #[test]
    fn every_configuration_runs_once_per_variant() {
        let variants: Vec<Variant> = vec!["a=".parse().unwrap(), "b=".parse().unwrap()];
        let configs = Config::list(&[10, 100], &[100], &variants);
        assert_eq!(configs.len(), 6);
        assert_eq!(configs[3].label(), "exactly-once 10ms [b]");
        assert_eq!(configs[5].label(), "at-least-once 100ms [b]");
        assert_eq!(
            Config::list(&[100], &[], &[])[0].label(),
            "exactly-once 100ms"
        );
    }
}
