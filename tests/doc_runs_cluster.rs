//! The pages' commands on a broker of the local 3-broker cluster (issue 45: every command a page
//! shows runs; `tests/doc_runs.rs` runs the others and names this file as their runner): docs/
//! testing.md's `scripts/kafka.sh broker 2 kill`, `broker 2 start` and `logs --brokers 3
//! --broker 2 -f`, whichever [`doc_commands::lane_test`] gives to [`LaneTest::ClusterBrokers`].
//!
//! They take a broker of the shared cluster down, so they run in scripts/test.sh's cluster lane
//! (this file is one of its `cluster_tests`): its test binaries run one after the other, and the
//! test holds [`cluster_to_myself`] besides. Each command is taken from the page and run as shown,
//! in page order, with one substitution: `scripts/kafka.sh` is the script of the checkout that
//! started the cluster ([`common::cluster::cluster`]: this one's, or `KAFKA_SH`), with the
//! environment the test was given (`KAFKA_CLUSTER_PORT`, `KAFKA_LOG_ROOT`), so it acts on the
//! suite's cluster and no other. Each must exit 0, and do what it says:
//! - `broker K kill|stop`: broker K's JVM is gone;
//! - `broker K start`: broker K runs again, and the test waits until the cluster is fully
//!   replicated (every ISR complete) before it gives the cluster back, as the other cluster tests
//!   do; a broker left down by a failing test is started again all the same;
//! - `logs … -f`: follows the log for ever by design (`tail -F`), so the test waits for its first
//!   line, then kills it; `logs` without `-f` must print a line and exit 0.
//!
//! Broker tests: `#[ignore]`d under a plain `cargo test`; scripts/test.sh runs them.

mod common;
mod doc_commands;

use common::cluster::{broker_pid, cluster, cluster_to_myself};
use doc_commands::{LaneTest, Shown};
use price_alerts::tools::chaos::cluster::Cluster;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a shown command may take to exit (`broker K start` waits for the broker to register,
/// bounded by kafka.sh's own 240 s), and until a followed log prints its first line.
const RUN_BOUND: Duration = Duration::from_secs(300);
const FIRST_LINE: Duration = Duration::from_secs(30);
/// Until the cluster is fully replicated again after a broker comes back (as tests/coordinator.rs).
const REPLICATED: Duration = Duration::from_secs(180);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The commands this file runs, in page order.
fn cluster_commands() -> Vec<Shown> {
    let mut shown: Vec<Shown> = doc_commands::shown_scripts(&root())
        .into_iter()
        .filter(|s| doc_commands::lane_test(s) == Some(LaneTest::ClusterBrokers))
        .collect();
    shown.sort_by(|a, b| (a.page.as_str(), a.line).cmp(&(b.page.as_str(), b.line)));
    shown
}

/// The shown command as it runs here: the cluster's own script, the shown arguments.
fn command_of(cluster: &Cluster, shown: &Shown) -> Command {
    assert!(
        shown.binary == "scripts/kafka.sh" && shown.env.is_empty() && !shown.partial,
        "{shown}: not a whole scripts/kafka.sh command: say here how to run it"
    );
    let mut cmd = Command::new(&cluster.kafka_sh);
    cmd.args(&shown.args).stdin(Stdio::null());
    cmd
}

/// Runs `shown` to its end; its exit code must be 0 within [`RUN_BOUND`]. Returns its stdout.
fn run(cluster: &Cluster, shown: &Shown) -> String {
    let mut child = command_of(cluster, shown)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{shown}: cannot start: {e}"));
    let (mut out, mut err) = (
        child.stdout.take().expect("piped"),
        child.stderr.take().expect("piped"),
    );
    let o = std::thread::spawn(move || std::io::read_to_string(&mut out).unwrap_or_default());
    let e = std::thread::spawn(move || std::io::read_to_string(&mut err).unwrap_or_default());
    let status = doc_commands::wait_bounded(&mut child, RUN_BOUND, &shown.to_string());
    let (stdout, stderr) = (o.join().unwrap_or_default(), e.join().unwrap_or_default());
    eprintln!("{stderr}");
    assert!(
        status.success(),
        "{shown}: exited with {status}: {stdout}{stderr}"
    );
    stdout
}

/// Whether process `pid` still exists (a zombie child of kafka.sh's counts as gone).
/// How long a killed or stopped broker's process may take to exit.
const GONE_WITHIN: Duration = Duration::from_secs(30);

/// Whether process `pid` has exited (or is a zombie) within `bound`.
fn gone_within(pid: u32, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    while running(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// Starts broker `id` again when dropped while it is down, then waits until the cluster is fully
/// replicated: a failing test leaves the cluster as it found it.
struct Down<'a> {
    cluster: &'a Cluster,
    id: Option<i32>,
}

impl Drop for Down<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            if let Err(e) = self.cluster.start_broker(id) {
                eprintln!("starting broker {id} again failed: {e:#}");
            }
            let _ = self.cluster.wait_fully_replicated(REPLICATED);
        }
    }
}

/// Runs a followed log (`logs … -f`) until its first line, then kills it: it never ends by itself.
fn follow_until_first_line(cluster: &Cluster, shown: &Shown) {
    let mut child = command_of(cluster, shown)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{shown}: cannot start: {e}"));
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        let _ = tx.send(lines.next());
        // Read on until it is killed: a pipe closed here would end it (SIGPIPE) at its next line,
        // and it would look as if it had ended by itself.
        lines.for_each(drop);
    });
    let first = rx.recv_timeout(FIRST_LINE);
    let still_running = matches!(child.try_wait(), Ok(None));
    let _ = child.kill();
    let _ = child.wait();
    match first {
        Ok(Some(Ok(line))) => eprintln!("{shown}: first line: {line}"),
        other => panic!("{shown}: no line within {FIRST_LINE:?}: {other:?}"),
    }
    assert!(
        still_running,
        "{shown}: ended by itself instead of following the log"
    );
}

#[test]
fn the_pages_show_cluster_broker_commands() {
    let shown = cluster_commands();
    assert!(
        !shown.is_empty(),
        "the pages show no cluster broker command"
    );
    // A broker a command takes down, a later one of the page starts again.
    let mut down: Vec<&str> = Vec::new();
    for s in &shown {
        if let ["broker", id, action] = s.args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            match action {
                "kill" | "stop" => down.push(id),
                "start" => down.retain(|d| *d != id),
                _ => {}
            }
        }
    }
    assert!(down.is_empty(), "the pages leave brokers {down:?} down");
}

#[test]
#[ignore = "needs the 3-broker cluster: run scripts/test.sh"]
fn the_cluster_commands_of_the_pages_run() {
    let _cluster = cluster_to_myself();
    let started = Instant::now();
    let cluster = cluster();
    cluster
        .wait_fully_replicated(REPLICATED)
        .expect("the cluster is fully replicated before the test");
    let shown = cluster_commands();
    assert!(!shown.is_empty(), "found the commands");
    let mut down = Down {
        cluster: &cluster,
        id: None,
    };
    for s in &shown {
        eprintln!("doc_runs: {s}");
        let at = Instant::now();
        let args: Vec<&str> = s.args.iter().map(String::as_str).collect();
        match args[..] {
            ["broker", id, "kill" | "stop"] => {
                let id: i32 = id.parse().expect("a broker id");
                let pid = broker_pid(&cluster, id);
                down.id = Some(id);
                run(&cluster, s);
                // The signal is sent when kafka.sh returns; a killed JVM takes a moment to exit
                // (a fresh-clone run saw it still running right after).
                assert!(
                    gone_within(pid, GONE_WITHIN),
                    "{s}: broker {id} (pid {pid}) still runs {GONE_WITHIN:?} later"
                );
            }
            ["broker", id, "start"] => {
                let id: i32 = id.parse().expect("a broker id");
                run(&cluster, s);
                let pid = broker_pid(&cluster, id);
                assert!(running(pid), "{s}: broker {id} does not run");
                let took = cluster
                    .wait_fully_replicated(REPLICATED)
                    .expect("the cluster fully replicated again");
                if down.id == Some(id) {
                    down.id = None;
                }
                eprintln!("doc_runs: broker {id} back; fully replicated after {took:?}");
            }
            ["broker", _, "status" | "pid"] => {
                run(&cluster, s);
            }
            ["logs", ..] if args.contains(&"-f") || args.contains(&"--follow") => {
                follow_until_first_line(&cluster, s);
            }
            ["logs", ..] => {
                let out = run(&cluster, s);
                assert!(!out.trim().is_empty(), "{s}: printed no log line");
            }
            _ => panic!("{s}: no way to run it here yet: add one"),
        }
        eprintln!("doc_runs: {s}: ok in {:.1?}", at.elapsed());
    }
    eprintln!(
        "doc_runs: {} cluster commands in {:.1?}",
        shown.len(),
        started.elapsed()
    );
}
