//! Dead-letter records: a failed tick, untouched, plus headers that say what happened to it.
//!
//! The record keeps the original key and value bytes and the original headers, and adds the
//! `dlq.*` headers of DESIGN.md. It is produced inside the same transaction as the offset that
//! moves past the failed tick, so a tick is either processed or dead-lettered, never skipped: if
//! the DLQ write fails, the transaction aborts and the offset stays where it was.

use crate::failure::Failure;
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::Message;
use std::time::SystemTime;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Longest `dlq.error.message`, in bytes.
pub const MAX_ERROR_MESSAGE: usize = 256;

/// Service name written to `dlq.service`.
pub const SERVICE: &str = env!("CARGO_PKG_NAME");
/// Version written to `dlq.service.version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// A dead-letter record ready to produce.
pub struct DlqRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: OwnedHeaders,
}

/// Builds the DLQ record of `msg`, consumed by `group`.
pub fn record(msg: &BorrowedMessage<'_>, group: &str, failure: &Failure) -> DlqRecord {
    let mut headers = OwnedHeaders::new();
    if let Some(orig) = msg.headers() {
        for h in orig.iter() {
            headers = headers.insert(Header { key: h.key, value: h.value });
        }
    }
    let topic = msg.topic();
    let partition = msg.partition().to_string();
    let offset = msg.offset().to_string();
    let origin = format!("{topic}/{partition}/{offset}");
    let timestamp = msg.timestamp().to_millis().map(|ms| ms.to_string()).unwrap_or_default();
    let attempts = failure.attempts().to_string();
    let failed_at = now_rfc3339();
    let message = sanitize(&failure.message());
    for (k, v) in [
        ("dlq.origin", origin.as_str()),
        ("dlq.original.topic", topic),
        ("dlq.original.partition", partition.as_str()),
        ("dlq.original.offset", offset.as_str()),
        ("dlq.original.timestamp", timestamp.as_str()),
        ("dlq.consumer.group", group),
        ("dlq.error.class", failure.class()),
        ("dlq.error.message", message.as_str()),
        ("dlq.attempts", attempts.as_str()),
        ("dlq.failed.at", failed_at.as_str()),
        ("dlq.service", SERVICE),
        ("dlq.service.version", VERSION),
    ] {
        headers = headers.insert(Header { key: k, value: Some(v) });
    }
    DlqRecord {
        key: msg.key().map(<[u8]>::to_vec),
        value: msg.payload().map(<[u8]>::to_vec),
        headers,
    }
}

/// Current time as RFC 3339 UTC.
pub fn now_rfc3339() -> String {
    OffsetDateTime::from(SystemTime::now()).format(&Rfc3339).unwrap_or_default()
}

/// Keeps a message printable and short: control characters become spaces and the result is cut
/// to [`MAX_ERROR_MESSAGE`] bytes on a character boundary.
pub fn sanitize(message: &str) -> String {
    let clean: String = message.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if clean.len() <= MAX_ERROR_MESSAGE {
        return clean;
    }
    let mut end = MAX_ERROR_MESSAGE;
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    clean[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_cuts_on_char_boundary_and_strips_controls() {
        assert_eq!(sanitize("a\nb\tc"), "a b c");
        let long = "é".repeat(200); // 400 bytes
        let s = sanitize(&long);
        assert!(s.len() <= MAX_ERROR_MESSAGE);
        assert!(s.len() >= MAX_ERROR_MESSAGE - 1);
        assert!(s.chars().all(|c| c == 'é'));
    }
}
