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
//! The domain, pure and without I/O:
//! - [`tick`]: decode and validate ticks; the permanent failure classes.
//! - [`alert`]: the crossing rule and the notification record.
//! - [`rules`]: alert thresholds from TOML, and live alerts ([`rules::live`]): the rules topic's
//!   records, the versioned table and the join's one rule, shared by the pipeline and the oracle.
//!
//! The processor and its failure path:
//! - [`pipeline`]: the exactly-once loop, in one folder: driver, engine, commit and rebalance,
//!   transactional producer and error classes, state, settings.
//! - [`dlq`]: the failure path in one file: failure classes, bounded retry, fault injection, the
//!   dead-letter record and its headers.
//! - [`trace`]: trace context (traceparent, correlation-id, event-id) carried to what a tick makes.
//! - [`metrics`]: every metric, in one place; [`health`]: the `/metrics`, `/healthz` and
//!   `/readyz` endpoint; [`background`]: the watchers' threads, stopped and waited for at exit.
//!
//! Shared plumbing and the tools around the processor:
//! - [`kafka`]: client configuration, secrets, the start-up connect and access checks, topics,
//!   offsets, readers, the tick feed.
//! - [`tools`]: the commit/abort experiment, the tick generator, the verifier (oracle), the DLQ
//!   replay (with its replay ledger), inspection and backlog watcher, `alert-rules` (live alerts).
//!
//! Past Kafka's edge, where transactions cannot reach:
//! - [`sink`]: notifications into PostgreSQL, effectively once (`alert-sink`).
//! - [`deliver`]: notifications to subscribers' webhooks (`alert-deliver`): retry bucket topics, a
//!   parking lot and a DLQ, every hand-off in one Kafka transaction with its offset; the HTTP call
//!   at least once with an idempotency key.
//!
//! - [`cli`]: the command-line layer of the thin binaries in `src/bin/`; the library never
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
pub mod health;
pub mod kafka;
pub mod labels;
pub mod metrics;
pub mod pipeline;
pub mod rules;
pub mod sink;
pub mod tick;
pub mod tools;
pub mod trace;
