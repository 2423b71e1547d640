//! `inspect`: what a DLQ holds, for the person deciding what to replay and what to discard.
//!
//! Reads the ledger and the DLQ (read_committed, from the beginning; it writes nothing and fences
//! no one) and counts the selected dead letters, handled and unhandled: in total, grouped by a
//! header ([`GROUPINGS`]), and the timestamps of the oldest and newest unhandled one. `show` lists
//! the headers of the first unhandled ones; their payload only when asked, since dead letters are
//! raw input that may hold what a terminal or a ticket should not.
//!
//! A grouping is a `(name, header)` pair, so another one is a line in [`GROUPINGS`]: alert-deliver's
//! DLQ and parking lot are grouped by `retry.subscriber` too.

use super::select::Selection;
use super::{class_of, now_ms, subscriber_of, table};
use crate::dlq::header;
use crate::dlq::ledger::{self, key_of};
use crate::kafka::read::{
    partition_count, read_partitions_to_end, reader, End, DEFAULT_READ_TIMEOUT,
};
use crate::kafka::{Isolation, KafkaConfig};
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::Message;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// How dead letters are grouped: (name in the output, header whose value is the group). A dead
/// letter without the header counts under `-`.
pub const GROUPINGS: &[(&str, &str)] = &[
    ("class", "dlq.error.class"),
    ("subscriber", crate::deliver::buckets::SUBSCRIBER),
    ("source_partition", "dlq.original.partition"),
];

/// What to inspect.
#[derive(Debug, Clone)]
pub struct InspectOptions {
    pub kafka: KafkaConfig,
    /// The dead-letter topic.
    pub dlq: String,
    /// Which dead letters count.
    pub select: Selection,
    /// Show the headers of the first this many unhandled dead letters.
    pub show: usize,
    /// Show their payloads too.
    pub payload: bool,
}

/// Handled and unhandled dead letters of a group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub handled: u64,
    pub unhandled: u64,
}

impl Counts {
    fn count(&mut self, handled: bool) {
        if handled {
            self.handled += 1;
        } else {
            self.unhandled += 1;
        }
    }
}

/// A dead letter's time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Moment {
    /// The record timestamp (RFC 3339).
    pub timestamp: String,
    /// Seconds from then to the inspection.
    pub age_seconds: f64,
}

/// One header of a shown dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShownHeader {
    pub key: String,
    /// The value as UTF-8 (invalid bytes replaced).
    pub value: String,
}

/// A dead letter shown in full, but for its payload unless asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shown {
    /// `dlq-topic/partition/offset`, its ledger key.
    pub coordinates: String,
    pub timestamp: Option<String>,
    pub headers: Vec<ShownHeader>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

/// What a DLQ holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inspection {
    pub dlq: String,
    /// Its replay ledger.
    pub ledger: String,
    /// Every selected dead letter.
    pub total: Counts,
    /// Per grouping of [`GROUPINGS`], per value.
    pub by: BTreeMap<String, BTreeMap<String, Counts>>,
    pub oldest_unhandled: Option<Moment>,
    pub newest_unhandled: Option<Moment>,
    /// The first unhandled dead letters, as many as asked.
    pub shown: Vec<Shown>,
}

/// Inspects the DLQ. Blocking.
pub fn inspect(opts: &InspectOptions) -> anyhow::Result<Inspection> {
    let consumer = reader(&opts.kafka, Isolation::ReadCommitted)?;
    let count = partition_count(&consumer, &opts.dlq, DEFAULT_READ_TIMEOUT)?;
    let partitions = opts.select.partitions_of(&opts.dlq, count)?;
    let handled = ledger::read(&opts.kafka, &opts.dlq)?;
    let mut found = Inspection {
        dlq: opts.dlq.clone(),
        ledger: ledger::topic(&opts.dlq),
        total: Counts::default(),
        by: GROUPINGS
            .iter()
            .map(|(name, _)| (name.to_string(), BTreeMap::new()))
            .collect(),
        oldest_unhandled: None,
        newest_unhandled: None,
        shown: Vec::new(),
    };
    let mut unhandled_times: Option<(i64, i64)> = None;
    read_partitions_to_end(
        &consumer,
        &opts.dlq,
        &partitions,
        End::Decided,
        DEFAULT_READ_TIMEOUT,
        |m| {
            if !opts
                .select
                .matches(m.partition(), m.offset(), class_of(m), subscriber_of(m))
            {
                return Ok(());
            }
            let is_handled = handled.contains(m.partition(), m.offset(), m.timestamp().to_millis());
            found.total.count(is_handled);
            for (name, key) in GROUPINGS {
                let value = header(m, key).unwrap_or("-");
                if let Some(groups) = found.by.get_mut(*name) {
                    groups
                        .entry(value.to_owned())
                        .or_default()
                        .count(is_handled);
                }
            }
            if !is_handled {
                if let Some(ts) = m.timestamp().to_millis() {
                    unhandled_times = Some(
                        unhandled_times.map_or((ts, ts), |(old, new)| (old.min(ts), new.max(ts))),
                    );
                }
                if found.shown.len() < opts.show {
                    found.shown.push(shown(m, opts.payload));
                }
            }
            Ok(())
        },
    )?;
    let now = now_ms();
    let moment = |ms: i64| Moment {
        timestamp: rfc3339_ms(ms),
        age_seconds: (now - ms).max(0) as f64 / 1000.0,
    };
    found.oldest_unhandled = unhandled_times.map(|(old, _)| moment(old));
    found.newest_unhandled = unhandled_times.map(|(_, new)| moment(new));
    Ok(found)
}

fn shown(m: &BorrowedMessage<'_>, payload: bool) -> Shown {
    let lossy = |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
    Shown {
        coordinates: key_of(m),
        timestamp: m.timestamp().to_millis().map(rfc3339_ms),
        headers: m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| ShownHeader {
                        key: h.key.to_owned(),
                        value: lossy(h.value),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        payload: payload.then(|| lossy(m.payload())),
    }
}

/// Milliseconds since the epoch as RFC 3339 UTC.
fn rfc3339_ms(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| ms.to_string())
}

impl Inspection {
    /// Aligned text for people.
    pub fn to_text(&self) -> String {
        let t = &self.total;
        let mut out = format!(
            "{}: {} dead letters, {} handled (in {}), {} unhandled\n",
            self.dlq,
            t.handled + t.unhandled,
            t.handled,
            self.ledger,
            t.unhandled
        );
        for (what, m) in [
            ("oldest unhandled", &self.oldest_unhandled),
            ("newest unhandled", &self.newest_unhandled),
        ] {
            if let Some(m) = m {
                let age = humantime::format_duration(Duration::from_secs(m.age_seconds as u64));
                out.push_str(&format!("{what}  {}  ({age} ago)\n", m.timestamp));
            }
        }
        for (name, _) in GROUPINGS {
            let Some(groups) = self.by.get(*name) else {
                continue;
            };
            let mut rows: Vec<(&String, &Counts)> = groups.iter().collect();
            // Numbers in numeric order (partition 10 after 9), the rest by name.
            rows.sort_by_key(|(value, _)| (value.parse::<i64>().ok(), value.as_str()));
            let rows: Vec<Vec<String>> = rows
                .into_iter()
                .map(|(v, c)| vec![v.clone(), c.handled.to_string(), c.unhandled.to_string()])
                .collect();
            out.push('\n');
            out.push_str(&table(
                &[&name.replace('_', " "), "handled", "unhandled"],
                &rows,
            ));
        }
        for s in &self.shown {
            out.push_str(&format!(
                "\n{}  {}\n",
                s.coordinates,
                s.timestamp.as_deref().unwrap_or("-")
            ));
            for h in &s.headers {
                out.push_str(&format!("  {}: {}\n", h.key, h.value));
            }
            if let Some(p) = &s.payload {
                out.push_str(&format!("  payload: {p}\n"));
            }
        }
        out
    }
}
