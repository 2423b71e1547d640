//! The failure path: why a tick could not be processed, the bounded retry that decides it, and
//! the dead-letter record that carries it; below it, the replay ledger ([`ledger`]: which dead
//! letters were replayed) and the backlog watcher ([`watch`]: how many are still unhandled), which
//! the replay tool, alert-pipeline and alert-deliver all take from here.
//!
//! Every tick ends in exactly one of two places: processed (its notifications and state change in
//! the transaction) or dead-lettered (its DLQ record in the same transaction as the offset that
//! moves past it). If the DLQ write fails, the transaction aborts and the offset stays where it
//! was: a tick is never skipped. [`admit`] decides which place; [`send`] writes the dead letter.
//!
//! | class                 | cause                                              | attempts        |
//! |-----------------------|----------------------------------------------------|-----------------|
//! | `permanent.*`         | decode/validation ([`crate::tick::TickError`])     | 1, never retried |
//! | `poison`              | a processing failure on every attempt of the budget | `max_attempts`  |
//! | `transient.exhausted` | still failing when the retry time budget ran out    | fewer            |
//! | `delivery.*`          | alert-deliver gave up on a (notification, subscriber) ([`crate::deliver`]) | per bucket |
//!
//! # Retries
//! Transient failures are retried inline with exponential backoff and full jitter
//! (`base * 2^(n-1)`, capped, times a random factor in [0.5, 1]), at most `max_attempts` attempts and
//! at most `budget` of total backoff per tick. The budget is kept far below `max.poll.interval.ms`
//! (the transaction timeout + 50 s: `kafka::config::max_poll_interval`) and below the transaction timeout, so a bad tick can neither get the consumer
//! evicted nor time out the transaction it sits in; the partition never stalls behind it.
//!
//! # Dead-letter records
//! The record keeps the original key and value bytes and the original headers, and adds the
//! `dlq.*` headers of docs/design.md (`dlq.origin`, `dlq.original.{topic,partition,offset,timestamp}`,
//! `dlq.consumer.group`, `dlq.error.class`, `dlq.error.message`, `dlq.attempts`, `dlq.failed.at`,
//! `dlq.service`, `dlq.service.version`). The error message is sanitized and never holds the
//! payload. The replay tool ([`crate::tools::replay`]) copies headers back with [`copy_headers`].
//!
//! # Fault injection
//! Off by default. When on, as in the seed experiment: `seq % 25 == 0` fails on every attempt
//! (poison), `seq % 7 == 0` fails its first two attempts and then succeeds (flaky). A tick that is
//! both is poison.

pub mod ledger;
pub mod watch;

pub use watch::Watcher;

use crate::tick::{self, Tick, TickError};
use crate::trace;
use rand::Rng;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::producer::BaseRecord;
use rdkafka::Message;
use std::time::{Duration, SystemTime};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tracing::warn;

pub use crate::labels::{CLASSES, INJECTED};

/// A failure of one processing attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransientError {
    /// What kind of failure (a metrics label): [`INJECTED`], or the dependency that failed.
    pub class: &'static str,
    pub reason: String,
}

/// Why a tick is dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// It does not decode or validate: retrying the same bytes cannot help.
    Permanent(TickError),
    /// Every attempt of the budget failed.
    Poison { attempts: u32, last: TransientError },
    /// The retry time budget ran out while it was still failing.
    TransientExhausted { attempts: u32, last: TransientError },
}

impl Failure {
    /// The `dlq.error.class` header and the metrics label.
    pub fn class(&self) -> &'static str {
        match self {
            Failure::Permanent(e) => e.class(),
            Failure::Poison { .. } => "poison",
            Failure::TransientExhausted { .. } => "transient.exhausted",
        }
    }

    pub fn attempts(&self) -> u32 {
        match self {
            Failure::Permanent(_) => 1,
            Failure::Poison { attempts, .. } | Failure::TransientExhausted { attempts, .. } => {
                *attempts
            }
        }
    }

    /// A message that never contains the payload.
    pub fn message(&self) -> String {
        match self {
            Failure::Permanent(e) => e.to_string(),
            Failure::Poison { attempts, last } => {
                format!("failed on all {attempts} attempts: {}", last.reason)
            }
            Failure::TransientExhausted { attempts, last } => {
                format!(
                    "retry budget exhausted after {attempts} attempts: {}",
                    last.reason
                )
            }
        }
    }
}

/// Bounds of the inline retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// Backoff before the second attempt.
    pub base: Duration,
    /// Largest single backoff.
    pub max_backoff: Duration,
    /// Largest total backoff for one tick.
    pub budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base: Duration::from_millis(5),
            max_backoff: Duration::from_millis(100),
            budget: Duration::from_millis(500),
        }
    }
}

impl RetryPolicy {
    /// Backoff before attempt `next` (2, 3, ...): exponential, capped, with jitter in [0.5, 1].
    pub fn backoff(&self, next: u32, rng: &mut impl Rng) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32 << (next.saturating_sub(2)).min(20));
        let capped = exp.min(self.max_backoff);
        capped.mul_f64(rng.random_range(0.5..=1.0))
    }

    /// Runs `attempt(n)` for n = 1.. until it succeeds or the budget is spent; `sleep` waits out
    /// each backoff (a real sleep in the pipeline, a recorder in tests).
    pub fn run<T>(
        &self,
        rng: &mut impl Rng,
        mut sleep: impl FnMut(Duration),
        mut attempt: impl FnMut(u32) -> Result<T, TransientError>,
    ) -> Result<(T, u32), Failure> {
        let mut waited = Duration::ZERO;
        let mut n = 1;
        loop {
            match attempt(n) {
                Ok(v) => return Ok((v, n)),
                Err(last) if n >= self.max_attempts => {
                    return Err(Failure::Poison { attempts: n, last })
                }
                Err(last) => {
                    let pause = self.backoff(n + 1, rng);
                    if waited + pause > self.budget {
                        return Err(Failure::TransientExhausted { attempts: n, last });
                    }
                    sleep(pause);
                    waited += pause;
                    n += 1;
                }
            }
        }
    }
}

/// Deterministic fault injection by tick seq (off unless enabled).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultInjection {
    pub enabled: bool,
}

impl FaultInjection {
    /// Whether attempt `attempt` (1-based) of the tick with `seq` fails.
    pub fn check(&self, seq: u64, attempt: u32) -> Result<(), TransientError> {
        if !self.enabled {
            return Ok(());
        }
        if seq.is_multiple_of(25) {
            return Err(TransientError {
                class: INJECTED,
                reason: format!("injected poison (seq {seq} % 25 == 0)"),
            });
        }
        if seq.is_multiple_of(7) && attempt <= 2 {
            return Err(TransientError {
                class: INJECTED,
                reason: format!("injected flaky failure (seq {seq} % 7 == 0)"),
            });
        }
        Ok(())
    }

    /// Whether the tick with `seq` is poison under this injection (the verifier's view).
    pub fn is_poison(&self, seq: u64) -> bool {
        self.enabled && seq.is_multiple_of(25)
    }
}

/// Decodes a tick and runs the processing step under the retry policy: the tick and the attempts
/// it took, or the [`Failure`] that dead-letters it. Sleeps out the backoffs (bounded by the
/// policy's budget).
pub fn admit(
    payload: Option<&[u8]>,
    max_bytes: usize,
    retry: &RetryPolicy,
    faults: FaultInjection,
) -> Result<(Tick, u32), Failure> {
    let tick = tick::decode(payload, max_bytes).map_err(Failure::Permanent)?;
    // The processing step proper. It cannot fail today but for injected faults; the retry is where
    // a real transient dependency (an enrichment lookup, say) would be retried.
    let check = |n| {
        faults
            .check(tick.seq, n)
            .inspect_err(|e| crate::metrics::transient_failure(e.class))
    };
    let ((), attempts) = retry.run(&mut rand::rng(), std::thread::sleep, check)?;
    Ok((tick, attempts))
}

/// Dead-letters `msg` (consumed by `group`) to `topic` through `send` (into the open
/// transaction), and logs it (with its trace identifiers, never its payload). The caller counts
/// it at commit.
pub fn send(
    send: impl FnOnce(BaseRecord<'_, [u8], [u8]>) -> Result<(), KafkaError>,
    topic: &str,
    msg: &BorrowedMessage<'_>,
    group: &str,
    failure: &Failure,
) -> Result<(), KafkaError> {
    warn!(
        event_id = %trace::event_id(msg),
        correlation_id = trace::header(msg, trace::CORRELATION_ID),
        topic = msg.topic(),
        partition = msg.partition(),
        offset = msg.offset(),
        group,
        class = failure.class(),
        attempts = failure.attempts(),
        action = "dead-lettered",
        dlq = topic,
        error = %failure.message(),
        "tick dead-lettered"
    );
    let headers = dead_letter_headers(msg, group, failure);
    let mut record = BaseRecord::to(topic).headers(headers);
    if let Some(k) = msg.key() {
        record = record.key(k);
    }
    if let Some(v) = msg.payload() {
        record = record.payload(v);
    }
    send(record)
}

/// The headers of `msg`'s dead letter: its own headers, its event id if it had none, then the
/// `dlq.*` ones.
fn dead_letter_headers(msg: &BorrowedMessage<'_>, group: &str, failure: &Failure) -> OwnedHeaders {
    let mut headers = copy_headers(msg, |_| true);
    if trace::header(msg, trace::EVENT_ID).is_none() {
        let id = trace::event_id(msg);
        headers = headers.insert(Header {
            key: trace::EVENT_ID,
            value: Some(id.as_str()),
        });
    }
    let letter = Letter {
        group,
        class: failure.class(),
        message: &failure.message(),
        attempts: failure.attempts(),
    };
    letter.headers(headers, &Coordinates::of(msg))
}

/// Where a failed record was first read: the `dlq.original.*` headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coordinates {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// Record timestamp (ms since the epoch).
    pub timestamp: Option<i64>,
}

impl Coordinates {
    /// The coordinates of `msg` itself.
    pub fn of<M: Message>(msg: &M) -> Self {
        Coordinates {
            topic: msg.topic().to_owned(),
            partition: msg.partition(),
            offset: msg.offset(),
            timestamp: msg.timestamp().to_millis(),
        }
    }

    /// The `dlq.original.*` coordinates `msg` carries (a retry record: where its notification was
    /// first read), or `msg`'s own when it carries none.
    pub fn original<M: Message>(msg: &M) -> Self {
        let topic = header(msg, "dlq.original.topic");
        let partition = header(msg, "dlq.original.partition").and_then(|p| p.parse().ok());
        let offset = header(msg, "dlq.original.offset").and_then(|o| o.parse().ok());
        match (topic, partition, offset) {
            (Some(topic), Some(partition), Some(offset)) => Coordinates {
                topic: topic.to_owned(),
                partition,
                offset,
                timestamp: header(msg, "dlq.original.timestamp").and_then(|t| t.parse().ok()),
            },
            _ => Self::of(msg),
        }
    }

    /// Appends `dlq.origin` (`topic/partition/offset`) and `dlq.original.{topic,partition,offset,timestamp}`.
    pub fn append(&self, mut headers: OwnedHeaders) -> OwnedHeaders {
        let partition = self.partition.to_string();
        let offset = self.offset.to_string();
        let origin = format!("{}/{partition}/{offset}", self.topic);
        let timestamp = self.timestamp.map(|ms| ms.to_string()).unwrap_or_default();
        for (k, v) in [
            ("dlq.origin", origin.as_str()),
            ("dlq.original.topic", self.topic.as_str()),
            ("dlq.original.partition", partition.as_str()),
            ("dlq.original.offset", offset.as_str()),
            ("dlq.original.timestamp", timestamp.as_str()),
        ] {
            headers = headers.insert(Header {
                key: k,
                value: Some(v),
            });
        }
        headers
    }
}

/// What a dead letter says about its failure: the `dlq.*` headers past the coordinates.
#[derive(Debug, Clone, Copy)]
pub struct Letter<'a> {
    /// The consumer group that gave up on the record.
    pub group: &'a str,
    /// One of [`CLASSES`].
    pub class: &'a str,
    /// Why; sanitized here, never the payload.
    pub message: &'a str,
    pub attempts: u32,
}

impl Letter<'_> {
    /// `headers`, then the coordinates of `origin`, then every other `dlq.*` header.
    pub fn headers(&self, headers: OwnedHeaders, origin: &Coordinates) -> OwnedHeaders {
        let mut headers = origin.append(headers);
        let attempts = self.attempts.to_string();
        let failed_at = now_rfc3339();
        let message = sanitize(self.message);
        for (k, v) in [
            ("dlq.consumer.group", self.group),
            ("dlq.error.class", self.class),
            ("dlq.error.message", message.as_str()),
            ("dlq.attempts", attempts.as_str()),
            ("dlq.failed.at", failed_at.as_str()),
            ("dlq.service", SERVICE),
            ("dlq.service.version", VERSION),
        ] {
            headers = headers.insert(Header {
                key: k,
                value: Some(v),
            });
        }
        headers
    }
}

/// The headers of `msg` whose key `keep` accepts, in order.
pub fn copy_headers<M: Message>(msg: &M, keep: impl Fn(&str) -> bool) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new();
    if let Some(orig) = msg.headers() {
        for h in orig.iter().filter(|h| keep(h.key)) {
            headers = headers.insert(Header {
                key: h.key,
                value: h.value,
            });
        }
    }
    headers
}

/// The value of a header of a record (the replay reads `dlq.*` headers with it).
pub use crate::trace::header;

/// Longest `dlq.error.message`, in bytes.
pub const MAX_ERROR_MESSAGE: usize = 256;

/// Service name written to `dlq.service`.
pub const SERVICE: &str = env!("CARGO_PKG_NAME");
/// Version written to `dlq.service.version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Current time as RFC 3339 UTC.
pub fn now_rfc3339() -> String {
    OffsetDateTime::from(SystemTime::now())
        .format(&Rfc3339)
        .unwrap_or_default()
}

/// Keeps a message printable and short: control characters become spaces and the result is cut
/// to [`MAX_ERROR_MESSAGE`] bytes on a character boundary.
pub fn sanitize(message: &str) -> String {
    let clean: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if clean.len() <= MAX_ERROR_MESSAGE {
        return clean;
    }
    let mut end = MAX_ERROR_MESSAGE;
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    clean[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn run(
        policy: &RetryPolicy,
        inj: FaultInjection,
        seq: u64,
    ) -> (Result<u32, Failure>, Vec<Duration>) {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut slept = Vec::new();
        let r = policy
            .run(&mut rng, |d| slept.push(d), |n| inj.check(seq, n))
            .map(|((), n)| n);
        (r, slept)
    }

    #[test]
    fn every_class_is_listed() {
        let permanent = [
            TickError::Oversize { len: 2, max: 1 },
            TickError::Empty,
            TickError::NotUtf8,
            TickError::NotJson {
                reason: String::new(),
            },
            TickError::NotObject,
            TickError::MissingField { field: "seq" },
            TickError::WrongType {
                field: "seq",
                expected: "",
            },
            TickError::BadDecimal,
            TickError::NonPositivePrice,
            TickError::BadSymbol,
            TickError::BadSeq,
            TickError::BadTimestamp,
        ];
        let last = TransientError {
            class: INJECTED,
            reason: String::new(),
        };
        let failures = permanent.into_iter().map(Failure::Permanent).chain([
            Failure::Poison {
                attempts: 4,
                last: last.clone(),
            },
            Failure::TransientExhausted { attempts: 2, last },
        ]);
        for f in failures {
            assert!(
                CLASSES.contains(&f.class()),
                "{} is not in CLASSES",
                f.class()
            );
        }
    }

    #[test]
    fn flaky_ticks_succeed_on_the_third_attempt() {
        let on = FaultInjection { enabled: true };
        let (r, slept) = run(&RetryPolicy::default(), on, 14);
        assert_eq!(r, Ok(3));
        assert_eq!(slept.len(), 2);
    }

    #[test]
    fn poison_ticks_use_every_attempt() {
        let on = FaultInjection { enabled: true };
        let p = RetryPolicy::default();
        let (r, slept) = run(&p, on, 50);
        let f = r.unwrap_err();
        assert_eq!(f.class(), "poison");
        assert_eq!(f.attempts(), p.max_attempts);
        assert_eq!(slept.len() as u32, p.max_attempts - 1);
        assert!(slept.iter().sum::<Duration>() <= p.budget);
        // seq 175 is both flaky and poison: poison wins.
        assert_eq!(run(&p, on, 175).0.unwrap_err().class(), "poison");
    }

    #[test]
    fn a_small_time_budget_ends_in_transient_exhausted() {
        let on = FaultInjection { enabled: true };
        let p = RetryPolicy {
            max_attempts: 10,
            budget: Duration::from_millis(12),
            ..RetryPolicy::default()
        };
        let (r, slept) = run(&p, on, 25);
        let f = r.unwrap_err();
        assert_eq!(f.class(), "transient.exhausted");
        assert!(f.attempts() < 10);
        assert!(slept.iter().sum::<Duration>() <= p.budget);
    }

    #[test]
    fn injection_is_off_by_default_and_backoff_grows_with_jitter() {
        let (r, slept) = run(&RetryPolicy::default(), FaultInjection::default(), 50);
        assert_eq!(r, Ok(1));
        assert!(slept.is_empty());
        let p = RetryPolicy::default();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for next in 2..8 {
            let full = p.base.saturating_mul(1 << (next - 2)).min(p.max_backoff);
            let b = p.backoff(next, &mut rng);
            assert!(
                b >= full / 2 && b <= full,
                "attempt {next}: {b:?} vs {full:?}"
            );
        }
    }

    #[test]
    fn sanitize_cuts_on_char_boundary_and_strips_controls() {
        assert_eq!(sanitize("a\nb\tc"), "a b c");
        let long = "é".repeat(200); // 400 bytes
        let s = sanitize(&long);
        assert!(s.len() <= MAX_ERROR_MESSAGE);
        assert!(s.len() >= MAX_ERROR_MESSAGE - 1);
        assert!(s.chars().all(|c| c == 'é'));
    }
}
