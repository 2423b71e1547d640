//! When the open batch commits: its commit interval counts from when its oldest record arrived,
//! not from when the batch was opened.
//!
//! The loop commits a batch once it is `commit_interval` old or `max_batch` records big. Counting
//! from the open would make a tick that arrives while the previous batch commits wait for that
//! commit, then for a whole interval, then for its own commit: two commits and an interval, where
//! one of each would do (bench/RESULTS.md section 11.1 has the measurements). So the clock
//! starts at the arrival of the batch's oldest record (its record timestamp, mapped onto the
//! monotonic clock), clamped:
//! - never before the previous commit began: records of a backlog, or of a partition just
//!   assigned, are old, and their age says nothing about how long this batch has been waiting;
//!   with no previous commit (start, after an abort) it counts from the open;
//! - never more than half an interval before the open: if commits take longer than the interval,
//!   the batch still collects for half an interval, so slow commits cannot shrink batches to a
//!   record each, which would make every commit slower still;
//! - never after the open: a producer clock ahead of ours is ignored.
//!
//! A producer clock behind ours can only move the clock back within those bounds.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What the run loop knows of the open batch, to decide when it commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenBatch {
    /// Records processed in it.
    pub records: u64,
    /// When it was opened (its first record processed).
    pub opened: Instant,
    /// When its oldest record arrived, as far as its record timestamp tells.
    pub oldest_arrival: Instant,
    /// When the commit before it began, if it followed a commit (not a start or an abort).
    pub previous_commit: Option<Instant>,
}

impl OpenBatch {
    /// When the batch is due to commit.
    pub fn deadline(&self, interval: Duration) -> Instant {
        let half_back = self.opened.checked_sub(interval / 2).unwrap_or(self.opened);
        let earliest = self.previous_commit.unwrap_or(self.opened).max(half_back);
        self.oldest_arrival
            .clamp(earliest, self.opened.max(earliest))
            + interval
    }
}

/// When a record with this timestamp (milliseconds since the epoch) arrived, on the monotonic
/// clock; `now` if it has no timestamp, one in the future, or one too old to represent.
pub fn arrival(timestamp_ms: Option<i64>, now: Instant) -> Instant {
    let Some(ts) = timestamp_ms else { return now };
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let age = Duration::from_millis(wall.saturating_sub(ts).max(0) as u64);
    now.checked_sub(age).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(100);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A batch opened at t0 + `opened`, oldest record at t0 + `arrived`, previous commit at
    /// t0 + `previous`; returns its deadline as an offset from t0.
    fn due(opened: u64, arrived: u64, previous: Option<u64>) -> Duration {
        let t0 = Instant::now();
        let batch = OpenBatch {
            records: 1,
            opened: t0 + ms(opened),
            oldest_arrival: t0 + ms(arrived),
            previous_commit: previous.map(|p| t0 + ms(p)),
        };
        batch.deadline(INTERVAL) - t0
    }

    #[test]
    fn a_record_that_waited_behind_a_commit_is_due_one_interval_after_it_arrived() {
        // The previous commit ran from 1000 to 1040; the record arrived at 1010 and opened the
        // batch when the commit was done.
        assert_eq!(due(1040, 1010, Some(1000)), ms(1110));
    }

    #[test]
    fn an_idle_processor_counts_from_the_record_that_opens_the_batch() {
        assert_eq!(due(5000, 5000, Some(1000)), ms(5100));
    }

    #[test]
    fn a_backlog_counts_from_the_previous_commit_not_from_its_age() {
        // Records of an hour ago; the previous commit began 30 ms before the open.
        assert_eq!(due(3_600_030, 0, Some(3_600_000)), ms(3_600_100));
    }

    #[test]
    fn without_a_previous_commit_the_clock_starts_at_the_open() {
        // The first batch after a start or an abort: old records say nothing of this batch.
        assert_eq!(due(2000, 500, None), ms(2100));
    }

    #[test]
    fn a_batch_after_a_slow_commit_still_collects_for_half_an_interval() {
        // The previous commit took 180 ms; counting from its start the batch would be overdue.
        assert_eq!(due(1180, 1000, Some(1000)), ms(1230));
    }

    #[test]
    fn a_timestamp_from_a_clock_ahead_of_ours_counts_as_the_open() {
        assert_eq!(due(1040, 9000, Some(1000)), ms(1140));
    }

    #[test]
    fn arrival_maps_a_record_timestamp_onto_the_monotonic_clock() {
        let now = Instant::now();
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let arrived = arrival(Some(wall_ms - 250), now);
        let age = now - arrived;
        // The wall clock moved on a little between the two readings.
        assert!(age >= ms(250) && age < ms(350), "age {age:?}");
        assert_eq!(arrival(None, now), now);
        assert_eq!(arrival(Some(wall_ms + 60_000), now), now);
    }
}
