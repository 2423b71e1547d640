//! An exactly-once Kafka-to-Kafka price-alert processor.
//!
//! Ticks arrive on `market-updates` (key = symbol). For every symbol with alert rules the processor
//! keeps the last accepted price and emits a notification each time the price crosses one of the
//! symbol's thresholds. The notifications, the changed per-symbol state (a compacted changelog) and
//! the consumed offsets are written in ONE Kafka transaction, so every crossing implied by the
//! committed input gives exactly one notification to read_committed consumers, whatever crashes.
//!
//! ```text
//! market-updates ──► [ decode ─► validate ─► crossing rule (per-symbol state) ] ──► notifications
//!    (key=symbol)          │ permanent failure                │ state change
//!                          ▼                                  ▼
//!                   market-updates.dlq               <app>-state (compacted changelog)
//!   ── all outputs + send_offsets_to_transaction(consumer group metadata) in ONE transaction ──
//! ```
//!
//! # The exactly-once invariants
//! 1. Outputs and input offsets commit together ([`pipeline::engine`], [`pipeline::commit`]).
//! 2. State is read back only as committed (read_committed restore, partition-aligned changelog)
//!    and after an abort every owned partition is rewound and restored ([`pipeline::state`]).
//! 3. One stable `transactional.id` per instance plus the consumer group metadata in
//!    `send_offsets_to_transaction` (KIP-447) fence zombies ([`kafka::txn`]).
//! 4. Counting is by records, never by offset arithmetic: transaction markers occupy offsets
//!    ([`kafka::read`]).
//!
//! # Module map
//! Arrows point down: a module imports only those of the same group or a group below it.
//!
//! The domain, pure and without I/O:
//! - [`tick`]: decode and validate ticks; the permanent failure classes.
//! - [`alert`]: the crossing rule and the notification record.
//! - [`rules`]: alert thresholds from TOML, and live alerts ([`rules::live`]): the rules topic's
//!   records, the versioned table and the join's one rule, shared by the pipeline and the oracle.
//! - [`duration`]: the one duration syntax of every flag and every duration read from elsewhere.
//!
//! Leaves every layer uses:
//! - [`metrics`]: every metric, in one place (it imports only [`labels`]);
//!   [`labels`]: bounded label values; [`backoff`]: retry delays; [`trace`]: trace context
//!   (traceparent, correlation-id, event-id) carried to what a tick makes; [`exit`]: a
//!   watchdog's exit that flushes the queued log lines first.
//!
//! Kafka plumbing:
//! - [`kafka`]: one client configuration for every client, secrets, the start-up connect and
//!   access checks, topics, offsets, readers, the tick feed, and the transactional producer with
//!   its error classes and call deadlines ([`kafka::txn`]).
//! - [`health`]: the `/metrics`, `/healthz` and `/readyz` endpoint; [`background`]: the
//!   watchers' threads, stopped and waited for at exit.
//! - [`dlq`]: the failure path: failure classes, bounded retry, fault injection, the dead-letter
//!   record and its headers; the replay ledger and the DLQ backlog watcher.
//! - [`oracle`]: what the notifications should be, from the input topics alone, against what
//!   read_committed readers find (alert-verify, alert-sink's table check, the tests).
//!
//! The stages:
//! - [`pipeline`]: the exactly-once loop, in one folder: driver, engine, commit, the overlapped
//!   commit, the rebalance callbacks, state, settings.
//! - Past Kafka's edge, where transactions cannot reach: [`sink`], notifications into
//!   PostgreSQL, effectively once (`alert-sink`); [`deliver`], notifications to subscribers'
//!   webhooks (`alert-deliver`): retry bucket topics, a parking lot and a DLQ, every hand-off in
//!   one Kafka transaction with its offset; the HTTP call at least once with an idempotency key.
//!
//! On top:
//! - [`tools`]: the commit/abort experiment, the tick generator, the DLQ replay and inspection,
//!   `alert-rules` (live alerts), the chaos runner, the test subscriber and token endpoint.
//! - [`cli`]: the command-line layer of the thin binaries in `src/bin/`; no other module
//!   imports it.
//!
//! The benchmarks are a crate of their own (`bench/`), so the processor carries none of their
//! dependencies.

pub mod alert;
pub mod background;
pub mod backoff;
pub mod cli;
pub mod deliver;
pub mod dlq;
pub mod duration;
pub mod exit;
pub mod health;
pub mod kafka;
pub mod labels;
pub mod metrics;
pub mod oracle;
pub mod pipeline;
pub mod rules;
pub mod sink;
pub mod tick;
pub mod tools;
pub mod trace;
