//! What the broker answered for each record: the delivery reports' context (failures counted,
//! refused topics noted, the transaction coordinator's address), and the drain before a commit.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing::debug;

/// Bound on waiting for in-flight records before a commit.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Counts delivery failures, which in a transaction show up again as an abortable commit error;
/// the at-least-once mode reads them to decide whether offsets may be committed. Notes the topics
/// a record was refused for (TOPIC_AUTHORIZATION_FAILED), so the abort that follows can name the
/// missing right without asking the broker, and sums up the other failures per partition, so the
/// abort says once what failed ([`super::TxnProducer::report_failures`]) instead of a line per record.
#[derive(Default)]
pub struct DeliveryContext {
    failures: AtomicU64,
    /// Records acknowledged so far: one acknowledged in a transaction shows that a partition of
    /// it is registered with its coordinator ([`super::TxnProducer::partition_registered`]).
    delivered: AtomicU64,
    pub(super) refused: Mutex<BTreeSet<String>>,
    pub(super) failed: Mutex<Failed>,
    /// The transaction coordinator's `host:port`, from librdkafka's statistics.
    coordinator: Mutex<Option<String>>,
}

/// Delivery failures since the last report: how many per topic and partition, and the first.
#[derive(Default)]
pub(super) struct Failed {
    pub(super) per_partition: BTreeMap<(String, i32), u64>,
    pub(super) first: Option<String>,
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        if let Some(topic) = refused_add_partition(fac, log_message) {
            self.note_refused(topic);
        }
        crate::kafka::logging::log(level, fac, log_message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        crate::kafka::logging::error(&error, reason);
    }

    /// librdkafka's statistics: the transaction coordinator is its logical broker
    /// "TxnCoordinator", whose node name is that of the broker it stands for.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let coordinator = statistics
            .brokers
            .values()
            .find(|b| b.source == "logical" && b.name.starts_with("TxnCoordinator"))
            .map(|b| b.nodename.clone())
            .filter(|n| !n.is_empty());
        if let (Some(c), Ok(mut known)) = (coordinator, self.coordinator.lock()) {
            *known = Some(c);
        }
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if result.is_ok() {
            self.delivered.fetch_add(1, Ordering::Relaxed);
        }
        if let Err((e, m)) = result {
            if matches!(
                e.rdkafka_error_code(),
                Some(RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight)
            ) {
                // Purged by our own abort: the record was meant to vanish with its transaction.
                debug!(topic = m.topic(), "record purged by abort");
                return;
            }
            self.failures.fetch_add(1, Ordering::Relaxed);
            crate::metrics::delivery_failed(m.topic());
            // Per record at debug level only: a batch of thousands fails alike, and the abort
            // that follows says it once (`report_failures`, or the refused right).
            debug!(topic = m.topic(), partition = m.partition(), error = %e, "delivery failed");
            if e.rdkafka_error_code() == Some(RDKafkaErrorCode::TopicAuthorizationFailed) {
                self.note_refused(m.topic());
            } else if let Ok(mut failed) = self.failed.lock() {
                *failed
                    .per_partition
                    .entry((m.topic().to_owned(), m.partition()))
                    .or_default() += 1;
                failed.first.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// The topic of librdkafka's line for an AddPartitionsToTxn refused for lack of Write (facility
/// ADDPARTS): `TxnCoordinator/1: Failed to add partition "<topic>" [<p>] to transaction: Broker:
/// Topic authorization failed`. The transaction then fails with TOPIC_AUTHORIZATION_FAILED and its
/// records are purged by the abort, so no delivery report names the topic: this line is the only
/// place librdkafka does (a metadata probe cannot tell either while Read still grants Describe).
fn refused_add_partition<'a>(fac: &str, message: &'a str) -> Option<&'a str> {
    const PREFIX: &str = "Failed to add partition \"";
    if fac != "ADDPARTS" || !message.contains("Topic authorization failed") {
        return None;
    }
    let start = message.find(PREFIX)? + PREFIX.len();
    let len = message[start..].find('"')?;
    Some(&message[start..start + len])
}

impl DeliveryContext {
    pub(super) fn note_refused(&self, topic: &str) {
        if let Ok(mut refused) = self.refused.lock() {
            if !refused.contains(topic) {
                refused.insert(topic.to_owned());
            }
        }
    }

    /// Delivery failures so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Records acknowledged so far.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    pub(super) fn coordinator(&self) -> Option<String> {
        self.coordinator.lock().ok().and_then(|c| c.clone())
    }
}

/// The librdkafka producer of a [`super::TxnProducer`], with its delivery reports.
pub type Client = ThreadedProducer<DeliveryContext>;

/// Waits until every record enqueued on `producer` is acknowledged (or failed), for at most
/// `timeout`, asleep.
///
/// Why librdkafka's `rd_kafka_flush` itself rather than rust-rdkafka's `flush`: the latter polls
/// the delivery reports' queue in steps of up to 100 ms that end only at their deadline, while
/// the producer's own polling thread takes the reports, so every flush with records in flight
/// lasted at least 100 ms ([`super::TxnProducer::commit`]). In steps of 1 ms, it span: a step's poll is
/// asked for the milliseconds left, rounded down to 0, until the step's end (40 % of the
/// pipeline's CPU samples in `clock_gettime` during a backlog, a core that the broker lacked on a
/// 2-core machine). `rd_kafka_flush` with delivery reports as events (rust-rdkafka's mode) only
/// waits on librdkafka's count of messages in flight, woken as the polling thread releases them,
/// and counts as flushing meanwhile (`linger.ms` taken as 0). Called in steps of at most
/// [`DRAIN_STEP`], so the deadline is the process's.
pub fn drain(producer: &Client, timeout: Duration) -> Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let step = i32::try_from(left.min(DRAIN_STEP).as_millis()).unwrap_or(0);
        // SAFETY: the client handle is valid while `producer` is borrowed; rd_kafka_flush takes
        // no pointer from the caller and keeps none, and is safe to call from any thread.
        let err =
            unsafe { rdkafka::bindings::rd_kafka_flush(producer.client().native_ptr(), step) };
        match RDKafkaErrorCode::from(err) {
            RDKafkaErrorCode::NoError => return Ok(()),
            RDKafkaErrorCode::OperationTimedOut if Instant::now() < deadline => {}
            code => return Err(KafkaError::Flush(code)),
        }
    }
}

/// The longest single wait of [`drain`] inside librdkafka.
const DRAIN_STEP: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::producer::BaseRecord;

    /// CPU time of the calling thread so far, from `/proc/thread-self/stat` (utime + stime, in
    /// clock ticks of 10 ms).
    fn thread_cpu() -> Duration {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("thread stat");
        // The fields after the command name in parentheses: state is the 3rd field of the
        // line, utime the 14th, stime the 15th.
        let after = &stat[stat.rfind(')').expect("comm") + 2..];
        let fields: Vec<u64> = after
            .split_whitespace()
            .skip(11)
            .take(2)
            .map(|f| f.parse().expect("a tick count"))
            .collect();
        Duration::from_millis(10 * (fields[0] + fields[1]))
    }

    /// A commit drains the producer first, and the drain waits while the broker has not answered:
    /// it must wait asleep. Spinning, it took a whole core for as long as the commits' flushes
    /// lasted (most of a backlog's run: perf of pipeline-bench found 40 % of the pipeline's
    /// samples in `clock_gettime`), which on a 2-core machine is the broker's other core.
    #[test]
    fn a_drain_waits_asleep_for_the_broker() {
        let producer: Client = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .create_with_context(DeliveryContext::default())
            .expect("a producer can be made without a broker");
        producer
            .send(BaseRecord::<[u8], [u8]>::to("t").payload(b"never delivered".as_slice()))
            .map_err(|(e, _)| e)
            .expect("queued");
        let wait = Duration::from_millis(600);
        let (cpu, started) = (thread_cpu(), Instant::now());
        let drained = drain(&producer, wait);
        let (waited, spent) = (started.elapsed(), thread_cpu().saturating_sub(cpu));
        assert!(
            matches!(
                drained,
                Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut))
            ),
            "nothing can be delivered: {drained:?}"
        );
        assert!(waited >= wait, "waited {waited:?} of {wait:?}");
        assert!(
            spent < wait / 4,
            "the drain spent {spent:?} of CPU in a wait of {waited:?}"
        );
    }

    #[test]
    fn a_refused_add_partition_names_its_topic() {
        let line = "TxnCoordinator/1: Failed to add partition \"n.parking-lot\" [0] to transaction: Broker: Topic authorization failed";
        assert_eq!(
            refused_add_partition("ADDPARTS", line),
            Some("n.parking-lot")
        );
        assert_eq!(refused_add_partition("TXNERR", line), None);
        let other = "TxnCoordinator/1: Failed to add partition \"n\" [0] to transaction: Broker: Not coordinator";
        assert_eq!(refused_add_partition("ADDPARTS", other), None);
    }
}
