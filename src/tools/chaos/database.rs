//! PostgreSQL in an all-stage chaos run: a fresh database for the run's `alerts` table on the
//! server of `scripts/postgres.sh`, the server's immediate shutdowns (the fault), and what the
//! checks read back (the stored ids and the sink's stored offsets).
//!
//! ```text
//!   start: CREATE DATABASE chaos_<seed>_<suffix> ─► alert-sink migrate
//!   fault (a thread, one at a time): postgres.sh down --immediate ─► down a few seconds ─► up
//!   end:   SELECT id FROM alerts; SELECT … FROM sink_offsets ─► (passing run) DROP DATABASE
//! ```
//!
//! `down --immediate` is `pg_ctl -m immediate`: every connection is cut and the server stops
//! without a checkpoint, so the restart runs crash recovery, as after a power cut. The server
//! keeps its port across a restart (scripts/postgres.sh reuses it), so the sinks' URL stays valid.
//! [`ServerGuard`] starts the server again when the run ends on any path, so a failed run never
//! leaves it down.

use crate::sink::db;
use crate::sink::options::{DatabaseUrl, DbOptions, TlsOptions};
use anyhow::{bail, Context as _};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Bound on one connection attempt of the runner (a loaded machine's SCRAM exchange is slow).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The server and the run's database on it.
#[derive(Debug, Clone)]
pub struct Database {
    /// scripts/postgres.sh, which stops and starts the server.
    pub postgres_sh: PathBuf,
    /// The script's state folder (`PG_STATE`): a server of its own, or `None`, the checkout's.
    pub postgres_state: Option<PathBuf>,
    /// The server's URL (any database: the run's is created beside it).
    pub admin_url: String,
    /// The run's database.
    pub name: String,
}

/// scripts/postgres.sh as a command, on the server of `state` (`PG_STATE`) when given.
pub fn postgres_command(postgres_sh: &Path, state: Option<&Path>) -> Command {
    let mut cmd = Command::new(postgres_sh);
    if let Some(state) = state {
        cmd.env("PG_STATE", state);
    }
    cmd
}

/// One immediate shutdown, as it happened.
#[derive(Debug, Clone)]
pub struct DatabaseDown {
    pub down: Duration,
    /// From the start command to accepting connections again.
    pub recovered: Duration,
}

impl Database {
    /// The URL of the run's database.
    pub fn url(&self) -> String {
        with_database(&self.admin_url, &self.name)
    }

    /// Connection settings for the run's database, or (`admin`) for the server's own (the URL
    /// as given).
    pub fn options(&self, admin: bool) -> anyhow::Result<DbOptions> {
        let url = if admin {
            self.admin_url.clone()
        } else {
            self.url()
        };
        Ok(DbOptions {
            url: url.parse::<DatabaseUrl>()?,
            tls: TlsOptions::default(),
            connect_timeout: CONNECT_TIMEOUT,
        })
    }

    /// Runs `sql` on the admin database.
    fn admin(&self, sql: &str) -> anyhow::Result<()> {
        let opts = self.options(true)?;
        runtime()?.block_on(async {
            let c = db::connect(&opts)
                .await
                .with_context(|| format!("connecting to {}", db::describe(&opts)))?;
            c.batch_execute(sql)
                .await
                .with_context(|| format!("running {sql}"))
        })
    }

    /// Creates the run's database.
    pub fn create(&self) -> anyhow::Result<()> {
        self.admin(&format!("CREATE DATABASE {}", self.name))
    }

    /// Drops the run's database (after a passing run).
    pub fn drop_database(&self) -> anyhow::Result<()> {
        self.admin(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ))
    }

    /// Runs scripts/postgres.sh with `args`; returns what it logged (stderr).
    fn script(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = postgres_command(&self.postgres_sh, self.postgres_state.as_deref())
            .args(args)
            .output()
            .with_context(|| format!("running {}", self.postgres_sh.display()))?;
        let said = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        if !out.status.success() {
            bail!(
                "{} {}: {}: {said}",
                self.postgres_sh.display(),
                args.join(" "),
                out.status
            );
        }
        Ok(said)
    }

    /// Starts the server (a no-op when it accepts connections already).
    pub fn up(&self) -> anyhow::Result<()> {
        self.script(&["up"]).map(drop)
    }

    /// The fault: an immediate shutdown, `down` long, then a start (which returns once the server
    /// accepts connections).
    pub fn bounce(&self, down: Duration) -> anyhow::Result<DatabaseDown> {
        info!(
            down_ms = down.as_millis() as u64,
            "PostgreSQL: immediate shutdown"
        );
        match self.script(&["down", "--immediate"]) {
            // A server the script did not start (a DATABASE_URL of elsewhere) is not stopped:
            // the fault would silently not happen.
            Ok(said) if said.contains("no cluster started by this script") => {
                bail!(
                    "PostgreSQL is not the server of {}: {said}",
                    self.postgres_sh.display()
                )
            }
            Ok(_) => {}
            Err(e) => {
                // Whatever state the stop left, the server must be up when the fault is over.
                let _ = self.up();
                return Err(e);
            }
        }
        // How long the server stays down is the fault itself, not a wait for a condition.
        std::thread::sleep(down);
        let restarted = Instant::now();
        self.up()?;
        Ok(DatabaseDown {
            down,
            recovered: restarted.elapsed(),
        })
    }

    /// Every id in `alerts`, each with its number of rows.
    pub fn stored_ids(&self) -> anyhow::Result<HashMap<String, u64>> {
        let opts = self.options(false)?;
        runtime()?.block_on(crate::sink::check::stored_ids(&opts))
    }

    /// The offsets the sinks of `group` stored with their rows (the next offset per partition).
    pub fn stored_offsets(&self, group: &str, topic: &str) -> anyhow::Result<BTreeMap<i32, i64>> {
        let opts = self.options(false)?;
        runtime()?.block_on(async {
            let c = db::connect(&opts)
                .await
                .with_context(|| format!("connecting to {}", db::describe(&opts)))?;
            let rows = c
                .query(
                    "SELECT kafka_partition, next_offset FROM sink_offsets \
                     WHERE consumer_group = $1 AND topic = $2",
                    &[&group, &topic],
                )
                .await
                .context("reading sink_offsets")?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("a runtime for the database")
}

/// Starts the server when dropped: a run that fails between a shutdown and its start must not
/// leave the server down for everyone else.
pub struct ServerGuard(pub Database);

impl Drop for ServerGuard {
    fn drop(&mut self) {
        if let Err(e) = self.0.up() {
            warn!(error = format!("{e:#}"), "could not start PostgreSQL again");
        }
    }
}

/// `url` with its database replaced by `name` (the query, TLS settings say, kept).
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let has_path = base
        .split_once("://")
        .is_some_and(|(_, rest)| rest.contains('/'));
    let base = if has_path {
        base.rsplit_once('/').map_or(base, |(b, _)| b)
    } else {
        base
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_of_a_url_is_replaced_and_its_query_kept() {
        assert_eq!(
            with_database(
                "postgres://u:p@127.0.0.1:5433/postgres?sslmode=require",
                "run"
            ),
            "postgres://u:p@127.0.0.1:5433/run?sslmode=require"
        );
        assert_eq!(
            with_database("postgres://u@h:5432", "run"),
            "postgres://u@h:5432/run"
        );
    }
}
