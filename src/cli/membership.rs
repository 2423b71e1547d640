//! How an instance of a stage (alert-pipeline, alert-sink, alert-deliver) is named and how it
//! joins its consumer group: `--instance-id`, `--static-membership`, `--dynamic-membership`, the
//! same flags and the same rules for the three.
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
//! restart). The README's "Group membership" has the figures and the trade-off.
//!
//! # The instance id
//! It names the transactional id of the pipeline and the deliverer (`<app>-<instance>`,
//! `<group>-<instance>`) and, under static membership, the `group.instance.id`. Two replicas
//! with one id fence each other's transactions, so it never silently defaults to one value for
//! every replica: without `--instance-id` (or `INSTANCE_ID`) a random id is drawn for the
//! process and logged. A stable id per replica (a StatefulSet's pod name) is still better: a
//! restart then fences its predecessor and aborts the transaction it left open at once, instead
//! of after the transaction timeout. Static membership needs a given id.

use anyhow::bail;
use clap::Args;
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
    /// within its session timeout can leave partitions without an owner (README, "Group
    /// membership").
    #[arg(long, conflicts_with = "dynamic_membership")]
    pub static_membership: bool,
    /// Dynamic group membership: the default; kept so that existing command lines still run.
    #[arg(long)]
    pub dynamic_membership: bool,
}

/// The resolved identity of one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The instance id given, or the one drawn for this process.
    pub instance_id: String,
    /// Static group membership was asked for.
    pub static_membership: bool,
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
        })
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
        let m = parse(&["--instance-id", "pod-2"])
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!(
            m,
            Membership {
                instance_id: "pod-2".into(),
                static_membership: false
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
}
