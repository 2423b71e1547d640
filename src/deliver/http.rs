//! One webhook call and what its result means.
//!
//! [`classify`] is the one place that turns what happened to a request into an [`Outcome`]; it
//! is pure, so every rule below has a unit test:
//!
//! | what happened                                   | outcome                              |
//! |-------------------------------------------------|--------------------------------------|
//! | 2xx                                             | delivered                            |
//! | 5xx, 408, a timeout, connection refused or reset | transient: next retry bucket          |
//! | no answer within the batch's delivery deadline  | transient (`deadline`)               |
//! | not tried: no turn, or the circuit is open      | transient (`deferred`, `circuit_open`) |
//! | 429                                             | transient, not before `Retry-After`  |
//! | 410 Gone                                        | gone: the parking lot                |
//! | any other 4xx (and 1xx/3xx: redirects are not followed) | permanent: the DLQ at once    |
//!
//! The request is a POST of the notification's JSON exactly as it was read, with
//! `Idempotency-Key: <notification id>/<subscriber>`, so a receiver can make a repeated delivery
//! harmless (the HTTP side is at-least-once). The client bounds the connection and the whole
//! request with timeouts, follows no redirect (a webhook that moved should say so, not silently
//! receive alerts elsewhere), and the error kept for the retry headers is short and never the
//! payload.

use std::time::{Duration, SystemTime};

/// The request header a receiver deduplicates on.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// Longest `Retry-After` honoured: a receiver cannot park a record for longer than this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// What happened to one request, before it is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The receiver answered with `status` (and maybe a `Retry-After` header).
    Answered {
        status: u16,
        retry_after: Option<String>,
    },
    /// Connecting failed (refused, reset, DNS, TLS).
    Connect(String),
    /// The connection or the whole request took longer than its timeout.
    Timeout,
    /// Anything else the client reports (a broken body, a protocol error).
    Other(String),
    /// Not sent: it did not get its turn within the batch's deadline (its subscriber was slow).
    NotStarted,
    /// Not sent: the subscriber's circuit is open ([`super::breaker`]).
    CircuitOpen,
    /// Sent, but no answer within the batch's delivery deadline: the batch moved on without it
    /// (the request runs on to its own timeout, detached; a late answer only counts in metrics).
    Unfinished,
}

impl Attempt {
    /// Whether a request was sent (a retry's `retry.attempt` counts only these).
    pub fn tried(&self) -> bool {
        !matches!(self, Attempt::NotStarted | Attempt::CircuitOpen)
    }

    /// What the attempt says about the endpoint, for its circuit breaker: `Some(true)` if it
    /// answered (anything but a 5xx or 408: a 4xx, 410 or 429 comes back at once and says what the
    /// receiver wants), `Some(false)` if it failed (5xx, 408, timeout, connection, no answer
    /// within the deadline), `None` if no request was made.
    pub fn responsive(&self) -> Option<bool> {
        match self {
            Attempt::Answered { status, .. } => {
                Some(!(500..600).contains(status) && *status != 408)
            }
            Attempt::Connect(_) | Attempt::Timeout | Attempt::Other(_) | Attempt::Unfinished => {
                Some(false)
            }
            Attempt::NotStarted | Attempt::CircuitOpen => None,
        }
    }
}

/// What a delivery attempt means for the (notification, subscriber).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    /// Worth another try later; `not_before`: the receiver asked for at least this long.
    Transient {
        class: &'static str,
        reason: String,
        not_before: Option<Duration>,
    },
    /// The receiver refuses this request: retrying the same bytes cannot help.
    Permanent {
        class: &'static str,
        reason: String,
    },
    /// The receiver says the subscription is gone (410): people decide.
    Gone {
        reason: String,
    },
}

impl Outcome {
    /// The metrics label of the outcome.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Transient { .. } => "transient",
            Outcome::Permanent { .. } => "permanent",
            Outcome::Gone { .. } => "gone",
        }
    }
}

/// The one decision: what an [`Attempt`] means. `now` dates an HTTP-date `Retry-After`.
pub fn classify(attempt: &Attempt, now: SystemTime) -> Outcome {
    match attempt {
        Attempt::Answered { status, .. } if (200..300).contains(status) => Outcome::Delivered,
        Attempt::Answered {
            status: 429,
            retry_after,
        } => Outcome::Transient {
            class: "http.429",
            reason: "HTTP 429 Too Many Requests".into(),
            not_before: retry_after
                .as_deref()
                .and_then(|v| retry_after_delay(v, now)),
        },
        Attempt::Answered { status: 408, .. } => Outcome::Transient {
            class: "http.408",
            reason: "HTTP 408 Request Timeout".into(),
            not_before: None,
        },
        Attempt::Answered { status, .. } if (500..600).contains(status) => Outcome::Transient {
            class: "http.5xx",
            reason: format!("HTTP {status}"),
            not_before: None,
        },
        Attempt::Answered { status: 410, .. } => Outcome::Gone {
            reason: "HTTP 410 Gone".into(),
        },
        Attempt::Answered { status, .. } => Outcome::Permanent {
            class: "http.4xx",
            reason: format!("HTTP {status}"),
        },
        Attempt::Connect(e) => Outcome::Transient {
            class: "connect",
            reason: short(e),
            not_before: None,
        },
        Attempt::Timeout => Outcome::Transient {
            class: "timeout",
            reason: "request timed out".into(),
            not_before: None,
        },
        Attempt::Other(e) => Outcome::Transient {
            class: "other",
            reason: short(e),
            not_before: None,
        },
        Attempt::NotStarted => Outcome::Transient {
            class: "deferred",
            reason: "not tried: no turn within the batch".into(),
            not_before: None,
        },
        Attempt::CircuitOpen => Outcome::Transient {
            class: "circuit_open",
            reason: "not tried: the subscriber's circuit is open".into(),
            not_before: None,
        },
        Attempt::Unfinished => Outcome::Transient {
            class: "deadline",
            reason: "no answer within the batch's delivery deadline".into(),
            not_before: None,
        },
    }
}

/// A `Retry-After` value as a delay from `now`: delta-seconds or an HTTP-date (RFC 9110), capped
/// at [`MAX_RETRY_AFTER`]; `None` when it is neither.
pub fn retry_after_delay(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    let delay = if let Ok(secs) = v.parse::<u64>() {
        Duration::from_secs(secs)
    } else {
        let at =
            time::OffsetDateTime::parse(v, &time::format_description::well_known::Rfc2822).ok()?;
        SystemTime::from(at)
            .duration_since(now)
            .unwrap_or(Duration::ZERO)
    };
    Some(delay.min(MAX_RETRY_AFTER))
}

/// An error text short enough for a header and a log line (the client's errors never hold the
/// request body).
fn short(e: &str) -> String {
    crate::dlq::sanitize(e).chars().take(160).collect()
}

/// The HTTP client of a deliverer: connection and request timeouts, no redirects.
pub fn client(
    connect_timeout: Duration,
    request_timeout: Duration,
) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .timeout(request_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("price-alerts-deliver/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| anyhow::anyhow!("building the HTTP client: {e}"))
}

/// POSTs `body` (a notification's JSON) to `url` with its idempotency key; what happened.
pub async fn post(
    client: &reqwest::Client,
    url: &reqwest::Url,
    key: &str,
    body: Vec<u8>,
) -> Attempt {
    let sent = client
        .post(url.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(IDEMPOTENCY_KEY, key)
        .body(body)
        .send()
        .await;
    match sent {
        Ok(response) => {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            Attempt::Answered {
                status: response.status().as_u16(),
                retry_after,
            }
        }
        Err(e) => describe(e),
    }
}

/// What a client error was, with its cause chain (reqwest's own text says only "error sending
/// request").
fn describe(e: reqwest::Error) -> Attempt {
    if e.is_timeout() {
        return Attempt::Timeout;
    }
    let connect = e.is_connect();
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    if connect {
        Attempt::Connect(text)
    } else {
        Attempt::Other(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(status: u16) -> Attempt {
        Attempt::Answered {
            status,
            retry_after: None,
        }
    }

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777) // Sun, 06 Nov 1994 08:49:37 GMT
    }

    #[test]
    fn status_codes() {
        for s in [200, 201, 202, 204, 299] {
            assert_eq!(classify(&answered(s), now()), Outcome::Delivered, "{s}");
        }
        for s in [500, 502, 503, 504, 599, 408] {
            assert_eq!(classify(&answered(s), now()).label(), "transient", "{s}");
        }
        for s in [400, 401, 403, 404, 409, 422, 301, 302, 100] {
            assert_eq!(classify(&answered(s), now()).label(), "permanent", "{s}");
        }
        assert!(matches!(
            classify(&answered(410), now()),
            Outcome::Gone { .. }
        ));
    }

    #[test]
    fn transport_failures_are_transient() {
        let refused =
            Attempt::Connect("tcp connect error: Connection refused (os error 111)".into());
        assert!(matches!(
            classify(&refused, now()),
            Outcome::Transient {
                class: "connect",
                not_before: None,
                ..
            }
        ));
        assert!(matches!(
            classify(&Attempt::Timeout, now()),
            Outcome::Transient {
                class: "timeout",
                ..
            }
        ));
        let long = Attempt::Other("x".repeat(1000));
        let Outcome::Transient { reason, .. } = classify(&long, now()) else {
            panic!("not transient")
        };
        assert!(reason.len() <= 160);
        assert!(matches!(
            classify(&Attempt::NotStarted, now()),
            Outcome::Transient {
                class: "deferred",
                ..
            }
        ));
        assert!(matches!(
            classify(&Attempt::CircuitOpen, now()),
            Outcome::Transient {
                class: "circuit_open",
                ..
            }
        ));
        assert!(matches!(
            classify(&Attempt::Unfinished, now()),
            Outcome::Transient {
                class: "deadline",
                ..
            }
        ));
    }

    #[test]
    fn what_the_breaker_hears() {
        for s in [200, 400, 404, 410, 429] {
            assert_eq!(answered(s).responsive(), Some(true), "{s}");
        }
        for s in [500, 503, 408] {
            assert_eq!(answered(s).responsive(), Some(false), "{s}");
        }
        for a in [
            Attempt::Timeout,
            Attempt::Unfinished,
            Attempt::Connect("refused".into()),
            Attempt::Other("reset".into()),
        ] {
            assert_eq!(a.responsive(), Some(false), "{a:?}");
            assert!(a.tried());
        }
        for a in [Attempt::NotStarted, Attempt::CircuitOpen] {
            assert_eq!(a.responsive(), None, "{a:?}");
            assert!(!a.tried(), "{a:?}");
        }
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let with = |v: &str| {
            classify(
                &Attempt::Answered {
                    status: 429,
                    retry_after: Some(v.into()),
                },
                now(),
            )
        };
        assert!(
            matches!(with("3"), Outcome::Transient { not_before: Some(d), .. } if d == Duration::from_secs(3))
        );
        let date = with("Sun, 06 Nov 1994 08:49:47 GMT");
        assert!(
            matches!(date, Outcome::Transient { not_before: Some(d), .. } if d == Duration::from_secs(10)),
            "{date:?}"
        );
        assert!(matches!(
            with("Sun, 06 Nov 1994 08:49:00 GMT"),
            Outcome::Transient {
                not_before: Some(Duration::ZERO),
                ..
            }
        ));
        assert!(matches!(
            with("soon"),
            Outcome::Transient {
                not_before: None,
                ..
            }
        ));
        assert!(matches!(
            with("999999"),
            Outcome::Transient {
                not_before: Some(MAX_RETRY_AFTER),
                ..
            }
        ));
        let none = classify(&answered(429), now());
        assert!(matches!(
            none,
            Outcome::Transient {
                class: "http.429",
                not_before: None,
                ..
            }
        ));
    }
}
