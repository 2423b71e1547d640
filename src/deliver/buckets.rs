//! Retry buckets: their names, where a failed delivery goes next, when a retry is due, and the
//! `retry.*` headers that carry all that on the record. Pure, no I/O.
//!
//! ```text
//!  <topic> ─fail─► <topic>.retry.5s ─fail─► <topic>.retry.1m ─fail─► <topic>.retry.10m ─fail─► <topic>.dlq
//!  (every stage: 4xx ─► <topic>.dlq at once; 410 ─► <topic>.parking-lot)
//! ```
//!
//! The bucket list is configuration (`--buckets 5s,1m,10m`, the default): each bucket is a topic
//! named after its delay. A record handed to bucket *i* is due `delay(i)` after the hand-off, or
//! later if the receiver asked for more with `Retry-After` (capped at the last bucket's delay, so
//! one receiver cannot park a partition of a bucket for an hour). The due time is written in the
//! record (`retry.next.due.at`), so a bucket consumer never has to guess it, and a record whose
//! header is missing falls back to its timestamp plus the bucket's delay.
//!
//! The header is trusted up to a bound that no re-read moves: the record's timestamp plus the
//! last bucket's delay, the latest any hand-off sets ([`Buckets::due_of`]). A partition is held
//! at its first record not due, so an unbounded header would hold every retry behind it.

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::Message;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Failed delivery attempts of the (notification, subscriber) so far.
pub const ATTEMPT: &str = "retry.attempt";
/// When the first attempt failed (RFC 3339).
pub const FIRST_FAILURE_AT: &str = "retry.first.failure.at";
/// When the record may be delivered again (RFC 3339, milliseconds).
pub const NEXT_DUE_AT: &str = "retry.next.due.at";
/// The class of the last failure ([`super::http::Outcome`]'s class: `connect`, `http.5xx`, ...).
pub const ERROR_CLASS: &str = "retry.error.class";
/// The last failure, short, never the payload.
pub const ERROR_MESSAGE: &str = "retry.error.message";
/// The one subscriber this record is for.
pub const SUBSCRIBER: &str = "retry.subscriber";
/// How many times the delivery came due in the last bucket, was not tried (circuit open, no
/// turn) and was handed to the last bucket again (absent: 0). See [`Buckets::next_untried`].
pub const UNTRIED_PASSES: &str = "retry.untried.passes";

/// How many times an untried delivery goes round the last bucket again before it is
/// dead-lettered: it then waits about this many times the last bucket's delay beyond the retry
/// window (with the default buckets, 2 x 10 m beyond 5 s + 1 m + 10 m).
pub const MAX_UNTRIED_PASSES: u32 = 2;

/// Every `retry.*` header (a hand-off writes them afresh).
pub const HEADERS: &[&str] = &[
    ATTEMPT,
    FIRST_FAILURE_AT,
    NEXT_DUE_AT,
    ERROR_CLASS,
    ERROR_MESSAGE,
    SUBSCRIBER,
    UNTRIED_PASSES,
];

/// The default bucket delays, as docs/design.md draws them.
pub const DEFAULT_BUCKETS: &[Duration] = &[
    Duration::from_secs(5),
    Duration::from_secs(60),
    Duration::from_secs(600),
];

/// A bucket delay as it appears in a topic name: `500ms`, `5s`, `1m`, `10m`, `2h`.
pub fn label(delay: Duration) -> String {
    let ms = delay.as_millis();
    let whole = |unit: u128| ms > 0 && ms.is_multiple_of(unit);
    match ms {
        _ if whole(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if whole(60_000) => format!("{}m", ms / 60_000),
        _ if whole(1_000) => format!("{}s", ms / 1_000),
        _ => format!("{ms}ms"),
    }
}

/// Why a bucket list is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BucketsError {
    #[error("the bucket list is empty: give at least one delay (e.g. 5s,1m,10m)")]
    Empty,
    #[error("bucket {0:?}: {1}")]
    Delay(String, String),
    #[error("bucket delays must grow: {later} comes after {earlier}")]
    NotIncreasing { earlier: String, later: String },
}

/// The retry topics of one notifications topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buckets {
    /// The topic the notifications are first read from.
    pub topic: String,
    delays: Vec<Duration>,
}

/// Where a consumed record stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The notifications topic: every subscriber of its symbol, at once.
    Main,
    /// Retry bucket `i` (0-based): its one subscriber, once due.
    Bucket(usize),
}

/// Where a transient failure goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Bucket(usize),
    /// Past the last bucket: the DLQ.
    Exhausted,
}

impl Buckets {
    /// Buckets of `topic` with these delays (increasing, each at least 1 ms).
    pub fn new(topic: impl Into<String>, delays: Vec<Duration>) -> Result<Self, BucketsError> {
        if delays.is_empty() {
            return Err(BucketsError::Empty);
        }
        for d in &delays {
            if d.as_millis() < 1 {
                return Err(BucketsError::Delay(
                    format!("{d:?}"),
                    "a delay is at least 1ms".into(),
                ));
            }
        }
        for w in delays.windows(2) {
            if w[1] <= w[0] {
                return Err(BucketsError::NotIncreasing {
                    earlier: label(w[0]),
                    later: label(w[1]),
                });
            }
        }
        Ok(Buckets {
            topic: topic.into(),
            delays,
        })
    }

    /// Parses `5s,1m,10m` (the `--buckets` syntax).
    pub fn parse(topic: impl Into<String>, list: &str) -> Result<Self, BucketsError> {
        let delays = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| crate::duration::duration(s).map_err(|e| BucketsError::Delay(s.to_owned(), e)))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(topic, delays)
    }

    pub fn delays(&self) -> &[Duration] {
        &self.delays
    }

    /// `<topic>.retry.<label>` of bucket `i`.
    pub fn bucket_topic(&self, i: usize) -> String {
        format!("{}.retry.{}", self.topic, label(self.delays[i]))
    }

    /// Every bucket topic, in order.
    pub fn bucket_topics(&self) -> Vec<String> {
        (0..self.delays.len())
            .map(|i| self.bucket_topic(i))
            .collect()
    }

    /// `<topic>.dlq`.
    pub fn dlq(&self) -> String {
        format!("{}.dlq", self.topic)
    }

    /// `<topic>.parking-lot`.
    pub fn parking_lot(&self) -> String {
        format!("{}.parking-lot", self.topic)
    }

    /// The stage of a record read from `topic` (`None`: not one of ours).
    pub fn stage_of(&self, topic: &str) -> Option<Stage> {
        if topic == self.topic {
            return Some(Stage::Main);
        }
        (0..self.delays.len())
            .find(|&i| self.bucket_topic(i) == topic)
            .map(Stage::Bucket)
    }

    /// Where a transient failure at `stage` goes.
    pub fn next(&self, stage: Stage) -> Next {
        let i = match stage {
            Stage::Main => 0,
            Stage::Bucket(i) => i + 1,
        };
        if i < self.delays.len() {
            Next::Bucket(i)
        } else {
            Next::Exhausted
        }
    }

    /// Where a delivery that was **not tried** at `stage` goes (skipped by an open circuit, or no
    /// turn): as [`Buckets::next`], except that it is not dead-lettered at once. Past the last
    /// bucket it waits in the last bucket again, [`MAX_UNTRIED_PASSES`] times (`untried_passes`:
    /// how many it has made, its `retry.untried.passes`), then it is exhausted. An endpoint that
    /// never answers still ends in the DLQ, but a record is not given up only because the circuit
    /// happened to be open when it came due.
    ///
    /// What counts is what happened to the record, never the wall clock: a deliverer that stalled
    /// or was down for a while finds its records due with the circuit not yet probed, and that
    /// must not dead-letter them (it costs each one pass, not its whole allowance).
    pub fn next_untried(&self, stage: Stage, untried_passes: u32) -> Next {
        match (self.next(stage), stage) {
            (Next::Exhausted, Stage::Bucket(i)) if untried_passes < MAX_UNTRIED_PASSES => {
                Next::Bucket(i)
            }
            (next, _) => next,
        }
    }

    /// Whether handing a record from `stage` on to `next` is an untried pass round the last
    /// bucket (one more for its `retry.untried.passes`).
    pub fn is_untried_pass(&self, stage: Stage, next: Next) -> bool {
        matches!((stage, next), (Stage::Bucket(i), Next::Bucket(j)) if i == j)
    }

    /// When a record read from bucket `i` at `now` is due: its `retry.next.due.at`, or, when that
    /// is missing or unreadable, its timestamp plus the bucket's delay (`now` without a
    /// timestamp). A header in the past is due at once.
    ///
    /// Never later than the record's timestamp plus the last bucket's delay: a hand-off writes
    /// its due time before the producer stamps the record, at most the last delay ahead
    /// ([`Buckets::due`]), so only an edited record, or one whose due time and timestamp come
    /// from different clocks, goes beyond; trusted, it would hold the whole partition behind it
    /// until then. The bound is the record's
    /// own, the same at every re-read: bounding by `now` instead held the partition for ever,
    /// since a held record is read again when its due time comes. A record without a timestamp
    /// has no such bound and is due at once ([`Due::clamped`] when its header said later).
    pub fn due_of<M: Message>(&self, msg: &M, i: usize, now: SystemTime) -> Due {
        let written = msg.timestamp().to_millis().map(from_millis);
        let bound = written.map_or(now, |t| t + self.longest());
        let header = crate::trace::header(msg, NEXT_DUE_AT);
        match header.and_then(parse_time) {
            Some(due) if due > bound => Due {
                at: bound,
                clamped: header.map(str::to_owned),
            },
            Some(due) => Due {
                at: due,
                clamped: None,
            },
            None => Due {
                at: written.map_or(now, |t| t + self.delays[i]),
                clamped: None,
            },
        }
    }

    /// The last bucket's delay: the longest a hand-off waits.
    fn longest(&self) -> Duration {
        self.delays[self.delays.len() - 1]
    }

    /// When a record handed to bucket `i` at `now` is due: the bucket's delay, or the receiver's
    /// `not_before` if longer (capped at the last bucket's delay).
    pub fn due(&self, i: usize, now: SystemTime, not_before: Option<Duration>) -> SystemTime {
        now + self.delays[i].max(not_before.unwrap_or_default().min(self.longest()))
    }
}

/// When a record of a bucket is due ([`Buckets::due_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub at: SystemTime,
    /// Its `retry.next.due.at` as written, when that lay beyond the bound and `at` is the bound
    /// instead: for the operator (an edited record, or a due time and a timestamp from different
    /// clocks).
    pub clamped: Option<String>,
}

/// The retry state a record carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryState {
    /// Failed attempts so far.
    pub attempt: u32,
    /// RFC 3339.
    pub first_failure_at: String,
    pub next_due_at: SystemTime,
    pub error_class: String,
    pub error_message: String,
    pub subscriber: String,
    /// Untried passes round the last bucket ([`UNTRIED_PASSES`]); not attempts.
    pub untried_passes: u32,
}

impl RetryState {
    /// The state in `msg`'s headers; `None` without a subscriber (not a retry record).
    /// `fallback_due`: when it is due if its `retry.next.due.at` is missing or unreadable.
    pub fn of<M: Message>(msg: &M, fallback_due: SystemTime) -> Option<Self> {
        let h = |k| crate::trace::header(msg, k);
        Some(RetryState {
            subscriber: h(SUBSCRIBER)?.to_owned(),
            attempt: h(ATTEMPT).and_then(|a| a.parse().ok()).unwrap_or(0),
            first_failure_at: h(FIRST_FAILURE_AT).unwrap_or_default().to_owned(),
            next_due_at: h(NEXT_DUE_AT).and_then(parse_time).unwrap_or(fallback_due),
            error_class: h(ERROR_CLASS).unwrap_or_default().to_owned(),
            error_message: h(ERROR_MESSAGE).unwrap_or_default().to_owned(),
            untried_passes: h(UNTRIED_PASSES).and_then(|p| p.parse().ok()).unwrap_or(0),
        })
    }

    /// Appends the `retry.*` headers.
    pub fn append(&self, mut headers: OwnedHeaders) -> OwnedHeaders {
        let attempt = self.attempt.to_string();
        let passes = self.untried_passes.to_string();
        let due = format_time(self.next_due_at);
        let message = crate::dlq::sanitize(&self.error_message);
        for (key, value) in [
            (ATTEMPT, attempt.as_str()),
            (FIRST_FAILURE_AT, self.first_failure_at.as_str()),
            (NEXT_DUE_AT, due.as_str()),
            (ERROR_CLASS, self.error_class.as_str()),
            (ERROR_MESSAGE, message.as_str()),
            (SUBSCRIBER, self.subscriber.as_str()),
            (UNTRIED_PASSES, passes.as_str()),
        ] {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        headers
    }
}

/// RFC 3339 with milliseconds, UTC.
pub fn format_time(t: SystemTime) -> String {
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i128);
    OffsetDateTime::from_unix_timestamp_nanos(ms * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

/// An RFC 3339 time.
pub fn parse_time(s: &str) -> Option<SystemTime> {
    OffsetDateTime::parse(s, &Rfc3339)
        .ok()
        .map(SystemTime::from)
}

/// A record timestamp (ms) as a time.
pub fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(list: &str) -> Buckets {
        Buckets::parse("n", list).unwrap()
    }

    #[test]
    fn an_untried_delivery_goes_round_the_last_bucket_twice_then_is_exhausted() {
        let d = b("1s,2s,3s");
        assert_eq!(d.next_untried(Stage::Main, 0), Next::Bucket(0));
        assert_eq!(d.next_untried(Stage::Bucket(1), 0), Next::Bucket(2));
        for passes in 0..MAX_UNTRIED_PASSES {
            let next = d.next_untried(Stage::Bucket(2), passes);
            assert_eq!(
                next,
                Next::Bucket(2),
                "again the last bucket ({passes} passes)"
            );
            assert!(d.is_untried_pass(Stage::Bucket(2), next));
        }
        assert_eq!(
            d.next_untried(Stage::Bucket(2), MAX_UNTRIED_PASSES),
            Next::Exhausted
        );
        assert!(!d.is_untried_pass(Stage::Bucket(1), Next::Bucket(2)));
        assert!(!d.is_untried_pass(Stage::Main, Next::Bucket(0)));
        assert_eq!(
            d.next(Stage::Bucket(2)),
            Next::Exhausted,
            "a tried one is exhausted at once"
        );
    }

    /// A retry record as the bucket `2` consumer reads it.
    fn retry_record(headers: &[(&str, &str)]) -> rdkafka::message::OwnedMessage {
        let headers = headers.iter().fold(OwnedHeaders::new(), |h, (key, value)| {
            h.insert(Header {
                key,
                value: Some(*value),
            })
        });
        rdkafka::message::OwnedMessage::new(
            None,
            None,
            "n.retry.10s".into(),
            rdkafka::Timestamp::NotAvailable,
            0,
            0,
            Some(headers),
        )
    }

    #[test]
    fn a_stall_of_the_deliverer_does_not_exhaust_an_untried_delivery() {
        // Buckets 1s,2s,10s (window 13 s, as in tests/deliver.rs): the first failure is 10x the
        // window ago (the deliverer stalled), but the record has gone round the last bucket
        // untried only once. It waits in the last bucket again, it does not reach the DLQ.
        let d = b("1s,2s,10s");
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let long_ago = format_time(now - 10 * Duration::from_secs(13));
        let m = retry_record(&[
            (SUBSCRIBER, "down"),
            (ATTEMPT, "2"),
            (FIRST_FAILURE_AT, &long_ago),
            (UNTRIED_PASSES, "1"),
        ]);
        let state = RetryState::of(&m, now).unwrap();
        assert_eq!(state.untried_passes, 1);
        assert_eq!(
            d.next_untried(Stage::Bucket(2), state.untried_passes),
            Next::Bucket(2)
        );
        // Without the header: none yet.
        let m = retry_record(&[(SUBSCRIBER, "down"), (FIRST_FAILURE_AT, &long_ago)]);
        assert_eq!(RetryState::of(&m, now).unwrap().untried_passes, 0);
    }

    #[test]
    fn the_retry_state_round_trips_through_its_headers() {
        let now = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let state = RetryState {
            attempt: 3,
            first_failure_at: format_time(now),
            next_due_at: now,
            error_class: "circuit_open".into(),
            error_message: "not tried".into(),
            subscriber: "down".into(),
            untried_passes: 2,
        };
        let m = rdkafka::message::OwnedMessage::new(
            None,
            None,
            "n.retry.10s".into(),
            rdkafka::Timestamp::NotAvailable,
            0,
            0,
            Some(state.append(OwnedHeaders::new())),
        );
        assert_eq!(RetryState::of(&m, UNIX_EPOCH), Some(state));
    }

    #[test]
    fn names_follow_the_design() {
        let d = Buckets::new("notifications", DEFAULT_BUCKETS.to_vec()).unwrap();
        assert_eq!(
            d.bucket_topics(),
            [
                "notifications.retry.5s",
                "notifications.retry.1m",
                "notifications.retry.10m"
            ]
        );
        assert_eq!(
            (d.dlq(), d.parking_lot()),
            (
                "notifications.dlq".into(),
                "notifications.parking-lot".into()
            )
        );
        assert_eq!(label(Duration::from_millis(500)), "500ms");
        assert_eq!(label(Duration::from_secs(90)), "90s");
        assert_eq!(label(Duration::from_secs(7200)), "2h");
    }

    #[test]
    fn stages_move_forward_to_the_dlq() {
        let x = b("1s,2s,4s");
        assert_eq!(x.stage_of("n"), Some(Stage::Main));
        assert_eq!(x.stage_of("n.retry.2s"), Some(Stage::Bucket(1)));
        assert_eq!(x.stage_of("n.dlq"), None);
        assert_eq!(x.next(Stage::Main), Next::Bucket(0));
        assert_eq!(x.next(Stage::Bucket(1)), Next::Bucket(2));
        assert_eq!(x.next(Stage::Bucket(2)), Next::Exhausted);
    }

    #[test]
    fn bad_lists_are_refused() {
        assert_eq!(Buckets::parse("n", ""), Err(BucketsError::Empty));
        assert!(matches!(
            Buckets::parse("n", "5s,1s"),
            Err(BucketsError::NotIncreasing { .. })
        ));
        assert!(matches!(
            Buckets::parse("n", "5s,5s"),
            Err(BucketsError::NotIncreasing { .. })
        ));
        assert!(matches!(
            Buckets::parse("n", "5"),
            Err(BucketsError::Delay(..))
        ));
        assert!(matches!(
            Buckets::parse("n", "0s"),
            Err(BucketsError::Delay(..))
        ));
    }

    #[test]
    fn due_honours_retry_after_up_to_the_last_delay() {
        let x = b("1s,2s,4s");
        let now = UNIX_EPOCH + Duration::from_secs(1000);
        assert_eq!(x.due(0, now, None), now + Duration::from_secs(1));
        assert_eq!(
            x.due(0, now, Some(Duration::from_secs(3))),
            now + Duration::from_secs(3)
        );
        assert_eq!(
            x.due(1, now, Some(Duration::from_millis(10))),
            now + Duration::from_secs(2)
        );
        assert_eq!(
            x.due(0, now, Some(Duration::from_secs(3600))),
            now + Duration::from_secs(4)
        );
    }

    /// A bucket-1s record written at `written` (ms) with these headers, as read back.
    fn written_at(written: i64, headers: &[(&str, &str)]) -> rdkafka::message::OwnedMessage {
        let headers = headers.iter().fold(OwnedHeaders::new(), |h, (key, value)| {
            h.insert(Header {
                key,
                value: Some(*value),
            })
        });
        rdkafka::message::OwnedMessage::new(
            None,
            None,
            "n.retry.1s".into(),
            rdkafka::Timestamp::CreateTime(written),
            7,
            0,
            Some(headers),
        )
    }

    #[test]
    fn a_due_time_beyond_the_timestamp_plus_the_last_bucket_is_clamped_there() {
        let x = b("1s,2s,4s");
        let written = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let bound = written + Duration::from_secs(4);
        let far = "2099-01-01T00:00:00Z";
        let m = written_at(1_000_000_000, &[(SUBSCRIBER, "s"), (NEXT_DUE_AT, far)]);
        // An edited record: due at its timestamp plus the last delay,
        // and that bound does not move when the held record is read again later (issue 43: it
        // was `now` + the last delay, re-read every 4 s and held for ever).
        for now in [
            written,
            written + Duration::from_secs(3),
            bound,
            bound + Duration::from_secs(3600),
        ] {
            let due = x.due_of(&m, 0, now);
            assert_eq!(due.at, bound, "read at {now:?}");
            assert_eq!(due.clamped.as_deref(), Some(far));
        }
        // Honest due times are kept, up to the bound itself (Retry-After capped at the last delay).
        for ahead in [1, 3, 4] {
            let due = written + Duration::from_secs(ahead);
            let m = written_at(
                1_000_000_000,
                &[(SUBSCRIBER, "s"), (NEXT_DUE_AT, &format_time(due))],
            );
            assert_eq!(
                x.due_of(&m, 0, written),
                Due {
                    at: due,
                    clamped: None
                }
            );
        }
        // A millisecond beyond is clamped.
        let beyond = format_time(bound + Duration::from_millis(1));
        let m = written_at(1_000_000_000, &[(NEXT_DUE_AT, &beyond)]);
        assert_eq!(x.due_of(&m, 0, written).at, bound);
    }

    #[test]
    fn a_due_time_in_the_past_or_unreadable_is_not_clamped() {
        let x = b("1s,2s,4s");
        let written = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let now = written + Duration::from_millis(500);
        // A clock behind: due at once (the due time has passed), nothing clamped.
        let past = format_time(written - Duration::from_secs(86_400));
        let m = written_at(1_000_000_000, &[(SUBSCRIBER, "s"), (NEXT_DUE_AT, &past)]);
        let due = x.due_of(&m, 1, now);
        assert!(due.at <= now && due.clamped.is_none(), "{due:?}");
        // Unreadable or missing: as written without it, the timestamp plus the bucket's delay
        // (within the bound), due at once when that has passed.
        for headers in [&[(NEXT_DUE_AT, "tomorrow")][..], &[][..]] {
            let m = written_at(1_000_000_000, headers);
            assert_eq!(
                x.due_of(&m, 1, now),
                Due {
                    at: written + Duration::from_secs(2),
                    clamped: None
                }
            );
            assert!(
                x.due_of(&m, 1, written + Duration::from_secs(60)).at
                    < written + Duration::from_secs(60)
            );
        }
    }

    #[test]
    fn without_a_timestamp_a_record_is_due_at_once() {
        // Nothing that does not move bounds its header: due now, reported when the header said
        // later.
        let x = b("1s,2s,4s");
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let later = format_time(now + Duration::from_secs(3));
        let m = retry_record(&[(SUBSCRIBER, "s"), (NEXT_DUE_AT, &later)]);
        assert_eq!(
            x.due_of(&m, 0, now),
            Due {
                at: now,
                clamped: Some(later)
            }
        );
        let earlier = now - Duration::from_secs(3);
        let m = retry_record(&[(SUBSCRIBER, "s"), (NEXT_DUE_AT, &format_time(earlier))]);
        assert_eq!(
            x.due_of(&m, 0, now),
            Due {
                at: earlier,
                clamped: None
            }
        );
        assert_eq!(
            x.due_of(&retry_record(&[]), 2, now),
            Due {
                at: now,
                clamped: None
            }
        );
    }

    #[test]
    fn times_round_trip_in_milliseconds() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(parse_time(&format_time(t)), Some(t));
        assert_eq!(parse_time("yesterday"), None);
    }
}
