//! The oracle for alert-sink's table: the notifications the input implies (the verifier's own
//! expectation, [`crate::oracle::expected_from_input`]) against the ids stored in `alerts`, with the
//! verifier's own comparison ([`crate::oracle::compare`]). `alert-verify --table` and the tests use
//! it. The primary key makes a duplicate row impossible, so what this can find is a missing or an
//! unexpected row.

use super::db;
use super::options::DbOptions;
use crate::dlq::FaultInjection;
use crate::kafka::KafkaConfig;
use crate::oracle::{compare, expected_from_input, VerifyReport};
use crate::rules::Rules;
use anyhow::Context as _;
use std::collections::HashMap;

/// Every id in the `alerts` table, each with the number of rows that have it.
pub async fn stored_ids(opts: &DbOptions) -> anyhow::Result<HashMap<String, u64>> {
    let client = db::connect(opts)
        .await
        .with_context(|| format!("connecting to {}", db::describe(opts)))?;
    let rows = client
        .query("SELECT id, count(*) FROM alerts GROUP BY id", &[])
        .await
        .map_err(|e| db::classify(&e))
        .context("reading the alerts table")?;
    Ok(rows
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
        .collect())
}

/// Compares the notifications implied by `input` with the rows of the `alerts` table.
pub fn verify_table(
    kafka: &KafkaConfig,
    input: &str,
    rules: &Rules,
    max_tick_bytes: usize,
    faults: FaultInjection,
    db: &DbOptions,
) -> anyhow::Result<VerifyReport> {
    let mut report = VerifyReport::default();
    let expected = expected_from_input(kafka, input, rules, max_tick_bytes, faults, &mut report)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let found = rt.block_on(stored_ids(db))?;
    report.found = found.values().sum();
    compare(&mut report, &expected, &found);
    Ok(report)
}
