//! The instances of one stage of a chaos run: real child processes (`alert-pipeline`,
//! `alert-sink` or `alert-deliver`, as the [`Launch`] says), signalled the way an orchestrator or
//! an outage would (SIGKILL, SIGTERM, SIGSTOP/SIGCONT) and restarted with the same instance id
//! whenever they exit, as a StatefulSet would. The runner keeps one [`Instances`] per stage.
//!
//! Each instance is a small state machine driven by [`Instances::tick`], which the runner calls
//! every few hundred milliseconds: an exited process is reaped and restarted, a SIGTERM that is
//! not honoured within the shutdown timeout (plus a grace) is escalated to SIGKILL, a paused
//! zombie is resumed when its pause is over. Nothing here waits: the runner's loop keeps every
//! instance and the broker bounces going at the same time.
//!
//! Each instance's stderr is appended to `<log_dir>/<stage>-<id>.log` across its restarts; the
//! pipeline's commit count of the figures is read from there (the `transaction committed` debug
//! lines).
//!
//! After a coordinator kill ([`super::coordinator`]) the instances that were running and busy
//! (their progress line logged shortly before) are watched ([`Instances::watch`]) until each
//! shows progress (its stage's progress line, logged twice after the kill) or exits on its own
//! (the runner restarts it, as it restarts any exit), or the bound passes: then it is stuck. An
//! instance idle at the kill (no partitions, or nothing left to read) is reported as such, not
//! judged: no progress would be expected of it either way. A watched instance is spared the other instance faults
//! meanwhile, as a resumed zombie is: what it does is the kill's doing. Exits with status 75
//! ([`WATCHDOG_EXIT`]) are counted apart in the figures.

use super::plan::Stage;
use anyhow::Context as _;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// What the runner may do to an instance, and what the instance is doing.
#[derive(Debug)]
enum Phase {
    /// Processing.
    Running,
    /// SIGTERM sent at this instant; waiting for it to exit.
    Terminating(Instant),
    /// SIGSTOPped until this instant (the zombie).
    Paused(Instant),
    /// Exited; restart at this instant.
    Down(Instant),
}

/// One instance id and its current process.
#[derive(Debug)]
struct Instance {
    id: String,
    child: Option<Child>,
    phase: Phase,
    /// The current process was SIGKILLed by the runner, so its exit is planned.
    killed: bool,
    /// When the current process was started (the log is shared by every incarnation).
    since: Instant,
}

/// The exit status of a process that gave up on a call stuck past its bound (EX_TEMPFAIL, the
/// process watchdog of issue 20): an orchestrator restarts it, and so does the runner.
pub const WATCHDOG_EXIT: i32 = 75;

/// How a watched instance came out of a coordinator kill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// It logged its progress line twice after the kill, this long after it: the second needed
    /// the group coordinator after the kill (the first may have been past it already).
    Committed(Duration),
    /// Its process exited on its own (and was restarted), with this status, this long after.
    Exited { status: String, after: Duration },
    /// Neither within this long.
    Stuck(Duration),
    /// No progress line in the [`BUSY_WITHIN`] before the kill: nothing to judge it by.
    Idle,
}

impl Progress {
    pub fn stuck(&self) -> bool {
        matches!(self, Progress::Stuck(_))
    }
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Progress::Committed(after) => {
                write!(f, "progressed {:.1}s after", after.as_secs_f64())
            }
            Progress::Exited { status, after } => {
                write!(f, "exited ({status}) {:.1}s after", after.as_secs_f64())
            }
            Progress::Stuck(for_) => write!(
                f,
                "STUCK: no progress and no exit in {:.1}s",
                for_.as_secs_f64()
            ),
            Progress::Idle => write!(
                f,
                "idle at the kill (no progress line in the {}s before): not judged",
                BUSY_WITHIN.as_secs()
            ),
        }
    }
}

/// An instance watched since a coordinator kill.
#[derive(Debug)]
struct Watch {
    /// Which kill of the run (its number).
    kill: usize,
    /// The instance.
    n: usize,
    /// When the kill was seen.
    since: Instant,
    /// Past this, no progress means stuck.
    bound: Duration,
    /// Length of the instance's log at the kill: what follows was written after it.
    log_len: u64,
    outcome: Option<Progress>,
}

/// Counters of what happened to the instances.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceFigures {
    pub starts: u64,
    pub sigkills: u64,
    pub sigterms: u64,
    /// SIGTERMed instances that exited 0.
    pub clean_exits: u64,
    /// SIGTERMs escalated to SIGKILL because the instance did not exit in time.
    pub term_escalations: u64,
    pub sigstops: u64,
    /// Exits nobody asked for (fenced, a fatal broker error, ...), each with its status.
    pub unplanned_exits: Vec<String>,
    /// Zombies that exited non-zero on their own after SIGCONT: fenced, as they must be.
    pub zombies_fenced: u64,
    /// How each zombie ended: fenced, or went on running.
    pub zombie_outcomes: Vec<String>,
    /// Exits with [`WATCHDOG_EXIT`] (each restarted, as every exit is).
    pub watchdog_exits: u64,
}

/// How to start an instance.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Which stage: names the logs and the log lines.
    pub stage: Stage,
    /// The stage's binary.
    pub binary: PathBuf,
    /// Arguments of every instance (without --instance-id).
    pub args: Vec<String>,
    /// Environment of every instance (the database URL of the sink, ...).
    pub env: Vec<(String, String)>,
    /// RUST_LOG of every instance.
    pub log_filter: String,
    /// The log line of a committed batch, if the stage logs one: a zombie is then taken among
    /// the instances that committed lately (so it is paused with work in hand); without it,
    /// among those up for a few seconds.
    pub commit_line: Option<&'static str>,
    /// The log line of one unit of progress at `log_filter` (a committed transaction, a stored
    /// batch): a coordinator kill's check counts them.
    pub progress_line: &'static str,
    /// Folder of the instances' logs.
    pub log_dir: PathBuf,
    /// The instances' --shutdown-timeout: a SIGTERM not honoured within it (plus a grace) is
    /// escalated.
    pub shutdown_timeout: Duration,
}

/// The supervised instances.
pub struct Instances {
    launch: Launch,
    all: Vec<Instance>,
    /// Zombies resumed and not yet seen to end, with when and how long their log was then: their
    /// fate is watched, and no fault is aimed at them meanwhile, so it is their own.
    resumed: Vec<(usize, Instant, u64)>,
    /// Instances watched since a coordinator kill.
    watches: Vec<Watch>,
    /// When the watched instances' logs were last read.
    watches_read: Instant,
    pub figures: InstanceFigures,
}

/// Grace after the shutdown timeout before a SIGTERM is escalated.
const TERM_GRACE: Duration = Duration::from_secs(10);
/// How long after SIGCONT an exit is put down to the zombie's fencing (and the zombie is spared).
const ZOMBIE_WATCH: Duration = Duration::from_secs(60);
/// How often the logs of instances watched after a coordinator kill are read.
const WATCH_READ_EVERY: Duration = Duration::from_secs(1);
/// Progress lines after a coordinator kill that prove progress (see [`Progress::Committed`]).
const PROGRESS_LINES: usize = 2;
/// An instance whose progress line is younger than this at a coordinator kill is busy, and
/// judged (a pipeline instance commits every second while it has input; the margin is for a
/// loaded machine).
pub const BUSY_WITHIN: Duration = Duration::from_secs(10);

impl Instances {
    /// Starts `n` instances, ids `0..n`.
    pub fn start(launch: Launch, n: usize) -> anyhow::Result<Self> {
        let mut me = Instances {
            launch,
            all: Vec::new(),
            resumed: Vec::new(),
            watches: Vec::new(),
            watches_read: Instant::now(),
            figures: InstanceFigures::default(),
        };
        for i in 0..n {
            // A fresh log per run: counts are read from it, and a reused folder must not add an
            // earlier run's lines.
            let log = Self::log_path(&me.launch.log_dir, me.launch.stage, &i.to_string());
            if log.exists() {
                std::fs::remove_file(&log)
                    .with_context(|| format!("removing {}", log.display()))?;
            }
            let child = me.spawn(&i.to_string())?;
            me.all.push(Instance {
                id: i.to_string(),
                child: Some(child),
                phase: Phase::Running,
                killed: false,
                since: Instant::now(),
            });
        }
        Ok(me)
    }

    /// Log file of instance `id` of `stage`.
    pub fn log_path(dir: &Path, stage: Stage, id: &str) -> PathBuf {
        dir.join(format!("{}-{id}.log", stage.name()))
    }

    /// The stage of these instances.
    pub fn stage(&self) -> Stage {
        self.launch.stage
    }

    fn spawn(&mut self, id: &str) -> anyhow::Result<Child> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(Self::log_path(&self.launch.log_dir, self.launch.stage, id))
            .context("opening an instance log")?;
        let child = Command::new(&self.launch.binary)
            .args(&self.launch.args)
            // Always given: a stage's default instance id is not the runner's to rely on.
            .args(["--instance-id", id])
            .envs(self.launch.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", &self.launch.log_filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.launch.binary.display()))?;
        self.figures.starts += 1;
        let stage = self.launch.stage.name();
        info!(stage, instance = id, pid = child.id(), "instance started");
        Ok(child)
    }

    /// Number of instances.
    pub fn len(&self) -> usize {
        self.all.len()
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Indexes of instances that are running (not paused, stopping or down).
    pub fn running(&self) -> Vec<usize> {
        self.all
            .iter()
            .enumerate()
            .filter(|(_, i)| matches!(i.phase, Phase::Running))
            .map(|(n, _)| n)
            .collect()
    }

    /// The instances a fault may hit now: running ones, but not a zombie whose fate after SIGCONT
    /// is still being watched, nor one watched after a coordinator kill.
    pub fn targets(&self) -> Vec<usize> {
        let now = Instant::now();
        let watched = |n: usize| {
            self.resumed
                .iter()
                .any(|(z, at, _)| *z == n && now.duration_since(*at) < ZOMBIE_WATCH)
                || self.watches.iter().any(|w| w.n == n && w.outcome.is_none())
        };
        self.running()
            .into_iter()
            .filter(|&n| !watched(n))
            .collect()
    }

    /// The instance ids.
    pub fn ids(&self) -> Vec<String> {
        self.all.iter().map(|i| i.id.clone()).collect()
    }

    fn signal(&self, n: usize, sig: &str) -> anyhow::Result<()> {
        let Some(child) = &self.all[n].child else {
            return Ok(());
        };
        let status = Command::new("kill")
            .args([format!("-{sig}"), child.id().to_string()])
            .status()
            .context("running kill")?;
        if !status.success() {
            // The process exited between the check and the signal; tick() reaps it.
            warn!(instance = %self.all[n].id, sig, "signal not delivered (the process had exited)");
        }
        Ok(())
    }

    /// SIGKILLs instance `n`; it is restarted at once (tick).
    pub fn kill(&mut self, n: usize) -> anyhow::Result<()> {
        self.signal(n, "KILL")?;
        self.all[n].killed = true;
        self.figures.sigkills += 1;
        info!(stage = self.launch.stage.name(), instance = %self.all[n].id, "SIGKILL");
        Ok(())
    }

    /// SIGTERMs instance `n`; it is restarted once it has exited.
    pub fn terminate(&mut self, n: usize) -> anyhow::Result<()> {
        self.signal(n, "TERM")?;
        self.all[n].phase = Phase::Terminating(Instant::now());
        self.figures.sigterms += 1;
        info!(stage = self.launch.stage.name(), instance = %self.all[n].id, "SIGTERM");
        Ok(())
    }

    /// SIGSTOPs instance `n` for `pause`: a zombie that wakes up after its transaction timed out
    /// and its group moved on.
    pub fn pause(&mut self, n: usize, pause: Duration) -> anyhow::Result<()> {
        self.signal(n, "STOP")?;
        self.all[n].phase = Phase::Paused(Instant::now() + pause);
        self.figures.sigstops += 1;
        info!(
            stage = self.launch.stage.name(),
            instance = %self.all[n].id,
            pause_s = pause.as_secs(),
            "SIGSTOP (zombie)"
        );
        Ok(())
    }

    /// Keeps every paused instance paused until `at` at least (never shortens a pause); returns
    /// how many are paused. The runner calls it when a broker bounce or a coordinator kill ends:
    /// the group's new coordinator loads the group and starts every member's session again, so a
    /// zombie woken within a session of that would still be a member, rightly not fenced, and
    /// would not be the zombie the fault is meant to make (a consumer-protocol chaos run,
    /// 2026-12-06: woken 41 s after its group moved, with a 45 s session).
    pub fn keep_paused_until(&mut self, at: Instant) -> usize {
        let mut paused = 0;
        for inst in &mut self.all {
            if let Phase::Paused(until) = &mut inst.phase {
                if *until < at {
                    info!(
                        stage = self.launch.stage.name(),
                        instance = %inst.id,
                        longer_s = at.duration_since(*until).as_secs(),
                        "zombie kept paused: its group's coordinator moved"
                    );
                    *until = at;
                }
                paused += 1;
            }
        }
        paused
    }

    /// Reaps, restarts, escalates and resumes, as due. `restart` says whether exited instances
    /// come back (not while the run is being stopped).
    pub fn tick(&mut self, restart: bool) -> anyhow::Result<()> {
        let now = Instant::now();
        for n in 0..self.all.len() {
            match self.all[n].phase {
                Phase::Paused(until) if now >= until => {
                    self.signal(n, "CONT")?;
                    self.all[n].phase = Phase::Running;
                    let log_len = std::fs::metadata(self.log(n)).map(|m| m.len()).unwrap_or(0);
                    self.resumed.push((n, now, log_len));
                    info!(
                        stage = self.launch.stage.name(),
                        instance = %self.all[n].id,
                        "SIGCONT (zombie resumed)"
                    );
                }
                Phase::Terminating(since)
                    if now.duration_since(since) > self.launch.shutdown_timeout + TERM_GRACE =>
                {
                    warn!(
                        stage = self.launch.stage.name(),
                        instance = %self.all[n].id,
                        "SIGTERM not honoured in time: SIGKILL"
                    );
                    self.signal(n, "KILL")?;
                    self.all[n].killed = true;
                    self.figures.term_escalations += 1;
                }
                Phase::Down(at) if restart && now >= at => {
                    let id = self.all[n].id.clone();
                    self.all[n].child = Some(self.spawn(&id)?);
                    self.all[n].since = Instant::now();
                    self.all[n].phase = Phase::Running;
                    self.all[n].killed = false;
                }
                _ => {}
            }
            if let Some(status) = self.try_reap(n)? {
                self.exited(n, status, now);
            }
        }
        if now.duration_since(self.watches_read) >= WATCH_READ_EVERY {
            self.watches_read = now;
            self.read_watches(now);
        }
        Ok(())
    }

    /// Watches every running instance from now on, for coordinator kill `kill`: each busy one
    /// must show progress or exit on its own within `bound`; an idle one is noted as such.
    /// Returns how many are watched (the busy ones).
    pub fn watch(&mut self, kill: usize, bound: Duration) -> usize {
        let now = Instant::now();
        let busy = self.busy(BUSY_WITHIN);
        for n in self.running() {
            let log_len = std::fs::metadata(self.log(n)).map(|m| m.len()).unwrap_or(0);
            self.watches.push(Watch {
                kill,
                n,
                since: now,
                bound,
                log_len,
                outcome: (!busy.contains(&n)).then_some(Progress::Idle),
            });
        }
        busy.len()
    }

    /// Running instances whose progress line (of any incarnation) is younger than `within`.
    pub fn busy(&self, within: Duration) -> Vec<usize> {
        let line = self.launch.progress_line;
        self.running()
            .into_iter()
            .filter(|&n| {
                tail(&self.log(n))
                    .and_then(|t| last_commit_age(&t, line))
                    .is_some_and(|age| age < within)
            })
            .collect()
    }

    /// Whether an instance is still watched after a coordinator kill (neither progress, exit nor
    /// bound seen yet).
    pub fn watching(&self) -> bool {
        self.watches.iter().any(|w| w.outcome.is_none())
    }

    /// Resolves the watches whose instance logged enough progress lines since its kill, or whose
    /// bound has passed.
    fn read_watches(&mut self, now: Instant) {
        let line = self.launch.progress_line;
        for i in 0..self.watches.len() {
            let w = &self.watches[i];
            if w.outcome.is_some() {
                continue;
            }
            let after = now.duration_since(w.since);
            let lines =
                read_from(&self.log(w.n), w.log_len).map_or(0, |t| plain(&t).matches(line).count());
            let outcome = if lines >= PROGRESS_LINES {
                Some(Progress::Committed(after))
            } else if after > w.bound {
                Some(Progress::Stuck(after))
            } else {
                None
            };
            self.watches[i].outcome = outcome;
        }
    }

    /// How each instance watched for coordinator kill `kill` came out of it, by instance id. A
    /// watch still open (the run ended within its bound) is resolved now: progress if its
    /// lines are there, else stuck.
    pub fn progress(&mut self, kill: usize) -> Vec<(String, Progress)> {
        let now = Instant::now();
        self.read_watches(now);
        self.watches
            .iter()
            .filter(|w| w.kill == kill)
            .map(|w| {
                let outcome = (w.outcome.clone())
                    .unwrap_or_else(|| Progress::Stuck(now.duration_since(w.since)));
                (self.all[w.n].id.clone(), outcome)
            })
            .collect()
    }

    fn try_reap(&mut self, n: usize) -> anyhow::Result<Option<ExitStatus>> {
        let Some(child) = self.all[n].child.as_mut() else {
            return Ok(None);
        };
        let status = child.try_wait().context("waiting for an instance")?;
        if status.is_some() {
            self.all[n].child = None;
        }
        Ok(status)
    }

    fn exited(&mut self, n: usize, status: ExitStatus, now: Instant) {
        if status.code() == Some(WATCHDOG_EXIT) {
            self.figures.watchdog_exits += 1;
        }
        // Progress lines logged before the exit count; else the exit is the outcome.
        self.read_watches(now);
        for w in self
            .watches
            .iter_mut()
            .filter(|w| w.n == n && w.outcome.is_none())
        {
            w.outcome = Some(Progress::Exited {
                status: status.to_string(),
                after: now.duration_since(w.since),
            });
        }
        let inst = &mut self.all[n];
        let planned_term = matches!(inst.phase, Phase::Terminating(_));
        if planned_term && status.success() {
            self.figures.clean_exits += 1;
        } else if !inst.killed && !planned_term {
            let zombie = self
                .resumed
                .iter()
                .position(|(z, at, _)| *z == n && now.duration_since(*at) < ZOMBIE_WATCH);
            if let Some(z) = zombie {
                let (_, at, _) = self.resumed.remove(z);
                let after = now.duration_since(at).as_secs_f64();
                if !status.success() {
                    self.figures.zombies_fenced += 1;
                }
                self.figures.zombie_outcomes.push(format!(
                    "instance {} exited ({status}) {after:.1}s after SIGCONT",
                    inst.id
                ));
            }
            let stage = self.launch.stage;
            warn!(stage = stage.name(), instance = %inst.id, %status, zombie, "instance exited unasked; restarting");
            let binary = self.launch.binary.file_name().unwrap_or_default();
            let why = last_words(
                &Self::log_path(&self.launch.log_dir, stage, &inst.id),
                &binary.to_string_lossy(),
            )
            .unwrap_or_default();
            self.figures
                .unplanned_exits
                .push(format!("instance {}: {status} {why}", inst.id));
        }
        info!(stage = self.launch.stage.name(), instance = %inst.id, %status, "instance exited");
        // A killed instance comes back at once (its successor fences it); an unplanned exit after
        // a second, so that a crash loop does not spin.
        let delay = if inst.killed || planned_term {
            Duration::ZERO
        } else {
            Duration::from_secs(1)
        };
        inst.phase = Phase::Down(now + delay);
    }

    /// Whether every instance is running (none paused, stopping or down).
    pub fn all_running(&self) -> bool {
        self.running().len() == self.all.len()
    }

    /// SIGTERMs every running instance (not counted among the chaos' SIGTERMs) and waits up to
    /// `timeout` for all to exit; those still running then are SIGKILLed. Returns the exit
    /// status of each final process.
    pub fn stop_all(&mut self, timeout: Duration) -> anyhow::Result<Vec<(String, String)>> {
        for n in self.running() {
            self.signal(n, "TERM")?;
        }
        let deadline = Instant::now() + timeout;
        let mut outcome = Vec::new();
        for n in 0..self.all.len() {
            let Some(mut child) = self.all[n].child.take() else {
                continue;
            };
            let status = loop {
                if let Some(s) = child.try_wait().context("waiting for an instance")? {
                    break s.to_string();
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break "did not exit in time: SIGKILL".to_owned();
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            outcome.push((self.all[n].id.clone(), status));
        }
        Ok(outcome)
    }

    /// Zombie outcomes once the run is over, for a resumed zombie not seen to exit: the group
    /// fenced it if, after SIGCONT, it found its assignment lost or had the offsets of its stale
    /// generation refused (its generation is gone, so its offsets could not commit: KIP-447), and
    /// it went on; else it was not fenced. Read from the stage's own `partitions revoked …
    /// lost=true` line (pipeline, sink), librdkafka's `Consumer group session timed out` warning
    /// (every stage: the deliverer logs no rebalance line of its own), or the broker's refusal of
    /// the offsets as librdkafka relays it ([`lost_after_pause`]).
    pub fn finish_zombies(&mut self) {
        let resumed: Vec<_> = self.resumed.drain(..).collect();
        for (n, _, log_len) in resumed {
            let after = std::fs::read(self.log(n)).ok().and_then(|t| {
                t.get(log_len as usize..)
                    .map(|t| plain(&String::from_utf8_lossy(t)))
            });
            let id = &self.all[n].id;
            if after.is_some_and(|t| lost_after_pause(&t)) {
                self.figures.zombies_fenced += 1;
                self.figures.zombie_outcomes.push(format!(
                    "instance {id} found its assignment lost or its generation refused after SIGCONT, and rejoined"
                ));
            } else {
                self.figures
                    .zombie_outcomes
                    .push(format!("instance {id} went on after SIGCONT (not fenced)"));
            }
        }
    }

    fn log(&self, n: usize) -> PathBuf {
        Self::log_path(&self.launch.log_dir, self.launch.stage, &self.all[n].id)
    }

    /// Running instances that are processing: their current process (up for more than five
    /// seconds, so the line is its own) logged a commit in the last two seconds (for a stage
    /// without a commit line: any instance up that long). A zombie is taken from these, so that
    /// it is paused with partitions and (with one-second batches) nearly always an open
    /// transaction: something to fence.
    pub fn processing(&self) -> Vec<usize> {
        let commit_line = self.launch.commit_line;
        self.targets()
            .into_iter()
            .filter(|&n| self.all[n].since.elapsed() > Duration::from_secs(5))
            .filter(|&n| {
                let Some(line) = commit_line else {
                    return true;
                };
                tail(&self.log(n))
                    .and_then(|t| last_commit_age(&t, line))
                    .is_some_and(|age| age < Duration::from_secs(2))
            })
            .collect()
    }
}

/// Whether an instance's log after SIGCONT shows that the group fenced it: it found its
/// assignment lost, or the group refused the offsets of its stale generation (KIP-447: a member
/// whose generation has moved on cannot commit). The second is all a zombie sees when the group
/// was not expelling it: a coordinator that takes the group over during the pause times every
/// member's session from the takeover, and a rebalance meanwhile still moves the generation on.
fn lost_after_pause(log: &str) -> bool {
    (log.contains("partitions revoked") && log.contains("lost=true"))
        || log.contains("Consumer group session timed out")
        // Kafka's messages for ILLEGAL_GENERATION and UNKNOWN_MEMBER_ID, as librdkafka relays them.
        || log.contains("Specified group generation id is not valid")
        || log.contains("The coordinator is not aware of this member")
}

/// `text` without terminal colour codes (ESC [ ... letter), which the instances' log fields carry.
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The last 16 KiB of an instance log: the logs grow large.
fn tail(log: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(log).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)))
        .ok()?;
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).ok()?;
    Some(String::from_utf8_lossy(&tail).into_owned())
}

/// What `log` holds from byte `offset` on.
fn read_from(log: &Path, offset: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(log).ok()?;
    f.seek(SeekFrom::Start(offset)).ok()?;
    let mut text = Vec::new();
    f.read_to_end(&mut text).ok()?;
    Some(String::from_utf8_lossy(&text).into_owned())
}

/// How long ago the last line of `log` containing `commit_line` was written, by its timestamp
/// (the first word of a line, RFC 3339).
fn last_commit_age(log: &str, commit_line: &str) -> Option<Duration> {
    use time::format_description::well_known::Rfc3339;
    let line = log.lines().rev().find(|l| l.contains(commit_line))?;
    let stamp = plain(line).split_whitespace().next()?.to_owned();
    let at = time::OffsetDateTime::parse(&stamp, &Rfc3339).ok()?;
    let age = time::OffsetDateTime::now_utc() - at;
    Some(age.try_into().unwrap_or(Duration::ZERO))
}

/// The last `<binary>: ...` line of an instance log (its exit message).
fn last_words(log: &Path, binary: &str) -> Option<String> {
    let prefix = format!("{binary}: ");
    tail(log)?
        .lines()
        .rev()
        .find(|l| l.starts_with(&prefix))
        .map(|l| l.chars().take(200).collect())
}

impl Drop for Instances {
    fn drop(&mut self) {
        // A failing run must not leave processors running (or stopped: SIGCONT first).
        for inst in &mut self.all {
            if let Some(child) = inst.child.as_mut() {
                let _ = Command::new("kill")
                    .args(["-CONT".to_owned(), child.id().to_string()])
                    .status();
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_age_of_the_last_commit_is_read_from_its_timestamp() {
        let an_hour_ago = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
        let stamp = an_hour_ago
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        let log = format!(
            "\u{1b}[2m{stamp}\u{1b}[0m DEBUG transaction committed records=3\nlater line\n"
        );
        let age = super::last_commit_age(&log, "transaction committed").unwrap();
        assert!(
            age >= std::time::Duration::from_secs(3599)
                && age < std::time::Duration::from_secs(3660),
            "{age:?}"
        );
        assert_eq!(
            super::last_commit_age("no commit here", "transaction committed"),
            None
        );
    }

    #[test]
    fn a_lost_assignment_is_read_from_the_stage_or_from_librdkafka() {
        let sink = "INFO partitions revoked partitions=[0, 1] lost=true buffered=0";
        let deliver = "WARN librdkafka: [thrd:main]: Consumer group session timed out (in \
                       join-state steady) after 42121 ms without a successful response";
        assert!(super::lost_after_pause(sink) && super::lost_after_pause(deliver));
        assert!(!super::lost_after_pause(
            "INFO partitions revoked partitions=[0] lost=false"
        ));
    }

    /// A short chaos run (2026-12-03): the group coordinator moved while the zombie was paused,
    /// so the new coordinator timed its session from the move and did not expel it; a rebalance
    /// had still moved the generation on, and the zombie's stale offsets were refused on waking.
    #[test]
    fn offsets_refused_for_a_stale_generation_fence_the_zombie() {
        let pipeline =
            "WARN price_alerts::pipeline::commit: commit failed; aborting and rewinding \
                        error=send_offsets_to_transaction failed (Abortable): Transaction error: \
                        Failed to commit offsets to transaction on broker 127.0.0.1:19093/2: \
                        t-market-updates((null))[3](Broker: Specified group generation id is not \
                        valid)";
        let unknown = "WARN librdkafka: [thrd:main]: Failed to commit offsets to transaction on \
                       broker 127.0.0.1:19093/2: t[0](Broker: The coordinator is not aware of \
                       this member)";
        assert!(super::lost_after_pause(pipeline) && super::lost_after_pause(unknown));
        assert!(!super::lost_after_pause(
            "DEBUG transaction committed records=365 notifications=47 offsets={3: 835}"
        ));
    }

    #[test]
    fn colour_codes_are_stripped_from_log_fields() {
        let logged = "partitions revoked \u{1b}[3mlost\u{1b}[0m\u{1b}[2m=\u{1b}[0mtrue";
        assert_eq!(super::plain(logged), "partitions revoked lost=true");
    }

    use super::{Instances, Launch, Progress, WATCHDOG_EXIT};
    use crate::tools::chaos::plan::Stage;
    use std::time::{Duration, Instant};

    /// Instances of `sh -c <script>` (the runner appends `--instance-id <id>`: `$0` and `$1`).
    fn shell(dir: &std::path::Path, script: &str) -> Launch {
        Launch {
            stage: Stage::Sink,
            binary: "/bin/sh".into(),
            args: vec!["-c".to_owned(), script.to_owned()],
            env: Vec::new(),
            log_filter: "info".to_owned(),
            commit_line: None,
            progress_line: "batch stored",
            log_dir: dir.to_owned(),
            shutdown_timeout: Duration::from_secs(5),
        }
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("chaos-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Ticks `i` until `done` holds, or fails after a deadline that a loaded machine meets.
    fn tick_until(i: &mut Instances, what: &str, done: impl Fn(&Instances) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(i) {
            assert!(Instant::now() < deadline, "not within 60 s: {what}");
            i.tick(true).unwrap();
            std::thread::sleep(Duration::from_millis(50)); // the runner's loop period, shorter
        }
    }

    #[test]
    fn an_instance_exiting_with_the_watchdog_status_is_counted_apart_and_restarted() {
        let dir = temp_dir("watchdog");
        let mut i = Instances::start(shell(&dir, &format!("exit {WATCHDOG_EXIT}")), 1).unwrap();
        tick_until(&mut i, "two restarts", |i| i.figures.starts >= 3);
        assert!(i.figures.watchdog_exits >= 2, "{:?}", i.figures);
        assert!(
            i.figures.unplanned_exits[0].contains("exit status: 75"),
            "{:?}",
            i.figures.unplanned_exits
        );
    }

    /// A group coordinator that moves while a zombie is paused starts its session again: the
    /// zombie stays paused until the runner's new bound, and one resumed is not held again.
    #[test]
    fn a_paused_zombie_stays_paused_past_its_session_counted_again_from_a_coordinator_move() {
        let dir = temp_dir("repause");
        let mut i = Instances::start(shell(&dir, "exec sleep 60"), 2).unwrap();
        let started = Instant::now();
        i.pause(0, Duration::from_millis(300)).unwrap();
        let moved_bound = Instant::now() + Duration::from_secs(2);
        assert_eq!(i.keep_paused_until(moved_bound), 1, "one paused instance");
        tick_until(&mut i, "the zombie resumed", |i| i.all_running());
        assert!(
            Instant::now() >= moved_bound,
            "resumed {:?} after SIGSTOP, before the bound set at the move",
            started.elapsed()
        );
        assert_eq!(i.figures.sigstops, 1);
        assert_eq!(
            i.keep_paused_until(Instant::now() + Duration::from_secs(60)),
            0,
            "a running instance is not paused again"
        );
        assert!(i.all_running());
        // A later bound never shortens a pause.
        i.pause(1, Duration::from_secs(2)).unwrap();
        let planned = Instant::now() + Duration::from_secs(2);
        assert_eq!(i.keep_paused_until(Instant::now()), 1);
        tick_until(&mut i, "the second zombie resumed", |i| i.all_running());
        assert!(Instant::now() >= planned, "the planned pause was kept");
    }

    #[test]
    fn a_watched_instance_progresses_exits_or_is_stuck() {
        let dir = temp_dir("watch");
        // Four instances by their id ($1). 0 to 2 are busy (a progress line with a timestamp, as
        // tracing writes it) before the kill; once it is watched (the file `go`), 0 logs progress
        // twice, 1 exits 75, 2 says nothing. 3 was idle all along.
        let go = dir.join("go");
        let _ = std::fs::remove_file(&go);
        let script = format!(
            r#"stored() {{ echo "$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ) DEBUG batch stored" >&2; }}
            [ "$1" = 3 ] || stored
            until [ -e '{}' ]; do sleep 0.05; done
            case "$1" in
                0) stored; stored; exec sleep 60 ;;
                1) exit 75 ;;
                *) exec sleep 60 ;;
            esac"#,
            go.display()
        );
        let mut i = Instances::start(shell(&dir, &script), 4).unwrap();
        tick_until(&mut i, "three busy instances", |i| {
            i.busy(Duration::from_secs(60)).len() == 3
        });
        assert_eq!(i.watch(7, Duration::from_secs(10)), 3);
        std::fs::write(&go, "").unwrap();
        assert_eq!(
            i.targets(),
            [3],
            "the watched instances are spared, not the idle one"
        );
        tick_until(&mut i, "every watch resolved", |i| !i.watching());
        let outcomes = i.progress(7);
        assert_eq!(outcomes.len(), 4);
        assert_eq!(outcomes[3].1, Progress::Idle, "{outcomes:?}");
        assert!(
            matches!(outcomes[0].1, Progress::Committed(_)),
            "{outcomes:?}"
        );
        assert!(
            matches!(&outcomes[1].1, Progress::Exited { status, .. } if status.contains("75")),
            "{outcomes:?}"
        );
        assert!(outcomes[2].1.stuck(), "{outcomes:?}");
        assert!(i.progress(8).is_empty(), "another kill watched nobody");
    }
}
