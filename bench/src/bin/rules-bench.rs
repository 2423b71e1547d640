//! `rules-bench`: how soon a live alert put with `alert-rules put` is in force, at a paced stream.

use clap::Parser;
use price_alerts::cli::{main_of, KafkaArgs};
use price_alerts_bench::rules::{self, Options};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "rules-bench",
    version,
    about = "Live alerts: from a put's return to its first notification, at a paced stream"
)]
struct Cli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// The alert-pipeline binary (default: the one beside this binary).
    #[arg(long)]
    binary: Option<PathBuf>,
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// Symbols of the paced stream.
    #[arg(long, default_value_t = 100)]
    symbols: usize,
    /// Ticks per second.
    #[arg(long, default_value_t = 1_000)]
    rate: usize,
    /// Alerts put, one at a time.
    #[arg(long, default_value_t = 100)]
    puts: usize,
    /// Time between two puts.
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    every: Duration,
    #[arg(long, default_value = "100ms")]
    commit_interval: String,
    /// Where to write results.json and results.md.
    #[arg(long, default_value = "bench/out/rules")]
    out: PathBuf,
}

fn main() -> ExitCode {
    main_of("rules-bench", || run().map(|()| ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let binary = match cli.binary {
        Some(b) => b,
        None => price_alerts_bench::child::bin_dir()?.join("alert-pipeline"),
    };
    let report = rules::run(&Options {
        kafka: cli.kafka.connect()?,
        binary,
        partitions: cli.partitions,
        symbols: cli.symbols,
        rate: cli.rate,
        puts: cli.puts,
        every: cli.every,
        commit_interval: cli.commit_interval,
    })?;
    price_alerts::outln!("{report}");
    price_alerts_bench::write_results(&cli.out, &report, &format!("{report}\n"))?;
    Ok(())
}
