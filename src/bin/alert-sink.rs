//! `alert-sink`: the notifications topic into PostgreSQL, effectively once (idempotent rows and
//! the consumed offsets in one database transaction per batch). `alert-sink migrate` only applies
//! the database migrations.

use clap::Parser;
use price_alerts::cli::sink::{SinkArgs, SinkCommand};
use price_alerts::cli::{main_of, shutdown_signal_bounded};
use price_alerts::health::{self, Health, DEFAULT_STALL_AFTER};
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
            // The sink's series (sink::metrics) appear with their first event; not the processor's.
            health::serve(addr, health.clone(), || ()).await?;
        }
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
    // Never wait for a sink thread that did not finish: the shutdown bound is the promise.
    runtime.shutdown_background();
    result
}
