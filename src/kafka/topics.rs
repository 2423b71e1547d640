//! Topic names of one deployment and their creation.
//!
//! The processor creates what it needs when missing: the state changelog compacted and with the
//! input's partition count (restoring input partition p reads changelog partition p, so the two
//! counts must match), the notifications and DLQ topics with the input's count as a sensible
//! default. An existing changelog with another partition count is refused: using it would restore
//! the wrong state. Lacking the right to create a topic is reported as such.
//!
//! The DLQ is created with an explicit `retention.ms` ([`DEFAULT_DLQ_RETENTION`], or the
//! deployment's own): its records are raw payloads that failed, kept long enough to be inspected
//! and replayed, not for ever, and not at whatever the broker's default happens to be. An existing
//! topic is never altered.
//! The changelog is created with small segments and an eager cleaner, so that a restore reads
//! about one record per symbol; [`super::changelog`] says why and checks an existing changelog.
//!
//! Creating topics waits on the broker: metadata round trips, bounded by [`ADMIN_TIMEOUT`], and
//! the short sleeps between them while a new topic shows up. Those calls block, so the async
//! functions here make them on a thread of their own ([`super::blocking`]): the thread that polls
//! them, a tokio worker that may also serve `/healthz`, is never held up by a slow broker.
//!
//! Tests and benchmarks delete what they created ([`delete_topics`], and by their fresh prefix
//! with [`delete_topics_with_prefix`] or the [`DropTopics`] guard): the broker is shared, and every
//! partition left behind holds open files on it.

use super::blocking::off_runtime;
use super::changelog;
pub use super::cleanup::Cleanup;
use super::config::KafkaConfig;
use super::logging::Logged;
use super::read::{partition_count, partition_count_if_exists};
use anyhow::{anyhow, bail, Context as _};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::RDKafkaErrorCode;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The topics one processor reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    /// Ticks, key = symbol.
    pub input: String,
    /// Notifications, key = symbol.
    pub notifications: String,
    /// Compacted per-symbol state, partition-aligned with `input`.
    pub changelog: String,
    /// Dead-lettered ticks.
    pub dlq: String,
    /// `retention.ms` of the DLQ when it has to be created.
    pub dlq_retention: Duration,
}

/// How long dead letters are kept by default: two weeks, time for an incident to be fixed and its
/// dead letters replayed, after which raw payloads should not linger.
pub const DEFAULT_DLQ_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);

impl Topics {
    /// The names of docs/design.md: `market-updates`, `notifications`, `<app>-state`, `<input>.dlq`.
    pub fn standard(app_id: &str) -> Self {
        Self::with("market-updates".into(), "notifications".into(), app_id)
    }

    /// Names derived from an input and an output topic.
    pub fn with(input: String, notifications: String, app_id: &str) -> Self {
        Topics {
            dlq: format!("{input}.dlq"),
            changelog: format!("{app_id}-state"),
            input,
            notifications,
            dlq_retention: DEFAULT_DLQ_RETENTION,
        }
    }

    /// The standard names behind a prefix (tests and demos use a fresh prefix per run); a prefix
    /// that does not end in `-`, `.` or `_` gets a `-`.
    pub fn prefixed(prefix: &str, app_id: &str) -> Self {
        let prefix = separated(prefix);
        Self::with(
            format!("{prefix}market-updates"),
            format!("{prefix}notifications"),
            &format!("{prefix}{app_id}"),
        )
    }

    /// Every topic of the deployment (what a demo or benchmark deletes after its run).
    pub fn names(&self) -> [&str; 4] {
        [&self.input, &self.notifications, &self.changelog, &self.dlq]
    }
}

/// `prefix` ready to stand before a name: ending in `-`, `.` or `_` (a `-` is added otherwise),
/// or empty.
pub fn separated(prefix: &str) -> String {
    match prefix.chars().last() {
        None | Some('-' | '.' | '_') => prefix.to_owned(),
        Some(_) => format!("{prefix}-"),
    }
}

/// A short random suffix for fresh names (topics, groups, transactional ids) per run, so that
/// runs never share state.
pub fn unique_suffix() -> String {
    use rand::Rng;
    let n: u32 = rand::rng().random();
    format!("{n:08x}")
}

/// A topic to create if missing.
#[derive(Debug, Clone)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
    pub cleanup: Cleanup,
    /// `retention.ms`; `None`: the broker's default.
    pub retention: Option<Duration>,
}

/// Creates the topics that do not exist yet. Replication factor: the broker's default.
pub async fn create_topics(kafka: &KafkaConfig, specs: &[TopicSpec]) -> anyhow::Result<()> {
    let admin: AdminClient<Logged> = kafka
        .admin()
        .create_with_context(Logged)
        .context("creating an admin client")?;
    // NewTopic borrows its config values: the strings live here, beside it.
    let configs: Vec<Vec<(&str, String)>> = specs
        .iter()
        .map(|s| {
            let mut c = s.cleanup.configs();
            if let Some(r) = s.retention {
                c.push(("retention.ms", r.as_millis().to_string()));
            }
            c
        })
        .collect();
    let new: Vec<NewTopic<'_>> = specs
        .iter()
        .zip(&configs)
        .map(|(s, configs)| {
            configs.iter().fold(
                NewTopic::new(&s.name, s.partitions, TopicReplication::Fixed(-1)),
                |t, (k, v)| t.set(k, v),
            )
        })
        .collect();
    let results = admin
        .create_topics(
            &new,
            &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)),
        )
        .await
        .context("creating topics")?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((
                name,
                RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed,
            )) => {
                // Named as the start-up check names a missing right; the other way out is an
                // operator creating the topic beforehand.
                let missing = super::access::Missing {
                    operation: "Create",
                    resource: "Topic",
                    name,
                };
                return Err(anyhow::Error::new(super::access::AccessError::new(
                    kafka,
                    vec![missing],
                ))
                .context("a topic it needs is missing, and it may not create it"));
            }
            Err((name, code)) => bail!("cannot create topic {name}: {code}"),
        }
    }
    Ok(())
}

/// Deletes topics (tests and demos clean up after themselves); missing ones are fine.
pub async fn delete_topics(kafka: &KafkaConfig, names: &[&str]) -> anyhow::Result<()> {
    let admin: AdminClient<Logged> = kafka.admin().create_with_context(Logged)?;
    let results = admin
        .delete_topics(
            names,
            &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)),
        )
        .await?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((name, code)) => bail!("cannot delete topic {name}: {code}"),
        }
    }
    Ok(())
}

/// Deletes every topic whose name starts with `prefix`; returns how many there were. For tests and
/// benchmarks, whose names carry a fresh random prefix: the prefix also catches the topics their
/// child processes created (a changelog, a DLQ, retry buckets, a replay ledger). An empty prefix
/// is refused: it would name every topic of the cluster.
pub async fn delete_topics_with_prefix(kafka: &KafkaConfig, prefix: &str) -> anyhow::Result<usize> {
    if prefix.is_empty() {
        bail!("refusing to delete topics by an empty prefix: that is every topic");
    }
    let probe = Metadata::new(kafka)?;
    let names = probe.topics_with_prefix(prefix).await?;
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    if !names.is_empty() {
        delete_topics(kafka, &names).await?;
    }
    Ok(names.len())
}

/// Deletes the topics of its prefix ([`delete_topics_with_prefix`]) when dropped, however the
/// scope ends: a failed assertion unwinds through it too. How a test leaves the shared broker as
/// it found it; without it every run of the suite left some 500 partitions behind, until the
/// broker ran out of file descriptors.
#[must_use = "the topics are deleted when this guard is dropped: bind it to a named variable"]
pub struct DropTopics {
    kafka: KafkaConfig,
    prefix: String,
}

impl DropTopics {
    /// A guard for the topics named `<prefix>…` (the prefix must not be empty).
    pub fn with_prefix(kafka: &KafkaConfig, prefix: &str) -> Self {
        DropTopics {
            kafka: kafka.clone(),
            prefix: prefix.to_owned(),
        }
    }
}

impl Drop for DropTopics {
    fn drop(&mut self) {
        // Blocking is fine here: the admin request is driven by librdkafka's own threads, not by
        // the caller's runtime, and a drop cannot report an error but by logging it.
        if let Err(e) =
            futures::executor::block_on(delete_topics_with_prefix(&self.kafka, &self.prefix))
        {
            warn!(prefix = %self.prefix, error = format!("{e:#}"), "topics not deleted");
        }
    }
}

/// Makes sure every topic of `topics` exists: the input must (or is created with
/// `input_partitions` when given), the others are created to match it. Returns the input's
/// partition count.
pub async fn ensure(
    kafka: &KafkaConfig,
    topics: &Topics,
    input_partitions: Option<i32>,
) -> anyhow::Result<i32> {
    let probe = Metadata::new(kafka)?;
    let input = match probe.partition_count(&topics.input).await {
        Ok(n) => n,
        Err(e) => {
            let Some(n) = input_partitions else {
                return Err(e.context(format!("input topic {} is missing", topics.input)));
            };
            create_topics(
                kafka,
                &[TopicSpec {
                    name: topics.input.clone(),
                    partitions: n,
                    cleanup: Cleanup::Delete,
                    retention: None,
                }],
            )
            .await?;
            probe.wait_for_partitions(&topics.input).await?
        }
    };
    let specs = [
        TopicSpec {
            name: topics.notifications.clone(),
            partitions: input,
            cleanup: Cleanup::Delete,
            retention: None,
        },
        TopicSpec {
            name: topics.changelog.clone(),
            partitions: input,
            cleanup: Cleanup::CompactedState,
            retention: None,
        },
        TopicSpec {
            name: topics.dlq.clone(),
            partitions: input,
            cleanup: Cleanup::Delete,
            retention: Some(topics.dlq_retention),
        },
    ];
    let mut missing = Vec::new();
    for s in &specs {
        if probe.partition_count(&s.name).await.is_err() {
            missing.push(s.clone());
        }
    }
    if !missing.is_empty() {
        create_topics(kafka, &missing).await?;
    }
    if !missing.iter().any(|s| s.name == topics.changelog) {
        changelog::warn_of_drift(kafka, &topics.changelog).await;
    }
    let changelog = probe.wait_for_partitions(&topics.changelog).await?;
    if changelog != input {
        return Err(anyhow!(
            "changelog {} has {changelog} partitions but input {} has {input}: restoring partition p reads \
             changelog partition p, so they must match",
            topics.changelog,
            topics.input
        ));
    }
    Ok(input)
}

/// Creates `spec`'s topic unless it exists; returns its partition count (the existing topic's,
/// which may differ from the spec's).
pub async fn ensure_topic(kafka: &KafkaConfig, spec: &TopicSpec) -> anyhow::Result<i32> {
    let probe = Metadata::new(kafka)?;
    if let Some(n) = probe.partition_count_if_exists(&spec.name).await? {
        return Ok(n);
    }
    create_topics(kafka, std::slice::from_ref(spec)).await?;
    probe.wait_for_partitions(&spec.name).await
}

/// The partition count of `topic`, which must exist, asked off the caller's thread.
pub async fn partition_count_of(kafka: &KafkaConfig, topic: &str) -> anyhow::Result<i32> {
    Metadata::new(kafka)?.partition_count(topic).await
}

/// Makes sure the live alerts' rules topic exists with the input's partition count (creating it
/// compacted and stamped by the broker, [`Cleanup::RulesTable`]); refuses one with another count:
/// an alert lives in the partition of its symbol's ticks, and the instance that owns input
/// partition p reads rules partition p only.
pub async fn ensure_rules(
    kafka: &KafkaConfig,
    rules: &str,
    input: &str,
    partitions: i32,
) -> anyhow::Result<()> {
    let n = ensure_topic(
        kafka,
        &TopicSpec {
            name: rules.to_owned(),
            partitions,
            cleanup: Cleanup::RulesTable,
            retention: None,
        },
    )
    .await?;
    if n != partitions {
        bail!(
            "rules topic {rules} has {n} partitions but input {input} has {partitions}: an alert lives in \
             the partition of its symbol's ticks, so the two must be co-partitioned (same count, the \
             symbol hashed with murmur2); recreate {rules} with {partitions} partitions and load the alerts again"
        );
    }
    Ok(())
}

/// A metadata client whose blocking requests run on threads of their own (module doc): each
/// method is one bounded round trip, or the bounded wait of [`wait_for_partitions`].
struct Metadata {
    probe: Arc<BaseConsumer<Logged>>,
}

impl Metadata {
    fn new(kafka: &KafkaConfig) -> anyhow::Result<Self> {
        let probe: BaseConsumer<Logged> = kafka
            .admin()
            .create_with_context(Logged)
            .context("creating a metadata client")?;
        Ok(Metadata {
            probe: Arc::new(probe),
        })
    }

    /// `call` with the client, off the caller's thread; its error is the call's own.
    async fn ask<T: Send + 'static>(
        &self,
        name: &str,
        call: impl FnOnce(&BaseConsumer<Logged>) -> anyhow::Result<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let probe = Arc::clone(&self.probe);
        off_runtime(name, move || call(&probe)).await?
    }

    async fn partition_count(&self, topic: &str) -> anyhow::Result<i32> {
        let topic = topic.to_owned();
        self.ask("topic-metadata", move |p| {
            partition_count(p, &topic, ADMIN_TIMEOUT)
        })
        .await
    }

    async fn partition_count_if_exists(&self, topic: &str) -> anyhow::Result<Option<i32>> {
        let topic = topic.to_owned();
        self.ask("topic-metadata", move |p| {
            partition_count_if_exists(p, &topic, ADMIN_TIMEOUT)
        })
        .await
    }

    async fn wait_for_partitions(&self, topic: &str) -> anyhow::Result<i32> {
        let topic = topic.to_owned();
        self.ask("topic-metadata", move |p| wait_for_partitions(p, &topic))
            .await
    }

    /// The names of the cluster's topics that start with `prefix`.
    async fn topics_with_prefix(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        let prefix = prefix.to_owned();
        self.ask("topic-metadata", move |p| {
            let metadata = p
                .fetch_metadata(None, ADMIN_TIMEOUT)
                .context("listing topics")?;
            Ok(metadata
                .topics()
                .iter()
                .map(|t| t.name().to_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect())
        })
        .await
    }
}

/// Partition count of a topic that was just created: a broker answers CreateTopics before its
/// metadata shows the topic, so ask again for a bounded time. Blocking.
fn wait_for_partitions(probe: &BaseConsumer<Logged>, topic: &str) -> anyhow::Result<i32> {
    let deadline = std::time::Instant::now() + ADMIN_TIMEOUT;
    loop {
        match partition_count(probe, topic, ADMIN_TIMEOUT) {
            Ok(n) => return Ok(n),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_is_separated_from_the_names() {
        let t = Topics::prefixed("ux-demo", "txn-demo");
        assert_eq!(t.notifications, "ux-demo-notifications");
        assert_eq!(t.changelog, "ux-demo-txn-demo-state");
        assert_eq!(Topics::prefixed("run.", "a").input, "run.market-updates");
        assert_eq!(Topics::prefixed("", "a").input, "market-updates");
    }
}
