//! The back-off after setbacks in a row, shared by every loop that redoes work after an abort.
//!
//! An abort rewinds the batch, and the next attempt redoes it at once: the pipeline restores the
//! state of every owned partition, alert-deliver calls the subscribers again. An error that comes
//! back on every attempt (a right refused, a coordinator that keeps failing) would make that a
//! hot loop: restores on every poll, the same requests to every subscriber as fast as the loop
//! spins. So each setback in a row waits a little longer before the next attempt: 100 ms after the
//! first, doubling, at most 5 s, far below `max.poll.interval.ms`; a success resets it.

use std::time::Duration;

/// Back-off after the first setback in a row.
const FIRST: Duration = Duration::from_millis(100);
/// The longest back-off.
const MAX: Duration = Duration::from_secs(5);

/// The back-off after the `n`-th setback in a row (`n` >= 1): 100 ms, 200 ms, 400 ms, … 5 s.
pub fn after(n: u32) -> Duration {
    FIRST
        .saturating_mul(1 << n.saturating_sub(1).min(16))
        .min(MAX)
}

/// Setbacks since the last success.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Setbacks {
    in_a_row: u32,
}

impl Setbacks {
    /// One more setback in a row: the back-off before the next attempt.
    pub fn set_back(&mut self) -> Duration {
        self.in_a_row = self.in_a_row.saturating_add(1);
        after(self.in_a_row)
    }

    /// How many setbacks came since the last success.
    pub fn in_a_row(&self) -> u32 {
        self.in_a_row
    }

    /// A success: the next setback starts from the shortest back-off again. Returns how many
    /// setbacks came before it (for the line that says the work goes on).
    pub fn reset(&mut self) -> u32 {
        std::mem::take(&mut self.in_a_row)
    }
}

#[cfg(test)]
mod tests {
    use super::{after, Setbacks};
    use std::time::Duration;

    #[test]
    fn the_backoff_doubles_per_setback_in_a_row_up_to_five_seconds() {
        let ms: Vec<u128> = (1..=9).map(|n| after(n).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        assert_eq!(after(u32::MAX), Duration::from_secs(5));
    }

    #[test]
    fn a_success_starts_the_backoff_over() {
        let mut s = Setbacks::default();
        assert_eq!(s.set_back(), Duration::from_millis(100));
        assert_eq!(s.set_back(), Duration::from_millis(200));
        assert_eq!(s.reset(), 2);
        assert_eq!(s.in_a_row(), 0);
        assert_eq!(s.set_back(), Duration::from_millis(100));
    }
}
