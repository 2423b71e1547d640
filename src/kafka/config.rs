//! One place that builds every rdkafka client of the project.
//!
//! Every option set here carries a one-line reason. Users reach anything else librdkafka offers
//! (SASL, TLS, tuning) through pass-through properties (`-X key=value`, as in kcat, or the
//! `[librdkafka]` table of a config file). The properties the exactly-once guarantee rests on are
//! owned by this module: a pass-through that tries to change one is refused with a message naming
//! it, instead of silently weakening the guarantee.
//!
//! # Memory
//! librdkafka's defaults size its queues for throughput on a big machine, not for a processor
//! with a memory budget: a consumer prefetches up to 100,000 records or 64 MB (whichever comes
//! first, for all partitions together) and fetches up to 50 MB per response; a producer queues up
//! to 100,000 records or 1 GiB. Each queued record also costs librdkafka's own bookkeeping (a few
//! hundred bytes) beside its bytes. The processor's clients (group consumer, transactional
//! producer, readers) bound their queues on purpose below; every bound keeps more than what the
//! loop consumes or produces between two looks at the queue, so the loop never waits for data
//! that a larger queue would have had ready. A pass-through (`-X`) overrides any of them.
//! `bench/RESULTS.md` has the measurements behind the values.
//!
//! # Group protocol (KIP-848)
//! The group consumers of the three stages (the only clients that join a group: the readers and
//! the lag and offset probes assign partitions or ask a coordinator, and never join) speak the
//! protocol of [`GroupProtocol`]: `classic` (the default, for now: the rebalance benchmark of
//! issue 44 decides) or `consumer`, KIP-848's, where the broker computes the assignments and
//! hands them out in the heartbeats. What librdkafka 2.12.1 (this build: rdkafka-sys
//! 4.10.0+2.12.1) asks of a client under `consumer`:
//! - `session.timeout.ms`, `heartbeat.interval.ms`, `partition.assignment.strategy` and
//!   `group.protocol.type` may not be set: `rd_kafka_conf_finalize` (src/rdkafka_conf.c) refuses
//!   a consumer that has any of them ("`session.timeout.ms` is not supported for
//!   `group.protocol=consumer`. It is defined broker side"). The session and the heartbeat are
//!   the broker's (`group.consumer.session.timeout.ms`, 45 s by default, and at least
//!   `group.consumer.min.session.timeout.ms`, also 45 s), the assignor too
//!   (`group.remote.assignor`, `uniform` unless set; every KIP-848 assignor is sticky and
//!   incremental). So under `consumer` this module sets none of them, and
//!   [`KafkaConfig::with_group_protocol`] refuses a pass-through that does, at start, naming it,
//!   instead of letting the consumer's creation fail later. Under `classic`,
//!   `group.remote.assignor` is refused the same way: librdkafka would ignore it.
//! - `max.poll.interval.ms` is still enforced on the client, and sent to the broker as the
//!   member's rebalance timeout (how long it may take to revoke); it stays as below.
//! - The rebalance callback is incremental only (assign and revoke name the partitions that
//!   move), which is what `cooperative-sticky` gives the callbacks here already.
//! - Static membership (`group.instance.id`) is supported, with one difference that matters:
//!   a member that joins with an instance id still held by a live member (one that did not leave:
//!   a predecessor SIGKILLed or frozen) is refused with UNRELEASED_INSTANCE_ID, which librdkafka
//!   makes fatal, until the broker expires the holder's session; the classic protocol fenced the
//!   older member instead.
//!
//! Sources: librdkafka's INTRODUCTION.md, "Next Generation Consumer Group Protocol (KIP-848)"
//! (v2.12.1), its CONFIGURATION.md (`group.protocol`, `group.remote.assignor`, and the "not
//! supported for `group.protocol=consumer`" notes of the four properties), and its CHANGELOG
//! (KIP-848 GA in 2.12.0; #5541, fixed in 2.15.0 only: a member past `max.poll.interval.ms`
//! is refused with a fatal INVALID_REQUEST when it rejoins).

use anyhow::{bail, Context as _};
use rdkafka::config::ClientConfig;
use std::collections::BTreeMap;
use std::time::Duration;

/// librdkafka's own `max.poll.interval.ms`, which a reader keeps.
const LIBRDKAFKA_MAX_POLL_INTERVAL: Duration = Duration::from_secs(300);

/// How long a stage's loop may go without polling its group consumer before the group gives its
/// partitions to other members: a transactional call stuck to its deadline
/// ([`crate::kafka::txn::call_deadline`], 20 s at the default transaction timeout) plus 40 s, in
/// which a new producer usually registers again and a restore of the state reads a few seconds'
/// worth; 60 s at the default. It stays above librdkafka's `session.timeout.ms` (45 s), as
/// librdkafka requires, and below the watchdog's bound ([`crate::kafka::txn::stuck_bound`],
/// 90 s), so the group moves on before a stuck process is ended.
pub fn max_poll_interval(txn_timeout: Duration) -> Duration {
    crate::kafka::txn::call_deadline(txn_timeout) + Duration::from_secs(40)
}

/// Default bootstrap address: the local single-node broker of `scripts/kafka.sh`.
pub const DEFAULT_BOOTSTRAP: &str = "127.0.0.1:9092";

/// Default transaction timeout. Kafka Streams uses 10 s under EOS: long enough for a batch and
/// its commit, short enough that a crashed instance's open transaction does not stall read_committed
/// readers (the LSO) for long when it is not restarted with the same transactional.id.
pub const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Records the group consumer keeps prefetched (librdkafka: 100,000). The loop processes about
/// 60,000 ticks/s; 20,000 is a third of a second of work, while a fetch round trip on a healthy
/// link takes milliseconds, so the loop never waits for a fetch that a longer queue would have
/// made earlier.
pub const CONSUMER_QUEUED_MIN_MESSAGES: u32 = 20_000;

/// Prefetched bytes of the group consumer, KB (librdkafka: 65,536): bounds the prefetch when
/// records are large (a tick may be up to `--max-tick-bytes`); 20,000 ticks of ~70 bytes stay far
/// below it.
pub const CONSUMER_QUEUED_MAX_KBYTES: u32 = 4_096;

/// Bytes asked per partition in a fetch (librdkafka: 1 MiB). A fetch response lands whole in the
/// queue, past its bounds: six partitions at 1 MiB would overshoot the prefetch by 6 MiB at once.
/// 256 KiB is still thousands of ticks per partition per round trip. A larger record batch is
/// still returned whole (the broker never stalls a consumer on it).
pub const FETCH_PARTITION_BYTES: u32 = 262_144;

/// Bytes of one fetch response over all partitions (librdkafka: 50 MiB).
pub const FETCH_MAX_BYTES: u32 = 2_097_152;

/// How long a partition waits before fetching again once the prefetch is full (librdkafka:
/// 1,000 ms). With bounded queues the default starves the loop: it drains a full queue in a
/// fraction of a second, then waits for the rest of the second. A restore paid the same: the
/// reader paused a whole second each time 100,000 changelog records were queued.
pub const FETCH_QUEUE_BACKOFF_MS: u32 = 10;

/// How often a client that asks a group's coordinator for committed offsets (the lag probe and
/// the processor's rewinds and restores, [`KafkaConfig::group_probe`]) looks that coordinator up
/// again (librdkafka's `coordinator.query.interval.ms`: 10 min). In between, librdkafka changes
/// coordinator only when a request fails with a coordinator error or the connection drops, and a
/// timed-out request is sent again to the same broker. A coordinator whose broker is frozen
/// (SIGSTOP, a hung VM, a long pause) keeps its connection open and answers nothing: KRaft fences
/// it after `broker.session.timeout.ms` and the group moves, but the client goes on asking the
/// frozen broker. Measured on the 3-broker cluster (tests/coordinator.rs, the pipeline's freeze
/// case): the rewind after an abort waited 9.2 s and 19.6 s for its committed offsets, both times
/// until 40 s after the freeze, past the transaction timeout + 30 s that a stuck instance has to
/// heal in (issue 20); with 5 s it took 2.2 s. The cost is one FindCoordinator request per client
/// every 5 s. The group consumers keep librdkafka's default: a look-up that the broker refuses
/// (Read on the group revoked) parks librdkafka's consumer until one is allowed again, with its
/// heartbeats stopped ([`crate::kafka::offsets::GroupOffsets`]).
pub const COORDINATOR_QUERY_INTERVAL: Duration = Duration::from_secs(5);

/// How long a client that asks a group's coordinator for committed offsets waits for any one
/// answer before it drops that connection (librdkafka's `socket.timeout.ms`: 60 s). librdkafka
/// sends such a client's coordinator look-ups to one broker connection that it keeps up for them
/// (picked at random among the brokers, then the least idle one), and a frozen broker's
/// connection stays up until a request on it times out. When the frozen broker is that one, every
/// look-up goes to it, unanswered, and the client keeps asking the frozen coordinator: a rewind
/// in the pipeline's freeze case waited 17.4 s and 19.7 s, and the instance healed 40.3 s after
/// the freeze, past its bound (tests/coordinator.rs; issue 20). With 5 s the connection is
/// dropped 5 s after the first unanswered request, and the next look-up goes to another broker.
/// Nothing this client asks makes a broker wait before it answers (an offset fetch that must wait
/// for a previous owner's transaction is answered at once with UNSTABLE_OFFSET_COMMIT and asked
/// again), so only a silent or stalled broker trips it; a stall costs a reconnection.
pub const OFFSETS_CLIENT_SOCKET_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a client on a coordinator's path waits for a broker's ApiVersion answer before it drops
/// that connection (librdkafka's `api.version.request.timeout.ms`: 10 s): the transactional
/// producer, and the clients that ask a group's coordinator for committed offsets. ApiVersion is
/// the first request on every connection, and a live broker answers it in milliseconds; a frozen
/// broker (SIGSTOP, a hung VM) accepts the TCP connection and never answers it. A producer made
/// again after a stuck call asks FindCoordinator at once; when the frozen broker is also the active
/// controller, KRaft fences it only after electing another controller and a full broker session
/// (22-24 s on the 3-broker cluster, against 16-18 s otherwise), so the new producer may still be
/// told the frozen broker, and waited 10 s on its connection before asking again. Measured on
/// tests/coordinator.rs's freeze case with that broker the controller: the new producer registered
/// 7.9-8.6 s after the fencing and the instance healed 31.3-32.8 s after the freeze with 10 s; with
/// 3 s, 1.0 s after the fencing, and every run healed within 21.6-28.6 s (issue 19: a loaded
/// fresh-clone run went past the 40 s bound). A timed-out ApiVersion costs a reconnection, and the next
/// connection asks again (`api.version.fallback.ms` is 0); a live broker whose request threads
/// stall past 3 s (seen once under the suite's load) costs the same.
pub const API_VERSION_TIMEOUT: Duration = Duration::from_secs(3);

/// Records the transactional producer may hold, queued or in flight (librdkafka: 100,000). One
/// transaction of the default batch (5,000 ticks) writes at most one state record per tick and a
/// notification per crossed threshold; 32,768 holds more than that, and the commit drains the
/// queue, so only a runaway batch ever waits for room (the send waits, it does not fail).
pub const PRODUCER_QUEUE_MESSAGES: u32 = 32_768;

/// Bytes the transactional producer may hold, KB (librdkafka: 1 GiB): bounds the queue when
/// records are large. 16 MiB leaves room for full 1 MB batches to every partition the processor
/// writes (notifications, changelog, DLQ) in flight at once.
pub const PRODUCER_QUEUE_KBYTES: u32 = 16_384;

/// Properties that the pipeline sets itself and that a pass-through may not override.
/// The properties whose value is a file librdkafka opens when a client is created.
const FILE_PROPERTIES: &[&str] = &[
    "ssl.ca.location",
    "ssl.crl.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.keystore.location",
    "https.ca.location",
];

const MANAGED: &[(&str, &str)] = &[
    ("bootstrap.servers", "use --bootstrap (or KAFKA_BOOTSTRAP)"),
    ("group.id", "the group is derived from the application id"),
    ("group.instance.id", "it is derived from the instance id"),
    (
        "transactional.id",
        "it is derived from the application and instance ids",
    ),
    (
        "enable.auto.commit",
        "offsets are committed inside the transaction",
    ),
    (
        "enable.auto.offset.store",
        "offsets are committed inside the transaction",
    ),
    (
        "isolation.level",
        "the pipeline reads read_committed by design",
    ),
    (
        "enable.idempotence",
        "transactions and the at-least-once mode both require it",
    ),
    ("transaction.timeout.ms", "use --transaction-timeout"),
    ("group.protocol", "use --group-protocol (or GROUP_PROTOCOL)"),
];

/// The properties librdkafka refuses on a consumer of the `consumer` group protocol (KIP-848):
/// the broker owns them there (module doc, `# Group protocol`).
pub const CLASSIC_ONLY: &[(&str, &str)] = &[
    (
        "session.timeout.ms",
        "the broker sets it (group.consumer.session.timeout.ms)",
    ),
    (
        "heartbeat.interval.ms",
        "the broker sets it (group.consumer.heartbeat.interval.ms)",
    ),
    (
        "partition.assignment.strategy",
        "the broker assigns; -X group.remote.assignor=uniform|range picks its assignor",
    ),
    ("group.protocol.type", "the consumer protocol has none"),
];

/// The consumer group protocol of the stages' group consumers (module doc, `# Group protocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GroupProtocol {
    /// The classic protocol (JoinGroup/SyncGroup), with `cooperative-sticky`: the default.
    #[default]
    Classic,
    /// KIP-848's: the broker assigns, in the heartbeats (Kafka 4.0 or later).
    Consumer,
}

impl GroupProtocol {
    /// librdkafka's name of the protocol (`group.protocol`).
    pub fn as_str(self) -> &'static str {
        match self {
            GroupProtocol::Classic => "classic",
            GroupProtocol::Consumer => "consumer",
        }
    }
}

impl std::fmt::Display for GroupProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for GroupProtocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "classic" => Ok(GroupProtocol::Classic),
            "consumer" => Ok(GroupProtocol::Consumer),
            other => Err(format!(
                "unknown group protocol {other:?}: classic or consumer"
            )),
        }
    }
}

/// Connection settings shared by every client, plus the user's pass-through properties.
#[derive(Clone)]
pub struct KafkaConfig {
    /// `bootstrap.servers` of every client.
    pub bootstrap: String,
    /// Raw librdkafka properties applied to every client after ours (already validated).
    pub properties: BTreeMap<String, String>,
    /// The group protocol of the group consumers ([`KafkaConfig::group_consumer`]).
    pub group_protocol: GroupProtocol,
}

/// Secrets (`sasl.password`, …) show as `[redacted]`: a configuration may end up in a log line.
impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("bootstrap", &self.bootstrap)
            .field("properties", &super::secrets::redacted(&self.properties))
            .field("group_protocol", &self.group_protocol)
            .finish()
    }
}

/// How a standalone reader (verifier, state restore) sees transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    ReadCommitted,
    ReadUncommitted,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read_committed",
            Isolation::ReadUncommitted => "read_uncommitted",
        }
    }
}

impl KafkaConfig {
    /// Settings for `bootstrap` with no pass-through properties.
    pub fn new(bootstrap: impl Into<String>) -> Self {
        KafkaConfig {
            bootstrap: bootstrap.into(),
            properties: BTreeMap::new(),
            group_protocol: GroupProtocol::default(),
        }
    }

    /// The group consumers speak `protocol`; a pass-through property that it does not allow on
    /// the client is refused here, naming it, rather than by librdkafka when the consumer is
    /// made (module doc, `# Group protocol`).
    pub fn with_group_protocol(mut self, protocol: GroupProtocol) -> anyhow::Result<Self> {
        match protocol {
            GroupProtocol::Consumer => {
                if let Some((key, why)) = CLASSIC_ONLY
                    .iter()
                    .find(|(k, _)| self.properties.contains_key(*k))
                {
                    bail!(
                        "librdkafka property {key} is not allowed with --group-protocol consumer: {why}"
                    );
                }
            }
            GroupProtocol::Classic => {
                if self.properties.contains_key("group.remote.assignor") {
                    bail!(
                        "librdkafka property group.remote.assignor needs --group-protocol consumer (the classic protocol assigns on a member, with cooperative-sticky)"
                    );
                }
            }
        }
        self.group_protocol = protocol;
        Ok(self)
    }

    /// Adds pass-through properties (`key=value` strings), refusing malformed and managed ones.
    pub fn with_overrides<S: AsRef<str>>(mut self, pairs: &[S]) -> anyhow::Result<Self> {
        for pair in pairs {
            let pair = pair.as_ref();
            let Some((k, v)) = pair.split_once('=') else {
                bail!("librdkafka property {pair:?} must be written key=value");
            };
            self.set(k.trim(), v.trim())?;
        }
        Ok(self)
    }

    /// Adds one pass-through property, refusing the managed ones.
    pub fn set(&mut self, key: &str, value: &str) -> anyhow::Result<()> {
        if key.is_empty() {
            bail!("librdkafka property with an empty name");
        }
        if let Some((_, why)) = MANAGED.iter().find(|(k, _)| *k == key) {
            bail!("librdkafka property {key} cannot be overridden: {why}");
        }
        self.properties.insert(key.to_owned(), value.to_owned());
        Ok(())
    }

    /// Checks the pass-through properties against librdkafka itself, so a misspelt or invalid one
    /// is refused at start (librdkafka's message names it) instead of failing deep inside a
    /// client. Together, not one by one: some are only valid in company (security.protocol=SASL_SSL
    /// wants its sasl.mechanism). The message never repeats the values: one may be a password.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.check_files()?;
        let mut c = ClientConfig::new();
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        // No bootstrap.servers: the client is created and dropped without connecting.
        if let Err(e) = c.create::<rdkafka::producer::BaseProducer>() {
            // rust-rdkafka's message repeats the property's value after its name: say the
            // reason and the name only, and scrub what librdkafka's reason may quote.
            let reason = match &e {
                rdkafka::error::KafkaError::ClientConfig(_, reason, key, _) => {
                    format!("{reason} ({key})")
                }
                other => other.to_string(),
            };
            bail!(
                "librdkafka properties refused: {}",
                super::secrets::scrub(&reason, &self.properties)
            );
        }
        Ok(())
    }

    /// Checks that each file a property names can be opened, so a mistyped path is refused naming
    /// the property, the path and the system's reason: librdkafka's own refusal names the
    /// property only, with OpenSSL's code (`ssl.ca.location failed: error:05880002:x509
    /// certificate routines::system lib`).
    fn check_files(&self) -> anyhow::Result<()> {
        for key in FILE_PROPERTIES {
            let Some(path) = self.properties.get(*key) else {
                continue;
            };
            // ssl.ca.location=probe asks librdkafka to look in the system's usual places.
            if *key == "ssl.ca.location" && path == "probe" {
                continue;
            }
            // A directory (ssl.ca.location may be one) opens too on the systems we run on. The
            // path is named unless librdkafka counts the property sensitive (ssl.key.location):
            // nothing this project prints carries such a value.
            std::fs::File::open(path).with_context(|| {
                if super::secrets::is_sensitive(key) {
                    format!("{key}: cannot read the file it names")
                } else {
                    format!("{key}: cannot read {path}")
                }
            })?;
        }
        Ok(())
    }

    fn base(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap);
        c
    }

    fn producer_base(&self) -> ClientConfig {
        let mut c = self.base();
        // librdkafka's default (consistent_random) differs from the Java client's murmur2: match
        // Java so that every client of the same topic puts a symbol on the same partition.
        c.set("partitioner", "murmur2_random");
        c
    }

    /// Bounds a consumer's prefetch (see the module's `# Memory`).
    fn bounded_fetch(c: &mut ClientConfig) {
        c.set(
            "queued.min.messages",
            CONSUMER_QUEUED_MIN_MESSAGES.to_string(),
        );
        c.set(
            "queued.max.messages.kbytes",
            CONSUMER_QUEUED_MAX_KBYTES.to_string(),
        );
        c.set(
            "max.partition.fetch.bytes",
            FETCH_PARTITION_BYTES.to_string(),
        );
        c.set("fetch.max.bytes", FETCH_MAX_BYTES.to_string());
        c.set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS.to_string());
    }

    /// Finds a moved group coordinator within [`COORDINATOR_QUERY_INTERVAL`], and leaves a silent
    /// broker within [`OFFSETS_CLIENT_SOCKET_TIMEOUT`], for a client that asks its group's
    /// coordinator for committed offsets.
    fn follow_coordinator(c: &mut ClientConfig) {
        c.set(
            "coordinator.query.interval.ms",
            COORDINATOR_QUERY_INTERVAL.as_millis().to_string(),
        );
        c.set(
            "socket.timeout.ms",
            OFFSETS_CLIENT_SOCKET_TIMEOUT.as_millis().to_string(),
        );
        Self::leave_a_silent_broker(c);
    }

    /// Drops a connection whose broker does not answer ApiVersion within
    /// [`API_VERSION_TIMEOUT`].
    fn leave_a_silent_broker(c: &mut ClientConfig) {
        c.set(
            "api.version.request.timeout.ms",
            API_VERSION_TIMEOUT.as_millis().to_string(),
        );
    }

    fn finish(&self, mut c: ClientConfig) -> ClientConfig {
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }

    /// Admin client (topic creation, metadata).
    pub fn admin(&self) -> ClientConfig {
        let mut c = self.finish(self.base());
        // Also the config of the metadata consumers (connect and access checks).
        self.poll_interval_covers_session(&mut c, LIBRDKAFKA_MAX_POLL_INTERVAL);
        c
    }

    /// The group consumer of a stage whose transactions time out after `txn_timeout` (the sink,
    /// which has none, passes the default: its loop's longest call is shorter).
    pub fn group_consumer(
        &self,
        group_id: &str,
        instance_id: Option<&str>,
        txn_timeout: Duration,
    ) -> ClientConfig {
        let mut c = self.base();
        c.set("group.id", group_id);
        // librdkafka's default is 300 s: an instance stuck between two polls (a call that never
        // returns, librdkafka #5456) would keep its partitions five minutes. Every call of the
        // loop has a deadline instead (crate::kafka::txn, `# Deadlines`), so a loop that has not
        // polled for `max_poll_interval` is stuck past what it mends itself: the group hands its
        // partitions to the others then, before the watchdog ends the process.
        c.set(
            "max.poll.interval.ms",
            max_poll_interval(txn_timeout).as_millis().to_string(),
        );
        if let Some(id) = instance_id {
            // Static membership (KIP-345): a restarted instance takes its partitions back at once
            // instead of waiting session.timeout.ms for its dead predecessor to be evicted.
            c.set("group.instance.id", id);
        }
        // Offsets are committed by the producer inside the transaction, never by the consumer.
        c.set("enable.auto.commit", "false");
        c.set("enable.auto.offset.store", "false");
        // Set explicitly (librdkafka's default today): never process an aborted upstream record.
        c.set("isolation.level", "read_committed");
        match self.group_protocol {
            // Incremental rebalances: only the partitions that move are revoked, so the others
            // keep their open transaction and their state.
            GroupProtocol::Classic => {
                c.set("partition.assignment.strategy", "cooperative-sticky");
            }
            // The broker assigns, incrementally and sticky; librdkafka refuses a strategy here.
            GroupProtocol::Consumer => {
                c.set("group.protocol", GroupProtocol::Consumer.as_str());
            }
        }
        // A new group starts at the beginning of the input: no tick is skipped.
        c.set("auto.offset.reset", "earliest");
        // Statistics every 5 s give the consumer lag per partition (a metric); cheap at that rate.
        c.set("statistics.interval.ms", "5000");
        // A bounded prefetch: librdkafka's defaults held the whole backlog in memory.
        Self::bounded_fetch(&mut c);
        let mut c = self.finish(c);
        self.poll_interval_covers_session(&mut c, max_poll_interval(txn_timeout));
        c
    }

    /// librdkafka refuses a consumer whose max.poll.interval.ms is below its session.timeout.ms:
    /// a longer session given with -X (and no poll interval) raises the poll interval of every
    /// consumer with it, above `poll` (what the consumer has without it).
    fn poll_interval_covers_session(&self, c: &mut ClientConfig, poll: Duration) {
        if self.properties.contains_key("max.poll.interval.ms") {
            return;
        }
        let session = c
            .get("session.timeout.ms")
            .and_then(|s| s.parse::<u64>().ok());
        if let Some(session) = session.filter(|&s| s > poll.as_millis() as u64) {
            c.set("max.poll.interval.ms", session.to_string());
        }
    }

    /// A standalone reader (no group, nothing committed) that reports the end of each partition.
    pub fn reader(&self, isolation: Isolation) -> ClientConfig {
        // librdkafka wants a group.id even for assign(); nothing is ever committed with it.
        self.reader_of_group("price-alerts-reader", isolation, false)
    }

    /// A reader that asks `group`'s coordinator for the group's committed offsets (the lag probe,
    /// the processor's [`crate::kafka::offsets::GroupOffsets`]). It never joins the group.
    pub fn group_probe(&self, group: &str, isolation: Isolation) -> ClientConfig {
        self.reader_of_group(group, isolation, true)
    }

    fn reader_of_group(
        &self,
        group: &str,
        isolation: Isolation,
        asks_coordinator: bool,
    ) -> ClientConfig {
        let mut c = self.base();
        c.set("group.id", group);
        if asks_coordinator {
            Self::follow_coordinator(&mut c);
        }
        c.set("enable.auto.commit", "false");
        c.set("enable.auto.offset.store", "false");
        // Readers count records up to the end of a partition, so they need the EOF event.
        c.set("enable.partition.eof", "true");
        // A reader waits for the end, not for data: do not let an empty fetch idle for the 500 ms
        // default before the end is known (restores and verifiers would each pay it).
        c.set("fetch.wait.max.ms", "20");
        // Readers read a topic from its beginning (a restore, the whole changelog) as fast as the
        // loop takes records, with the processor's bounded prefetch: the defaults held up to
        // 100,000 records and then paused each partition a full second.
        Self::bounded_fetch(&mut c);
        c.set("isolation.level", isolation.as_str());
        c.set("auto.offset.reset", "earliest");
        let mut c = self.finish(c);
        // A reader never joins its group, but librdkafka checks the two all the same.
        self.poll_interval_covers_session(&mut c, LIBRDKAFKA_MAX_POLL_INTERVAL);
        c
    }

    /// The transactional producer of one processor instance.
    pub fn transactional_producer(
        &self,
        transactional_id: &str,
        txn_timeout: Duration,
    ) -> anyhow::Result<ClientConfig> {
        let mut c = self.producer_base();
        // Stable per instance: a restart fences its predecessor and aborts what it left open.
        c.set("transactional.id", transactional_id);
        c.set(
            "transaction.timeout.ms",
            txn_timeout.as_millis().to_string(),
        );
        // Implied by transactional.id; set so that the configuration reads as what it is.
        c.set("enable.idempotence", "true");
        Self::leave_a_silent_broker(&mut c);
        // Statistics every 5 s name the transaction coordinator, which the line about a stuck
        // call reports (crate::kafka::txn); cheap at that rate.
        c.set("statistics.interval.ms", "5000");
        c.set("acks", "all");
        // A message must fail before its transaction can time out, or a stuck send would surface as
        // a confusing coordinator timeout instead of a delivery error (librdkafka requires it).
        let message_timeout = txn_timeout
            .saturating_sub(Duration::from_secs(1))
            .max(Duration::from_millis(1000));
        c.set(
            "message.timeout.ms",
            message_timeout.as_millis().to_string(),
        );
        // A bounded queue (see the module's `# Memory`); a full one makes a send wait, not fail.
        c.set(
            "queue.buffering.max.messages",
            PRODUCER_QUEUE_MESSAGES.to_string(),
        );
        c.set(
            "queue.buffering.max.kbytes",
            PRODUCER_QUEUE_KBYTES.to_string(),
        );
        let c = self.finish(c);
        check_message_timeout(&c, txn_timeout)?;
        Ok(c)
    }

    /// An idempotent, non-transactional producer (at-least-once mode, the tick feed).
    pub fn idempotent_producer(&self) -> ClientConfig {
        let mut c = self.producer_base();
        // No duplicates or reordering from producer retries.
        c.set("enable.idempotence", "true");
        c.set("acks", "all");
        self.finish(c)
    }

    /// A plain producer without idempotence (benchmarks only).
    pub fn plain_producer(&self, acks: &str) -> ClientConfig {
        let mut c = self.producer_base();
        c.set("enable.idempotence", "false");
        c.set("acks", acks);
        self.finish(c)
    }
}

/// Refuses a message.timeout.ms (possibly from a pass-through) not below the transaction timeout.
fn check_message_timeout(c: &ClientConfig, txn_timeout: Duration) -> anyhow::Result<()> {
    let Some(v) = c.get("message.timeout.ms") else {
        return Ok(());
    };
    let ms: u128 = v
        .parse()
        .with_context(|| format!("message.timeout.ms={v} is not a number"))?;
    if ms >= txn_timeout.as_millis() {
        bail!(
            "message.timeout.ms={ms} must be below the transaction timeout ({} ms)",
            txn_timeout.as_millis()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_properties_are_refused() {
        let err = KafkaConfig::new("x")
            .with_overrides(&["enable.auto.commit=true"])
            .unwrap_err();
        assert!(err.to_string().contains("enable.auto.commit"), "{err}");
        assert!(KafkaConfig::new("x")
            .with_overrides(&["isolation.level=read_uncommitted"])
            .is_err());
        assert!(KafkaConfig::new("x")
            .with_overrides(&["no-equals-sign"])
            .is_err());
    }

    #[test]
    fn pass_through_reaches_every_client() {
        let k = KafkaConfig::new("h:1")
            .with_overrides(&["security.protocol=SSL", "linger.ms=7"])
            .unwrap();
        for c in [
            k.admin(),
            k.group_consumer("g", None, DEFAULT_TRANSACTION_TIMEOUT),
            k.reader(Isolation::ReadCommitted),
            k.transactional_producer("t", DEFAULT_TRANSACTION_TIMEOUT)
                .unwrap(),
            k.idempotent_producer(),
        ] {
            assert_eq!(c.get("security.protocol"), Some("SSL"));
            assert_eq!(c.get("bootstrap.servers"), Some("h:1"));
        }
    }

    #[test]
    fn a_consumer_stuck_past_its_deadlines_gives_its_partitions_away_before_the_watchdog() {
        let c = KafkaConfig::new("h:1").group_consumer("g", None, DEFAULT_TRANSACTION_TIMEOUT);
        assert_eq!(c.get("max.poll.interval.ms"), Some("60000"));
        let poll = max_poll_interval(DEFAULT_TRANSACTION_TIMEOUT);
        // librdkafka's default session.timeout.ms, which max.poll.interval.ms may not undercut.
        assert!(poll >= Duration::from_secs(45));
        assert!(poll > crate::kafka::txn::call_deadline(DEFAULT_TRANSACTION_TIMEOUT));
        assert!(poll < crate::kafka::txn::stuck_bound(DEFAULT_TRANSACTION_TIMEOUT));
        let long = Duration::from_secs(120);
        assert!(max_poll_interval(long) > crate::kafka::txn::call_deadline(long));
        // A longer session given by the user raises it (librdkafka refuses it below the session).
        let k = KafkaConfig::new("h:1")
            .with_overrides(&["session.timeout.ms=180000"])
            .unwrap();
        let c = k.group_consumer("g", None, DEFAULT_TRANSACTION_TIMEOUT);
        assert_eq!(c.get("max.poll.interval.ms"), Some("180000"));
        c.create::<rdkafka::consumer::BaseConsumer>()
            .expect("librdkafka accepts it");
    }

    /// The clients that ask a group's coordinator for committed offsets follow it when it moves
    /// (see [`COORDINATOR_QUERY_INTERVAL`]); the group consumer and the readers keep librdkafka's
    /// default; a `-X` value still wins.
    #[test]
    fn clients_that_ask_a_group_coordinator_find_a_moved_one_within_seconds() {
        let k = KafkaConfig::new("h:1");
        let probe = k.group_probe("g", crate::kafka::Isolation::ReadCommitted);
        assert_eq!(probe.get("coordinator.query.interval.ms"), Some("5000"));
        assert_eq!(probe.get("socket.timeout.ms"), Some("5000"));
        assert_eq!(probe.get("api.version.request.timeout.ms"), Some("3000"));
        assert_eq!(probe.get("group.id"), Some("g"));
        assert_eq!(probe.get("isolation.level"), Some("read_committed"));
        probe
            .create::<rdkafka::consumer::BaseConsumer>()
            .expect("librdkafka accepts it");
        let consumer = k.group_consumer("g", Some("i"), DEFAULT_TRANSACTION_TIMEOUT);
        let reader = k.reader(crate::kafka::Isolation::ReadCommitted);
        for c in [consumer, reader] {
            assert_eq!(c.get("coordinator.query.interval.ms"), None);
            assert_eq!(c.get("socket.timeout.ms"), None);
            assert_eq!(c.get("api.version.request.timeout.ms"), None);
        }
        let txn = k
            .transactional_producer("t", DEFAULT_TRANSACTION_TIMEOUT)
            .unwrap();
        assert_eq!(txn.get("api.version.request.timeout.ms"), Some("3000"));
        let k = k
            .with_overrides(&["coordinator.query.interval.ms=60000"])
            .unwrap();
        let probe = k.group_probe("g", crate::kafka::Isolation::ReadUncommitted);
        assert_eq!(probe.get("coordinator.query.interval.ms"), Some("60000"));
    }

    /// A session longer than librdkafka's 300 s poll interval, given with -X, reaches every
    /// consumer the binaries make (the lag and DLQ watchers and the restores read with
    /// `reader`, the connect and access checks use `admin`): each one must still be accepted.
    #[test]
    fn a_session_longer_than_the_default_poll_interval_is_accepted_by_every_consumer() {
        let k = KafkaConfig::new("h:1")
            .with_overrides(&["session.timeout.ms=400000"])
            .unwrap();
        for c in [
            k.group_consumer("g", None, DEFAULT_TRANSACTION_TIMEOUT),
            k.reader(crate::kafka::Isolation::ReadCommitted),
            k.admin(),
        ] {
            assert_eq!(c.get("max.poll.interval.ms"), Some("400000"));
            c.create::<rdkafka::consumer::BaseConsumer>()
                .expect("librdkafka accepts it");
        }
    }

    #[test]
    fn consumer_settings_the_guarantee_rests_on() {
        let c = KafkaConfig::new("h:1").group_consumer("g", Some("i"), DEFAULT_TRANSACTION_TIMEOUT);
        assert_eq!(c.get("enable.auto.commit"), Some("false"));
        assert_eq!(c.get("isolation.level"), Some("read_committed"));
        assert_eq!(
            c.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        assert_eq!(c.get("group.instance.id"), Some("i"));
    }

    /// Under the consumer protocol the group consumer names the protocol and none of the
    /// settings librdkafka refuses there, and librdkafka accepts it (its own check runs when the
    /// consumer is made); everything the guarantee rests on stays.
    #[test]
    fn a_group_consumer_of_the_consumer_protocol_is_accepted_by_librdkafka() {
        let k = KafkaConfig::new("h:1")
            .with_group_protocol(GroupProtocol::Consumer)
            .unwrap();
        for instance in [None, Some("i")] {
            let c = k.group_consumer("g", instance, DEFAULT_TRANSACTION_TIMEOUT);
            assert_eq!(c.get("group.protocol"), Some("consumer"));
            for (key, _) in CLASSIC_ONLY {
                assert_eq!(c.get(key), None, "{key} is the broker's under consumer");
            }
            assert_eq!(c.get("enable.auto.commit"), Some("false"));
            assert_eq!(c.get("isolation.level"), Some("read_committed"));
            assert_eq!(c.get("max.poll.interval.ms"), Some("60000"));
            assert_eq!(c.get("group.instance.id"), instance);
            c.create::<rdkafka::consumer::BaseConsumer>()
                .expect("librdkafka accepts it");
        }
        // Only the group consumer joins a group: readers and probes keep librdkafka's default.
        assert_eq!(
            k.reader(Isolation::ReadCommitted).get("group.protocol"),
            None
        );
        assert_eq!(
            k.group_probe("g", Isolation::ReadCommitted)
                .get("group.protocol"),
            None
        );
        // Classic, the default, is as it was.
        let c = KafkaConfig::new("h:1").group_consumer("g", None, DEFAULT_TRANSACTION_TIMEOUT);
        assert_eq!(c.get("group.protocol"), None);
    }

    /// What the consumer protocol forbids on the client is refused when the protocol is chosen,
    /// naming the property and where the setting lives instead; `group.protocol` itself belongs
    /// to --group-protocol; `group.remote.assignor` is refused under classic, which ignores it.
    #[test]
    fn settings_a_protocol_forbids_are_refused_naming_them() {
        for (key, value) in [
            ("session.timeout.ms", "6000"),
            ("heartbeat.interval.ms", "1000"),
            ("partition.assignment.strategy", "roundrobin"),
            ("group.protocol.type", "consumer"),
        ] {
            let k = KafkaConfig::new("h:1")
                .with_overrides(&[format!("{key}={value}")])
                .unwrap();
            let err = k
                .clone()
                .with_group_protocol(GroupProtocol::Consumer)
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{err}");
            assert!(err.contains("--group-protocol consumer"), "{err}");
            assert!(!err.contains(value) || value == "consumer", "{err}");
            // The classic protocol takes them as before.
            k.with_group_protocol(GroupProtocol::Classic).unwrap();
        }
        let err = KafkaConfig::new("h:1")
            .with_overrides(&["group.protocol=consumer"])
            .unwrap_err();
        assert!(err.to_string().contains("--group-protocol"), "{err}");
        let k = KafkaConfig::new("h:1")
            .with_overrides(&["group.remote.assignor=range"])
            .unwrap();
        let err = k
            .clone()
            .with_group_protocol(GroupProtocol::Classic)
            .unwrap_err();
        assert!(err.to_string().contains("group.remote.assignor"), "{err}");
        let k = k.with_group_protocol(GroupProtocol::Consumer).unwrap();
        let c = k.group_consumer("g", None, DEFAULT_TRANSACTION_TIMEOUT);
        assert_eq!(c.get("group.remote.assignor"), Some("range"));
        c.create::<rdkafka::consumer::BaseConsumer>()
            .expect("librdkafka accepts it");
    }

    #[test]
    fn properties_are_validated_together() {
        // Alone, security.protocol=SASL_* asks for the default mechanism (GSSAPI), which this
        // build lacks; with its mechanism it is a valid configuration.
        let sasl = [
            "security.protocol=SASL_PLAINTEXT",
            "sasl.mechanism=SCRAM-SHA-512",
            "sasl.username=alerts",
            "sasl.password=not-a-real-one",
        ];
        KafkaConfig::new("h:1")
            .with_overrides(&sasl)
            .unwrap()
            .validate()
            .unwrap();
        let err = KafkaConfig::new("h:1")
            .with_overrides(&["linger.ms=soon"])
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("linger.ms"), "{err}");
        let err = KafkaConfig::new("h:1")
            .with_overrides(&["no.such.property=1"])
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("no.such.property"), "{err}");
    }

    #[test]
    fn debug_never_shows_a_password() {
        let k = KafkaConfig::new("h:1")
            .with_overrides(&["sasl.password=hunter2-secret", "sasl.username=u"])
            .unwrap();
        let shown = format!("{k:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("sasl.username"), "{shown}");
    }

    #[test]
    fn queues_are_bounded_and_a_pass_through_wins() {
        let k = KafkaConfig::new("h:1");
        for c in [
            k.group_consumer("g", None, DEFAULT_TRANSACTION_TIMEOUT),
            k.reader(Isolation::ReadCommitted),
        ] {
            assert_eq!(c.get("queued.min.messages"), Some("20000"));
            assert_eq!(c.get("queued.max.messages.kbytes"), Some("4096"));
            assert_eq!(c.get("max.partition.fetch.bytes"), Some("262144"));
            assert_eq!(c.get("fetch.max.bytes"), Some("2097152"));
            // A bounded queue with librdkafka's 1 s back-off would starve the loop.
            assert_eq!(c.get("fetch.queue.backoff.ms"), Some("10"));
        }
        let p = k
            .transactional_producer("t", DEFAULT_TRANSACTION_TIMEOUT)
            .unwrap();
        assert_eq!(p.get("queue.buffering.max.messages"), Some("32768"));
        assert_eq!(p.get("queue.buffering.max.kbytes"), Some("16384"));
        let k = KafkaConfig::new("h:1")
            .with_overrides(&[
                "queued.min.messages=100000",
                "queue.buffering.max.kbytes=1048576",
            ])
            .unwrap();
        assert_eq!(
            k.group_consumer("g", None, DEFAULT_TRANSACTION_TIMEOUT)
                .get("queued.min.messages"),
            Some("100000")
        );
        assert_eq!(
            k.transactional_producer("t", DEFAULT_TRANSACTION_TIMEOUT)
                .unwrap()
                .get("queue.buffering.max.kbytes"),
            Some("1048576")
        );
    }

    #[test]
    fn bounded_settings_are_valid_for_librdkafka() {
        let k = KafkaConfig::new("h:1");
        k.group_consumer("g", Some("i"), DEFAULT_TRANSACTION_TIMEOUT)
            .create::<rdkafka::consumer::BaseConsumer>()
            .unwrap();
        k.reader(Isolation::ReadCommitted)
            .create::<rdkafka::consumer::BaseConsumer>()
            .unwrap();
    }

    #[test]
    fn message_timeout_below_transaction_timeout() {
        let c = KafkaConfig::new("h:1")
            .transactional_producer("t", Duration::from_secs(10))
            .unwrap();
        assert_eq!(c.get("message.timeout.ms"), Some("9000"));
        let k = KafkaConfig::new("h:1")
            .with_overrides(&["message.timeout.ms=60000"])
            .unwrap();
        let err = k
            .transactional_producer("t", Duration::from_secs(10))
            .unwrap_err();
        assert!(err.to_string().contains("must be below"), "{err}");
    }
}
