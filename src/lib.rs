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
//! 1. Outputs and input offsets commit together ([`engine`]).
//! 2. State is read back only as committed (read_committed restore, partition-aligned changelog)
//!    and after an abort every owned partition is rewound and restored ([`state`]).
//! 3. One stable `transactional.id` per instance plus the consumer group metadata in
//!    `send_offsets_to_transaction` (KIP-447) fence zombies ([`txn`]).
//! 4. Counting is by records, never by offset arithmetic: transaction markers occupy offsets
//!    ([`reader`]).
//!
//! # Module map
//! - [`tick`]: decode and validate ticks; the permanent failure classes.
//! - [`alert`]: the pure crossing rule and the notification record.
//! - [`rules`]: alert thresholds from TOML.
//! - [`config`]: the one place that builds rdkafka client configurations.
//! - [`txn`]: the transactional producer and the error classification.
//! - [`engine`]: the transactional consume-process-produce step, rebalances, aborts.
//! - [`state`]: per-partition state and its restore.
//! - [`failure`]: the failure classes, the bounded retry, fault injection.
//! - [`dlq`]: dead-letter records; [`replay`]: putting them back, exactly once.
//! - [`metrics`]: the counters, in one place.
//! - [`topics`], [`reader`], [`load`]: topic management, reading to the end, loading input.
//! - [`pipeline`]: the long-running processor loop and its shutdown.
//! - [`bench`](mod@bench), [`pipeline_bench`]: producer throughput by mode; the pipeline's cost of
//!   exactly-once.
//! - [`generate`], [`verify`]: a seeded tick stream, and the oracle that checks the output.
//! - [`demo`]: the commit/abort experiment (5 versus 10).
//! - [`cli`]: the command-line pieces the thin binaries in `src/bin/` share.
//! - [`sink`]: past Kafka's edge: notifications into PostgreSQL, effectively once (`alert-sink`);
//!   [`sink_bench`]: its rows/s and tick-to-row latency.

pub mod alert;
pub mod bench;
pub mod cli;
pub mod config;
pub mod demo;
pub mod dlq;
pub mod engine;
pub mod failure;
pub mod generate;
pub mod load;
pub mod metrics;
pub mod pipeline;
pub mod pipeline_bench;
pub mod reader;
pub mod replay;
pub mod rules;
pub mod sink;
pub mod sink_bench;
pub mod state;
pub mod tick;
pub mod topics;
pub mod txn;
pub mod verify;
