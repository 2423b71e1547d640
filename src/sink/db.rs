//! The database connection: connecting (TLS as libpq would), the migrations, and the one function
//! that decides what a PostgreSQL error means for the sink ([`classify`]).
//!
//! # Why tokio-postgres, one connection per instance
//! The sink writes one batch at a time from one loop, so a pool would hold one busy connection and
//! idle others. tokio-postgres is the maintained async driver underneath most Rust PostgreSQL
//! stacks; it pipelines the statements of a batch on one connection, takes arrays as parameters
//! (one `INSERT … SELECT FROM UNNEST(…)` per batch instead of a round trip per row), and maps
//! `numeric` to `rust_decimal::Decimal` exactly (rust_decimal's `db-tokio-postgres`). TLS goes
//! through postgres-openssl, on the system OpenSSL that rdkafka links already.
//!
//! # Migrations
//! Versioned SQL files in `src/sink/migrations/` (`V<n>__<name>.sql`), embedded in the binary by
//! refinery and applied in order at start (or by `alert-sink migrate`), each once; refinery records
//! them in `refinery_schema_history` with a checksum and refuses to run when an applied file was
//! edited afterwards. Instances that start together serialize on a PostgreSQL advisory lock, so two
//! of them never apply the same migration at once.

use super::options::{DbOptions, SslMode, TlsOptions};
use anyhow::Context as _;
use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode};
use postgres_openssl::MakeTlsConnector;
use std::time::Duration;
use tokio_postgres::Client;
use tracing::{debug, info, warn};

mod embedded {
    refinery::embed_migrations!("src/sink/migrations");
}

/// Advisory lock key of the migrations (any fixed number; "alrtsink" in ASCII).
const MIGRATION_LOCK: i64 = 0x616c_7274_7369_6e6b;

/// What a failed database call means for the sink. The caller branches on it: an outage pauses,
/// a refused row is dead-lettered, a conflict is retried, anything else stops the sink.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The database cannot be reached, the connection broke, or it is shutting down or starting:
    /// never the record's fault. Pause, reconnect with backoff, write the same batch again.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A row of the batch was refused (class 22 data exception, 23 integrity violation).
    #[error("database refused the data ({sqlstate}): {message}")]
    Rejected { sqlstate: String, message: String },
    /// A serialization failure or deadlock: the same transaction may succeed when run again.
    #[error("database conflict, retry ({0})")]
    Retry(String),
    /// Anything else (missing table, no permission, a TLS or authentication failure): a bug or
    /// a misconfiguration that waiting will not fix.
    #[error("database error: {0}")]
    Fatal(String),
}

impl DbError {
    pub fn is_unavailable(&self) -> bool {
        matches!(self, DbError::Unavailable(_))
    }
}

/// Decides what a tokio-postgres error means (see [`DbError`]).
pub fn classify(e: &tokio_postgres::Error) -> DbError {
    let text = error_text(e);
    let Some(code) = e.code() else {
        // No SQLSTATE: the connection itself. A TLS protocol failure (a certificate that does not
        // verify, no common protocol version) is configuration; sockets that fail or close, also
        // during the handshake, are an outage.
        return if tls_refused(e) {
            DbError::Fatal(text)
        } else {
            DbError::Unavailable(text)
        };
    };
    let code = code.code();
    match &code[..2] {
        // connection exception, insufficient resources, operator intervention (shutdown, cannot
        // connect now, query canceled), system error.
        "08" | "53" | "57" | "58" => DbError::Unavailable(text),
        // A standby that has not been promoted yet (read-only transaction) is an outage too.
        "25" if code == "25006" => DbError::Unavailable(text),
        "40" => DbError::Retry(text),
        "55" if code == "55P03" => DbError::Retry(text),
        "22" | "23" => DbError::Rejected {
            sqlstate: code.to_owned(),
            message: e
                .as_db_error()
                .map(|d| d.message().to_owned())
                .unwrap_or(text),
        },
        _ => DbError::Fatal(text),
    }
}

/// Whether a TLS handshake was refused (not merely cut off) somewhere in `e`'s causes.
fn tls_refused(e: &tokio_postgres::Error) -> bool {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(ssl) = c.downcast_ref::<openssl::ssl::Error>() {
            return ssl.code() == openssl::ssl::ErrorCode::SSL;
        }
        if c.is::<openssl::error::ErrorStack>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// The error and its causes on one line (the message of a database error, never its detail,
/// which can quote row values).
fn error_text(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.code().code(), db.message());
    }
    let mut s = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// Host, port, database and user of a connection string, for logs (never the password).
pub fn describe(opts: &DbOptions) -> String {
    match opts.url.expose().parse::<tokio_postgres::Config>() {
        Ok(c) => {
            let host = c
                .get_hosts()
                .iter()
                .map(|h| match h {
                    tokio_postgres::config::Host::Tcp(h) => h.clone(),
                    tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
                })
                .collect::<Vec<_>>()
                .join(",");
            let port = c
                .get_ports()
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(",");
            format!(
                "{}@{host}:{port}/{}",
                c.get_user().unwrap_or("?"),
                c.get_dbname().unwrap_or("?")
            )
        }
        Err(_) => opts.url.redacted(),
    }
}

/// The TLS connector of `tls` (libpq's sslmode semantics on OpenSSL).
fn tls_connector(tls: &TlsOptions) -> anyhow::Result<MakeTlsConnector> {
    let mut b = SslConnector::builder(SslMethod::tls()).context("setting up OpenSSL")?;
    if let Some(ca) = &tls.root_cert {
        b.set_ca_file(ca)
            .with_context(|| format!("reading root certificate {}", ca.display()))?;
    }
    if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
        b.set_certificate_chain_file(cert)
            .with_context(|| format!("reading client certificate {}", cert.display()))?;
        b.set_private_key_file(key, SslFiletype::PEM)
            .with_context(|| format!("reading client key {}", key.display()))?;
    }
    let verify = match tls.mode {
        Some(SslMode::VerifyCa | SslMode::VerifyFull) => true,
        // libpq: require with a root certificate behaves as verify-ca.
        Some(SslMode::Require) => tls.root_cert.is_some(),
        _ => false,
    };
    if !verify {
        b.set_verify(SslVerifyMode::NONE);
    }
    let mut connector = MakeTlsConnector::new(b.build());
    if tls.mode != Some(SslMode::VerifyFull) {
        connector.set_callback(|config, _host| {
            config.set_verify_hostname(false);
            Ok(())
        });
    }
    Ok(connector)
}

/// The tokio-postgres configuration of `opts` (the TLS mode applied).
fn config(opts: &DbOptions) -> anyhow::Result<tokio_postgres::Config> {
    // tokio-postgres's parse errors name the option, never its value.
    let mut c: tokio_postgres::Config =
        opts.url.expose().parse().context("invalid database URL")?;
    c.connect_timeout(opts.connect_timeout);
    if c.get_application_name().is_none() {
        // Shows in pg_stat_activity, so an operator can tell the sink's connections apart.
        c.application_name("alert-sink");
    }
    if let Some(mode) = opts.tls.mode {
        c.ssl_mode(match mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        });
    }
    Ok(c)
}

/// Opens one connection, bounded by the connect timeout, and drives it on the current runtime.
/// Configuration mistakes are [`DbError::Fatal`].
pub async fn connect(opts: &DbOptions) -> Result<Client, DbError> {
    let cfg = config(opts).map_err(|e| DbError::Fatal(format!("{e:#}")))?;
    let tls = tls_connector(&opts.tls).map_err(|e| DbError::Fatal(format!("{e:#}")))?;
    let (client, connection) = tokio::time::timeout(
        opts.connect_timeout + Duration::from_secs(1),
        cfg.connect(tls),
    )
    .await
    .map_err(|_| DbError::Unavailable(format!("no connection within {:?}", opts.connect_timeout)))?
    .map_err(|e| classify(&e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            warn!(error = %error_text(&e), "database connection closed");
        }
    });
    debug!(db = %describe(opts), "connected to the database");
    Ok(client)
}

/// The first connection of a sink: waits out an unavailable database with `backoff` until
/// `give_up` resolves, for at most `bound` (None: for ever). A database that has not answered
/// within the bound is an error naming it and the last cause: at start, before it ever answered, a
/// wrong host or port looks exactly like an outage, and waiting for ever would hide the typo.
/// Fatal errors (authentication, TLS, configuration) return at once.
pub async fn connect_waiting(
    opts: &DbOptions,
    backoff: super::options::Backoff,
    bound: Option<Duration>,
    give_up: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Option<Client>> {
    tokio::pin!(give_up);
    let deadline = bound.map(|b| tokio::time::Instant::now() + b);
    let never_answered = |cause: &str| {
        anyhow::anyhow!(
            "the database at {} did not answer within {} (--db-start-timeout; 0s waits for ever): {cause}",
            describe(opts),
            humantime::format_duration(bound.unwrap_or_default()),
        )
    };
    let mut attempt = 0;
    loop {
        // An attempt ends at the deadline too: one slow connect must not stretch the bound.
        let connected = match deadline {
            Some(d) => match tokio::time::timeout_at(d, connect(opts)).await {
                Ok(c) => c,
                Err(_) => Err(DbError::Unavailable(format!(
                    "no connection within {:?}",
                    opts.connect_timeout
                ))),
            },
            None => connect(opts).await,
        };
        match connected {
            Ok(c) => return Ok(Some(c)),
            Err(DbError::Unavailable(e)) => {
                attempt += 1;
                let now = tokio::time::Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return Err(never_answered(&e));
                }
                let wait = backoff.delay(attempt, rand::random_range(0.5..=1.0));
                let wake = deadline.map_or(now + wait, |d| d.min(now + wait));
                warn!(db = %describe(opts), attempt, error = %e, retry_in_ms = (wake - now).as_millis() as u64, "database unavailable at start; waiting for it");
                tokio::select! {
                    () = tokio::time::sleep_until(wake) => {}
                    () = &mut give_up => return Ok(None),
                }
            }
            Err(e) => {
                return Err(
                    anyhow::Error::new(e).context(format!("connecting to {}", describe(opts)))
                )
            }
        }
    }
}

/// Applies the migrations not applied yet, under an advisory lock; returns the versions applied.
pub async fn migrate(client: &mut Client) -> anyhow::Result<Vec<String>> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| classify(&e))
        .context("taking the migration lock")?;
    let report = embedded::migrations::runner()
        .set_grouped(true)
        .run_async(client)
        .await;
    // Unlocked also after a failure; a broken connection drops the lock with the session anyway.
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    let report = report.context("applying the migrations")?;
    unlocked
        .map_err(|e| classify(&e))
        .context("releasing the migration lock")?;
    let applied: Vec<String> = report
        .applied_migrations()
        .iter()
        .map(|m| format!("V{}__{}", m.version(), m.name()))
        .collect();
    if applied.is_empty() {
        debug!("database schema up to date");
    } else {
        info!(applied = ?applied, "migrations applied");
    }
    Ok(applied)
}

/// The migrations this binary carries, as `V<n>__<name>`.
pub fn known_migrations() -> Vec<String> {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| format!("V{}__{}", m.version(), m.name()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::options::{Backoff, TlsOptions};

    /// Nothing listens on port 1: no database server is needed to see the start bound.
    #[test]
    fn a_database_that_never_answers_fails_the_start_within_the_bound() {
        let opts = DbOptions {
            url: "postgres://sink:s3cr3t@127.0.0.1:1/alerts".parse().unwrap(),
            tls: TlsOptions::default(),
            connect_timeout: Duration::from_secs(1),
        };
        let backoff = Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(200),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let bound = Some(Duration::from_millis(600));
        let err = rt
            .block_on(connect_waiting(
                &opts,
                backoff,
                bound,
                std::future::pending(),
            ))
            .unwrap_err();
        let took = started.elapsed();
        let text = format!("{err:#}");
        assert!(took >= Duration::from_millis(600), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(text.contains("127.0.0.1:1"), "{text}");
        // The refusal, or on a loaded machine the attempt cut off by the connect timeout.
        assert!(
            text.contains("Connection refused") || text.contains("no connection within"),
            "{text}"
        );
        assert!(!text.contains("s3cr3t"), "{text}");
        println!("{text}");
    }
}
