//! `alert-chaos`'s command line: every knob of a chaos run, each defaulting to the short run's.

use crate::kafka::KafkaConfig;
use crate::tools::chaos::cluster::{Cluster, DEFAULT_CLUSTER_BOOTSTRAP};
use crate::tools::chaos::ChaosOptions;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "alert-chaos",
    version,
    about = "Kill, pause and bounce pipeline instances and brokers, then check exactly-once"
)]
pub struct ChaosArgs {
    /// Every broker of the cluster.
    #[arg(long, env = "KAFKA_CLUSTER_BOOTSTRAP", default_value = DEFAULT_CLUSTER_BOOTSTRAP)]
    pub bootstrap: String,
    #[arg(long, default_value_t = 3)]
    pub brokers: i32,
    /// scripts/kafka.sh, which stops, kills and starts brokers and runs Kafka's tools.
    #[arg(long, default_value = "scripts/kafka.sh")]
    pub kafka_sh: PathBuf,
    /// The alert-pipeline binary (default: the one beside this binary).
    #[arg(long)]
    pub pipeline: Option<PathBuf>,
    /// Seed of the stream, the schedule and every choice (default: random, printed).
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long)]
    pub ticks: Option<usize>,
    #[arg(long)]
    pub symbols: Option<usize>,
    /// Input partitions.
    #[arg(long)]
    pub partitions: Option<i32>,
    #[arg(long)]
    pub instances: Option<usize>,
    /// Planned chaos time: the input is fed and the faults spread over it.
    #[arg(long, value_parser = super::duration)]
    pub span: Option<Duration>,
    #[arg(long)]
    pub kills: Option<u32>,
    #[arg(long)]
    pub terms: Option<u32>,
    #[arg(long)]
    pub zombies: Option<u32>,
    #[arg(long)]
    pub hard_bounces: Option<u32>,
    #[arg(long)]
    pub clean_bounces: Option<u32>,
    #[arg(long, value_parser = super::duration)]
    pub limit: Option<Duration>,
    /// Where the instances' logs go (default: a temp folder named after the seed).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Static group membership for the instances (`--static-membership`), not dynamic (the
    /// pipeline's default).
    #[arg(long)]
    pub static_membership: bool,
}

impl ChaosArgs {
    /// The run's options: the short run's, with what was given on the command line.
    pub fn options(self) -> std::io::Result<ChaosOptions> {
        let pipeline = match self.pipeline {
            Some(p) => p,
            None => std::env::current_exe()?.with_file_name("alert-pipeline"),
        };
        let cluster = Cluster {
            kafka_sh: self.kafka_sh,
            kafka: KafkaConfig::new(self.bootstrap),
            brokers: self.brokers,
        };
        let mut o = ChaosOptions::short(cluster, pipeline, self.seed.unwrap_or_else(rand::random));
        o.ticks = self.ticks.unwrap_or(o.ticks);
        o.symbols = self.symbols.unwrap_or(o.symbols);
        o.partitions = self.partitions.unwrap_or(o.partitions);
        o.instances = self.instances.unwrap_or(o.instances);
        o.span = self.span.unwrap_or(o.span);
        o.limit = self.limit.unwrap_or(o.limit);
        o.work_dir = self.work_dir.unwrap_or(o.work_dir);
        o.static_membership = self.static_membership;
        let f = &mut o.faults;
        f.kills = self.kills.unwrap_or(f.kills);
        f.terms = self.terms.unwrap_or(f.terms);
        f.zombies = self.zombies.unwrap_or(f.zombies);
        f.hard_bounces = self.hard_bounces.unwrap_or(f.hard_bounces);
        f.clean_bounces = self.clean_bounces.unwrap_or(f.clean_bounces);
        Ok(o)
    }
}
