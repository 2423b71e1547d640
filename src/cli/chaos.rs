//! `alert-chaos`'s command line: every knob of a chaos run, each defaulting to the short run's
//! (all stages: [`ChaosOptions::short_all_stages`]; `--pipeline-only` for the pipeline alone).
//!
//! A long all-stage run, as issues 19 and 20 ask for (≥ 500,000 ticks, ≥ 15 kills of each stage,
//! ≥ 4 broker bounces, ≥ 3 PostgreSQL shutdowns, a coordinator kill of each stage's group):
//!
//! ```text
//! alert-chaos --ticks 500000 --symbols 200 --partitions 12 --span 20m \
//!     --kills 15 --terms 5 --zombies 2 --hard-bounces 2 --clean-bounces 2 \
//!     --coordinator-kills 3 --database-downs 3 --limit 90m --work-dir /tmp/chaos-all-long
//! ```

use super::membership::GroupProtocolArg;
use crate::kafka::KafkaConfig;
use crate::tools::chaos::cluster::{Cluster, DEFAULT_CLUSTER_BOOTSTRAP};
use crate::tools::chaos::plan::Stage;
use crate::tools::chaos::stages::GroupProtocols;
use crate::tools::chaos::ChaosOptions;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "alert-chaos",
    version,
    about = "Kill, pause and bounce the instances of every stage, brokers and PostgreSQL, then check exactly-once"
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
    /// The pipeline alone: no sink, deliverer, subscribers or database.
    #[arg(long)]
    pub pipeline_only: bool,
    /// Live alerts: the rules loaded into the rules topic before the start, the pipeline run with
    /// --live-rules, and alerts changed during the chaos (--alert-changes); the oracle joins the
    /// input with the rules topic.
    #[arg(long)]
    pub live_rules: bool,
    /// With --live-rules: how many alert changes (updates, deletes, new one-shot and banded
    /// alerts) are spread over the span.
    #[arg(long, default_value_t = 40)]
    pub alert_changes: usize,
    /// The alert-sink binary (default: the one beside this binary).
    #[arg(long)]
    pub sink: Option<PathBuf>,
    /// The alert-deliver binary (default: the one beside this binary).
    #[arg(long)]
    pub deliver: Option<PathBuf>,
    /// scripts/postgres.sh, which shuts PostgreSQL down and starts it (the database faults).
    #[arg(long, default_value = "scripts/postgres.sh")]
    pub postgres_sh: PathBuf,
    /// scripts/postgres.sh's state folder: a server of the run's own (its data, port and
    /// password), which it must have started (`PG_STATE=DIR scripts/postgres.sh up`); default the
    /// checkout's .postgres/.
    #[arg(long, env = "PG_STATE")]
    pub postgres_state: Option<PathBuf>,
    /// The PostgreSQL server (the run creates its own database there; default: what
    /// `scripts/postgres.sh url` prints).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    #[arg(long)]
    pub sink_instances: Option<usize>,
    #[arg(long)]
    pub deliver_instances: Option<usize>,
    /// alert-deliver's retry buckets (their sum must exceed --subscriber-outage by a margin).
    #[arg(long)]
    pub buckets: Option<String>,
    /// How long the failing subscriber answers 503 (from a quarter of the span on).
    #[arg(long, value_parser = super::duration)]
    pub subscriber_outage: Option<Duration>,
    /// Immediate PostgreSQL shutdowns.
    #[arg(long)]
    pub database_downs: Option<u32>,
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
    /// SIGKILLs of instances, of each stage.
    #[arg(long)]
    pub kills: Option<u32>,
    /// SIGTERMs of instances, of each stage.
    #[arg(long)]
    pub terms: Option<u32>,
    /// Instances SIGSTOPped beyond their transaction timeout, of each stage.
    #[arg(long)]
    pub zombies: Option<u32>,
    #[arg(long)]
    pub hard_bounces: Option<u32>,
    #[arg(long)]
    pub clean_bounces: Option<u32>,
    /// SIGKILLs of the broker that coordinates a stage's group, kept down past the stuck bound
    /// (the transaction timeout + 30 s), each followed by the check that no instance of the
    /// stage is stuck; the stages' groups in turn (pipeline, sink, deliver). Default 0.
    #[arg(long)]
    pub coordinator_kills: Option<u32>,
    /// How long a coordinator kill keeps the broker down (default 70s; keep it above the
    /// transaction timeout + 30 s, so that a call blocked on it stays blocked while judged).
    #[arg(long, value_parser = super::duration)]
    pub coordinator_down: Option<Duration>,
    #[arg(long, value_parser = super::duration)]
    pub limit: Option<Duration>,
    /// Where the instances' logs go (default: a temp folder named after the seed).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Static group membership (`--static-membership`) for the instances of every stage, not
    /// dynamic (the default).
    #[arg(long)]
    pub static_membership: bool,
    /// The group protocol of every stage's instances: classic, or consumer (KIP-848). A classic
    /// stage gets -X session.timeout.ms=10000; a consumer stage none, its session being the
    /// broker's group.consumer.session.timeout.ms (45 s by default, read from the cluster), which
    /// its zombies' pause then outlasts. The report says which protocol each stage ran.
    #[arg(long, value_enum, env = "GROUP_PROTOCOL", default_value = "classic")]
    pub group_protocol: GroupProtocolArg,
    /// The group protocol of the pipeline's instances, over --group-protocol.
    #[arg(long, value_enum)]
    pub pipeline_group_protocol: Option<GroupProtocolArg>,
    /// The group protocol of the sink's instances, over --group-protocol.
    #[arg(long, value_enum, conflicts_with = "pipeline_only")]
    pub sink_group_protocol: Option<GroupProtocolArg>,
    /// The group protocol of the deliverer's instances, over --group-protocol.
    #[arg(long, value_enum, conflicts_with = "pipeline_only")]
    pub deliver_group_protocol: Option<GroupProtocolArg>,
}

impl ChaosArgs {
    /// Each stage's group protocol: its own flag, else --group-protocol.
    fn group_protocols(&self) -> GroupProtocols {
        let mut protocols = GroupProtocols::all(self.group_protocol.into());
        for (stage, own) in [
            (Stage::Pipeline, self.pipeline_group_protocol),
            (Stage::Sink, self.sink_group_protocol),
            (Stage::Deliver, self.deliver_group_protocol),
        ] {
            if let Some(p) = own {
                protocols.set(stage, p.into());
            }
        }
        protocols
    }

    /// The run's options: the short run's, with what was given on the command line.
    pub fn options(self) -> anyhow::Result<ChaosOptions> {
        let group_protocols = self.group_protocols();
        let here = std::env::current_exe()?;
        let pipeline = match self.pipeline {
            Some(p) => p,
            None => here.with_file_name("alert-pipeline"),
        };
        let cluster = Cluster {
            kafka_sh: self.kafka_sh,
            kafka: KafkaConfig::new(self.bootstrap),
            brokers: self.brokers,
        };
        let seed = self.seed.unwrap_or_else(rand::random);
        let mut o = if self.pipeline_only {
            ChaosOptions::short(cluster, pipeline, seed)
        } else {
            let database_url = match self.database_url {
                Some(url) => url,
                None => postgres_url(&self.postgres_sh, self.postgres_state.as_deref())?,
            };
            let dir = here.parent().unwrap_or(std::path::Path::new("."));
            let mut o =
                ChaosOptions::short_all_stages(cluster, dir, seed, self.postgres_sh, database_url);
            o.pipeline = pipeline;
            if let Some(d) = &mut o.downstream {
                d.postgres_state = self.postgres_state;
                d.sink = self.sink.unwrap_or_else(|| d.sink.clone());
                d.deliver = self.deliver.unwrap_or_else(|| d.deliver.clone());
                d.sink_instances = self.sink_instances.unwrap_or(d.sink_instances);
                d.deliver_instances = self.deliver_instances.unwrap_or(d.deliver_instances);
                d.buckets = self.buckets.unwrap_or_else(|| d.buckets.clone());
                d.subscriber_outage.lasts =
                    self.subscriber_outage.unwrap_or(d.subscriber_outage.lasts);
            }
            o
        };
        o.ticks = self.ticks.unwrap_or(o.ticks);
        o.symbols = self.symbols.unwrap_or(o.symbols);
        o.partitions = self.partitions.unwrap_or(o.partitions);
        o.instances = self.instances.unwrap_or(o.instances);
        o.span = self.span.unwrap_or(o.span);
        if let Some(d) = &mut o.downstream {
            d.subscriber_outage.after = o.span / 4;
        }
        o.limit = self.limit.unwrap_or(o.limit);
        o.coordinator_down = self.coordinator_down.unwrap_or(o.coordinator_down);
        o.work_dir = self.work_dir.unwrap_or(o.work_dir);
        o.static_membership = self.static_membership;
        o.group_protocols = group_protocols;
        o.alert_changes = self.live_rules.then_some(self.alert_changes);
        let f = &mut o.faults;
        f.kills = self.kills.unwrap_or(f.kills);
        f.terms = self.terms.unwrap_or(f.terms);
        f.zombies = self.zombies.unwrap_or(f.zombies);
        f.hard_bounces = self.hard_bounces.unwrap_or(f.hard_bounces);
        f.clean_bounces = self.clean_bounces.unwrap_or(f.clean_bounces);
        f.database_downs = self.database_downs.unwrap_or(f.database_downs);
        f.coordinator_kills = self.coordinator_kills.unwrap_or(f.coordinator_kills);
        Ok(o)
    }
}

/// The URL `scripts/postgres.sh url` prints.
fn postgres_url(
    postgres_sh: &std::path::Path,
    state: Option<&std::path::Path>,
) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let out = crate::tools::chaos::database::postgres_command(postgres_sh, state)
        .arg("url")
        .output()
        .with_context(|| format!("running {} url", postgres_sh.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "no --database-url and `{} url` failed: {}",
            postgres_sh.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::ChaosArgs;
    use crate::kafka::config::GroupProtocol::{Classic, Consumer};
    use crate::tools::chaos::stages::GroupProtocols;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<ChaosArgs, clap::Error> {
        ChaosArgs::try_parse_from(std::iter::once("alert-chaos").chain(args.iter().copied()))
    }

    #[test]
    fn every_stage_takes_the_run_protocol_unless_its_own_is_given() {
        // --group-protocol always given: the test run's own GROUP_PROTOCOL must not decide.
        let all = parse(&["--group-protocol", "consumer"]).unwrap();
        assert_eq!(all.group_protocols(), GroupProtocols::all(Consumer));
        let mixed = parse(&[
            "--group-protocol",
            "consumer",
            "--sink-group-protocol",
            "classic",
        ])
        .unwrap();
        assert_eq!(
            mixed.group_protocols(),
            GroupProtocols {
                pipeline: Consumer,
                sink: Classic,
                deliver: Consumer
            }
        );
        let own = parse(&[
            "--group-protocol",
            "classic",
            "--pipeline-group-protocol",
            "consumer",
            "--deliver-group-protocol",
            "consumer",
        ])
        .unwrap();
        assert_eq!(
            own.group_protocols(),
            GroupProtocols {
                pipeline: Consumer,
                sink: Classic,
                deliver: Consumer
            }
        );
        let o = parse(&[
            "--group-protocol",
            "consumer",
            "--database-url",
            "postgres://h/d",
        ])
        .unwrap()
        .options()
        .unwrap();
        assert_eq!(o.group_protocols, GroupProtocols::all(Consumer));
    }

    #[test]
    fn a_pipeline_only_run_takes_no_downstream_protocol() {
        assert!(parse(&["--pipeline-only", "--sink-group-protocol", "consumer"]).is_err());
        assert!(parse(&["--pipeline-only", "--deliver-group-protocol", "classic"]).is_err());
        assert!(parse(&["--pipeline-only", "--pipeline-group-protocol", "consumer"]).is_ok());
        assert!(parse(&["--group-protocol", "eager"]).is_err());
    }
}
