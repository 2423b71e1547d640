//! `tick-gen`: writes a seeded random-walk tick stream to the input topic, and the rules it used.

use anyhow::Context as _;
use clap::Parser;
use price_alerts::cli::{main_of, KafkaArgs};
use price_alerts::kafka::feed::Feed;
use price_alerts::kafka::topics::{create_topics, TopicSpec};
use price_alerts::tools::generate::{generate, GenOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "tick-gen",
    version,
    about = "Generate ticks (seeded random walk) and the alert rules they were made for"
)]
struct Cli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// Topic to write (created with --partitions if missing).
    #[arg(long, default_value = "market-updates")]
    topic: String,
    /// Partitions of the topic if it has to be created.
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// Number of symbols.
    #[arg(long, default_value_t = 50)]
    symbols: usize,
    /// Number of ticks.
    #[arg(long, default_value_t = 10_000)]
    ticks: usize,
    /// Random seed: the same seed gives the same stream and rules.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Every n-th tick is followed by a stale re-send of an earlier one (0: none).
    #[arg(long, default_value_t = 0)]
    stale_every: usize,
    /// Ticks per second at most (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Where to write the rules (TOML); printed to stdout when absent.
    #[arg(long)]
    rules_out: Option<PathBuf>,
    /// Only write the rules; produce nothing.
    #[arg(long)]
    rules_only: bool,
}

fn main() -> ExitCode {
    main_of("tick-gen", || run().map(|()| ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let (rules, ticks) = generate(&GenOptions {
        symbols: cli.symbols,
        ticks: cli.ticks,
        seed: cli.seed,
        stale_every: cli.stale_every,
    });
    match &cli.rules_out {
        Some(path) => std::fs::write(path, rules.to_toml())
            .with_context(|| format!("writing {}", path.display()))?,
        None => price_alerts::outln!("{}", rules.to_toml()),
    }
    if cli.rules_only {
        return Ok(());
    }
    let kafka = cli.kafka.connect()?;
    futures::executor::block_on(create_topics(
        &kafka,
        &[TopicSpec {
            name: cli.topic.clone(),
            partitions: cli.partitions,
            compacted: false,
            retention: None,
        }],
    ))?;
    let started = Instant::now();
    Feed::new(&kafka)?.send_ticks_at_rate(&cli.topic, &ticks, cli.rate)?;
    price_alerts::errln!(
        "tick-gen: {} ticks for {} symbols written to {} in {:.1}s",
        ticks.len(),
        cli.symbols,
        cli.topic,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
