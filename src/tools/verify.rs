//! `alert-verify`: the oracle run against a pipeline's outputs. The expected notifications come
//! from the input topic and the rules ([`crate::oracle`]); they are compared with what
//! read_committed readers find in the notifications topic ([`crate::oracle::verify`]), with the
//! live alerts' rules topic in place of a rules file ([`crate::oracle::verify_live`]), or with
//! alert-sink's table ([`crate::sink::check::verify_table`]).

use crate::dlq::FaultInjection;
use crate::kafka::access::{check, Needs};
use crate::kafka::KafkaConfig;
use crate::oracle::{verify_live, VerifyReport};
use crate::rules::Rules;
use crate::sink::check::verify_table;
use crate::sink::DbOptions;

/// What to check, and where.
pub struct VerifyOptions {
    pub kafka: KafkaConfig,
    /// The rules the pipeline ran with (empty with `rules_topic`).
    pub rules: Rules,
    /// The live alerts' rules topic the pipeline joined, instead of a rules file.
    pub rules_topic: Option<String>,
    pub input: String,
    /// The notifications topic (unless `table`).
    pub output: String,
    /// Same limit as the pipeline's.
    pub max_tick_bytes: usize,
    /// The pipeline ran with fault injection: poison ticks imply no notification.
    pub faults: FaultInjection,
    /// alert-sink's database, whose `alerts` table is checked instead of the topic.
    pub table: Option<DbOptions>,
}

/// Checks that the Read rights are there, then recomputes the expected notifications and
/// compares them with the committed ones (or the table's rows).
pub fn verify(opts: &VerifyOptions) -> anyhow::Result<VerifyReport> {
    let mut read = vec![opts.input.clone()];
    read.extend(opts.rules_topic.clone());
    if opts.table.is_none() {
        read.push(opts.output.clone());
    }
    check(
        &opts.kafka,
        &Needs {
            read,
            ..Default::default()
        },
    )?;
    if let Some(db) = &opts.table {
        verify_table(
            &opts.kafka,
            &opts.input,
            &opts.rules,
            opts.max_tick_bytes,
            opts.faults,
            db,
        )
    } else if let Some(rules_topic) = &opts.rules_topic {
        verify_live(
            &opts.kafka,
            &opts.input,
            &opts.output,
            rules_topic,
            opts.max_tick_bytes,
            opts.faults,
        )
    } else {
        crate::oracle::verify(
            &opts.kafka,
            &opts.input,
            &opts.output,
            &opts.rules,
            opts.max_tick_bytes,
            opts.faults,
        )
    }
}
