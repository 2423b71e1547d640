//! `dlq-replay`'s command line: the `replay` (default) and `inspect` subcommands, their shared
//! filters, and their mapping onto [`ReplayOptions`] and [`InspectOptions`].
//!
//! The filters are checked before the broker is contacted, so a misspelt class fails at once and
//! names the known ones.

// The `///` comments on clap arguments are the --help texts, written for a terminal (<app>,
// [symbols]), not rustdoc markup.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use super::KafkaArgs;
use crate::tools::replay::{InspectOptions, ReplayHooks, ReplayOptions, Selection, DEFAULT_BATCH};

/// `dlq-replay`: `replay` when no subcommand is given, so `dlq-replay --class poison` works as it
/// always did.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "dlq-replay",
    version,
    about = "Replay dead letters to their source topic exactly once (a replay ledger records which), or inspect a DLQ",
    args_conflicts_with_subcommands = true
)]
pub struct ReplayCli {
    #[command(subcommand)]
    pub command: Option<ReplayCommand>,
    #[command(flatten)]
    pub replay: ReplayArgs,
}

impl ReplayCli {
    /// The command to run: the subcommand, or `replay` with the top-level flags.
    pub fn command(self) -> ReplayCommand {
        self.command.unwrap_or(ReplayCommand::Replay(self.replay))
    }
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum ReplayCommand {
    /// Replay the selected dead letters that are not replayed yet (the default command).
    Replay(ReplayArgs),
    /// Count dead letters by class, subscriber and source partition, replayed or not, and show some.
    Inspect(InspectArgs),
}

/// The DLQ and the filters, as both subcommands take them.
#[derive(Debug, Clone, clap::Args)]
pub struct DlqArgs {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// The dead-letter topic (its replay ledger is <dlq>.replayed).
    #[arg(long, default_value = "market-updates.dlq")]
    pub dlq: String,
    /// Only this class (repeatable): a class, or a prefix ending in * (e.g. 'permanent.*'). An
    /// unknown class is refused with the list of known ones.
    #[arg(long = "class")]
    pub classes: Vec<String>,
    /// Only the dead letters of this subscriber (repeatable): alert-deliver's retry.subscriber.
    #[arg(long = "subscriber")]
    pub subscribers: Vec<String>,
    /// Only this partition of the DLQ (repeatable).
    #[arg(long = "partition", value_parser = clap::value_parser!(i32).range(0..))]
    pub partitions: Vec<i32>,
    /// Only DLQ offsets from this one on (inclusive), in each selected partition.
    #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
    pub from_offset: Option<i64>,
    /// Only DLQ offsets up to this one (inclusive), in each selected partition.
    #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
    pub to_offset: Option<i64>,
    /// Print JSON instead of aligned text.
    #[arg(long)]
    pub json: bool,
}

impl DlqArgs {
    /// The filters, checked.
    pub fn selection(&self) -> anyhow::Result<Selection> {
        Ok(Selection::classes(&self.classes)?
            .for_subscribers(&self.subscribers)
            .in_partitions(&self.partitions)
            .in_offsets(self.from_offset, self.to_offset)?)
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub common: DlqArgs,
    /// Replay at most this many dead letters (the first ones met); the others stay unhandled.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Target topic instead of each dead letter's dlq.original.topic.
    #[arg(long)]
    pub to: Option<String>,
    /// Count what would be replayed; write nothing, and fence no replay that is running.
    #[arg(long)]
    pub dry_run: bool,
    /// Dead letters per transaction.
    #[arg(long, default_value_t = DEFAULT_BATCH)]
    pub batch_size: usize,
    /// Producer transaction.timeout.ms: a batch must be written and committed within it.
    #[arg(long, default_value = "10s", value_parser = super::duration)]
    pub transaction_timeout: std::time::Duration,
    /// TEST ONLY: crash (abort the process) once this many dead letters are copied, inside the
    /// open transaction.
    #[arg(long, hide = true)]
    pub test_crash_after: Option<u64>,
}

impl ReplayArgs {
    /// Checks the filters, then the broker, and builds the options.
    pub fn options(&self) -> anyhow::Result<ReplayOptions> {
        let select = self.common.selection()?;
        if self.batch_size == 0 {
            anyhow::bail!("--batch-size must be at least 1");
        }
        Ok(ReplayOptions {
            select,
            limit: self.limit,
            to: self.to.clone(),
            dry_run: self.dry_run,
            batch: self.batch_size,
            transaction_timeout: self.transaction_timeout,
            hooks: ReplayHooks {
                crash_after: self.test_crash_after,
            },
            ..ReplayOptions::new(self.common.kafka.connect()?, &self.common.dlq)
        })
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub common: DlqArgs,
    /// Show the headers of the first N unhandled dead letters.
    #[arg(long, default_value_t = 0)]
    pub show: usize,
    /// With --show, their payloads too (raw input: mind where the output goes).
    #[arg(long)]
    pub payload: bool,
}

impl InspectArgs {
    /// Checks the filters, then the broker, and builds the options.
    pub fn options(&self) -> anyhow::Result<InspectOptions> {
        let select = self.common.selection()?;
        Ok(InspectOptions {
            kafka: self.common.kafka.connect()?,
            dlq: self.common.dlq.clone(),
            select,
            show: self.show,
            payload: self.payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> ReplayCommand {
        ReplayCli::try_parse_from([&["dlq-replay"], args].concat())
            .unwrap()
            .command()
    }

    #[test]
    fn no_subcommand_means_replay() {
        let ReplayCommand::Replay(a) = parse(&["--class", "poison", "--dlq", "d"]) else {
            panic!("not replay")
        };
        assert_eq!(
            (a.common.classes, a.common.dlq),
            (vec!["poison".to_owned()], "d".to_owned())
        );
        let ReplayCommand::Replay(a) = parse(&[
            "replay",
            "--limit",
            "3",
            "--partition",
            "1",
            "--partition",
            "2",
        ]) else {
            panic!("not replay")
        };
        assert_eq!((a.limit, a.common.partitions), (Some(3), vec![1, 2]));
        let ReplayCommand::Inspect(a) = parse(&["inspect", "--show", "2", "--json"]) else {
            panic!("not inspect")
        };
        assert!(a.common.json && a.show == 2 && !a.payload);
    }

    #[test]
    fn filters_are_checked_before_any_connection() {
        let ReplayCommand::Replay(a) =
            parse(&["--class", "nonsense.class", "--bootstrap", "127.0.0.1:1"])
        else {
            panic!("not replay")
        };
        let err = format!("{:#}", a.options().unwrap_err());
        assert!(
            err.contains("unknown class \"nonsense.class\"") && err.contains("poison"),
            "{err}"
        );
        assert!(ReplayCli::try_parse_from(["dlq-replay", "--partition", "-1"]).is_err());
        let ReplayCommand::Replay(a) = parse(&["--from-offset", "5", "--to-offset", "4"]) else {
            panic!("not replay")
        };
        assert!(format!("{:#}", a.options().unwrap_err()).contains("empty"));
    }
}
