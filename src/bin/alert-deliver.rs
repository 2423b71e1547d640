//! `alert-deliver`: notifications to subscribers' webhooks, with retry bucket topics, a parking lot
//! and a DLQ; every hand-off between them exactly once on the Kafka side (see `deliver`).

use clap::Parser;
use price_alerts::cli::deliver::DeliverArgs;
use price_alerts::cli::{end_runtime, main_of, shutdown_signal_bounded};
use price_alerts::health::{self, Health, DEFAULT_STALL_AFTER};
use price_alerts::kafka::group_lag;
use price_alerts::{deliver, errln, outln};
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("alert-deliver", || run().map(|()| ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let args = DeliverArgs::parse();
    let opts = args.options()?;
    let runtime = tokio::runtime::Runtime::new()?;
    let result = runtime.block_on(async {
        let health = Health::new(DEFAULT_STALL_AFTER);
        if let Some(addr) = args.metrics_addr {
            // Its metrics are registered by deliver::run, once it knows its subscribers and buckets.
            health::serve(addr, health.clone(), || ()).await?;
        }
        // Served before the broker is waited for: /healthz answers, and /readyz says why not
        // ready, however slow the broker is to answer at start.
        health.not_ready("connecting to the brokers");
        args.kafka.check_async(&opts.kafka).await?;
        // The group's lag on every partition it consumes, owned or not, where it is scraped.
        let _lag_watch = match args.metrics_addr {
            Some(_) => {
                let mut topics = vec![opts.buckets.topic.clone()];
                topics.extend(opts.buckets.bucket_topics());
                Some(group_lag::Watcher::spawn(
                    &opts.kafka,
                    &opts.group_id,
                    &topics,
                    args.lag_watch_interval,
                )?)
            }
            None => None,
        };
        let stats = deliver::run(
            opts.clone(),
            health,
            shutdown_signal_bounded(opts.shutdown_timeout),
        )
        .await?;
        errln!("alert-deliver: stopped cleanly");
        outln!("{stats}");
        Ok(())
    });
    end_runtime(runtime);
    result
}
