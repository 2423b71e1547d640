//! alert-sink's options: the one struct the sink runs with ([`SinkOptions`]) and the database
//! connection settings ([`DbOptions`]); the command line that builds them is `crate::cli::sink`.
//!
//! The connection string is a secret (it may hold the password): it lives in a [`DatabaseUrl`]
//! whose `Debug` shows it with the password masked, clap never prints the `DATABASE_URL`
//! environment value in `--help`, and the sink logs only host, port, database and user.
//!
//! TLS follows libpq's conventions, so a deployment's existing settings carry over: `sslmode`,
//! `sslrootcert`, `sslcert` and `sslkey` may be given in the URL's query, as `--db-ssl-*` flags, or
//! as the `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY` environment variables (a flag or
//! variable wins over the URL).

// The `///` comments on clap arguments are --help texts, written for a terminal.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use crate::kafka::KafkaConfig;
use anyhow::{bail, Context as _};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// Default largest batch, in records: one database transaction each.
pub const DEFAULT_MAX_BATCH: usize = 5_000;
/// Default age at which a batch is written even if records are still arriving.
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_millis(100);
/// Default quiet time after which a batch is written: once the consumer has caught up, waiting
/// longer only adds latency.
pub const DEFAULT_LINGER: Duration = Duration::from_millis(5);
/// Default bound on the database's first answer at start.
pub const DEFAULT_DB_START_TIMEOUT: Duration = Duration::from_secs(30);

/// A PostgreSQL connection string that never shows its password.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// The string itself, for the connection only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with any password replaced by `***` (`user:secret@host` and `password=secret`).
    pub fn redacted(&self) -> String {
        let s = &self.0;
        let masked = if let Some((scheme, rest)) = s.split_once("://") {
            let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
            match authority.rsplit_once('@') {
                Some((userinfo, host)) => {
                    let user = userinfo.split(':').next().unwrap_or_default();
                    let mask = if userinfo.contains(':') { ":***" } else { "" };
                    format!("{scheme}://{user}{mask}@{host}{tail}")
                }
                None => s.clone(),
            }
        } else {
            s.clone()
        };
        // A password parameter (key=value form, or ?password= in a URL).
        masked
            .split_inclusive([' ', '&', '?'])
            .map(|part| match part.strip_prefix("password=") {
                Some(rest) => {
                    let sep = rest.chars().last().filter(|c| matches!(c, ' ' | '&' | '?'));
                    format!("password=***{}", sep.map(String::from).unwrap_or_default())
                }
                None => part.to_owned(),
            })
            .collect()
    }
}

impl FromStr for DatabaseUrl {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        if s.trim().is_empty() {
            bail!("the database URL is empty");
        }
        Ok(DatabaseUrl(s.to_owned()))
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

/// libpq's `sslmode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SslMode {
    /// Plain text only.
    Disable,
    /// TLS when the server offers it, unverified; plain text otherwise (libpq's default).
    Prefer,
    /// TLS or nothing; the certificate is verified only when a root certificate is given (as
    /// libpq does).
    Require,
    /// TLS, certificate chain verified against the root certificate (or the system's roots).
    VerifyCa,
    /// As verify-ca, and the certificate must name the host.
    VerifyFull,
}

impl FromStr for SslMode {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        <Self as clap::ValueEnum>::from_str(s, true)
            .map_err(|_| anyhow::anyhow!("invalid sslmode {s:?}"))
    }
}

/// TLS settings of the database connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// None: the URL's or tokio-postgres's default (prefer).
    pub mode: Option<SslMode>,
    /// CA certificates (PEM) the server's certificate must chain to.
    pub root_cert: Option<PathBuf>,
    /// Client certificate (PEM) and its key, for servers that ask for one.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl TlsOptions {
    /// Checks that every file named can be opened, so a mistyped path stops the start naming the
    /// file and the system's reason ("No such file or directory"), before anything is connected
    /// to; OpenSSL, reading it later, says only `BIO_new_file:reason(2)`.
    pub fn check_files(&self) -> anyhow::Result<()> {
        let files = [
            ("root certificate", &self.root_cert),
            ("client certificate", &self.cert),
            ("client key", &self.key),
        ];
        for (what, path) in files {
            if let Some(path) = path {
                std::fs::File::open(path)
                    .with_context(|| format!("cannot read the {what} {}", path.display()))?;
            }
        }
        Ok(())
    }
}

/// How to reach the database.
#[derive(Debug, Clone)]
pub struct DbOptions {
    /// The connection string; the libpq TLS parameters are taken out of it into `tls`.
    pub url: DatabaseUrl,
    pub tls: TlsOptions,
    /// Bound on one connection attempt (TCP, TLS, authentication).
    pub connect_timeout: Duration,
}

/// Reconnection pacing during an outage: exponential from `initial`, capped at `max`, jittered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The wait before attempt `n` (1-based) of a reconnection, with `jitter` in [0.5, 1].
    pub fn delay(&self, n: u32, jitter: f64) -> Duration {
        let exp = self
            .initial
            .saturating_mul(1u32 << n.saturating_sub(1).min(16));
        exp.min(self.max).mul_f64(jitter.clamp(0.5, 1.0))
    }
}

/// TEST ONLY: where the sink stops dead, so a test can SIGKILL it at exactly that point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldAt {
    /// Inside the n-th batch's database transaction: rows and offsets written, not committed.
    InDbTxn,
    /// After the n-th batch's database commit, before its offsets are committed to Kafka.
    AfterDbCommit,
}

/// TEST ONLY: hold at `at` on the `batch`-th batch, after writing its offsets to `file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestHold {
    pub at: HoldAt,
    pub batch: u64,
    pub file: PathBuf,
}

/// Everything one sink instance runs with.
#[derive(Debug, Clone)]
pub struct SinkOptions {
    pub kafka: KafkaConfig,
    pub db: DbOptions,
    /// The notifications topic.
    pub topic: String,
    /// The sink's own consumer group; its offsets in `sink_offsets` are keyed by it.
    pub group_id: String,
    /// Static membership (`group.instance.id`): a restarted instance takes its partitions back
    /// at once. None: dynamic membership.
    pub group_instance_id: Option<String>,
    /// A batch is written when it holds this many records...
    pub max_batch: usize,
    /// ...or is this old...
    pub commit_interval: Duration,
    /// ...or no record arrived for this long (the consumer has caught up).
    pub linger: Duration,
    /// Bound on writing one batch; past it the database counts as unavailable.
    pub write_timeout: Duration,
    /// How long the database has to answer at start: past it, with no connection ever made, the
    /// start fails (a wrong host or port looks like nothing else). None: wait for ever. An outage
    /// after the first connection pauses instead, for as long as it lasts.
    pub db_start_timeout: Option<Duration>,
    /// Reconnection pacing during an outage.
    pub backoff: Backoff,
    /// Larger records are dead-lettered as oversize.
    pub max_record_bytes: usize,
    /// Also commit the stored offsets to the Kafka group, for lag monitoring only (the sink never
    /// reads them back while the database answers).
    pub commit_to_kafka: bool,
    /// How long a graceful shutdown may take before exiting non-zero.
    pub shutdown_timeout: Duration,
    /// Stop once idle this long with nothing buffered (demos and benchmarks).
    pub exit_when_idle: Option<Duration>,
    /// TEST ONLY: stop dead at a given point of a given batch.
    pub test_hold: Option<TestHold>,
    /// TEST ONLY: the watchdog's bound instead of [`crate::sink::run::watchdog_bound`]: a test
    /// sees in seconds that a stalled loop ends the process.
    pub test_watchdog_bound: Option<Duration>,
}

/// Takes libpq's TLS parameters (which tokio-postgres does not know) out of a URL's query.
pub fn split_tls_params(url: &DatabaseUrl) -> anyhow::Result<(DatabaseUrl, TlsOptions)> {
    let s = url.expose();
    let Some((base, query)) = s.split_once('?').filter(|_| s.contains("://")) else {
        return Ok((url.clone(), TlsOptions::default()));
    };
    let mut tls = TlsOptions::default();
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v);
        match k {
            "sslmode" => tls.mode = Some(v.parse()?),
            "sslrootcert" => tls.root_cert = Some(v.into()),
            "sslcert" => tls.cert = Some(v.into()),
            "sslkey" => tls.key = Some(v.into()),
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((DatabaseUrl(url), tls))
}

/// `%XX` decoding of a URL query value (paths of certificate files).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> DatabaseUrl {
        s.parse().unwrap()
    }

    #[test]
    fn the_password_never_shows() {
        let u = url("postgres://sink:s3cr3t@db.example:5432/alerts?sslmode=require");
        assert_eq!(
            u.redacted(),
            "postgres://sink:***@db.example:5432/alerts?sslmode=require"
        );
        assert!(!format!("{u:?}").contains("s3cr3t"));
        assert_eq!(
            url("postgres://sink@h/db").redacted(),
            "postgres://sink@h/db"
        );
        let kv = url("host=h user=sink password=s3cr3t dbname=alerts");
        assert_eq!(kv.redacted(), "host=h user=sink password=*** dbname=alerts");
        assert!(!url("postgres://h/db?password=s3cr3t&x=1")
            .redacted()
            .contains("s3cr3t"));
    }

    #[test]
    fn libpq_tls_parameters_leave_the_url() {
        let (u, tls) = split_tls_params(&url(
            "postgres://u:p@h:5/d?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
        ))
        .unwrap();
        assert_eq!(u.expose(), "postgres://u:p@h:5/d?application_name=x");
        assert_eq!(tls.mode, Some(SslMode::VerifyFull));
        assert_eq!(tls.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        assert!(split_tls_params(&url("postgres://h/d?sslmode=sometimes")).is_err());
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(5),
        };
        assert_eq!(b.delay(1, 1.0), Duration::from_millis(200));
        assert_eq!(b.delay(3, 1.0), Duration::from_millis(800));
        assert_eq!(b.delay(30, 1.0), Duration::from_secs(5));
        assert_eq!(b.delay(2, 0.5), Duration::from_millis(200));
    }
}
