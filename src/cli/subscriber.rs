//! `test-subscriber`'s command line: local webhook receivers for alert-deliver (the demo's, and
//! the compose project's `webhook` service, whose arguments tests/deploy.rs parses with it).

use crate::tools::subscriber::Spec;

/// test-subscriber's command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "test-subscriber",
    version,
    about = "Local webhook receivers for alert-deliver: each accepts, fails for a while, or answers a fixed status; prints what each received, by Idempotency-Key, when stopped (SIGINT/SIGTERM)"
)]
pub struct SubscriberArgs {
    /// Address to listen on (port 0: any free port; the subscriptions file names the one bound).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
    /// A subscriber, NAME=accept, NAME=fail-for:DURATION (503 from its first request for that
    /// long, then 200) or NAME=status:CODE (repeatable). Served at /hook/NAME.
    #[arg(long = "subscriber", value_name = "NAME=BEHAVIOUR", required = true)]
    pub subscribers: Vec<Spec>,
    /// Write alert-deliver's subscriptions file here (every subscriber, every symbol) once
    /// listening.
    #[arg(long, value_name = "FILE")]
    pub subscriptions_out: Option<std::path::PathBuf>,
}
