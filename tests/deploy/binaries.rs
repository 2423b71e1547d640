//! The binaries of `src/bin` as the deployment files run them: where each is deployed, and what
//! its own clap struct makes of the arguments a file gives it. Parsing is the binary's: a flag
//! that does not exist, a duration without a unit or a missing required argument is the error
//! the binary would print, without starting anything.
//!
//! Parsing reads the test process's environment too, as the binary reads its own (clap's `env`
//! fallbacks: `KAFKA_BOOTSTRAP`, `DATABASE_URL`, ...), so the checks look at what the arguments
//! set, and at the environment a file gives by its names.

use clap::{CommandFactory, Parser};
use price_alerts::cli::deliver::DeliverArgs;
use price_alerts::cli::rules::{RulesArgs, RulesCommand};
use price_alerts::cli::sink::SinkArgs;
use price_alerts::cli::subscriber::SubscriberArgs;
use price_alerts::cli::tickgen::TickGenArgs;
use price_alerts::cli::PipelineArgs;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Where a binary of `src/bin` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A stage that runs for good: a workload in deploy/k8s and a service in docker-compose.yml.
    Service,
    /// In docker-compose.yml only: the demo's helpers and the tool people run beside it there.
    Compose,
    /// Nowhere: run by hand or by the tests.
    Manual,
}

/// Every binary of `src/bin` with its role and why: a new binary fails the tests until it is
/// placed here, so a new stage cannot ship without its manifests.
pub const ROLES: &[(&str, Role, &str)] = &[
    ("alert-pipeline", Role::Service, "the processor"),
    (
        "alert-sink",
        Role::Service,
        "the notifications into PostgreSQL",
    ),
    (
        "alert-deliver",
        Role::Service,
        "the notifications to the webhooks",
    ),
    (
        "alert-rules",
        Role::Compose,
        "the live alerts' command line, run on demand",
    ),
    (
        "tick-gen",
        Role::Compose,
        "the demo's tick stream (profile tick-gen)",
    ),
    (
        "test-subscriber",
        Role::Compose,
        "the demo's webhook receiver",
    ),
    (
        "dlq-replay",
        Role::Manual,
        "an operator's tool, run when dead letters are replayed",
    ),
    ("alert-verify", Role::Manual, "the oracle of a run"),
    ("txn-demo", Role::Manual, "the commit/abort experiment"),
    (
        "alert-chaos",
        Role::Manual,
        "the chaos runner, on the cluster of scripts/kafka.sh",
    ),
];

/// Programs of the image that are not binaries of `src/bin`, and the one use each has.
pub const HELPERS: &[(&str, &str)] = &[
    (
        "install",
        "the init containers' copy of a Secret's files, mode 600",
    ),
    (
        "sh",
        "the compose project's secrets, made by deploy/compose/secrets.sh",
    ),
];

/// The role of `binary`, if it is one of `src/bin`'s.
pub fn role(binary: &str) -> Option<Role> {
    ROLES
        .iter()
        .find(|(b, _, _)| *b == binary)
        .map(|(_, r, _)| *r)
}

/// What a stage's flags say about running it.
#[derive(Debug, Clone)]
pub struct Stage {
    /// `--metrics-addr`: /metrics, /healthz, /readyz.
    pub metrics_addr: Option<SocketAddr>,
    /// `--shutdown-timeout`: a clean stop takes at most this (and the watchdog's margin).
    pub shutdown_timeout: Duration,
    /// `--static-membership`.
    pub static_membership: bool,
    /// `--input` (the pipeline): the topic tick-gen must write.
    pub input: Option<String>,
    /// `--partitions` (the pipeline): the input's partition count when it creates it.
    pub partitions: Option<i32>,
}

/// A binary's arguments as its clap struct parsed them.
pub struct Parsed {
    /// The stage's settings; `None` for a tool or helper.
    pub stage: Option<Stage>,
    /// Files it reads that may hold a secret, by flag: `--config` (the Kafka client's
    /// [librdkafka] table), `--database-url-file`, `--subscriptions` (webhook URLs may carry
    /// tokens).
    pub secret_files: Vec<(&'static str, PathBuf)>,
    /// The subscriptions file alert-deliver reads.
    pub subscriptions: Option<PathBuf>,
    /// test-subscriber: where it listens and the subscribers it serves.
    pub listen: Option<SocketAddr>,
    pub subscribers: Vec<String>,
    /// tick-gen: its topic, the partitions it creates it with, its symbols and seed, and where
    /// it writes its rules (`--rules-out`, with `--rules-only` when it sends nothing).
    pub topic: Option<String>,
    pub partitions: Option<i32>,
    pub generated: Option<(usize, u64)>,
    pub rules_out: Option<PathBuf>,
    pub rules_only: bool,
    /// alert-rules: the file `load` reads.
    pub loads: Option<PathBuf>,
}

impl Parsed {
    fn new(stage: Option<Stage>) -> Self {
        Parsed {
            stage,
            secret_files: Vec::new(),
            subscriptions: None,
            listen: None,
            subscribers: Vec::new(),
            topic: None,
            partitions: None,
            generated: None,
            rules_out: None,
            rules_only: false,
            loads: None,
        }
    }
}

/// `args` (without the program name) parsed by `binary`'s own clap struct.
pub fn parse(binary: &str, args: &[String]) -> Result<Parsed, String> {
    let argv = std::iter::once(binary.to_owned()).chain(args.iter().cloned());
    let err = |e: clap::Error| format!("{binary} {args:?}: {}", e.render());
    let config = |c: &Option<PathBuf>| c.clone().map(|p| ("--config", p));
    Ok(match binary {
        "alert-pipeline" => {
            let a = PipelineArgs::try_parse_from(argv).map_err(err)?;
            let mut p = Parsed::new(Some(Stage {
                metrics_addr: a.metrics_addr,
                shutdown_timeout: a.shutdown_timeout,
                static_membership: a.membership.static_membership,
                input: Some(a.input.clone()),
                partitions: Some(a.partitions),
            }));
            p.secret_files.extend(config(&a.kafka.config));
            p
        }
        "alert-sink" => {
            let a = SinkArgs::try_parse_from(argv).map_err(err)?;
            let mut p = Parsed::new(Some(Stage {
                metrics_addr: a.metrics_addr,
                shutdown_timeout: a.shutdown_timeout,
                static_membership: a.membership.static_membership,
                input: None,
                partitions: None,
            }));
            p.secret_files.extend(config(&a.kafka.config));
            p.secret_files.extend(
                a.db.database_url_file
                    .clone()
                    .map(|f| ("--database-url-file", f)),
            );
            p
        }
        "alert-deliver" => {
            let a = DeliverArgs::try_parse_from(argv).map_err(err)?;
            let mut p = Parsed::new(Some(Stage {
                metrics_addr: a.metrics_addr,
                shutdown_timeout: a.shutdown_timeout,
                static_membership: a.membership.static_membership,
                input: None,
                partitions: None,
            }));
            p.secret_files.extend(config(&a.kafka.config));
            p.secret_files
                .push(("--subscriptions", a.subscriptions.clone()));
            p.subscriptions = Some(a.subscriptions);
            p
        }
        "alert-rules" => {
            let a = RulesArgs::try_parse_from(argv).map_err(err)?;
            let mut p = Parsed::new(None);
            p.secret_files.extend(config(&a.kafka.config));
            if let RulesCommand::Load { file, .. } = a.command {
                p.loads = Some(file);
            }
            p
        }
        "tick-gen" => {
            let a = TickGenArgs::try_parse_from(argv).map_err(err)?;
            let mut p = Parsed::new(None);
            p.secret_files.extend(config(&a.kafka.config));
            p.topic = Some(a.topic);
            p.partitions = Some(a.partitions);
            p.generated = Some((a.symbols, a.seed));
            p.rules_out = a.rules_out;
            p.rules_only = a.rules_only;
            p
        }
        "test-subscriber" => {
            let a = SubscriberArgs::try_parse_from(argv).map_err(err)?;
            let mut p = Parsed::new(None);
            p.listen = Some(a.listen);
            p.subscribers = a.subscribers.into_iter().map(|s| s.name).collect();
            p
        }
        other => {
            return Err(format!(
                "{other}: no deployment file runs it (tests/deploy/binaries.rs)"
            ))
        }
    })
}

/// The clap command of `binary`, for its flags' metadata.
fn command(binary: &str) -> clap::Command {
    match binary {
        "alert-pipeline" => PipelineArgs::command(),
        "alert-sink" => SinkArgs::command(),
        "alert-deliver" => DeliverArgs::command(),
        "alert-rules" => RulesArgs::command(),
        "tick-gen" => TickGenArgs::command(),
        "test-subscriber" => SubscriberArgs::command(),
        other => panic!("{other}: no deployment file runs it"),
    }
}

/// Every argument of `cmd` and of its subcommands.
fn arguments(cmd: &clap::Command) -> Vec<clap::Arg> {
    let mut all: Vec<clap::Arg> = cmd.get_arguments().cloned().collect();
    for sub in cmd.get_subcommands() {
        all.extend(arguments(sub));
    }
    all
}

/// The environment variables `binary` reads: its flags' (clap's `env`), the log filter and
/// colour switch every binary reads, and the SASL password of `src/kafka/secrets.rs`. A variable a
/// file sets that is not here is one the binary never sees, most likely a typo.
pub fn env_names(binary: &str) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = arguments(&command(binary))
        .iter()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect();
    names.extend(["RUST_LOG", "NO_COLOR"].map(String::from));
    names.insert(price_alerts::kafka::secrets::PASSWORD_ENV.to_owned());
    names
}

/// The variables that carry a secret's value: the flags that hide their environment value
/// (`DATABASE_URL`), and the SASL password. A deployment file must never set one.
pub fn secret_env_names() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = ROLES
        .iter()
        .filter(|(_, role, _)| *role != Role::Manual)
        .flat_map(|(b, _, _)| arguments(&command(b)))
        .filter(|a| a.is_hide_env_values_set())
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect();
    names.insert(price_alerts::kafka::secrets::PASSWORD_ENV.to_owned());
    names
}

/// The long flags of every deployed binary whose value is itself a secret (those hiding their
/// environment value: `--database-url`): never on a command line.
pub fn secret_flags() -> BTreeSet<String> {
    ROLES
        .iter()
        .filter(|(_, role, _)| *role != Role::Manual)
        .flat_map(|(b, _, _)| arguments(&command(b)))
        .filter(|a| a.is_hide_env_values_set())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect()
}

/// Why `args` would put a secret on the command line, if they would: a secret flag, or a
/// librdkafka property that `src/kafka/secrets.rs` takes for secret material (the binary refuses
/// it at start too, but only once it runs).
pub fn secret_in_args(args: &[String]) -> Option<String> {
    let flags = secret_flags();
    let mut previous = "";
    for a in args {
        let flag = a.split('=').next().unwrap_or_default();
        if flags.contains(flag) {
            return Some(format!("{flag} holds a secret"));
        }
        let property = a
            .strip_prefix("-X")
            .map(str::trim_start)
            .filter(|p| !p.is_empty())
            .or((previous == "-X").then_some(a.as_str()));
        if let Some(property) = property {
            let key = property.split('=').next().unwrap_or_default().trim();
            if price_alerts::kafka::secrets::is_secret(key) {
                return Some(format!("-X {key} is secret material"));
            }
        }
        previous = a;
    }
    None
}
