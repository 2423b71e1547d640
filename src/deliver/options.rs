//! alert-deliver's options: the one struct a deliverer runs with. The command line that builds it
//! is `crate::cli::deliver`.

use super::breaker::BreakerConfig;
use super::buckets::Buckets;
use super::subscriptions::Subscriptions;
use crate::kafka::KafkaConfig;
use std::time::Duration;

/// Default largest batch, in records: one Kafka transaction each.
pub const DEFAULT_MAX_BATCH: usize = 1_000;
/// Default largest batch, in deliveries (a notification's subscribers, a retry's one). The
/// records of a batch are delivered together and then committed, so what a batch delivers, not
/// how many records it has, sets both how long a fresh notification waits behind it and how many
/// deliveries share one commit: bounding records alone made a fan-out of 1 pay a commit per 100
/// deliveries (0.31 of the at-most-once reference) and a fan-out of 100 wait behind 10,000.
pub const DEFAULT_MAX_BATCH_DELIVERIES: usize = 4_000;
/// Default bound on concurrent deliveries of the records of one partition.
pub const DEFAULT_PARTITION_CONCURRENCY: usize = 16;

/// Everything one deliverer instance runs with.
#[derive(Debug, Clone)]
pub struct DeliverOptions {
    pub kafka: KafkaConfig,
    /// Who receives what.
    pub subscriptions: Subscriptions,
    /// The notifications topic and its retry buckets (the DLQ and parking lot are named after it).
    pub buckets: Buckets,
    /// The deliverer's consumer group; it reads the notifications topic and every bucket.
    pub group_id: String,
    /// Static membership (`group.instance.id`): a restarted instance takes its partitions back at
    /// once. None: dynamic membership.
    pub group_instance_id: Option<String>,
    /// Stable per instance: a restart fences its predecessor and aborts what it left open.
    pub transactional_id: String,
    /// Records per batch (one transaction), at most.
    pub max_batch: usize,
    /// Deliveries per batch, at most, as counted when polling (a notification's subscribers by
    /// its key, a retry's one); a batch always takes its first record.
    pub max_batch_deliveries: usize,
    /// Concurrent deliveries of one partition's records, at most (each subscriber has its own
    /// bound too, `max_in_flight`).
    pub partition_concurrency: usize,
    /// Bound on connecting to a subscriber.
    pub connect_timeout: Duration,
    /// Bound on a whole request, connection included.
    pub request_timeout: Duration,
    /// How long a batch waits for its deliveries, at most (default: the request timeout). A
    /// delivery not started by then is deferred to the next bucket untried; one started and not
    /// answered is handed on as `deadline` (its request runs on, detached, to its own timeout).
    pub delivery_deadline: Duration,
    /// The per-subscriber circuit breaker ([`super::breaker`]).
    pub breaker: BreakerConfig,
    /// `transaction.timeout.ms` of the producer.
    pub transaction_timeout: Duration,
    /// `retention.ms` of the bucket, DLQ and parking-lot topics when they have to be created.
    pub retention: Duration,
    /// How long a graceful shutdown may take before exiting non-zero.
    pub shutdown_timeout: Duration,
    /// Where metrics are served (`--metrics-addr`): watch the DLQ and the parking lot for their
    /// backlog gauges, and read the buckets' ends for their lag gauges, each on a thread of its
    /// own. The backlog watchers read both topics and their replay ledgers, rights the `deliver`
    /// role has only with `scripts/acls.sh … --dlq-gauges`.
    pub backlog_gauges: bool,
    /// Stop once nothing was polled for this long, partitions owned and none held (no retry
    /// waiting for its due time): demos and benchmarks.
    pub exit_when_idle: Option<Duration>,
    /// TEST ONLY: abort the process once this many hand-off records are written (flushed into
    /// the log) by this process, inside the open transaction: a crash in the middle of a hand-off.
    pub test_crash_after_handoffs: Option<u64>,
    /// TEST ONLY: abort the N-th hand-off transaction of this process (1-based) instead of
    /// committing it, through the path an abortable commit error takes.
    pub test_abort_handoff_txn: Option<u64>,
    /// TEST ONLY: while this file exists, abort every hand-off transaction.
    pub test_abort_handoffs_while: Option<std::path::PathBuf>,
    /// TEST ONLY: while this file exists, hold right before each hand-off transaction's
    /// send_offsets_to_transaction ([`crate::kafka::hold`]).
    pub test_hold_send_offsets: Option<std::path::PathBuf>,
    /// TEST ONLY: every abort of a hand-off transaction fails fatally, leaving it open on the
    /// broker ([`crate::kafka::txn::TxnProducer::fail_next_abort`]).
    pub test_aborts_fail_fatally: bool,
}
