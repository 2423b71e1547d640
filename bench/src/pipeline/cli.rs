//! The command line of `pipeline-bench`, and what the binary does with it: run the benchmark and
//! write its outputs, or with `--replot` draw latency.png again from an earlier run.
//!
//! Why here and not in `bench/src/bin/pipeline-bench.rs`: a binary only parses, calls the library
//! and maps the result to an exit code (issue 45, thin binaries). Here the flags' turning into the
//! configurations ([`Config::list`]: the intervals in ms, at-least-once or not, the variants) is
//! plain code the unit tests below parse and check, and the flow sits beside the module it
//! drives. The help text is the fields' doc comments, so they are kept word for word.

use super::{plot, write_outputs, Config, Options, Variant};
use clap::Parser;
use price_alerts::cli::KafkaArgs;
use price_alerts::kafka::KafkaConfig;
use std::path::PathBuf;
use std::time::Duration;

// No `///` on the struct: clap turns a struct's doc comment into help text, and the help is kept
// as it was.
#[derive(Parser)]
#[command(
    name = "pipeline-bench",
    version,
    about = "What exactly-once costs the pipeline, by commit interval"
)]
pub struct BenchCli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// Commit intervals of the exactly-once runs, comma-separated durations.
    #[arg(long, value_delimiter = ',', value_parser = price_alerts::cli::interval, default_value = "10ms,100ms,1s")]
    intervals: Vec<Duration>,
    /// Also run at-least-once to compare.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    at_least_once: bool,
    /// Commit intervals of the at-least-once runs. Each exactly-once run is paired with the
    /// at-least-once run of its own interval where there is one, else with the first listed.
    #[arg(long, value_delimiter = ',', value_parser = price_alerts::cli::interval, default_value = "100ms")]
    at_least_once_intervals: Vec<Duration>,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Pre-loaded ticks for the throughput phase.
    #[arg(long, default_value_t = 100_000)]
    ticks: usize,
    /// Paced ticks for the latency phase.
    #[arg(long, default_value_t = 3_000)]
    latency_ticks: usize,
    /// Rate of the paced ticks, per second.
    #[arg(long, default_value_t = 1_000)]
    latency_rate: usize,
    #[arg(long, default_value_t = 200)]
    symbols: usize,
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// A named set of extra arguments for the pipeline, NAME=ARGS (repeatable), e.g.
    /// `--variant 'librdkafka-defaults=-X queued.max.messages.kbytes=65536'`: every configuration
    /// runs once per variant, interleaved. `env:KEY=VALUE` sets an environment variable of the
    /// pipeline, `bin:PATH` runs another build of it (`--variant before=bin:old/alert-pipeline`).
    #[arg(long)]
    variant: Vec<Variant>,
    /// Draw latency.png again from a results.json written before, beside it, and run nothing.
    #[arg(long)]
    replot: Option<PathBuf>,
    /// Where to write results.json and results.md.
    #[arg(long, default_value = "bench/out/pipeline")]
    out: PathBuf,
}

impl BenchCli {
    /// Does what the flags ask: a line per run goes to stderr, the table (or the redrawn plot's
    /// path) to stdout.
    pub fn run(self) -> anyhow::Result<()> {
        if let Some(results) = &self.replot {
            let png = results.with_file_name("latency.png");
            if !plot::replot(results, &png)? {
                anyhow::bail!("{}: no latency samples to plot", results.display());
            }
            price_alerts::outln!("{}", png.display());
            return Ok(());
        }
        let binary = crate::child::bin_dir()?.join("alert-pipeline");
        let opts = self.options(self.kafka.connect()?, binary);
        let results = super::run(&opts, |r| price_alerts::errln!("pipeline-bench: {r}"))?;
        price_alerts::outln!("{}", write_outputs(&self.out, &opts.configs, &results)?);
        Ok(())
    }

    /// The options of a run against `kafka` (already checked) with the pipeline at `binary`: every
    /// configuration the flags name, in the order they are interleaved.
    pub fn options(&self, kafka: KafkaConfig, binary: PathBuf) -> Options {
        let ms =
            |ds: &[Duration]| -> Vec<u64> { ds.iter().map(|d| d.as_millis() as u64).collect() };
        let alo_ms = if self.at_least_once {
            ms(&self.at_least_once_intervals)
        } else {
            Vec::new()
        };
        Options {
            kafka,
            binary,
            configs: Config::list(&ms(&self.intervals), &alo_ms, &self.variant),
            repeats: self.repeats,
            ticks: self.ticks,
            latency_ticks: self.latency_ticks,
            latency_rate: self.latency_rate,
            symbols: self.symbols,
            partitions: self.partitions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    fn configs(args: &[&str]) -> Vec<String> {
        let cli =
            BenchCli::try_parse_from(std::iter::once("pipeline-bench").chain(args.iter().copied()))
                .unwrap();
        cli.options(KafkaConfig::new("broker:9092"), PathBuf::from("p"))
            .configs
            .iter()
            .map(Config::label)
            .collect()
    }

    #[test]
    fn the_command_line_is_well_formed() {
        BenchCli::command().debug_assert();
    }

    #[test]
    fn defaults_are_three_exactly_once_intervals_and_one_at_least_once() {
        assert_eq!(
            configs(&[]),
            [
                "exactly-once 10ms",
                "exactly-once 100ms",
                "exactly-once 1000ms",
                "at-least-once 100ms"
            ]
        );
    }

    #[test]
    fn at_least_once_can_be_left_out_and_variants_multiply_the_configurations() {
        assert_eq!(
            configs(&["--at-least-once", "false", "--intervals", "50ms"]),
            ["exactly-once 50ms"]
        );
        assert_eq!(
            configs(&["--intervals=1s", "--variant", "a=", "--variant", "b=-X x=1"]),
            [
                "exactly-once 1000ms [a]",
                "at-least-once 100ms [a]",
                "exactly-once 1000ms [b]",
                "at-least-once 100ms [b]"
            ]
        );
    }
}
