//! A fatal error of a stage's group consumer, said for what it means.
//!
//! librdkafka makes a few group errors fatal: the consumer is unusable after one, and every stage
//! stops on it (exit 1) for its supervisor to start it again. Two come from static membership
//! (`group.instance.id`), and each protocol raises its own (librdkafka's INTRODUCTION.md,
//! "Static Group Membership" under KIP-848):
//! - classic: FENCED_INSTANCE_ID to the *older* member, when a newer one joins with its id;
//! - consumer (KIP-848): UNRELEASED_INSTANCE_ID to the *newer* member, while the older one has
//!   not left (SIGKILLed, frozen): the broker releases the id only when that member's session
//!   expires (`group.consumer.session.timeout.ms`, 45 s by default). librdkafka 2.12.1 makes it
//!   fatal (`rd_kafka_cgrp_handle_ConsumerGroupHeartbeat`, src/rdkafka_cgrp.c).

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

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
}
