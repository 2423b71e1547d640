//! `txn-demo`: the commit/abort experiment on a real broker (read_committed 5, read_uncommitted
//! 10; after a restart 10 and 15). Exits non-zero if any figure differs from the expected one.

use clap::Parser;
use price_alerts::cli::main_of;
use price_alerts::cli::txn_demo::TxnDemoArgs;
use price_alerts::kafka::topics::unique_suffix;
use price_alerts::tools::demo::{self, DemoOptions};
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("txn-demo", run)
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = TxnDemoArgs::parse();
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
