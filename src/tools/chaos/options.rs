//! What a chaos run is asked to do ([`ChaosOptions`]): the stream, the instances, the counts of
//! faults and the timeouts, the short run that `scripts/test.sh` and the binary start from, and
//! what follows from the options for each stage: how long a member that stopped heartbeating
//! keeps its partitions under the stage's group protocol ([`ChaosOptions::session`]), how long a
//! zombie is paused ([`ChaosOptions::zombie_pause`]) and within what bound an instance must have
//! moved on after a coordinator kill ([`ChaosOptions::stuck_bound`]).
//!
//! A file of its own because the runner ([`run`](super::run)), the stages' launches
//! ([`stages`](super::stages)) and the binary's flags (`src/cli/chaos.rs`) all read it, and
//! none of them owns it.

use super::cluster::Cluster;
use super::downstream::DownstreamOptions;
use super::plan::{FaultCounts, Stage};
use super::stages::GroupProtocols;
use super::subscribers;
use crate::kafka::config::GroupProtocol;
use std::path::PathBuf;
use std::time::Duration;

/// Kafka's default `group.consumer.session.timeout.ms` (and its floor,
/// `group.consumer.min.session.timeout.ms`): the session of a consumer-protocol member until a
/// run has read the cluster's.
pub const BROKER_CONSUMER_SESSION: Duration = Duration::from_secs(45);

/// What to run.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// The cluster (every broker in the bootstrap list) and `scripts/kafka.sh`.
    pub cluster: Cluster,
    /// The `alert-pipeline` binary.
    pub pipeline: PathBuf,
    /// Seed of the stream, the schedule and every random choice.
    pub seed: u64,
    pub ticks: usize,
    pub symbols: usize,
    /// Input partitions.
    pub partitions: i32,
    /// Pipeline instances (distinct instance ids).
    pub instances: usize,
    /// Planned chaos time: the input is fed and the faults are spread over it.
    pub span: Duration,
    pub faults: FaultCounts,
    /// The instances' --transaction-timeout; the zombie's pause exceeds it.
    pub transaction_timeout: Duration,
    /// The session.timeout.ms of the classic-protocol stages' instances: a paused or dead member
    /// keeps its partitions this long ([`Self::session`]).
    pub session_timeout: Duration,
    /// The group protocol of each stage's instances ([`stages`](super::stages), `# The group
    /// protocol of each stage`).
    pub group_protocols: GroupProtocols,
    /// The session of a consumer-protocol member, which is the broker's
    /// (`group.consumer.session.timeout.ms`, 45 s by default; scripts/kafka.sh's cluster keeps
    /// it): a run with a consumer-protocol stage reads it from the cluster at its start
    /// ([`Cluster::consumer_session_timeout`]).
    pub consumer_session_timeout: Duration,
    /// The instances' --shutdown-timeout.
    pub shutdown_timeout: Duration,
    /// The instances' --commit-interval.
    pub commit_interval: Duration,
    /// Static group membership (`--static-membership`) or dynamic (the pipeline's default).
    pub static_membership: bool,
    /// Longest time a bounced broker stays down (drawn from 1 s up to this).
    pub max_down: Duration,
    /// How long a coordinator kill keeps the broker down: longer than [`Self::stuck_bound`], so
    /// that a call blocked on it stays blocked until the check has judged.
    pub coordinator_down: Duration,
    /// Bound on the whole run; past it the run fails.
    pub limit: Duration,
    /// Where the rules file and the instances' logs go.
    pub work_dir: PathBuf,
    /// Keep the run's topics after a passing run (a failing run always keeps them).
    pub keep_topics: bool,
    /// The stages after the pipeline (sink, deliver, PostgreSQL), or `None`: pipeline only.
    pub downstream: Option<DownstreamOptions>,
    /// Live alerts (`--live-rules`): the rules loaded into the rules topic before the start and
    /// this many alert changes during the chaos ([`alerts`](super::alerts)); `None`: the rules
    /// file.
    pub alert_changes: Option<usize>,
}

impl ChaosOptions {
    /// The short run of `scripts/test.sh` (about a minute of chaos): 30,000 ticks over 60 s,
    /// 3 instances, 3 SIGKILLs, 3 SIGTERMs, one zombie, one hard and one clean broker bounce (the
    /// first of a transaction coordinator, the second of the group coordinator), with dynamic
    /// membership. The
    /// binary's defaults too.
    pub fn short(cluster: Cluster, pipeline: PathBuf, seed: u64) -> Self {
        // As the broker tests: a shared CI machine once stalled a broker for about 9 s.
        let transaction_timeout = Duration::from_secs(30);
        ChaosOptions {
            cluster,
            pipeline,
            seed,
            ticks: 30_000,
            symbols: 100,
            partitions: 6,
            instances: 3,
            span: Duration::from_secs(60),
            faults: FaultCounts {
                kills: 3,
                terms: 3,
                zombies: 1,
                hard_bounces: 1,
                clean_bounces: 1,
                database_downs: 2,
                // None in the short run: a kill keeps a broker down past the stuck bound (70 s
                // here) and needs input flowing through it; tests/chaos.rs's coordinator-kill
                // test and tests/coordinator.rs take them.
                coordinator_kills: 0,
            },
            transaction_timeout,
            session_timeout: Duration::from_secs(10),
            group_protocols: GroupProtocols::default(),
            consumer_session_timeout: BROKER_CONSUMER_SESSION,
            shutdown_timeout: Duration::from_secs(20),
            // One-second batches: a transaction is open nearly all the time, so every kill, pause
            // and bounce lands in one (and a commit's fixed cost on three replicas is paid less
            // often than with the production 100 ms).
            commit_interval: Duration::from_secs(1),
            // Dynamic, the pipeline's default: with static membership a partition can be left
            // without owner for good when an instance is stopped between the two rounds of a
            // cooperative rebalance and its successor takes its place without a rebalance
            // (tests/membership.rs); the long run in docs/testing.md shows the static case,
            // `--static-membership`.
            static_membership: false,
            max_down: Duration::from_secs(5),
            // The stuck bound (transaction timeout + 30 s) and 10 s more.
            coordinator_down: transaction_timeout + Duration::from_secs(40),
            limit: Duration::from_secs(600),
            work_dir: std::env::temp_dir().join(format!("alert-chaos-{seed}")),
            keep_topics: false,
            downstream: None,
            alert_changes: None,
        }
    }

    /// The short run carried through every stage (what `scripts/test.sh` runs, and the binary's
    /// default): the pipeline's short run, plus 2 sink and 2 deliver instances, each stage with
    /// the same instance faults as the pipeline (3 SIGKILLs, 3 SIGTERMs, one zombie), two
    /// immediate PostgreSQL shutdowns, and a subscriber failing for 10 s.
    pub fn short_all_stages(
        cluster: Cluster,
        binaries: &std::path::Path,
        seed: u64,
        postgres_sh: PathBuf,
        database_url: String,
    ) -> Self {
        let mut o = Self::short(cluster, binaries.join("alert-pipeline"), seed);
        o.downstream = Some(DownstreamOptions {
            sink: binaries.join("alert-sink"),
            deliver: binaries.join("alert-deliver"),
            postgres_sh,
            postgres_state: None,
            database_url,
            sink_instances: 2,
            deliver_instances: 2,
            // 37 s in all, far more than the subscriber's 10 s outage: a notification that fails
            // at its start is retried after 2 s and 7 s (still failing), then after 37 s.
            buckets: "2s,5s,30s".to_owned(),
            subscriber_outage: subscribers::Outage {
                after: o.span / 4,
                lasts: Duration::from_secs(10),
            },
            max_database_down: Duration::from_secs(5),
        });
        o
    }

    /// Within this long after a coordinator kill every instance that was running must show
    /// progress or have exited by itself (and been restarted), else it is stuck: the transaction
    /// timeout plus 30 s, what issue 20 asks of a process that gives up a stuck call by itself.
    pub fn stuck_bound(&self) -> Duration {
        self.transaction_timeout + Duration::from_secs(30)
    }

    /// How long a member of `stage` that stopped heartbeating (killed, paused) keeps its
    /// partitions before its group gives them to the others: the session of the stage's protocol,
    /// the client's [`Self::session_timeout`] under classic, the broker's
    /// [`Self::consumer_session_timeout`] under consumer.
    pub fn session(&self, stage: Stage) -> Duration {
        match self.group_protocols.of(stage) {
            GroupProtocol::Classic => self.session_timeout,
            GroupProtocol::Consumer => self.consumer_session_timeout,
        }
    }

    /// How long a zombie of `stage` is paused: beyond its transaction timeout, so that the
    /// coordinator aborts its transaction, and beyond its session, so that its group has moved on
    /// when it wakes (and fences it), by 10 s. A broker bounce or a coordinator kill that ends
    /// while it is paused counts this pause again from its end
    /// ([`super::stages::Stages::coordinator_moved`]): the group's new coordinator starts every
    /// member's session again.
    pub fn zombie_pause(&self, stage: Stage) -> Duration {
        self.transaction_timeout.max(self.session(stage)) + Duration::from_secs(10)
    }

    /// The stages this run starts.
    pub fn stages(&self) -> Vec<Stage> {
        if self.downstream.is_some() {
            Stage::ALL.to_vec()
        } else {
            vec![Stage::Pipeline]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ChaosOptions, GroupProtocols, Stage};
    use crate::kafka::config::GroupProtocol;
    use crate::kafka::KafkaConfig;
    use std::time::Duration;

    fn short() -> ChaosOptions {
        let cluster = super::Cluster {
            kafka_sh: "kafka.sh".into(),
            kafka: KafkaConfig::new("h:1"),
            brokers: 3,
        };
        ChaosOptions::short(cluster, "alert-pipeline".into(), 7)
    }

    /// A zombie wakes after its transaction timed out and after its group expired it, whichever
    /// protocol its stage speaks: the classic session is the client's 10 s, the consumer one the
    /// broker's 45 s (the cluster's default), so the pause follows the longer.
    #[test]
    fn the_zombie_outlasts_the_session_of_its_stage_protocol() {
        let mut o = short();
        assert_eq!(o.session(Stage::Pipeline), Duration::from_secs(10));
        assert_eq!(o.zombie_pause(Stage::Pipeline), Duration::from_secs(40));
        o.group_protocols = GroupProtocols::all(GroupProtocol::Classic);
        o.group_protocols.set(Stage::Sink, GroupProtocol::Consumer);
        assert_eq!(o.session(Stage::Sink), Duration::from_secs(45));
        assert_eq!(o.zombie_pause(Stage::Sink), Duration::from_secs(55));
        assert_eq!(o.zombie_pause(Stage::Deliver), Duration::from_secs(40));
        // A cluster configured otherwise: the pause follows what the run read from it.
        o.consumer_session_timeout = Duration::from_secs(60);
        assert_eq!(o.zombie_pause(Stage::Sink), Duration::from_secs(70));
        for stage in Stage::ALL {
            assert!(
                o.zombie_pause(stage) > o.session(stage).max(o.transaction_timeout),
                "{stage:?}"
            );
        }
    }
}
