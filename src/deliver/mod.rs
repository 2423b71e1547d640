//! `alert-deliver`: notifications to subscribers' webhooks, with non-blocking retry topics.
//!
//! In-line retry is right for a blip, but a subscriber whose endpoint is down for ten minutes must
//! not stall everyone else's alerts, and a partition must never sleep in its poll loop. So a
//! delivery that fails for a reason that may pass moves on to a retry bucket topic, to be tried
//! again when it is due, while the notifications behind it keep flowing:
//!
//! ```text
//! notifications ──► alert-deliver ──► POST <subscriber url>   (Idempotency-Key: <id>/<subscriber>)
//!                      │ transient (5xx, 408, 429, timeout, refused)   │ permanent 4xx   │ 410 Gone
//!                      ▼                                               ▼                 ▼
//!  notifications.retry.5s ─► .retry.1m ─► .retry.10m ─────────► notifications.dlq  notifications.parking-lot
//! ```
//!
//! # Guarantees
//! - Kafka side, exactly once: consuming a record, producing its hand-offs (next bucket, DLQ or
//!   parking lot) and moving the offset past it commit in one transaction ([`handoff`]).
//! - HTTP side, at least once: a crash or an abort between a delivery and its commit delivers
//!   again. Every request carries `Idempotency-Key: <notification id>/<subscriber>`, the same on
//!   every attempt, so a receiver can make the repeats harmless.
//! - Ordering: a retried notification can arrive after a later one for the same symbol. Its `seq`
//!   lets a receiver tell; holding back a symbol's later notifications behind a failing one would
//!   bring back the head-of-line blocking the buckets exist to avoid.
//!
//! # Module map
//! - [`subscriptions`]: who receives which symbols, from TOML, validated at start.
//! - [`http`]: the request and the one function that classifies its result.
//! - [`breaker`]: the per-subscriber circuit breaker (pure state machine); `dispatch`: a batch's
//!   HTTP calls, bounded per subscriber and partition, through the breakers, within a deadline.
//! - [`buckets`]: bucket names, where a failure goes next, due times, the `retry.*` headers.
//! - [`handoff`]: the hand-off records and the one transaction per batch.
//! - [`partitions`]: what the deliverer keeps per partition between polls (held heads, pauses)
//!   and its fate on assign, revoke, abort and due; the consumer context whose rebalance
//!   callbacks reach it.
//! - [`run`](mod@run): start-up, the poll loop with its due-time pauses, shutdown; `gauges`: the
//!   buckets' ends, read beside the loop for the lag gauges.
//! - [`options`], [`metrics`].

pub mod breaker;
pub mod buckets;
mod dispatch;
mod gauges;
pub mod handoff;
pub mod http;
pub mod metrics;
pub mod options;
pub mod partitions;
pub mod run;
pub mod subscriptions;

pub use buckets::Buckets;
pub use options::DeliverOptions;
pub use run::{run, DeliverStats};
pub use subscriptions::Subscriptions;
