//! `txn-demo`: the commit/abort experiment on a real broker (read_committed 5, read_uncommitted
//! 10; after a restart 10 and 15). Exits non-zero if any figure differs from the expected one.

use clap::Parser;
use price_alerts::cli::{main_of, KafkaArgs};
use price_alerts::kafka::topics::unique_suffix;
use price_alerts::tools::demo::{self, DemoOptions};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "txn-demo",
    version,
    about = "Kafka transactions: 5 committed versus 10 uncommitted readers"
)]
struct Cli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// Prefix of the run's topics and group (default: a fresh random one, so runs never mix).
    #[arg(long)]
    topic_prefix: Option<String>,
    /// Partitions of the input topic.
    #[arg(long, default_value_t = 3)]
    partitions: i32,
    /// Keep the run's topics instead of deleting them at the end.
    #[arg(long)]
    keep_topics: bool,
}

fn main() -> ExitCode {
    main_of("txn-demo", run)
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let opts = DemoOptions {
        kafka: cli.kafka.connect()?,
        prefix: cli
            .topic_prefix
            .unwrap_or_else(|| format!("demo-{}-", unique_suffix())),
        partitions: cli.partitions,
        cleanup: !cli.keep_topics,
    };
    let report = demo::run(&opts)?;
    price_alerts::outln!("{report}");
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
