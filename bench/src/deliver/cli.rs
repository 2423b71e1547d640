//! The command line of `deliver-bench`, and what the binary does with it: run the benchmark, print
//! a line per run and the table, write the results and the plot; or, as `deliver-bench reference`,
//! be the reference deliverer the benchmark starts as a child.
//!
//! Why here and not in `bench/src/bin/deliver-bench.rs`: a binary only parses, calls the library
//! and maps the result to an exit code (issue 45, thin binaries). Here the flags' turning into
//! [`Options`] and into a [`Reference`] (its subscribers read from the subscriptions file) is plain
//! code the unit tests below parse and check, and the flow sits beside the module it drives. The
//! help text is the fields' doc comments, so they are kept word for word.

use super::reference::{self, Reference};
use super::{hot_urls, plot, summarize, table, Options};
use anyhow::Context as _;
use clap::{Parser, Subcommand};
use price_alerts::cli::KafkaArgs;
use std::path::PathBuf;
use std::time::Duration;

// No `///` on the struct: clap turns a struct's doc comment into help text, and the help is kept
// as it was.
#[derive(Parser)]
#[command(
    version,
    about = "alert-deliver: deliveries/s by fan-out against an at-most-once reference, latency, RSS, outages",
    args_conflicts_with_subcommands = true
)]
pub struct BenchCli {
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

impl BenchCli {
    /// Does what the flags ask. The benchmark prints a line per run to stderr and the table to
    /// stdout, and writes results.json, results.md and deliveries-by-fanout.png under `--out`;
    /// the reference runs until it is killed.
    pub fn run(self) -> anyhow::Result<()> {
        if let Some(sub) = &self.command {
            return reference::run(sub.reference()?);
        }
        let opts = self.options(crate::child::bin_dir()?)?;
        let results = super::run(&opts, |r| {
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
        let summaries = summarize(&results);
        let table = table(&summaries);
        print!("{table}");
        crate::write_results(
            &self.out,
            &serde_json::json!({ "runs": results, "summary": summaries }),
            &table,
        )?;
        let png = self.out.join("deliveries-by-fanout.png");
        if plot::write_png(&summaries, &png)? {
            eprintln!("deliver-bench: plot in {}", png.display());
        }
        Ok(())
    }

    /// The options of the benchmark, with the release binaries in `bin_dir`.
    pub fn options(&self, bin_dir: PathBuf) -> anyhow::Result<Options> {
        Ok(Options {
            kafka: self.kafka.config()?,
            bin_dir,
            repeats: self.repeats,
            deliveries: self.deliveries,
            partitions: self.partitions,
            fanouts: self.fanouts.clone(),
            populations: self.populations.clone(),
            population_fanout: self.fanout,
            latency_for: self.latency_for,
            throughput_only: self.throughput_only,
            log_dir: self.out.join("logs"),
            deliver_args: self.deliver_args.clone(),
            runner_log: self.runner_log.clone(),
        })
    }
}

impl Sub {
    /// What the reference runs with: its subscribers are the file's hot ones (every notification
    /// goes to each), their URLs checked here.
    fn reference(&self) -> anyhow::Result<Reference> {
        let Sub::Reference {
            kafka,
            subscriptions,
            topic,
            partitions,
            max_in_flight,
            http_connect_timeout,
            http_timeout,
        } = self;
        let toml = std::fs::read_to_string(subscriptions)
            .with_context(|| format!("reading {}", subscriptions.display()))?;
        let subscribers = hot_urls(&toml)?
            .into_iter()
            .map(|(name, url)| Ok((name, url.parse::<reqwest::Url>()?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Reference {
            kafka: kafka.config()?,
            topic: topic.clone(),
            partitions: *partitions,
            subscribers,
            max_in_flight: *max_in_flight,
            connect_timeout: *http_connect_timeout,
            request_timeout: *http_timeout,
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
        let cli = BenchCli::try_parse_from(["deliver-bench", "--bootstrap=broker:9092"]).unwrap();
        let opts = cli.options(PathBuf::from("bin")).unwrap();
        assert_eq!(opts.fanouts, [1, 10, 100]);
        assert_eq!(opts.populations, [100, 10_000]);
        assert_eq!(opts.population_fanout, 10);
        assert_eq!(opts.latency_for, Duration::from_secs(20));
        assert_eq!(opts.log_dir, PathBuf::from("bench/out/deliver/logs"));
        assert!(!opts.throughput_only);
    }

    #[test]
    fn deliver_args_may_start_with_a_hyphen() {
        let cli = BenchCli::try_parse_from([
            "deliver-bench",
            "--deliver-arg=--max-batch=1000",
            "--deliver-arg",
            "--linger=5ms",
        ])
        .unwrap();
        let opts = cli.options(PathBuf::from("bin")).unwrap();
        assert_eq!(opts.deliver_args, ["--max-batch=1000", "--linger=5ms"]);
    }

    #[test]
    fn the_reference_takes_the_hot_subscribers_of_its_file() {
        let dir = std::env::temp_dir().join(format!("deliver-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("subscriptions.toml");
        std::fs::write(
            &file,
            "[subscribers.hot]\nurl = \"http://127.0.0.1:1/hot\"\nsymbols = [\"*\"]\n\
             [subscribers.cold]\nurl = \"http://127.0.0.1:1/cold\"\nsymbols = [\"A\", \"B\"]\n",
        )
        .unwrap();
        let cli = BenchCli::try_parse_from([
            "deliver-bench".as_ref(),
            "reference".as_ref(),
            "--subscriptions".as_ref(),
            file.as_os_str(),
            "--topic=n".as_ref(),
            "--partitions=3".as_ref(),
        ])
        .unwrap();
        let reference = cli.command.as_ref().unwrap().reference().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let names: Vec<_> = reference
            .subscribers
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(names, ["hot"]);
        assert_eq!((reference.topic.as_str(), reference.partitions), ("n", 3));
    }
}
