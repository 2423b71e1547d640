//! `alert-rules`: puts, deletes, lists and loads live alerts in the rules topic
//! ([`crate::rules::live`]) while the pipeline runs.
//!
//! Every write goes to the partition of the alert's symbol ([`partition_of`]: murmur2, as the
//! ticks' producers partition by symbol), waits for the broker's acknowledgement and says where
//! it went (partition, offset: the version the notifications will name). A write is refused with
//! the field and the reason before anything is sent. A delete finds the alert's partition by
//! reading the table first.

use crate::kafka::read::{partition_count_if_exists, reader};
use crate::kafka::rules::read_joins;
use crate::kafka::topics::{ensure_rules, ADMIN_TIMEOUT};
use crate::kafka::{Isolation, KafkaConfig};
use crate::rules::live::{check_alert_id, partition_of, rules_topic, Alert};
use crate::rules::Rules;
use anyhow::{anyhow, bail, Context as _};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// How long a write waits for its acknowledgement.
const ACK_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a write went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Ack {
    pub partition: i32,
    pub offset: i64,
}

/// An alert of the table, as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Listed {
    pub id: String,
    pub partition: i32,
    pub version: i64,
    #[serde(flatten)]
    pub alert: Alert,
}

/// The rules topic of an application, and its partition count (created co-partitioned with
/// `input` when missing).
pub struct RulesTopic {
    kafka: KafkaConfig,
    pub name: String,
    pub partitions: i32,
}

impl RulesTopic {
    /// Opens `name` (default `<app>-rules`), creating it with `input`'s partition count if missing.
    pub async fn open(
        kafka: &KafkaConfig,
        app_id: &str,
        name: Option<&str>,
        input: &str,
    ) -> anyhow::Result<Self> {
        let name = name.map_or_else(|| rules_topic(app_id), str::to_owned);
        let probe = reader(kafka, Isolation::ReadCommitted)?;
        let input_partitions = partition_count_if_exists(&probe, input, ADMIN_TIMEOUT)?
            .ok_or_else(|| {
                anyhow!(
                    "input topic {input} is missing: the rules topic is made co-partitioned with it \
                     (start alert-pipeline once, or name the input with --input)"
                )
            })?;
        ensure_rules(kafka, &name, input, input_partitions).await?;
        Ok(RulesTopic {
            kafka: kafka.clone(),
            name,
            partitions: input_partitions,
        })
    }

    fn producer(&self) -> anyhow::Result<FutureProducer<crate::kafka::logging::Logged>> {
        self.kafka
            .idempotent_producer()
            .create_with_context(crate::kafka::logging::Logged)
            .context("creating the rules producer")
    }

    /// Puts (creates or replaces) alert `id`.
    pub async fn put(&self, id: &str, alert: &Alert) -> anyhow::Result<Ack> {
        check_alert_id(id)?;
        alert.check()?;
        let producer = self.producer()?;
        let partition = partition_of(&alert.symbol, self.partitions);
        let value = alert.to_json();
        send(&producer, &self.name, partition, id, Some(&value)).await
    }

    /// Puts many alerts (a rules file), acknowledged together; returns how many per partition.
    pub async fn put_all(&self, alerts: &[(String, Alert)]) -> anyhow::Result<BTreeMap<i32, u64>> {
        let producer = self.producer()?;
        let mut per_partition = BTreeMap::new();
        for chunk in alerts.chunks(10_000) {
            let mut pending = Vec::with_capacity(chunk.len());
            for (id, alert) in chunk {
                check_alert_id(id)?;
                alert.check().with_context(|| format!("alert {id}"))?;
                let partition = partition_of(&alert.symbol, self.partitions);
                let value = alert.to_json();
                let record = FutureRecord::to(&self.name)
                    .partition(partition)
                    .key(id.as_str())
                    .payload(&value);
                let delivery = producer
                    .send_result(record)
                    .map_err(|(e, _)| anyhow!("sending alert {id}: {e}"))?;
                pending.push((id, delivery));
            }
            // Each delivery ends by librdkafka's message.timeout.ms at the latest (no runtime's
            // timer here: the chaos runner and the benchmarks call this from plain threads).
            for (id, delivery) in pending {
                let delivered = delivery
                    .await
                    .map_err(|_| anyhow!("alert {id}: the producer went away"))?
                    .map_err(|(e, _)| anyhow!("alert {id} not written: {e}"))?;
                *per_partition.entry(delivered.partition).or_default() += 1;
            }
        }
        Ok(per_partition)
    }

    /// Deletes alert `id` (a tombstone in its partition); an id not in the table is refused.
    pub async fn delete(&self, id: &str) -> anyhow::Result<Ack> {
        check_alert_id(id)?;
        let table = self.list()?;
        let Some(found) = table.iter().find(|l| l.id == id) else {
            bail!("no alert {id} in {}", self.name);
        };
        let producer = self.producer()?;
        send(&producer, &self.name, found.partition, id, None).await
    }

    /// Every alert in force once all records are applied, by id.
    pub fn list(&self) -> anyhow::Result<Vec<Listed>> {
        let mut joins = read_joins(&self.kafka, &self.name, self.partitions)?;
        let mut out = Vec::new();
        for (p, j) in &mut joins {
            // No record is later than the end of time, and no barrier is for offset -1: all apply.
            j.ready(i64::MAX, -1);
            out.extend(j.table().iter().map(|(symbol, e)| Listed {
                id: e.id.to_string(),
                partition: *p,
                version: e.version,
                alert: e.alert(symbol),
            }));
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }
}

/// Loads `alerts` into `<app_id>-rules` (created co-partitioned with `input` if missing), from a
/// plain thread (no runtime needed); returns the topic's name. The chaos runner and the
/// benchmarks load their rules so before the ticks.
pub fn load_blocking(
    kafka: &KafkaConfig,
    app_id: &str,
    input: &str,
    alerts: &[(String, Alert)],
) -> anyhow::Result<String> {
    let topic = futures::executor::block_on(RulesTopic::open(kafka, app_id, None, input))?;
    futures::executor::block_on(topic.put_all(alerts))?;
    Ok(topic.name)
}

async fn send(
    producer: &FutureProducer<crate::kafka::logging::Logged>,
    topic: &str,
    partition: i32,
    id: &str,
    value: Option<&Vec<u8>>,
) -> anyhow::Result<Ack> {
    let mut record = FutureRecord::<str, Vec<u8>>::to(topic)
        .partition(partition)
        .key(id);
    if let Some(v) = value {
        record = record.payload(v);
    }
    let delivered = producer
        .send(record, Timeout::After(ACK_TIMEOUT))
        .await
        .map_err(|(e, _)| anyhow!("writing alert {id} to {topic}: {e}"))?;
    Ok(Ack {
        partition: delivered.partition,
        offset: delivered.offset,
    })
}

/// One `alert-rules` command, its alert checked (and its subscriber known) before anything is
/// sent.
#[derive(Debug)]
pub enum Request {
    /// Creates or replaces alert `id`.
    Put { id: String, alert: Alert },
    /// Deletes alert `id`.
    Delete { id: String },
    /// Lists the alerts in force, as a table or, with `json`, as JSON.
    List { json: bool },
    /// Publishes a rules file: one alert per threshold, for `subscriber` if given.
    Load {
        file: PathBuf,
        subscriber: Option<String>,
    },
}

impl RulesTopic {
    /// Carries out `request` on this topic; returns the line that says what was done (where a
    /// write went, the table, what was loaded).
    pub async fn carry_out(&self, request: &Request) -> anyhow::Result<String> {
        Ok(match request {
            Request::Put { id, alert } => {
                let ack = self.put(id, alert).await?;
                format!(
                    "put {id} ({} {} {}) in {} partition {} at offset {} (its version)",
                    alert.symbol,
                    alert.direction.as_str(),
                    alert.threshold,
                    self.name,
                    ack.partition,
                    ack.offset
                )
            }
            Request::Delete { id } => {
                let ack = self.delete(id).await?;
                format!(
                    "deleted {id} in {} partition {} at offset {}",
                    self.name, ack.partition, ack.offset
                )
            }
            Request::List { json } => {
                let alerts = self.list()?;
                if *json {
                    serde_json::to_string_pretty(&alerts)?
                } else {
                    render(&alerts)
                }
            }
            Request::Load { file, subscriber } => {
                let rules = Rules::load(file)?;
                let alerts = alerts_of_file(&rules, subscriber.as_deref());
                let per_partition = self.put_all(&alerts).await?;
                format!(
                    "loaded {} alerts of {} symbols from {} into {}; per partition: {per_partition:?}",
                    alerts.len(),
                    rules.len(),
                    file.display(),
                    self.name
                )
            }
        })
    }
}

/// The alerts of a rules file: one per symbol and threshold, id `<SYMBOL>-<threshold>`, watching
/// both directions (what the file's thresholds mean), for `subscriber` if given.
pub fn alerts_of_file(rules: &Rules, subscriber: Option<&str>) -> Vec<(String, Alert)> {
    rules
        .symbols()
        .flat_map(|symbol| {
            rules
                .thresholds(symbol)
                .unwrap_or_default()
                .iter()
                .map(move |t| {
                    (
                        format!("{symbol}-{t}"),
                        Alert {
                            symbol: symbol.to_owned(),
                            threshold: *t,
                            direction: crate::rules::live::Watch::Both,
                            subscriber: subscriber.map(str::to_owned),
                            one_shot: false,
                            rearm_band: None,
                        },
                    )
                })
        })
        .collect()
}

/// The table as text: one alert a line, aligned.
pub fn render(alerts: &[Listed]) -> String {
    let mut out = format!(
        "{:<24} {:<10} {:<5} {:>14} {:>8} {:<8} {:<14} {:>4} {:>8}\n",
        "id", "symbol", "dir", "threshold", "band", "one-shot", "subscriber", "part", "version"
    );
    for l in alerts {
        let a = &l.alert;
        out.push_str(&format!(
            "{:<24} {:<10} {:<5} {:>14} {:>8} {:<8} {:<14} {:>4} {:>8}\n",
            l.id,
            a.symbol,
            a.direction.as_str(),
            a.threshold.to_string(),
            a.rearm_band.map_or("-".to_owned(), |b| b.to_string()),
            if a.one_shot { "yes" } else { "no" },
            a.subscriber.as_deref().unwrap_or("-"),
            l.partition,
            l.version
        ));
    }
    out.push_str(&format!("{} alerts", alerts.len()));
    out
}
