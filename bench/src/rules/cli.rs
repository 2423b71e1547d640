//! The command line of `rules-bench`, and what the binary does with it: run the benchmark, print
//! the report, write the results.
//!
//! Why here and not in `bench/src/bin/rules-bench.rs`: as for the other benchmarks (see
//! [`crate::recovery::cli`]), a binary only parses, calls the library and maps the result to an
//! exit code, and a test can ask this parser whether a command shown in the documents still
//! parses (`bench/tests/docs.rs`). The help text is the fields' doc comments, kept word for word.

use super::Options;
use clap::Parser;
use price_alerts::cli::KafkaArgs;
use std::path::PathBuf;
use std::time::Duration;

// No `///` on the struct: clap turns a struct's doc comment into help text, and the help is kept
// as it was.
#[derive(Parser)]
#[command(
    name = "rules-bench",
    version,
    about = "Live alerts: from a put's return to its first notification, at a paced stream"
)]
pub struct BenchCli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// The alert-pipeline binary (default: the one beside this binary).
    #[arg(long)]
    binary: Option<PathBuf>,
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// Symbols of the paced stream.
    #[arg(long, default_value_t = 100)]
    symbols: usize,
    /// Ticks per second.
    #[arg(long, default_value_t = 1_000)]
    rate: usize,
    /// Alerts put, one at a time.
    #[arg(long, default_value_t = 100)]
    puts: usize,
    /// Time between two puts.
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    every: Duration,
    #[arg(long, default_value = "100ms")]
    commit_interval: String,
    /// Where to write results.json and results.md.
    #[arg(long, default_value = "bench/out/rules")]
    out: PathBuf,
}

impl BenchCli {
    /// Does what the flags ask: the report goes to stdout and into the output folder.
    pub fn run(self) -> anyhow::Result<()> {
        let binary = match self.binary {
            Some(b) => b,
            None => crate::child::bin_dir()?.join("alert-pipeline"),
        };
        let report = super::run(&Options {
            kafka: self.kafka.connect()?,
            binary,
            partitions: self.partitions,
            symbols: self.symbols,
            rate: self.rate,
            puts: self.puts,
            every: self.every,
            commit_interval: self.commit_interval,
        })?;
        price_alerts::outln!("{report}");
        crate::write_results(&self.out, &report, &format!("{report}\n"))?;
        Ok(())
    }
}
