//! The command line of `recovery-bench`, and what the binary does with it: run the benchmark, print
//! a line per run and the table, write the results.
//!
//! Why here and not in `bench/src/bin/recovery-bench.rs`: a binary only parses, calls the library
//! and maps the result to an exit code (issue 45, thin binaries). Here the flags' turning into
//! [`Options`] (the pipelines compared: those given, else the one beside the benchmark) is plain
//! code the unit tests below parse and check, and the flow sits beside the module it drives. The
//! help text is the fields' doc comments, so they are kept word for word.

use super::{write_outputs, Options};
use clap::Parser;
use price_alerts::cli::KafkaArgs;
use price_alerts::kafka::KafkaConfig;
use std::path::PathBuf;

// No `///` on the struct: clap turns a struct's doc comment into help text, and the help is kept
// as it was.
#[derive(Parser)]
#[command(
    name = "recovery-bench",
    version,
    about = "Restart after SIGKILL: time to restore the state and to the first commit"
)]
pub struct BenchCli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// alert-pipeline binaries to compare, interleaved (repeatable; default: the one beside
    /// this binary).
    #[arg(long)]
    binary: Vec<PathBuf>,
    /// Extra argument for every pipeline process (repeatable), e.g. --pipeline-arg=-Xfoo=1.
    #[arg(long, allow_hyphen_values = true)]
    pipeline_arg: Vec<String>,
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Symbols, each with state in the changelog before the crash.
    #[arg(long, default_value_t = 100_000)]
    symbols: usize,
    /// Random-walk ticks pre-loaded after one tick per symbol.
    #[arg(long, default_value_t = 200_000)]
    ticks: usize,
    /// Ticks per second appended around the crash and the restart.
    #[arg(long, default_value_t = 5_000)]
    live_rate: usize,
    /// Live ticks committed before the SIGKILL.
    #[arg(long, default_value_t = 2_000)]
    kill_after: usize,
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// The pipeline's --commit-interval.
    #[arg(long, default_value = "100ms")]
    commit_interval: String,
    /// Live alerts: this many alerts per symbol in the rules topic, the pipeline run with
    /// --live-rules (0: the rules file).
    #[arg(long, default_value_t = 0)]
    live_alerts: usize,
    /// Where to write results.json, results.md and the pipelines' logs.
    #[arg(long, default_value = "bench/out/recovery")]
    out: PathBuf,
}

impl BenchCli {
    /// Does what the flags ask: a line per run goes to stderr, the table to stdout.
    pub fn run(self) -> anyhow::Result<()> {
        let binaries = self.binaries()?;
        let opts = self.options(self.kafka.connect()?, binaries);
        let results = super::run(&opts, |r| price_alerts::errln!("recovery-bench: {r}"))?;
        price_alerts::outln!("{}", write_outputs(&self.out, &opts.binaries, &results)?);
        Ok(())
    }

    /// The pipelines compared: those given with --binary, else the `alert-pipeline` beside this
    /// benchmark.
    pub fn binaries(&self) -> anyhow::Result<Vec<PathBuf>> {
        if self.binary.is_empty() {
            Ok(vec![crate::child::bin_dir()?.join("alert-pipeline")])
        } else {
            Ok(self.binary.clone())
        }
    }

    /// The options of a run against `kafka` (already checked), comparing `binaries`.
    pub fn options(&self, kafka: KafkaConfig, binaries: Vec<PathBuf>) -> Options {
        Options {
            kafka,
            binaries,
            pipeline_args: self.pipeline_arg.clone(),
            repeats: self.repeats,
            symbols: self.symbols,
            ticks: self.ticks,
            live_rate: self.live_rate,
            kill_after: self.kill_after,
            partitions: self.partitions,
            commit_interval: self.commit_interval.clone(),
            log_dir: self.out.join("logs"),
            live_alerts: self.live_alerts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    fn cli(args: &[&str]) -> BenchCli {
        BenchCli::try_parse_from(std::iter::once("recovery-bench").chain(args.iter().copied()))
            .unwrap()
    }

    fn options(args: &[&str]) -> Options {
        let cli = cli(args);
        let binaries = cli.binaries().unwrap();
        cli.options(KafkaConfig::new("broker:9092"), binaries)
    }

    #[test]
    fn the_command_line_is_well_formed() {
        BenchCli::command().debug_assert();
    }

    #[test]
    fn the_pipeline_beside_the_benchmark_runs_unless_binaries_are_given() {
        let opts = options(&[]);
        let beside = std::env::current_exe()
            .unwrap()
            .with_file_name("alert-pipeline");
        assert_eq!(opts.binaries, [beside]);
        assert_eq!(
            (opts.repeats, opts.symbols, opts.ticks),
            (5, 100_000, 200_000)
        );
        assert_eq!(opts.log_dir, PathBuf::from("bench/out/recovery/logs"));
        let opts = options(&["--binary=a/alert-pipeline", "--binary", "b/alert-pipeline"]);
        assert_eq!(
            opts.binaries,
            [
                PathBuf::from("a/alert-pipeline"),
                PathBuf::from("b/alert-pipeline")
            ]
        );
    }

    #[test]
    fn pipeline_args_may_start_with_a_hyphen() {
        let opts = options(&["--pipeline-arg", "-Xfoo=1", "--live-alerts=2"]);
        assert_eq!(opts.pipeline_args, ["-Xfoo=1"]);
        assert_eq!(opts.live_alerts, 2);
    }
}
