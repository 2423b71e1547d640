//! The command-line layer of the thin binaries in `src/bin/`: flags every binary shares, logging,
//! output, signals and the shutdown watchdog. It imports the library; nothing in the library
//! imports it.
//!
//! # Output never blocks and never panics
//! A process whose stderr or stdout reader went away (`alert-pipeline … 2>&1 | head -2`) must keep
//! running and must still stop within its shutdown bound. `println!`/`eprintln!` panic on a closed
//! stream, and tracing-subscriber reports a failed write with `eprintln!`, which panicked inside a
//! rebalance callback and left the consumer's close waiting for ever. So: log lines go through a
//! non-blocking, lossy writer whose write errors are swallowed (counted as dropped lines), and the
//! binaries print with [`outln!`](crate::outln) and [`errln!`](crate::errln), which ignore errors.

// The `///` comments on clap arguments are the --help texts, written for a terminal (<app>,
// [symbols]), not rustdoc markup.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

pub mod chaos;
pub mod deliver;
mod log;
pub mod membership;
pub mod pipeline;
pub mod replay;
pub mod rules;
pub mod sink;
pub mod subscriber;
pub mod tickgen;
pub mod txn_demo;
pub mod verify;

pub use log::{init_logging, LogGuard};
pub use membership::{Membership, MembershipArgs};
pub use pipeline::{GuaranteeArg, PipelineArgs};
// The value parsers of every duration flag; they live below, in a leaf that the stages use too.
pub use crate::duration::{duration, interval};

use crate::kafka::config::{KafkaConfig, DEFAULT_BOOTSTRAP};
use crate::kafka::connect::{self, ConnectError};
use crate::kafka::secrets;
use clap::Args;
use std::time::Duration;

/// `--bootstrap`, `-X key=value` and `--config`, as every binary takes them.
#[derive(Debug, Clone, Args)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BOOTSTRAP", default_value = DEFAULT_BOOTSTRAP)]
    pub bootstrap: String,
    /// A librdkafka property for every client, as key=value (repeatable), e.g.
    /// -X security.protocol=SASL_SSL. Properties the exactly-once guarantee rests on are refused,
    /// and so are secrets (a command line is visible to every local user): see --config.
    #[arg(short = 'X', value_name = "KEY=VALUE")]
    pub properties: Vec<String>,
    /// A TOML file whose [librdkafka] table is passed to every client (like -X; -X wins): the
    /// place for secrets and TLS paths. Holding a secret, it must be readable by its owner only
    /// (chmod 600). The SASL password may come from KAFKA_SASL_PASSWORD instead.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// How long a broker at --bootstrap has to answer at start before the process gives up,
    /// naming the address and the cause (refused, DNS, TLS, SASL).
    #[arg(long, default_value = "10s", value_parser = duration, env = "KAFKA_CONNECT_TIMEOUT")]
    pub connect_timeout: Duration,
}

impl KafkaArgs {
    /// The client configuration as given (-X, then the --config file, then KAFKA_SASL_PASSWORD,
    /// each filling in only what the ones before left unset), unchecked.
    pub fn config(&self) -> anyhow::Result<KafkaConfig> {
        use anyhow::Context as _;
        for pair in &self.properties {
            if let Some((k, _)) = pair.split_once('=') {
                secrets::refuse_on_command_line(k.trim())?;
            }
        }
        let mut kafka = KafkaConfig::new(&self.bootstrap).with_overrides(&self.properties)?;
        if let Some(path) = &self.config {
            for (k, v) in secrets::read_config_file(path)? {
                if !kafka.properties.contains_key(&k) {
                    kafka
                        .set(&k, &v)
                        .with_context(|| format!("config file {}", path.display()))?;
                }
            }
        }
        if let Ok(password) = std::env::var(secrets::PASSWORD_ENV) {
            if !kafka.properties.contains_key("sasl.password") {
                kafka.set("sasl.password", &password)?;
            }
        }
        Ok(kafka)
    }

    /// The client configuration, checked: every property accepted by librdkafka, and a broker at
    /// the bootstrap address answering within --connect-timeout.
    pub fn connect(&self) -> anyhow::Result<KafkaConfig> {
        let kafka = self.config()?;
        kafka.validate()?;
        self.check(&kafka)?;
        Ok(kafka)
    }

    /// The start-up connect check of `kafka` (built from these flags and maybe a config file).
    pub fn check(&self, kafka: &KafkaConfig) -> Result<(), ConnectError> {
        connect::check(kafka, self.connect_timeout)
    }

    /// [`KafkaArgs::check`] for a service that serves `/healthz` meanwhile: the check waits up to
    /// `--connect-timeout` on the broker, so it runs on a thread of its own
    /// ([`crate::kafka::blocking`]) and the runtime's workers go on answering.
    pub async fn check_async(&self, kafka: &KafkaConfig) -> anyhow::Result<()> {
        let (kafka, timeout) = (kafka.clone(), self.connect_timeout);
        crate::kafka::blocking::off_runtime("connect-check", move || {
            connect::check(&kafka, timeout)
        })
        .await??;
        Ok(())
    }
}

/// Like `println!`, but a closed or broken stdout is ignored instead of panicking.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stdout(), $($arg)*);
    }};
}

/// Like `eprintln!`, but a closed or broken stderr is ignored instead of panicking.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr(), $($arg)*);
    }};
}

/// A binary's `main`: logging, then `run`; an error is printed with its whole cause chain
/// ([`report`]) and exits 1 ([`exit_code_of`]: 75 when a transactional call stayed stuck).
pub fn main_of(
    name: &str,
    run: impl FnOnce() -> anyhow::Result<std::process::ExitCode>,
) -> std::process::ExitCode {
    let _log = init_logging();
    match run() {
        Ok(code) => code,
        Err(e) => {
            crate::errln!("{name}: {}", report(&e));
            exit_code_of(&e)
        }
    }
}

/// The one line an error is printed as when a binary stops on it: each message of its cause
/// chain, outermost first, separated by `: ` (as anyhow's `{:#}`), leaving out a cause whose text
/// the line already holds.
///
/// Why not `{:#}` itself: an error type may both return its cause from `source()` and write it in
/// its own message (thiserror's `#[error("cannot read {path}: {source}")]` does both), and `{:#}`
/// then prints the cause twice ("No such file or directory (os error 2): No such file or directory
/// (os error 2)"). Deciding it here, where errors are printed, covers every such type, the
/// dependencies' included, and leaves their `Display` whole for the logs that print one alone.
pub fn report(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// The exit status of a run that failed with `e`: [`crate::kafka::txn::EXIT_STUCK`] when a
/// transactional call stayed stuck and the producer could not be made again (a restart is
/// expected to mend it), 1 for anything else.
pub fn exit_code_of(e: &anyhow::Error) -> std::process::ExitCode {
    let stuck = e.chain().any(|c| {
        c.downcast_ref::<crate::kafka::txn::TxnError>()
            .is_some_and(crate::kafka::txn::TxnError::is_stuck)
    });
    if stuck {
        std::process::ExitCode::from(crate::kafka::txn::EXIT_STUCK)
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// Resolves on SIGINT or SIGTERM (or never, if the handlers cannot be installed, which is logged).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut int, mut term) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "cannot install signal handlers; stop with SIGKILL");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = int.recv() => tracing::info!("SIGINT received"),
        _ = term.recv() => tracing::info!("SIGTERM received"),
    }
}

/// How long [`end_runtime`] waits for the runtime's threads.
pub const RUNTIME_END_WAIT: Duration = Duration::from_secs(1);

/// Ends a stage's runtime before the process exits: its worker threads drop the tasks left (the
/// PostgreSQL connections' tasks, TLS streams over OpenSSL among them) and are waited for, at most
/// [`RUNTIME_END_WAIT`]. Without the wait, a task could still be inside OpenSSL while the exit
/// handlers clean it up. A thread that does not end in time (a blocking call that never returns)
/// is left behind: the shutdown bound is the promise.
pub fn end_runtime(runtime: tokio::runtime::Runtime) {
    runtime.shutdown_timeout(RUNTIME_END_WAIT);
}

/// Exit status of a process whose shutdown did not finish within its bound.
pub const EXIT_SHUTDOWN_TIMEOUT: i32 = 3;

/// The moment past a shutdown bound that the watchdog of [`shutdown_signal_bounded`] leaves for
/// logs to flush before it exits the process: a supervisor's grace period (Kubernetes'
/// `terminationGracePeriodSeconds`, compose's `stop_grace_period`) must exceed the bound plus
/// this, or it kills a clean shutdown (tests/deploy.rs checks the shipped ones).
pub const SHUTDOWN_MARGIN: Duration = Duration::from_millis(500);

/// Resolves on SIGINT or SIGTERM, and from then on guarantees that the process ends within
/// `bound` (plus [`SHUTDOWN_MARGIN`] to flush): a watchdog thread exits it with
/// [`EXIT_SHUTDOWN_TIMEOUT`] if the clean path is still running by then, whatever a client call is
/// waiting for. An open transaction left behind is aborted by the broker (at its timeout, or at
/// once when the instance restarts with the same transactional id).
pub async fn shutdown_signal_bounded(bound: Duration) {
    shutdown_signal().await;
    let spawned = std::thread::Builder::new().name("shutdown-watchdog".into()).spawn(move || {
        std::thread::sleep(bound + SHUTDOWN_MARGIN);
        tracing::error!(bound = ?bound, "shutdown did not finish within its bound; exiting");
        crate::errln!("shutdown did not finish within {bound:?}; exiting with status {EXIT_SHUTDOWN_TIMEOUT}");
        crate::exit::exit(EXIT_SHUTDOWN_TIMEOUT);
    });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the shutdown watchdog; the shutdown bound is not enforced");
    }
}

#[cfg(test)]
mod tests {
    use super::report;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read {path}: {source}")]
    struct Both {
        path: String,
        source: std::io::Error,
    }

    fn enoent() -> std::io::Error {
        std::io::Error::from_raw_os_error(2)
    }

    #[test]
    fn a_cause_shows_once_even_when_its_parent_writes_it_too() {
        let e = anyhow::Error::new(Both {
            path: "/x.toml".into(),
            source: enoent(),
        });
        assert_eq!(format!("{e:#}").matches("os error 2").count(), 2, "{e:#}");
        assert_eq!(
            report(&e),
            "cannot read /x.toml: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn every_distinct_cause_shows_in_order() {
        let e = anyhow::Error::new(enoent())
            .context("reading /x.toml")
            .context("loading the rules");
        assert_eq!(
            report(&e),
            "loading the rules: reading /x.toml: No such file or directory (os error 2)"
        );
        assert_eq!(report(&anyhow::anyhow!("plain")), "plain");
    }
}
