//! How long this process was away: stopped (SIGSTOP), in a paused VM or container, or not
//! scheduled at all, as opposed to running or waiting for an answer.
//!
//! Why: a transactional producer refused as fenced cannot tell from the error who fenced it
//! ([`super::txn`], `# Fences`). Its coordinator aborting a transaction that outlived its timeout
//! and a newer process registering the same transactional id get the same answer. What this
//! process can know is whether it was there meanwhile: a transaction that timed out while the
//! process was awake (waiting on a frozen or lost coordinator) was aborted by the broker, and the
//! id is still its own; a transaction that timed out because the process was away may have been
//! ended by a replacement that registered the id meanwhile, unseen.
//!
//! How: one thread wakes every [`TICK`] and notes the time. A wake later than [`TICK`] +
//! [`SLACK`] counts the gap, less one tick, as time away; a shorter delay is a busy machine's
//! scheduling and counts for nothing. A reading adds the gap in progress (now since the last
//! wake), so whichever thread runs first after a SIGCONT, the absence is counted.
//!
//! The clock is `Instant`'s, which goes on while the process is stopped (CLOCK_MONOTONIC). The
//! thread holds nothing but the clock, so it is detached and ends with the process (unlike the
//! watchers of [`crate::background`], which hold librdkafka clients).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tracing::warn;

/// How often the clock's thread wakes.
pub const TICK: Duration = Duration::from_millis(100);

/// How much later than [`TICK`] a wake may come before the gap counts as time away: more than
/// the scheduling delays of a loaded machine, far less than a stopped process's absence.
pub const SLACK: Duration = Duration::from_secs(1);

/// The time away of one process, as its thread's wakes show it.
#[derive(Debug)]
pub struct Clock {
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
struct State {
    /// The last wake.
    last: Instant,
    /// The gaps counted so far.
    away: Duration,
}

/// The time away that a gap of `gap` between two wakes counts for.
fn counted(gap: Duration) -> Duration {
    if gap > TICK + SLACK {
        gap - TICK
    } else {
        Duration::ZERO
    }
}

impl Clock {
    /// A clock that nothing has woken yet, started at `now`.
    pub fn new(now: Instant) -> Self {
        Clock {
            state: Mutex::new(State {
                last: now,
                away: Duration::ZERO,
            }),
        }
    }

    /// A wake of the clock's thread at `now`.
    pub fn wake(&self, now: Instant) {
        // The guarded value is two plain numbers, never left half-updated: a poisoned lock is fine.
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let gap = now.saturating_duration_since(s.last);
        s.away += counted(gap);
        s.last = s.last.max(now);
    }

    /// The time away up to `now`, the gap since the last wake included.
    pub fn away(&self, now: Instant) -> Duration {
        let s = *self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.away + counted(now.saturating_duration_since(s.last))
    }
}

/// The clock of this process, its thread started on the first call; `None` if the thread could
/// not be started (said once, at WARN): then nothing shows that the process was there.
pub fn process() -> Option<Arc<Clock>> {
    static CLOCK: OnceLock<Option<Arc<Clock>>> = OnceLock::new();
    CLOCK
        .get_or_init(|| {
            let clock = Arc::new(Clock::new(Instant::now()));
            let ticking = Arc::clone(&clock);
            let started = std::thread::Builder::new()
                .name("away-clock".into())
                .spawn(move || loop {
                    std::thread::sleep(TICK);
                    ticking.wake(Instant::now());
                });
            match started {
                Ok(_) => Some(clock),
                Err(e) => {
                    warn!(error = %e, "the away clock's thread could not be started: a fenced producer is not made again");
                    None
                }
            }
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_wake_counts_as_time_away_a_punctual_one_does_not() {
        let t0 = Instant::now();
        let c = Clock::new(t0);
        let s = Duration::from_millis;
        c.wake(t0 + s(100));
        // A loaded machine's delay: not away.
        c.wake(t0 + s(1_000));
        assert_eq!(c.away(t0 + s(1_000)), Duration::ZERO);
        // Stopped 15 s: away 15 s, less the tick the thread would have slept anyway.
        c.wake(t0 + s(16_000));
        assert_eq!(c.away(t0 + s(16_000)), s(14_900));
        c.wake(t0 + s(16_100));
        assert_eq!(c.away(t0 + s(16_100)), s(14_900));
    }

    #[test]
    fn the_gap_in_progress_counts_before_the_thread_wakes() {
        let t0 = Instant::now();
        let c = Clock::new(t0);
        let s = Duration::from_millis;
        // Just after a SIGCONT, another thread asks before the clock's thread has woken.
        assert_eq!(c.away(t0 + s(20_000)), s(19_900));
        assert_eq!(c.away(t0 + s(500)), Duration::ZERO);
        // The wake then counts the same gap, once.
        c.wake(t0 + s(20_000));
        assert_eq!(c.away(t0 + s(20_050)), s(19_900));
    }

    #[test]
    fn the_process_clock_ticks() {
        let c = process().expect("the clock's thread starts");
        let then = Instant::now();
        std::thread::sleep(TICK * 5);
        let last = c.state.lock().expect("clock").last;
        assert!(last > then, "its thread woke meanwhile");
    }
}
