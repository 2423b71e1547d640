//! `alert-sink`: notifications into PostgreSQL, effectively once.
//!
//! A Kafka transaction cannot include a database write, so past Kafka's edge exactly-once becomes
//! at-least-once delivery made harmless by idempotent effects, twice over:
//! 1. every row has a stable primary key (the notification id) and is written with
//!    `ON CONFLICT (id) DO NOTHING`, so storing it again changes nothing;
//! 2. the sink's consumed offsets live in the same database (`sink_offsets`) and commit in the
//!    same transaction as the rows, so "stored" and "consumed" cannot disagree, and a restarted or
//!    new owner of a partition starts exactly past what is stored.
//!
//! ```text
//! notifications ──► poll (read_committed, group <app>-sink) ──► decode ─┬─► alerts row
//!   (Kafka)                                                             └─► dead letter
//!   ── per batch, ONE database transaction: rows + dead letters + sink_offsets (GREATEST) ──
//!   ── then, for lag monitoring only, the same offsets committed to the Kafka group ──
//! ```
//!
//! # Failures
//! - A record that can never be stored (not a notification, refused by a constraint) is a permanent
//!   failure: a row of `sink_dead_letters`, in the same transaction as the offset past it.
//! - A database outage is not a record failure: the partitions are paused, the consumer keeps
//!   polling (it stays in the group), the connection is retried with backoff, and the same batch is
//!   written once it answers. Readiness (`alerts_sink_ready`) is 0 meanwhile.
//! - Anything else the database says (missing table, no permission) stops the sink non-zero.
//!
//! # Module map
//! - [`options`]: the options struct and the command line, the secret-safe database URL.
//! - [`record`]: what a record becomes: a row or a dead letter (pure).
//! - [`db`]: connecting (TLS), migrations, what a database error means.
//! - [`store`]: one batch in one transaction; why a redo is harmless and offsets never go back.
//! - [`state`]: what the sink owns per partition, its open batch and its counters; the table of
//!   what each event does to a partition, one method per event.
//! - [`partitions`]: the batch and outages (pause, reconnect, resume); the invariants.
//! - [`rebalance`]: the consumer's context: where an assigned partition starts, what becomes of a
//!   revoked partition's records.
//! - [`group_offsets`]: the stored offsets committed to the Kafka group until it has them.
//! - [`run`](mod@run): start-up, the poll loop, shutdown.
//! - [`metrics`]: the sink's counters and readiness.
//! - [`check`]: the table against the verifier's expected notifications.

pub mod check;
pub mod db;
pub mod group_offsets;
pub mod metrics;
pub mod options;
pub mod partitions;
pub mod rebalance;
pub mod record;
pub mod run;
pub mod state;
pub mod store;

pub use options::{DbOptions, SinkOptions};
pub use run::{migrate_only, run};
pub use state::SinkStats;
