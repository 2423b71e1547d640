//! The Kafka plumbing every binary shares; nothing here knows about ticks' meaning or alerts (the
//! tick feed and the rules topic's reader carry records to and from the domain's codecs).
//!
//! - [`config`]: the one place that builds rdkafka client configurations, and the pass-through
//!   properties with the ones the guarantee rests on refused.
//! - [`connect`]: the start-up check that a broker answers, naming the address and the cause.
//! - [`secrets`]: where passwords may come from (a mode-600 `--config` file, an environment
//!   variable; never the command line) and their redaction.
//! - [`access`]: the start-up authorisation check: the rights each binary needs, named when
//!   missing ("Write on Topic notifications").
//! - [`logging`]: librdkafka's own lines and events through tracing, rate-limited.
//! - [`blocking`]: librdkafka's blocking calls made from async code, on a thread of their own.
//! - [`topics`]: a deployment's topic names, and creating them (changelog partition-aligned);
//!   deleting them again (tests, benchmarks).
//! - [`cleanup`]: what a topic does with old records, and the changelog's compaction settings.
//! - [`changelog`]: why those settings (a restore reads about one record per symbol), and the
//!   check of an existing changelog against them.
//! - [`tpl`]: building partition lists (a leaf).
//! - [`offsets`]: committed offsets (fetched as stable), and seeking to them.
//! - [`txn`]: the transactional producer that the pipeline, alert-deliver and dlq-replay share,
//!   the one `classify` of its errors, and the deadline on every transactional call.
//! - [`away`]: how long the process was stopped or paused, which tells a thawed zombie's fence
//!   from a coordinator's timeout, and which no call's deadline counts.
//! - [`group`]: a fatal error of a stage's group consumer (static membership refused or
//!   fenced), said for what it means under each group protocol.
//! - [`group_lag`]: the group's committed offset, end and lag on every partition of a topic,
//!   owned or not, refreshed off the processing thread: a partition nobody consumes shows.
//! - [`pause`]: the one owner of a consumer's paused partitions, which sets librdkafka's pause
//!   flag again on every assign (the flag outlives an unassign).
//! - [`read`]: standalone readers that read partitions to their end, counting records (never
//!   subtracting offsets: transaction markers occupy offsets).
//! - [`feed`]: the upstream tick feed: an idempotent producer that loads input and says where
//!   each record landed.
//! - [`rules`]: the rules topic's records as the live-alert join takes them (the domain decodes
//!   them), and a whole rules topic read into joins.
//! - [`hold`]: TEST ONLY: holds a process before a transactional call while a test breaks the
//!   cluster (`--test-hold-send-offsets`).

pub mod access;
pub mod away;
pub mod blocking;
pub mod changelog;
pub mod cleanup;
pub mod config;
pub mod connect;
pub mod feed;
pub mod group;
pub mod group_lag;
pub mod hold;
pub mod logging;
pub mod offsets;
pub mod pause;
pub mod read;
pub mod rules;
pub mod secrets;
pub mod topics;
pub mod tpl;
pub mod txn;

pub use config::{Isolation, KafkaConfig};
