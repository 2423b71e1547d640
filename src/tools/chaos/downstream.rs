//! The stages after the pipeline in an all-stage run: alert-sink into a fresh PostgreSQL database
//! ([`database`](super::database)) and alert-deliver to the runner's own webhook subscribers
//! ([`subscribers`](super::subscribers)), both reading the pipeline's notifications.
//!
//! ```text
//!   pipeline ──► notifications ─┬─► alert-sink × N ──► PostgreSQL: alerts, sink_offsets
//!                               └─► alert-deliver × N ──► subscribers (one fails for a while)
//!                                      ▲        └──► <notifications>.retry.<delay> … .dlq, .parking-lot
//!                                      └───────────────┘ (the buckets are read again when due)
//!   drain: committed offsets of both groups (the sink's in its table) at the data ends of their
//!          inputs (the buckets included: every key settled)
//!   checks: alerts = oracle; accepted keys ⊎ given-up keys = oracle × subscribers; each given-up
//!           record once; no partition left behind
//! ```
//!
//! The oracle is the pipeline's: the notification ids the input implies
//! ([`crate::oracle::expected_from_input`]). Each subscriber receives every symbol, so its
//! expected keys are `<id>/<subscriber>` for every expected id. The failing subscriber recovers
//! well before its notifications run out of retry buckets, so normally nothing is given up; what
//! is given up (DLQ, parking lot) is still accounted for, once, instead of an acceptance.

use super::checks::{self, data_ends, left_behind};
use super::database::{Database, DatabaseDown};
use super::instances::Launch;
use super::plan::Stage;
use super::stages;
use super::subscribers::{Outage, Subscribers};
use super::ChaosOptions;
use crate::deliver::Buckets;
use crate::kafka::offsets::committed_offsets;
use crate::kafka::KafkaConfig;
use crate::oracle::{compare, VerifyReport};
use anyhow::Context as _;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// What an all-stage run adds to a pipeline-only one.
#[derive(Debug, Clone)]
pub struct DownstreamOptions {
    /// The `alert-sink` binary.
    pub sink: PathBuf,
    /// The `alert-deliver` binary.
    pub deliver: PathBuf,
    /// scripts/postgres.sh, which shuts the server down and starts it.
    pub postgres_sh: PathBuf,
    /// scripts/postgres.sh's state folder (`PG_STATE`): a server of the run's own, so that its
    /// shutdowns stop no other user's; `None`: the checkout's server.
    pub postgres_state: Option<PathBuf>,
    /// The server's URL; the run creates its own database there.
    pub database_url: String,
    pub sink_instances: usize,
    pub deliver_instances: usize,
    /// alert-deliver's `--buckets`. Their sum must exceed the subscriber's outage by a margin,
    /// so that its notifications are still in a bucket when it recovers.
    pub buckets: String,
    /// When the failing subscriber answers 503, from the start of the chaos.
    pub subscriber_outage: Outage,
    /// Longest time PostgreSQL stays down (drawn from 1 s up to this).
    pub max_database_down: Duration,
}

/// The subscribers: one steady, one failing for a while.
const SUBSCRIBERS: [&str; 2] = ["steady", "flaky"];

/// The downstream stages of a run, set up.
pub struct Downstream {
    pub db: Database,
    pub subscribers: Subscribers,
    /// alert-sink's group (its offsets are stored in the database, and committed to Kafka).
    pub sink_group: String,
    /// alert-deliver's group, on the notifications and its buckets.
    pub deliver_group: String,
    pub notifications: String,
    /// The deliverer's topics: buckets, DLQ and parking lot.
    pub buckets: Buckets,
    /// The subscriptions file given to every deliverer.
    subscriptions: PathBuf,
}

impl Downstream {
    /// Creates the run's database (with the sink's tables), starts the subscribers and writes
    /// the subscriptions file.
    pub fn set_up(
        opts: &DownstreamOptions,
        app_id: &str,
        notifications: &str,
        name: &str,
        work_dir: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let db = Database {
            postgres_sh: opts.postgres_sh.clone(),
            postgres_state: opts.postgres_state.clone(),
            admin_url: opts.database_url.clone(),
            name: name.to_owned(),
        };
        db.create()?;
        let migrate = db.options(false)?;
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(crate::sink::migrate_only(&migrate))
            .context("creating the sink's tables")?;
        let subscribers = Subscribers::start(&SUBSCRIBERS, "flaky")?;
        let subscriptions = work_dir.join("subscriptions.toml");
        std::fs::write(&subscriptions, subscribers.subscriptions_toml())
            .with_context(|| format!("writing {}", subscriptions.display()))?;
        Ok(Downstream {
            db,
            subscribers,
            sink_group: format!("{app_id}-sink"),
            deliver_group: format!("{app_id}-deliver"),
            notifications: notifications.to_owned(),
            buckets: Buckets::parse(notifications, &opts.buckets).context("the buckets")?,
            subscriptions,
        })
    }

    /// The deliverer's own topics: its buckets, DLQ and parking lot.
    pub fn deliver_topics(&self) -> Vec<String> {
        let mut t = self.buckets.bucket_topics();
        t.extend([self.buckets.dlq(), self.buckets.parking_lot()]);
        t
    }

    /// The transactional id of deliverer `instance` (as alert-deliver makes it).
    pub fn deliver_transactional_id(&self, instance: usize) -> String {
        format!("{}-{instance}", self.deliver_group)
    }

    /// How the sink and deliver instances are started ([`stages::launch`]): their group and
    /// input, and the deliverer's subscribers, buckets and timeouts.
    pub fn launches(
        &self,
        opts: &ChaosOptions,
        down: &DownstreamOptions,
    ) -> anyhow::Result<Vec<(Launch, usize)>> {
        let sink = stages::launch(
            opts,
            Stage::Sink,
            &down.sink,
            &["--topic", &self.notifications, "--group", &self.sink_group],
            vec![("DATABASE_URL".to_owned(), self.db.url())],
        )?;
        let deliver = stages::launch(
            opts,
            Stage::Deliver,
            &down.deliver,
            &[
                "--topic",
                &self.notifications,
                "--group",
                &self.deliver_group,
                "--subscriptions",
                &self.subscriptions.display().to_string(),
                "--buckets",
                &down.buckets,
                "--transaction-timeout",
                &stages::ms(opts.transaction_timeout),
                // A local subscriber answers in milliseconds; a loaded machine gets seconds.
                "--http-connect-timeout",
                "1s",
                "--http-timeout",
                "5s",
            ],
            Vec::new(),
        )?;
        Ok(vec![
            (sink, down.sink_instances),
            (deliver, down.deliver_instances),
        ])
    }

    /// The group of `stage`'s instances.
    pub fn group(&self, stage: Stage) -> Option<&str> {
        match stage {
            Stage::Sink => Some(&self.sink_group),
            Stage::Deliver => Some(&self.deliver_group),
            Stage::Pipeline => None,
        }
    }

    /// The partitions the sink or the deliverer has not consumed to their data end yet (empty:
    /// both are done). The committed offsets are read before the data ends: a hand-off written
    /// in between is then counted as not consumed, never the other way round.
    pub fn left_behind(&self, kafka: &KafkaConfig) -> anyhow::Result<Vec<String>> {
        let stored = self
            .db
            .stored_offsets(&self.sink_group, &self.notifications)?;
        let mut deliver_inputs = vec![self.notifications.clone()];
        deliver_inputs.extend(self.buckets.bucket_topics());
        let committed = deliver_inputs
            .iter()
            .map(|t| committed_offsets(kafka, &self.deliver_group, t))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut behind = left_behind(
            &format!("{} (sink_offsets)", self.sink_group),
            &self.notifications,
            |p| stored.get(&p).copied(),
            &data_ends(kafka, &self.notifications)?,
        );
        for (topic, committed) in deliver_inputs.iter().zip(&committed) {
            behind.extend(left_behind(
                &self.deliver_group,
                topic,
                |p| committed.get(p as usize).copied().flatten(),
                &data_ends(kafka, topic)?,
            ));
        }
        Ok(behind)
    }

    /// The checks, once every instance has stopped.
    pub fn check(
        &self,
        kafka: &KafkaConfig,
        expected: &[String],
    ) -> anyhow::Result<DownstreamChecks> {
        let mut table = VerifyReport::default();
        let stored = self.db.stored_ids()?;
        table.found = stored.values().sum();
        compare(&mut table, expected, &stored);
        let dlq = checks::given_up(kafka, &self.buckets.dlq())?;
        let parked = checks::given_up(kafka, &self.buckets.parking_lot())?;
        let subscribers = self
            .subscribers
            .names()
            .iter()
            .map(|name| {
                let seen = self.subscribers.seen(name);
                let want: BTreeSet<String> =
                    expected.iter().map(|id| format!("{id}/{name}")).collect();
                let mut c =
                    subscriber_check(name, &want, &seen.accepted, &dlq, &parked, &seen.requests);
                c.refused = seen.refused;
                c
            })
            .collect();
        Ok(DownstreamChecks {
            table,
            subscribers,
            dlq: dlq.values().sum(),
            parked: parked.values().sum(),
            left_behind: self.left_behind(kafka)?,
            failing: self.subscribers.failing().to_owned(),
        })
    }
}

/// One subscriber's keys against the oracle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscriberCheck {
    pub name: String,
    pub expected: u64,
    pub accepted: u64,
    /// Requests in all (at least once: a repeated batch sends a key again).
    pub requests: u64,
    /// Requests the subscriber refused (503) during its outage.
    pub refused: u64,
    /// Keys given up (DLQ or parking lot) instead of accepted.
    pub given_up: u64,
    /// Expected keys neither accepted nor given up.
    pub missing: Vec<String>,
    /// Keys given up more than once, or given up and accepted.
    pub duplicate: Vec<String>,
    /// Accepted or given-up keys of no expected notification.
    pub unexpected: Vec<String>,
}

impl SubscriberCheck {
    pub fn ok(&self) -> bool {
        self.missing.is_empty() && self.duplicate.is_empty() && self.unexpected.is_empty()
    }
}

/// The keys of subscriber `name`: each expected key accepted, or given up once (DLQ or parking
/// lot), never both; nothing else.
fn subscriber_check(
    name: &str,
    want: &BTreeSet<String>,
    accepted: &BTreeSet<String>,
    dlq: &BTreeMap<String, u64>,
    parked: &BTreeMap<String, u64>,
    requests: &BTreeMap<String, u64>,
) -> SubscriberCheck {
    let suffix = format!("/{name}");
    let mut given: BTreeMap<&String, u64> = BTreeMap::new();
    for (k, n) in dlq.iter().chain(parked) {
        if k.ends_with(&suffix) {
            *given.entry(k).or_default() += n;
        }
    }
    let duplicate = given
        .iter()
        .filter(|(k, n)| **n > 1 || accepted.contains(**k))
        .map(|(k, n)| format!("{k} (given up {n}×, accepted: {})", accepted.contains(*k)))
        .collect();
    let unexpected = accepted
        .iter()
        .chain(given.keys().copied())
        .filter(|k| !want.contains(*k))
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    SubscriberCheck {
        name: name.to_owned(),
        expected: want.len() as u64,
        accepted: accepted.len() as u64,
        requests: requests.values().sum(),
        given_up: given.values().sum(),
        refused: 0,
        missing: want
            .iter()
            .filter(|k| !accepted.contains(*k) && !given.contains_key(k))
            .cloned()
            .collect(),
        duplicate,
        unexpected,
    }
}

/// What the downstream checks found.
#[derive(Debug, Clone)]
pub struct DownstreamChecks {
    /// The `alerts` table against the oracle.
    pub table: VerifyReport,
    pub subscribers: Vec<SubscriberCheck>,
    /// Records in alert-deliver's DLQ and parking lot.
    pub dlq: u64,
    pub parked: u64,
    /// Partitions the sink or the deliverer left behind.
    pub left_behind: Vec<String>,
    /// The subscriber that failed for a while.
    pub failing: String,
}

impl DownstreamChecks {
    pub fn ok(&self) -> bool {
        self.table.missing.is_empty()
            && self.table.duplicate.is_empty()
            && self.table.unexpected.is_empty()
            && self.subscribers.iter().all(SubscriberCheck::ok)
            && self.left_behind.is_empty()
    }
}

/// The downstream part of a run's report.
#[derive(Debug, Clone)]
pub struct DownstreamReport {
    pub database_downs: Vec<DatabaseDown>,
    pub checks: DownstreamChecks,
}

impl fmt::Display for DownstreamReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.checks;
        writeln!(
            f,
            "{:<22} {} immediate shutdowns",
            "PostgreSQL",
            self.database_downs.len()
        )?;
        for d in &self.database_downs {
            writeln!(
                f,
                "  down {:.1}s, accepting connections again {:.1}s after its start",
                d.down.as_secs_f64(),
                d.recovered.as_secs_f64()
            )?;
        }
        let t = &c.table;
        writeln!(
            f,
            "{:<22} expected {}, rows {}, missing {}, duplicate {}, unexpected {}",
            "alerts table",
            t.expected,
            t.found,
            t.missing.len(),
            t.duplicate.len(),
            t.unexpected.len()
        )?;
        for s in &c.subscribers {
            let failing = if s.name == c.failing {
                " (failed for a while)"
            } else {
                ""
            };
            writeln!(
                f,
                "  subscriber {}{failing}: expected {}, accepted {} ({} requests, {} refused), \
                 given up {}, missing {}, duplicate {}, unexpected {}",
                s.name,
                s.expected,
                s.accepted,
                s.requests,
                s.refused,
                s.given_up,
                s.missing.len(),
                s.duplicate.len(),
                s.unexpected.len()
            )?;
        }
        writeln!(
            f,
            "{:<22} {} in the DLQ, {} in the parking lot",
            "deliver given up", c.dlq, c.parked
        )?;
        writeln!(
            f,
            "{:<22} {}",
            "sink/deliver behind",
            if c.left_behind.is_empty() {
                "none".to_owned()
            } else {
                c.left_behind.len().to_string()
            }
        )?;
        let problems = c
            .left_behind
            .iter()
            .chain(t.missing.iter().take(5))
            .chain(t.unexpected.iter().take(5))
            .chain(c.subscribers.iter().flat_map(|s| {
                s.missing
                    .iter()
                    .take(5)
                    .chain(s.duplicate.iter().take(5))
                    .chain(s.unexpected.iter().take(5))
            }));
        for p in problems {
            writeln!(f, "  ! {p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(keys: &[&str]) -> BTreeSet<String> {
        keys.iter().map(|k| (*k).to_owned()).collect()
    }

    #[test]
    fn each_key_is_accepted_or_given_up_once_and_nothing_else() {
        let want = set(&["a/s", "b/s", "c/s", "d/s"]);
        let accepted = set(&["a/s", "b/s", "x/s"]);
        let dlq = BTreeMap::from([
            ("c/s".to_owned(), 1),
            ("b/s".to_owned(), 1),
            ("a/other".to_owned(), 1),
        ]);
        let parked = BTreeMap::new();
        let requests = BTreeMap::from([("a/s".to_owned(), 2), ("b/s".to_owned(), 1)]);
        let c = subscriber_check("s", &want, &accepted, &dlq, &parked, &requests);
        assert_eq!(c.missing, ["d/s"]);
        assert_eq!(c.duplicate.len(), 1, "b/s accepted and given up");
        assert_eq!(c.unexpected, ["x/s"]);
        assert_eq!((c.accepted, c.given_up, c.requests), (3, 2, 3));
        assert!(!c.ok());

        let clean = subscriber_check(
            "s",
            &want,
            &set(&["a/s", "b/s", "c/s"]),
            &BTreeMap::new(),
            &BTreeMap::from([("d/s".to_owned(), 1)]),
            &BTreeMap::new(),
        );
        assert!(clean.ok(), "{clean:?}");
    }
}
