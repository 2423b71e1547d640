//! The command line of `sink-bench`, and what the binary does with it: run the benchmark, print a
//! line per repeat, write the results and print the table.
//!
//! Why here and not in `bench/src/bin/sink-bench.rs`: a binary only parses, calls the library and
//! maps the result to an exit code (issue 45, thin binaries). Here the flags' turning into
//! [`Options`] is plain code the unit tests below parse and check, and the flow sits beside the
//! module it drives. The help text is the fields' doc comments, so they are kept word for word.

use super::{summarize, table, Options};
use clap::Parser;
use price_alerts::cli::KafkaArgs;
use std::path::PathBuf;

// No `///` on the struct: clap turns a struct's doc comment into help text, and the help is kept
// as it was.
#[derive(Parser)]
#[command(
    version,
    about = "alert-sink: rows/s batched vs naive, and tick-to-row latency"
)]
pub struct BenchCli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// Admin connection string; each run creates and drops a database of its own there.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Pre-loaded notifications per batched run.
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// Pre-loaded notifications per naive (--max-batch 1) run.
    #[arg(long, default_value_t = 5_000)]
    naive_rows: usize,
    /// Ticks appended in the latency phase, and their rate per second.
    #[arg(long, default_value_t = 5_000)]
    latency_ticks: usize,
    #[arg(long, default_value_t = 1_000)]
    latency_rate: usize,
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// The pipeline's commit interval in the latency phase, in ms.
    #[arg(long, default_value_t = 100)]
    pipeline_commit_ms: u64,
    /// Where to write results.json and results.md.
    #[arg(long, default_value = "bench/out/sink")]
    out: PathBuf,
}

impl BenchCli {
    /// Does what the flags ask: a line per repeat goes to stderr, then results.json and
    /// results.md are written under `--out` and the table goes to stdout.
    pub fn run(self) -> anyhow::Result<()> {
        let opts = self.options(crate::child::bin_dir()?)?;
        let results = super::run(&opts, |r| {
            eprintln!(
                "sink-bench #{}: batched {:.0} rows/s, naive {:.0} rows/s, latency p50 {:.0} ms p99 {:.0} ms ({} samples), sink's share p50 {:.0} ms p99 {:.0} ms",
                r.repeat,
                r.batched_rows_per_sec,
                r.naive_rows_per_sec,
                r.latency_p50_ms,
                r.latency_p99_ms,
                r.latency_samples,
                r.sink_share_p50_ms,
                r.sink_share_p99_ms
            )
        })?;
        let summary = summarize(&results);
        let table = table(&summary, &opts);
        crate::write_results(&self.out, &(&summary, &results), &table)?;
        println!("{table}");
        Ok(())
    }

    /// The options of the benchmark, with the release binaries in `bin_dir`.
    pub fn options(&self, bin_dir: PathBuf) -> anyhow::Result<Options> {
        Ok(Options {
            kafka: self.kafka.config()?,
            admin_url: self.database_url.clone(),
            bin_dir,
            repeats: self.repeats,
            rows: self.rows,
            naive_rows: self.naive_rows,
            latency_ticks: self.latency_ticks,
            latency_rate: self.latency_rate,
            partitions: self.partitions,
            pipeline_commit_ms: self.pipeline_commit_ms,
        })
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
        let cli = BenchCli::try_parse_from([
            "sink-bench",
            "--bootstrap=broker:9092",
            "--database-url=postgres://admin@db/postgres",
        ])
        .unwrap();
        let opts = cli.options(PathBuf::from("bin")).unwrap();
        assert_eq!(opts.admin_url, "postgres://admin@db/postgres");
        assert_eq!((opts.rows, opts.naive_rows), (100_000, 5_000));
        assert_eq!((opts.latency_ticks, opts.latency_rate), (5_000, 1_000));
        assert_eq!(
            (opts.repeats, opts.partitions, opts.pipeline_commit_ms),
            (3, 6, 100)
        );
        assert_eq!(opts.bin_dir, PathBuf::from("bin"));
    }
}
