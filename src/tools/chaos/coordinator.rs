//! The coordinator kill: SIGKILL the broker that coordinates a stage's consumer group while its
//! instances commit, keep it down for longer than any call blocked on it may wait, start it
//! again, and check that no instance of the stage was left stuck.
//!
//! Why a fault of its own: librdkafka's `send_offsets_to_transaction` does not time out while
//! the group coordinator is down (#5456), and it keeps waiting on a stale coordinator entry when
//! that broker does not come back (#5511). A bounce of a few seconds lets such a call go on when
//! the broker returns, so it hides the hang; this fault keeps the broker down past the bound
//! within which each instance must have moved on by itself
//! ([`ChaosOptions::stuck_bound`](super::ChaosOptions::stuck_bound): transaction timeout + 30 s,
//! what issue 20 asks of a process that protects itself).
//!
//! ```text
//!   thread: every ISR complete ─► locate the group's coordinator ─► SIGKILL it ─► Killed ─►
//!           down for `coordinator_down` ─► start it ─► every ISR complete ─► CoordinatorKill
//!   main loop, on Killed: watch every running instance of the stage that was busy (its progress
//!           line in the last 10 s; Instances::watch): each must log its progress line twice, or
//!           exit by itself (restarted as any exit), within the bound; meanwhile no other
//!           instance fault is aimed at it. An idle one (no partitions, no input left) is noted
//!   end:    each watched instance's outcome goes into the report; one stuck fails the run
//! ```
//!
//! The groups are the pipeline's (its app id), the sink's and the deliverer's; the stages take
//! the kills in turn ([`super::plan`]).

use super::cluster::{Cluster, Stop};
use super::instances::Progress;
use super::plan::Stage;
use super::REPLICATION_TIMEOUT;
use anyhow::Context as _;
use std::fmt;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Bound on finding the group's coordinator (each look-up starts a JVM; a group that has just
/// moved may be reported without one for a while).
const LOCATE_TIMEOUT: Duration = Duration::from_secs(90);

/// Sent by the kill's thread the moment the broker is dead, so that the runner watches the
/// instances that are running then.
#[derive(Debug, Clone, Copy)]
pub struct Killed {
    /// The kill's number in the run.
    pub kill: usize,
    pub stage: Stage,
    pub broker: i32,
}

/// One coordinator kill, as it happened.
#[derive(Debug, Clone)]
pub struct CoordinatorKill {
    pub kill: usize,
    pub stage: Stage,
    pub group: String,
    pub broker: i32,
    pub down: Duration,
    /// From the start command to every ISR complete again.
    pub recovered: Duration,
    /// Each instance of the stage running at the kill, and how it came out of it (filled in by
    /// the runner: [`super::instances::Instances::progress`]).
    pub instances: Vec<(String, Progress)>,
}

impl CoordinatorKill {
    /// Instances that neither progressed nor exited within the bound.
    pub fn stuck(&self) -> usize {
        self.instances.iter().filter(|(_, p)| p.stuck()).count()
    }
}

/// The kill itself, on a thread of its own: locate `group`'s coordinator, SIGKILL it, tell the
/// runner (`killed`), keep it down for `down`, start it, wait until every ISR is complete.
pub fn kill(
    cluster: &Cluster,
    kill: usize,
    stage: Stage,
    group: &str,
    down: Duration,
    killed: &Sender<Killed>,
) -> anyhow::Result<CoordinatorKill> {
    cluster.wait_fully_replicated(REPLICATION_TIMEOUT)?;
    let broker = locate(cluster, group)?;
    info!(
        broker,
        group,
        stage = stage.name(),
        down_s = down.as_secs(),
        "killing the group coordinator"
    );
    cluster.stop_broker(broker, Stop::Hard)?;
    // The runner may have stopped listening (its run failed): the kill goes on and ends the same.
    let _ = killed.send(Killed {
        kill,
        stage,
        broker,
    });
    // How long the broker stays dead is the fault itself, not a wait for a condition.
    std::thread::sleep(down);
    let restarted = Instant::now();
    cluster.start_broker(broker)?;
    cluster.wait_fully_replicated(REPLICATION_TIMEOUT)?;
    Ok(CoordinatorKill {
        kill,
        stage,
        group: group.to_owned(),
        broker,
        down,
        recovered: restarted.elapsed(),
        instances: Vec::new(),
    })
}

/// The broker that coordinates `group`, asked until the tool names one or the bound passes: a
/// kill of a random broker would not be this fault, so there is no fallback.
fn locate(cluster: &Cluster, group: &str) -> anyhow::Result<i32> {
    let started = Instant::now();
    loop {
        match cluster.group_coordinator(group) {
            Ok(broker) => return Ok(broker),
            Err(e) if started.elapsed() > LOCATE_TIMEOUT => {
                return Err(e).with_context(|| {
                    format!("the coordinator of {group} was not found within {LOCATE_TIMEOUT:?}")
                })
            }
            Err(e) => warn!(
                error = format!("{e:#}"),
                group, "coordinator not found yet; asking again"
            ),
        }
        std::thread::sleep(Duration::from_secs(1)); // each look-up is a JVM: not in a tight loop
    }
}

impl fmt::Display for CoordinatorKill {
    /// One line: the kill, then each watched instance's outcome.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} group: broker {} killed, down {:.1}s, back and fully replicated in {:.1}s; ",
            self.stage.name(),
            self.broker,
            self.down.as_secs_f64(),
            self.recovered.as_secs_f64()
        )?;
        if self.instances.is_empty() {
            return write!(f, "no instance was running at the kill");
        }
        let outcomes: Vec<String> = self
            .instances
            .iter()
            .map(|(id, p)| format!("instance {id} {p}"))
            .collect();
        write!(f, "{}", outcomes.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_reports_each_instance_and_counts_the_stuck_ones() {
        let mut k = CoordinatorKill {
            kill: 0,
            stage: Stage::Deliver,
            group: "g".to_owned(),
            broker: 2,
            down: Duration::from_secs(70),
            recovered: Duration::from_millis(12_300),
            instances: vec![
                ("0".to_owned(), Progress::Committed(Duration::from_secs(14))),
                (
                    "1".to_owned(),
                    Progress::Exited {
                        status: "exit status: 75".to_owned(),
                        after: Duration::from_secs(41),
                    },
                ),
            ],
        };
        assert_eq!(k.stuck(), 0);
        k.instances
            .push(("2".to_owned(), Progress::Stuck(Duration::from_secs(61))));
        assert_eq!(k.stuck(), 1);
        assert_eq!(
            k.to_string(),
            "deliver group: broker 2 killed, down 70.0s, back and fully replicated in 12.3s; \
             instance 0 progressed 14.0s after; instance 1 exited (exit status: 75) 41.0s after; \
             instance 2 STUCK: no progress and no exit in 61.0s"
        );
    }
}
