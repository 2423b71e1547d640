//! `tick-gen`: writes a seeded random-walk tick stream to the input topic, and the rules it used.

use anyhow::Context as _;
use clap::Parser;
use price_alerts::cli::main_of;
use price_alerts::cli::tickgen::TickGenArgs;
use price_alerts::kafka::access::{check, Needs};
use price_alerts::kafka::feed::Feed;
use price_alerts::kafka::topics::{ensure_topic, Cleanup, TopicSpec};
use price_alerts::tools::generate::{generate, GenOptions};
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    main_of("tick-gen", || run().map(|()| ExitCode::SUCCESS))
}

fn run() -> anyhow::Result<()> {
    let cli = TickGenArgs::parse();
    let (rules, ticks) = generate(&GenOptions {
        symbols: cli.symbols,
        ticks: cli.ticks,
        seed: cli.seed,
        stale_every: cli.stale_every,
    });
    match &cli.rules_out {
        Some(path) => std::fs::write(path, rules.to_toml())
            .with_context(|| format!("writing {}", path.display()))?,
        None => price_alerts::outln!("{}", rules.to_toml()),
    }
    if cli.rules_only {
        return Ok(());
    }
    let kafka = cli.kafka.connect()?;
    check(
        &kafka,
        &Needs {
            write: vec![cli.topic.clone()],
            ..Needs::default()
        },
    )?;
    // Created only when missing: a producer with Write but no Create on an existing topic is fine.
    futures::executor::block_on(ensure_topic(
        &kafka,
        &TopicSpec {
            name: cli.topic.clone(),
            partitions: cli.partitions,
            cleanup: Cleanup::Delete,
            retention: None,
        },
    ))?;
    let started = Instant::now();
    Feed::new(&kafka)?.send_ticks_at_rate(&cli.topic, &ticks, cli.rate)?;
    price_alerts::errln!(
        "tick-gen: {} ticks for {} symbols written to {} in {:.1}s",
        ticks.len(),
        cli.symbols,
        cli.topic,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
