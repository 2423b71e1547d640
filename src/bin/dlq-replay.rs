//! `dlq-replay`: put dead-lettered ticks back on their source topic, exactly once per replay group.

// The `///` comments on clap arguments are the --help texts, written for a terminal (<app>,
// [symbols]), not rustdoc markup.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use clap::Parser;
use price_alerts::cli::{main_of, KafkaArgs};
use price_alerts::tools::replay::{replay, ReplayOptions};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "dlq-replay", version, about = "Replay dead letters to their source topic in transactions (once per --group)")]
struct Cli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// The dead-letter topic.
    #[arg(long, default_value = "market-updates.dlq")]
    dlq: String,
    /// Replay group: its committed offsets on the DLQ say what was handled (default: <dlq>.replay).
    #[arg(long)]
    group: Option<String>,
    /// Only these classes (repeatable; a trailing * matches a prefix, e.g. 'permanent.*').
    #[arg(long = "class")]
    classes: Vec<String>,
    /// Target topic instead of each record's dlq.original.topic.
    #[arg(long)]
    to: Option<String>,
    /// Count what would be replayed; produce and commit nothing.
    #[arg(long)]
    dry_run: bool,
}

fn main() -> ExitCode {
    main_of("dlq-replay", run)
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let opts = ReplayOptions {
        kafka: cli.kafka.connect()?,
        group: cli.group.unwrap_or_else(|| format!("{}.replay", cli.dlq)),
        dlq: cli.dlq,
        classes: cli.classes,
        to: cli.to,
        dry_run: cli.dry_run,
    };
    let report = replay(&opts)?;
    price_alerts::outln!("{:<28} {:>8} {:>9}", "class", "read", if opts.dry_run { "to replay" } else { "replayed" });
    for (class, n) in &report.read {
        price_alerts::outln!("{class:<28} {n:>8} {:>9}", report.replayed.get(class).copied().unwrap_or(0));
    }
    price_alerts::outln!("{} replayed in {} transactions", report.total_replayed(), report.transactions);
    Ok(ExitCode::SUCCESS)
}
