//! The command line of `alert-verify`: check that every crossing gave exactly one committed
//! notification ([`crate::tools::verify`]).

use super::sink::DbArgs;
use super::KafkaArgs;
use crate::dlq::FaultInjection;
use crate::rules::Rules;
use crate::tools::verify::VerifyOptions;
use clap::Parser;
use std::path::PathBuf;

// No `///` on the struct: clap would make it --help's long text, and the help says `about` alone.
#[derive(Parser)]
#[command(
    name = "alert-verify",
    version,
    about = "Check that every crossing gave exactly one committed notification"
)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// The rules file the pipeline ran with; or --rules-topic.
    #[arg(
        long,
        required_unless_present = "rules_topic",
        conflicts_with = "rules_topic"
    )]
    pub rules: Option<PathBuf>,
    /// The live alerts' rules topic the pipeline joined (alert-pipeline --live-rules): the
    /// expected notifications follow the join's rule (docs/design.md, "Live alerts").
    #[arg(long)]
    pub rules_topic: Option<String>,
    #[arg(long, default_value = "market-updates")]
    pub input: String,
    #[arg(long, default_value = "notifications")]
    pub output: String,
    /// Same limit as the pipeline's --max-tick-bytes.
    #[arg(long, default_value_t = crate::tick::DEFAULT_MAX_TICK_BYTES)]
    pub max_tick_bytes: usize,
    /// The pipeline ran with --inject-faults: poison ticks imply no notification.
    #[arg(long)]
    pub inject_faults: bool,
    /// Check alert-sink's `alerts` table (at --database-url / DATABASE_URL) instead of the topic.
    #[arg(long)]
    pub table: bool,
    #[command(flatten)]
    pub db: DbArgs,
}

impl VerifyArgs {
    /// The options, and the connection to the broker. The files first: a mistyped path is named
    /// before any broker or database is needed.
    pub fn options(&self) -> anyhow::Result<VerifyOptions> {
        let rules = match &self.rules {
            Some(path) => Rules::load(path)?,
            None => Rules::default(),
        };
        if self.table && self.rules_topic.is_some() {
            anyhow::bail!("--table checks a rules file's run; with --rules-topic check the topic");
        }
        let table = if self.table {
            Some(self.db.options()?)
        } else {
            None
        };
        Ok(VerifyOptions {
            kafka: self.kafka.connect()?,
            rules,
            rules_topic: self.rules_topic.clone(),
            input: self.input.clone(),
            output: self.output.clone(),
            max_tick_bytes: self.max_tick_bytes,
            faults: FaultInjection {
                enabled: self.inject_faults,
            },
            table,
        })
    }
}
