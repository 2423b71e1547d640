//! `pipeline-bench`: the pipeline's cost of exactly-once (throughput, end-to-end latency, peak
//! RSS) at several commit intervals, against at-least-once; interleaved, repeated, medians.

use anyhow::Context as _;
use clap::Parser;
use price_alerts::cli::{main_of, KafkaArgs};
use price_alerts_bench::pipeline::{self as pipeline_bench, Config, Options};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "pipeline-bench",
    version,
    about = "What exactly-once costs the pipeline, by commit interval"
)]
struct Cli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// Commit intervals of the exactly-once runs, comma-separated durations.
    #[arg(long, value_delimiter = ',', value_parser = price_alerts::cli::interval, default_value = "10ms,100ms,1s")]
    intervals: Vec<std::time::Duration>,
    /// Also run at-least-once to compare.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    at_least_once: bool,
    /// Commit intervals of the at-least-once runs. Each exactly-once run is paired with the
    /// at-least-once run of its own interval where there is one, else with the first listed.
    #[arg(long, value_delimiter = ',', value_parser = price_alerts::cli::interval, default_value = "100ms")]
    at_least_once_intervals: Vec<std::time::Duration>,
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
    /// A named set of extra arguments for the pipeline, NAME=ARGS (repeatable), e.g.
    /// `--variant 'librdkafka-defaults=-X queued.max.messages.kbytes=65536'`: every configuration
    /// runs once per variant, interleaved. `env:KEY=VALUE` sets an environment variable of the
    /// pipeline, `bin:PATH` runs another build of it (`--variant before=bin:old/alert-pipeline`).
    #[arg(long)]
    variant: Vec<price_alerts_bench::pipeline::Variant>,
    /// Draw latency.png again from a results.json written before, beside it, and run nothing.
    #[arg(long)]
    replot: Option<PathBuf>,
    /// Where to write results.json and results.md.
    #[arg(long, default_value = "bench/out/pipeline")]
    out: PathBuf,
}

fn main() -> ExitCode {
    main_of("pipeline-bench", || run().map(|()| ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(results) = &cli.replot {
        let png = results.with_file_name("latency.png");
        if !price_alerts_bench::pipeline::plot::replot(results, &png)? {
            anyhow::bail!("{}: no latency samples to plot", results.display());
        }
        price_alerts::outln!("{}", png.display());
        return Ok(());
    }
    let binary = std::env::current_exe()?
        .parent()
        .context("locating the binaries folder")?
        .join("alert-pipeline");
    let ms = |ds: &[std::time::Duration]| -> Vec<u64> {
        ds.iter().map(|d| d.as_millis() as u64).collect()
    };
    let alo_ms = if cli.at_least_once {
        ms(&cli.at_least_once_intervals)
    } else {
        Vec::new()
    };
    let configs = Config::list(&ms(&cli.intervals), &alo_ms, &cli.variant);
    let opts = Options {
        kafka: cli.kafka.connect()?,
        binary,
        configs: configs.clone(),
        repeats: cli.repeats,
        ticks: cli.ticks,
        latency_ticks: cli.latency_ticks,
        latency_rate: cli.latency_rate,
        symbols: cli.symbols,
        partitions: cli.partitions,
    };
    let results = pipeline_bench::run(&opts, |r| price_alerts::errln!("pipeline-bench: {r}"))?;
    price_alerts::outln!(
        "{}",
        pipeline_bench::write_outputs(&cli.out, &configs, &results)?
    );
    Ok(())
}
