//! alert-sink's options: the one struct the sink runs with ([`SinkOptions`]), the database
//! connection settings ([`DbOptions`]), and the command line that builds them.
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

use crate::cli::KafkaArgs;
use crate::config::KafkaConfig;
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
        <Self as clap::ValueEnum>::from_str(s, true).map_err(|_| anyhow::anyhow!("invalid sslmode {s:?}"))
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
        let exp = self.initial.saturating_mul(1u32 << n.saturating_sub(1).min(16));
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
}

/// The database flags, shared by alert-sink and alert-verify.
#[derive(Debug, Clone, clap::Args)]
pub struct DbArgs {
    /// PostgreSQL connection string (postgres://user:password@host:port/db?sslmode=...).
    /// Never logged with its password.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<DatabaseUrl>,
    /// TLS mode, as libpq's sslmode (wins over the URL's).
    #[arg(long, env = "PGSSLMODE", value_enum)]
    pub db_ssl_mode: Option<SslMode>,
    /// CA certificates (PEM) to verify the server with, as libpq's sslrootcert.
    #[arg(long, env = "PGSSLROOTCERT")]
    pub db_ssl_root_cert: Option<PathBuf>,
    /// Client certificate (PEM), as libpq's sslcert.
    #[arg(long, env = "PGSSLCERT")]
    pub db_ssl_cert: Option<PathBuf>,
    /// Client certificate key (PEM), as libpq's sslkey.
    #[arg(long, env = "PGSSLKEY")]
    pub db_ssl_key: Option<PathBuf>,
    /// Bound on one connection attempt.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub db_connect_timeout: Duration,
}

impl DbArgs {
    /// The connection settings; an error if no URL was given.
    pub fn options(&self) -> anyhow::Result<DbOptions> {
        let url = self.database_url.clone().context("no database: give --database-url or set DATABASE_URL")?;
        let (url, mut tls) = split_tls_params(&url)?;
        let flags = TlsOptions {
            mode: self.db_ssl_mode,
            root_cert: self.db_ssl_root_cert.clone(),
            cert: self.db_ssl_cert.clone(),
            key: self.db_ssl_key.clone(),
        };
        tls.mode = flags.mode.or(tls.mode);
        tls.root_cert = flags.root_cert.or(tls.root_cert);
        tls.cert = flags.cert.or(tls.cert);
        tls.key = flags.key.or(tls.key);
        if tls.cert.is_some() != tls.key.is_some() {
            bail!("a client certificate needs its key and the other way round (sslcert with sslkey)");
        }
        Ok(DbOptions { url, tls, connect_timeout: self.db_connect_timeout })
    }
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
    let url = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    Ok((DatabaseUrl(url), tls))
}

/// `%XX` decoding of a URL query value (paths of certificate files).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
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

/// alert-sink's command line.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "alert-sink",
    version,
    about = "Notifications into PostgreSQL, effectively once: idempotent rows and the consumed offsets in one database transaction"
)]
pub struct SinkArgs {
    #[command(subcommand)]
    pub command: Option<SinkCommand>,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub db: DbArgs,
    /// Application id; the sink's group is <app>-sink unless --group says otherwise.
    #[arg(long, default_value = "price-alerts")]
    pub app_id: String,
    /// The sink's consumer group (default <app>-sink).
    #[arg(long)]
    pub group: Option<String>,
    /// Instance id, stable across restarts of this instance (group.instance.id = <group>-<instance>).
    #[arg(long, env = "INSTANCE_ID", default_value = "0")]
    pub instance_id: String,
    /// Dynamic group membership instead of static (group.instance.id).
    #[arg(long)]
    pub dynamic_membership: bool,
    /// The notifications topic.
    #[arg(long, default_value = "notifications")]
    pub topic: String,
    /// Write a batch when it holds this many records.
    #[arg(long, default_value_t = DEFAULT_MAX_BATCH)]
    pub max_batch: usize,
    /// Write a batch when it is this old, even if records keep arriving.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub commit_interval: Duration,
    /// Write a batch when no record arrived for this long.
    #[arg(long, default_value = "5ms", value_parser = humantime::parse_duration)]
    pub linger: Duration,
    /// Bound on writing one batch; past it the database counts as unavailable.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub write_timeout: Duration,
    /// First reconnection delay during an outage (doubling up to --reconnect-max).
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    pub reconnect_initial: Duration,
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub reconnect_max: Duration,
    /// Notifications larger than this many bytes are dead-lettered as oversize.
    #[arg(long, default_value_t = super::record::DEFAULT_MAX_RECORD_BYTES)]
    pub max_record_bytes: usize,
    /// Do not commit the stored offsets to the Kafka group (they are only for lag monitoring).
    #[arg(long)]
    pub no_kafka_commit: bool,
    /// How long a graceful shutdown may take before exiting non-zero.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,
    /// Stop once idle this long with nothing buffered (demos, benchmarks).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub exit_when_idle: Option<Duration>,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9899); alerts_sink_ready is 0
    /// while the sink is paused.
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// TEST ONLY: stop dead at in-db-txn:N or after-db-commit:N (the N-th batch).
    #[arg(long, hide = true)]
    pub test_hold: Option<String>,
    /// TEST ONLY: the file written when the hold is reached.
    #[arg(long, hide = true)]
    pub test_hold_file: Option<PathBuf>,
}

/// What alert-sink does besides sinking.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SinkCommand {
    /// Apply the database migrations and exit (the sink also applies them at start).
    Migrate,
}

impl SinkArgs {
    /// The consumer group.
    pub fn group_id(&self) -> String {
        self.group.clone().unwrap_or_else(|| format!("{}-sink", self.app_id))
    }

    /// Validates the arguments and builds the options.
    pub fn options(&self) -> anyhow::Result<SinkOptions> {
        let kafka = self.kafka.config()?;
        kafka.validate()?;
        if self.max_batch == 0 {
            bail!("--max-batch must be at least 1");
        }
        if self.reconnect_initial.is_zero() || self.reconnect_max < self.reconnect_initial {
            bail!("--reconnect-initial must be above 0 and at most --reconnect-max");
        }
        let test_hold = match (&self.test_hold, &self.test_hold_file) {
            (None, _) => None,
            (Some(_), None) => bail!("--test-hold needs --test-hold-file"),
            (Some(spec), Some(file)) => {
                let (at, n) = spec.split_once(':').context("--test-hold is AT:N")?;
                let at = match at {
                    "in-db-txn" => HoldAt::InDbTxn,
                    "after-db-commit" => HoldAt::AfterDbCommit,
                    other => bail!("--test-hold: unknown point {other:?}"),
                };
                Some(TestHold { at, batch: n.parse().context("--test-hold: N")?, file: file.clone() })
            }
        };
        let group_id = self.group_id();
        Ok(SinkOptions {
            kafka,
            db: self.db.options()?,
            topic: self.topic.clone(),
            group_instance_id: (!self.dynamic_membership).then(|| format!("{group_id}-{}", self.instance_id)),
            group_id,
            max_batch: self.max_batch,
            commit_interval: self.commit_interval,
            linger: self.linger,
            write_timeout: self.write_timeout,
            backoff: Backoff { initial: self.reconnect_initial, max: self.reconnect_max },
            max_record_bytes: self.max_record_bytes,
            commit_to_kafka: !self.no_kafka_commit,
            shutdown_timeout: self.shutdown_timeout,
            exit_when_idle: self.exit_when_idle,
            test_hold,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn url(s: &str) -> DatabaseUrl {
        s.parse().unwrap()
    }

    #[test]
    fn the_password_never_shows() {
        let u = url("postgres://sink:s3cr3t@db.example:5432/alerts?sslmode=require");
        assert_eq!(u.redacted(), "postgres://sink:***@db.example:5432/alerts?sslmode=require");
        assert!(!format!("{u:?}").contains("s3cr3t"));
        assert_eq!(url("postgres://sink@h/db").redacted(), "postgres://sink@h/db");
        let kv = url("host=h user=sink password=s3cr3t dbname=alerts");
        assert_eq!(kv.redacted(), "host=h user=sink password=*** dbname=alerts");
        assert!(!url("postgres://h/db?password=s3cr3t&x=1").redacted().contains("s3cr3t"));
        let args = SinkArgs::try_parse_from(["alert-sink", "--database-url", "postgres://u:s3cr3t@h/d"]).unwrap();
        assert!(!format!("{args:?}").contains("s3cr3t"), "Debug of the arguments masks it");
        assert!(!format!("{:?}", args.options().unwrap()).contains("s3cr3t"), "and of the options");
    }

    #[test]
    fn libpq_tls_parameters_leave_the_url_and_flags_win() {
        let (u, tls) = split_tls_params(&url(
            "postgres://u:p@h:5/d?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
        ))
        .unwrap();
        assert_eq!(u.expose(), "postgres://u:p@h:5/d?application_name=x");
        assert_eq!(tls.mode, Some(SslMode::VerifyFull));
        assert_eq!(tls.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        let args = SinkArgs::try_parse_from([
            "alert-sink",
            "--database-url",
            "postgres://u@h/d?sslmode=require&sslrootcert=/a.pem",
            "--db-ssl-root-cert",
            "/b.pem",
        ])
        .unwrap();
        let db = args.options().unwrap().db;
        assert_eq!((db.tls.mode, db.tls.root_cert), (Some(SslMode::Require), Some(PathBuf::from("/b.pem"))));
        assert!(split_tls_params(&url("postgres://h/d?sslmode=sometimes")).is_err());
    }

    #[test]
    fn defaults_and_refusals() {
        let o = SinkArgs::try_parse_from(["alert-sink", "--database-url", "postgres://h/d"]).unwrap().options().unwrap();
        assert_eq!(o.group_id, "price-alerts-sink");
        assert_eq!(o.group_instance_id.as_deref(), Some("price-alerts-sink-0"));
        assert_eq!((o.max_batch, o.commit_interval), (DEFAULT_MAX_BATCH, DEFAULT_COMMIT_INTERVAL));
        assert_eq!(o.linger, DEFAULT_LINGER);
        assert!(o.commit_to_kafka);
        let err = SinkArgs::try_parse_from(["alert-sink", "--max-batch", "0", "--database-url", "x"]).unwrap().options();
        assert!(err.is_err());
        let hold = SinkArgs::try_parse_from([
            "alert-sink",
            "--database-url",
            "x",
            "--test-hold",
            "after-db-commit:3",
            "--test-hold-file",
            "/tmp/f",
        ])
        .unwrap()
        .options()
        .unwrap()
        .test_hold;
        assert_eq!(hold.map(|h| (h.at, h.batch)), Some((HoldAt::AfterDbCommit, 3)));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = Backoff { initial: Duration::from_millis(200), max: Duration::from_secs(5) };
        assert_eq!(b.delay(1, 1.0), Duration::from_millis(200));
        assert_eq!(b.delay(3, 1.0), Duration::from_millis(800));
        assert_eq!(b.delay(30, 1.0), Duration::from_secs(5));
        assert_eq!(b.delay(2, 0.5), Duration::from_millis(200));
    }
}
