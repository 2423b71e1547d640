//! librdkafka's own log lines and error events, through tracing, at sensible levels and
//! rate-limited.
//!
//! librdkafka reports a broker it cannot reach on every reconnect attempt, from every client of
//! the process; printed as they come, a down broker produces hundreds of lines a minute. Here each
//! kind of line (a log facility, or an error code) is printed the first time, then at most once
//! per [`QUIET_PERIOD`], with the number of lines suppressed meanwhile. Levels: librdkafka's
//! errors about connections are transient (it reconnects by itself), so they are warnings; an error
//! event is an error only when librdkafka flags it fatal. Every context of the project's clients
//! routes its `log` and `error` callbacks here; [`Logged`] is the context of clients that need
//! nothing else.

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientContext;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

/// Shortest time between two lines of the same kind.
pub const QUIET_PERIOD: Duration = Duration::from_secs(30);

/// When each kind of line was last printed, and how many were suppressed since.
fn limiter() -> &'static Mutex<HashMap<String, (Instant, u64)>> {
    static LIMITER: OnceLock<Mutex<HashMap<String, (Instant, u64)>>> = OnceLock::new();
    LIMITER.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Whether a line of `kind` may be printed now; if so, how many of its kind were suppressed since
/// the last one printed.
fn admit(kind: &str) -> Option<u64> {
    let Ok(mut seen) = limiter().lock() else {
        return Some(0);
    };
    let now = Instant::now();
    match seen.get_mut(kind) {
        Some((last, suppressed)) if now.duration_since(*last) < QUIET_PERIOD => {
            *suppressed += 1;
            None
        }
        Some((last, suppressed)) => {
            let n = *suppressed;
            (*last, *suppressed) = (now, 0);
            Some(n)
        }
        None => {
            seen.insert(kind.to_owned(), (now, 0));
            Some(0)
        }
    }
}

/// A log line of librdkafka.
pub fn log(level: RDKafkaLogLevel, facility: &str, message: &str) {
    if matches!(level, RDKafkaLogLevel::Debug) {
        // Debug lines are asked for (`debug=...`): never suppressed.
        return debug!(target: "librdkafka", facility, "{message}");
    }
    let Some(suppressed) = admit(&format!("log:{facility}")) else {
        return;
    };
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => {
            warn!(target: "librdkafka", facility, suppressed, "{message}")
        }
        RDKafkaLogLevel::Warning => warn!(target: "librdkafka", facility, suppressed, "{message}"),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info | RDKafkaLogLevel::Debug => {
            info!(target: "librdkafka", facility, suppressed, "{message}")
        }
    }
}

/// An error event of librdkafka (client-wide, not tied to a call).
pub fn error(e: &KafkaError, reason: &str) {
    let code = e.rdkafka_error_code();
    if matches!(e, KafkaError::PartitionEOF(_)) || code == Some(RDKafkaErrorCode::PartitionEOF) {
        // What a reader waits for, not an error.
        return debug!(target: "librdkafka", reason, "partition end");
    }
    let Some(suppressed) = admit(&format!("error:{code:?}")) else {
        return;
    };
    if code == Some(RDKafkaErrorCode::Fatal) {
        error!(target: "librdkafka", error = %e, suppressed, "{reason}");
    } else {
        warn!(target: "librdkafka", error = %e, suppressed, "{reason}");
    }
}

/// The context of clients that need no callbacks of their own: logging as above.
#[derive(Debug, Default, Clone, Copy)]
pub struct Logged;

impl ClientContext for Logged {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self::error(&error, reason);
    }
}

impl ConsumerContext for Logged {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_kind_is_printed_once_per_quiet_period_with_the_suppressed_count() {
        let kind = format!("test:{:?}", Instant::now());
        assert_eq!(admit(&kind), Some(0));
        assert_eq!(admit(&kind), None);
        assert_eq!(admit(&kind), None);
        assert_eq!(
            admit("test:another kind"),
            Some(0),
            "kinds are limited apart"
        );
        if let Ok(mut seen) = limiter().lock() {
            let last = &mut seen.get_mut(&kind).expect("seen").0;
            *last = last
                .checked_sub(QUIET_PERIOD)
                .expect("a clock older than the quiet period");
        }
        assert_eq!(
            admit(&kind),
            Some(2),
            "the next line tells how many were left out"
        );
    }
}
