//! How an instance of a stage (alert-pipeline, alert-sink, alert-deliver) is named and how it
//! joins its consumer group: `--instance-id`, `--static-membership`, `--dynamic-membership`,
//! `--group-protocol`, the same flags and the same rules for the three.
//!
//! # The group protocol
//! `--group-protocol classic|consumer` (or `GROUP_PROTOCOL`): the classic protocol (the default
//! until the rebalance benchmark of issue 44 says otherwise), or KIP-848's `consumer` protocol
//! (Kafka 4.0 or later), where the broker assigns the partitions and each member gives up only
//! what moves, without a group-wide barrier. The stage's group consumer speaks it; readers and
//! probes never join a group. Under `consumer`, librdkafka 2.12 refuses `session.timeout.ms`,
//! `heartbeat.interval.ms`, `partition.assignment.strategy` and `group.protocol.type` on the
//! client (they are the broker's): this project sets none of them then, and one given with `-X`
//! or the config file is refused at start, naming it ([`crate::kafka::KafkaConfig::with_group_protocol`],
//! whose module doc cites librdkafka). `-X group.protocol` is refused in favour of the flag.
//!
//! Static membership under `consumer`: supported by librdkafka, but a member whose instance id
//! is still held by a member that did not leave (a predecessor SIGKILLed, frozen, or on a
//! machine that vanished) is refused by the broker with UNRELEASED_INSTANCE_ID, fatal in
//! librdkafka, until the holder's session expires (the broker's
//! `group.consumer.session.timeout.ms`, 45 s by default): the restart exits 1 saying so, and
//! its supervisor's next restart after that session gets the partitions. A clean stop releases
//! the id at once. The classic protocol fenced the older member instead.
//!
//! # Dynamic membership by default, static opt-in
//! As in Kafka Streams. Static membership (KIP-345, `group.instance.id`) lets a restart within
//! `session.timeout.ms` take its partitions back without a rebalance, but with librdkafka's
//! classic protocol (JoinGroup v5) and cooperative-sticky it can leave partitions without an
//! owner for good: a member that revokes partitions in the first round of a rebalance and dies
//! before the second comes back with the same `group.instance.id` into a Stable group, the
//! broker hands it its cached first-round assignment without a rebalance, and nobody is ever
//! given what it revoked. `tests/membership.rs` reproduces it: 7 runs of 7 under static
//! membership left 3 of 6 partitions without an owner (still so 30 s after the restart), 0 of 7
//! under dynamic membership (every partition owned again about one session timeout after the
//! restart). docs/pipeline.md, "Group membership", has the figures and the trade-off.
//!
//! # The instance id
//! It names the transactional id of the pipeline and the deliverer (`<app>-<instance>`,
//! `<group>-<instance>`) and, under static membership, the `group.instance.id`. Two replicas
//! with one id fence each other's transactions, so it never silently defaults to one value for
//! every replica: without `--instance-id` (or `INSTANCE_ID`) a random id is drawn for the
//! process and logged. A stable id per replica (a StatefulSet's pod name) is still better: a
//! restart then fences its predecessor and aborts the transaction it left open at once, instead
//! of after the transaction timeout. Static membership needs a given id.

use crate::kafka::config::GroupProtocol;
use anyhow::bail;
use clap::{Args, ValueEnum};
use tracing::info;

/// `--instance-id`, `--static-membership`, `--dynamic-membership`, as every stage takes them.
#[derive(Debug, Clone, Default, Args)]
pub struct MembershipArgs {
    /// Instance id: unique per replica and stable across its restarts (a StatefulSet pod name).
    /// It names the instance's transactional id (alert-pipeline: <app>-<instance>,
    /// alert-deliver: <group>-<instance>), so a restart fences its predecessor, and, with
    /// --static-membership, its group.instance.id (<group>-<instance> for alert-sink and
    /// alert-deliver). Without one, a random id is drawn at start and logged.
    #[arg(long, env = "INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// Static group membership (group.instance.id from the instance id; needs --instance-id): a
    /// restart within session.timeout.ms takes its partitions back without a rebalance. Opt-in:
    /// an instance that dies between the two rounds of a cooperative rebalance and comes back
    /// within its session timeout can leave partitions without an owner (docs/pipeline.md,
    /// "Group membership").
    #[arg(long, conflicts_with = "dynamic_membership")]
    pub static_membership: bool,
    /// Dynamic group membership: the default; kept so that existing command lines still run.
    #[arg(long)]
    pub dynamic_membership: bool,
    /// The consumer group protocol: classic (the default for now), or consumer (KIP-848, Kafka
    /// 4.0 or later: the broker assigns, each member revokes only what moves). Under consumer
    /// the session timeout, heartbeat interval and assignor are the broker's
    /// (group.consumer.session.timeout.ms, 45 s by default; -X group.remote.assignor picks
    /// uniform or range), so -X session.timeout.ms, heartbeat.interval.ms,
    /// partition.assignment.strategy and group.protocol.type are refused; and a static member
    /// restarted while its crashed predecessor still holds its instance id is refused until the
    /// broker expires that session (docs/pipeline.md, "Group membership").
    #[arg(long, value_enum, env = "GROUP_PROTOCOL", default_value = "classic")]
    pub group_protocol: GroupProtocolArg,
}

/// `--group-protocol`'s values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum GroupProtocolArg {
    #[default]
    Classic,
    Consumer,
}

impl From<GroupProtocolArg> for GroupProtocol {
    fn from(p: GroupProtocolArg) -> Self {
        match p {
            GroupProtocolArg::Classic => GroupProtocol::Classic,
            GroupProtocolArg::Consumer => GroupProtocol::Consumer,
        }
    }
}

/// The resolved identity of one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The instance id given, or the one drawn for this process.
    pub instance_id: String,
    /// Static group membership was asked for.
    pub static_membership: bool,
    /// The group protocol of the stage's group consumer.
    pub group_protocol: GroupProtocol,
}

impl MembershipArgs {
    /// The instance id and the membership, checked: an empty id, or static membership without a
    /// given id, are refused.
    pub fn resolve(&self) -> anyhow::Result<Membership> {
        let instance_id = match self.instance_id.as_deref().map(str::trim) {
            Some("") => bail!("--instance-id (INSTANCE_ID) is empty: give each replica its own id, or leave it unset for a random one"),
            Some(id) => id.to_owned(),
            None if self.static_membership => bail!(
                "--static-membership needs --instance-id (or INSTANCE_ID), unique per replica and stable across its restarts"
            ),
            None => {
                let id = random_instance_id();
                info!(
                    instance_id = %id,
                    "no --instance-id or INSTANCE_ID: drawn at random for this process; a restart will not fence its predecessor's open transaction (the broker aborts it at its timeout)"
                );
                id
            }
        };
        Ok(Membership {
            instance_id,
            static_membership: self.static_membership,
            group_protocol: self.group_protocol.into(),
        })
    }

    /// `kafka` with the group protocol asked for, refusing the pass-through properties that the
    /// protocol does not allow on the client (see the module doc).
    pub fn kafka(
        &self,
        kafka: crate::kafka::KafkaConfig,
    ) -> anyhow::Result<crate::kafka::KafkaConfig> {
        kafka.with_group_protocol(self.group_protocol.into())
    }
}

/// A fresh instance id: 64 random bits in hex, unique among the replicas of any deployment.
fn random_instance_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        m: MembershipArgs,
    }

    fn parse(args: &[&str]) -> Result<MembershipArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).map(|c| c.m)
    }

    #[test]
    fn dynamic_by_default_with_an_id_of_its_own_per_process() {
        let m = parse(&[]).unwrap();
        let (a, b) = (m.resolve().unwrap(), m.resolve().unwrap());
        assert!(!a.static_membership);
        assert_ne!(
            a.instance_id, b.instance_id,
            "two replicas never share a default id"
        );
        let m = parse(&["--instance-id", "pod-2", "--group-protocol", "classic"])
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!(
            m,
            Membership {
                instance_id: "pod-2".into(),
                static_membership: false,
                group_protocol: GroupProtocol::Classic,
            }
        );
    }

    #[test]
    fn static_is_opt_in_and_needs_a_given_id() {
        let m = parse(&["--static-membership", "--instance-id", "3"]).unwrap();
        assert!(m.resolve().unwrap().static_membership);
        let err = parse(&["--static-membership"])
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(err.to_string().contains("--instance-id"), "{err}");
        assert!(parse(&["--instance-id", " "]).unwrap().resolve().is_err());
        assert!(parse(&["--static-membership", "--dynamic-membership"]).is_err());
        // The old flag still parses: dynamic is what it asked for, and what it gets.
        let m = parse(&["--dynamic-membership"]).unwrap().resolve().unwrap();
        assert!(!m.static_membership);
    }

    #[test]
    fn the_group_protocol_is_classic_unless_asked_and_checks_the_properties() {
        // The default is classic (GROUP_PROTOCOL may be set by the test run itself, the doubled
        // suite, so the parse without the flag is not asserted).
        use clap::CommandFactory;
        let cmd = Cli::command();
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_id() == "group_protocol")
            .unwrap();
        assert_eq!(arg.get_default_values(), ["classic"]);
        assert_eq!(arg.get_env(), Some(std::ffi::OsStr::new("GROUP_PROTOCOL")));
        let m = parse(&["--group-protocol", "classic"]).unwrap();
        assert_eq!(m.resolve().unwrap().group_protocol, GroupProtocol::Classic);
        let m = parse(&[
            "--group-protocol",
            "consumer",
            "--static-membership",
            "--instance-id",
            "a",
        ])
        .unwrap();
        let resolved = m.resolve().unwrap();
        assert_eq!(resolved.group_protocol, GroupProtocol::Consumer);
        assert!(
            resolved.static_membership,
            "static membership stays allowed"
        );
        assert!(parse(&["--group-protocol", "eager"]).is_err());
        let session = crate::kafka::KafkaConfig::new("h:1")
            .with_overrides(&["session.timeout.ms=6000"])
            .unwrap();
        let err = m.kafka(session.clone()).unwrap_err().to_string();
        assert!(err.contains("session.timeout.ms"), "{err}");
        let classic = parse(&["--group-protocol", "classic"]).unwrap();
        assert_eq!(
            classic.kafka(session).unwrap().group_protocol,
            GroupProtocol::Classic
        );
        assert_eq!(
            m.kafka(crate::kafka::KafkaConfig::new("h:1"))
                .unwrap()
                .group_protocol,
            GroupProtocol::Consumer
        );
    }
}
