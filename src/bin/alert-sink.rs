//! `alert-sink`: the notifications topic into PostgreSQL, effectively once (idempotent rows and
//! the consumed offsets in one database transaction per batch). `alert-sink migrate` only applies
//! the database migrations.

use clap::Parser;
use price_alerts::cli::sink::{SinkArgs, SinkCommand};
use price_alerts::cli::{end_runtime, main_of, shutdown_signal_bounded};
use price_alerts::health::{self, Health, DEFAULT_STALL_AFTER};
use price_alerts::kafka::group_lag;
use price_alerts::{errln, outln, sink};
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("alert-sink", || run().map(|()| ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let args = SinkArgs::parse();
    let runtime = tokio::runtime::Runtime::new()?;
    if let Some(SinkCommand::Migrate) = args.command {
        let db = args.db.options()?;
        let applied = runtime.block_on(sink::migrate_only(&db))?;
        errln!(
            "alert-sink: {} migration(s) applied: {applied:?}",
            applied.len()
        );
        return Ok(());
    }
    let opts = args.options()?;
    args.kafka.check(&opts.kafka)?;
    let result = runtime.block_on(async {
        let health = Health::new(DEFAULT_STALL_AFTER);
        if let Some(addr) = args.metrics_addr {
            // The sink's series (sink::metrics), at zero from the start; not the processor's but
            // the group lag (described here, set by the lag watcher).
            health::serve(addr, health.clone(), || {
                use price_alerts::metrics::{
                    describe_only, GROUP_COMMITTED_OFFSET, GROUP_LAG, PARTITION_END_OFFSET,
                };
                sink::metrics::describe();
                describe_only(&[GROUP_COMMITTED_OFFSET, PARTITION_END_OFFSET, GROUP_LAG]);
            })
            .await?;
        }
        // The sink's lag on every partition, owned or not: from the offsets it commits to its
        // Kafka group after each database commit (for this; the database's are the truth).
        let _lag_watch = match args.metrics_addr {
            Some(_) => Some(group_lag::Watcher::spawn(
                &opts.kafka,
                &opts.group_id,
                std::slice::from_ref(&opts.topic),
                args.lag_watch_interval,
            )?),
            None => None,
        };
        let stats = sink::run(
            opts.clone(),
            health,
            shutdown_signal_bounded(opts.shutdown_timeout),
        )
        .await?;
        errln!("alert-sink: stopped cleanly");
        outln!("{stats}");
        Ok(())
    });
    end_runtime(runtime);
    result
}
