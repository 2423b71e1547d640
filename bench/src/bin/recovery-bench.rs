//! `recovery-bench`: after a SIGKILL of an instance holding a large state, how long its restart
//! takes to restore the state and reach its first commit; repeated, p50 and max.

use anyhow::Context as _;
use clap::Parser;
use price_alerts::cli::{main_of, KafkaArgs};
use price_alerts_bench::recovery::{self, Options};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "recovery-bench",
    version,
    about = "Restart after SIGKILL: time to restore the state and to the first commit"
)]
struct Cli {
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

fn main() -> ExitCode {
    main_of("recovery-bench", || run().map(|()| ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let binaries = if cli.binary.is_empty() {
        vec![std::env::current_exe()?
            .parent()
            .context("locating the binaries folder")?
            .join("alert-pipeline")]
    } else {
        cli.binary.clone()
    };
    let opts = Options {
        kafka: cli.kafka.connect()?,
        binaries: binaries.clone(),
        pipeline_args: cli.pipeline_arg,
        repeats: cli.repeats,
        symbols: cli.symbols,
        ticks: cli.ticks,
        live_rate: cli.live_rate,
        kill_after: cli.kill_after,
        partitions: cli.partitions,
        commit_interval: cli.commit_interval,
        log_dir: cli.out.join("logs"),
        live_alerts: cli.live_alerts,
    };
    let results = recovery::run(&opts, |r| price_alerts::errln!("recovery-bench: {r}"))?;
    price_alerts::outln!(
        "{}",
        recovery::write_outputs(&cli.out, &binaries, &results)?
    );
    Ok(())
}
