//! The sink's metrics, in one place, so the log lines and the counters never drift apart.
//!
//! `alerts_sink_ready` is the readiness signal: 1 while the sink consumes and writes, 0 while it
//! starts or while a database outage keeps its partitions paused. Counters are counted when a batch
//! has committed in the database, so a batch written again after an outage is counted once.
//!
//! Every metric is named in [`CATALOGUE`], and [`describe`] registers them at zero when the
//! endpoint starts: an alert on `increase(alerts_sink_db_outages_total[30m])` sees the first
//! outage only if the series was there at 0 before it (a series that appears at 1 has no
//! increase), and a dashboard sees every panel from the first scrape.

use super::store::Written;
use crate::metrics::Kind;
use metrics::{counter, gauge, histogram};
use std::time::Duration;

pub const READY: &str = "alerts_sink_ready";
pub const BATCHES: &str = "alerts_sink_batches_total";
pub const RECORDS: &str = "alerts_sink_records_total";
pub const ROWS_INSERTED: &str = "alerts_sink_rows_inserted_total";
pub const ROWS_CONFLICTED: &str = "alerts_sink_rows_conflicted_total";
pub const DEAD_LETTERS: &str = "alerts_sink_dead_letters_total";
pub const BATCH_SECONDS: &str = "alerts_sink_batch_seconds";
pub const DB_OUTAGES: &str = "alerts_sink_db_outages_total";
pub const DB_OUTAGE_SECONDS: &str = "alerts_sink_db_outage_seconds";
pub const ASSIGNED_PARTITIONS: &str = "alerts_sink_assigned_partitions";
pub const PAUSED_PARTITIONS: &str = "alerts_sink_paused_partitions";

/// Every metric of the sink: name, kind, help text.
pub const CATALOGUE: &[(&str, Kind, &str)] = &[
    (READY, Kind::Gauge, "1 while the sink consumes and writes; 0 while it starts, stops, or waits for the database with its partitions paused."),
    (BATCHES, Kind::Counter, "Batches committed in the database."),
    (RECORDS, Kind::Counter, "Notification records in committed batches."),
    (ROWS_INSERTED, Kind::Counter, "Rows inserted by committed batches."),
    (ROWS_CONFLICTED, Kind::Counter, "Rows that were stored already (a redo after a crash, a rebalance or an unknown commit)."),
    (DEAD_LETTERS, Kind::Counter, "Records stored as dead letters in committed batches, by class."),
    (BATCH_SECONDS, Kind::Histogram, "Time to write and commit one batch."),
    (DB_OUTAGES, Kind::Counter, "Database outages: the database stopped answering and the partitions were paused."),
    (DB_OUTAGE_SECONDS, Kind::Histogram, "How long each database outage lasted, until the partitions were resumed."),
    (ASSIGNED_PARTITIONS, Kind::Gauge, "Partitions of the notifications topic this instance owns."),
    (PAUSED_PARTITIONS, Kind::Gauge, "Owned partitions paused (by a database outage)."),
];

/// Registers every metric with its help text, at zero (not ready: the sink is starting).
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    for &(name, kind, help) in CATALOGUE {
        match kind {
            Kind::Counter => describe_counter!(name, Unit::Count, help),
            Kind::Gauge => describe_gauge!(name, help),
            Kind::Histogram => describe_histogram!(name, Unit::Seconds, help),
        }
    }
    for name in [BATCHES, RECORDS, ROWS_INSERTED, ROWS_CONFLICTED, DB_OUTAGES] {
        counter!(name).increment(0);
    }
    ready(false);
    partitions(0, 0);
    // Registered without a sample: rendered with every bucket at zero.
    for name in [BATCH_SECONDS, DB_OUTAGE_SECONDS] {
        let _ = histogram!(name);
    }
}

/// Ready (consuming and writing) or not (starting, or paused by an outage).
pub fn ready(ready: bool) {
    gauge!(READY).set(if ready { 1.0 } else { 0.0 });
}

/// A batch committed in the database.
pub fn batch_written(w: &Written, records: usize, took: Duration) {
    counter!(BATCHES).increment(1);
    counter!(RECORDS).increment(records as u64);
    counter!(ROWS_INSERTED).increment(w.inserted);
    // Rows that were stored already: a redo after a crash, a rebalance or an unknown commit.
    counter!(ROWS_CONFLICTED).increment(w.conflicted);
    for (class, n) in &w.dead_letters {
        counter!(DEAD_LETTERS, "class" => *class).increment(*n);
    }
    histogram!(BATCH_SECONDS).record(took.as_secs_f64());
}

/// The database became unavailable (the partitions are paused).
pub fn outage_started() {
    counter!(DB_OUTAGES).increment(1);
    ready(false);
}

/// The database answers again (the partitions are resumed).
pub fn outage_ended(took: Duration) {
    histogram!(DB_OUTAGE_SECONDS).record(took.as_secs_f64());
    ready(true);
}

/// Partitions owned now, and how many of them are paused; set after every assign, revoke, pause
/// and resume, so a partition paused by a past outage shows.
pub fn partitions(owned: usize, paused: usize) {
    gauge!(ASSIGNED_PARTITIONS).set(owned as f64);
    gauge!(PAUSED_PARTITIONS).set(paused as f64);
}
