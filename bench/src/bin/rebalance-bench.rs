//! `rebalance-bench`: how long each partition goes without committed progress when an instance
//! of three is stopped (SIGTERM), killed (SIGKILL) or added, under the classic group protocol and
//! KIP-848's consumer protocol, interleaved; p50, p99 and max over the repeats, a plot.

use clap::Parser;
use price_alerts::cli::{main_of, KafkaArgs};
use price_alerts::kafka::config::GroupProtocol;
use price_alerts_bench::rebalance::{self, idle::Settle, Options};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "rebalance-bench",
    version,
    about = "Partition idle time after SIGTERM, SIGKILL and a join: classic against consumer"
)]
struct Cli {
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

fn main() -> ExitCode {
    main_of("rebalance-bench", || run().map(|()| ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(results) = &cli.replot {
        let report = rebalance::read_report(results)?;
        let dir = results.parent().unwrap_or(std::path::Path::new("."));
        price_alerts::outln!("{}", rebalance::write_outputs(dir, &report)?);
        return Ok(());
    }
    let binary = match cli.binary {
        Some(b) => b,
        None => price_alerts_bench::child::bin_dir()?.join("alert-pipeline"),
    };
    let opts = Options {
        kafka: cli.kafka.connect()?,
        binary,
        protocols: cli.protocols,
        repeats: cli.repeats,
        partitions: cli.partitions,
        rate: cli.rate,
        symbols: cli.symbols,
        commit_interval: cli.commit_interval,
        classic_session_timeout: cli.classic_session_timeout,
        pipeline_args: cli.pipeline_arg,
        poll: cli.poll,
        settle: Settle {
            quiet: cli.quiet.as_secs_f64(),
            hold: cli.hold.as_secs_f64(),
        },
        event_timeout: cli.event_timeout,
        start_timeout: cli.start_timeout,
        log_dir: cli.out.join("logs"),
    };
    let report = rebalance::run(&opts, |line| {
        price_alerts::errln!("rebalance-bench: {line}")
    })?;
    price_alerts::outln!("{}", rebalance::write_outputs(&cli.out, &report)?);
    Ok(())
}
