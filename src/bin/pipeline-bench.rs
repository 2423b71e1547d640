//! `pipeline-bench`: the pipeline's cost of exactly-once (throughput, end-to-end latency, peak
//! RSS) at several commit intervals, against at-least-once; interleaved, repeated, medians.

use anyhow::Context as _;
use clap::Parser;
use price_alerts::cli::{main_of, KafkaArgs};
use price_alerts::pipeline_bench::{self, Config, Options};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(version, about = "What exactly-once costs the pipeline, by commit interval")]
struct Cli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// Commit intervals of the exactly-once runs, in ms.
    #[arg(long, value_delimiter = ',', default_values_t = [10u64, 100, 1000])]
    intervals: Vec<u64>,
    /// Also run at-least-once (at 100 ms) to compare.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    at_least_once: bool,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Pre-loaded ticks for the throughput phase.
    #[arg(long, default_value_t = 100_000)]
    ticks: usize,
    /// Paced ticks for the latency phase.
    #[arg(long, default_value_t = 3_000)]
    latency_ticks: usize,
    /// Rate of the paced ticks, per second.
    #[arg(long, default_value_t = 1_000)]
    latency_rate: usize,
    #[arg(long, default_value_t = 200)]
    symbols: usize,
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// Where to write results.json and results.md.
    #[arg(long, default_value = "bench/out/pipeline")]
    out: PathBuf,
}

fn main() -> ExitCode {
    main_of("pipeline-bench", || run().map(|()| ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let binary = std::env::current_exe()?
        .parent()
        .context("locating the binaries folder")?
        .join("alert-pipeline");
    let mut configs: Vec<Config> =
        cli.intervals.iter().map(|&ms| Config { guarantee: "exactly-once", commit_interval_ms: ms }).collect();
    if cli.at_least_once {
        configs.push(Config { guarantee: "at-least-once", commit_interval_ms: 100 });
    }
    let opts = Options {
        kafka: cli.kafka.config()?,
        binary,
        configs: configs.clone(),
        repeats: cli.repeats,
        ticks: cli.ticks,
        latency_ticks: cli.latency_ticks,
        latency_rate: cli.latency_rate,
        symbols: cli.symbols,
        partitions: cli.partitions,
    };
    let results = pipeline_bench::run(&opts, |r| {
        eprintln!(
            "pipeline-bench: {} #{}: {:.0} ticks/s, latency p50 {:.0} ms p99 {:.0} ms ({} samples), peak RSS {:.0} MiB",
            r.config.label(),
            r.repeat,
            r.ticks_per_sec,
            r.latency_p50_ms,
            r.latency_p99_ms,
            r.latency_samples,
            r.peak_rss_mib
        )
    })?;
    let summary = pipeline_bench::summarize(&configs, &results);
    let table = pipeline_bench::table(&summary);
    std::fs::create_dir_all(&cli.out)?;
    std::fs::write(cli.out.join("results.json"), serde_json::to_vec_pretty(&(&summary, &results))?)?;
    std::fs::write(cli.out.join("results.md"), &table)?;
    println!("{table}");
    Ok(())
}
