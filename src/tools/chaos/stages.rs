//! The supervised instances of every stage of a run, one [`Instances`] per [`Stage`], driven
//! together: the runner's loop ticks them all, a fault picks its stage's, the end stops them all.
//! A pipeline-only run holds one stage, an all-stage run three.
//!
//! ```text
//!   Stages ─┬─ Instances(pipeline): alert-pipeline --instance-id 0..N --group-protocol P
//!           ├─ Instances(sink):     alert-sink     --instance-id 0..N --group-protocol S
//!           └─ Instances(deliver):  alert-deliver  --instance-id 0..N --group-protocol D
//! ```
//!
//! Instance ids, group membership and the group protocol are always given on the command line
//! (never left to a binary's defaults or to the run's `GROUP_PROTOCOL`, which may change):
//! [`membership_from_help`] asks each binary which flags it has. Every stage's instances are
//! started the one way [`launch`] builds: the arguments all stages share, then the stage's own.
//!
//! # The group protocol of each stage
//! Each stage speaks the protocol [`GroupProtocols`] gives it, and its arguments follow it: a
//! `classic` stage gets the run's short `-X session.timeout.ms`, a `consumer` (KIP-848) stage
//! none, since the session is the broker's there (`group.consumer.session.timeout.ms`) and the
//! stages refuse one on the client. Both keep `-X max.poll.interval.ms`, which librdkafka still
//! enforces under `consumer`. How long a member that stopped heartbeating keeps its partitions
//! follows the protocol as well ([`super::ChaosOptions::session`]).

use super::instances::{InstanceFigures, Instances, Launch};
use super::plan::Stage;
use super::ChaosOptions;
use crate::kafka::config::GroupProtocol;
use anyhow::{bail, Context as _};
use std::path::Path;
use std::time::{Duration, Instant};

/// The group protocol of each stage's instances (`alert-chaos --group-protocol`, and the
/// per-stage `--pipeline-group-protocol`, `--sink-group-protocol`, `--deliver-group-protocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupProtocols {
    pub pipeline: GroupProtocol,
    pub sink: GroupProtocol,
    pub deliver: GroupProtocol,
}

impl GroupProtocols {
    /// Every stage on `protocol`.
    pub const fn all(protocol: GroupProtocol) -> Self {
        GroupProtocols {
            pipeline: protocol,
            sink: protocol,
            deliver: protocol,
        }
    }

    /// The protocol of `stage`.
    pub fn of(&self, stage: Stage) -> GroupProtocol {
        match stage {
            Stage::Pipeline => self.pipeline,
            Stage::Sink => self.sink,
            Stage::Deliver => self.deliver,
        }
    }

    /// Puts `stage` on `protocol`.
    pub fn set(&mut self, stage: Stage, protocol: GroupProtocol) {
        match stage {
            Stage::Pipeline => self.pipeline = protocol,
            Stage::Sink => self.sink = protocol,
            Stage::Deliver => self.deliver = protocol,
        }
    }

    /// Whether any of `stages` speaks `protocol`.
    pub fn any(&self, stages: &[Stage], protocol: GroupProtocol) -> bool {
        stages.iter().any(|&s| self.of(s) == protocol)
    }
}

/// Every stage's instances, in data-flow order.
pub struct Stages {
    all: Vec<Instances>,
}

impl Stages {
    /// Starts `n` instances of each launch.
    pub fn start(launches: Vec<(Launch, usize)>) -> anyhow::Result<Self> {
        let mut all = Vec::new();
        for (launch, n) in launches {
            all.push(Instances::start(launch, n)?);
        }
        Ok(Stages { all })
    }

    /// The stages run.
    pub fn stages(&self) -> Vec<Stage> {
        self.all.iter().map(Instances::stage).collect()
    }

    /// The instances of `stage`, if it runs.
    pub fn get(&mut self, stage: Stage) -> Option<&mut Instances> {
        self.all.iter_mut().find(|i| i.stage() == stage)
    }

    /// The figures of `stage` (default if it does not run).
    pub fn figures(&self, stage: Stage) -> InstanceFigures {
        self.all
            .iter()
            .find(|i| i.stage() == stage)
            .map(|i| i.figures.clone())
            .unwrap_or_default()
    }

    /// Every stage's figures, in data-flow order.
    pub fn all_figures(&self) -> Vec<(Stage, InstanceFigures)> {
        self.all
            .iter()
            .map(|i| (i.stage(), i.figures.clone()))
            .collect()
    }

    /// After a broker bounce or a coordinator kill ended at `moved`: every paused instance of
    /// each stage stays paused for that stage's zombie pause counted from `moved`
    /// ([`Instances::keep_paused_until`], [`ChaosOptions::zombie_pause`]).
    pub fn coordinator_moved(&mut self, moved: Instant, opts: &ChaosOptions) {
        for i in &mut self.all {
            let stage = i.stage();
            i.keep_paused_until(moved + opts.zombie_pause(stage));
        }
    }

    /// [`Instances::tick`] of every stage.
    pub fn tick(&mut self, restart: bool) -> anyhow::Result<()> {
        self.all.iter_mut().try_for_each(|i| i.tick(restart))
    }

    /// Whether every instance of every stage runs.
    pub fn all_running(&self) -> bool {
        self.all.iter().all(Instances::all_running)
    }

    /// Stops every stage, the last of the data flow first, each SIGTERMed and given `timeout`
    /// ([`Instances::stop_all`]). Returns each final process' exit, named `<stage> <id>`.
    pub fn stop_all(&mut self, timeout: Duration) -> anyhow::Result<Vec<(String, String)>> {
        let mut per_stage = Vec::new();
        for i in self.all.iter_mut().rev() {
            let stage = i.stage().name();
            let stopped: Vec<_> = i
                .stop_all(timeout)?
                .into_iter()
                .map(|(id, s)| (format!("{stage} {id}"), s))
                .collect();
            per_stage.push(stopped);
        }
        Ok(per_stage.into_iter().rev().flatten().collect())
    }

    /// [`Instances::finish_zombies`] of every stage.
    pub fn finish_zombies(&mut self) {
        self.all.iter_mut().for_each(Instances::finish_zombies);
    }
}

/// A duration as the stages' command lines take it.
pub fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// How the instances of `stage` are started: `binary` with [`launch_args`] (the flags it has are
/// read from its `--help`), with `env`. The log level keeps each stage's progress line (a
/// committed transaction, a stored batch), which the figures and the coordinator kill's check
/// count.
pub fn launch(
    opts: &ChaosOptions,
    stage: Stage,
    binary: &Path,
    own: &[&str],
    env: Vec<(String, String)>,
) -> anyhow::Result<Launch> {
    let help = std::process::Command::new(binary)
        .arg("--help")
        .output()
        .with_context(|| format!("running {} --help", binary.display()))?;
    let help = String::from_utf8_lossy(&help.stdout);
    let args = launch_args(opts, stage, &help, own)
        .with_context(|| format!("the arguments of {}", binary.display()))?;
    let (log_filter, commit_line, progress_line) = match stage {
        // A zombie is taken among the pipeline instances that committed lately (its commits are
        // logged at debug level; the figures count them too).
        Stage::Pipeline => (
            "warn,price_alerts=info,price_alerts::pipeline::commit=debug",
            Some("transaction committed"),
            "transaction committed",
        ),
        Stage::Sink => (
            "warn,price_alerts=info,price_alerts::sink::partitions=debug",
            None,
            "batch stored",
        ),
        Stage::Deliver => (
            "warn,price_alerts=info,price_alerts::deliver::run=debug",
            None,
            "hand-off transaction committed",
        ),
    };
    Ok(Launch {
        stage,
        binary: binary.to_owned(),
        args,
        env,
        log_filter: log_filter.to_owned(),
        commit_line,
        progress_line,
        log_dir: opts.work_dir.clone(),
        shutdown_timeout: opts.shutdown_timeout,
    })
}

/// The arguments of every instance of `stage` (without `--instance-id`, which each instance gets
/// its own): those all stages share (the cluster's full bootstrap list, the run's shutdown
/// timeout, the session timeout where the stage's protocol takes one from the client, the poll
/// interval), the membership and the protocol ([`membership_from_help`], from the binary's
/// `help`), then `own`.
pub fn launch_args(
    opts: &ChaosOptions,
    stage: Stage,
    help: &str,
    own: &[&str],
) -> anyhow::Result<Vec<String>> {
    let protocol = opts.group_protocols.of(stage);
    let mut args: Vec<String> = [
        "--bootstrap",
        &opts.cluster.kafka.bootstrap,
        "--shutdown-timeout",
        &ms(opts.shutdown_timeout),
    ]
    .map(str::to_owned)
    .to_vec();
    if protocol == GroupProtocol::Classic {
        // A short session: a killed or paused member's partitions move on after 10 s, not 45.
        // Under the consumer protocol the session is the broker's, and the stages refuse it.
        args.extend([
            "-X".to_owned(),
            format!("session.timeout.ms={}", opts.session_timeout.as_millis()),
        ]);
    }
    // An instance blocked inside a client call (librdkafka #5456/#5511: a transactional call
    // that waits forever for a group coordinator that was killed) stops polling; a minute
    // later its group gives its partitions to the others instead of after the default 5 (the
    // consumer protocol too: librdkafka enforces it, and sends it as the rebalance timeout).
    args.extend(["-X", "max.poll.interval.ms=60000"].map(str::to_owned));
    args.extend(membership_from_help(
        help,
        opts.static_membership,
        protocol,
    )?);
    args.extend(own.iter().map(|a| (*a).to_owned()));
    Ok(args)
}

/// The arguments that give a binary's instances static (`want_static`) or dynamic group
/// membership and the group `protocol`, from its help text: `--static-membership` or
/// `--dynamic-membership` when the binary has that flag, nothing when what is wanted is its
/// default; `--group-protocol <protocol>` always, whatever `GROUP_PROTOCOL` the run's environment
/// holds. A binary without `--group-protocol` speaks only the classic protocol: asked for
/// `consumer`, it is refused.
pub fn membership_from_help(
    help: &str,
    want_static: bool,
    protocol: GroupProtocol,
) -> anyhow::Result<Vec<String>> {
    let mut args: Vec<String> = membership_flag(help, want_static)
        .map(|f| vec![f.to_owned()])
        .unwrap_or_default();
    if help.contains("--group-protocol") {
        args.extend(["--group-protocol".to_owned(), protocol.as_str().to_owned()]);
    } else if protocol != GroupProtocol::Classic {
        bail!(
            "the binary has no --group-protocol: it speaks only the classic protocol, not {protocol}"
        );
    }
    Ok(args)
}

/// The membership flag to give, from a binary's help text.
fn membership_flag(help: &str, want_static: bool) -> Option<&'static str> {
    let flag = if want_static {
        "--static-membership"
    } else {
        "--dynamic-membership"
    };
    help.contains(flag).then_some(flag)
}

#[cfg(test)]
mod tests {
    use super::{launch_args, membership_flag, membership_from_help, GroupProtocols};
    use crate::kafka::config::{GroupProtocol, CLASSIC_ONLY};
    use crate::kafka::KafkaConfig;
    use crate::tools::chaos::cluster::Cluster;
    use crate::tools::chaos::plan::Stage;
    use crate::tools::chaos::ChaosOptions;

    /// What the stages' `--help` shows of the flags read here.
    const HELP: &str = "  --instance-id <ID>\n  --static-membership\n  --dynamic-membership\n  \
                        --group-protocol <GROUP_PROTOCOL>  [env: GROUP_PROTOCOL=] [default: classic]";

    fn options(protocols: GroupProtocols) -> ChaosOptions {
        let cluster = Cluster {
            kafka_sh: "kafka.sh".into(),
            kafka: KafkaConfig::new("h:1,h:2,h:3"),
            brokers: 3,
        };
        let mut o = ChaosOptions::short(cluster, "alert-pipeline".into(), 7);
        o.group_protocols = protocols;
        o
    }

    /// The values of the `-X` arguments.
    fn properties(args: &[String]) -> Vec<&str> {
        args.windows(2)
            .filter(|w| w[0] == "-X")
            .map(|w| w[1].as_str())
            .collect()
    }

    /// The value given after `flag`, if any.
    fn value_of<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
        args.windows(2)
            .find(|w| w[0] == flag)
            .map(|w| w[1].as_str())
    }

    #[test]
    fn a_consumer_stage_gets_no_client_session_and_names_its_protocol() {
        let o = options(GroupProtocols::all(GroupProtocol::Consumer));
        for stage in Stage::ALL {
            let args = launch_args(&o, stage, HELP, &["--topic", "t"]).unwrap();
            let props = properties(&args);
            for (key, _) in CLASSIC_ONLY {
                assert!(
                    !props.iter().any(|p| p.starts_with(&format!("{key}="))),
                    "{stage:?}: {key} given under the consumer protocol: {args:?}"
                );
            }
            assert_eq!(value_of(&args, "--group-protocol"), Some("consumer"));
            assert!(props.contains(&"max.poll.interval.ms=60000"), "{args:?}");
            assert_eq!(args[args.len() - 2..], ["--topic", "t"], "its own last");
        }
    }

    #[test]
    fn a_classic_stage_keeps_the_short_session_and_names_its_protocol() {
        let o = options(GroupProtocols::all(GroupProtocol::Classic));
        let args = launch_args(&o, Stage::Pipeline, HELP, &[]).unwrap();
        assert_eq!(
            properties(&args),
            ["session.timeout.ms=10000", "max.poll.interval.ms=60000"]
        );
        assert_eq!(value_of(&args, "--group-protocol"), Some("classic"));
        assert_eq!(value_of(&args, "--bootstrap"), Some("h:1,h:2,h:3"));
    }

    /// Each stage's arguments follow its own protocol, and are what that stage accepts: its
    /// properties pass the check the stage makes at start
    /// ([`KafkaConfig::with_group_protocol`]).
    #[test]
    fn each_stage_follows_its_own_protocol() {
        let mut protocols = GroupProtocols::all(GroupProtocol::Classic);
        protocols.set(Stage::Sink, GroupProtocol::Consumer);
        let o = options(protocols);
        for (stage, want) in [
            (Stage::Pipeline, GroupProtocol::Classic),
            (Stage::Sink, GroupProtocol::Consumer),
            (Stage::Deliver, GroupProtocol::Classic),
        ] {
            assert_eq!(protocols.of(stage), want);
            let args = launch_args(&o, stage, HELP, &[]).unwrap();
            assert_eq!(value_of(&args, "--group-protocol"), Some(want.as_str()));
            let has_session = properties(&args)
                .iter()
                .any(|p| p.starts_with("session.timeout.ms="));
            assert_eq!(has_session, want == GroupProtocol::Classic, "{args:?}");
            KafkaConfig::new("h:1")
                .with_overrides(&properties(&args))
                .and_then(|k| k.with_group_protocol(want))
                .unwrap_or_else(|e| panic!("{stage:?} would refuse its arguments: {e:#}"));
        }
        assert!(protocols.any(&[Stage::Pipeline, Stage::Sink], GroupProtocol::Consumer));
        assert!(!protocols.any(&[Stage::Pipeline], GroupProtocol::Consumer));
    }

    #[test]
    fn a_binary_without_the_protocol_flag_runs_only_classic() {
        let old = "  --instance-id <ID>\n  --static-membership";
        assert_eq!(
            membership_from_help(old, false, GroupProtocol::Classic).unwrap(),
            Vec::<String>::new()
        );
        let err = membership_from_help(old, false, GroupProtocol::Consumer).unwrap_err();
        assert!(err.to_string().contains("--group-protocol"), "{err}");
        assert_eq!(
            membership_from_help(HELP, true, GroupProtocol::Consumer).unwrap(),
            ["--static-membership", "--group-protocol", "consumer"]
        );
    }

    #[test]
    fn the_membership_flag_is_the_one_the_binary_has() {
        let dynamic_default = "  --static-membership  Static group membership";
        let static_default = "  --dynamic-membership  Dynamic group membership";
        assert_eq!(membership_flag(dynamic_default, false), None);
        assert_eq!(
            membership_flag(dynamic_default, true),
            Some("--static-membership")
        );
        assert_eq!(
            membership_flag(static_default, false),
            Some("--dynamic-membership")
        );
        assert_eq!(membership_flag(static_default, true), None);
    }
}
