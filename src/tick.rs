//! Decoding and validation of ticks from `market-updates`.
//!
//! A tick is untrusted input: every way it can be wrong is a variant of [`TickError`], so the
//! pipeline can dead-letter it with a precise class instead of "some error". Decoding goes through
//! `serde_json::Value` rather than a derived struct on purpose: a derived struct reports "invalid
//! type" and "missing field" as one opaque message, while the operator wants to know which field
//! was wrong and how.
//!
//! Invariants of a decoded [`Tick`]:
//! - `symbol` is 1 to 32 bytes of `A-Z 0-9 . - _`;
//! - `price` is a `Decimal` > 0, parsed from the JSON text exactly (no float ever touches it);
//! - `seq` is a `u64`;
//! - `ts`, when present, is a valid RFC 3339 timestamp and kept as sent.

use rust_decimal::Decimal;
use serde_json::Value;
use std::fmt;
use std::str::FromStr;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Longest symbol accepted, in bytes.
pub const MAX_SYMBOL_LEN: usize = 32;

/// Default largest tick payload accepted, in bytes. Real ticks are under 200 bytes; anything far
/// larger is a producer bug and should not be parsed at all.
pub const DEFAULT_MAX_TICK_BYTES: usize = 4096;

/// A validated price tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    /// Instrument, validated against the symbol alphabet.
    pub symbol: String,
    /// Last traded price, exact decimal, > 0.
    pub price: Decimal,
    /// Sequence number, increasing per symbol; used to drop stale duplicates.
    pub seq: u64,
    /// Exchange timestamp as sent (RFC 3339), if any; the record timestamp stands in otherwise.
    pub ts: Option<String>,
}

/// Why a tick was refused. Every variant is permanent: retrying the same bytes gives the same
/// answer, so such a tick goes to the dead-letter queue at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TickError {
    /// The payload is larger than the configured limit.
    Oversize { len: usize, max: usize },
    /// The record has no value at all (a tombstone on an input topic).
    Empty,
    /// The payload is not valid UTF-8.
    NotUtf8,
    /// The payload is not a JSON document.
    NotJson { reason: String },
    /// The document is JSON but not an object.
    NotObject,
    /// A required field is absent (or null).
    MissingField { field: &'static str },
    /// A field has the wrong JSON type.
    WrongType {
        field: &'static str,
        expected: &'static str,
    },
    /// `price` is not a decimal number.
    BadDecimal,
    /// `price` is zero or negative.
    NonPositivePrice,
    /// `symbol` is empty, too long or has characters outside the alphabet.
    BadSymbol,
    /// `seq` is a number but not an unsigned 64-bit integer.
    BadSeq,
    /// `ts` is present but not RFC 3339.
    BadTimestamp,
}

impl TickError {
    /// Stable, dotted class name, used as the `dlq.error.class` header and as a metrics label.
    pub fn class(&self) -> &'static str {
        match self {
            TickError::Oversize { .. } => "permanent.oversize",
            TickError::Empty => "permanent.empty",
            TickError::NotUtf8 => "permanent.not_utf8",
            TickError::NotJson { .. } => "permanent.not_json",
            TickError::NotObject => "permanent.wrong_type",
            TickError::MissingField { .. } => "permanent.missing_field",
            TickError::WrongType { .. } => "permanent.wrong_type",
            TickError::BadDecimal => "permanent.bad_decimal",
            TickError::NonPositivePrice => "permanent.non_positive_price",
            TickError::BadSymbol => "permanent.bad_symbol",
            TickError::BadSeq => "permanent.wrong_type",
            TickError::BadTimestamp => "permanent.bad_timestamp",
        }
    }
}

impl fmt::Display for TickError {
    // Messages never echo the payload: they end up in DLQ headers and logs, where a payload could
    // leak data or blow up a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TickError::Oversize { len, max } => write!(f, "payload of {len} bytes exceeds {max}"),
            TickError::Empty => write!(f, "record has no value"),
            TickError::NotUtf8 => write!(f, "payload is not valid UTF-8"),
            TickError::NotJson { reason } => write!(f, "payload is not JSON: {reason}"),
            TickError::NotObject => write!(f, "payload is not a JSON object"),
            TickError::MissingField { field } => write!(f, "missing field `{field}`"),
            TickError::WrongType { field, expected } => {
                write!(f, "field `{field}` must be {expected}")
            }
            TickError::BadDecimal => write!(f, "field `price` is not a decimal number"),
            TickError::NonPositivePrice => write!(f, "field `price` must be > 0"),
            TickError::BadSymbol => write!(
                f,
                "field `symbol` must be 1 to {MAX_SYMBOL_LEN} bytes of A-Z, 0-9, '.', '-', '_'"
            ),
            TickError::BadSeq => write!(f, "field `seq` must be an unsigned 64-bit integer"),
            TickError::BadTimestamp => write!(f, "field `ts` is not an RFC 3339 timestamp"),
        }
    }
}

impl std::error::Error for TickError {}

/// True when `s` is a valid symbol.
pub fn valid_symbol(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_SYMBOL_LEN
        && s.bytes().all(|b| {
            b.is_ascii_uppercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')
        })
}

/// Decodes and validates one tick payload of at most `max_bytes` bytes.
pub fn decode(payload: Option<&[u8]>, max_bytes: usize) -> Result<Tick, TickError> {
    let bytes = payload.ok_or(TickError::Empty)?;
    if bytes.len() > max_bytes {
        return Err(TickError::Oversize {
            len: bytes.len(),
            max: max_bytes,
        });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| TickError::NotUtf8)?;
    let doc: Value = serde_json::from_str(text).map_err(|e| TickError::NotJson {
        // serde_json's messages name a position and a category, never the input text.
        reason: e.to_string(),
    })?;
    let obj = doc.as_object().ok_or(TickError::NotObject)?;
    let field = |name: &'static str| match obj.get(name) {
        None | Some(Value::Null) => Err(TickError::MissingField { field: name }),
        Some(v) => Ok(v),
    };

    let symbol = field("symbol")?.as_str().ok_or(TickError::WrongType {
        field: "symbol",
        expected: "a string",
    })?;
    if !valid_symbol(symbol) {
        return Err(TickError::BadSymbol);
    }

    let price = parse_price(field("price")?)?;

    let seq = match field("seq")? {
        // With arbitrary_precision, the number keeps its text: "1.0" or "-1" or 2^64 are refused
        // here rather than rounded.
        Value::Number(n) => n.as_u64().ok_or(TickError::BadSeq)?,
        _ => {
            return Err(TickError::WrongType {
                field: "seq",
                expected: "an integer",
            })
        }
    };

    let ts = match obj.get("ts") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            OffsetDateTime::parse(s, &Rfc3339).map_err(|_| TickError::BadTimestamp)?;
            Some(s.clone())
        }
        Some(_) => {
            return Err(TickError::WrongType {
                field: "ts",
                expected: "an RFC 3339 string",
            })
        }
    };

    Ok(Tick {
        symbol: symbol.to_owned(),
        price,
        seq,
        ts,
    })
}

/// Parses a price given as a JSON string or number, exactly.
fn parse_price(v: &Value) -> Result<Decimal, TickError> {
    let text = match v {
        Value::String(s) => s.clone(),
        // arbitrary_precision keeps the literal, so "0.1" stays 0.1 and never becomes a float.
        Value::Number(n) => n.to_string(),
        _ => {
            return Err(TickError::WrongType {
                field: "price",
                expected: "a decimal string or number",
            })
        }
    };
    let text = text.trim();
    let price = Decimal::from_str_exact(text)
        .or_else(|_| Decimal::from_scientific(text))
        .map_err(|_| TickError::BadDecimal)?;
    if price <= Decimal::ZERO {
        return Err(TickError::NonPositivePrice);
    }
    Ok(price)
}

/// Parses a decimal written in a config file or on a command line.
pub fn parse_decimal(text: &str) -> Option<Decimal> {
    Decimal::from_str_exact(text.trim())
        .or_else(|_| Decimal::from_str(text.trim()))
        .ok()
}

/// Encodes a tick as the JSON of docs/design.md (used by the generator and the demos).
pub fn encode(tick: &Tick) -> Vec<u8> {
    let mut obj = serde_json::Map::new();
    obj.insert("symbol".into(), Value::String(tick.symbol.clone()));
    obj.insert("price".into(), Value::String(tick.price.to_string()));
    obj.insert("seq".into(), Value::from(tick.seq));
    if let Some(ts) = &tick.ts {
        obj.insert("ts".into(), Value::String(ts.clone()));
    }
    // Serializing a Map of strings and integers cannot fail.
    serde_json::to_vec(&Value::Object(obj)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = DEFAULT_MAX_TICK_BYTES;

    fn dec(s: &str) -> Decimal {
        Decimal::from_str_exact(s).unwrap()
    }

    fn err(payload: &str) -> TickError {
        decode(Some(payload.as_bytes()), MAX).unwrap_err()
    }

    #[test]
    fn decodes_the_design_example() {
        let t = decode(
            Some(br#"{"symbol":"BBCA","price":"9525.50","seq":1042,"ts":"2026-11-30T09:15:00.123Z","venue":"IDX"}"#),
            MAX,
        )
        .unwrap();
        assert_eq!(t.symbol, "BBCA");
        assert_eq!(t.price, dec("9525.50"));
        assert_eq!(t.price.to_string(), "9525.50", "scale is kept");
        assert_eq!(t.seq, 1042);
        assert_eq!(t.ts.as_deref(), Some("2026-11-30T09:15:00.123Z"));
    }

    #[test]
    fn price_as_number_is_exact() {
        let t = decode(Some(br#"{"symbol":"X","price":0.1,"seq":1}"#), MAX).unwrap();
        assert_eq!(t.price, dec("0.1"));
        let t = decode(
            Some(br#"{"symbol":"X","price":123456789.123456789,"seq":1}"#),
            MAX,
        )
        .unwrap();
        assert_eq!(t.price, dec("123456789.123456789"));
        let t = decode(Some(br#"{"symbol":"X","price":1e3,"seq":1}"#), MAX).unwrap();
        assert_eq!(t.price, dec("1000"));
    }

    #[test]
    fn every_permanent_failure_has_its_class() {
        assert_eq!(decode(None, MAX).unwrap_err().class(), "permanent.empty");
        assert_eq!(
            decode(Some(&[0xff, 0xfe]), MAX).unwrap_err(),
            TickError::NotUtf8
        );
        assert_eq!(err("not json").class(), "permanent.not_json");
        assert_eq!(err("[1,2]"), TickError::NotObject);
        assert_eq!(
            err(r#"{"price":"1","seq":1}"#),
            TickError::MissingField { field: "symbol" }
        );
        assert_eq!(
            err(r#"{"symbol":"A","seq":1}"#),
            TickError::MissingField { field: "price" }
        );
        assert_eq!(
            err(r#"{"symbol":"A","price":"1"}"#),
            TickError::MissingField { field: "seq" }
        );
        assert_eq!(
            err(r#"{"symbol":"A","price":"1","seq":null}"#).class(),
            "permanent.missing_field"
        );
        assert_eq!(
            err(r#"{"symbol":7,"price":"1","seq":1}"#).class(),
            "permanent.wrong_type"
        );
        assert_eq!(
            err(r#"{"symbol":"A","price":true,"seq":1}"#).class(),
            "permanent.wrong_type"
        );
        assert_eq!(
            err(r#"{"symbol":"A","price":"1","seq":"1"}"#).class(),
            "permanent.wrong_type"
        );
        assert_eq!(
            err(r#"{"symbol":"A","price":"1","seq":-1}"#),
            TickError::BadSeq
        );
        assert_eq!(
            err(r#"{"symbol":"A","price":"1","seq":1.5}"#),
            TickError::BadSeq
        );
        assert_eq!(
            err(r#"{"symbol":"A","price":"abc","seq":1}"#),
            TickError::BadDecimal
        );
        assert_eq!(
            err(r#"{"symbol":"A","price":"0","seq":1}"#),
            TickError::NonPositivePrice
        );
        assert_eq!(
            err(r#"{"symbol":"A","price":-3,"seq":1}"#),
            TickError::NonPositivePrice
        );
        assert_eq!(
            err(r#"{"symbol":"bbca","price":"1","seq":1}"#),
            TickError::BadSymbol
        );
        assert_eq!(
            err(r#"{"symbol":"","price":"1","seq":1}"#),
            TickError::BadSymbol
        );
        let long = "A".repeat(33);
        assert_eq!(
            err(&format!(r#"{{"symbol":"{long}","price":"1","seq":1}}"#)),
            TickError::BadSymbol
        );
        assert_eq!(
            err(r#"{"symbol":"A","price":"1","seq":1,"ts":"yesterday"}"#),
            TickError::BadTimestamp
        );
        let big = format!(
            r#"{{"symbol":"A","price":"1","seq":1,"pad":"{}"}}"#,
            "x".repeat(200)
        );
        assert_eq!(
            decode(Some(big.as_bytes()), 100).unwrap_err(),
            TickError::Oversize {
                len: big.len(),
                max: 100
            }
        );
    }

    #[test]
    fn symbol_alphabet() {
        assert!(valid_symbol("BRK.B"));
        assert!(valid_symbol("ES_F-2026"));
        assert!(valid_symbol(&"Z".repeat(32)));
        assert!(!valid_symbol("AB C"));
        assert!(!valid_symbol("Ä"));
    }

    #[test]
    fn messages_never_echo_the_payload() {
        let secret = "SECRET-PAYLOAD-XYZ";
        let e = err(&format!(r#"{{"symbol":"A","price":"{secret}","seq":1}}"#));
        assert!(!e.to_string().contains(secret));
        let e = err(&format!("{secret} not json"));
        assert!(!e.to_string().contains(secret), "{e}");
    }

    #[test]
    fn encode_round_trips() {
        let t = Tick {
            symbol: "BBCA".into(),
            price: dec("9525.50"),
            seq: 9,
            ts: None,
        };
        assert_eq!(decode(Some(&encode(&t)), MAX).unwrap(), t);
    }
}
