//! What a record of the notifications topic becomes: an `alerts` row, or a dead letter.
//!
//! The decision is pure and deterministic (the same bytes always give the same answer), which is
//! what makes a redo harmless: two instances, or one instance before and after a crash, store the
//! same row or the same dead letter for the same record, and the primary keys make the second
//! write a no-op. Everything the table's constraints check is checked here first, so a batch is
//! refused by the database only for what Rust cannot see (a NUL character in a text column); those
//! rows are found one by one in [`super::store`].
//!
//! A dead letter's message never contains the payload: serde's messages can quote the offending
//! value ("invalid type: string \"…\""), so only the category and position are kept from them.

use crate::alert::{Direction, Notification};
use crate::tick::valid_symbol;
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::Message;
use rust_decimal::Decimal;
use std::fmt;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Default largest notification accepted, in bytes: real ones are under 400 bytes.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 64 * 1024;

/// A notification ready to be stored: the columns of one `alerts` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertRow {
    /// `symbol:seq:threshold:direction`, checked against the other fields.
    pub id: String,
    pub symbol: String,
    pub threshold: Decimal,
    pub direction: Direction,
    pub price: Decimal,
    pub previous_price: Decimal,
    /// The tick's seq; `bigint` in the table, so at most `i64::MAX`.
    pub seq: i64,
    pub tick_ts: OffsetDateTime,
    /// Where the tick behind the notification was read (the notification's `source`).
    pub source_topic: String,
    pub source_partition: i32,
    pub source_offset: i64,
    /// Where the sink read the notification.
    pub partition: i32,
    pub offset: i64,
}

/// Why a record can never be stored. Every variant is permanent: the same bytes fail the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    /// No value (a tombstone).
    Empty,
    Oversize {
        len: usize,
        max: usize,
    },
    NotUtf8,
    /// Not a JSON document; line and column of the syntax error.
    NotJson {
        line: usize,
        column: usize,
    },
    /// JSON, but not of the notification's shape (a field missing or of the wrong type).
    NotNotification {
        reason: String,
    },
    /// The id is not `symbol:seq:threshold:direction` of the record's own fields.
    IdMismatch,
    BadSymbol,
    /// A price or previous price that is not > 0.
    NonPositivePrice,
    /// A seq above `i64::MAX`, which a `bigint` cannot hold.
    SeqOutOfRange,
    /// `tick_ts` is not an RFC 3339 timestamp.
    BadTimestamp,
    /// `source` names no topic, or a negative partition or offset.
    BadSource,
    /// The database refused the row (class 22 data exception or 23 integrity violation).
    Rejected {
        sqlstate: String,
        reason: String,
    },
}

impl RecordError {
    /// The `error_class` column and the metrics label.
    pub fn class(&self) -> &'static str {
        match self {
            RecordError::Empty => "permanent.empty",
            RecordError::Oversize { .. } => "permanent.oversize",
            RecordError::NotUtf8 => "permanent.not_utf8",
            RecordError::NotJson { .. } => "permanent.not_json",
            RecordError::NotNotification { .. } => "permanent.not_notification",
            RecordError::IdMismatch => "permanent.id_mismatch",
            RecordError::BadSymbol => "permanent.bad_symbol",
            RecordError::NonPositivePrice => "permanent.non_positive_price",
            RecordError::SeqOutOfRange => "permanent.seq_out_of_range",
            RecordError::BadTimestamp => "permanent.bad_timestamp",
            RecordError::BadSource => "permanent.bad_source",
            RecordError::Rejected { sqlstate, .. } if sqlstate.starts_with("23") => {
                "permanent.constraint"
            }
            RecordError::Rejected { .. } => "permanent.invalid_data",
        }
    }
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::Empty => write!(f, "record has no value"),
            RecordError::Oversize { len, max } => {
                write!(f, "record of {len} bytes is larger than {max}")
            }
            RecordError::NotUtf8 => write!(f, "value is not UTF-8"),
            RecordError::NotJson { line, column } => write!(
                f,
                "value is not JSON (syntax error at line {line} column {column})"
            ),
            RecordError::NotNotification { reason } => {
                write!(f, "value is not a notification: {reason}")
            }
            RecordError::IdMismatch => write!(
                f,
                "field `id` is not symbol:seq:threshold:direction of the record"
            ),
            RecordError::BadSymbol => write!(
                f,
                "field `symbol` must be 1 to 32 bytes of A-Z, 0-9, '.', '-', '_'"
            ),
            RecordError::NonPositivePrice => {
                write!(f, "fields `price` and `previous_price` must be > 0")
            }
            RecordError::SeqOutOfRange => write!(f, "field `seq` is larger than a bigint holds"),
            RecordError::BadTimestamp => write!(f, "field `tick_ts` is not an RFC 3339 timestamp"),
            RecordError::BadSource => write!(
                f,
                "field `source` needs a topic and a non-negative partition and offset"
            ),
            RecordError::Rejected { sqlstate, reason } => {
                write!(f, "refused by the database ({sqlstate}): {reason}")
            }
        }
    }
}

impl std::error::Error for RecordError {}

/// Decodes and checks one value; `partition` and `offset` say where it was read.
pub fn decode(
    value: Option<&[u8]>,
    partition: i32,
    offset: i64,
    max_bytes: usize,
) -> Result<AlertRow, RecordError> {
    let bytes = value.ok_or(RecordError::Empty)?;
    if bytes.len() > max_bytes {
        return Err(RecordError::Oversize {
            len: bytes.len(),
            max: max_bytes,
        });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| RecordError::NotUtf8)?;
    let n: Notification = serde_json::from_str(text).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => RecordError::NotNotification {
            reason: shape_reason(&e),
        },
        _ => RecordError::NotJson {
            line: e.line(),
            column: e.column(),
        },
    })?;
    if !valid_symbol(&n.symbol) {
        return Err(RecordError::BadSymbol);
    }
    if n.id != Notification::id_of(&n.symbol, n.seq, n.threshold, n.direction) {
        return Err(RecordError::IdMismatch);
    }
    if n.price <= Decimal::ZERO || n.previous_price <= Decimal::ZERO {
        return Err(RecordError::NonPositivePrice);
    }
    let seq = i64::try_from(n.seq).map_err(|_| RecordError::SeqOutOfRange)?;
    let tick_ts =
        OffsetDateTime::parse(&n.tick_ts, &Rfc3339).map_err(|_| RecordError::BadTimestamp)?;
    if n.source.topic.is_empty() || n.source.partition < 0 || n.source.offset < 0 {
        return Err(RecordError::BadSource);
    }
    Ok(AlertRow {
        id: n.id,
        symbol: n.symbol,
        threshold: n.threshold,
        direction: n.direction,
        price: n.price,
        previous_price: n.previous_price,
        seq,
        tick_ts,
        source_topic: n.source.topic,
        source_partition: n.source.partition,
        source_offset: n.source.offset,
        partition,
        offset,
    })
}

/// What of a serde "data" error can be said without quoting the input: a missing field names
/// only our own field; every other message may carry the offending value, so only its position.
fn shape_reason(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    if let Some(rest) = msg.strip_prefix("missing field `") {
        if let Some(field) = rest.split('`').next() {
            return format!("missing field `{field}`");
        }
    }
    format!(
        "a field has the wrong type or value (line {} column {})",
        e.line(),
        e.column()
    )
}

/// A record as it came, kept until its batch is stored: a row the database refuses becomes a dead
/// letter with these bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// The record's headers as `[[key, value], …]` (values as UTF-8, lossy; null when absent).
    pub headers: serde_json::Value,
    pub timestamp: Option<OffsetDateTime>,
}

impl RawRecord {
    pub fn of(m: &BorrowedMessage<'_>) -> Self {
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        serde_json::json!([
                            h.key,
                            h.value.map(|v| String::from_utf8_lossy(v).into_owned())
                        ])
                    })
                    .collect()
            })
            .unwrap_or_default();
        RawRecord {
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers: serde_json::Value::Array(headers),
            timestamp: m.timestamp().to_millis().and_then(|ms| {
                OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()
            }),
        }
    }
}

/// A record that can never be stored, with its provenance and raw bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    pub partition: i32,
    pub offset: i64,
    pub class: &'static str,
    /// Sanitized, at most 256 bytes, never the payload.
    pub message: String,
    pub raw: RawRecord,
}

impl DeadLetter {
    pub fn new(partition: i32, offset: i64, raw: RawRecord, error: &RecordError) -> Self {
        DeadLetter {
            partition,
            offset,
            class: error.class(),
            message: crate::dlq::sanitize(&error.to_string()),
            raw,
        }
    }
}

/// One consumed record, decided.
#[derive(Debug, Clone)]
pub enum Entry {
    Row(AlertRow, RawRecord),
    Dead(DeadLetter),
}

impl Entry {
    /// Decides what `m` becomes.
    pub fn of(m: &BorrowedMessage<'_>, max_bytes: usize) -> Self {
        let raw = RawRecord::of(m);
        match decode(m.payload(), m.partition(), m.offset(), max_bytes) {
            Ok(row) => Entry::Row(row, raw),
            Err(e) => Entry::Dead(DeadLetter::new(m.partition(), m.offset(), raw, &e)),
        }
    }

    pub fn partition(&self) -> i32 {
        match self {
            Entry::Row(r, _) => r.partition,
            Entry::Dead(d) => d.partition,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"id":"BBCA:1042:10000:up","symbol":"BBCA","threshold":"10000","direction":"up","price":"10000.50","previous_price":"9990.00","seq":1042,"tick_ts":"2026-11-30T09:15:00.123Z","source":{"topic":"market-updates","partition":3,"offset":5521}}"#;

    fn dec(s: &str) -> Result<AlertRow, RecordError> {
        decode(Some(s.as_bytes()), 1, 7, DEFAULT_MAX_RECORD_BYTES)
    }

    #[test]
    fn a_notification_of_the_design_decodes_with_exact_decimals() {
        let r = dec(GOOD).unwrap();
        assert_eq!(r.id, "BBCA:1042:10000:up");
        assert_eq!(
            r.price.to_string(),
            "10000.50",
            "scale kept: numeric stores what was sent"
        );
        assert_eq!(r.previous_price.to_string(), "9990.00");
        assert_eq!(
            (r.source_partition, r.source_offset, r.partition, r.offset),
            (3, 5521, 1, 7)
        );
        assert_eq!(r.tick_ts.unix_timestamp(), 1_796_030_100);
    }

    #[test]
    fn every_kind_of_bad_record_has_its_class_and_no_payload_in_the_message() {
        let with = |from: &str, to: &str| GOOD.replace(from, to);
        let cases: Vec<(Option<Vec<u8>>, &str)> = vec![
            (None, "permanent.empty"),
            (Some(vec![0xff, 0xfe]), "permanent.not_utf8"),
            (Some(b"SECRET not json".to_vec()), "permanent.not_json"),
            (
                Some(br#"{"id":"SECRET"}"#.to_vec()),
                "permanent.not_notification",
            ),
            (
                Some(with("\"seq\":1042", "\"seq\":\"SECRET\"").into_bytes()),
                "permanent.not_notification",
            ),
            (
                Some(with("\"direction\":\"up\"", "\"direction\":\"SECRET\"").into_bytes()),
                "permanent.not_notification",
            ),
            (
                Some(with("BBCA:1042", "BBCA:1043").into_bytes()),
                "permanent.id_mismatch",
            ),
            (
                Some(with("\"symbol\":\"BBCA\"", "\"symbol\":\"bbca\"").into_bytes()),
                "permanent.bad_symbol",
            ),
            (
                Some(with("\"10000.50\"", "\"-1\"").into_bytes()),
                "permanent.non_positive_price",
            ),
            (
                Some(with("1042", "18446744073709551615").into_bytes()),
                "permanent.seq_out_of_range",
            ),
            (
                Some(with("2026-11-30T09:15:00.123Z", "SECRET").into_bytes()),
                "permanent.bad_timestamp",
            ),
            (
                Some(with("\"partition\":3", "\"partition\":-3").into_bytes()),
                "permanent.bad_source",
            ),
            (Some(vec![b' '; 100]), "permanent.oversize"),
        ];
        for (value, class) in cases {
            let max = if class == "permanent.oversize" {
                50
            } else {
                DEFAULT_MAX_RECORD_BYTES
            };
            let err = decode(value.as_deref(), 0, 0, max).unwrap_err();
            assert_eq!(err.class(), class, "{value:?}: {err}");
            assert!(
                !err.to_string().contains("SECRET"),
                "message quotes the payload: {err}"
            );
        }
    }

    #[test]
    fn missing_field_is_named() {
        let err = dec(r#"{"id":"x"}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "value is not a notification: missing field `symbol`"
        );
    }

    #[test]
    fn database_refusals_are_classed_by_sqlstate() {
        let e = |s: &str| RecordError::Rejected {
            sqlstate: s.into(),
            reason: "r".into(),
        };
        assert_eq!(e("23514").class(), "permanent.constraint");
        assert_eq!(e("22021").class(), "permanent.invalid_data");
    }
}
