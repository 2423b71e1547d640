//! `alert-verify`: the oracle. Recomputes the expected notifications from the input topic with the
//! crossing rule and compares them with what read_committed readers find. Exit 1 on any missing,
//! duplicate or unexpected notification.

use clap::Parser;
use price_alerts::cli::{init_logging, KafkaArgs};
use price_alerts::oracle::verify;
use price_alerts::rules::Rules;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "alert-verify",
    version,
    about = "Check that every crossing gave exactly one committed notification"
)]
struct Cli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// The rules file the pipeline ran with; or --rules-topic.
    #[arg(
        long,
        required_unless_present = "rules_topic",
        conflicts_with = "rules_topic"
    )]
    rules: Option<PathBuf>,
    /// The live alerts' rules topic the pipeline joined (alert-pipeline --live-rules): the
    /// expected notifications follow the join's rule (docs/design.md, "Live alerts").
    #[arg(long)]
    rules_topic: Option<String>,
    #[arg(long, default_value = "market-updates")]
    input: String,
    #[arg(long, default_value = "notifications")]
    output: String,
    /// Same limit as the pipeline's --max-tick-bytes.
    #[arg(long, default_value_t = price_alerts::tick::DEFAULT_MAX_TICK_BYTES)]
    max_tick_bytes: usize,
    /// The pipeline ran with --inject-faults: poison ticks imply no notification.
    #[arg(long)]
    inject_faults: bool,
    /// Check alert-sink's `alerts` table (at --database-url / DATABASE_URL) instead of the topic.
    #[arg(long)]
    table: bool,
    #[command(flatten)]
    db: price_alerts::cli::sink::DbArgs,
}

fn main() -> ExitCode {
    let _log = init_logging();
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            price_alerts::errln!("alert-verify: {}", price_alerts::cli::report(&e));
            ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<bool> {
    let cli = Cli::parse();
    // The files first: a mistyped path is named before any broker or database is needed.
    let rules = match &cli.rules {
        Some(path) => Rules::load(path)?,
        None => Rules::default(),
    };
    if cli.table && cli.rules_topic.is_some() {
        anyhow::bail!("--table checks a rules file's run; with --rules-topic check the topic");
    }
    let db = if cli.table {
        Some(cli.db.options()?)
    } else {
        None
    };
    let kafka = cli.kafka.connect()?;
    let mut read = vec![cli.input.clone()];
    read.extend(cli.rules_topic.clone());
    if !cli.table {
        read.push(cli.output.clone());
    }
    price_alerts::kafka::access::check(
        &kafka,
        &price_alerts::kafka::access::Needs {
            read,
            ..Default::default()
        },
    )?;
    let faults = price_alerts::dlq::FaultInjection {
        enabled: cli.inject_faults,
    };
    let report = if let Some(db) = db {
        price_alerts::sink::check::verify_table(
            &kafka,
            &cli.input,
            &rules,
            cli.max_tick_bytes,
            faults,
            &db,
        )?
    } else if let Some(rules_topic) = &cli.rules_topic {
        price_alerts::oracle::verify_live(
            &kafka,
            &cli.input,
            &cli.output,
            rules_topic,
            cli.max_tick_bytes,
            faults,
        )?
    } else {
        verify(
            &kafka,
            &cli.input,
            &cli.output,
            &rules,
            cli.max_tick_bytes,
            faults,
        )?
    };
    price_alerts::outln!("{report}");
    Ok(report.ok())
}
