//! Live alerts: a versioned table of alerts read from the rules topic, joined with the ticks of the
//! same partition. Pure, no I/O: the pipeline and the oracle (`alert-verify --rules-topic`) both
//! drive it, record by record, so they cannot disagree on which alert was in force for a tick.
//!
//! # The rules topic
//! `<app>-rules`, compacted, with the input's partition count, `message.timestamp.type =
//! LogAppendTime`. One record per alert: key = the alert's id, value = [`Alert`] as JSON; a
//! tombstone (no value) deletes it. An alert lives in the partition its **symbol's** ticks go to:
//! Kafka's murmur2 of the symbol ([`partition_of`]), what the Java client and our producers
//! (`partitioner=murmur2_random`) do with a tick keyed by its symbol. A record anywhere else, or
//! one that does not decode, is [`RuleChange::Invalid`]: it changes nothing (the version before it
//! stays in force), and it is counted and logged.
//!
//! Two more kinds of record share the topic, both written by the pipeline:
//! - a **barrier** (key [`BARRIER_KEY`], value `{"input_offset": N}`): no alert, only a point in
//!   the partition's order that says "the tick at input offset N of this partition sees what came
//!   before me" (below);
//! - the tombstone of a **one-shot** alert that fired, in the same transaction as its notification,
//!   with header [`FIRED_HEADER`] naming the version that fired.
//!
//! # Which alerts are in force for a tick (the join's one rule)
//! The records of rules partition p are applied in offset order, never out of it, and the applied
//! prefix only grows. Before tick k of input partition p (record timestamp T, input offset o) is
//! evaluated, every record is applied up to, not including, the first record r not yet applied
//! that **ends** k's prefix: r's timestamp is later than T, or r is a barrier for offset o. Until
//! such a record has been read, tick k waits (its partition is paused); the pipeline writes a
//! barrier for it, so the wait is one produce-and-read round trip, whatever T says. So:
//! - an alert put before a tick's timestamp (by the broker's clock that stamps LogAppendTime) is
//!   in force for it, and one put after is not;
//! - a tick whose timestamp is far ahead (a producer's skewed clock) is not held until then: its
//!   own barrier ends its prefix at once, and the ticks after it, whose barrier or whose later
//!   records end their prefixes by timestamp, are not held either (the prefix never shrinks, and
//!   a record's position decides, not the far-ahead time);
//! - everything depends only on the two topics' records, offsets and timestamps: the oracle applies
//!   the same rule to the same records and predicts every notification.
//!
//! # What a crash must not lose
//! The applied position and the one-shot alerts fired whose tombstone is not applied yet
//! ([`JoinCheckpoint`]) are written to the state changelog (key [`JOIN_KEY`]) in the transaction of
//! every batch, beside the symbols' states. A restore reads the rules partition from its start to
//! its end, applies what lies before the checkpoint's position, removes the fired one-shots that
//! are still at the version that fired, and keeps the rest for the ticks to come: exactly the table
//! of the last commit.

use crate::alert::Direction;
use crate::tick::{parse_decimal, valid_symbol};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

/// Key of a barrier record in the rules topic (an alert id cannot start with `#`).
pub const BARRIER_KEY: &str = "#barrier";
/// Header of a one-shot alert's tombstone: the version (rules offset) that fired.
pub const FIRED_HEADER: &str = "alert.fired.version";
/// Key of a partition's join checkpoint in the state changelog (a symbol cannot start with `#`).
pub const JOIN_KEY: &str = "#join";
/// Longest alert id, in bytes.
pub const MAX_ALERT_ID_LEN: usize = 64;

/// The rules topic of an application: `<app-id>-rules`.
pub fn rules_topic(app_id: &str) -> String {
    format!("{app_id}-rules")
}

/// Which crossings of its threshold an alert watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Watch {
    Up,
    Down,
    Both,
}

impl Watch {
    pub fn watches(self, d: Direction) -> bool {
        matches!(
            (self, d),
            (Watch::Both, _) | (Watch::Up, Direction::Up) | (Watch::Down, Direction::Down)
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Watch::Up => "up",
            Watch::Down => "down",
            Watch::Both => "both",
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "up" => Ok(Watch::Up),
            "down" => Ok(Watch::Down),
            "both" => Ok(Watch::Both),
            other => Err(format!("unknown direction {other:?}: up, down or both")),
        }
    }
}

/// One alert, the value of its record in the rules topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alert {
    pub symbol: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub threshold: Decimal,
    pub direction: Watch,
    /// Who it is for: the subscriber of alert-deliver's subscriptions file it is delivered to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscriber: Option<String>,
    /// Fires once, then is deleted (a tombstone in the same transaction as its notification).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub one_shot: bool,
    /// Hysteresis: after an up crossing it fires up again only once the price has been below
    /// `threshold - band`; after a down crossing, down again only once it has been at or above
    /// `threshold + band`.
    #[serde(
        with = "rust_decimal::serde::str_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub rearm_band: Option<Decimal>,
}

/// Why an alert (or a field of it) is refused: the field and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    pub field: &'static str,
    pub reason: String,
}

fn refuse(field: &'static str, reason: impl Into<String>) -> FieldError {
    FieldError {
        field,
        reason: reason.into(),
    }
}

/// Whether `id` can name an alert: 1 to 64 bytes of `A-Z a-z 0-9 . _ -`.
pub fn valid_alert_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ALERT_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whether `name` can name a subscriber (alert-deliver's subscriptions hold it to the same
/// alphabet: it goes into idempotency keys, headers and metric labels): 1 to 64 bytes of
/// `a-z 0-9 - _ .`.
pub fn valid_subscriber(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        })
}

/// The id field checked, for every writer of alerts.
pub fn check_alert_id(id: &str) -> Result<(), FieldError> {
    if valid_alert_id(id) {
        Ok(())
    } else {
        Err(refuse(
            "id",
            format!("{id:?} must be 1 to {MAX_ALERT_ID_LEN} bytes of A-Z, a-z, 0-9, '.', '_', '-'"),
        ))
    }
}

/// A threshold or band written as text: an exact decimal; floats have no text form here, so only
/// the JSON decoder below sees them.
pub fn parse_positive(
    field: &'static str,
    text: &str,
    zero_ok: bool,
) -> Result<Decimal, FieldError> {
    let d =
        parse_decimal(text).ok_or_else(|| refuse(field, format!("{text:?} is not a decimal")))?;
    if d < Decimal::ZERO || (!zero_ok && d.is_zero()) {
        return Err(refuse(
            field,
            format!("{d} must be {}", if zero_ok { ">= 0" } else { "> 0" }),
        ));
    }
    Ok(d)
}

/// A decimal field of the JSON value: a string, or an integer; a JSON number with a fraction is
/// refused, since it may have passed through a binary float on its way.
fn json_decimal(
    field: &'static str,
    v: &serde_json::Value,
    zero_ok: bool,
) -> Result<Decimal, FieldError> {
    match v {
        serde_json::Value::String(s) => parse_positive(field, s, zero_ok),
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => {
            parse_positive(field, &n.to_string(), zero_ok)
        }
        serde_json::Value::Number(n) => Err(refuse(
            field,
            format!("{n} is a float; write it as a string (\"{n}\") to keep it exact"),
        )),
        other => Err(refuse(
            field,
            format!("must be a decimal string or an integer, not {other}"),
        )),
    }
}

impl Alert {
    /// Checks every field (what [`Alert::from_json`] and the CLI both need).
    pub fn check(&self) -> Result<(), FieldError> {
        if !valid_symbol(&self.symbol) {
            return Err(refuse(
                "symbol",
                format!(
                    "{:?} must be 1 to 32 bytes of A-Z, 0-9, '.', '-', '_'",
                    self.symbol
                ),
            ));
        }
        if self.threshold <= Decimal::ZERO {
            return Err(refuse(
                "threshold",
                format!("{} must be > 0", self.threshold),
            ));
        }
        if let Some(b) = self.rearm_band {
            if b < Decimal::ZERO {
                return Err(refuse("rearm_band", format!("{b} must be >= 0")));
            }
        }
        if let Some(s) = &self.subscriber {
            if !valid_subscriber(s) {
                return Err(refuse(
                    "subscriber",
                    format!("{s:?} must be 1 to 64 bytes of a-z, 0-9, '-', '_', '.'"),
                ));
            }
        }
        Ok(())
    }

    /// Decodes and checks an alert's JSON, naming the field at fault. Unknown fields are refused:
    /// a misspelt `one_shot` must not make a recurring alert silently.
    pub fn from_json(bytes: &[u8]) -> Result<Alert, FieldError> {
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| refuse("value", format!("not JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| refuse("value", "must be a JSON object"))?;
        const KNOWN: [&str; 6] = [
            "symbol",
            "threshold",
            "direction",
            "subscriber",
            "one_shot",
            "rearm_band",
        ];
        if let Some(k) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(refuse("value", format!("unknown field {k:?}")));
        }
        let string = |field: &'static str| -> Result<Option<&str>, FieldError> {
            match obj.get(field) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s.as_str())),
                Some(other) => Err(refuse(field, format!("must be a string, not {other}"))),
            }
        };
        let symbol = string("symbol")?.ok_or_else(|| refuse("symbol", "missing"))?;
        let threshold = json_decimal(
            "threshold",
            obj.get("threshold")
                .ok_or_else(|| refuse("threshold", "missing"))?,
            false,
        )?;
        let direction =
            Watch::parse(string("direction")?.ok_or_else(|| refuse("direction", "missing"))?)
                .map_err(|r| refuse("direction", r))?;
        let one_shot = match obj.get("one_shot") {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Bool(b)) => *b,
            Some(other) => {
                return Err(refuse(
                    "one_shot",
                    format!("must be true or false, not {other}"),
                ))
            }
        };
        let rearm_band = match obj.get("rearm_band") {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(json_decimal("rearm_band", v, true)?),
        };
        let alert = Alert {
            symbol: symbol.to_owned(),
            threshold,
            direction,
            subscriber: string("subscriber")?.map(str::to_owned),
            one_shot,
            rearm_band: rearm_band.filter(|b| !b.is_zero()),
        };
        alert.check()?;
        Ok(alert)
    }

    pub fn to_json(&self) -> Vec<u8> {
        // Strings, decimals and booleans always serialize.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), as the Java client's default
/// partitioner and librdkafka's `murmur2_random` hash a key.
pub fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// The partition a record keyed by `symbol` goes to among `partitions`: `(murmur2 & 0x7fffffff) %
/// partitions`, the Java client's and librdkafka's `murmur2_random` for a non-empty key.
pub fn partition_of(symbol: &str, partitions: i32) -> i32 {
    ((murmur2(symbol.as_bytes()) & 0x7fff_ffff) % partitions.max(1) as u32) as i32
}

/// What one record of the rules topic says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleChange {
    /// The alert `id` is now `alert` (its version is the record's offset).
    Put { id: String, alert: Alert },
    /// The alert `id` is deleted; `fired` names the version of a one-shot that fired.
    Delete { id: String, fired: Option<i64> },
    /// A point in the order for the tick at this input offset (see the module doc).
    Barrier { input_offset: i64 },
    /// A record that changes nothing, with the reason (counted and logged).
    Invalid { reason: String },
}

/// One record of a rules partition, as the join needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRecord {
    pub offset: i64,
    /// Its timestamp, ms since the epoch (LogAppendTime on a topic the pipeline made).
    pub ts: i64,
    pub change: RuleChange,
}

/// The barrier record's value.
#[derive(Serialize, Deserialize)]
struct BarrierValue {
    input_offset: i64,
}

/// The value of a barrier for the tick at `input_offset`.
pub fn barrier_value(input_offset: i64) -> Vec<u8> {
    serde_json::to_vec(&BarrierValue { input_offset }).unwrap_or_default()
}

/// Decodes one record of rules partition `partition` (of `partitions`).
pub fn decode(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    fired: Option<&[u8]>,
    partition: i32,
    partitions: i32,
) -> RuleChange {
    let invalid = |reason: String| RuleChange::Invalid { reason };
    let Some(key) = key else {
        return invalid("record without a key".into());
    };
    let Ok(key) = std::str::from_utf8(key) else {
        return invalid("key is not UTF-8".into());
    };
    if key == BARRIER_KEY {
        return match value.map(serde_json::from_slice::<BarrierValue>) {
            Some(Ok(b)) => RuleChange::Barrier {
                input_offset: b.input_offset,
            },
            _ => invalid("barrier without an input offset".into()),
        };
    }
    if let Err(e) = check_alert_id(key) {
        return invalid(format!("key: {e}"));
    }
    let Some(value) = value else {
        let fired = fired
            .and_then(|f| std::str::from_utf8(f).ok())
            .and_then(|f| f.parse().ok());
        return RuleChange::Delete {
            id: key.to_owned(),
            fired,
        };
    };
    match Alert::from_json(value) {
        Err(e) => invalid(format!("alert {key}: {e}")),
        Ok(alert) => {
            let want = partition_of(&alert.symbol, partitions);
            if want != partition {
                return invalid(format!(
                    "alert {key} of {} is in partition {partition}, but {}'s ticks go to partition {want}",
                    alert.symbol, alert.symbol
                ));
            }
            RuleChange::Put {
                id: key.to_owned(),
                alert,
            }
        }
    }
}

/// An alert in force, with its version (the offset of the record that put it): what the table
/// keeps of it. The symbol is the table's key, not repeated: a million alerts are held in about
/// 150 MB (issue 42's goal is a peak RSS of 256 MiB for one instance).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: Arc<str>,
    pub version: i64,
    pub threshold: Decimal,
    pub direction: Watch,
    pub one_shot: bool,
    pub rearm_band: Option<Decimal>,
    pub subscriber: Option<Box<str>>,
}

impl Entry {
    /// The alert of this entry, of `symbol`.
    pub fn alert(&self, symbol: &str) -> Alert {
        Alert {
            symbol: symbol.to_owned(),
            threshold: self.threshold,
            direction: self.direction,
            subscriber: self.subscriber.as_deref().map(str::to_owned),
            one_shot: self.one_shot,
            rearm_band: self.rearm_band,
        }
    }
}

/// The alerts in force of one partition, by symbol and by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlertTable {
    /// Symbol -> its alerts, sorted by id (a sorted vector: a B-tree's nodes cost a symbol with
    /// a few alerts over a kilobyte).
    by_symbol: HashMap<Arc<str>, Vec<Entry>>,
    /// Id -> symbol (a tombstone names the id only); both strings shared with `by_symbol`.
    symbol_of: HashMap<Arc<str>, Arc<str>>,
}

impl AlertTable {
    pub fn put(&mut self, id: &str, version: i64, alert: Alert) {
        self.remove(id);
        let id: Arc<str> = Arc::from(id);
        let symbol: Arc<str> = match self.by_symbol.get_key_value(alert.symbol.as_str()) {
            Some((s, _)) => Arc::clone(s),
            None => Arc::from(alert.symbol.as_str()),
        };
        self.symbol_of.insert(Arc::clone(&id), Arc::clone(&symbol));
        let entries = self.by_symbol.entry(symbol).or_default();
        let at = entries
            .binary_search_by(|e| e.id.as_ref().cmp(id.as_ref()))
            .unwrap_or_else(|i| i);
        // Grown by an eighth, not doubled: a doubling vector holds up to twice its alerts (a
        // symbol of ten alerts, capacity sixteen: 480 bytes idle, 48 MB over 100,000 symbols),
        // while one grown by one would copy a popular symbol's alerts at every put.
        if entries.len() == entries.capacity() {
            entries.reserve_exact((entries.len() / 8).max(1));
        }
        entries.insert(
            at,
            Entry {
                id,
                version,
                threshold: alert.threshold,
                direction: alert.direction,
                one_shot: alert.one_shot,
                rearm_band: alert.rearm_band,
                subscriber: alert.subscriber.map(String::into_boxed_str),
            },
        );
    }

    /// Removes `id`; returns what it was.
    pub fn remove(&mut self, id: &str) -> Option<Entry> {
        let symbol = self.symbol_of.remove(id)?;
        let entries = self.by_symbol.get_mut(&symbol)?;
        let at = entries.binary_search_by(|e| e.id.as_ref().cmp(id)).ok()?;
        let gone = entries.remove(at);
        if entries.is_empty() {
            self.by_symbol.remove(&symbol);
        } else if entries.capacity() > 2 * entries.len() + 4 {
            entries.shrink_to_fit();
        }
        Some(gone)
    }

    pub fn get(&self, id: &str) -> Option<&Entry> {
        let entries = self.by_symbol.get(self.symbol_of.get(id)?)?;
        entry_of(entries, id)
    }

    /// The alerts of `symbol`, sorted by id.
    pub fn of_symbol(&self, symbol: &str) -> Option<&[Entry]> {
        self.by_symbol.get(symbol).map(Vec::as_slice)
    }

    pub fn len(&self) -> usize {
        self.symbol_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.symbol_of.is_empty()
    }

    /// Every alert with its symbol.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.by_symbol
            .iter()
            .flat_map(|(s, es)| es.iter().map(move |e| (s.as_ref(), e)))
    }
}

/// The entry of `id` among a symbol's entries (sorted by id).
pub fn entry_of<'a>(entries: &'a [Entry], id: &str) -> Option<&'a Entry> {
    entries
        .binary_search_by(|e| e.id.as_ref().cmp(id))
        .ok()
        .map(|i| &entries[i])
}

/// What a partition's join must keep across a crash: written to the changelog with every batch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinCheckpoint {
    /// Rules offset of the next record to apply: everything before it is applied.
    pub applied: i64,
    /// One-shot alerts fired whose tombstone is not applied yet: id -> version that fired.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fired: BTreeMap<String, i64>,
}

/// Counts of what applying records did (for metrics and logs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    pub puts: u64,
    pub deletes: u64,
    pub invalid: u64,
}

/// The join of one partition: the table in force, the records read but not applied yet, and the
/// one-shots fired but not yet seen deleted.
#[derive(Debug, Clone, Default)]
pub struct PartitionJoin {
    table: AlertTable,
    /// Next rules offset to apply.
    applied: i64,
    /// Records read, not applied: offsets ascending, all at or past `applied`.
    pending: VecDeque<RuleRecord>,
    fired: BTreeMap<String, i64>,
    /// Offset after the last record read (pushed or applied).
    read_to: i64,
    /// While restoring: the checkpoint's position, before which records are applied as they come.
    restoring_until: Option<i64>,
    /// What applying has done so far (taken by [`PartitionJoin::take_applied`]).
    counts: Applied,
    /// Invalid records applied since the last take, with their reasons (for one log line each).
    invalid: Vec<(i64, String)>,
}

impl PartitionJoin {
    /// A join that resumes from `checkpoint` (the default: from the partition's start); feed it the
    /// partition's records from offset 0 with [`PartitionJoin::push`], then call
    /// [`PartitionJoin::restored`].
    pub fn resuming(checkpoint: &JoinCheckpoint) -> Self {
        PartitionJoin {
            fired: checkpoint.fired.clone(),
            restoring_until: Some(checkpoint.applied),
            ..Default::default()
        }
    }

    /// Takes one record read from the partition (in offset order).
    pub fn push(&mut self, record: RuleRecord) {
        self.read_to = record.offset + 1;
        // Restoring: records before the checkpoint's position were applied before the crash.
        if self
            .restoring_until
            .is_some_and(|until| record.offset < until)
        {
            self.apply(record);
            return;
        }
        self.pending.push_back(record);
    }

    /// The restore's records are all pushed: the one-shots that fired are removed again (if still
    /// at the version that fired), and the join goes on from the checkpoint's position.
    pub fn restored(&mut self, checkpoint: &JoinCheckpoint, read_to: i64) {
        self.restoring_until = None;
        self.applied = self.applied.max(checkpoint.applied);
        self.read_to = self.read_to.max(read_to).max(self.applied);
        for (id, &version) in &self.fired {
            if self.table.get(id).is_some_and(|v| v.version == version) {
                self.table.remove(id);
            }
        }
    }

    /// Applies records until the first that ends the prefix of the tick at `input_offset` with
    /// timestamp `ts`; true when that record has been read (the tick may be evaluated), false when
    /// more records are needed (the tick waits; a barrier brings one).
    pub fn ready(&mut self, ts: i64, input_offset: i64) -> bool {
        while let Some(front) = self.pending.front() {
            let ends = front.ts > ts
                || matches!(front.change, RuleChange::Barrier { input_offset: o } if o == input_offset);
            if ends {
                return true;
            }
            let record = self.pending.pop_front().expect("front exists");
            self.apply(record);
        }
        false
    }

    fn apply(&mut self, record: RuleRecord) {
        self.applied = record.offset + 1;
        match record.change {
            RuleChange::Put { id, alert } => {
                self.counts.puts += 1;
                self.table.put(&id, record.offset, alert);
            }
            RuleChange::Delete { id, fired } => {
                self.counts.deletes += 1;
                if let Some(v) = fired {
                    if self.fired.get(&id) == Some(&v) {
                        self.fired.remove(&id);
                    }
                }
                self.table.remove(&id);
            }
            RuleChange::Barrier { .. } => {}
            RuleChange::Invalid { reason } => {
                self.counts.invalid += 1;
                self.invalid.push((record.offset, reason));
            }
        }
    }

    /// A one-shot alert fired: it leaves the table now; its tombstone follows in the same
    /// transaction.
    pub fn fire_one_shot(&mut self, id: &str, version: i64) {
        self.table.remove(id);
        self.fired.insert(id.to_owned(), version);
    }

    pub fn table(&self) -> &AlertTable {
        &self.table
    }

    pub fn checkpoint(&self) -> JoinCheckpoint {
        JoinCheckpoint {
            applied: self.applied,
            fired: self.fired.clone(),
        }
    }

    /// Records read and not applied.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether a barrier for `input_offset` has been read and not applied yet.
    pub fn has_barrier(&self, input_offset: i64) -> bool {
        self.pending.iter().any(
            |r| matches!(r.change, RuleChange::Barrier { input_offset: o } if o == input_offset),
        )
    }

    /// Offset after the last record read.
    pub fn read_to(&self) -> i64 {
        self.read_to
    }

    /// What applying did since the last call, and the invalid records with their reasons.
    pub fn take_applied(&mut self) -> (Applied, Vec<(i64, String)>) {
        (
            std::mem::take(&mut self.counts),
            std::mem::take(&mut self.invalid),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Decimal {
        Decimal::from_str_exact(s).unwrap()
    }

    fn alert(symbol: &str, t: &str) -> Alert {
        Alert {
            symbol: symbol.into(),
            threshold: d(t),
            direction: Watch::Up,
            subscriber: None,
            one_shot: false,
            rearm_band: None,
        }
    }

    fn put(offset: i64, ts: i64, id: &str, t: &str) -> RuleRecord {
        RuleRecord {
            offset,
            ts,
            change: RuleChange::Put {
                id: id.into(),
                alert: alert("BBCA", t),
            },
        }
    }

    fn rec(offset: i64, ts: i64, change: RuleChange) -> RuleRecord {
        RuleRecord { offset, ts, change }
    }

    fn threshold(j: &PartitionJoin, id: &str) -> Option<String> {
        j.table().get(id).map(|v| v.threshold.to_string())
    }

    #[test]
    fn murmur2_matches_kafka() {
        // Values of Kafka's Utils.murmur2 (its own unit test vectors).
        assert_eq!(murmur2(b"21") as i32, -973932308);
        assert_eq!(murmur2(b"foobar") as i32, -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string") as i32, -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string") as i32, -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") as i32,
            -58897971
        );
        assert_eq!(murmur2(b"abc") as i32, 479470107);
    }

    #[test]
    fn a_tick_sees_the_records_before_its_time_and_waits_for_one_after() {
        let mut j = PartitionJoin::default();
        j.push(put(0, 100, "a", "10"));
        j.push(put(1, 200, "b", "20"));
        // A tick at 150: "a" applies, "b" (200 > 150) ends its prefix.
        assert!(j.ready(150, 7));
        assert_eq!(threshold(&j, "a").as_deref(), Some("10"));
        assert_eq!(threshold(&j, "b"), None);
        // A tick at 250: "b" applies, and nothing read yet ends its prefix: it waits.
        assert!(!j.ready(250, 8));
        assert_eq!(threshold(&j, "b").as_deref(), Some("20"));
        // Its barrier ends it, whatever the barrier's timestamp.
        j.push(rec(2, 240, RuleChange::Barrier { input_offset: 8 }));
        assert!(j.ready(250, 8));
        // An older tick after it: the prefix never shrinks.
        assert!(j.ready(50, 9));
        assert_eq!(threshold(&j, "a").as_deref(), Some("10"));
    }

    #[test]
    fn a_far_ahead_tick_does_not_hold_the_table_back() {
        let mut j = PartitionJoin::default();
        j.push(put(0, 100, "a", "10"));
        // A tick from far ahead: its barrier (stamped now, 300) ends its prefix.
        assert!(!j.ready(9_000_000, 5));
        j.push(rec(1, 300, RuleChange::Barrier { input_offset: 5 }));
        assert!(j.ready(9_000_000, 5));
        // A put after the barrier is in force for the next tick of ordinary time.
        j.push(put(2, 400, "a", "11"));
        j.push(rec(3, 500, RuleChange::Barrier { input_offset: 6 }));
        assert!(j.ready(450, 6));
        assert_eq!(threshold(&j, "a").as_deref(), Some("11"));
    }

    #[test]
    fn update_and_delete_by_order() {
        let mut j = PartitionJoin::default();
        j.push(put(0, 1, "a", "10"));
        j.push(put(1, 2, "a", "12"));
        j.push(rec(
            2,
            3,
            RuleChange::Delete {
                id: "a".into(),
                fired: None,
            },
        ));
        j.push(put(3, 4, "b", "5"));
        j.push(rec(4, 99, RuleChange::Barrier { input_offset: 0 }));
        assert!(j.ready(2, 0));
        assert_eq!(threshold(&j, "a").as_deref(), Some("12"));
        assert_eq!(j.table().get("a").unwrap().version, 1);
        assert!(j.ready(4, 1));
        assert_eq!(threshold(&j, "a"), None);
        assert_eq!(threshold(&j, "b").as_deref(), Some("5"));
    }

    #[test]
    fn a_restore_gives_the_table_of_the_checkpoint() {
        let records = [
            put(0, 1, "a", "10"),
            put(1, 2, "b", "20"),
            put(2, 3, "c", "30"),
            rec(
                3,
                4,
                RuleChange::Delete {
                    id: "a".into(),
                    fired: Some(0),
                },
            ),
            put(4, 5, "d", "40"),
        ];
        // Before the crash: a tick at 3 applied offsets 0-2, then "b" (one-shot) fired.
        let mut live = PartitionJoin::default();
        records[..3].iter().cloned().for_each(|r| live.push(r));
        live.push(records[3].clone());
        assert!(live.ready(3, 0));
        live.fire_one_shot("b", 1);
        let cp = live.checkpoint();
        assert_eq!(cp.applied, 3);
        assert_eq!(cp.fired, BTreeMap::from([("b".to_owned(), 1)]));
        // The restore reads everything there is, then resumes.
        let json = serde_json::to_vec(&cp).unwrap();
        let cp: JoinCheckpoint = serde_json::from_slice(&json).unwrap();
        let mut back = PartitionJoin::resuming(&cp);
        records.iter().cloned().for_each(|r| back.push(r));
        back.restored(&cp, 5);
        assert_eq!(back.table(), live.table());
        assert_eq!(back.pending(), 2);
        assert_eq!(back.read_to(), 5);
        // Both go on alike.
        for j in [&mut live, &mut back] {
            if j.pending() < 2 {
                j.push(records[4].clone());
            }
            assert!(!j.ready(10, 1));
            assert_eq!(threshold(j, "a"), None);
            assert_eq!(threshold(j, "d").as_deref(), Some("40"));
        }
    }

    #[test]
    fn a_put_that_follows_a_one_shot_fire_is_not_removed_by_the_restore() {
        let mut j = PartitionJoin::resuming(&JoinCheckpoint {
            applied: 2,
            fired: BTreeMap::from([("a".to_owned(), 0)]),
        });
        j.push(put(0, 1, "a", "10"));
        j.push(put(1, 2, "a", "11")); // put again before the fire was checkpointed
        j.restored(
            &JoinCheckpoint {
                applied: 2,
                fired: BTreeMap::from([("a".to_owned(), 0)]),
            },
            2,
        );
        assert_eq!(threshold(&j, "a").as_deref(), Some("11"));
    }

    #[test]
    fn decode_refuses_with_the_field() {
        let p = partition_of("BBCA", 6);
        let ok = br#"{"symbol":"BBCA","threshold":"100.5","direction":"both","subscriber":"ops","one_shot":true,"rearm_band":"0.5"}"#;
        match decode(Some(b"a1"), Some(ok), None, p, 6) {
            RuleChange::Put { id, alert } => {
                assert_eq!(id, "a1");
                assert!(alert.one_shot);
                assert_eq!(alert.rearm_band, Some(d("0.5")));
                assert_eq!(Alert::from_json(&alert.to_json()).unwrap(), alert);
            }
            other => panic!("{other:?}"),
        }
        let reason = |v: &[u8]| match decode(Some(b"a1"), Some(v), None, p, 6) {
            RuleChange::Invalid { reason } => reason,
            other => panic!("{other:?}"),
        };
        assert!(
            reason(br#"{"symbol":"BBCA","threshold":100.5,"direction":"up"}"#)
                .contains("threshold: 100.5 is a float")
        );
        assert!(
            reason(br#"{"symbol":"BBCA","threshold":"1","direction":"sideways"}"#)
                .contains("direction: unknown direction")
        );
        assert!(
            reason(br#"{"symbol":"bbca","threshold":"1","direction":"up"}"#).contains("symbol:")
        );
        assert!(
            reason(br#"{"symbol":"BBCA","threshold":"1","direction":"up","oneshot":true}"#)
                .contains("unknown field \"oneshot\"")
        );
        let wrong = (p + 1) % 6;
        match decode(Some(b"a1"), Some(ok), None, wrong, 6) {
            RuleChange::Invalid { reason } => {
                assert!(reason.contains("go to partition"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            decode(Some(b"a1"), None, Some(b"17"), p, 6),
            RuleChange::Delete {
                id: "a1".into(),
                fired: Some(17)
            }
        );
        assert_eq!(
            decode(
                Some(BARRIER_KEY.as_bytes()),
                Some(&barrier_value(42)),
                None,
                p,
                6
            ),
            RuleChange::Barrier { input_offset: 42 }
        );
    }
}
