//! The supervised instances of every stage of a run, one [`Instances`] per [`Stage`], driven
//! together: the runner's loop ticks them all, a fault picks its stage's, the end stops them all.
//! A pipeline-only run holds one stage, an all-stage run three.
//!
//! ```text
//!   Stages ─┬─ Instances(pipeline): alert-pipeline --instance-id 0..N
//!           ├─ Instances(sink):     alert-sink     --instance-id 0..N
//!           └─ Instances(deliver):  alert-deliver  --instance-id 0..N
//! ```
//!
//! Instance ids and group membership are always given on the command line (never left to a
//! binary's defaults, which may change): [`membership_args`] asks each binary which flag it has.
//! Every stage's instances are started the one way [`launch`] builds: the arguments all stages
//! share, then the stage's own.

use super::instances::{InstanceFigures, Instances, Launch};
use super::plan::Stage;
use super::ChaosOptions;
use anyhow::Context as _;
use std::path::Path;
use std::time::Duration;

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

/// How the instances of `stage` are started: `binary` with the arguments every stage shares
/// (the cluster's full bootstrap list, the run's shutdown and session timeouts, the poll
/// interval, explicit membership), then `own`, with `env`. The log level keeps each stage's
/// progress line (a committed transaction, a stored batch), which the figures and the
/// coordinator kill's check count.
pub fn launch(
    opts: &ChaosOptions,
    stage: Stage,
    binary: &Path,
    own: &[&str],
    env: Vec<(String, String)>,
) -> anyhow::Result<Launch> {
    let mut args = [
        "--bootstrap",
        &opts.cluster.kafka.bootstrap,
        "--shutdown-timeout",
        &ms(opts.shutdown_timeout),
        "-X",
        &format!("session.timeout.ms={}", opts.session_timeout.as_millis()),
        // An instance blocked inside a client call (librdkafka #5456/#5511: a transactional call
        // that waits forever for a group coordinator that was killed) stops polling; a minute
        // later its group gives its partitions to the others instead of after the default 5.
        "-X",
        "max.poll.interval.ms=60000",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(membership_args(binary, opts.static_membership)?);
    args.extend(own.iter().map(|a| (*a).to_owned()));
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

/// The arguments that give `binary`'s instances static (`want_static`) or dynamic group
/// membership, whichever its default: `--static-membership` or `--dynamic-membership` when the
/// binary has that flag (read from its `--help`), nothing when what is wanted is its default.
pub fn membership_args(binary: &Path, want_static: bool) -> anyhow::Result<Vec<String>> {
    let help = std::process::Command::new(binary)
        .arg("--help")
        .output()
        .with_context(|| format!("running {} --help", binary.display()))?;
    let help = String::from_utf8_lossy(&help.stdout);
    let mut args: Vec<String> = membership_from_help(&help, want_static)
        .map(|f| vec![f.to_owned()])
        .unwrap_or_default();
    // The classic group protocol, whatever GROUP_PROTOCOL the run's environment holds: every
    // stage gets -X session.timeout.ms above, which the consumer protocol refuses. Chaos under
    // the consumer protocol, per stage, is issue 44's item 3.
    if help.contains("--group-protocol") {
        args.extend(["--group-protocol".to_owned(), "classic".to_owned()]);
    }
    Ok(args)
}

/// The membership flag to give, from a binary's help text.
fn membership_from_help(help: &str, want_static: bool) -> Option<&'static str> {
    let flag = if want_static {
        "--static-membership"
    } else {
        "--dynamic-membership"
    };
    help.contains(flag).then_some(flag)
}

#[cfg(test)]
mod tests {
    use super::membership_from_help;

    #[test]
    fn the_membership_flag_is_the_one_the_binary_has() {
        let dynamic_default = "  --static-membership  Static group membership";
        let static_default = "  --dynamic-membership  Dynamic group membership";
        assert_eq!(membership_from_help(dynamic_default, false), None);
        assert_eq!(
            membership_from_help(dynamic_default, true),
            Some("--static-membership")
        );
        assert_eq!(
            membership_from_help(static_default, false),
            Some("--dynamic-membership")
        );
        assert_eq!(membership_from_help(static_default, true), None);
    }
}
