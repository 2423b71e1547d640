//! `alert-rules`: manage live alerts (the rules topic) while the pipeline runs.

use clap::Parser;
use price_alerts::cli::main_of;
use price_alerts::cli::rules::{check_subscriber, RulesArgs, RulesCommand};
use price_alerts::tools::alerts::{alerts_of_file, render, RulesTopic};
use price_alerts::{outln, rules::Rules};
use std::process::ExitCode;

fn main() -> ExitCode {
    main_of("alert-rules", || run().map(|()| ExitCode::SUCCESS))
}

#[tokio::main]
async fn run() -> anyhow::Result<()> {
    let cli = RulesArgs::parse();
    // Refused before anything is sent.
    let put = match &cli.command {
        RulesCommand::Put(p) => {
            let alert = p.alert()?;
            check_subscriber(alert.subscriber.as_deref(), p.subscriptions.as_deref())?;
            Some((p.id.clone(), alert))
        }
        RulesCommand::Load {
            subscriber,
            subscriptions,
            ..
        } => {
            check_subscriber(subscriber.as_deref(), subscriptions.as_deref())?;
            None
        }
        _ => None,
    };
    let kafka = cli.kafka.connect()?;
    let topic =
        RulesTopic::open(&kafka, &cli.app_id, cli.rules_topic.as_deref(), &cli.input).await?;
    match &cli.command {
        RulesCommand::Put(_) => {
            let (id, alert) = put.expect("made above for put");
            let ack = topic.put(&id, &alert).await?;
            outln!(
                "put {id} ({} {} {}) in {} partition {} at offset {} (its version)",
                alert.symbol,
                alert.direction.as_str(),
                alert.threshold,
                topic.name,
                ack.partition,
                ack.offset
            );
        }
        RulesCommand::Delete { id } => {
            let ack = topic.delete(id).await?;
            outln!(
                "deleted {id} in {} partition {} at offset {}",
                topic.name,
                ack.partition,
                ack.offset
            );
        }
        RulesCommand::List { json } => {
            let alerts = topic.list()?;
            if *json {
                outln!("{}", serde_json::to_string_pretty(&alerts)?);
            } else {
                outln!("{}", render(&alerts));
            }
        }
        RulesCommand::Load {
            file, subscriber, ..
        } => {
            let rules = Rules::load(file)?;
            let alerts = alerts_of_file(&rules, subscriber.as_deref());
            let per_partition = topic.put_all(&alerts).await?;
            outln!(
                "loaded {} alerts of {} symbols from {} into {}; per partition: {per_partition:?}",
                alerts.len(),
                rules.len(),
                file.display(),
                topic.name
            );
        }
    }
    Ok(())
}
