//! A stage's group consumer: how it leaves its group, and a fatal error said for what it means.
//!
//! # Leaving
//! A stage that stops leaves its group before it closes its consumer, so that the others take
//! its partitions at once rather than a session later ([`leave`]). Closing the consumer is not
//! enough under the classic protocol: librdkafka 2.12.1 loses the LeaveGroup when its close
//! (TERMINATE) arrives while the cooperative unassign that the revoke started is still
//! completing (`rd_kafka_cgrp_incr_unassign_done`, src/rdkafka_cgrp.c, goes on to a full unassign
//! without the leave that its KIP-848 twin does). Seen as 45 s without an owner after 2 of 10
//! SIGTERMs (bench/RESULTS.md, section 18) and in 6 of 8 stops of a lone member
//! (tests/membership.rs). So [`leave`] unsubscribes, serves the revoke, and under classic polls
//! until librdkafka has sent the leave (it clears its member id as it does); only then is the
//! consumer dropped.
//!
//! # Fatal errors
//! librdkafka makes a few group errors fatal: the consumer is unusable after one, and every stage
//! stops on it (exit 1) for its supervisor to start it again. Two come from static membership
//! (`group.instance.id`), and each protocol raises its own (librdkafka's INTRODUCTION.md,
//! "Static Group Membership" under KIP-848):
//! - classic: FENCED_INSTANCE_ID to the *older* member, when a newer one joins with its id;
//! - consumer (KIP-848): UNRELEASED_INSTANCE_ID to the *newer* member, while the older one has
//!   not left (SIGKILLed, frozen): the broker releases the id only when that member's session
//!   expires (`group.consumer.session.timeout.ms`, 45 s by default). librdkafka 2.12.1 makes it
//!   fatal (`rd_kafka_cgrp_handle_ConsumerGroupHeartbeat`, src/rdkafka_cgrp.c).
//!
//! One more is fatal under the consumer protocol only: GROUP_AUTHORIZATION_FAILED in answer to a
//! heartbeat (Read on the group taken away while the stage runs), which the classic protocol
//! reports and retries. That one is an operator's doing, undone by granting the right again, so
//! no stage stops on it: they drop the consumer (and what it held, as a
//! crash would), wait until the broker grants the group again ([`wait_for_group_read`]) and make
//! it again (alert-deliver drops and makes again its whole deliverer, its transactional producer
//! with it). Their new member gets the partitions when the broker expires the old one, which
//! could not leave without the right: its session after its last heartbeat.

use crate::backoff::Setbacks;
use crate::kafka::config::GroupProtocol;
use crate::kafka::KafkaConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often [`leave`] polls while it waits.
const LEAVE_POLL: Duration = Duration::from_millis(100);

/// What [`leave`] got done within its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    /// The stage's revoke callback gave every partition up.
    pub revoked: bool,
    /// librdkafka has sent the leave (classic: LeaveGroup; under the consumer protocol the leave
    /// heartbeat goes with the close, which sends it in every case, so this is true).
    pub leave_sent: bool,
}

/// Leaves the group: unsubscribes, polls `consumer` (serving the revoke, whose callback commits
/// what the stage holds) until `owns_partitions` says the stage gave every partition up, and,
/// under the classic protocol, until librdkafka has sent the LeaveGroup (module doc,
/// `# Leaving`), all within `bound`. What was not done in time is said in the answer, for the
/// caller's log; the consumer's close that follows then leaves as it can.
pub fn leave<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    protocol: GroupProtocol,
    mut owns_partitions: impl FnMut() -> anyhow::Result<bool>,
    bound: Duration,
) -> anyhow::Result<Left> {
    let deadline = Instant::now() + bound;
    consumer.unsubscribe();
    let mut revoked = !owns_partitions()?;
    while !revoked && Instant::now() < deadline {
        let _ = consumer.poll(LEAVE_POLL);
        revoked = !owns_partitions()?;
    }
    let mut leave_sent = protocol == GroupProtocol::Consumer || !has_member_id(consumer);
    while !leave_sent && Instant::now() < deadline {
        let _ = consumer.poll(LEAVE_POLL);
        leave_sent = !has_member_id(consumer);
    }
    Ok(Left {
        revoked,
        leave_sent,
    })
}

/// Whether librdkafka's group handle still has a member id: a classic member clears it as it
/// sends its LeaveGroup (`rd_kafka_cgrp_leave`). rust-rdkafka does not wrap `rd_kafka_memberid`,
/// hence the `unsafe` call. It asks librdkafka's main thread and waits for the answer; the stage's
/// own shutdown bound covers it, as it covers the consumer's close that comes next.
fn has_member_id<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> bool {
    // SAFETY: the client handle is valid while `consumer` is borrowed. rd_kafka_memberid returns
    // NULL or a NUL-terminated copy that the caller owns and frees with rd_kafka_mem_free, once,
    // after it is read here.
    unsafe {
        let rk = consumer.client().native_ptr();
        let id = rdkafka::bindings::rd_kafka_memberid(rk);
        if id.is_null() {
            return false;
        }
        let has = !std::ffi::CStr::from_ptr(id).to_bytes().is_empty();
        rdkafka::bindings::rd_kafka_mem_free(rk, id.cast());
        has
    }
}

/// Whether `e` is the consumer's fatal GROUP_AUTHORIZATION_FAILED (Read on the group refused to
/// a heartbeat under the consumer protocol; module doc).
pub fn is_group_refused(e: &anyhow::Error) -> bool {
    e.downcast_ref::<FatalConsumerError>()
        .is_some_and(|f| f.0 == RDKafkaErrorCode::GroupAuthorizationFailed)
}

/// After a group consumer was stopped by Read on its group refused ([`is_group_refused`]): once
/// per step of the growing back-off (going on from `setbacks`), calls `say` with the setbacks in
/// a row and the back-off, waits it out, and asks the broker whether it still refuses `group`
/// (read through `topic`). Returns true once it does not, or does not answer (the consumer made
/// again finds out, and is stopped again if it is still refused); false when `stop` is set.
/// `beat` is called every poll slice, for the stage's liveness.
pub fn wait_for_group_read(
    kafka: &KafkaConfig,
    group: &str,
    topic: &str,
    setbacks: &mut Setbacks,
    stop: &AtomicBool,
    beat: impl Fn(),
    mut say: impl FnMut(u32, Duration),
) -> bool {
    const SLICE: Duration = Duration::from_millis(100);
    loop {
        let backoff = setbacks.set_back();
        say(setbacks.in_a_row(), backoff);
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            beat();
            std::thread::sleep(SLICE.min(until.saturating_duration_since(Instant::now())));
        }
        match crate::kafka::access::group_read_refused(kafka, group, topic) {
            Ok(true) => continue,
            Ok(false) => {
                tracing::info!(
                    group,
                    "Read on the group granted again: making the group consumer again"
                );
                return true;
            }
            Err(e) => {
                tracing::warn!(
                    group,
                    error = format!("{e:#}"),
                    "could not ask whether the group is refused; making the group consumer again"
                );
                return true;
            }
        }
    }
}

/// A fatal error of the group consumer: the stage stops on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("fatal consumer error: {}", explain(*.0))]
pub struct FatalConsumerError(pub RDKafkaErrorCode);

impl FatalConsumerError {
    /// The fatal error `e` is, if it is one.
    pub fn of(e: &KafkaError) -> Option<Self> {
        match e {
            KafkaError::MessageConsumptionFatal(code) => Some(FatalConsumerError(*code)),
            _ => None,
        }
    }
}

fn explain(code: RDKafkaErrorCode) -> String {
    match code {
        RDKafkaErrorCode::UnreleasedInstanceId => format!(
            "{code}: the group.instance.id of this static member is still held by a member that \
             did not leave the group (a predecessor that was killed or frozen); under \
             --group-protocol consumer the broker refuses the id until that member's session \
             expires (group.consumer.session.timeout.ms, 45 s by default): start again after \
             that, or use dynamic membership"
        ),
        RDKafkaErrorCode::FencedInstanceId => format!(
            "{code}: another member joined the group with this static member's \
             group.instance.id and took its place (do two replicas share an --instance-id?)"
        ),
        RDKafkaErrorCode::GroupAuthorizationFailed => format!(
            "{code}: Read on the consumer group was refused (an ACL removed while running?); \
             under --group-protocol consumer librdkafka makes a refused heartbeat fatal, where \
             the classic protocol backs off and goes on (each stage makes its consumer again \
             once it is granted): grant Read on the group again (scripts/acls.sh names each \
             stage's rights); a stage started again names a right still missing"
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_static_id_says_why_and_what_to_do() {
        let e = KafkaError::MessageConsumptionFatal(RDKafkaErrorCode::UnreleasedInstanceId);
        let said = FatalConsumerError::of(&e).unwrap().to_string();
        assert!(said.contains("session expires"), "{said}");
        assert!(said.contains("dynamic membership"), "{said}");
        let e = KafkaError::MessageConsumptionFatal(RDKafkaErrorCode::GroupAuthorizationFailed);
        let said = FatalConsumerError::of(&e).unwrap().to_string();
        assert!(said.contains("Read on the consumer group"), "{said}");
        assert!(said.contains("grant Read on the group again"), "{said}");
        let e = KafkaError::MessageConsumptionFatal(RDKafkaErrorCode::FencedInstanceId);
        assert!(FatalConsumerError::of(&e)
            .unwrap()
            .to_string()
            .contains("--instance-id"));
        let e = KafkaError::MessageConsumption(RDKafkaErrorCode::UnknownMemberId);
        assert_eq!(
            FatalConsumerError::of(&e),
            None,
            "not fatal: librdkafka rejoins"
        );
    }

    /// Only the fatal refusal of the group is waited out; every other fatal error stops the stage.
    #[test]
    fn only_the_group_refused_for_good_is_waited_out() {
        let fatal = |code| anyhow::Error::from(FatalConsumerError(code));
        assert!(is_group_refused(&fatal(
            RDKafkaErrorCode::GroupAuthorizationFailed
        )));
        assert!(!is_group_refused(&fatal(
            RDKafkaErrorCode::UnreleasedInstanceId
        )));
        assert!(!is_group_refused(&fatal(
            RDKafkaErrorCode::FencedInstanceId
        )));
        assert!(!is_group_refused(&anyhow::Error::from(
            KafkaError::MessageConsumption(RDKafkaErrorCode::GroupAuthorizationFailed)
        )));
        // Context added on the way up keeps it recognisable.
        assert!(is_group_refused(
            &fatal(RDKafkaErrorCode::GroupAuthorizationFailed).context("polling")
        ));
    }
}
