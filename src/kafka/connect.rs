//! The start-up connect check: does a broker at the bootstrap address answer, and if not, why.
//!
//! Without it a wrong or down broker looks like a hang: librdkafka retries for ever, and the first
//! call with a timeout fails a minute or two later with a message that names neither the address
//! nor the cause. Every binary runs [`check`] before anything else: a metadata request, bounded by
//! `--connect-timeout`, with librdkafka's error events captured so the failure says what happened
//! (connection refused, DNS, TLS, SASL authentication, an OIDC token endpoint that gives no
//! token). Authentication and TLS failures end the check at once (retrying the same credentials
//! cannot help); a refused connection or a name that does not resolve is retried until the
//! bound, since a broker or a DNS record may be on its way.
//!
//! With `sasl.oauthbearer.method=oidc`, librdkafka fetches a token from
//! `sasl.oauthbearer.token.endpoint.url` before it connects, and reports a failure as an
//! authentication error whose text is the endpoint's answer or curl's, without the URL (that is
//! only in a log line). The check names the URL and the client id, never the secret
//! ([`ConnectError::Token`]). librdkafka retries a refusal (HTTP 401, connection refused) every
//! 10 s for ever; the check stops at the first: a refused secret or a down endpoint at start is a
//! deployment mistake. (Only 5xx, 408, 425 and 429 answers are retried inside librdkafka's one
//! request, 5 s apart, up to four times, before it reports.)

use super::config::KafkaConfig;
use super::logging;
use super::secrets;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer as _, ProducerContext};
use rdkafka::ClientContext;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Default bound of the check.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why no broker answered.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot resolve the bootstrap address {bootstrap} (DNS): {detail}")]
    Dns { bootstrap: String, detail: String },
    #[error("the broker at {bootstrap} refused the connection (is it running, is the port right?): {detail}")]
    Refused { bootstrap: String, detail: String },
    #[error("TLS with {bootstrap} failed: {detail}")]
    Tls { bootstrap: String, detail: String },
    #[error(
        "authentication to {bootstrap} failed (SASL mechanism {mechanism}, user {user}): {detail}"
    )]
    Authentication {
        bootstrap: String,
        mechanism: String,
        user: String,
        detail: String,
    },
    #[error("no OAUTHBEARER token from the OIDC token endpoint {url} for client id {client_id}, so no connection to {bootstrap}: {detail}")]
    Token {
        bootstrap: String,
        url: String,
        client_id: String,
        detail: String,
    },
    #[error("no broker at {bootstrap} answered within {timeout:?}: {detail}")]
    NoAnswer {
        bootstrap: String,
        timeout: Duration,
        detail: String,
    },
    #[error("cannot create a Kafka client for {bootstrap}: {source}")]
    Client {
        bootstrap: String,
        #[source]
        source: KafkaError,
    },
}

/// Checks that a broker at `kafka`'s bootstrap address answers a metadata request within
/// `timeout`. Blocking.
pub fn check(kafka: &KafkaConfig, timeout: Duration) -> Result<(), ConnectError> {
    let bootstrap = kafka.bootstrap.clone();
    let probe: BaseProducer<Probe> = kafka
        .admin()
        .create_with_context(Probe::default())
        .map_err(|source| ConnectError::Client {
            bootstrap: bootstrap.clone(),
            source,
        })?;
    let deadline = Instant::now() + timeout;
    loop {
        let slice = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(250));
        if probe.client().fetch_metadata(None, slice).is_ok() {
            return Ok(());
        }
        // Serve the error events librdkafka queued meanwhile.
        probe.poll(Duration::ZERO);
        let last = probe.context().last();
        let now = Instant::now();
        match last {
            Some((code, detail)) if now >= deadline || is_final(code, &detail) => {
                return Err(classify(kafka, code, detail, timeout));
            }
            None if now >= deadline => {
                let detail = "no error reported".to_owned();
                return Err(ConnectError::NoAnswer {
                    bootstrap,
                    timeout,
                    detail,
                });
            }
            _ => {}
        }
    }
}

/// Failures that retrying with the same settings cannot mend.
fn is_final(code: RDKafkaErrorCode, detail: &str) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Authentication
            | RDKafkaErrorCode::SaslAuthenticationFailed
            | RDKafkaErrorCode::SSL
    ) || is_tls(detail)
}

/// librdkafka's words for a token it could not get (`rd_kafka_oauthbearer_set_token_failure`).
fn is_token_failure(detail: &str) -> bool {
    detail.contains("Failed to acquire SASL OAUTHBEARER token")
}

/// librdkafka reports a failed handshake as a transport failure; its text says it was TLS.
fn is_tls(detail: &str) -> bool {
    detail.contains("SSL handshake failed") || detail.contains("certificate verify failed")
}

fn classify(
    kafka: &KafkaConfig,
    code: RDKafkaErrorCode,
    detail: String,
    timeout: Duration,
) -> ConnectError {
    let bootstrap = kafka.bootstrap.clone();
    match code {
        RDKafkaErrorCode::Resolve => ConnectError::Dns { bootstrap, detail },
        RDKafkaErrorCode::SSL => ConnectError::Tls { bootstrap, detail },
        _ if is_tls(&detail) => ConnectError::Tls { bootstrap, detail },
        RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed => {
            let property = |keys: &[&str]| {
                keys.iter()
                    .find_map(|k| kafka.properties.get(*k))
                    .cloned()
                    .unwrap_or_else(|| "(none)".to_owned())
            };
            // The endpoint's answer or curl's error: no secret is expected in it, but it is made
            // by others, so it is scrubbed like every such message.
            let detail = secrets::scrub(&detail, &kafka.properties);
            if is_token_failure(&detail) {
                return ConnectError::Token {
                    bootstrap,
                    url: property(&["sasl.oauthbearer.token.endpoint.url"]),
                    client_id: property(&["sasl.oauthbearer.client.id"]),
                    detail,
                };
            }
            ConnectError::Authentication {
                bootstrap,
                mechanism: property(&["sasl.mechanism", "sasl.mechanisms"]),
                user: property(&["sasl.username", "sasl.oauthbearer.client.id"]),
                detail,
            }
        }
        _ if detail.contains("Connection refused") => ConnectError::Refused { bootstrap, detail },
        _ => ConnectError::NoAnswer {
            bootstrap,
            timeout,
            detail,
        },
    }
}

/// Remembers the most telling error event: the first of a kind that settles the question (DNS,
/// TLS, authentication, refused) wins over the "all brokers are down" summaries that follow it.
#[derive(Default)]
struct Probe {
    last: Mutex<Option<(RDKafkaErrorCode, String)>>,
}

impl Probe {
    /// Keeps `code` unless it is only a summary ("all brokers are down") of what is kept already.
    fn note(&self, code: RDKafkaErrorCode, detail: &str) {
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        let summary = matches!(code, RDKafkaErrorCode::AllBrokersDown);
        if last.is_none() || !summary {
            *last = Some((code, detail.to_owned()));
        }
    }

    fn last(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.last.lock().ok().and_then(|l| l.clone())
    }
}

impl ClientContext for Probe {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        // A failed TLS handshake is logged by librdkafka's broker thread at once; the error
        // event with the same text only arrives when the check next serves its queue, and on a
        // busy machine it has come too late. So the log line settles it too (without its
        // "[thrd:…]: " prefix).
        if is_tls(log_message) {
            let detail = log_message
                .split_once("]: ")
                .map_or(log_message, |(_, rest)| rest);
            self.note(RDKafkaErrorCode::SSL, detail);
        }
        // The check reports the failure itself; librdkafka's lines about it are detail.
        if matches!(level, RDKafkaLogLevel::Debug) {
            logging::log(level, fac, log_message);
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(code) = error.rdkafka_error_code() {
            self.note(code, reason);
        }
    }
}

impl ProducerContext for Probe {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &rdkafka::producer::DeliveryResult<'_>, _: ()) {}
}
