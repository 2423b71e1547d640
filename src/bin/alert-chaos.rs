//! `alert-chaos`: the chaos runner on the local cluster of `scripts/kafka.sh up --brokers 3`.
//! Exit 0 only if exactly-once held: offsets at the input's end, 0 missing, 0 duplicate,
//! 0 unexpected, no hanging transaction, every dead letter once. Defaults: the short run.

use clap::Parser;
use price_alerts::cli::main_of;
use price_alerts::kafka::KafkaConfig;
use price_alerts::tools::chaos::cluster::{Cluster, DEFAULT_CLUSTER_BOOTSTRAP};
use price_alerts::tools::chaos::{self, ChaosOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "alert-chaos",
    version,
    about = "Kill, pause and bounce pipeline instances and brokers, then check exactly-once"
)]
struct Cli {
    /// Every broker of the cluster.
    #[arg(long, env = "KAFKA_CLUSTER_BOOTSTRAP", default_value = DEFAULT_CLUSTER_BOOTSTRAP)]
    bootstrap: String,
    #[arg(long, default_value_t = 3)]
    brokers: i32,
    /// scripts/kafka.sh, which stops, kills and starts brokers and runs Kafka's tools.
    #[arg(long, default_value = "scripts/kafka.sh")]
    kafka_sh: PathBuf,
    /// The alert-pipeline binary (default: the one beside this binary).
    #[arg(long)]
    pipeline: Option<PathBuf>,
    /// Seed of the stream, the schedule and every choice (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long)]
    ticks: Option<usize>,
    #[arg(long)]
    symbols: Option<usize>,
    /// Input partitions.
    #[arg(long)]
    partitions: Option<i32>,
    #[arg(long)]
    instances: Option<usize>,
    /// Planned chaos time: the input is fed and the faults spread over it.
    #[arg(long, value_parser = price_alerts::cli::duration)]
    span: Option<Duration>,
    #[arg(long)]
    kills: Option<u32>,
    #[arg(long)]
    terms: Option<u32>,
    #[arg(long)]
    zombies: Option<u32>,
    #[arg(long)]
    hard_bounces: Option<u32>,
    #[arg(long)]
    clean_bounces: Option<u32>,
    #[arg(long, value_parser = price_alerts::cli::duration)]
    limit: Option<Duration>,
    /// Where the instances' logs go (default: a temp folder named after the seed).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Static group membership for the instances (the pipeline's default), not dynamic.
    #[arg(long)]
    static_membership: bool,
}

fn main() -> ExitCode {
    main_of("alert-chaos", || {
        let cli = Cli::parse();
        let pipeline = match cli.pipeline {
            Some(p) => p,
            None => std::env::current_exe()?.with_file_name("alert-pipeline"),
        };
        let cluster = Cluster {
            kafka_sh: cli.kafka_sh,
            kafka: KafkaConfig::new(cli.bootstrap),
            brokers: cli.brokers,
        };
        let mut o = ChaosOptions::short(cluster, pipeline, cli.seed.unwrap_or_else(rand::random));
        (o.ticks, o.symbols) = (
            cli.ticks.unwrap_or(o.ticks),
            cli.symbols.unwrap_or(o.symbols),
        );
        (o.partitions, o.instances) = (
            cli.partitions.unwrap_or(o.partitions),
            cli.instances.unwrap_or(o.instances),
        );
        o.span = cli.span.unwrap_or(o.span);
        o.limit = cli.limit.unwrap_or(o.limit);
        (o.work_dir, o.static_membership) =
            (cli.work_dir.unwrap_or(o.work_dir), cli.static_membership);
        let f = &mut o.faults;
        (f.kills, f.terms, f.zombies) = (
            cli.kills.unwrap_or(f.kills),
            cli.terms.unwrap_or(f.terms),
            cli.zombies.unwrap_or(f.zombies),
        );
        f.hard_bounces = cli.hard_bounces.unwrap_or(f.hard_bounces);
        f.clean_bounces = cli.clean_bounces.unwrap_or(f.clean_bounces);
        price_alerts::outln!(
            "alert-chaos: seed {}; instance logs in {}",
            o.seed,
            o.work_dir.display()
        );
        let report = chaos::run(&o)?;
        price_alerts::outln!("{report}");
        Ok(if report.ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    })
}
