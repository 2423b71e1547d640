//! Trace context: what lets an operator follow one tick through everything made from it.
//!
//! A tick's `traceparent` (W3C trace context), `correlation-id` and `event-id` headers are copied
//! to its notifications and its dead letter (the replay copies them back with the rest of the
//! headers). A tick without an `event-id` gets one: its coordinates, `topic/partition/offset`,
//! which are unique and the same on every redo of the tick after an abort, so a notification and a
//! dead letter of the same tick always share one event id.

use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::Message;

/// The W3C trace context header.
pub const TRACEPARENT: &str = "traceparent";
/// A caller's correlation id.
pub const CORRELATION_ID: &str = "correlation-id";
/// The event's id.
pub const EVENT_ID: &str = "event-id";

/// The value of header `key` of `msg`, if present and UTF-8.
pub fn header<'a, M: Message>(msg: &'a M, key: &str) -> Option<&'a str> {
    msg.headers()?
        .iter()
        .find(|h| h.key == key)
        .and_then(|h| std::str::from_utf8(h.value?).ok())
}

/// The tick's event id: its own `event-id` header, or its coordinates.
pub fn event_id(msg: &BorrowedMessage<'_>) -> String {
    header(msg, EVENT_ID).map_or_else(
        || format!("{}/{}/{}", msg.topic(), msg.partition(), msg.offset()),
        str::to_owned,
    )
}

/// The trace headers for a record made from `msg`: its `traceparent` and `correlation-id` when
/// present, and its [`event_id`].
pub fn headers(msg: &BorrowedMessage<'_>) -> OwnedHeaders {
    let mut out = OwnedHeaders::new();
    for key in [TRACEPARENT, CORRELATION_ID] {
        if let Some(v) = header(msg, key) {
            out = out.insert(Header {
                key,
                value: Some(v),
            });
        }
    }
    let id = event_id(msg);
    out.insert(Header {
        key: EVENT_ID,
        value: Some(id.as_str()),
    })
}
