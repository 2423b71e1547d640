//! `alert-rules`: manage live alerts (the rules topic) while the pipeline runs. The logic is in
//! `price_alerts::tools::alerts`; the flags in `price_alerts::cli::rules`.

use clap::Parser;
use price_alerts::cli::main_of;
use price_alerts::cli::rules::RulesArgs;
use price_alerts::outln;
use price_alerts::tools::alerts::RulesTopic;
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("alert-rules", || run().map(|()| ExitCode::SUCCESS))
}

#[tokio::main]
async fn run() -> anyhow::Result<()> {
    let cli = RulesArgs::parse();
    // Refused before anything is sent.
    let request = cli.request()?;
    let kafka = cli.kafka.connect()?;
    let topic =
        RulesTopic::open(&kafka, &cli.app_id, cli.rules_topic.as_deref(), &cli.input).await?;
    outln!("{}", topic.carry_out(&request).await?);
    Ok(())
}
