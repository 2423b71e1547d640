//! Helpers of the broker tests: the broker address, fresh names, engine settings.
#![allow(dead_code)] // each test binary uses a different subset

use price_alerts::config::{KafkaConfig, DEFAULT_BOOTSTRAP};
use price_alerts::engine::EngineSettings;
use price_alerts::rules::Rules;
use price_alerts::tick::DEFAULT_MAX_TICK_BYTES;
use price_alerts::topics::{self, Topics};
use std::sync::Arc;
use std::time::Duration;

/// The broker under test: `KAFKA_BOOTSTRAP`, or the local one of scripts/kafka.sh.
pub fn kafka() -> KafkaConfig {
    KafkaConfig::new(std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| DEFAULT_BOOTSTRAP.to_owned()))
}

/// A fresh prefix, so tests never share topics, groups or transactional ids.
pub fn prefix(test: &str) -> String {
    format!("t-{test}-{}-", price_alerts::cli::unique_suffix())
}

/// Settings of one engine instance on fresh topics.
pub fn settings(prefix: &str, rules: Rules) -> EngineSettings {
    let app_id = format!("{prefix}app");
    EngineSettings {
        kafka: kafka(),
        topics: Topics::with(format!("{prefix}market-updates"), format!("{prefix}notifications"), &app_id),
        app_id,
        instance_id: "0".into(),
        rules: Arc::new(rules),
        max_tick_bytes: DEFAULT_MAX_TICK_BYTES,
        transaction_timeout: Duration::from_secs(10),
        static_membership: true,
    }
}

/// Creates the topics of `s` with `partitions` input partitions.
pub fn create_topics(s: &EngineSettings, partitions: i32) {
    futures::executor::block_on(topics::ensure(&s.kafka, &s.topics, Some(partitions))).expect("creating topics");
}
