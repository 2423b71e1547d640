//! The broker bounce: one broker of the cluster stopped (SIGTERM, a controlled shutdown) or
//! killed (SIGKILL), left down for a while and started again, on a thread of its own so that the
//! main loop keeps the instances going meanwhile. Its target is the one the schedule names
//! ([`Target`]): the transaction coordinator of an instance's transactional id, the coordinator
//! of the pipeline's group, or any broker; a coordinator that cannot be located gives way to a
//! random broker, and the report says so in the bounce's role.
//!
//! ```text
//!   thread: every ISR complete ─► locate the target ─► stop/kill ─► down for a while ─► start
//!           ─► every ISR complete ─► Bounce (into the report)
//! ```
//!
//! Every ISR is complete before a broker goes down and again before the next fault may take one,
//! so no partition drops below min.insync.replicas by the runner's doing. Driving the brokers
//! and locating the coordinators is [`cluster`](super::cluster)'s; the other fault that takes a
//! broker down is the coordinator kill ([`coordinator`](super::coordinator)).

use super::cluster::{Cluster, Stop};
use super::plan::Target;
use super::REPLICATION_TIMEOUT;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// One broker bounce, as it happened.
#[derive(Debug, Clone)]
pub struct Bounce {
    pub broker: i32,
    pub hard: bool,
    /// Why this broker: the coordinator it was, or "any".
    pub role: String,
    pub down: Duration,
    /// From the start command to every ISR complete again.
    pub recovered: Duration,
}

/// One broker bounce: locate the target, take it down, leave it down for `down`, start it, wait
/// until every ISR is complete again.
pub(super) fn bounce(
    cluster: &Cluster,
    how: Stop,
    target: Target,
    down: Duration,
    txn_id: &str,
    group: &str,
    any: i32,
) -> anyhow::Result<Bounce> {
    cluster.wait_fully_replicated(REPLICATION_TIMEOUT)?;
    let located = match target {
        Target::TransactionCoordinator => Some(
            cluster
                .transaction_coordinator(txn_id)
                .map(|b| (b, format!("transaction coordinator of {txn_id}"))),
        ),
        Target::GroupCoordinator => Some(
            cluster
                .group_coordinator(group)
                .map(|b| (b, "group coordinator".to_owned())),
        ),
        Target::Any => None,
    };
    let (broker, role) = match located {
        Some(Ok(found)) => found,
        Some(Err(e)) => {
            warn!(
                error = format!("{e:#}"),
                ?target,
                "coordinator not found; bouncing a random broker"
            );
            (any, format!("any ({target:?} not found)"))
        }
        None => (any, "any".to_owned()),
    };
    info!(
        broker,
        ?how,
        role,
        down_ms = down.as_millis() as u64,
        "bouncing a broker"
    );
    cluster.stop_broker(broker, how)?;
    // How long the broker stays down is the fault itself, not a wait for a condition.
    std::thread::sleep(down);
    let restarted = Instant::now();
    cluster.start_broker(broker)?;
    cluster.wait_fully_replicated(REPLICATION_TIMEOUT)?;
    Ok(Bounce {
        broker,
        hard: how == Stop::Hard,
        role,
        down,
        recovered: restarted.elapsed(),
    })
}
