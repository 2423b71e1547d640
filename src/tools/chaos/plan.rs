//! The seeded schedule of a chaos run: which faults, in which order, at which moments.
//!
//! The counts are fixed by the options (so a run is known to contain, say, 20 SIGKILLs); the
//! order, the moments and every later random choice (which instance, how long a broker stays
//! down) come from one ChaCha8 generator seeded with the printed seed, so a failing run can be
//! replayed with the same seed. Moments are spread evenly over the planned chaos time, each
//! jittered within its slot. Broker bounces target, in order of their moments, the transaction
//! coordinator of an instance's transactional id, then the group coordinator, then any broker, in
//! turn: the first two are where exactly-once is most at risk.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

/// Which broker a bounce takes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The coordinator of an instance's transactional id.
    TransactionCoordinator,
    /// The coordinator of the processors' consumer group.
    GroupCoordinator,
    /// Any broker, drawn at random.
    Any,
}

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL an instance (restarted at once).
    Kill,
    /// SIGTERM an instance (restarted once it exited).
    Term,
    /// SIGSTOP an instance beyond its transaction timeout, then SIGCONT.
    Zombie,
    /// Take a broker down (hard: SIGKILL, clean: SIGTERM) and start it again.
    Bounce { hard: bool, target: Target },
}

/// How many faults of each kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultCounts {
    pub kills: u32,
    pub terms: u32,
    pub zombies: u32,
    pub hard_bounces: u32,
    pub clean_bounces: u32,
}

impl FaultCounts {
    pub fn total(&self) -> u32 {
        self.kills + self.terms + self.zombies + self.hard_bounces + self.clean_bounces
    }
}

/// A fault and when it is due, from the start of the chaos.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    pub at: Duration,
    pub fault: Fault,
}

/// The schedule: `counts` faults in random order over `span`.
pub fn plan(counts: &FaultCounts, span: Duration, rng: &mut ChaCha8Rng) -> Vec<Planned> {
    let mut faults = Vec::new();
    faults.extend((0..counts.kills).map(|_| Fault::Kill));
    faults.extend((0..counts.terms).map(|_| Fault::Term));
    faults.extend((0..counts.zombies).map(|_| Fault::Zombie));
    faults.extend((0..counts.hard_bounces).map(|_| Fault::Bounce {
        hard: true,
        target: Target::Any,
    }));
    faults.extend((0..counts.clean_bounces).map(|_| Fault::Bounce {
        hard: false,
        target: Target::Any,
    }));
    faults.shuffle(rng);
    let targets = [
        Target::TransactionCoordinator,
        Target::GroupCoordinator,
        Target::Any,
    ];
    let mut bounces = 0;
    for f in &mut faults {
        if let Fault::Bounce { target, .. } = f {
            *target = targets[bounces % targets.len()];
            bounces += 1;
        }
    }
    let n = faults.len().max(1) as f64;
    faults
        .into_iter()
        .enumerate()
        .map(|(i, fault)| Planned {
            at: span.mul_f64((i as f64 + rng.random_range(0.1..0.9)) / n),
            fault,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_plan_has_the_counts_in_order_within_the_span_and_replays_with_its_seed() {
        let counts = FaultCounts {
            kills: 20,
            terms: 20,
            zombies: 1,
            hard_bounces: 3,
            clean_bounces: 2,
        };
        let span = Duration::from_secs(600);
        let p = plan(&counts, span, &mut ChaCha8Rng::seed_from_u64(9));
        assert_eq!(p, plan(&counts, span, &mut ChaCha8Rng::seed_from_u64(9)));
        assert_eq!(p.len() as u32, counts.total());
        assert!(p.windows(2).all(|w| w[0].at < w[1].at) && p.iter().all(|e| e.at < span));
        let count = |f: fn(&Fault) -> bool| p.iter().filter(|e| f(&e.fault)).count();
        assert_eq!(count(|f| *f == Fault::Kill), 20);
        assert_eq!(count(|f| matches!(f, Fault::Bounce { hard: true, .. })), 3);
        let targets: Vec<Target> = p
            .iter()
            .filter_map(|e| match e.fault {
                Fault::Bounce { target, .. } => Some(target),
                _ => None,
            })
            .collect();
        assert_eq!(
            &targets[..3],
            [
                Target::TransactionCoordinator,
                Target::GroupCoordinator,
                Target::Any
            ]
        );
    }
}
