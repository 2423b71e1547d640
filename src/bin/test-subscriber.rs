//! `test-subscriber`: local webhook receivers for alert-deliver (accepting, failing for a while,
//! or answering a fixed status), counting what they receive by Idempotency-Key; used by
//! `scripts/demo.sh` and the compose project's `webhook` service. The logic is in
//! `price_alerts::tools::subscriber`.

use clap::Parser;
use price_alerts::cli::subscriber::SubscriberArgs;
use price_alerts::cli::{main_of, shutdown_signal};
use price_alerts::outln;
use price_alerts::tools::subscriber::serve;
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("test-subscriber", || {
        let cli = SubscriberArgs::parse();
        let runtime = tokio::runtime::Runtime::new()?;
        let report = runtime.block_on(serve(
            cli.listen,
            &cli.subscribers,
            cli.subscriptions_out.as_deref(),
            shutdown_signal(),
        ))?;
        outln!("{}", report.to_string().trim_end());
        Ok(ExitCode::SUCCESS)
    })
}
