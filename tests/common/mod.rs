//! Helpers of the broker tests: the broker address, fresh names, engine settings, the group
//! protocol.
//!
//! # Two group protocols, one list of tests
//! Every stage a test starts speaks the group protocol of the suite: `GROUP_PROTOCOL`
//! (`classic` by default, or `consumer`, KIP-848), passed as `--group-protocol` to every child
//! and set on [`kafka`]'s configuration for the engines a test runs in-process. So
//! `GROUP_PROTOCOL=consumer scripts/test.sh` runs the whole suite under the consumer protocol.
//! A test that must run under both in every suite takes the protocol as an argument and has a
//! thin `#[test]` per protocol (the `…_under_the_consumer_protocol` ones); what differs between
//! the protocols for a test is here: [`session_args`], [`session_timeout`],
//! [`restart_membership`].
#![allow(dead_code)] // each test binary uses a different subset

pub mod cluster;
pub mod oidc;
pub mod postgres;
pub mod secure;
pub mod webhook;

use price_alerts::kafka::config::{GroupProtocol, KafkaConfig, DEFAULT_BOOTSTRAP};
use price_alerts::kafka::topics::{self, DropTopics, Topics};
use price_alerts::pipeline::EngineSettings;
use price_alerts::rules::Rules;
use price_alerts::tick::DEFAULT_MAX_TICK_BYTES;
use std::sync::Arc;
use std::time::Duration;

/// The broker under test: `KAFKA_BOOTSTRAP`, or the local one of scripts/kafka.sh; its group
/// consumers speak the suite's protocol ([`suite_protocol`]).
pub fn kafka() -> KafkaConfig {
    let mut k = KafkaConfig::new(
        std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| DEFAULT_BOOTSTRAP.to_owned()),
    );
    k.group_protocol = suite_protocol();
    k
}

/// The group protocol of the suite: `GROUP_PROTOCOL` (`classic` or `consumer`), classic when
/// unset. A value that is neither fails the test that asks, naming it.
pub fn suite_protocol() -> GroupProtocol {
    match std::env::var("GROUP_PROTOCOL") {
        Ok(p) => p.parse().unwrap_or_else(|e| panic!("GROUP_PROTOCOL: {e}")),
        Err(_) => GroupProtocol::Classic,
    }
}

/// The broker's session timeout of consumer-protocol members (`group.consumer.session.timeout.ms`:
/// 45 s by default, and no lower than `group.consumer.min.session.timeout.ms`, also 45 s; the
/// brokers of scripts/kafka.sh keep both).
pub const BROKER_CONSUMER_SESSION: Duration = Duration::from_secs(45);

/// `-X session.timeout.ms=<classic>` under the classic protocol; nothing under the consumer
/// protocol, where the session is the broker's and the stages refuse one on the client.
pub fn session_args(protocol: GroupProtocol, classic: Duration) -> Vec<String> {
    match protocol {
        GroupProtocol::Classic => vec![
            "-X".into(),
            format!("session.timeout.ms={}", classic.as_millis()),
        ],
        GroupProtocol::Consumer => Vec::new(),
    }
}

/// How long a member that stopped answering keeps its partitions: `classic` (what
/// [`session_args`] set) under the classic protocol, the broker's session under the consumer one.
pub fn session_timeout(protocol: GroupProtocol, classic: Duration) -> Duration {
    match protocol {
        GroupProtocol::Classic => classic,
        GroupProtocol::Consumer => BROKER_CONSUMER_SESSION,
    }
}

/// The membership of a test that restarts a crashed instance at once with the same id. Classic:
/// static, so the restart takes the partitions back at once (the classic protocol fences the
/// crashed member). Consumer: dynamic, as the broker refuses a static id that a crashed member
/// still holds (UNRELEASED_INSTANCE_ID, fatal) until that member's session expires; the restart
/// joins as a new member and gets the partitions when the crashed one is expired.
pub fn restart_membership(protocol: GroupProtocol) -> &'static [&'static str] {
    match protocol {
        GroupProtocol::Classic => &["--static-membership"],
        GroupProtocol::Consumer => &[],
    }
}

/// A fresh prefix, so tests never share topics, groups or transactional ids.
pub fn prefix(test: &str) -> String {
    format!("t-{test}-{}-", price_alerts::kafka::topics::unique_suffix())
}

/// Deletes the topics named `<prefix>…` when dropped, however the test ends, those that child
/// processes created included. Bind it to a named variable (`let _topics = …`; `let _ = …` drops
/// it at once) declared before the pipelines that write to the topics, so that it drops after
/// them: a producer still running could otherwise create a deleted topic again.
pub fn drop_topics(prefix: &str) -> DropTopics {
    DropTopics::with_prefix(&kafka(), prefix)
}

/// Settings of one engine instance on fresh topics.
pub fn settings(prefix: &str, rules: Rules) -> EngineSettings {
    let app_id = format!("{prefix}app");
    let topics = Topics::with(
        format!("{prefix}market-updates"),
        format!("{prefix}notifications"),
        &app_id,
    );
    EngineSettings::new(kafka(), &app_id, "0", topics, Arc::new(rules))
}

/// Creates the topics of `s` with `partitions` input partitions.
pub fn create_topics(s: &EngineSettings, partitions: i32) {
    futures::executor::block_on(topics::ensure(&s.kafka, &s.topics, Some(partitions)))
        .expect("creating topics");
}

/// Loads raw (key, value) records in `chunks` slices spread over about `spread`, from a thread of
/// its own, so the consumer under test works on a live stream; returns where every record landed.
pub fn load_slowly(
    topic: String,
    records: Vec<(Option<Vec<u8>>, Vec<u8>)>,
    chunks: usize,
    spread: Duration,
) -> std::thread::JoinHandle<Vec<price_alerts::kafka::feed::Landed>> {
    load_slowly_on(kafka(), topic, records, chunks, spread)
}

/// As [`load_slowly`], into the cluster of `kafka`.
pub fn load_slowly_on(
    kafka: KafkaConfig,
    topic: String,
    records: Vec<(Option<Vec<u8>>, Vec<u8>)>,
    chunks: usize,
    spread: Duration,
) -> std::thread::JoinHandle<Vec<price_alerts::kafka::feed::Landed>> {
    load_until_hurried(kafka, topic, records, chunks, spread, Default::default())
}

/// As [`load_slowly_on`], but once `hurry` is set the chunks left go at once: a test that needs
/// a live stream for a while (kills mid-transaction) loads a long one and hurries it when done,
/// so a slow machine cannot run out of stream before the test is through with it.
pub fn load_until_hurried(
    kafka: KafkaConfig,
    topic: String,
    records: Vec<(Option<Vec<u8>>, Vec<u8>)>,
    chunks: usize,
    spread: Duration,
    hurry: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<price_alerts::kafka::feed::Landed>> {
    std::thread::spawn(move || {
        let feed = price_alerts::kafka::feed::Feed::new(&kafka).expect("tick feed");
        let size = records.len().div_ceil(chunks);
        let pause = spread / chunks as u32;
        let mut landed = Vec::new();
        for chunk in records.chunks(size) {
            landed.extend(feed.send_raw(&topic, chunk).expect("loading records"));
            if !hurry.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(pause); // input pacing, not a wait for a condition
            }
        }
        landed
    })
}

/// A running `alert-pipeline` child process.
pub struct Pipeline {
    pub child: std::process::Child,
    pub instance: String,
}

/// Where a pipeline run reads and writes, and with which rules.
pub struct Run {
    pub prefix: String,
    pub app_id: String,
    pub input: String,
    pub output: String,
    pub rules_path: std::path::PathBuf,
    pub rules: Rules,
    /// Extra arguments for every instance.
    pub extra: Vec<String>,
    /// Live alerts: the instances join the rules topic (`--live-rules`) instead of the file.
    pub live: bool,
    /// Fault injection the instances run with (the verifier must know).
    pub faults: price_alerts::dlq::FaultInjection,
    /// --max-tick-bytes of the instances (the verifier must agree on what is oversize).
    pub max_tick_bytes: usize,
    /// --transaction-timeout of the instances. Longer than the production default (10 s): a
    /// shared CI machine once stalled the broker for about 9 s, the coordinator then aborted the
    /// open transaction for its timeout and fenced the instance, which stops by design. The tests
    /// restart after SIGKILL with the same id, so the timeout never delays them otherwise.
    pub transaction_timeout: &'static str,
    /// The cluster the run reads and writes: [`kafka`] unless made with [`Run::on`].
    pub kafka: KafkaConfig,
    /// The group protocol of every instance (`--group-protocol`): the suite's unless set.
    pub group_protocol: GroupProtocol,
    /// The run's topics go when the run does (see [`drop_topics`]); last, so dropped last.
    _topics: DropTopics,
}

impl Run {
    /// A fresh run of `test` with `rules` written to a temp file.
    pub fn new(test: &str, rules: Rules) -> Self {
        Self::on(kafka(), test, rules)
    }

    /// As [`Run::new`], on the cluster of `kafka` (the 3-broker one, say).
    pub fn on(kafka: KafkaConfig, test: &str, rules: Rules) -> Self {
        let prefix = prefix(test);
        let dir = std::env::temp_dir().join(format!("{prefix}rules"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let rules_path = dir.join("rules.toml");
        std::fs::write(&rules_path, rules.to_toml()).expect("writing rules");
        Run {
            _topics: DropTopics::with_prefix(&kafka, &prefix),
            app_id: format!("{prefix}app"),
            input: format!("{prefix}market-updates"),
            output: format!("{prefix}notifications"),
            prefix,
            rules_path,
            rules,
            extra: Vec::new(),
            live: false,
            faults: Default::default(),
            max_tick_bytes: DEFAULT_MAX_TICK_BYTES,
            transaction_timeout: "30s",
            kafka,
            group_protocol: suite_protocol(),
        }
    }

    pub fn topics(&self) -> Topics {
        Topics::with(self.input.clone(), self.output.clone(), &self.app_id)
    }

    /// Creates the input topic and the processor's topics.
    pub fn create_topics(&self, partitions: i32) {
        futures::executor::block_on(topics::ensure(
            &self.kafka,
            &self.topics(),
            Some(partitions),
        ))
        .expect("topics");
    }

    /// Starts instance `instance` of the pipeline as a child process. Its log lines reach the
    /// test's stderr prefixed with `[instance]` (see [`Pipeline::prefixed`]).
    pub fn spawn(&self, instance: &str) -> Pipeline {
        let child = self
            .command(instance)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starting alert-pipeline");
        Pipeline::prefixed(child, instance)
    }

    /// The command line of instance `instance`, for a test that wants to change how it runs
    /// (its stderr, say) before it starts it with [`Pipeline::from`].
    pub fn command(&self, instance: &str) -> std::process::Command {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_alert-pipeline"));
        match self.live {
            true => command.arg("--live-rules"),
            false => command.args(["--rules", self.rules_path.to_str().expect("utf-8 path")]),
        };
        command
            .args(["--app-id", &self.app_id, "--instance-id", instance])
            .args(["--input", &self.input, "--output", &self.output])
            .args(["--bootstrap", &self.kafka.bootstrap])
            .args(&self.extra)
            .args(self.faults.enabled.then_some("--inject-faults"))
            .args(["--max-tick-bytes", &self.max_tick_bytes.to_string()])
            .args(["--transaction-timeout", self.transaction_timeout])
            .args(["--group-protocol", self.group_protocol.as_str()])
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,price_alerts=info".into()),
            )
            .stdin(std::process::Stdio::null());
        // The suite runs with overlapped commits when OVERLAP_COMMITS is set in its environment;
        // a run that pins a mode the overlap does not go with (at least once) keeps its own.
        if self.extra.iter().any(|a| a == "at-least-once") {
            command.env_remove("OVERLAP_COMMITS");
        }
        command
    }

    /// The group's committed offset on each input partition (0 where none).
    pub fn committed_per_partition(&self) -> Vec<i64> {
        price_alerts::kafka::offsets::committed_offsets(&self.kafka, &self.app_id, &self.input)
            .expect("committed offsets")
            .into_iter()
            .map(|o| o.unwrap_or(0))
            .collect()
    }

    /// Sum of the group's committed offsets over the input partitions.
    pub fn committed(&self) -> i64 {
        self.committed_per_partition().into_iter().sum()
    }

    /// Waits until the group's committed offsets reach `target` on every partition (the position
    /// after the last loaded record), or fails after `timeout`.
    pub fn wait_committed(&self, target: &std::collections::BTreeMap<i32, i64>, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let committed = price_alerts::kafka::offsets::committed_offsets(
                &self.kafka,
                &self.app_id,
                &self.input,
            )
            .expect("committed offsets");
            if target
                .iter()
                .all(|(p, o)| committed.get(*p as usize).copied().flatten() == Some(*o))
            {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "committed {committed:?} never reached {target:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The verifier's report for this run.
    pub fn verify(&self) -> price_alerts::oracle::VerifyReport {
        if self.live {
            return price_alerts::oracle::verify_live(
                &self.kafka,
                &self.input,
                &self.output,
                &format!("{}-rules", self.app_id),
                self.max_tick_bytes,
                self.faults,
            )
            .expect("verifier runs");
        }
        price_alerts::oracle::verify(
            &self.kafka,
            &self.input,
            &self.output,
            &self.rules,
            self.max_tick_bytes,
            self.faults,
        )
        .expect("verifier runs")
    }
}

impl Pipeline {
    /// As [`Pipeline::prefixed`], and the flag returned is set once a line of its stderr
    /// contains `needle` (a log line that says it got somewhere, "engine started" say).
    pub fn prefixed_watching(
        child: std::process::Child,
        instance: &str,
        needle: &'static str,
    ) -> (Self, std::sync::Arc<std::sync::atomic::AtomicBool>) {
        let (p, mut seen) = Self::prefixed_watching_all(child, instance, &[needle]);
        (p, seen.remove(0))
    }

    /// As [`Pipeline::prefixed_watching`], one flag per needle, in their order.
    pub fn prefixed_watching_all(
        mut child: std::process::Child,
        instance: &str,
        needles: &[&'static str],
    ) -> (Self, Vec<std::sync::Arc<std::sync::atomic::AtomicBool>>) {
        let seen: Vec<_> = needles
            .iter()
            .map(|_| std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)))
            .collect();
        if let Some(stderr) = child.stderr.take() {
            let tag = instance.to_owned();
            let watched: Vec<_> = needles
                .iter()
                .copied()
                .zip(seen.iter().map(std::sync::Arc::clone))
                .collect();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    for (needle, flag) in &watched {
                        if line.contains(needle) {
                            flag.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    eprintln!("[{tag}] {line}");
                }
            });
        }
        (Pipeline::from(child, instance), seen)
    }

    /// A pipeline started from [`Run::command`].
    pub fn from(child: std::process::Child, instance: &str) -> Self {
        Pipeline {
            child,
            instance: instance.to_owned(),
        }
    }

    /// A pipeline whose stderr was piped: a thread copies its lines to the test's stderr, each
    /// prefixed with `[instance]`, so that the logs of several instances can be told apart. The
    /// thread inherits the test's output capture: a failing test shows them, a passing one does
    /// not (unless run with `--nocapture`). It ends when the child's stderr closes.
    pub fn prefixed(mut child: std::process::Child, instance: &str) -> Self {
        if let Some(stderr) = child.stderr.take() {
            let tag = instance.to_owned();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(stderr).lines() {
                    match line {
                        Ok(line) => eprintln!("[{tag}] {line}"),
                        Err(_) => break,
                    }
                }
            });
        }
        Pipeline::from(child, instance)
    }

    /// Sends a signal (SIGKILL, SIGTERM) to the child.
    pub fn signal(&self, sig: &str) {
        let status = std::process::Command::new("kill")
            .args([format!("-{sig}"), self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{sig} failed");
    }

    /// Sends a signal unless the child has exited already.
    pub fn signal_if_running(&mut self, sig: &str) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal(sig);
        }
    }

    /// Waits for the child to exit, at most `timeout`; returns its exit status.
    pub fn wait(mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("instance {} did not exit within {timeout:?}", self.instance);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // A failing test must not leave processors running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free port on 127.0.0.1 for an instance's HTTP endpoint.
pub fn free_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port();
    format!("127.0.0.1:{port}")
}

/// `GET path` on `addr`: the status code and the body (status 0 while nothing answers).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    if s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .is_err()
    {
        return (0, String::new());
    }
    let mut response = String::new();
    let _ = s.read_to_string(&mut response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Produces one record with `headers` to `topic` and waits for it; returns where it landed.
pub fn produce_with_headers(
    topic: &str,
    key: &str,
    value: &[u8],
    headers: &[(&str, &str)],
) -> price_alerts::kafka::feed::Landed {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = kafka().idempotent_producer().create().expect("producer");
    let mut owned = OwnedHeaders::new();
    for (k, v) in headers {
        owned = owned.insert(Header {
            key: k,
            value: Some(*v),
        });
    }
    let record = FutureRecord::to(topic)
        .key(key)
        .payload(value)
        .headers(owned);
    let d = futures::executor::block_on(producer.send(record, Duration::from_secs(30)))
        .expect("delivered");
    price_alerts::kafka::feed::Landed {
        partition: d.partition,
        offset: d.offset,
    }
}

/// A record as read back.
#[derive(Debug)]
pub struct ReadRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// Headers as text.
    pub headers: std::collections::BTreeMap<String, String>,
}

/// Every record of `topic` (read_committed).
pub fn records_with_headers(topic: &str) -> Vec<ReadRecord> {
    records_with_headers_on(&kafka(), topic)
}

/// As [`records_with_headers`], from the cluster of `kafka`.
pub fn records_with_headers_on(kafka: &KafkaConfig, topic: &str) -> Vec<ReadRecord> {
    use price_alerts::kafka::read::{read_topic_to_end, DEFAULT_READ_TIMEOUT};
    use rdkafka::message::Headers;
    use rdkafka::Message;
    let mut out = Vec::new();
    read_topic_to_end(
        kafka,
        topic,
        price_alerts::kafka::Isolation::ReadCommitted,
        DEFAULT_READ_TIMEOUT,
        |m| {
            let mut headers = std::collections::BTreeMap::new();
            if let Some(h) = m.headers() {
                for h in h.iter() {
                    headers.insert(
                        h.key.to_owned(),
                        String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                    );
                }
            }
            out.push(ReadRecord {
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers,
            });
            Ok(())
        },
    )
    .expect("reading the topic");
    out
}

/// Sends SIGCONT to a child when dropped, however the test ends: a failing test never leaves a
/// frozen process behind (declare it after the child, so it thaws the child before the child's
/// own guard stops it).
pub struct Thaw(pub u32);

impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// A classic group as DescribeGroups answers it: its state and how many members it has (None if
/// the broker did not answer). A group the broker does not have (never made, or an empty one
/// its cleanup deleted) is `Dead` with no member, as Kafka names it; librdkafka lists nothing for
/// it. DescribeGroups does not describe consumer-protocol groups.
pub fn classic_group(group: &str) -> Option<(String, usize)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let client: BaseConsumer = kafka().admin().create().expect("a client");
    let list = client
        .fetch_group_list(Some(group), Duration::from_secs(10))
        .ok()?;
    Some(match list.groups().first() {
        Some(g) => (g.state().to_string(), g.members().len()),
        None => ("Dead".to_owned(), 0),
    })
}

/// Starts a stage with `spawn` and stops it with SIGTERM `rounds` times (each must exit within
/// `exit`), each stop a different
/// moment (400 ms more each round) after the classic group `group` is Stable with it alone; after
/// each exit (which must be a success) the group must have no member. Panics naming the rounds
/// whose stopped member was still in the group; before the next round it waits for the broker
/// to expire such a member. The stages' leave at close (src/kafka/group.rs, `leave`).
pub fn assert_each_sigterm_leaves_the_group(
    what: &str,
    rounds: usize,
    group: &str,
    exit: Duration,
    spawn: impl Fn() -> Pipeline,
) {
    let mut stayed = Vec::new();
    for round in 0..rounds {
        let p = spawn();
        let started = std::time::Instant::now();
        while classic_group(group) != Some(("Stable".into(), 1)) {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "round {round}: never joined"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(400 * round as u64));
        p.signal("TERM");
        let status = p.wait(exit);
        assert!(status.success(), "round {round}: {status}");
        let after = classic_group(group);
        println!("round {round}: after the exit the group is {after:?}");
        if after.as_ref().map(|(_, members)| *members) != Some(0) {
            stayed.push((round, after));
            // The next round must not join a group still waiting for the dead member.
            let waited = std::time::Instant::now();
            while classic_group(group).map(|(_, m)| m) != Some(0) {
                assert!(waited.elapsed() < Duration::from_secs(90), "never expired");
                std::thread::sleep(Duration::from_millis(250));
            }
        }
    }
    assert!(
        stayed.is_empty(),
        "{} of {rounds} stopped {what} were still in the group after they exited: {stayed:?}",
        stayed.len()
    );
}
