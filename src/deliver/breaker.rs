//! A circuit breaker per subscriber: the state machine, pure (time is passed in).
//!
//! Why: a batch's transaction waits for the batch's HTTP calls, so an endpoint that hangs (takes
//! the connection, never answers) would hold every batch, and every other subscriber's deliveries
//! with it, for as long as it hangs. After `failures` consecutive failed calls (a 5xx or 408, a
//! timeout, a refused or broken connection, or no answer within the batch's delivery deadline)
//! the subscriber's circuit **opens**: for `cooldown` its deliveries are not tried at all but
//! handed to the next retry bucket at once (class `circuit_open`). After the cool-down the next
//! delivery is a **probe** (half-open, the only call let through): an answer closes the circuit,
//! a failure opens it for another cool-down.
//!
//! ```text
//!            failure × N                    cool-down over: one probe
//!  Closed ─────────────────► Open{until} ─────────────────────────────► HalfOpen
//!    ▲                          ▲                                          │
//!    └── probe answered ────────┼──────────────────────────────────────────┤
//!                               └───────────── probe failed ───────────────┘
//! ```
//!
//! Any answer that is not a 5xx or 408 counts as a success here (a 4xx, 410 or 429 comes back
//! at once: the endpoint is up and says what it wants, and `Retry-After` is honoured per record).
//! Results of calls made before the circuit opened that arrive while it is open or half-open are
//! ignored: only the probe decides. `failures == 0` turns the breaker off.

use std::time::{Duration, Instant};

/// Breaker settings (`--breaker-failures`, `--breaker-cooldown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failed calls that open the circuit; 0: never open.
    pub failures: u32,
    /// How long an open circuit skips its subscriber before a probe.
    pub cooldown: Duration,
}

/// Default `--breaker-failures`.
pub const DEFAULT_FAILURES: u32 = 3;
/// Default `--breaker-cooldown`: the default first bucket's delay, so a skipped delivery is due
/// about when the probe may have closed the circuit again.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(5);

/// Where a subscriber's circuit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Calls go through; `failures`: consecutive failed calls so far.
    Closed { failures: u32 },
    /// Calls are skipped until `until`.
    Open { until: Instant },
    /// One probe is under way; the other calls are skipped.
    HalfOpen,
}

impl State {
    /// The gauge value: 0 closed, 1 open, 2 half-open.
    pub fn gauge(self) -> f64 {
        match self {
            State::Closed { .. } => 0.0,
            State::Open { .. } => 1.0,
            State::HalfOpen => 2.0,
        }
    }
}

/// What a delivery may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Make the call; report it with [`Breaker::call_done`].
    Call,
    /// Make the call as the half-open probe; report it with [`Breaker::probe_done`], always.
    Probe,
    /// Do not call: the circuit is open (or a probe is under way).
    Skip,
}

/// One subscriber's breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    config: BreakerConfig,
    state: State,
}

impl Breaker {
    pub fn new(config: BreakerConfig) -> Self {
        Breaker {
            config,
            state: State::Closed { failures: 0 },
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// Whether a delivery at `now` may call; an open circuit whose cool-down is over turns
    /// half-open and lets this one call through as the probe.
    pub fn admit(&mut self, now: Instant) -> Admission {
        match self.state {
            State::Closed { .. } => Admission::Call,
            State::Open { until } if now >= until => {
                self.state = State::HalfOpen;
                Admission::Probe
            }
            State::Open { .. } | State::HalfOpen => Admission::Skip,
        }
    }

    /// A call admitted with [`Admission::Call`] ended: `ok` if the endpoint answered (see the
    /// module doc for what counts).
    pub fn call_done(&mut self, ok: bool, now: Instant) {
        let State::Closed { failures } = self.state else {
            return;
        };
        self.state = match ok {
            true => State::Closed { failures: 0 },
            false if self.config.failures > 0 && failures + 1 >= self.config.failures => {
                self.open(now)
            }
            false => State::Closed {
                failures: failures.saturating_add(1),
            },
        };
    }

    /// The probe ended: an answer closes the circuit, a failure (or a probe that could not be
    /// made) opens it for another cool-down.
    pub fn probe_done(&mut self, ok: bool, now: Instant) {
        if self.state != State::HalfOpen {
            return;
        }
        self.state = if ok {
            State::Closed { failures: 0 }
        } else {
            self.open(now)
        };
    }

    fn open(&self, now: Instant) -> State {
        State::Open {
            until: now + self.config.cooldown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOLDOWN: Duration = Duration::from_secs(5);

    fn breaker(failures: u32) -> Breaker {
        Breaker::new(BreakerConfig {
            failures,
            cooldown: COOLDOWN,
        })
    }

    #[test]
    fn opens_after_n_consecutive_failures_only() {
        let t0 = Instant::now();
        let mut b = breaker(3);
        b.call_done(false, t0);
        b.call_done(false, t0);
        b.call_done(true, t0); // a success in between starts the count again
        b.call_done(false, t0);
        b.call_done(false, t0);
        assert_eq!(b.state(), State::Closed { failures: 2 });
        assert_eq!(b.admit(t0), Admission::Call);
        b.call_done(false, t0);
        assert_eq!(
            b.state(),
            State::Open {
                until: t0 + COOLDOWN
            }
        );
        assert_eq!(b.state().gauge(), 1.0);
    }

    #[test]
    fn skips_while_open_then_lets_one_probe_through() {
        let t0 = Instant::now();
        let mut b = breaker(1);
        b.call_done(false, t0);
        assert_eq!(
            b.admit(t0 + COOLDOWN - Duration::from_millis(1)),
            Admission::Skip
        );
        let t1 = t0 + COOLDOWN;
        assert_eq!(b.admit(t1), Admission::Probe);
        assert_eq!(b.state(), State::HalfOpen);
        assert_eq!(b.state().gauge(), 2.0);
        assert_eq!(b.admit(t1), Admission::Skip, "one probe at a time");
        // Late results of calls made before the circuit opened do not decide.
        b.call_done(true, t1);
        assert_eq!(b.state(), State::HalfOpen);
    }

    #[test]
    fn a_probe_closes_or_reopens() {
        let t0 = Instant::now();
        let mut b = breaker(2);
        b.call_done(false, t0);
        b.call_done(false, t0);
        let t1 = t0 + COOLDOWN;
        assert_eq!(b.admit(t1), Admission::Probe);
        let t2 = t1 + Duration::from_secs(2);
        b.probe_done(false, t2);
        assert_eq!(
            b.state(),
            State::Open {
                until: t2 + COOLDOWN
            },
            "a new cool-down from the failed probe"
        );
        assert_eq!(b.admit(t2 + COOLDOWN), Admission::Probe);
        b.probe_done(true, t2 + COOLDOWN);
        assert_eq!(b.state(), State::Closed { failures: 0 });
        assert_eq!(b.admit(t2 + COOLDOWN), Admission::Call);
        // A closed circuit needs N failures again.
        b.call_done(false, t2 + COOLDOWN);
        assert_eq!(b.state(), State::Closed { failures: 1 });
    }

    #[test]
    fn results_while_open_are_ignored_and_zero_turns_it_off() {
        let t0 = Instant::now();
        let mut b = breaker(1);
        b.call_done(false, t0);
        b.call_done(true, t0 + Duration::from_secs(1));
        b.probe_done(true, t0 + Duration::from_secs(1)); // no probe was admitted
        assert_eq!(
            b.state(),
            State::Open {
                until: t0 + COOLDOWN
            }
        );
        let mut off = breaker(0);
        for _ in 0..100 {
            off.call_done(false, t0);
        }
        assert_eq!(off.admit(t0), Admission::Call);
        assert_eq!(off.state().gauge(), 0.0);
    }
}
