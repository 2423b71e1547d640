//! `alert-sink`: the notifications topic into PostgreSQL, effectively once (idempotent rows and
//! the consumed offsets in one database transaction per batch). `alert-sink migrate` only applies
//! the database migrations.

use clap::Parser;
use price_alerts::cli::{main_of, shutdown_signal};
use price_alerts::sink::options::SinkCommand;
use price_alerts::sink::{self, SinkArgs};
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
        eprintln!("alert-sink: {} migration(s) applied: {applied:?}", applied.len());
        return Ok(());
    }
    let opts = args.options()?;
    runtime.block_on(async {
        price_alerts::metrics::serve(args.metrics_addr)?;
        let stats = sink::run(opts, shutdown_signal()).await?;
        eprintln!("alert-sink: stopped cleanly: {stats:?}");
        Ok(())
    })
}
