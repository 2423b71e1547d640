//! The processor's command line: `alert-pipeline`'s flags, the config file, and their mapping onto
//! [`PipelineOptions`].

// The `///` comments on clap arguments are the --help texts, written for a terminal (<app>,
// [symbols]), not rustdoc markup.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use super::KafkaArgs;
use crate::pipeline::{Guarantee, PipelineOptions, TestHooks};

/// The processor's command line.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "alert-pipeline",
    version,
    about = "Exactly-once price alerts: Kafka to Kafka in one transaction per batch"
)]
pub struct PipelineArgs {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Alert rules read at start (TOML: [symbols] SYMBOL = ["threshold", ...]); or --live-rules.
    #[arg(long, env = "ALERT_RULES", required_unless_present_any = ["live_rules", "rules_topic"], conflicts_with_all = ["live_rules", "rules_topic"])]
    pub rules: Option<std::path::PathBuf>,
    /// Live alerts: join the ticks with the rules topic (<app-id>-rules), whose alerts `alert-rules`
    /// puts and deletes while the pipeline runs (docs/design.md, "Live alerts").
    #[arg(long, env = "LIVE_RULES", value_parser = clap::builder::BoolishValueParser::new())]
    pub live_rules: bool,
    /// The rules topic of --live-rules (default <app-id>-rules); implies --live-rules.
    #[arg(long, env = "RULES_TOPIC")]
    pub rules_topic: Option<String>,
    /// Application id: consumer group, transactional-id prefix, changelog name (<app>-state).
    #[arg(long, default_value = "price-alerts")]
    pub app_id: String,
    /// Instance id, group membership (--instance-id, --static-membership, --dynamic-membership).
    #[command(flatten)]
    pub membership: super::MembershipArgs,
    /// Input topic.
    #[arg(long, default_value = "market-updates")]
    pub input: String,
    /// Output topic.
    #[arg(long, default_value = "notifications")]
    pub output: String,
    /// Dead-letter topic (default: <input>.dlq).
    #[arg(long)]
    pub dlq: Option<String>,
    /// retention.ms of the dead-letter topic when it is created (dead letters hold raw payloads:
    /// keep them long enough to replay, not for ever). An existing topic is left as it is.
    #[arg(long, default_value = "14d", value_parser = super::duration)]
    pub dlq_retention: std::time::Duration,
    /// With --metrics-addr: how often the DLQ backlog gauges (unhandled dead letters, oldest
    /// age) are refreshed from the DLQ and its replay ledger.
    #[arg(long, default_value = "15s", value_parser = super::duration)]
    pub dlq_watch_interval: std::time::Duration,
    /// With --metrics-addr: how often the group's committed offset, the end and the lag of every
    /// input partition, owned by this instance or not, are read from the broker (the gauges
    /// alerts_group_*, alerts_partition_end_offset: a partition nobody consumes shows there).
    #[arg(long, default_value = "15s", value_parser = super::interval)]
    pub lag_watch_interval: std::time::Duration,
    /// Commit the open transaction when it is this old, counted from the arrival of its oldest
    /// record (so a record that waited behind the previous commit does not wait a whole interval
    /// more), but never from before the previous commit began or from more than half an interval
    /// before the transaction opened.
    #[arg(long, default_value = "100ms", value_parser = super::interval)]
    pub commit_interval: std::time::Duration,
    /// Commit the open transaction when it holds this many input records.
    #[arg(long, default_value_t = crate::pipeline::DEFAULT_MAX_BATCH)]
    pub max_batch: u64,
    /// Producer transaction.timeout.ms.
    #[arg(long, default_value = "10s", value_parser = super::duration)]
    pub transaction_timeout: std::time::Duration,
    /// Transactional producers taken in turn, one transaction each (1 or 2). With 2, a batch
    /// does not wait for the previous commit's markers before its records can leave; the
    /// second one's transactional id is <app>-<instance>#2. Going from 2 to 1 after a crash,
    /// the restart waits up to the transaction timeout for what the second one left open.
    #[arg(long, env = "TXN_PRODUCERS", default_value_t = crate::pipeline::settings::DEFAULT_TXN_PRODUCERS as u8, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub txn_producers: u8,
    /// Commit a batch on a thread of its own while the next one fills on the other producer
    /// (exactly-once with --txn-producers 2). A record of the next batch leaves only once every
    /// record of the committing one is in the log; an abort or a stall of either rewinds both.
    #[arg(long, env = "OVERLAP_COMMITS", value_parser = clap::builder::BoolishValueParser::new())]
    pub overlap_commits: bool,
    /// How long a graceful shutdown may take before exiting non-zero.
    #[arg(long, default_value = "30s", value_parser = super::duration)]
    pub shutdown_timeout: std::time::Duration,
    /// Ticks larger than this many bytes are dead-lettered as oversize.
    #[arg(long, default_value_t = crate::tick::DEFAULT_MAX_TICK_BYTES)]
    pub max_tick_bytes: usize,
    /// Partitions of the input topic when it has to be created.
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Stop once assigned, restored and idle (nothing to read) this long (demos, benchmarks).
    #[arg(long, value_parser = super::duration)]
    pub exit_when_idle: Option<std::time::Duration>,
    /// Delivery guarantee; at-least-once exists to compare against (it repeats outputs after a
    /// crash between produce and commit).
    #[arg(long, value_enum, default_value = "exactly-once")]
    pub guarantee: GuaranteeArg,
    /// Attempts per tick (the first included) before a failing tick is dead-lettered as poison.
    #[arg(long, default_value_t = 4)]
    pub max_attempts: u32,
    /// Largest total backoff per tick before it is dead-lettered as transient.exhausted; keep it
    /// far below max.poll.interval.ms and the transaction timeout.
    #[arg(long, default_value = "500ms", value_parser = super::duration)]
    pub retry_budget: std::time::Duration,
    /// Deterministic fault injection: seq % 25 == 0 always fails (poison), seq % 7 == 0 fails its
    /// first two attempts (flaky).
    #[arg(long)]
    pub inject_faults: bool,
    /// Serve /metrics (Prometheus), /healthz (liveness) and /readyz (readiness) on this address
    /// (e.g. 0.0.0.0:9898).
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Print the final summary as JSON instead of aligned text.
    #[arg(long)]
    pub json: bool,
    /// TEST ONLY: abort every n-th transaction instead of committing it.
    #[arg(long, hide = true)]
    pub test_abort_every: Option<u64>,
    /// TEST ONLY: crash (abort the process) at the n-th commit, after its outputs are in the log.
    #[arg(long, hide = true)]
    pub test_crash_before_commit: Option<u64>,
    /// TEST ONLY (--overlap-commits): the n-th commit fails, abortably, once the next batch
    /// has begun on the other producer.
    #[arg(long, hide = true)]
    pub test_fail_commit_in_flight: Option<u64>,
    /// TEST ONLY: hang once a shutdown is requested, as a client call stuck for ever would.
    #[arg(long, hide = true)]
    pub test_stall_on_shutdown: bool,
    /// TEST ONLY: crash (abort the process) right after the first revoke of input partitions,
    /// before the consumer rejoins the group.
    #[arg(long, hide = true)]
    pub test_abort_after_revoke: bool,
    /// TEST ONLY: while this file exists, hold right before each send_offsets_to_transaction
    /// (writing <FILE>.held with the pid) until it is removed.
    #[arg(long, hide = true)]
    pub test_hold_send_offsets: Option<std::path::PathBuf>,
    /// TEST ONLY: every abort of an open transaction fails fatally, leaving it open on the broker.
    #[arg(long, hide = true)]
    pub test_aborts_fail_fatally: bool,
    /// TEST ONLY: the watchdog exits the process after this long without progress, instead of
    /// after the transaction timeout + 80 s.
    #[arg(long, hide = true, value_parser = super::duration)]
    pub test_watchdog_bound: Option<std::time::Duration>,
    /// TEST ONLY (--live-rules): while this file exists, the rules topic is not read by the loop,
    /// so a held partition stays held; the held partitions are written to <FILE>.held.
    #[arg(long, hide = true)]
    pub test_freeze_rules: Option<std::path::PathBuf>,
}

/// `--guarantee`, mapped onto [`Guarantee`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GuaranteeArg {
    /// Outputs, state and offsets in one transaction.
    ExactlyOnce,
    /// No transaction: outputs acknowledged, then offsets committed; a crash in between repeats
    /// the batch's outputs.
    AtLeastOnce,
}

impl From<GuaranteeArg> for Guarantee {
    fn from(g: GuaranteeArg) -> Self {
        match g {
            GuaranteeArg::ExactlyOnce => Guarantee::ExactlyOnce,
            GuaranteeArg::AtLeastOnce => Guarantee::AtLeastOnce,
        }
    }
}

impl PipelineArgs {
    /// Validates the arguments, reads the rules and config files, and builds the options.
    pub fn options(&self) -> anyhow::Result<PipelineOptions> {
        // The group protocol first: a property it forbids is named before librdkafka sees any.
        let kafka = self.membership.kafka(self.kafka.config()?)?;
        kafka.validate()?;
        let rules = match &self.rules {
            Some(path) => {
                let rules = crate::rules::Rules::load(path)?;
                if rules.is_empty() {
                    anyhow::bail!("{}: no symbols: nothing would ever alert", path.display());
                }
                rules
            }
            None => crate::rules::Rules::default(),
        };
        let rules_topic = match (&self.rules_topic, self.live_rules) {
            (Some(t), _) => Some(t.clone()),
            (None, true) => Some(crate::rules::live::rules_topic(&self.app_id)),
            (None, false) => None,
        };
        if self.max_attempts == 0 {
            anyhow::bail!("--max-attempts must be at least 1");
        }
        if self.retry_budget * 4 > self.transaction_timeout {
            anyhow::bail!(
                "--retry-budget must stay well below --transaction-timeout (at most a quarter)"
            );
        }
        if self.max_batch == 0 {
            anyhow::bail!("--max-batch must be at least 1");
        }
        if self.overlap_commits
            && (self.txn_producers != 2 || self.guarantee != GuaranteeArg::ExactlyOnce)
        {
            anyhow::bail!(
                "--overlap-commits needs --guarantee exactly-once and --txn-producers 2: a batch commits on one producer while the next fills on the other"
            );
        }
        if self.commit_interval >= self.transaction_timeout {
            anyhow::bail!("--commit-interval must be well below --transaction-timeout");
        }
        let mut topics = crate::kafka::topics::Topics::with(
            self.input.clone(),
            self.output.clone(),
            &self.app_id,
        );
        if let Some(dlq) = &self.dlq {
            topics.dlq = dlq.clone();
        }
        if self.dlq_retention.is_zero() {
            anyhow::bail!("--dlq-retention must be positive");
        }
        topics.dlq_retention = self.dlq_retention;
        let membership = self.membership.resolve()?;
        Ok(PipelineOptions {
            engine: crate::pipeline::EngineSettings {
                rules_topic,
                max_tick_bytes: self.max_tick_bytes,
                transaction_timeout: self.transaction_timeout,
                static_membership: membership.static_membership,
                guarantee: self.guarantee.into(),
                txn_producers: self.txn_producers.into(),
                overlap_commits: self.overlap_commits,
                retry: crate::dlq::RetryPolicy {
                    max_attempts: self.max_attempts,
                    budget: self.retry_budget,
                    ..crate::dlq::RetryPolicy::default()
                },
                faults: crate::dlq::FaultInjection {
                    enabled: self.inject_faults,
                },
                hooks: TestHooks {
                    crash_before_commit: self.test_crash_before_commit,
                    fail_commit_in_flight: self.test_fail_commit_in_flight,
                    abort_every: self.test_abort_every,
                    stall_on_shutdown: self.test_stall_on_shutdown,
                    abort_after_revoke: self.test_abort_after_revoke,
                    hold_send_offsets: self.test_hold_send_offsets.clone(),
                    aborts_fail_fatally: self.test_aborts_fail_fatally,
                    watchdog_bound: self.test_watchdog_bound,
                    freeze_rules: self.test_freeze_rules.clone(),
                },
                ..crate::pipeline::EngineSettings::new(
                    kafka,
                    &self.app_id,
                    &membership.instance_id,
                    topics,
                    std::sync::Arc::new(rules),
                )
            },
            commit_interval: self.commit_interval,
            max_batch: self.max_batch,
            shutdown_timeout: self.shutdown_timeout,
            input_partitions: Some(self.partitions),
            exit_when_idle: self.exit_when_idle,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn files(config: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "cli-test-{}",
            crate::kafka::topics::unique_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let rules = dir.join("rules.toml");
        std::fs::write(&rules, "[symbols]\nBBCA = [\"10000\"]\n").unwrap();
        let cfg = dir.join("pipeline.toml");
        std::fs::write(&cfg, config).unwrap();
        (rules, cfg)
    }

    fn options(args: &[&str], config: &str) -> anyhow::Result<PipelineOptions> {
        let (rules, cfg) = files(config);
        let mut argv = vec![
            "alert-pipeline",
            "--rules",
            rules.to_str().unwrap(),
            "--config",
            cfg.to_str().unwrap(),
        ];
        argv.extend_from_slice(args);
        PipelineArgs::try_parse_from(argv)?.options()
    }

    #[test]
    fn config_file_properties_reach_the_clients_and_minus_x_wins() {
        let o = options(
            &["-X", "linger.ms=9", "--instance-id", "0"],
            "[librdkafka]\n\"linger.ms\" = 3\n\"socket.keepalive.enable\" = true\n",
        )
        .unwrap();
        let props = &o.engine.kafka.properties;
        assert_eq!(
            props.get("linger.ms").map(String::as_str),
            Some("9"),
            "-X wins over the file"
        );
        assert_eq!(
            props.get("socket.keepalive.enable").map(String::as_str),
            Some("true")
        );
        assert_eq!(o.engine.transactional_id(), "price-alerts-0");
        assert_eq!(o.commit_interval, std::time::Duration::from_millis(100));
    }

    #[test]
    fn membership_is_dynamic_unless_asked_and_ids_never_default_to_one_value() {
        let (a, b) = (options(&[], "").unwrap(), options(&[], "").unwrap());
        assert!(!a.engine.static_membership);
        assert_ne!(a.engine.transactional_id(), b.engine.transactional_id());
        let o = options(
            &["--static-membership", "--instance-id", "price-alerts-1"],
            "",
        )
        .unwrap();
        assert!(o.engine.static_membership);
        assert_eq!(o.engine.transactional_id(), "price-alerts-price-alerts-1");
        assert!(options(&["--static-membership"], "").is_err());
        assert!(
            !options(&["--dynamic-membership"], "")
                .unwrap()
                .engine
                .static_membership
        );
    }

    #[test]
    fn config_file_mistakes_are_refused() {
        let err = options(&[], "[librdkafka]\n\"no.such.thing\" = 1\n").unwrap_err();
        assert!(format!("{err:#}").contains("no.such.thing"), "{err:#}");
        let err = options(&[], "[librdkafka]\n\"enable.auto.commit\" = true\n").unwrap_err();
        assert!(
            format!("{err:#}").contains("cannot be overridden"),
            "{err:#}"
        );
        let err = options(&[], "[kafka]\nx = 1\n").unwrap_err();
        assert!(format!("{err:#}").contains("unknown field"), "{err:#}");
        let err = options(&["--commit-interval", "20s"], "").unwrap_err();
        assert!(
            format!("{err:#}").contains("transaction-timeout"),
            "{err:#}"
        );
    }

    #[test]
    fn dlq_retention_reaches_the_topics() {
        let two_weeks = std::time::Duration::from_secs(14 * 24 * 3600);
        assert_eq!(
            options(&[], "").unwrap().engine.topics.dlq_retention,
            two_weeks
        );
        let o = options(&["--dlq-retention", "3d"], "").unwrap();
        assert_eq!(
            o.engine.topics.dlq_retention,
            std::time::Duration::from_secs(3 * 24 * 3600)
        );
        assert!(options(&["--dlq-retention", "0s"], "").is_err());
    }
}
