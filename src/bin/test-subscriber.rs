//! `test-subscriber`: local webhook receivers for alert-deliver (accepting, failing for a while,
//! or answering a fixed status), counting what they receive by Idempotency-Key; used by
//! `scripts/demo.sh`. The logic is in `price_alerts::tools::subscriber`.

use clap::Parser;
use price_alerts::cli::{main_of, shutdown_signal};
use price_alerts::outln;
use price_alerts::tools::subscriber::{serve, Spec};
use std::process::ExitCode;

/// test-subscriber's command line.
#[derive(Debug, Parser)]
#[command(
    name = "test-subscriber",
    version,
    about = "Local webhook receivers for alert-deliver: each accepts, fails for a while, or answers a fixed status; prints what each received, by Idempotency-Key, when stopped (SIGINT/SIGTERM)"
)]
struct Cli {
    /// Address to listen on (port 0: any free port; the subscriptions file names the one bound).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    /// A subscriber, NAME=accept, NAME=fail-for:DURATION (503 from its first request for that
    /// long, then 200) or NAME=status:CODE (repeatable). Served at /hook/NAME.
    #[arg(long = "subscriber", value_name = "NAME=BEHAVIOUR", required = true)]
    subscribers: Vec<Spec>,
    /// Write alert-deliver's subscriptions file here (every subscriber, every symbol) once
    /// listening.
    #[arg(long, value_name = "FILE")]
    subscriptions_out: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    main_of("test-subscriber", || {
        let cli = Cli::parse();
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
