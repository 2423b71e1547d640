//! The cluster side of a chaos run: bouncing brokers of the local cluster of
//! `scripts/kafka.sh up --brokers N`, finding the coordinators to bounce, and asking Kafka's own
//! tools about hanging transactions.
//!
//! Brokers are stopped, killed and started through `scripts/kafka.sh broker K stop|kill|start`,
//! so the runner knows no JVM command line, pid file or port of its own. Coordinators are located
//! the way an operator would, with Kafka's tools from the same jars (`scripts/kafka.sh tool`):
//! `TransactionsCommand describe` names the broker that coordinates a transactional id (the
//! leader of its `__transaction_state` partition) and `ConsumerGroupCommand --describe --state`
//! the group coordinator (the leader of the group's `__consumer_offsets` partition). Each look-up
//! starts a JVM (about 2 s), which is why a bounce looks its target up on its own thread.
//!
//! Every failure here is an error with the command and its output: a chaos run whose cluster
//! control fails proves nothing, so the runner stops and says why.

use crate::kafka::KafkaConfig;
use anyhow::{anyhow, bail, Context as _};
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Kafka's transactions tool (describe, find-hanging).
const TRANSACTIONS_TOOL: &str = "org.apache.kafka.tools.TransactionsCommand";
/// Kafka's consumer-group tool (describe --state names the coordinator).
const GROUPS_TOOL: &str = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand";
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// The cluster of `scripts/kafka.sh up --brokers 3`, every broker.
pub const DEFAULT_CLUSTER_BOOTSTRAP: &str = "127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094";

/// How a broker is taken down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL: no controlled shutdown, leadership moves only once the controller fences it.
    Hard,
    /// SIGTERM: a controlled shutdown that moves leadership away first.
    Clean,
}

/// The local cluster, driven through `scripts/kafka.sh`.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// Path of `scripts/kafka.sh`.
    pub kafka_sh: PathBuf,
    /// Clients of the cluster (bootstrap = every broker).
    pub kafka: KafkaConfig,
    /// Number of brokers; their ids are 1..=brokers.
    pub brokers: i32,
}

impl Cluster {
    /// Runs `scripts/kafka.sh ARGS` and returns its stdout; fails with its stderr's last lines.
    fn script(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.kafka_sh)
            .args(args)
            .env("KAFKA_BROKERS", self.brokers.to_string())
            .output()
            .with_context(|| format!("running {}", self.kafka_sh.display()))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
            bail!(
                "kafka.sh {} failed ({}): {}",
                args.join(" "),
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs one of Kafka's tools against the cluster.
    fn tool(&self, class: &str, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["tool", class, "--bootstrap-server", &self.kafka.bootstrap];
        all.extend_from_slice(args);
        self.script(&all)
    }

    /// Takes broker `id` down.
    pub fn stop_broker(&self, id: i32, how: Stop) -> anyhow::Result<()> {
        let action = match how {
            Stop::Hard => "kill",
            Stop::Clean => "stop",
        };
        self.script(&["broker", &id.to_string(), action])
            .map(|_| ())
    }

    /// Starts broker `id` and waits until it is registered (kafka.sh bounds the wait).
    pub fn start_broker(&self, id: i32) -> anyhow::Result<()> {
        self.script(&["broker", &id.to_string(), "start"])
            .map(|_| ())
    }

    /// The broker that coordinates `transactional_id` (Kafka's `TransactionsCommand describe`).
    pub fn transaction_coordinator(&self, transactional_id: &str) -> anyhow::Result<i32> {
        let out = self.tool(
            TRANSACTIONS_TOOL,
            &["describe", "--transactional-id", transactional_id],
        )?;
        parse_transaction_coordinator(&out)
            .ok_or_else(|| anyhow!("no coordinator in the describe output: {out:?}"))
    }

    /// The broker that coordinates `group` (Kafka's `ConsumerGroupCommand --describe --state`).
    pub fn group_coordinator(&self, group: &str) -> anyhow::Result<i32> {
        // The tool exits 0 even when the describe fails; the output says.
        let out = self.tool(GROUPS_TOOL, &["--describe", "--group", group, "--state"])?;
        parse_group_coordinator(&out)
            .ok_or_else(|| anyhow!("no coordinator in the group describe output: {out:?}"))
    }

    /// The session of a consumer-protocol (KIP-848) member: every broker's
    /// `group.consumer.session.timeout.ms` (the longest, should they differ: any may coordinate a
    /// group), as `DescribeConfigs` gives it. One request per broker: librdkafka refuses a
    /// request that names two brokers' configs ("Conflicting use"), each being that broker's.
    pub fn consumer_session_timeout(&self) -> anyhow::Result<Duration> {
        use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
        const SESSION: &str = "group.consumer.session.timeout.ms";
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = self
            .kafka
            .admin()
            .create()
            .context("creating an admin client")?;
        let options = AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
        let mut longest = None;
        for broker in 1..=self.brokers {
            let results = futures::executor::block_on(
                admin.describe_configs(&[ResourceSpecifier::Broker(broker)], &options),
            )
            .with_context(|| format!("describing broker {broker}'s configs"))?;
            let resource = (results.into_iter().next())
                .ok_or_else(|| anyhow!("no configs of broker {broker} returned"))?
                .map_err(|code| anyhow!("describing broker {broker}'s configs: {code}"))?;
            let value = resource.get(SESSION).and_then(|e| e.value.clone());
            let ms: u64 = value
                .as_deref()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| anyhow!("broker {broker} gave no {SESSION}: {value:?}"))?;
            longest = longest.max(Some(Duration::from_millis(ms)));
        }
        longest.ok_or_else(|| anyhow!("no broker to describe"))
    }

    /// Open transactions on broker `id`'s partitions that their coordinator does not know
    /// (Kafka's `TransactionsCommand find-hanging`), at any age: the default looks only at those
    /// older than 15 minutes, longer than a chaos run. One line per hanging transaction.
    pub fn find_hanging(&self, id: i32) -> anyhow::Result<Vec<String>> {
        let out = self.tool(
            TRANSACTIONS_TOOL,
            &[
                "find-hanging",
                "--broker-id",
                &id.to_string(),
                "--max-transaction-timeout",
                "0",
            ],
        )?;
        Ok(hanging_rows(&out))
    }

    /// Whether every partition of every topic has a leader and all its replicas in sync: a
    /// bounced broker has caught up, so the next bounce cannot take a partition below its
    /// min.insync.replicas (an operator's rolling restart waits for the same).
    pub fn fully_replicated(&self) -> anyhow::Result<bool> {
        let probe: BaseConsumer = self
            .kafka
            .admin()
            .create()
            .context("creating a metadata client")?;
        let md = probe
            .fetch_metadata(None, METADATA_TIMEOUT)
            .context("fetching the cluster's metadata")?;
        if md.brokers().len() < self.brokers as usize {
            return Ok(false);
        }
        Ok(md
            .topics()
            .iter()
            .flat_map(|t| t.partitions())
            .all(|p| p.leader() >= 0 && p.isr().len() == p.replicas().len()))
    }

    /// Polls [`Cluster::fully_replicated`] until it holds, or fails after `timeout`.
    pub fn wait_fully_replicated(&self, timeout: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            // Metadata errors while a broker restarts are expected: ask again until the deadline.
            if self.fully_replicated().unwrap_or(false) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                bail!(
                    "the cluster was not fully replicated (every ISR complete) within {timeout:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Replication factor of each partition of `topic`.
    pub fn replication_factors(&self, topic: &str) -> anyhow::Result<Vec<usize>> {
        let probe: BaseConsumer = self
            .kafka
            .admin()
            .create()
            .context("creating a metadata client")?;
        // A broker that has just come back can answer for a topic with an error and no partitions
        // (its metadata not caught up yet): that is not the topic's replication, so ask again
        // until the answer has partitions, or report the error it kept giving.
        let deadline = Instant::now() + METADATA_TIMEOUT;
        loop {
            let md = probe
                .fetch_metadata(Some(topic), METADATA_TIMEOUT)
                .with_context(|| format!("metadata of {topic}"))?;
            let t = md.topics().iter().find(|t| t.name() == topic);
            let error = t.and_then(|t| t.error());
            let rf: Vec<usize> = t
                .iter()
                .flat_map(|t| t.partitions())
                .map(|p| p.replicas().len())
                .collect();
            if (error.is_none() && !rf.is_empty()) || Instant::now() >= deadline {
                if let (Some(e), true) = (error, rf.is_empty()) {
                    bail!(
                        "metadata of {topic}: {:?}",
                        rdkafka::error::RDKafkaErrorCode::from(e)
                    );
                }
                return Ok(rf);
            }
            std::thread::sleep(Duration::from_millis(200)); // the broker's metadata catching up
        }
    }
}

/// The CoordinatorId column of `TransactionsCommand describe` (a tab-separated header and row).
fn parse_transaction_coordinator(out: &str) -> Option<i32> {
    let mut lines = out.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next()?.split('\t').map(str::trim).collect();
    let col = header.iter().position(|h| *h == "CoordinatorId")?;
    lines.next()?.split('\t').nth(col)?.trim().parse().ok()
}

/// The `(id)` of the COORDINATOR (ID) column of `ConsumerGroupCommand --describe --state`.
fn parse_group_coordinator(out: &str) -> Option<i32> {
    let mut lines = out.lines().filter(|l| !l.trim().is_empty());
    lines.find(|l| l.contains("COORDINATOR (ID)"))?;
    let row = lines.next()?;
    let open = row.find('(')?;
    let close = open + row[open..].find(')')?;
    row[open + 1..close].trim().parse().ok()
}

/// The rows of `find-hanging` below its header.
fn hanging_rows(out: &str) -> Vec<String> {
    out.lines()
        .skip_while(|l| !l.starts_with("Topic"))
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinators_are_read_from_the_tools_output() {
        let describe =
            "CoordinatorId\tTransactionalId\tProducerId\tProducerEpoch\tTransactionState\n\
                        2\tapp-0\t1001\t3\tOngoing\n";
        assert_eq!(parse_transaction_coordinator(describe), Some(2));
        let group = "\nGROUP           COORDINATOR (ID)          ASSIGNMENT-STRATEGY  STATE           #MEMBERS\n\
                     app             127.0.0.1:19094 (3)       cooperative-sticky   Stable          3\n";
        assert_eq!(parse_group_coordinator(group), Some(3));
        assert_eq!(parse_group_coordinator("Error: Group app not found."), None);
        let hanging = "Topic\tPartition\tProducerId\tProducerEpoch\tCoordinatorEpoch\tStartOffset\tLastTimestamp\tDuration(min)\t\n";
        assert!(hanging_rows(hanging).is_empty());
        assert_eq!(
            hanging_rows(&format!("{hanging}t\t0\t5\t0\t1\t10\t0\t0\n")).len(),
            1
        );
    }
}
