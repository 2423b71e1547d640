//! The end of a state restore right after the changelog partition's leader is lost (issue 43,
//! item 7), on the 3-broker cluster (`KAFKA_CLUSTER_BOOTSTRAP`; replication 3, min.insync 2).
//!
//! A restore reads its changelog partition to [`End::Decided`]: the high watermark that the fetch
//! response of its first end-of-partition event reported, every transaction below it decided.
//! After a leader election the new leader's high watermark can lag the old leader's: a follower
//! learns the high watermark only from the next fetch response, and the new leader moves its own
//! only once the remaining follower fetches from it. Kafka refuses ListOffsets "latest" in that
//! state (OFFSET_NOT_AVAILABLE, until the high watermark reaches the start offset of the new
//! leader epoch), but Fetch responses report the stale high watermark as it is. A read_committed
//! restore whose first end-of-partition event comes from such a leader ends below records that
//! were acknowledged (and whose transaction commits): the state of the previous batch, and the
//! new owner would redo that batch with stale crossing state.
//!
//! Each round here puts the restore in that window, as it happens: the previous owner writes a
//! batch (the state of every symbol), its records are acknowledged by all three replicas, and
//! the changelog leader is SIGKILLed right then, before any follower has had a fetch response
//! carrying the new high watermark; the previous owner then commits (EndTxn returns once the
//! coordinator has fenced the dead broker). The new owner's restore starts as soon as the
//! metadata names the new leader. Two kinds of round:
//! - plain: nothing else; whether the restore sees the stale high watermark depends on whether its
//!   first fetch reaches the new leader before the remaining follower's does;
//! - follower stalled: the remaining follower is frozen (SIGSTOP) at the election for up to
//!   [`STALL`], as a follower in a GC pause or on a busy machine would be. The new leader's high
//!   watermark stays stale for as long.
//!
//! In every round the state restored during the election must be the committed one: every
//! symbol at the batch's price, as a restore after the cluster is whole again reads it. Before
//! the restore also asked the leader for its high watermark with ListOffsets (which Kafka refuses
//! until a new leader's high watermark has caught up), both kinds of round restored the previous
//! batch for all 400 symbols (2 of 2 rounds); since, the plain round's restore waits about half a
//! second for the new leader, the stalled one until the follower is thawed.
//! `RESTORE_LEADER_ROUNDS` sets the number of rounds (default 2: one of each kind); the test
//! prints, per round, how many symbols came back stale.
//!
//! `KAFKA_SH` names the `scripts/kafka.sh` that started the cluster when it is another checkout's.
//! Whatever else shares the cluster must wait meanwhile: this test kills and freezes brokers.

mod common;

use common::cluster::{broker_pid, cluster, create_changelog_on, signal};
use price_alerts::alert::SymbolState;
use price_alerts::kafka::read::{reader, End};
use price_alerts::kafka::topics::DropTopics;
use price_alerts::kafka::txn::TxnProducer;
use price_alerts::kafka::{Isolation, KafkaConfig};
use price_alerts::pipeline::state::{self, PartitionState};
use price_alerts::tools::chaos::cluster::Cluster;
use rdkafka::consumer::Consumer;
use rdkafka::producer::BaseRecord;
use rust_decimal::Decimal;
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Symbols of the state: one record each per batch, a few tens of kB per batch.
const SYMBOLS: usize = 400;
/// Transaction timeout of the previous owner: its commit waits for the dead leader to be fenced
/// (`broker.session.timeout.ms`, 18 s on the cluster) and must not be aborted meanwhile.
const TXN_TIMEOUT: Duration = Duration::from_secs(90);
/// Until the metadata names the new leader after the SIGKILL (the fence, 18 s, on a loaded machine).
const ELECTION: Duration = Duration::from_secs(90);
/// How long the remaining follower stays frozen at most in a stalled round: the restore's result
/// is awaited that long before the follower is thawed. Far below the broker session (18 s), so
/// that the follower is not fenced (with one broker dead, a frozen one also holds the quorum).
const STALL: Duration = Duration::from_secs(5);
/// Bound of each restore (a loaded machine; the stalled round's includes [`STALL`]).
const RESTORE_BOUND: Duration = Duration::from_secs(90);
/// Until the cluster is fully replicated again after the killed broker comes back.
const REPLICATED: Duration = Duration::from_secs(180);

/// Starts a killed broker again when dropped (unless [`Killed::restart`] did), then waits until
/// the cluster is fully replicated: a failing test leaves the cluster as it found it.
struct Killed<'a> {
    cluster: &'a Cluster,
    id: i32,
    down: bool,
}

impl Killed<'_> {
    fn kill<'a>(cluster: &'a Cluster, id: i32, pid: u32) -> Killed<'a> {
        let guard = Killed {
            cluster,
            id,
            down: true,
        };
        signal(pid, "KILL");
        guard
    }

    fn restart(&mut self) -> Duration {
        if std::mem::take(&mut self.down) {
            self.cluster
                .start_broker(self.id)
                .unwrap_or_else(|e| panic!("starting broker {} again: {e:#}", self.id));
        }
        self.cluster
            .wait_fully_replicated(REPLICATED)
            .expect("the cluster fully replicated again")
    }
}

impl Drop for Killed<'_> {
    fn drop(&mut self) {
        if self.down {
            if let Err(e) = self.cluster.start_broker(self.id) {
                eprintln!("starting broker {} again failed: {e:#}", self.id);
            }
            let _ = self.cluster.wait_fully_replicated(REPLICATED);
        }
    }
}

/// Thaws a frozen broker when dropped, unless [`Frozen::thaw`] did.
struct Frozen {
    pid: u32,
    frozen: bool,
}

impl Frozen {
    fn freeze(pid: u32) -> Frozen {
        let guard = Frozen { pid, frozen: true };
        signal(pid, "STOP");
        guard
    }

    fn thaw(&mut self) {
        if std::mem::take(&mut self.frozen) {
            signal(self.pid, "CONT");
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if self.frozen {
            let _ = Command::new("kill")
                .args(["-CONT", &self.pid.to_string()])
                .status();
        }
    }
}

/// Creates the one-partition compacted changelog `name` with the replicas in `replicas`' order
/// (the first is its leader, the second the next one), and waits until the metadata says so.
fn create_changelog(kafka: &KafkaConfig, name: &str, replicas: &[i32]) {
    create_changelog_on(kafka, name, replicas, &[("min.insync.replicas", "2")]);
}

/// Polls the metadata of `topic` (every 2 ms: the round starts its restore as soon as the new
/// leader is named) until partition 0's leader is `leader`; how long that took.
fn wait_for_leader(
    kafka: &KafkaConfig,
    topic: &str,
    leader: i32,
    timeout: Duration,
) -> Result<Duration, String> {
    let probe = reader(kafka, Isolation::ReadCommitted).expect("metadata client");
    let started = Instant::now();
    let mut last = None;
    loop {
        // Errors while a broker is down are expected: ask again until the deadline.
        if let Ok(md) = probe.fetch_metadata(Some(topic), Duration::from_secs(2)) {
            last = md
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .and_then(|t| t.partitions().first().map(|p| p.leader()));
            if last == Some(leader) {
                return Ok(started.elapsed());
            }
        }
        if started.elapsed() > timeout {
            return Err(format!(
                "{topic}: leader {last:?} after {timeout:?}, wanted {leader}"
            ));
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// One batch of the previous owner: the state of every symbol at `price`, in one transaction,
/// sent and acknowledged (flushed) but not committed.
fn write_batch(owner: &TxnProducer, changelog: &str, price: i64) {
    owner.begin().expect("begin");
    for i in 0..SYMBOLS {
        let value = serde_json::to_vec(&SymbolState {
            price: Decimal::from(price),
            seq: price as u64,
            disarmed: Vec::new(),
        })
        .expect("state as JSON");
        owner
            .send(
                BaseRecord::to(changelog)
                    .partition(0)
                    .key(format!("S{i:04}").as_bytes())
                    .payload(value.as_slice()),
            )
            .expect("send state");
    }
    owner
        .flush(Duration::from_secs(30))
        .expect("batch acknowledged");
}

/// Symbols of a restored partition per price.
fn by_price(s: &PartitionState) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for v in s.values() {
        *out.entry(v.price.to_string()).or_default() += 1;
    }
    out
}

fn restore_once(kafka: &KafkaConfig, changelog: &str) -> anyhow::Result<PartitionState> {
    let r = reader(kafka, Isolation::ReadCommitted)?;
    let mut states = state::restore(&r, changelog, &[0], RESTORE_BOUND)?;
    Ok(states.remove(&0).unwrap_or_default())
}

/// What one round saw.
#[derive(Debug)]
struct Round {
    stalled: bool,
    election: Duration,
    restore_took: Duration,
    /// Symbols per price restored during the election, and after the cluster was whole again.
    during: BTreeMap<String, usize>,
    after: BTreeMap<String, usize>,
}

impl Round {
    /// Symbols the restore during the election did not bring back at the committed price.
    fn stale(&self) -> usize {
        SYMBOLS - self.during.get("2").copied().unwrap_or(0)
    }
}

#[test]
#[ignore = "needs the 3-broker cluster: run scripts/test.sh"]
fn a_restore_during_a_changelog_leader_election_ends_at_the_committed_state() {
    let rounds: usize = std::env::var("RESTORE_LEADER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let cluster = cluster();
    cluster
        .wait_fully_replicated(REPLICATED)
        .expect("the cluster is fully replicated before the test");
    let kafka = &cluster.kafka;
    let prefix = common::prefix("restore-leader");
    let _topics = DropTopics::with_prefix(kafka, &prefix);
    let txn_id = format!("{prefix}app-0");

    // The previous owner, registered first so that Kafka's tool names its coordinator: never the
    // broker killed, so that its commit goes on while the changelog's leader is gone.
    let owner = TxnProducer::start(kafka, &txn_id, TXN_TIMEOUT).expect("previous owner");
    let coordinator = cluster
        .transaction_coordinator(&txn_id)
        .expect("transaction coordinator");
    let others: Vec<i32> = (1..=cluster.brokers)
        .filter(|&b| b != coordinator)
        .collect();
    // Killed: the changelog leader. Next: the coordinator's broker, the new leader. Stalled: the
    // third, the follower that the new leader waits for.
    let (killed, next, stalled) = (others[0], coordinator, others[1]);
    println!(
        "transaction coordinator: broker {coordinator}; changelog leader (killed): broker {killed}; \
         new leader: broker {next}; remaining follower: broker {stalled}"
    );

    let started = Instant::now();
    let mut seen = Vec::new();
    for round in 0..rounds {
        let stall = round % 2 == 1;
        let changelog = format!("{prefix}app-state-{round}");
        create_changelog(kafka, &changelog, &[killed, next, stalled]);
        // Batch 1, committed with every broker up: the state a stale end would restore.
        write_batch(&owner, &changelog, 1);
        owner.commit().expect("batch 1 committed");
        let killed_pid = broker_pid(&cluster, killed);
        let stalled_pid = broker_pid(&cluster, stalled);

        // Batch 2 acknowledged by all three replicas; the leader dies before the followers learn
        // the new high watermark (their next fetch response, up to 500 ms later).
        write_batch(&owner, &changelog, 2);
        let mut down = Killed::kill(&cluster, killed, killed_pid);
        let committer = {
            let owner = Arc::clone(&owner);
            thread::spawn(move || owner.commit())
        };
        let election = wait_for_leader(kafka, &changelog, next, ELECTION)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let mut frozen = stall.then(|| Frozen::freeze(stalled_pid));
        let restore_started = Instant::now();
        let restore = {
            let kafka = kafka.clone();
            let changelog = changelog.clone();
            thread::spawn(move || restore_once(&kafka, &changelog))
        };
        if let Some(f) = frozen.as_mut() {
            // The follower stays frozen until the restore returns, at most STALL.
            while !restore.is_finished() && restore_started.elapsed() < STALL {
                thread::sleep(Duration::from_millis(20));
            }
            f.thaw();
        }
        let during = restore
            .join()
            .expect("restore thread")
            .unwrap_or_else(|e| panic!("round {round}: restore during the election: {e:#}"));
        let restore_took = restore_started.elapsed();
        committer
            .join()
            .expect("commit thread")
            .unwrap_or_else(|e| panic!("round {round}: batch 2's commit: {e}"));
        drop(frozen);
        let replicated = down.restart();
        let after = restore_once(kafka, &changelog)
            .unwrap_or_else(|e| panic!("round {round}: restore after the election: {e:#}"));
        let r = Round {
            stalled: stall,
            election,
            restore_took,
            during: by_price(&during),
            after: by_price(&after),
        };
        println!(
            "round {round} ({}): new leader named {:?} after the kill; restore took {:?}; \
             restored during the election {:?}, after {:?}: {} of {SYMBOLS} symbols stale; \
             fully replicated {replicated:?} after the restart",
            if stall { "follower stalled" } else { "plain" },
            r.election,
            r.restore_took,
            r.during,
            r.after,
            r.stale(),
        );
        assert_eq!(
            r.after.get("2").copied(),
            Some(SYMBOLS),
            "round {round}: batch 2 is committed (a restore on the whole cluster)"
        );
        seen.push(r);
    }
    let stale: Vec<(usize, bool, usize)> = seen
        .iter()
        .enumerate()
        .filter(|(_, r)| r.stale() > 0)
        .map(|(i, r)| (i, r.stalled, r.stale()))
        .collect();
    println!(
        "{} of {rounds} rounds restored a stale state (round, follower stalled, symbols): {stale:?}; {:?} in all",
        stale.len(),
        started.elapsed()
    );
    assert!(
        stale.is_empty(),
        "a restore during the changelog leader's election ended below committed records \
         (round, follower stalled, stale symbols): {stale:?}; End::{:?}",
        End::Decided
    );
}
