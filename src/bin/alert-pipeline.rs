//! `alert-pipeline`: the exactly-once price-alert processor.

use clap::Parser;
use price_alerts::cli::{main_of, PipelineArgs};
use price_alerts::pipeline;
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("alert-pipeline", || run().map(|()| ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let args = PipelineArgs::parse();
    let opts = args.options()?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        price_alerts::metrics::serve(args.metrics_addr)?;
        let stats = pipeline::run(opts, price_alerts::cli::shutdown_signal()).await?;
        eprintln!("alert-pipeline: stopped cleanly: {stats:?}");
        Ok(())
    })
}
