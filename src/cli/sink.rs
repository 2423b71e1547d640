//! alert-sink's command line (and the database flags alert-verify shares), mapped onto
//! [`SinkOptions`] and [`DbOptions`].

// The `///` comments on clap arguments are the --help texts, written for a terminal, not rustdoc.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use super::{duration, interval, KafkaArgs};
use crate::sink::options::{
    split_tls_params, Backoff, DatabaseUrl, DbOptions, HoldAt, SinkOptions, SslMode, TestHold,
    TlsOptions,
};
use anyhow::{bail, Context as _};
use std::path::PathBuf;
use std::time::Duration;

/// The database flags, shared by alert-sink and alert-verify.
#[derive(Debug, Clone, clap::Args)]
pub struct DbArgs {
    /// PostgreSQL connection string (postgres://user:password@host:port/db?sslmode=...).
    /// Never logged with its password. A command line is readable by every local user: where
    /// the URL holds a password, prefer --database-url-file.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<DatabaseUrl>,
    /// A file holding the connection string instead (a mounted secret, such as a Kubernetes
    /// Secret): read once at start, surrounding whitespace ignored. Holding a password, it must
    /// be readable by its owner only (chmod 600).
    #[arg(long, env = "DATABASE_URL_FILE", value_name = "FILE")]
    pub database_url_file: Option<PathBuf>,
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
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub db_connect_timeout: Duration,
}

impl DbArgs {
    /// The connection settings; an error if no URL was given.
    pub fn options(&self) -> anyhow::Result<DbOptions> {
        let url = match (&self.database_url, &self.database_url_file) {
            (Some(url), None) => url.clone(),
            (None, Some(path)) => read_url_file(path)?,
            // Refused here, not by clap: either may come from the environment, and which one
            // was meant cannot be told.
            (Some(_), Some(_)) => bail!(
                "two database URLs: give --database-url (DATABASE_URL) or --database-url-file \
                 (DATABASE_URL_FILE), not both"
            ),
            (None, None) => bail!(
                "no database: give --database-url or set DATABASE_URL (or --database-url-file, \
                 DATABASE_URL_FILE: a file holding it)"
            ),
        };
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
            bail!(
                "a client certificate needs its key and the other way round (sslcert with sslkey)"
            );
        }
        tls.check_files()?;
        Ok(DbOptions {
            url,
            tls,
            connect_timeout: self.db_connect_timeout,
        })
    }
}

/// The connection string in `path`: whitespace around it (a trailing newline) dropped, and a
/// file whose URL holds a password refused unless only its owner can read it, as a `--config`
/// file holding a Kafka secret is. Errors name the file, never its contents.
fn read_url_file(path: &std::path::Path) -> anyhow::Result<DatabaseUrl> {
    let what = || format!("database URL file {}", path.display());
    let text = std::fs::read_to_string(path).with_context(what)?;
    let url: DatabaseUrl = text.trim().parse().with_context(what)?;
    // Redaction changes the URL exactly when it holds a password.
    if url.redacted() != url.expose() {
        crate::kafka::secrets::check_owner_only(path, "database URL file", "a password")?;
    }
    Ok(url)
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
    /// Instance id, group membership (--instance-id, --static-membership, --dynamic-membership).
    #[command(flatten)]
    pub membership: super::MembershipArgs,
    /// The notifications topic.
    #[arg(long, default_value = "notifications")]
    pub topic: String,
    /// How long the database has to answer at start before the sink gives up, naming host:port
    /// and the cause (a wrong URL, say, instead of waiting for it as for an outage). 0s: wait for
    /// ever. Once it has answered, an outage pauses the sink instead, however long it lasts.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub db_start_timeout: Duration,
    /// Write a batch when it holds this many records.
    #[arg(long, default_value_t = crate::sink::options::DEFAULT_MAX_BATCH)]
    pub max_batch: usize,
    /// Write a batch when it is this old, even if records keep arriving.
    #[arg(long, default_value = "100ms", value_parser = interval)]
    pub commit_interval: Duration,
    /// Write a batch when no record arrived for this long.
    #[arg(long, default_value = "5ms", value_parser = duration)]
    pub linger: Duration,
    /// Bound on writing one batch; past it the database counts as unavailable.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub write_timeout: Duration,
    /// First reconnection delay during an outage (doubling up to --reconnect-max).
    #[arg(long, default_value = "200ms", value_parser = duration)]
    pub reconnect_initial: Duration,
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub reconnect_max: Duration,
    /// Notifications larger than this many bytes are dead-lettered as oversize.
    #[arg(long, default_value_t = crate::sink::record::DEFAULT_MAX_RECORD_BYTES)]
    pub max_record_bytes: usize,
    /// Do not commit the stored offsets to the Kafka group (they are only for lag monitoring).
    #[arg(long)]
    pub no_kafka_commit: bool,
    /// How long a graceful shutdown may take before exiting non-zero.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub shutdown_timeout: Duration,
    /// Stop once idle this long with nothing buffered (demos, benchmarks).
    #[arg(long, value_parser = duration)]
    pub exit_when_idle: Option<Duration>,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9899); alerts_sink_ready is 0
    /// while the sink is paused.
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// With --metrics-addr: how often the sink's stored offset, the end and the lag of every
    /// partition of --topic, owned by this instance or not, are read (alerts_group_*,
    /// alerts_partition_end_offset: a partition no sink instance consumes shows there).
    #[arg(long, default_value = "15s", value_parser = interval)]
    pub lag_watch_interval: Duration,
    /// TEST ONLY: stop dead at in-db-txn:N or after-db-commit:N (the N-th batch).
    #[arg(long, hide = true)]
    pub test_hold: Option<String>,
    /// TEST ONLY: the file written when the hold is reached.
    #[arg(long, hide = true)]
    pub test_hold_file: Option<PathBuf>,
    /// TEST ONLY: the watchdog exits the process after this long without progress, instead of
    /// after its bound (90 s with the default timeouts).
    #[arg(long, hide = true, value_parser = duration)]
    pub test_watchdog_bound: Option<Duration>,
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
        self.group
            .clone()
            .unwrap_or_else(|| format!("{}-sink", self.app_id))
    }

    /// Validates the arguments and builds the options.
    pub fn options(&self) -> anyhow::Result<SinkOptions> {
        // The group protocol first: a property it forbids is named before librdkafka sees any.
        let kafka = self.membership.kafka(self.kafka.config()?)?;
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
                Some(TestHold {
                    at,
                    batch: n.parse().context("--test-hold: N")?,
                    file: file.clone(),
                })
            }
        };
        let group_id = self.group_id();
        let membership = self.membership.resolve()?;
        Ok(SinkOptions {
            kafka,
            db: self.db.options()?,
            topic: self.topic.clone(),
            group_instance_id: membership
                .static_membership
                .then(|| format!("{group_id}-{}", membership.instance_id)),
            group_id,
            max_batch: self.max_batch,
            commit_interval: self.commit_interval,
            linger: self.linger,
            write_timeout: self.write_timeout,
            db_start_timeout: (!self.db_start_timeout.is_zero()).then_some(self.db_start_timeout),
            backoff: Backoff {
                initial: self.reconnect_initial,
                max: self.reconnect_max,
            },
            max_record_bytes: self.max_record_bytes,
            commit_to_kafka: !self.no_kafka_commit,
            shutdown_timeout: self.shutdown_timeout,
            exit_when_idle: self.exit_when_idle,
            test_hold,
            test_watchdog_bound: self.test_watchdog_bound,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::options::{
        DEFAULT_COMMIT_INTERVAL, DEFAULT_DB_START_TIMEOUT, DEFAULT_LINGER, DEFAULT_MAX_BATCH,
    };
    use clap::Parser;

    #[test]
    fn the_password_never_shows_in_the_arguments_or_the_options() {
        let args =
            SinkArgs::try_parse_from(["alert-sink", "--database-url", "postgres://u:s3cr3t@h/d"])
                .unwrap();
        assert!(
            !format!("{args:?}").contains("s3cr3t"),
            "Debug of the arguments masks it"
        );
        assert!(
            !format!("{:?}", args.options().unwrap()).contains("s3cr3t"),
            "and of the options"
        );
    }

    /// `text` in a file of its own with `mode`, in a fresh temporary directory.
    fn url_file(name: &str, text: &str, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!(
            "sink-url-{}-{name}",
            crate::kafka::topics::unique_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("database-url");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    /// The database options of `args` alone: a DATABASE_URL or DATABASE_URL_FILE of the test's
    /// environment (scripts/test.sh exports DATABASE_URL) does not count.
    fn options_of(args: &[&str]) -> anyhow::Result<DbOptions> {
        let mut db = SinkArgs::try_parse_from([&["alert-sink"], args].concat())
            .unwrap()
            .db;
        if !args.contains(&"--database-url") {
            db.database_url = None;
        }
        if !args.contains(&"--database-url-file") {
            db.database_url_file = None;
        }
        db.options()
    }

    #[test]
    fn the_url_may_come_from_an_owner_only_file_never_quoted() {
        let secret = url_file("closed", "postgres://u:s3cr3t@db:5432/alerts\n", 0o600);
        let path = secret.to_str().unwrap();
        let db = options_of(&["--database-url-file", path]).unwrap();
        assert_eq!(
            db.url.expose(),
            "postgres://u:s3cr3t@db:5432/alerts",
            "the newline a file ends with is not part of the URL"
        );

        // A password in a file others can read is refused, as a Kafka --config file is.
        let open = url_file("open", "postgres://u:s3cr3t@db/alerts", 0o640);
        let err = format!(
            "{:#}",
            options_of(&["--database-url-file", open.to_str().unwrap()]).unwrap_err()
        );
        assert!(
            err.contains("holds a password but is readable by others (mode 640): chmod 600"),
            "{err}"
        );
        assert!(!err.contains("s3cr3t"), "{err}");
        // Without a password (certificate or trust authentication) the mode does not matter.
        let plain = url_file("plain", "postgres://u@db/alerts", 0o644);
        options_of(&["--database-url-file", plain.to_str().unwrap()]).unwrap();

        // An empty file, a missing one, and both sources at once: refused, naming the file.
        let empty = url_file("empty", "\n", 0o600);
        let err = format!(
            "{:#}",
            options_of(&["--database-url-file", empty.to_str().unwrap()]).unwrap_err()
        );
        assert!(
            err.contains("database URL file") && err.contains("empty"),
            "{err}"
        );
        assert!(options_of(&["--database-url-file", "/nonexistent/url"]).is_err());
        let err = format!(
            "{:#}",
            options_of(&[
                "--database-url",
                "postgres://h/d",
                "--database-url-file",
                path
            ])
            .unwrap_err()
        );
        assert!(err.contains("not both"), "{err}");
        for f in [secret, open, plain, empty] {
            let _ = std::fs::remove_dir_all(f.parent().unwrap());
        }
    }

    /// The sink's watchdog counts it stuck after the other stages' 90 s with the default
    /// timeouts, and after its longest legitimate stretch without a beat (and a margin) with
    /// longer ones; `--test-watchdog-bound` is for tests.
    #[test]
    fn the_watchdog_bound_covers_the_longest_stretch_without_a_beat() {
        use crate::sink::run::watchdog_bound;
        let parse = |more: &[&str]| {
            SinkArgs::try_parse_from(
                [&["alert-sink", "--database-url", "postgres://h/d"], more].concat(),
            )
            .unwrap()
            .options()
            .unwrap()
        };
        let default = parse(&[]);
        assert_eq!(watchdog_bound(&default), Duration::from_secs(90));
        assert_eq!(
            watchdog_bound(&default),
            crate::kafka::txn::stuck_bound(crate::kafka::config::DEFAULT_TRANSACTION_TIMEOUT)
        );
        assert_eq!(default.test_watchdog_bound, None);
        // 5 s + 1 s to connect, five writes or reads of 30 s, 10 s of margin.
        let slow = parse(&["--write-timeout", "30s"]);
        assert_eq!(watchdog_bound(&slow), Duration::from_secs(166));
        let test = parse(&["--test-watchdog-bound", "5s"]);
        assert_eq!(test.test_watchdog_bound, Some(Duration::from_secs(5)));
    }

    #[test]
    fn tls_flags_win_over_the_url() {
        // Files that exist: the options refuse a certificate path that cannot be read.
        let (a, b) = (
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"),
        );
        let args = SinkArgs::try_parse_from([
            "alert-sink",
            "--database-url",
            &format!("postgres://u@h/d?sslmode=require&sslrootcert={a}"),
            "--db-ssl-root-cert",
            b,
        ])
        .unwrap();
        let db = args.options().unwrap().db;
        assert_eq!(
            (db.tls.mode, db.tls.root_cert),
            (Some(SslMode::Require), Some(PathBuf::from(b)))
        );
    }

    #[test]
    fn defaults_and_refusals() {
        let o = SinkArgs::try_parse_from(["alert-sink", "--database-url", "postgres://h/d"])
            .unwrap()
            .options()
            .unwrap();
        assert_eq!(o.group_id, "price-alerts-sink");
        assert_eq!(o.group_instance_id, None, "dynamic membership by default");
        let o = SinkArgs::try_parse_from([
            "alert-sink",
            "--database-url",
            "postgres://h/d",
            "--static-membership",
            "--instance-id",
            "0",
        ])
        .unwrap()
        .options()
        .unwrap();
        assert_eq!(o.group_instance_id.as_deref(), Some("price-alerts-sink-0"));
        assert_eq!(
            (o.max_batch, o.commit_interval),
            (DEFAULT_MAX_BATCH, DEFAULT_COMMIT_INTERVAL)
        );
        assert_eq!(o.linger, DEFAULT_LINGER);
        assert_eq!(o.db_start_timeout, Some(DEFAULT_DB_START_TIMEOUT));
        let forever = SinkArgs::try_parse_from([
            "alert-sink",
            "--database-url",
            "postgres://h/d",
            "--db-start-timeout",
            "0s",
        ])
        .unwrap()
        .options()
        .unwrap();
        assert_eq!(forever.db_start_timeout, None, "0 waits for ever");
        assert!(o.commit_to_kafka);
        let err =
            SinkArgs::try_parse_from(["alert-sink", "--max-batch", "0", "--database-url", "x"])
                .unwrap()
                .options();
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
        assert_eq!(
            hold.map(|h| (h.at, h.batch)),
            Some((HoldAt::AfterDbCommit, 3))
        );
    }
}
