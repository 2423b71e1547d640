//! The sink's metrics, in one place, so the log lines and the counters never drift apart.
//!
//! `alerts_sink_ready` is the readiness signal: 1 while the sink consumes and writes, 0 while it
//! starts or while a database outage keeps its partitions paused. Counters are counted when a batch
//! has committed in the database, so a batch written again after an outage is counted once.

use super::store::Written;
use metrics::{counter, gauge, histogram};
use std::time::Duration;

/// Ready (consuming and writing) or not (starting, or paused by an outage).
pub fn ready(ready: bool) {
    gauge!("alerts_sink_ready").set(if ready { 1.0 } else { 0.0 });
}

/// A batch committed in the database.
pub fn batch_written(w: &Written, records: usize, took: Duration) {
    counter!("alerts_sink_batches_total").increment(1);
    counter!("alerts_sink_records_total").increment(records as u64);
    counter!("alerts_sink_rows_inserted_total").increment(w.inserted);
    // Rows that were stored already: a redo after a crash, a rebalance or an unknown commit.
    counter!("alerts_sink_rows_conflicted_total").increment(w.conflicted);
    for (class, n) in &w.dead_letters {
        counter!("alerts_sink_dead_letters_total", "class" => *class).increment(*n);
    }
    histogram!("alerts_sink_batch_seconds").record(took.as_secs_f64());
}

/// The database became unavailable (the partitions are paused).
pub fn outage_started() {
    counter!("alerts_sink_db_outages_total").increment(1);
    ready(false);
}

/// The database answers again (the partitions are resumed).
pub fn outage_ended(took: Duration) {
    histogram!("alerts_sink_db_outage_seconds").record(took.as_secs_f64());
    ready(true);
}

/// Partitions owned now, and how many of them are paused; set after every assign, revoke, pause
/// and resume, so a partition paused by a past outage shows.
pub fn partitions(owned: usize, paused: usize) {
    gauge!("alerts_sink_assigned_partitions").set(owned as f64);
    gauge!("alerts_sink_paused_partitions").set(paused as f64);
}
