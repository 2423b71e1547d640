//! The command line of `rebalance-bench`, and what the binary does with it: run the benchmark and
//! write its outputs, or with `--replot` write the outputs of an earlier run again.
//!
//! Why here and not in `bench/src/bin/rebalance-bench.rs`: a binary only parses, calls the library
//! and maps the result to an exit code (issue 45, thin binaries). Here the flags' defaults and
//! their turning into [`Options`] are plain code the unit tests below parse and check, and the
//! flow sits beside the module it drives. The help text is the fields' doc comments, so they are
//! kept word for word.

use super::{idle::Settle, read_report, write_outputs, Options};
use clap::Parser;
use price_alerts::cli::KafkaArgs;
use price_alerts::kafka::config::GroupProtocol;
use price_alerts::kafka::KafkaConfig;
use std::path::{Path, PathBuf};
use std::time::Duration;

// No `///` on the struct: clap turns a struct's doc comment into help text, and the help is kept
// as it was.
#[derive(Parser)]
#[command(
    name = "rebalance-bench",
    version,
    about = "Partition idle time after SIGTERM, SIGKILL and a join: classic against consumer"
)]
pub struct BenchCli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// The alert-pipeline binary (default: the one beside this binary).
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Group protocols compared, comma-separated, interleaved (the order alternates by repeat).
    #[arg(long, value_delimiter = ',', default_value = "classic,consumer")]
    protocols: Vec<GroupProtocol>,
    #[arg(long, default_value_t = 10)]
    repeats: usize,
    #[arg(long, default_value_t = 12)]
    partitions: i32,
    /// Ticks per second of the paced stream.
    #[arg(long, default_value_t = 1_000)]
    rate: usize,
    /// Symbols of the stream.
    #[arg(long, default_value_t = 240)]
    symbols: usize,
    /// The pipelines' --commit-interval.
    #[arg(long, default_value = "100ms", value_parser = price_alerts::cli::interval)]
    commit_interval: Duration,
    /// session.timeout.ms of the classic consumers (librdkafka's default; the consumer
    /// protocol's session is the broker's group.consumer.session.timeout.ms).
    #[arg(long, default_value = "45s", value_parser = price_alerts::cli::duration)]
    classic_session_timeout: Duration,
    /// Extra argument for every pipeline process (repeatable), e.g. --pipeline-arg=-Xfoo=1.
    #[arg(long, allow_hyphen_values = true)]
    pipeline_arg: Vec<String>,
    /// How often the group's committed offsets are read.
    #[arg(long, default_value = "50ms", value_parser = price_alerts::cli::interval)]
    poll: Duration,
    /// A partition this long without a committed advance is not progressing.
    #[arg(long, default_value = "1s", value_parser = price_alerts::cli::duration)]
    quiet: Duration,
    /// An event is settled once every partition has progressed this long in a row.
    #[arg(long, default_value = "3s", value_parser = price_alerts::cli::duration)]
    hold: Duration,
    /// Bound on each event's settling (beyond the session timeout for a SIGKILL).
    #[arg(long, default_value = "120s", value_parser = price_alerts::cli::duration)]
    event_timeout: Duration,
    /// Bound on the start of the three instances.
    #[arg(long, default_value = "180s", value_parser = price_alerts::cli::duration)]
    start_timeout: Duration,
    /// Write the table, the CSVs and idle.png again from a results.json written before, beside
    /// it, and run nothing.
    #[arg(long)]
    replot: Option<PathBuf>,
    /// Where to write results.json, results.md, the CSVs, idle.png and the pipelines' logs.
    #[arg(long, default_value = "bench/out/rebalance")]
    out: PathBuf,
}

impl BenchCli {
    /// Does what the flags ask: progress lines go to stderr, results.md's text to stdout.
    pub fn run(self) -> anyhow::Result<()> {
        if let Some(results) = &self.replot {
            let report = read_report(results)?;
            let dir = results.parent().unwrap_or(Path::new("."));
            price_alerts::outln!("{}", write_outputs(dir, &report)?);
            return Ok(());
        }
        let binary = match &self.binary {
            Some(b) => b.clone(),
            None => crate::child::bin_dir()?.join("alert-pipeline"),
        };
        let opts = self.options(self.kafka.connect()?, binary);
        let report = super::run(&opts, |line| {
            price_alerts::errln!("rebalance-bench: {line}")
        })?;
        price_alerts::outln!("{}", write_outputs(&self.out, &report)?);
        Ok(())
    }

    /// The options of a run against `kafka` (already checked) with the pipeline at `binary`.
    pub fn options(&self, kafka: KafkaConfig, binary: PathBuf) -> Options {
        Options {
            kafka,
            binary,
            protocols: self.protocols.clone(),
            repeats: self.repeats,
            partitions: self.partitions,
            rate: self.rate,
            symbols: self.symbols,
            commit_interval: self.commit_interval,
            classic_session_timeout: self.classic_session_timeout,
            pipeline_args: self.pipeline_arg.clone(),
            poll: self.poll,
            settle: Settle {
                quiet: self.quiet.as_secs_f64(),
                hold: self.hold.as_secs_f64(),
            },
            event_timeout: self.event_timeout,
            start_timeout: self.start_timeout,
            log_dir: self.out.join("logs"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_well_formed() {
        BenchCli::command().debug_assert();
    }

    #[test]
    fn defaults_become_the_documented_options() {
        let cli = BenchCli::try_parse_from(["rebalance-bench"]).unwrap();
        let opts = cli.options(KafkaConfig::new("broker:9092"), PathBuf::from("p"));
        assert_eq!(
            opts.protocols,
            [GroupProtocol::Classic, GroupProtocol::Consumer]
        );
        assert_eq!((opts.repeats, opts.partitions), (10, 12));
        assert_eq!((opts.settle.quiet, opts.settle.hold), (1.0, 3.0));
        assert_eq!(opts.classic_session_timeout, Duration::from_secs(45));
        assert_eq!(opts.log_dir, Path::new("bench/out/rebalance/logs"));
    }

    #[test]
    fn flags_reach_the_options() {
        let cli = BenchCli::try_parse_from([
            "rebalance-bench",
            "--protocols=consumer",
            "--quiet=500ms",
            "--pipeline-arg=-Xfoo=1",
            "--out=/tmp/x",
        ])
        .unwrap();
        let opts = cli.options(KafkaConfig::new("broker:9092"), PathBuf::from("p"));
        assert_eq!(opts.protocols, [GroupProtocol::Consumer]);
        assert_eq!(opts.settle.quiet, 0.5);
        assert_eq!(opts.pipeline_args, ["-Xfoo=1"]);
        assert_eq!(opts.log_dir, Path::new("/tmp/x/logs"));
    }
}
