//! The seeded schedule of a chaos run: which faults, in which order, at which moments.
//!
//! The counts are fixed by the options (so a run is known to contain, say, 20 SIGKILLs); the
//! order, the moments and every later random choice (which instance, how long a broker stays
//! down) come from one ChaCha8 generator seeded with the printed seed, so a failing run can be
//! replayed with the same seed. Moments are spread evenly over the planned chaos time, each
//! jittered within its slot. Broker bounces target, in order of their moments, the transaction
//! coordinator of an instance's transactional id, then the group coordinator, then any broker, in
//! turn: the first two are where exactly-once is most at risk.
//!
//! Instance faults are aimed at a [`Stage`]: in an all-stage run every stage gets the counts of
//! instance faults (so `kills: 15` is 15 SIGKILLs of pipeline instances, 15 of sink instances and
//! 15 of deliver instances), and the database gets its immediate shutdowns.
//!
//! Coordinator kills ([`Fault::CoordinatorKill`]) are counted for the run, not per stage: they
//! take the stages' groups in turn, in data-flow order (pipeline, sink, deliver, pipeline, …).
//! Each is followed by a check window in which every instance of its stage must make progress
//! while the broker is still down, and that needs input: so they are due within `kill_span`, the
//! part of the span that leaves the window before the feed ends.

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

/// The processes of a run, one supervised set of instances each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// `alert-pipeline`: input to notifications.
    Pipeline,
    /// `alert-sink`: notifications to the `alerts` table.
    Sink,
    /// `alert-deliver`: notifications to the subscribers' webhooks.
    Deliver,
}

impl Stage {
    /// Every stage, in data-flow order.
    pub const ALL: [Stage; 3] = [Stage::Pipeline, Stage::Sink, Stage::Deliver];

    /// Its name in logs, log files and the report.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Pipeline => "pipeline",
            Stage::Sink => "sink",
            Stage::Deliver => "deliver",
        }
    }
}

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL an instance of the stage (restarted at once).
    Kill(Stage),
    /// SIGTERM an instance of the stage (restarted once it exited).
    Term(Stage),
    /// SIGSTOP an instance of the stage beyond its timeouts, then SIGCONT.
    Zombie(Stage),
    /// Take a broker down (hard: SIGKILL, clean: SIGTERM) and start it again.
    Bounce { hard: bool, target: Target },
    /// Shut PostgreSQL down at once (`pg_ctl -m immediate`: no checkpoint, clients cut) and start
    /// it again a few seconds later.
    DatabaseDown,
    /// SIGKILL the broker that coordinates the stage's consumer group while its instances commit,
    /// keep it down for longer than a call blocked on it would take to be given up (librdkafka
    /// #5456/#5511: `send_offsets_to_transaction` waits for ever for a dead group coordinator),
    /// start it again, and check that no instance of the stage was left stuck
    /// ([`super::coordinator`]).
    CoordinatorKill(Stage),
}

/// How many faults of each kind. The instance faults are per stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultCounts {
    pub kills: u32,
    pub terms: u32,
    pub zombies: u32,
    pub hard_bounces: u32,
    pub clean_bounces: u32,
    /// Immediate PostgreSQL shutdowns (all-stage runs only).
    pub database_downs: u32,
    /// Kills of a group coordinator's broker, for the run (the stages' groups in turn).
    pub coordinator_kills: u32,
}

impl FaultCounts {
    /// Faults planned for a run of `stages` (the database's only with the sink).
    pub fn total(&self, stages: &[Stage]) -> u32 {
        let per_stage = self.kills + self.terms + self.zombies;
        let db = if stages.contains(&Stage::Sink) {
            self.database_downs
        } else {
            0
        };
        per_stage * stages.len() as u32
            + self.hard_bounces
            + self.clean_bounces
            + db
            + self.coordinator_kills
    }
}

/// A fault and when it is due, from the start of the chaos.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    pub at: Duration,
    pub fault: Fault,
}

/// The schedule: `counts` faults of `stages` in random order over `span`, the coordinator kills
/// over its first `kill_span` (all of it if longer), the stages' groups in turn.
pub fn plan(
    counts: &FaultCounts,
    stages: &[Stage],
    span: Duration,
    kill_span: Duration,
    rng: &mut ChaCha8Rng,
) -> Vec<Planned> {
    let mut faults = Vec::new();
    for &stage in stages {
        faults.extend((0..counts.kills).map(|_| Fault::Kill(stage)));
        faults.extend((0..counts.terms).map(|_| Fault::Term(stage)));
        faults.extend((0..counts.zombies).map(|_| Fault::Zombie(stage)));
    }
    if stages.contains(&Stage::Sink) {
        faults.extend((0..counts.database_downs).map(|_| Fault::DatabaseDown));
    }
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
    let mut planned = spread(faults, span, rng);
    let kills = (stages.iter().cycle())
        .take(counts.coordinator_kills as usize)
        .map(|&s| Fault::CoordinatorKill(s))
        .collect();
    planned.extend(spread(kills, kill_span.min(span), rng));
    // Stable: two faults due at the same moment keep their order.
    planned.sort_by_key(|p| p.at);
    planned
}

/// `faults` in their order, one per equal slot of `span`, each jittered within its slot.
fn spread(faults: Vec<Fault>, span: Duration, rng: &mut ChaCha8Rng) -> Vec<Planned> {
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

/// One line of what the schedule holds, by kind (the runner logs it when the chaos starts).
pub fn summary(planned: &[Planned]) -> String {
    let mut kinds: Vec<(String, u32)> = Vec::new();
    for p in planned {
        let kind = match p.fault {
            Fault::Kill(s) => format!("{} SIGKILL", s.name()),
            Fault::Term(s) => format!("{} SIGTERM", s.name()),
            Fault::Zombie(s) => format!("{} zombie", s.name()),
            Fault::Bounce { hard: true, .. } => "hard bounce".to_owned(),
            Fault::Bounce { hard: false, .. } => "clean bounce".to_owned(),
            Fault::DatabaseDown => "PostgreSQL shutdown".to_owned(),
            Fault::CoordinatorKill(s) => format!("coordinator kill ({} group)", s.name()),
        };
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((kind, 1)),
        }
    }
    kinds.sort();
    let parts: Vec<String> = kinds.iter().map(|(k, n)| format!("{n}× {k}")).collect();
    parts.join(", ")
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
            database_downs: 3,
            coordinator_kills: 0,
        };
        let span = Duration::from_secs(600);
        let pipeline = [Stage::Pipeline];
        let p = plan(
            &counts,
            &pipeline,
            span,
            span,
            &mut ChaCha8Rng::seed_from_u64(9),
        );
        assert_eq!(
            p,
            plan(
                &counts,
                &pipeline,
                span,
                span,
                &mut ChaCha8Rng::seed_from_u64(9)
            )
        );
        assert_eq!(p.len() as u32, counts.total(&pipeline));
        assert!(p.windows(2).all(|w| w[0].at < w[1].at) && p.iter().all(|e| e.at < span));
        let count = |f: fn(&Fault) -> bool| p.iter().filter(|e| f(&e.fault)).count();
        assert_eq!(count(|f| *f == Fault::Kill(Stage::Pipeline)), 20);
        assert_eq!(
            count(|f| *f == Fault::DatabaseDown),
            0,
            "no sink, no database"
        );
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

    #[test]
    fn an_all_stage_plan_has_the_instance_faults_of_each_stage_and_the_database_downs() {
        let counts = FaultCounts {
            kills: 15,
            terms: 5,
            zombies: 1,
            hard_bounces: 2,
            clean_bounces: 2,
            database_downs: 3,
            coordinator_kills: 0,
        };
        let p = plan(
            &counts,
            &Stage::ALL,
            Duration::from_secs(900),
            Duration::from_secs(900),
            &mut ChaCha8Rng::seed_from_u64(3),
        );
        assert_eq!(p.len() as u32, counts.total(&Stage::ALL));
        for stage in Stage::ALL {
            let of = |want: Fault| p.iter().filter(|e| e.fault == want).count();
            assert_eq!(
                (
                    of(Fault::Kill(stage)),
                    of(Fault::Term(stage)),
                    of(Fault::Zombie(stage))
                ),
                (15, 5, 1),
                "{stage:?}"
            );
        }
        let downs = p.iter().filter(|e| e.fault == Fault::DatabaseDown).count();
        assert_eq!(downs, 3);
    }

    #[test]
    fn coordinator_kills_take_the_stages_groups_in_turn_within_the_kill_span() {
        let counts = FaultCounts {
            kills: 3,
            terms: 3,
            zombies: 1,
            hard_bounces: 1,
            clean_bounces: 1,
            database_downs: 2,
            coordinator_kills: 4,
        };
        let (span, kill_span) = (Duration::from_secs(600), Duration::from_secs(400));
        let p = plan(
            &counts,
            &Stage::ALL,
            span,
            kill_span,
            &mut ChaCha8Rng::seed_from_u64(5),
        );
        assert_eq!(p.len() as u32, counts.total(&Stage::ALL));
        assert!(p.windows(2).all(|w| w[0].at <= w[1].at) && p.iter().all(|e| e.at < span));
        let kills: Vec<(Duration, Stage)> = p
            .iter()
            .filter_map(|e| match e.fault {
                Fault::CoordinatorKill(s) => Some((e.at, s)),
                _ => None,
            })
            .collect();
        let stages: Vec<Stage> = kills.iter().map(|(_, s)| *s).collect();
        assert_eq!(
            stages,
            [
                Stage::Pipeline,
                Stage::Sink,
                Stage::Deliver,
                Stage::Pipeline
            ]
        );
        assert!(kills.iter().all(|(at, _)| *at < kill_span), "{kills:?}");
        let pipeline_only = plan(
            &counts,
            &[Stage::Pipeline],
            span,
            kill_span,
            &mut ChaCha8Rng::seed_from_u64(5),
        );
        let on_pipeline = pipeline_only
            .iter()
            .filter(|e| e.fault == Fault::CoordinatorKill(Stage::Pipeline))
            .count();
        assert_eq!(on_pipeline, 4);
        assert!(
            summary(&p).contains("2× coordinator kill (pipeline group)"),
            "{}",
            summary(&p)
        );
    }
}
