//! `tick-gen`'s command line.

use super::KafkaArgs;
use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "tick-gen",
    version,
    about = "Generate ticks (seeded random walk) and the alert rules they were made for"
)]
pub struct TickGenArgs {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Topic to write (created with --partitions if missing).
    #[arg(long, default_value = "market-updates")]
    pub topic: String,
    /// Partitions of the topic if it has to be created.
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Number of symbols.
    #[arg(long, default_value_t = 50)]
    pub symbols: usize,
    /// Number of ticks.
    #[arg(long, default_value_t = 10_000)]
    pub ticks: usize,
    /// Random seed: the same seed gives the same stream and rules.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Every n-th tick is followed by a stale re-send of an earlier one (0: none).
    #[arg(long, default_value_t = 0)]
    pub stale_every: usize,
    /// Ticks per second at most (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Where to write the rules (TOML); printed to stdout when absent.
    #[arg(long)]
    pub rules_out: Option<PathBuf>,
    /// Only write the rules; produce nothing.
    #[arg(long)]
    pub rules_only: bool,
}
