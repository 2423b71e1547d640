//! Losing the group coordinator while an instance is inside `send_offsets_to_transaction`, on the
//! 3-broker cluster (`KAFKA_CLUSTER_BOOTSTRAP`; replication 3, min.insync.replicas 2, so one
//! broker down is survivable).
//!
//! librdkafka 2.12 can block in that call for ever once the group coordinator's broker is down
//! (#5456: the TxnOffsetCommit request is never timed out) or gone (#5511: a stale coordinator is
//! looked up again only on a broker state change that never comes). An instance stuck there keeps
//! its partitions and never leaves the group; nothing but a restart would move them. These tests
//! put the instance exactly there with the hidden `--test-hold-send-offsets FILE` hook
//! (`price_alerts::kafka::hold`): the instance holds right before the call, the test finds the
//! group coordinator (Kafka's own group tool), takes its broker down (SIGKILL, or SIGSTOP for 60 s)
//! and lets the call go. The instance must commit again within transaction timeout + 30 s without
//! a restart, and the output must stay exactly once.
//!
//! Every wait is a polled condition with a deadline, so a hung instance fails the test within
//! minutes, with the instance's last log lines in the message. Brokers taken down are started
//! (or thawed) again by guards, however the test ends, and the test waits until the cluster is
//! fully replicated before it returns.
//!
//! One more case freezes the group coordinator under the client that the pipeline's rewinds and
//! restores read committed offsets through (`GroupOffsets`), without a pipeline: it must answer
//! from the new coordinator within seconds of the move.
//!
//! They take turns (a lock in this file: each takes a broker down). `scripts/test.sh` runs four
//! of them in its cluster lane (the pipeline's kill and freeze, alert-deliver's freeze, the
//! offsets clients' freeze) and skips the others by name, for time; by hand, all seven:
//! `cargo test --test coordinator -- --include-ignored --test-threads=1`. Whatever else shares
//! the cluster must wait meanwhile; a lock held with `flock` must be taken with `-o`, or a broker
//! that a test starts again inherits it and holds it for as long as it runs.
//! `KAFKA_SH` names the `scripts/kafka.sh` that started the cluster when it is another checkout's
//! (the script controls only brokers started from its own checkout).

mod common;

use common::cluster::{broker_pid, cluster, cluster_to_myself, signal};
use common::webhook::{Behaviour, Webhook};
use common::{free_addr, http_get, load_until_hurried, records_with_headers_on, Pipeline, Run};
use price_alerts::kafka::config::COORDINATOR_QUERY_INTERVAL;
use price_alerts::kafka::feed::{next_offsets, Feed, Landed};
use price_alerts::kafka::hold::held_path;
use price_alerts::kafka::offsets::GroupOffsets;
use price_alerts::kafka::read::count_records;
use price_alerts::kafka::topics::{create_topics, Cleanup, DropTopics, TopicSpec};
use price_alerts::kafka::tpl::{partition_list, position_list};
use price_alerts::kafka::txn::send_offsets_deadline;
use price_alerts::kafka::{Isolation, KafkaConfig};
use price_alerts::tick::Tick;
use price_alerts::tools::chaos::cluster::{Cluster, Stop};
use price_alerts::tools::generate::{generate, GenOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// `--transaction-timeout` of the instances under test.
const TXN_TIMEOUT: Duration = Duration::from_secs(10);
/// The bound of the issue: after the coordinator's broker is lost, the instance commits again
/// (or has re-created its producer and goes on) within the transaction timeout and this margin.
///
/// Where the 40 s go, from the settings (issue 43, item 4). The call let go into the lost
/// coordinator waits until its own deadline, `send_offsets_deadline(TXN_TIMEOUT)` = 20 s (or
/// until librdkafka answers a timeout just before it, taken as stuck as well). The abort then
/// makes the producer again, whose registration is answered CONCURRENT_TRANSACTIONS until the
/// transaction coordinator has aborted the open transaction; that needs the lost broker's
/// partitions led elsewhere, which the controller does when it fences the broker, 9 s
/// (`broker.session.timeout.ms`, Kafka's default, which the cluster keeps) after its last
/// heartbeat: 19-22 s after a SIGSTOP on this machine, by the end of the deadline. What is left,
/// the registration and one commit (and for the pipeline its restore), took 0.3-5.1 s for
/// alert-deliver and 1.5-7.6 s for the pipeline frozen in ten runs in a row of 2026-12-06
/// (healed 20.3-25.1 and 21.5-27.6 s after the SIGSTOP; the SIGKILL case 17.8-28.1 s), under a
/// bound of 20 s. The run that missed it (a fresh clone, 2026-12-05) was
/// still answered CONCURRENT_TRANSACTIONS 20 s after the deadline; one that missed it here, an
/// instance that exited when librdkafka's timeout came 33 ms before the deadline, is mended
/// (`kafka::txn`, `# Retries`).
const HEAL_MARGIN: Duration = Duration::from_secs(30);
/// How long a broker stays frozen in the SIGSTOP test.
const FROZEN_FOR: Duration = Duration::from_secs(60);
/// Until the instance is held in the hook (it commits every 100 ms, so at its next commit).
const HOLD_BOUND: Duration = Duration::from_secs(60);
/// Until every record is committed once the cluster is whole again (a loaded 2-core machine).
const CAUGHT_UP: Duration = Duration::from_secs(240);
/// Until the cluster is fully replicated again after a broker comes back.
const REPLICATED: Duration = Duration::from_secs(180);
const EXIT: Duration = Duration::from_secs(60);
/// Exit status of an instance that gave up on a stuck call (issue 20): it must heal in place.
const STUCK_EXIT: i32 = 75;

/// The cluster, once it is fully replicated (a previous test's broker may still be catching up).
fn replicated_cluster() -> Cluster {
    let cluster = cluster();
    cluster
        .wait_fully_replicated(REPLICATED)
        .expect("the cluster is fully replicated before the test");
    cluster
}

/// Starts broker `id` again when dropped unless it was restarted already, then waits until the
/// cluster is fully replicated: a failing test leaves the cluster as it found it.
struct Restart<'a> {
    cluster: &'a Cluster,
    id: i32,
    down: bool,
}

impl Restart<'_> {
    fn start(&mut self) {
        if std::mem::take(&mut self.down) {
            self.cluster
                .start_broker(self.id)
                .unwrap_or_else(|e| panic!("starting broker {} again: {e:#}", self.id));
        }
        let took = self
            .cluster
            .wait_fully_replicated(REPLICATED)
            .expect("the cluster fully replicated again");
        eprintln!("broker {} back; fully replicated after {took:?}", self.id);
    }
}

impl Drop for Restart<'_> {
    fn drop(&mut self) {
        if self.down {
            if let Err(e) = self.cluster.start_broker(self.id) {
                eprintln!("starting broker {} again failed: {e:#}", self.id);
            }
            let _ = self.cluster.wait_fully_replicated(REPLICATED);
        }
    }
}

/// Sends SIGCONT to a frozen broker JVM when dropped unless it was thawed already, then waits
/// until the cluster is fully replicated.
struct Frozen<'a> {
    cluster: &'a Cluster,
    id: i32,
    pid: u32,
    frozen: bool,
}

impl Frozen<'_> {
    /// Freezes broker `id` (SIGSTOP to its JVM).
    fn freeze<'a>(cluster: &'a Cluster, id: i32) -> Frozen<'a> {
        let pid = broker_pid(cluster, id);
        let guard = Frozen {
            cluster,
            id,
            pid,
            frozen: true,
        };
        signal(pid, "STOP");
        guard
    }

    fn thaw(&mut self) {
        if std::mem::take(&mut self.frozen) {
            signal(self.pid, "CONT");
        }
        let took = self
            .cluster
            .wait_fully_replicated(REPLICATED)
            .expect("the cluster fully replicated again");
        eprintln!("broker {} thawed; fully replicated after {took:?}", self.id);
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        if self.frozen {
            let _ = Command::new("kill")
                .args(["-CONT", &self.pid.to_string()])
                .status();
            let _ = self.cluster.wait_fully_replicated(REPLICATED);
        }
    }
}

/// The hook's file: created, the instance holds before its next send_offsets; removed, it goes on.
struct HoldFile(PathBuf);

impl HoldFile {
    fn new(prefix: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("{prefix}hold"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        HoldFile(dir.join("send-offsets"))
    }

    fn arg(&self) -> String {
        self.0.to_str().expect("utf-8 path").to_owned()
    }

    fn hold(&self) {
        let _ = std::fs::remove_file(held_path(&self.0));
        std::fs::write(&self.0, b"hold").expect("creating the hold file");
    }

    fn held(&self) -> bool {
        held_path(&self.0).exists()
    }

    fn release(&self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Drop for HoldFile {
    fn drop(&mut self) {
        self.release();
    }
}

/// A child process under test and the file its stderr goes to.
struct Instance {
    process: Pipeline,
    log: PathBuf,
}

impl Instance {
    /// The last `n` lines of its log, for a failure message.
    fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Fails unless the instance is still running: it must heal without a restart.
    fn assert_running(&mut self, when: &str) {
        if let Ok(Some(status)) = self.process.child.try_wait() {
            let why = if status.code() == Some(STUCK_EXIT) {
                "it gave up on a stuck call (status 75); it must heal without a restart"
            } else {
                "it must heal without a restart"
            };
            panic!(
                "the instance exited {when} ({status}): {why}; its last lines:\n{}",
                self.tail(15)
            );
        }
    }

    /// Polls `cond` every 200 ms until it gives a value, failing after `timeout` with `what`, the
    /// instance's last log lines, and as soon as the instance exits.
    fn wait_for<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut cond: impl FnMut() -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = cond() {
                return v;
            }
            self.assert_running(&format!("while waiting until {what}"));
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting until {what}; the instance's last lines:\n{}",
                self.tail(15)
            );
            thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Starts `command` with its stderr in `<dir>/<name>.log`.
fn spawn_logged(mut command: Command, dir: &Path, name: &str) -> Instance {
    std::fs::create_dir_all(dir).expect("log dir");
    let log = dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .spawn()
        .expect("starting the instance");
    eprintln!("{name} log: {}", log.display());
    Instance {
        process: Pipeline::from(child, name),
        log,
    }
}

/// Creates topic `name` (cleanup delete) with `partitions` partitions on the cluster of `kafka`.
fn create_topic(kafka: &KafkaConfig, name: &str, partitions: i32) {
    let spec = TopicSpec {
        name: name.to_owned(),
        partitions,
        cleanup: Cleanup::Delete,
        retention: None,
    };
    futures::executor::block_on(create_topics(kafka, &[spec])).expect("creating the topic");
}

/// The group coordinator of `group`, asked again for a while: the tool fails while the group is
/// still forming or a coordinator moving.
fn group_coordinator(cluster: &Cluster, group: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match cluster.group_coordinator(group) {
            Ok(id) => return id,
            Err(e) => assert!(
                Instant::now() < deadline,
                "no group coordinator of {group}: {e:#}"
            ),
        }
        thread::sleep(Duration::from_millis(500));
    }
}

// ---------------------------------------------------------------------------------------------
// alert-pipeline

/// How the group coordinator's broker is taken down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// SIGKILL, the call let go at once; started again once the instance has healed.
    Kill,
    /// SIGKILL, the call let go only once the broker has left the cluster's metadata (the
    /// controller fenced it, `broker.session.timeout.ms` later) and the instance's clients have
    /// had time to see that: the broker is gone, as in librdkafka #5511, not just down. The
    /// transaction timeout is longer so that the coordinator does not abort the held transaction.
    KillAndForget,
    /// SIGSTOP for [`FROZEN_FOR`], then SIGCONT.
    Freeze,
    /// SIGKILL, the call let go at once, and the broker started again at once: the hard bounce
    /// of alert-chaos, after which its all-stage run found alert-deliver's group stuck.
    Bounce,
}

/// Transaction timeout of the [`Loss::KillAndForget`] run: the hold lasts about 25 s.
const LONG_TXN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the instance stays held after the killed broker left the metadata: its clients
/// refresh their metadata and drop the broker's thread meanwhile.
const FORGET: Duration = Duration::from_secs(5);

/// Whether the cluster's metadata lists broker `id` (None while it cannot be asked).
fn listed(cluster: &Cluster, id: i32) -> Option<bool> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let probe: BaseConsumer = cluster.kafka.admin().create().ok()?;
    let md = probe.fetch_metadata(None, OFFSETS_READ).ok()?;
    Some(md.brokers().iter().any(|b| b.id() == id))
}

fn ticks_stream(
    symbols: usize,
    ticks: usize,
    seed: u64,
) -> (price_alerts::rules::Rules, Vec<Tick>) {
    generate(&GenOptions {
        symbols,
        ticks,
        seed,
        stale_every: 97,
    })
}

/// Bound on one read of the committed offsets: short, so that a read that meets the lost
/// coordinator is asked again soon instead of holding up the deadline of the wait.
const OFFSETS_READ: Duration = Duration::from_secs(5);

/// The group's committed offset on each input partition (None where none), or None while they
/// cannot be read (a coordinator moving): the waits ask again.
fn committed(run: &Run) -> Option<Vec<Option<i64>>> {
    use price_alerts::kafka::read::partition_count;
    use rdkafka::Offset;
    // read_uncommitted, as `committed_offsets`: the offsets committed now, not a wait until no
    // transaction holds pending offsets.
    let mut cfg = run.kafka.reader(Isolation::ReadUncommitted);
    cfg.set("group.id", &run.app_id);
    let consumer: price_alerts::kafka::read::Reader = cfg
        .create_with_context(price_alerts::kafka::logging::Logged)
        .ok()?;
    let n = partition_count(&consumer, &run.input, OFFSETS_READ).ok()?;
    let tpl = partition_list(&run.input, 0..n);
    let c = price_alerts::kafka::offsets::fetch_committed(&consumer, &tpl, OFFSETS_READ).ok()?;
    Some(
        (0..n)
            .map(
                |p| match c.find_partition(&run.input, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => Some(o),
                    _ => None,
                },
            )
            .collect(),
    )
}

/// The group's committed offsets summed over the input partitions.
fn committed_sum(run: &Run) -> Option<i64> {
    committed(run).map(|v| v.into_iter().map(|o| o.unwrap_or(0)).sum())
}

fn committed_reached(run: &Run, target: &BTreeMap<i32, i64>) -> bool {
    committed(run).is_some_and(|c| {
        target
            .iter()
            .all(|(p, o)| c.get(*p as usize).copied().flatten() == Some(*o))
    })
}

/// One pipeline instance on a live stream; its send_offsets is held while the group coordinator's
/// broker is lost, then let go. It must commit again within the transaction timeout + 30 s, and
/// the whole stream must come out exactly once.
fn pipeline_survives(test: &str, loss: Loss) {
    let _cluster = cluster_to_myself();
    let cluster = replicated_cluster();
    let (rules, ticks) = ticks_stream(30, 6_000, 20);
    let n = ticks.len();
    let mut run = Run::on(cluster.kafka.clone(), test, rules);
    let txn_timeout = if loss == Loss::KillAndForget {
        run.transaction_timeout = "60s";
        LONG_TXN_TIMEOUT
    } else {
        run.transaction_timeout = "10s";
        TXN_TIMEOUT
    };
    let hold = HoldFile::new(&run.prefix);
    run.extra = vec!["--test-hold-send-offsets".into(), hold.arg()];
    run.create_topics(6);
    let rf = cluster
        .replication_factors(&run.input)
        .expect("replication of the input");
    assert!(rf.iter().all(|&r| r == 3), "input replication {rf:?}");

    let logs = std::env::temp_dir().join(format!("{}logs", run.prefix));
    let mut instance = spawn_logged(run.command("0"), &logs, "pipeline-0");
    let records = ticks
        .iter()
        .map(|t| {
            (
                Some(t.symbol.as_bytes().to_vec()),
                price_alerts::tick::encode(t),
            )
        })
        .collect();
    // Up to two minutes of input: it goes on through the loss and until the instance has healed
    // (and the lost broker is back, or thawed); the rest then goes at once.
    let hurry = Arc::new(AtomicBool::new(false));
    let loader = load_until_hurried(
        run.kafka.clone(),
        run.input.clone(),
        records,
        120,
        Duration::from_secs(120),
        Arc::clone(&hurry),
    );
    let first = instance.wait_for("the instance has committed some input", CAUGHT_UP, || {
        committed_sum(&run).filter(|&c| c > 200)
    });

    // The coordinators first (each look-up starts a JVM): the hold must stay far below the
    // transaction timeout, or the transaction coordinator aborts the held transaction itself.
    let coordinator = group_coordinator(&cluster, &run.app_id);
    let txn_coordinator = cluster
        .transaction_coordinator(&format!("{}-0", run.app_id))
        .map_or_else(|e| format!("unknown ({e:#})"), |id| id.to_string());
    // Held right before its next send_offsets_to_transaction.
    hold.hold();
    instance.wait_for("the instance holds before send_offsets", HOLD_BOUND, || {
        hold.held().then_some(())
    });
    let before = instance.wait_for("the committed offsets are read", HOLD_BOUND, || {
        committed_sum(&run)
    });
    eprintln!(
        "held with {before} committed (first seen {first}); group coordinator: broker {coordinator}, transaction coordinator: broker {txn_coordinator}"
    );
    let lost_at = Instant::now();
    let heal_bound = txn_timeout + HEAL_MARGIN;
    match loss {
        Loss::KillAndForget => {
            let mut down = Restart {
                cluster: &cluster,
                id: coordinator,
                down: true,
            };
            cluster
                .stop_broker(coordinator, Stop::Hard)
                .expect("SIGKILL of the group coordinator's broker");
            instance.wait_for(
                &format!("broker {coordinator} has left the cluster's metadata"),
                Duration::from_secs(45),
                || (listed(&cluster, coordinator) == Some(false)).then_some(()),
            );
            thread::sleep(FORGET); // the instance's clients see it gone: a time, not a condition
            let released_at = Instant::now();
            eprintln!(
                "broker {coordinator} gone from the metadata; released {:?} after the SIGKILL",
                lost_at.elapsed()
            );
            hold.release();
            // Counted from the SIGKILL, not from the call: an instance does not choose when its
            // coordinator dies, and an operator (or alert-chaos's stuck check) sees the time since
            // the loss. The first long all-stage run with coordinator kills found a deliverer that
            // made its first call 28 s after the kill and was stuck in it to its deadline (40 s):
            // 69 s in all, past this bound (issue 20).
            let after = instance.wait_for(
                &format!(
                    "the instance commits again within {heal_bound:?} of the SIGKILL of broker {coordinator} (the group coordinator), calling send_offsets_to_transaction {:?} after it (committed {before} before)",
                    released_at.duration_since(lost_at)
                ),
                heal_bound.saturating_sub(lost_at.elapsed()),
                || committed_sum(&run).filter(|&c| c > before),
            );
            eprintln!(
                "committed again ({after}) {:?} after the release, {:?} after the SIGKILL",
                released_at.elapsed(),
                lost_at.elapsed()
            );
            down.start();
        }
        Loss::Bounce => {
            let mut down = Restart {
                cluster: &cluster,
                id: coordinator,
                down: true,
            };
            cluster
                .stop_broker(coordinator, Stop::Hard)
                .expect("SIGKILL of the group coordinator's broker");
            hold.release();
            cluster
                .start_broker(coordinator)
                .expect("starting the broker again");
            down.down = false;
            eprintln!(
                "broker {coordinator} started again {:?} after the SIGKILL",
                lost_at.elapsed()
            );
            let after = instance.wait_for(
                &format!(
                    "the instance commits again within {heal_bound:?} of the hard bounce of broker {coordinator} (the group coordinator) during send_offsets_to_transaction (committed {before} before)"
                ),
                heal_bound.saturating_sub(lost_at.elapsed()),
                || committed_sum(&run).filter(|&c| c > before),
            );
            eprintln!(
                "committed again ({after}) {:?} after the SIGKILL",
                lost_at.elapsed()
            );
            down.start();
        }
        Loss::Kill => {
            let mut down = Restart {
                cluster: &cluster,
                id: coordinator,
                down: true,
            };
            cluster
                .stop_broker(coordinator, Stop::Hard)
                .expect("SIGKILL of the group coordinator's broker");
            hold.release();
            let after = instance.wait_for(
                &format!(
                    "the instance commits again within {heal_bound:?} of the SIGKILL of broker {coordinator} (the group coordinator) during send_offsets_to_transaction (committed {before} before)"
                ),
                heal_bound.saturating_sub(lost_at.elapsed()),
                || committed_sum(&run).filter(|&c| c > before),
            );
            eprintln!(
                "committed again ({after}) {:?} after the SIGKILL",
                lost_at.elapsed()
            );
            down.start();
        }
        Loss::Freeze => {
            let mut frozen = Frozen::freeze(&cluster, coordinator);
            hold.release();
            let after = instance.wait_for(
                &format!(
                    "the instance commits again within {heal_bound:?} of the SIGSTOP of broker {coordinator} (the group coordinator) during send_offsets_to_transaction (committed {before} before)"
                ),
                heal_bound.saturating_sub(lost_at.elapsed()),
                || committed_sum(&run).filter(|&c| c > before),
            );
            eprintln!(
                "committed again ({after}) {:?} after the SIGSTOP",
                lost_at.elapsed()
            );
            // The broker stays frozen its full time; the instance must keep going meanwhile.
            while lost_at.elapsed() < FROZEN_FOR {
                instance.assert_running("while the broker was frozen");
                thread::sleep(Duration::from_millis(200));
            }
            frozen.thaw();
        }
    }

    hurry.store(true, Ordering::Relaxed);
    let landed: Vec<Landed> = loader.join().expect("the loader finished");
    let target = next_offsets(&landed);
    instance.wait_for("every record is committed", CAUGHT_UP, || {
        committed_reached(&run, &target).then_some(())
    });
    instance.assert_running("before its SIGTERM");
    instance.process.signal("TERM");
    let status = instance.process.wait(EXIT);
    assert!(status.success(), "graceful shutdown exits 0: {status}");

    let report = run.verify();
    println!("{report}");
    assert_eq!(report.input_records, n as u64);
    assert!(
        report.expected > 200,
        "the stream crosses: {}",
        report.expected
    );
    assert!(
        report.missing.is_empty(),
        "missing: {:?}",
        &report.missing[..report.missing.len().min(5)]
    );
    assert!(
        report.duplicate.is_empty(),
        "duplicates: {:?}",
        &report.duplicate[..report.duplicate.len().min(5)]
    );
    assert!(
        report.unexpected.is_empty(),
        "unexpected: {:?}",
        &report.unexpected[..report.unexpected.len().min(5)]
    );
    assert_eq!(report.found, report.expected);
}

#[test]
#[ignore = "needs the 3-broker cluster: run scripts/test.sh"]
fn pipeline_heals_after_a_sigkill_of_the_group_coordinator_inside_send_offsets() {
    pipeline_survives("coord-kill", Loss::Kill);
}

#[test]
#[ignore = "needs the 3-broker cluster: run scripts/test.sh"]
fn pipeline_heals_when_send_offsets_starts_after_the_group_coordinator_is_gone() {
    pipeline_survives("coord-gone", Loss::KillAndForget);
}

#[test]
#[ignore = "needs the 3-broker cluster: run scripts/test.sh"]
fn pipeline_heals_after_a_hard_bounce_of_the_group_coordinator_inside_send_offsets() {
    pipeline_survives("coord-bounce", Loss::Bounce);
}

#[test]
#[ignore = "needs the 3-broker cluster: run scripts/test.sh"]
fn pipeline_heals_while_the_group_coordinator_is_frozen_inside_send_offsets() {
    pipeline_survives("coord-stop", Loss::Freeze);
}

// ---------------------------------------------------------------------------------------------
// The client the pipeline's rewinds and restores read committed offsets through

/// How soon [`GroupOffsets`] must answer once its frozen coordinator has left the metadata (and
/// the group with it): a request timed out on the frozen broker, a coordinator look-up, the new
/// coordinator loading the group, and slack for a loaded machine.
const MOVED_COORDINATOR_ANSWERS: Duration = Duration::from_secs(15);
/// How many offsets clients the test asks through at once.
const CLIENTS: usize = 12;
/// Until KRaft fences the frozen broker: 16-18 s on an idle machine (its session, 18 s), 22-24 s
/// when it was the active controller too (an election first). Not this test's subject: when
/// every JVM on the 2 cores stalls for seconds at a time (ci25: pauses of 4-6 s in all five
/// brokers at once), the fencing comes later, and the test waits for it rather than fail.
const FENCED_WITHIN: Duration = Duration::from_secs(90);

/// `GroupOffsets` (the pipeline's rewinds and restores) asks its group's coordinator, whose
/// broker then freezes (SIGSTOP: connections open, nothing answered) until KRaft fences it and
/// the group moves. Asked meanwhile, it must answer from the new coordinator within
/// [`MOVED_COORDINATOR_ANSWERS`] of the fencing. librdkafka sends a client's coordinator
/// look-ups to one broker connection it keeps up for them (picked at random, then the least
/// idle: `rd_kafka_broker_any_usable`), and a frozen broker stays "up" until a request to it
/// times out (`socket.timeout.ms`, 60 s): a client whose look-ups go to the frozen coordinator
/// itself keeps being told the frozen one. In the pipeline's freeze case a rewind waited 17.4 s
/// (a fresh-clone run) and 19.7 s (2026-12-02) for its committed offsets, and the instance
/// healed 40.3 s after the freeze, past its bound (issue 20).
#[test]
#[ignore = "needs the 3-broker cluster: run scripts/test.sh"]
fn group_offsets_answer_from_the_moved_coordinator_soon_after_theirs_froze() {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    let _cluster = cluster_to_myself();
    let cluster = replicated_cluster();
    let kafka = cluster.kafka.clone();
    let prefix = common::prefix("group-offsets-freeze");
    let _topics = DropTopics::with_prefix(&kafka, &prefix);
    let topic = format!("{prefix}input");
    let group = format!("{prefix}group");
    create_topic(&kafka, &topic, 3);
    // Committed offsets 10, 20, 30, by a member that never joins (the group stays empty).
    let committed = position_list(
        &topic,
        (0..3).map(|p| (p, Offset::Offset(10 * (i64::from(p) + 1)))),
    )
    .expect("offsets");
    let committer: BaseConsumer = kafka
        .group_probe(&group, Isolation::ReadUncommitted)
        .create()
        .expect("a committing client");
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = committer.commit(&committed, CommitMode::Sync) {
        assert!(Instant::now() < deadline, "committing the offsets: {e}");
        thread::sleep(Duration::from_millis(500));
    }
    let coordinator = group_coordinator(&cluster, &group);

    // Each client sends its look-ups to one broker it picked at random (the coordinator in a
    // third of the clients): with CLIENTS of them, some pick it in all but (2/3)^12 < 1% of runs.
    let clients: Vec<GroupOffsets> = (0..CLIENTS)
        .map(|_| {
            GroupOffsets::new(&kafka, &group, Isolation::ReadCommitted).expect("an offsets client")
        })
        .collect();
    let asked = partition_list(&topic, 0..3);
    let as_committed = |tpl: &TopicPartitionList| {
        (0..3)
            .map(|p| tpl.find_partition(&topic, p).map(|e| e.offset()))
            .collect::<Vec<_>>()
    };
    let expected = as_committed(&committed);
    for offsets in &clients {
        let first = offsets
            .fetch(&asked, Duration::from_secs(30))
            .expect("the committed offsets, before the freeze");
        assert_eq!(as_committed(&first), expected);
    }
    // The first look-up goes through the bootstrap connection, which librdkafka drops once it
    // knows the brokers; the next one, a look-up interval later, picks the broker they all go to.
    thread::sleep(COORDINATOR_QUERY_INTERVAL + Duration::from_secs(2)); // a time: no event shows it

    // Frozen, and every client asked again at once: the asks go to the frozen coordinator until
    // the controller fences it (it leaves the metadata) and the group moves with the leadership
    // of its __consumer_offsets partition. A thread watches for the fencing.
    let mut frozen = Frozen::freeze(&cluster, coordinator);
    let froze = Instant::now();
    let (fenced, answers) = thread::scope(|scope| {
        let fencing = scope.spawn(|| {
            let deadline = froze + FENCED_WITHIN;
            while listed(&cluster, coordinator) != Some(false) {
                if Instant::now() >= deadline {
                    return None;
                }
                thread::sleep(Duration::from_millis(200));
            }
            Some(froze.elapsed())
        });
        let asks: Vec<_> = clients
            .iter()
            .map(|offsets| {
                scope.spawn(|| {
                    let bound = FENCED_WITHIN + MOVED_COORDINATOR_ANSWERS;
                    let answer = offsets.fetch(&asked, bound);
                    (froze.elapsed(), answer)
                })
            })
            .collect();
        let answers: Vec<_> = asks
            .into_iter()
            .map(|a| a.join().expect("an asking thread"))
            .collect();
        (fencing.join().expect("the fencing watcher"), answers)
    });
    frozen.thaw();
    let times: Vec<String> = answers
        .iter()
        .map(|(at, a)| {
            format!(
                "{:.1}{}",
                at.as_secs_f64(),
                if a.is_ok() { "" } else { " (error)" }
            )
        })
        .collect();
    eprintln!(
        "broker {coordinator} (the group's coordinator) froze; it left the metadata after \
         {fenced:?}; the {CLIENTS} offsets clients answered after (s): {}",
        times.join(", ")
    );
    let fenced = fenced.expect("the frozen broker left the metadata");
    for (answered, answer) in answers {
        let answer = answer.expect("the committed offsets, from the moved coordinator");
        assert_eq!(as_committed(&answer), expected);
        let took = answered.saturating_sub(fenced);
        assert!(
            took <= MOVED_COORDINATOR_ANSWERS,
            "an offsets client answered {took:?} after its frozen coordinator left the metadata \
             ({fenced:?} after the freeze; bound {MOVED_COORDINATOR_ANSWERS:?})"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// alert-deliver

/// A notification as the pipeline writes it, as far as a deliverer reads it.
fn notification(symbol: &str, seq: u64) -> (String, Vec<u8>) {
    let id = format!("{symbol}:{seq}:100:up");
    let v = serde_json::json!({"id": id, "symbol": symbol, "seq": seq, "threshold": "100", "direction": "up"});
    (id, serde_json::to_vec(&v).expect("json"))
}

/// Hand-off transactions the deliverer serving metrics on `addr` has committed (None while it
/// does not answer).
fn committed_txns(addr: &str) -> Option<u64> {
    let series = "alerts_deliver_transactions_total{result=\"committed\"} ";
    http_get(addr, "/metrics")
        .1
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Committed records of `topic`, or None while they cannot be counted.
fn committed_count(kafka: &KafkaConfig, topic: &str) -> Option<u64> {
    count_records(kafka, topic, Isolation::ReadCommitted).ok()
}

/// Asserts `topic` holds exactly one record per id of `ids`, each for `subscriber`, and no other.
fn assert_exactly_once(kafka: &KafkaConfig, topic: &str, ids: &[String], subscriber: &str) {
    let mut per: BTreeMap<String, u32> = BTreeMap::new();
    for r in records_with_headers_on(kafka, topic) {
        let v: serde_json::Value =
            serde_json::from_slice(r.value.as_deref().unwrap_or_default()).expect("json");
        let sub = r
            .headers
            .get("retry.subscriber")
            .cloned()
            .unwrap_or_default();
        assert_eq!(sub, subscriber, "{topic}: a record for {sub}");
        *per.entry(v["id"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    let doubled: Vec<_> = per.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(doubled.is_empty(), "{topic}: doubled hand-offs {doubled:?}");
    let want: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let have: BTreeSet<&str> = per.keys().map(String::as_str).collect();
    let missing: Vec<_> = want.difference(&have).take(5).collect();
    let unexpected: Vec<_> = have.difference(&want).take(5).collect();
    assert!(missing.is_empty(), "{topic}: lost hand-offs {missing:?}");
    assert!(unexpected.is_empty(), "{topic}: unexpected {unexpected:?}");
}

/// alert-deliver with a failing and a healthy subscriber on a live stream of notifications: every
/// batch hands the failing subscriber's deliveries to the first bucket in one transaction. Its
/// send_offsets is held while the group coordinator's broker is SIGKILLed, then let go: the
/// hand-offs must go on within the transaction timeout + 30 s, and in the end each notification is
/// handed on once per bucket and accepted once per key by the healthy subscriber.
#[test]
#[ignore = "needs the 3-broker cluster: run scripts/test.sh"]
fn deliver_hand_offs_heal_after_a_sigkill_of_the_group_coordinator_inside_send_offsets() {
    deliver_survives("coord-deliver", Loss::Kill);
}

/// As the SIGKILL test, with the group coordinator's broker frozen (SIGSTOP) for 60 s instead.
#[test]
#[ignore = "needs the 3-broker cluster: run scripts/test.sh"]
fn deliver_hand_offs_heal_while_the_group_coordinator_is_frozen_inside_send_offsets() {
    deliver_survives("coord-deliver-stop", Loss::Freeze);
}

fn deliver_survives(test: &str, loss: Loss) {
    let _cluster = cluster_to_myself();
    let cluster = replicated_cluster();
    let kafka = cluster.kafka.clone();
    let failing = Webhook::up(Behaviour::Status(503));
    let healthy = Webhook::up(Behaviour::Ok);
    let prefix = common::prefix(test);
    let _topics = DropTopics::with_prefix(&kafka, &prefix);
    let topic = format!("{prefix}notifications");
    create_topic(&kafka, &topic, 3);
    let dir = std::env::temp_dir().join(format!("{prefix}deliver"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let subscriptions = dir.join("subscriptions.toml");
    let mut toml = String::new();
    for (name, url) in [("failing", failing.url()), ("healthy", healthy.url())] {
        toml.push_str(&format!(
            "[subscribers.{name}]\nurl = \"{url}\"\nsymbols = [\"*\"]\nmax_in_flight = 8\n\n"
        ));
    }
    std::fs::write(&subscriptions, toml).expect("writing subscriptions");
    // Two buckets: the first due at once, the last far beyond the test, so each failing delivery
    // is handed on exactly twice (notifications -> 1s -> 10m) and then stays.
    let (first, last) = (format!("{topic}.retry.1s"), format!("{topic}.retry.10m"));
    let group = format!("{prefix}app-deliver");
    let hold = HoldFile::new(&prefix);
    let metrics_addr = free_addr();
    let mut command = Command::new(env!("CARGO_BIN_EXE_alert-deliver"));
    command
        .args(["--bootstrap", &kafka.bootstrap])
        .args(["--subscriptions", subscriptions.to_str().expect("utf-8")])
        .args(["--topic", &topic, "--buckets", "1s,10m"])
        .args(["--app-id", &format!("{prefix}app"), "--instance-id", "0"])
        .args(["--transaction-timeout", "10s"])
        .args(["--http-connect-timeout", "1s", "--http-timeout", "2s"])
        // No breaker: every failing delivery is tried and handed on the same way.
        .args(["--breaker-failures", "0"])
        .args(["--metrics-addr", &metrics_addr])
        .args(["--test-hold-send-offsets", &hold.arg()])
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,price_alerts=info".into()),
        )
        .stdin(Stdio::null());
    let mut instance = spawn_logged(command, &dir, "deliver-0");
    instance.wait_for("alert-deliver is ready", CAUGHT_UP, || {
        (http_get(&metrics_addr, "/readyz").0 == 200).then_some(())
    });

    // A live stream: 5 notifications every 100 ms for about 60 s, from a thread of its own.
    let producer = {
        let kafka = kafka.clone();
        let topic = topic.clone();
        thread::spawn(move || {
            let feed = Feed::new(&kafka).expect("feed");
            let mut ids = Vec::new();
            for chunk in 0..600u64 {
                let mut records = Vec::new();
                for seq in chunk * 5..chunk * 5 + 5 {
                    let symbol = format!("S{}", seq % 10);
                    let (id, value) = notification(&symbol, seq);
                    ids.push(id);
                    records.push((Some(symbol.into_bytes()), value));
                }
                feed.send_raw(&topic, &records)
                    .expect("producing notifications");
                thread::sleep(Duration::from_millis(100)); // input pacing, not a wait
            }
            ids
        })
    };
    instance.wait_for("hand-offs have begun", CAUGHT_UP, || {
        committed_count(&kafka, &first).filter(|&c| c >= 50)
    });

    // The coordinators first: the hold must stay far below the transaction timeout.
    let coordinator = group_coordinator(&cluster, &group);
    let txn_coordinator = cluster
        .transaction_coordinator(&format!("{group}-0"))
        .map_or_else(|e| format!("unknown ({e:#})"), |id| id.to_string());
    hold.hold();
    instance.wait_for(
        "a hand-off transaction holds before send_offsets",
        HOLD_BOUND,
        || hold.held().then_some(()),
    );
    // Its own count of committed hand-off transactions: read in milliseconds (counting a topic
    // takes seconds, and the held transaction must stay far below its timeout). Held, it cannot
    // commit; the records in the buckets are checked at the end.
    let before = instance.wait_for("the committed transactions are read", HOLD_BOUND, || {
        committed_txns(&metrics_addr)
    });
    eprintln!(
        "held with {before} hand-off transactions committed; group coordinator: broker {coordinator}, transaction coordinator: broker {txn_coordinator}"
    );
    let lost_at = Instant::now();
    let heal_bound = TXN_TIMEOUT + HEAL_MARGIN;
    let how = if loss == Loss::Freeze {
        "SIGSTOP"
    } else {
        "SIGKILL"
    };
    let mut down = Restart {
        cluster: &cluster,
        id: coordinator,
        down: false,
    };
    let mut frozen = None;
    if loss == Loss::Freeze {
        frozen = Some(Frozen::freeze(&cluster, coordinator));
    } else {
        down.down = true;
        cluster
            .stop_broker(coordinator, Stop::Hard)
            .expect("SIGKILL of the group coordinator's broker");
    }
    hold.release();
    let after = instance.wait_for(
        &format!(
            "hand-offs go on within {heal_bound:?} of the {how} of broker {coordinator} (the group coordinator) during send_offsets_to_transaction ({before} committed before)"
        ),
        heal_bound.saturating_sub(lost_at.elapsed()),
        || committed_txns(&metrics_addr).filter(|&c| c > before),
    );
    eprintln!(
        "hand-off transactions committed again ({after}) {:?} after the {how}: {:?} after \
         send_offsets' own deadline",
        lost_at.elapsed(),
        lost_at
            .elapsed()
            .saturating_sub(send_offsets_deadline(TXN_TIMEOUT))
    );
    if let Some(mut frozen) = frozen {
        while lost_at.elapsed() < FROZEN_FOR {
            instance.assert_running("while the broker was frozen");
            thread::sleep(Duration::from_millis(200));
        }
        frozen.thaw();
    } else {
        down.start();
    }

    let ids: Vec<String> = producer.join().expect("the producer finished");
    let n = ids.len() as u64;
    instance.wait_for(
        "every failing delivery reached the last bucket and every healthy one was accepted",
        CAUGHT_UP,
        || {
            (committed_count(&kafka, &last).unwrap_or(0) >= n
                && healthy.accepted().len() == ids.len())
            .then_some(())
        },
    );
    instance.assert_running("before its SIGTERM");
    instance.process.signal("TERM");
    let status = instance.process.wait(EXIT);
    assert!(status.success(), "alert-deliver stops cleanly: {status}");

    assert_exactly_once(&kafka, &first, &ids, "failing");
    assert_exactly_once(&kafka, &last, &ids, "failing");
    let want: BTreeSet<String> = ids.iter().map(|id| format!("{id}/healthy")).collect();
    assert_eq!(
        healthy.accepted(),
        want,
        "the healthy subscriber accepted each once by key"
    );
    for end in [format!("{topic}.dlq"), format!("{topic}.parking-lot")] {
        assert_eq!(
            committed_count(&kafka, &end).unwrap_or(0),
            0,
            "nothing given up: {end}"
        );
    }
}
