//! alert-deliver's command line, mapped onto [`DeliverOptions`].

// The `///` comments on clap arguments are the --help texts, written for a terminal, not rustdoc.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use super::{duration, KafkaArgs};
use crate::deliver::breaker::{self, BreakerConfig};
use crate::deliver::options::{
    DEFAULT_MAX_BATCH, DEFAULT_MAX_BATCH_DELIVERIES, DEFAULT_PARTITION_CONCURRENCY,
};
use crate::deliver::{Buckets, DeliverOptions, Subscriptions};
use crate::kafka::config::DEFAULT_TRANSACTION_TIMEOUT;
use crate::kafka::topics::DEFAULT_DLQ_RETENTION;
use anyhow::{bail, Context as _};
use std::path::PathBuf;
use std::time::Duration;

/// alert-deliver's command line.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "alert-deliver",
    version,
    about = "Notifications to subscribers' webhooks: non-blocking retry topics with delay buckets, a parking lot and a DLQ; every hand-off exactly once on the Kafka side"
)]
pub struct DeliverArgs {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// The subscriptions file (TOML): [subscribers.<name>] with url, symbols, max_in_flight.
    #[arg(long)]
    pub subscriptions: PathBuf,
    /// The notifications topic; its buckets are <topic>.retry.<delay>, then <topic>.dlq and
    /// <topic>.parking-lot.
    #[arg(long, default_value = "notifications")]
    pub topic: String,
    /// The retry buckets' delays, increasing, comma-separated.
    #[arg(long, default_value = "5s,1m,10m")]
    pub buckets: String,
    /// Application id; the group is <app>-deliver unless --group says otherwise.
    #[arg(long, default_value = "price-alerts")]
    pub app_id: String,
    /// The deliverer's consumer group (default <app>-deliver).
    #[arg(long)]
    pub group: Option<String>,
    /// Instance id, group membership (--instance-id, --static-membership, --dynamic-membership).
    #[command(flatten)]
    pub membership: super::MembershipArgs,
    /// Records per batch (one transaction), at most.
    #[arg(long, default_value_t = DEFAULT_MAX_BATCH)]
    pub max_batch: usize,
    /// Deliveries per batch, at most (a notification counts one per subscriber).
    #[arg(long, default_value_t = DEFAULT_MAX_BATCH_DELIVERIES)]
    pub max_batch_deliveries: usize,
    /// Concurrent deliveries of one partition's records, at most.
    #[arg(long, default_value_t = DEFAULT_PARTITION_CONCURRENCY)]
    pub partition_concurrency: usize,
    /// Bound on connecting to a subscriber.
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub http_connect_timeout: Duration,
    /// Bound on a whole request to a subscriber.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub http_timeout: Duration,
    /// How long a batch waits for its deliveries (default: --http-timeout). Unanswered ones move
    /// to the next bucket (class deadline); lower it to bound what a newly hanging subscriber
    /// costs everyone else, keeping it above what healthy subscribers take to answer.
    #[arg(long, value_parser = duration)]
    pub delivery_deadline: Option<Duration>,
    /// Consecutive failed calls (5xx, 408, timeout, connection, deadline) that open a
    /// subscriber's circuit: its deliveries then go to the next bucket untried. 0: no breaker.
    #[arg(long, default_value_t = breaker::DEFAULT_FAILURES)]
    pub breaker_failures: u32,
    /// How long an open circuit skips its subscriber before one probe delivery.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub breaker_cooldown: Duration,
    /// Producer transaction.timeout.ms.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub transaction_timeout: Duration,
    /// retention.ms of the bucket, DLQ and parking-lot topics when they are created.
    #[arg(long, default_value = "14days", value_parser = duration)]
    pub retention: Duration,
    /// How long a graceful shutdown may take before exiting non-zero.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub shutdown_timeout: Duration,
    /// Stop once idle this long: nothing polled, no retry waiting in a bucket for its due time,
    /// and every partition it owns read to its end (demos, benchmarks).
    #[arg(long, value_parser = duration)]
    pub exit_when_idle: Option<Duration>,
    /// Serve Prometheus metrics, /healthz and /readyz on this address (e.g. 127.0.0.1:9898).
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// With --metrics-addr: how often the group's committed offset, the end and the lag of every
    /// partition it consumes (the notifications and every retry bucket), owned by this instance
    /// or not, are read from the broker (alerts_group_*, alerts_partition_end_offset: a partition
    /// nobody consumes shows there).
    #[arg(long, default_value = "15s", value_parser = super::interval)]
    pub lag_watch_interval: Duration,
    /// TEST ONLY: abort once this many hand-off records are written, inside the open transaction.
    #[arg(long, hide = true)]
    pub test_crash_after_handoffs: Option<u64>,
    /// TEST ONLY: abort the N-th hand-off transaction (1-based) instead of committing it.
    #[arg(long, hide = true)]
    pub test_abort_handoff_txn: Option<u64>,
    /// TEST ONLY: while this file exists, abort every hand-off transaction.
    #[arg(long, hide = true)]
    pub test_abort_handoffs_while: Option<std::path::PathBuf>,
    /// TEST ONLY: while this file exists, hold right before each hand-off's
    /// send_offsets_to_transaction (writing <FILE>.held with the pid) until it is removed.
    #[arg(long, hide = true)]
    pub test_hold_send_offsets: Option<std::path::PathBuf>,
    /// TEST ONLY: every abort of a hand-off transaction fails fatally, leaving it open on the
    /// broker.
    #[arg(long, hide = true)]
    pub test_aborts_fail_fatally: bool,
}

impl DeliverArgs {
    /// The consumer group.
    pub fn group_id(&self) -> String {
        self.group
            .clone()
            .unwrap_or_else(|| format!("{}-deliver", self.app_id))
    }

    /// Validates the arguments (the subscriptions file included) and builds the options.
    pub fn options(&self) -> anyhow::Result<DeliverOptions> {
        // The group protocol first: a property it forbids is named before librdkafka sees any.
        let kafka = self.membership.kafka(self.kafka.config()?)?;
        kafka.validate()?;
        let buckets = Buckets::parse(&self.topic, &self.buckets).context("--buckets")?;
        let subscriptions = Subscriptions::load(&self.subscriptions)?;
        if self.max_batch == 0 || self.max_batch_deliveries == 0 || self.partition_concurrency == 0
        {
            bail!(
                "--max-batch, --max-batch-deliveries and --partition-concurrency must be at least 1"
            );
        }
        if self.http_timeout.is_zero() || self.http_connect_timeout.is_zero() {
            bail!("--http-timeout and --http-connect-timeout must be above 0");
        }
        let delivery_deadline = self.delivery_deadline.unwrap_or(self.http_timeout);
        if delivery_deadline.is_zero() || delivery_deadline > self.http_timeout {
            bail!(
                "--delivery-deadline must be above 0 and at most --http-timeout ({:?})",
                self.http_timeout
            );
        }
        if self.breaker_failures > 0 && self.breaker_cooldown.is_zero() {
            bail!("--breaker-cooldown must be above 0");
        }
        let group_id = self.group_id();
        let membership = self.membership.resolve()?;
        let instance = format!("{group_id}-{}", membership.instance_id);
        Ok(DeliverOptions {
            kafka,
            subscriptions,
            buckets,
            group_instance_id: membership.static_membership.then(|| instance.clone()),
            transactional_id: instance,
            group_id,
            max_batch: self.max_batch,
            max_batch_deliveries: self.max_batch_deliveries,
            partition_concurrency: self.partition_concurrency,
            connect_timeout: self.http_connect_timeout,
            request_timeout: self.http_timeout,
            delivery_deadline,
            breaker: BreakerConfig {
                failures: self.breaker_failures,
                cooldown: self.breaker_cooldown,
            },
            transaction_timeout: self.transaction_timeout,
            retention: self.retention,
            shutdown_timeout: self.shutdown_timeout,
            exit_when_idle: self.exit_when_idle,
            backlog_gauges: self.metrics_addr.is_some(),
            test_crash_after_handoffs: self.test_crash_after_handoffs,
            test_abort_handoff_txn: self.test_abort_handoff_txn,
            test_abort_handoffs_while: self.test_abort_handoffs_while.clone(),
            test_hold_send_offsets: self.test_hold_send_offsets.clone(),
            test_aborts_fail_fatally: self.test_aborts_fail_fatally,
        })
    }
}

/// The defaults the flags above spell out as text.
const _: () = {
    assert!(DEFAULT_TRANSACTION_TIMEOUT.as_secs() == 10);
    assert!(DEFAULT_DLQ_RETENTION.as_secs() == 14 * 24 * 3600);
    assert!(breaker::DEFAULT_COOLDOWN.as_secs() == 5);
};

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn file(text: &str) -> tempfile_path::Path {
        tempfile_path::Path::new(text)
    }

    /// A subscriptions file in the temp dir, removed when dropped.
    mod tempfile_path {
        pub struct Path(pub std::path::PathBuf);
        impl Path {
            pub fn new(text: &str) -> Self {
                let p = std::env::temp_dir().join(format!(
                    "subs-{}.toml",
                    crate::kafka::topics::unique_suffix()
                ));
                std::fs::write(&p, text).unwrap();
                Path(p)
            }
        }
        impl Drop for Path {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn defaults_and_refusals() {
        let f = file("[subscribers.a]\nurl = \"http://h/\"\nsymbols = [\"*\"]\n");
        let path = f.0.to_str().unwrap();
        let o = DeliverArgs::try_parse_from(["alert-deliver", "--subscriptions", path])
            .unwrap()
            .options()
            .unwrap();
        assert_eq!(o.group_id, "price-alerts-deliver");
        assert_eq!(o.group_instance_id, None, "dynamic membership by default");
        let other = DeliverArgs::try_parse_from(["alert-deliver", "--subscriptions", path])
            .unwrap()
            .options()
            .unwrap();
        assert_ne!(
            o.transactional_id, other.transactional_id,
            "two replicas without an instance id do not fence each other"
        );
        let o = DeliverArgs::try_parse_from([
            "alert-deliver",
            "--subscriptions",
            path,
            "--instance-id",
            "0",
            "--static-membership",
        ])
        .unwrap()
        .options()
        .unwrap();
        assert_eq!(o.transactional_id, "price-alerts-deliver-0");
        assert_eq!(
            o.group_instance_id.as_deref(),
            Some("price-alerts-deliver-0")
        );
        assert_eq!(
            o.buckets.bucket_topics(),
            [
                "notifications.retry.5s",
                "notifications.retry.1m",
                "notifications.retry.10m"
            ]
        );
        let args = |extra: &[&str]| {
            DeliverArgs::try_parse_from(
                [&["alert-deliver", "--subscriptions", path], extra].concat(),
            )
        };
        let err = format!(
            "{:#}",
            args(&["--buckets", "1m,5s"])
                .unwrap()
                .options()
                .unwrap_err()
        );
        assert!(err.contains("must grow"), "{err}");
        assert!(args(&["--max-batch", "0"]).unwrap().options().is_err());
        assert!(args(&["--max-batch-deliveries", "0"])
            .unwrap()
            .options()
            .is_err());
        assert_eq!(
            o.delivery_deadline, o.request_timeout,
            "the deadline defaults to the request timeout"
        );
        assert_eq!(
            o.breaker,
            BreakerConfig {
                failures: 3,
                cooldown: Duration::from_secs(5)
            }
        );
        assert!(
            args(&["--delivery-deadline", "11s"])
                .unwrap()
                .options()
                .is_err(),
            "longer than --http-timeout"
        );
        assert!(args(&["--breaker-cooldown", "0s"])
            .unwrap()
            .options()
            .is_err());
        assert_eq!(
            args(&["--breaker-failures", "0", "--breaker-cooldown", "0s"])
                .unwrap()
                .options()
                .unwrap()
                .breaker
                .failures,
            0
        );
        let missing = DeliverArgs::try_parse_from([
            "alert-deliver",
            "--subscriptions",
            "/nonexistent/subs.toml",
        ])
        .unwrap();
        assert!(format!("{:#}", missing.options().unwrap_err())
            .contains("cannot read subscriptions file"));
    }
}
