//! What one processor instance is, and how the driver batches and stops it.
//!
//! Plain values, no command-line parsing: the CLI layer (`crate::cli`) maps its flags onto these,
//! and tests, the demo and the benchmarks build them directly. Test-only switches live in one
//! [`TestHooks`] value, off by default, so production settings never carry them by accident.

use crate::dlq::{FaultInjection, RetryPolicy};
use crate::kafka::config::DEFAULT_TRANSACTION_TIMEOUT;
use crate::kafka::topics::Topics;
use crate::kafka::KafkaConfig;
use crate::rules::Rules;
use std::sync::Arc;
use std::time::Duration;

/// Default commit interval: as Kafka Streams under exactly-once.
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_millis(100);
/// Default largest batch, in input records.
pub const DEFAULT_MAX_BATCH: u64 = 5_000;

/// The delivery guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Guarantee {
    /// Outputs, state and offsets in one transaction.
    #[default]
    ExactlyOnce,
    /// No transaction: outputs acknowledged, then offsets committed; a crash in between repeats
    /// the batch's outputs. It exists to compare against.
    AtLeastOnce,
}

/// Switches that only tests use to put a failure exactly where they want it. All off by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestHooks {
    /// Exit abruptly at the n-th commit, after the batch's outputs are in the log and before its
    /// offsets are committed: a crash placed between produce and commit.
    pub crash_before_commit: Option<u64>,
    /// With overlapped commits: the n-th commit fails (abortably, as a broker's refusal would)
    /// after its offsets, once the next batch has begun on the other producer, so that the
    /// failure must abort both.
    pub fail_commit_in_flight: Option<u64>,
    /// Abort every n-th transaction instead of committing it, as Kafka's own transactional
    /// copier test does, to prove that aborts lose and double nothing.
    pub abort_every: Option<u64>,
    /// Hang for ever once a shutdown is requested, instead of closing: a clean path stuck in a
    /// client call, which the shutdown bound must cut short.
    pub stall_on_shutdown: bool,
    /// Exit abruptly right after the first revoke of input partitions has been handled (its
    /// transaction closed, the partitions unassigned) and before the consumer rejoins: a crash
    /// between the two rounds of a cooperative rebalance.
    pub abort_after_revoke: bool,
    /// While this file exists, hold right before each `send_offsets_to_transaction` (see
    /// [`crate::kafka::hold`]): the test breaks the group coordinator meanwhile.
    pub hold_send_offsets: Option<std::path::PathBuf>,
    /// Every abort of an open transaction fails fatally without reaching the broker, as one
    /// answered INVALID_TXN_STATE does ([`crate::kafka::txn::TxnProducer::fail_next_abort`]).
    pub aborts_fail_fatally: bool,
    /// The watchdog's bound instead of [`crate::kafka::txn::stuck_bound`] (90 s by default): a
    /// test sees in seconds whether a wait counts as progress or as a stuck loop.
    pub watchdog_bound: Option<Duration>,
    /// Live alerts: while this file exists, the loop does not read the rules topic, so a held
    /// partition stays held until something else ends its hold (an abort, a revoke, a restart);
    /// the held partitions are written to `<FILE>.held` whenever they change
    /// ([`crate::pipeline::live`], "Freezing the rules reader").
    pub freeze_rules: Option<std::path::PathBuf>,
}

/// What one processor instance is.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Connection and pass-through properties.
    pub kafka: KafkaConfig,
    /// Application id: the consumer group, and the prefix of the transactional id.
    pub app_id: String,
    /// Instance id, stable across restarts of this instance: with the app id it makes the
    /// transactional id, so a restart fences its predecessor.
    pub instance_id: String,
    /// Topics read and written.
    pub topics: Topics,
    /// Alert thresholds per symbol (a rules file; empty with `rules_topic`).
    pub rules: Arc<Rules>,
    /// Live alerts: the rules topic joined with the ticks ([`crate::rules::live`]) instead of
    /// `rules`.
    pub rules_topic: Option<String>,
    /// Largest tick payload accepted; larger ones are dead-lettered as oversize.
    pub max_tick_bytes: usize,
    /// transaction.timeout.ms of the producer.
    pub transaction_timeout: Duration,
    /// Use static group membership (group.instance.id = transactional id). Off by default: a
    /// static member that dies between the two rounds of a cooperative rebalance can leave
    /// partitions without an owner (see `crate::cli::membership`).
    pub static_membership: bool,
    /// Exactly-once (transactions) or at-least-once (idempotent producer, offsets committed after
    /// the outputs are acknowledged).
    pub guarantee: Guarantee,
    /// Transactional producers taken in turn, one transaction each (exactly-once; 1 or 2). See
    /// [`super::producers`].
    pub txn_producers: usize,
    /// A batch's commit runs on a thread of its own while the next batch fills on the other
    /// producer (exactly-once with two producers; see [`super::overlap`]).
    pub overlap_commits: bool,
    /// Bounds of the inline retry of a failing tick.
    pub retry: RetryPolicy,
    /// Deterministic fault injection (off by default).
    pub faults: FaultInjection,
    /// Test-only failure switches (off by default).
    pub hooks: TestHooks,
}

impl EngineSettings {
    /// Settings with the defaults of everything but the deployment's names and rules.
    pub fn new(
        kafka: KafkaConfig,
        app_id: &str,
        instance_id: &str,
        topics: Topics,
        rules: Arc<Rules>,
    ) -> Self {
        EngineSettings {
            kafka,
            app_id: app_id.to_owned(),
            instance_id: instance_id.to_owned(),
            topics,
            rules,
            rules_topic: None,
            max_tick_bytes: crate::tick::DEFAULT_MAX_TICK_BYTES,
            transaction_timeout: DEFAULT_TRANSACTION_TIMEOUT,
            static_membership: false,
            guarantee: Guarantee::ExactlyOnce,
            txn_producers: DEFAULT_TXN_PRODUCERS,
            overlap_commits: false,
            retry: RetryPolicy::default(),
            faults: FaultInjection::default(),
            hooks: TestHooks::default(),
        }
    }

    pub fn group_id(&self) -> &str {
        &self.app_id
    }

    /// The transactional id of the instance's first producer: `<app>-<instance>`.
    pub fn transactional_id(&self) -> String {
        format!("{}-{}", self.app_id, self.instance_id)
    }

    /// The transactional ids of the instance's producers: the first is
    /// [`Self::transactional_id`], the next ones add `#<n>` (n from 2). No instance id may hold a
    /// `#` ([`Self::check_instance_id`]), so no id of one instance can be an id of another.
    pub fn transactional_ids(&self) -> Vec<String> {
        let first = self.transactional_id();
        (1..=self.txn_producers.max(1))
            .map(|n| {
                if n == 1 {
                    first.clone()
                } else {
                    format!("{first}#{n}")
                }
            })
            .collect()
    }

    /// Refuses an instance id that could make one instance's transactional id another's: one
    /// with a `#`. Whatever its own number of producers, since the replicas of one deployment may
    /// differ in theirs while it rolls out.
    pub fn check_instance_id(&self) -> anyhow::Result<()> {
        if self.instance_id.contains('#') {
            anyhow::bail!(
                "instance id {:?} holds a '#', which names a second producer's transactional id (<app>-<instance>#2): choose an id without one",
                self.instance_id
            );
        }
        Ok(())
    }
}

/// Transactional producers an instance takes in turn, by default: two, so that a batch does not
/// wait for the previous commit's markers (bench/RESULTS.md section 14).
pub const DEFAULT_TXN_PRODUCERS: usize = 2;

/// How the long-running processor batches and stops.
#[derive(Debug, Clone)]
pub struct PipelineOptions {
    pub engine: EngineSettings,
    /// Commit when the open transaction is this old.
    pub commit_interval: Duration,
    /// Commit when the open transaction holds this many input records.
    pub max_batch: u64,
    /// How long shutdown may take before the process gives up and exits non-zero.
    pub shutdown_timeout: Duration,
    /// Partitions of the input topic if it has to be created.
    pub input_partitions: Option<i32>,
    /// Stop once assigned, restored and with nothing to read for this long, with nothing open
    /// (demos and benchmarks).
    pub exit_when_idle: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(instance: &str, producers: usize) -> EngineSettings {
        EngineSettings {
            txn_producers: producers,
            ..EngineSettings::new(
                KafkaConfig::new("127.0.0.1:9092"),
                "app",
                instance,
                Topics::standard("app"),
                Arc::new(Rules::from_pairs(
                    Vec::<(String, Vec<rust_decimal::Decimal>)>::new(),
                )),
            )
        }
    }

    #[test]
    fn the_first_producer_keeps_the_transactional_id_of_one() {
        assert_eq!(settings("pod-1", 1).transactional_ids(), ["app-pod-1"]);
        assert_eq!(
            settings("pod-1", 2).transactional_ids(),
            ["app-pod-1", "app-pod-1#2"]
        );
    }

    #[test]
    fn an_instance_id_that_could_name_another_instances_second_producer_is_refused() {
        // "pod#2" would be app-pod#2: the second producer of instance "pod", also while "pod#2"
        // itself runs one producer and "pod" two.
        for producers in [1, 2] {
            let err = settings("pod#2", producers)
                .check_instance_id()
                .unwrap_err();
            assert!(err.to_string().contains("'#'"), "{err}");
            assert!(settings("pod-2", producers).check_instance_id().is_ok());
        }
    }
}
