//! Benchmarks of the price-alert processor, kept out of the processor's crate so that its
//! dependency tree carries no plotting, progress-bar or font crate.
//!
//! - [`producer`] (`producer-bench`): what exactly-once costs on the producing side: plain,
//!   idempotent and transactional producers, side by side with Kafka's own ProducerPerformance
//!   (`bench/compare.sh`).
//! - [`pipeline`] (`pipeline-bench`): what exactly-once costs the whole processor: throughput,
//!   end-to-end latency (with a plot of its distribution) and peak RSS by commit interval,
//!   against at-least-once.
//! - [`sink`] (`sink-bench`): alert-sink's rows/s into PostgreSQL, batched against one row per
//!   transaction, and the latency from a tick's append to its row.
//! - [`deliver`] (`deliver-bench`): alert-deliver's deliveries/s by fan-out against a plain
//!   at-most-once loop with the same HTTP client, its latency at half saturation, its RSS and CPU
//!   with up to 10,000 subscribers, and the healthy subscribers' share during an outage.
//! - [`recovery`] (`recovery-bench`): a restart after SIGKILL of an instance holding a large
//!   state: time to restore it from the changelog and to the first commit.
//! - [`rules`] (`rules-bench`): live alerts: from `alert-rules put` returning to the alert's
//!   first notification, at a paced stream.
//! - [`rebalance`] (`rebalance-bench`): how long each partition goes without committed progress
//!   when one of three instances is stopped, killed or joined by a fourth, classic group protocol
//!   against KIP-848's consumer protocol.
//! - [`plot`]: the font and colours of the PNG plots.
//! - [`tail`]: pipeline-bench's latency reader, tailing the notifications read_committed.
//! - [`child`]: the pipeline as a child process (guard, signals, metrics port, peak RSS).
//! - [`stats`]: median, range, percentiles, ratios (pure), shared by both.
//!
//! The binaries in `src/bin/` are thin (issue 45): they parse their flags, call the library and
//! map the result to an exit code. A command line that does more with its flags (defaults turned
//! into options, a replot branch, the printing) is in its benchmark's module, so that it is read,
//! and unit-tested, beside what it measures: `cli` for pipeline-, sink-, deliver-, recovery-,
//! rebalance- and rules-bench, [`producer::options`] for producer-bench.
//!
//! Figures, with their commands and machine, are in `bench/RESULTS.md`.

pub mod child;
pub mod deliver;
pub mod pipeline;
pub mod plot;
pub mod producer;
pub mod rebalance;
pub mod recovery;
pub mod rules;
pub mod sink;
pub mod stats;
pub mod tail;

/// Writes a benchmark's `results.json` (what it measured, pretty-printed) and `results.md` (its
/// table) into `dir`, creating it.
pub fn write_results(
    dir: &std::path::Path,
    json: &impl serde::Serialize,
    table: &str,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("results.json"), serde_json::to_vec_pretty(json)?)?;
    std::fs::write(dir.join("results.md"), table)?;
    Ok(())
}
