//! The state changelog's topic settings, and the check of an existing changelog against them.
//!
//! Compaction alone does not bound a restore. The log cleaner never touches the active segment,
//! and with the broker's defaults (`segment.bytes` 1 GiB, `segment.ms` 7 days) a changelog
//! partition's active segment holds every state change of up to a week: a restore, which reads
//! the partition from its start, reads that history instead of one record per symbol (at the
//! measured 650,000 records/s, about 50 s for a full 1 GiB segment of ~33-byte records). So the
//! changelog is created ([`Cleanup::CompactedState`], by [`super::topics::ensure`]) with:
//! - `segment.ms` = [`STATE_SEGMENT_MS`](super::cleanup::STATE_SEGMENT_MS) (10 min) and `segment.bytes` = [`STATE_SEGMENT_BYTES`](super::cleanup::STATE_SEGMENT_BYTES)
//!   (16 MiB): the active segment, which a restore reads uncleaned, holds at most ten minutes or
//!   16 MiB of changes (about 0.8 s of restore per partition at worst); at the rates of this
//!   project the time bound is the one that applies. A segment rolls only when a record arrives
//!   after the bound, and the cleaner merges the segments it cleans, so an idle or a busy
//!   changelog does not pile up files (each segment holds an open file on the broker).
//! - `min.cleanable.dirty.ratio` = [`STATE_MIN_CLEANABLE_DIRTY_RATIO`](super::cleanup::STATE_MIN_CLEANABLE_DIRTY_RATIO) (0.1, the broker's is
//!   0.5): the cleaner starts once the uncleaned part is a tenth of the log, so outside the
//!   active segment a restore reads at most about 1.1 records per symbol instead of 2. The price
//!   is more cleaning passes over a log that is small (one record per symbol, a few MB for
//!   100,000 symbols).
//!
//! Kafka Streams sets only `cleanup.policy=compact` on its changelogs and keeps the broker's
//! segment settings (its repartition topics get 50 MB segments), because it restores from a local
//! state store's checkpoint and reads only the changes after it. This processor keeps no local
//! state: every assignment and every abort restores from offset 0, so the changelog's cleaned
//! size is what a restore costs.
//!
//! An existing changelog is not altered to these settings: altering needs the `AlterConfigs`
//! right, which the processor's least-privilege ACLs do not grant, and a topic created beforehand
//! is an operator's (or their tooling's) to manage; silently rewriting it would fight them.
//! Instead [`super::topics::ensure`] compares it and warns, naming each setting that makes
//! restores read more than these would, and the command that aligns it ([`changelog_drift`]). A
//! changelog whose policy deletes (`delete`, or `compact,delete`) is warned about too: the state
//! of a symbol quiet for longer than `retention.ms` disappears, and a restore then takes its next
//! tick for its first.

use super::cleanup::Cleanup;
use super::config::KafkaConfig;
use super::logging::Logged;
use anyhow::{anyhow, bail, Context as _};
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use std::time::Duration;
use tracing::{debug, warn};

/// Bound on the describe-configs round trip.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A setting of an existing changelog that lets restores read more than a changelog created here
/// would (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    pub setting: &'static str,
    /// Its value on the topic.
    pub found: String,
    /// What a changelog is created with.
    pub wanted: String,
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}={} (created with {})",
            self.setting, self.found, self.wanted
        )
    }
}

/// Compares an existing changelog's settings with those of [`Cleanup::CompactedState`]: every
/// one that lets a restore read more (a larger value, or no compaction at all). Smaller values are
/// an operator's stricter choice and pass. Needs the `DescribeConfigs` right on the topic.
pub async fn changelog_drift(kafka: &KafkaConfig, changelog: &str) -> anyhow::Result<Vec<Drift>> {
    let admin: AdminClient<Logged> = kafka
        .admin()
        .create_with_context(Logged)
        .context("creating an admin client")?;
    let results = admin
        .describe_configs(
            [&ResourceSpecifier::Topic(changelog)],
            &AdminOptions::new().request_timeout(Some(ADMIN_TIMEOUT)),
        )
        .await
        .context("describing the changelog's configs")?;
    let Some(result) = results.into_iter().next() else {
        bail!("no configs returned for {changelog}");
    };
    let resource = result.map_err(|code| anyhow!("describing {changelog}: {code}"))?;
    // rust-rdkafka drops a resource's own error (UNKNOWN_TOPIC_OR_PARTITION for a topic the
    // broker's metadata does not show yet, TOPIC_AUTHORIZATION_FAILED without DescribeConfigs)
    // and returns it without entries; a topic always has entries, so none means not answered.
    if resource.entries.is_empty() {
        bail!(
            "no configs of {changelog} returned: the broker does not know the topic (yet), or refused DescribeConfigs"
        );
    }
    Ok(drift_of(|name| {
        resource.get(name).and_then(|entry| entry.value.clone())
    }))
}

/// [`changelog_drift`] over the topic's config values, as `found` gives them.
fn drift_of(found: impl Fn(&str) -> Option<String>) -> Vec<Drift> {
    let mut drift = Vec::new();
    for (setting, wanted) in Cleanup::CompactedState.configs() {
        let Some(value) = found(setting) else {
            continue;
        };
        let looser = match setting {
            // `delete` (alone or beside `compact`) drops the state of symbols quiet for longer
            // than retention.ms.
            "cleanup.policy" => value.split(',').map(str::trim).ne(["compact"]),
            "min.cleanable.dirty.ratio" => {
                matches!((value.parse::<f64>(), wanted.parse::<f64>()), (Ok(v), Ok(w)) if v > w)
            }
            _ => matches!((value.parse::<u64>(), wanted.parse::<u64>()), (Ok(v), Ok(w)) if v > w),
        };
        if looser {
            drift.push(Drift {
                setting,
                found: value,
                wanted,
            });
        }
    }
    drift
}

/// Warns when an existing changelog's settings let restores read more than needed, with the
/// command that aligns them; never fails the start (the check is advice, and a least-privilege
/// principal may not be allowed to describe configs).
pub(super) async fn warn_of_drift(kafka: &KafkaConfig, changelog: &str) {
    match changelog_drift(kafka, changelog).await {
        Ok(drift) if drift.is_empty() => {}
        Ok(drift) => {
            let settings: Vec<String> = drift.iter().map(Drift::to_string).collect();
            let wanted: Vec<String> = drift
                .iter()
                .map(|d| format!("{}={}", d.setting, d.wanted))
                .collect();
            warn!(
                changelog,
                settings = %settings.join(", "),
                fix = %format!(
                    "kafka-configs.sh --bootstrap-server … --alter --entity-type topics --entity-name {changelog} --add-config {}",
                    wanted.join(",")
                ),
                "the existing changelog lets restores read more than one record per symbol (or loses state); it is not altered"
            );
        }
        Err(e) => debug!(
            changelog,
            error = format!("{e:#}"),
            "changelog settings not checked"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drift_against(configs: &[(&str, &str)]) -> Vec<&'static str> {
        drift_of(|name| {
            configs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
        .into_iter()
        .map(|d| d.setting)
        .collect()
    }

    #[test]
    fn a_changelog_with_the_brokers_segment_defaults_drifts_and_a_stricter_one_does_not() {
        let broker_defaults = [
            ("cleanup.policy", "compact"),
            ("segment.ms", "604800000"),
            ("segment.bytes", "1073741824"),
            ("min.cleanable.dirty.ratio", "0.5"),
        ];
        assert_eq!(
            drift_against(&broker_defaults),
            ["segment.ms", "segment.bytes", "min.cleanable.dirty.ratio"]
        );
        let created: Vec<(&str, String)> = Cleanup::CompactedState.configs();
        let created: Vec<(&str, &str)> = created.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert!(drift_against(&created).is_empty());
        let stricter = [
            ("cleanup.policy", "compact"),
            ("segment.ms", "60000"),
            ("segment.bytes", "1048576"),
            ("min.cleanable.dirty.ratio", "0.01"),
        ];
        assert!(drift_against(&stricter).is_empty());
        // Unknown or unreadable values are not guessed at.
        assert!(drift_against(&[("segment.ms", "soon")]).is_empty());
    }

    #[test]
    fn a_changelog_whose_policy_deletes_drifts() {
        for policy in ["delete", "compact,delete", "delete, compact"] {
            assert_eq!(
                drift_against(&[("cleanup.policy", policy)]),
                ["cleanup.policy"],
                "{policy}"
            );
        }
        assert!(drift_against(&[("cleanup.policy", "compact")]).is_empty());
    }
}
