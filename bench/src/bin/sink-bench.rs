//! `sink-bench`: alert-sink's rows/s into PostgreSQL (batched against one row per transaction)
//! and the end-to-end latency from tick append to row visible; interleaved, repeated, medians.

use clap::Parser;
use price_alerts::cli::{main_of, KafkaArgs};
use price_alerts_bench::sink::{self as sink_bench, Options};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    version,
    about = "alert-sink: rows/s batched vs naive, and tick-to-row latency"
)]
struct Cli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// Admin connection string; each run creates and drops a database of its own there.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Pre-loaded notifications per batched run.
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// Pre-loaded notifications per naive (--max-batch 1) run.
    #[arg(long, default_value_t = 5_000)]
    naive_rows: usize,
    /// Ticks appended in the latency phase, and their rate per second.
    #[arg(long, default_value_t = 5_000)]
    latency_ticks: usize,
    #[arg(long, default_value_t = 1_000)]
    latency_rate: usize,
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// The pipeline's commit interval in the latency phase, in ms.
    #[arg(long, default_value_t = 100)]
    pipeline_commit_ms: u64,
    /// Where to write results.json and results.md.
    #[arg(long, default_value = "bench/out/sink")]
    out: PathBuf,
}

fn main() -> ExitCode {
    main_of("sink-bench", || run().map(|()| ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let bin_dir = price_alerts_bench::child::bin_dir()?;
    let opts = Options {
        kafka: cli.kafka.config()?,
        admin_url: cli.database_url,
        bin_dir,
        repeats: cli.repeats,
        rows: cli.rows,
        naive_rows: cli.naive_rows,
        latency_ticks: cli.latency_ticks,
        latency_rate: cli.latency_rate,
        partitions: cli.partitions,
        pipeline_commit_ms: cli.pipeline_commit_ms,
    };
    let results = sink_bench::run(&opts, |r| {
        eprintln!(
            "sink-bench #{}: batched {:.0} rows/s, naive {:.0} rows/s, latency p50 {:.0} ms p99 {:.0} ms ({} samples), sink's share p50 {:.0} ms p99 {:.0} ms",
            r.repeat,
            r.batched_rows_per_sec,
            r.naive_rows_per_sec,
            r.latency_p50_ms,
            r.latency_p99_ms,
            r.latency_samples,
            r.sink_share_p50_ms,
            r.sink_share_p99_ms
        )
    })?;
    let summary = sink_bench::summarize(&results);
    let table = sink_bench::table(&summary, &opts);
    price_alerts_bench::write_results(&cli.out, &(&summary, &results), &table)?;
    println!("{table}");
    Ok(())
}
