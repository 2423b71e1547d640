//! `alert-pipeline`: the exactly-once price-alert processor.

use clap::Parser;
use price_alerts::cli::{end_runtime, main_of, shutdown_signal_bounded, PipelineArgs};
use price_alerts::dlq::Watcher;
use price_alerts::health::{self, Health, DEFAULT_STALL_AFTER};
use price_alerts::kafka::group_lag;
use price_alerts::{errln, outln, pipeline};
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("alert-pipeline", || run().map(|()| ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let args = PipelineArgs::parse();
    let opts = args.options()?;
    let runtime = tokio::runtime::Runtime::new()?;
    let result = runtime.block_on(async {
        let health = Health::new(DEFAULT_STALL_AFTER);
        if let Some(addr) = args.metrics_addr {
            health::serve(addr, health.clone(), price_alerts::metrics::describe).await?;
        }
        // Served before the broker is waited for: /healthz answers, and /readyz says why not
        // ready, however slow the broker is to answer at start.
        health.not_ready("connecting to the brokers");
        args.kafka.check_async(&opts.engine.kafka).await?;
        // The DLQ backlog gauges, only where they are scraped; it stops when dropped at the end.
        let _dlq_watch = match args.metrics_addr {
            Some(_) => {
                let (kafka, dlq) = (opts.engine.kafka.clone(), opts.engine.topics.dlq.clone());
                Some(Watcher::spawn(kafka, dlq, args.dlq_watch_interval)?)
            }
            None => None,
        };
        // The group's lag on every input partition, owned or not, likewise.
        let _lag_watch = match args.metrics_addr {
            Some(_) => Some(group_lag::Watcher::spawn(
                &opts.engine.kafka,
                opts.engine.group_id(),
                std::slice::from_ref(&opts.engine.topics.input),
                args.lag_watch_interval,
            )?),
            None => None,
        };
        let shutdown = shutdown_signal_bounded(opts.shutdown_timeout);
        let stats = pipeline::run(opts, health, shutdown).await?;
        errln!("alert-pipeline: stopped cleanly");
        if args.json {
            outln!("{}", serde_json::to_string(&stats)?);
        } else {
            outln!("{stats}");
        }
        Ok(())
    });
    end_runtime(runtime);
    result
}
