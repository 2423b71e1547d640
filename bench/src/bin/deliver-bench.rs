//! `deliver-bench`: alert-deliver's deliveries/s by fan-out, subscribers in the file and
//! connection mode, against a plain at-most-once reference with the same HTTP client; its latency
//! at half saturation, its RSS and CPU, and the healthy subscribers' share during an outage.
//! `deliver-bench reference` is the reference itself, which the bench starts as a child.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use price_alerts::cli::{main_of, KafkaArgs};
use price_alerts_bench::deliver::{self as bench, reference, Options};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    version,
    about = "alert-deliver: deliveries/s by fan-out against an at-most-once reference, latency, RSS, outages",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    #[command(flatten)]
    kafka: KafkaArgs,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Deliveries per throughput run (notifications = this / fan-out).
    #[arg(long, default_value_t = 100_000)]
    deliveries: usize,
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// Fan-outs of the throughput runs (subscribers per notification).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    fanouts: Vec<usize>,
    /// Subscribers in the file for the population runs (deliver only).
    #[arg(long, value_delimiter = ',', default_value = "100,10000")]
    populations: Vec<usize>,
    /// Fan-out of the population, connection-mode, latency and outage runs.
    #[arg(long, default_value_t = 10)]
    fanout: usize,
    /// How long each latency run writes notifications.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    latency_for: Duration,
    /// Only the fan-out runs (deliver and the reference at each of --fanouts): no connection-mode,
    /// population, latency or outage runs. For a quick A/B of alert-deliver's settings.
    #[arg(long)]
    throughput_only: bool,
    /// An extra argument for alert-deliver (repeatable, e.g. --deliver-arg=--max-batch=1000).
    #[arg(long = "deliver-arg", allow_hyphen_values = true)]
    deliver_args: Vec<String>,
    /// The runners' RUST_LOG (their logs go under OUT/logs): `price_alerts=debug` gives
    /// alert-deliver's line per batch, with its deliveries' and its transaction's time.
    #[arg(long, default_value = "warn")]
    runner_log: String,
    /// Where to write results.json, results.md, the plot and the runners' logs.
    #[arg(long, default_value = "bench/out/deliver")]
    out: PathBuf,
}

#[derive(Subcommand)]
enum Sub {
    /// The reference deliverer: at-most-once, same HTTP client, no guarantees (the bench runs it).
    Reference {
        #[command(flatten)]
        kafka: KafkaArgs,
        /// The subscriptions file; every subscriber with symbols = ["*"] gets every notification.
        #[arg(long)]
        subscriptions: PathBuf,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        partitions: i32,
        /// Concurrent requests to one subscriber, at most (alert-deliver's default).
        #[arg(long, default_value_t = price_alerts::deliver::subscriptions::DEFAULT_MAX_IN_FLIGHT)]
        max_in_flight: usize,
        /// As alert-deliver's --http-connect-timeout.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        http_connect_timeout: Duration,
        /// As alert-deliver's --http-timeout.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        http_timeout: Duration,
    },
}

fn main() -> ExitCode {
    main_of("deliver-bench", || run().map(|()| ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Sub::Reference {
        kafka,
        subscriptions,
        topic,
        partitions,
        max_in_flight,
        http_connect_timeout,
        http_timeout,
    }) = cli.command
    {
        let toml = std::fs::read_to_string(&subscriptions)
            .with_context(|| format!("reading {}", subscriptions.display()))?;
        let subscribers = bench::hot_urls(&toml)?
            .into_iter()
            .map(|(name, url)| Ok((name, url.parse::<reqwest::Url>()?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        return reference::run(reference::Reference {
            kafka: kafka.config()?,
            topic,
            partitions,
            subscribers,
            max_in_flight,
            connect_timeout: http_connect_timeout,
            request_timeout: http_timeout,
        });
    }
    let bin_dir = price_alerts_bench::child::bin_dir()?;
    let opts = Options {
        kafka: cli.kafka.config()?,
        bin_dir,
        repeats: cli.repeats,
        deliveries: cli.deliveries,
        partitions: cli.partitions,
        fanouts: cli.fanouts,
        populations: cli.populations,
        population_fanout: cli.fanout,
        latency_for: cli.latency_for,
        throughput_only: cli.throughput_only,
        log_dir: cli.out.join("logs"),
        deliver_args: cli.deliver_args,
        runner_log: cli.runner_log,
    };
    let results = bench::run(&opts, |r| {
        eprintln!(
            "deliver-bench #{}: {}: {:.0} deliveries/s ({} keys), p50 {} p99 {} ms, RSS {:.1} MiB, CPU {:.2} s/10k, {} repeated",
            r.repeat,
            r.case.label(),
            r.deliveries_per_sec,
            r.keys,
            r.latency_p50_ms.map_or("-".into(), |v| format!("{v:.0}")),
            r.latency_p99_ms.map_or("-".into(), |v| format!("{v:.0}")),
            r.peak_rss_mib,
            r.cpu_s_per_10k,
            r.repeats_seen,
        )
    })?;
    let summaries = bench::summarize(&results);
    let table = bench::table(&summaries);
    print!("{table}");
    price_alerts_bench::write_results(
        &cli.out,
        &serde_json::json!({ "runs": results, "summary": summaries }),
        &table,
    )?;
    if bench::plot::write_png(&summaries, &cli.out.join("deliveries-by-fanout.png"))? {
        eprintln!(
            "deliver-bench: plot in {}",
            cli.out.join("deliveries-by-fanout.png").display()
        );
    }
    Ok(())
}
