//! `dlq-replay`: put dead letters back on their source topic exactly once (a replay ledger beside
//! the DLQ records which), or inspect what a DLQ holds. The logic is in
//! `price_alerts::tools::replay`; the flags in `price_alerts::cli::replay`.

use clap::Parser;
use price_alerts::cli::main_of;
use price_alerts::cli::replay::{ReplayCli, ReplayCommand};
use price_alerts::outln;
use price_alerts::tools::replay::{inspect, replay};
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("dlq-replay", run)
}

fn run() -> anyhow::Result<ExitCode> {
    match ReplayCli::parse().command() {
        ReplayCommand::Replay(args) => {
            let report = replay(&args.options()?)?;
            print(args.common.json, &report, || report.to_text())
        }
        ReplayCommand::Inspect(args) => {
            let found = inspect(&args.options()?)?;
            print(args.common.json, &found, || found.to_text())
        }
    }
}

/// Prints `value` as JSON, or as `text` for people.
fn print<T: serde::Serialize>(
    json: bool,
    value: &T,
    text: impl FnOnce() -> String,
) -> anyhow::Result<ExitCode> {
    if json {
        outln!("{}", serde_json::to_string_pretty(value)?);
    } else {
        outln!("{}", text().trim_end());
    }
    Ok(ExitCode::SUCCESS)
}
