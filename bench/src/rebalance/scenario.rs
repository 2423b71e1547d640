//! One run against the broker: fresh topics, the paced stream, three instances, the three events,
//! and the committed offsets polled throughout (the I/O around [`super::idle`]).

use super::idle::{Progress, Window};
use super::{Event, EventResult, Options, RunResult, Session};
use crate::child::{free_port, path_str, with_fresh_topics, ChildGuard};
use anyhow::{anyhow, bail, Context as _};
use price_alerts::kafka::config::GroupProtocol;
use price_alerts::kafka::feed::Feed;
use price_alerts::kafka::logging::Logged;
use price_alerts::kafka::offsets::fetch_committed;
use price_alerts::kafka::read::Reader;
use price_alerts::kafka::topics::Topics;
use price_alerts::kafka::tpl::partition_list;
use price_alerts::kafka::{Isolation, KafkaConfig};
use price_alerts::metrics as m;
use price_alerts::rules::Rules;
use price_alerts::tick::Tick;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use rust_decimal::Decimal;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bound on one OffsetFetch (a healthy one answers in milliseconds).
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Bound on the broker's metadata and config answers.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// librdkafka's `heartbeat.interval.ms`, which the pipeline leaves as it is under classic (the
/// report states this value; one given with `--pipeline-arg` is not read back).
const CLASSIC_HEARTBEAT_MS: u64 = 3_000;

/// The instances at the start, and which of them each event stops; the one that joins.
const FIRST: [usize; 3] = [0, 1, 2];
const STOPPED: usize = 0;
const KILLED: usize = 1;
const JOINING: usize = 3;

/// The session settings of each protocol of `opts`: classic's as the bench sets them on the
/// client, consumer's as the broker holds them (its `group.consumer.*` configs).
pub fn sessions(opts: &Options) -> anyhow::Result<Vec<Session>> {
    let mut out = Vec::new();
    for &p in &opts.protocols {
        out.push(match p {
            GroupProtocol::Classic => Session {
                protocol: p.as_str().to_owned(),
                session_timeout_ms: opts.classic_session_timeout.as_millis() as u64,
                heartbeat_interval_ms: CLASSIC_HEARTBEAT_MS,
                source: "client: session.timeout.ms set by the bench (-X), heartbeat.interval.ms librdkafka's default".to_owned(),
            },
            GroupProtocol::Consumer => {
                let (broker, configs) = broker_settings(&opts.kafka)?;
                let get = |name: &str| -> anyhow::Result<(u64, bool)> {
                    let (value, default) = configs
                        .get(name)
                        .ok_or_else(|| anyhow!("broker {broker} did not return {name}"))?;
                    let ms = value
                        .parse()
                        .with_context(|| format!("broker {broker}: {name}={value}"))?;
                    Ok((ms, *default))
                };
                let (session, session_default) = get("group.consumer.session.timeout.ms")?;
                let (heartbeat, heartbeat_default) = get("group.consumer.heartbeat.interval.ms")?;
                let whose = |default: bool| if default { "default" } else { "set" };
                Session {
                    protocol: p.as_str().to_owned(),
                    session_timeout_ms: session,
                    heartbeat_interval_ms: heartbeat,
                    source: format!(
                        "broker {broker}: group.consumer.session.timeout.ms ({}), group.consumer.heartbeat.interval.ms ({}), assignors {}",
                        whose(session_default),
                        whose(heartbeat_default),
                        configs
                            .get("group.consumer.assignors")
                            .map_or("?", |(v, _)| v.as_str())
                    ),
                }
            }
        });
    }
    Ok(out)
}

/// A broker's configs: name -> (value, whether it is the default).
pub type BrokerConfigs = BTreeMap<String, (String, bool)>;

/// The broker's id and its `group.consumer.*` configs.
pub fn broker_settings(kafka: &KafkaConfig) -> anyhow::Result<(i32, BrokerConfigs)> {
    let reader: Reader = kafka
        .reader(Isolation::ReadUncommitted)
        .create_with_context(Logged)
        .context("creating a metadata reader")?;
    let metadata = reader.fetch_metadata(None, ADMIN_TIMEOUT)?;
    let broker = metadata
        .brokers()
        .first()
        .map(|b| b.id())
        .ok_or_else(|| anyhow!("the cluster's metadata lists no broker"))?;
    let admin: AdminClient<Logged> = kafka
        .admin()
        .create_with_context(Logged)
        .context("creating an admin client")?;
    let results = futures::executor::block_on(admin.describe_configs(
        [&ResourceSpecifier::Broker(broker)],
        &AdminOptions::new().request_timeout(Some(ADMIN_TIMEOUT)),
    ))
    .context("describing the broker's configs")?;
    let resource = results
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no configs returned for broker {broker}"))?
        .map_err(|code| anyhow!("describing broker {broker}: {code}"))?;
    let configs = resource
        .entries
        .iter()
        .filter(|e| e.name.starts_with("group.consumer."))
        .filter_map(|e| Some((e.name.clone(), (e.value.clone()?, e.is_default))))
        .collect();
    Ok((broker, configs))
}

/// One run of `protocol` in `repeat`: every event's idle times. `session` is the protocol's
/// session timeout, which bounds the SIGKILL's settling beyond `opts.event_timeout`.
pub fn run(
    opts: &Options,
    protocol: GroupProtocol,
    repeat: usize,
    session: Duration,
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<RunResult> {
    with_fresh_topics(&opts.kafka, "rebal", opts.partitions, |app_id, topics| {
        let rules = std::env::temp_dir().join(format!("{app_id}-rules.toml"));
        std::fs::write(&rules, rules_of(opts.symbols).to_toml())
            .with_context(|| format!("writing {}", rules.display()))?;
        std::fs::create_dir_all(&opts.log_dir)?;
        let committed = Committed::new(&opts.kafka, app_id, &topics.input, opts.partitions)?;
        // Nothing between the feeder's start and its finish returns early: it would feed on.
        let feeder = Feeder::start(&opts.kafka, &topics.input, opts.symbols, opts.rate);
        let mut play = Play {
            opts,
            protocol,
            repeat,
            app_id,
            topics,
            rules: rules.clone(),
            origin: Instant::now(),
            committed,
            progress: Progress::new(opts.partitions as usize),
            running: BTreeMap::new(),
        };
        let played = play.all(session, progress);
        // The instances go first (their guards kill them), then the stream.
        drop(play);
        let sent = feeder.finish();
        let _ = std::fs::remove_file(&rules);
        let (start_s, events) = played?;
        let (ticks_sent, fed_s) = sent?;
        Ok(RunResult {
            protocol: protocol.as_str().to_owned(),
            repeat,
            start_s,
            events,
            ticks_sent,
            ticks_per_s: ticks_sent as f64 / fed_s,
        })
    })
}

/// Rules for the stream's symbols: one threshold at 100, which the prices cross.
fn rules_of(symbols: usize) -> Rules {
    Rules::from_pairs((0..symbols).map(|i| (symbol(i), vec![Decimal::from(100)])))
}

fn symbol(i: usize) -> String {
    format!("RB{i}")
}

/// The `n`-th tick of the stream: every symbol in turn; each symbol's price climbs 91..110 one
/// step per tick and drops back, so it crosses 100 up once per 20 of its ticks.
fn tick(n: u64, symbols: usize) -> Tick {
    let round = n / symbols as u64;
    Tick {
        symbol: symbol((n % symbols as u64) as usize),
        price: Decimal::from(91 + round % 20),
        seq: round + 1,
        ts: None,
    }
}

/// The paced stream, on a thread of its own until told to stop.
struct Feeder {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<anyhow::Result<(u64, f64)>>,
}

/// The stream goes out in slices this far apart, each sent and acknowledged before the wait for
/// the next: close to a steady stream (pipeline-bench's `PACED_SLICES_PER_SEC` says why).
const SLICE: Duration = Duration::from_millis(10);

impl Feeder {
    fn start(kafka: &KafkaConfig, topic: &str, symbols: usize, rate: usize) -> Feeder {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (kafka, topic, stop) = (kafka.clone(), topic.to_owned(), Arc::clone(&stop));
            std::thread::spawn(move || -> anyhow::Result<(u64, f64)> {
                let feed = Feed::new(&kafka)?;
                let per_slice = (rate as u64 * SLICE.as_millis() as u64 / 1000).max(1);
                let started = Instant::now();
                let mut n = 0u64;
                let mut slice = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let ticks: Vec<Tick> = (n..n + per_slice).map(|k| tick(k, symbols)).collect();
                    feed.send_ticks(&topic, &ticks)?;
                    n += per_slice;
                    slice += 1;
                    let next = started + SLICE * slice;
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                }
                Ok((n, started.elapsed().as_secs_f64()))
            })
        };
        Feeder { stop, thread }
    }

    /// Stops the stream; the ticks it sent, and over how many seconds.
    fn finish(self) -> anyhow::Result<(u64, f64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow!("the tick feeder panicked"))?
            .context("feeding ticks")
    }
}

/// The group's committed offsets, read by a non-member.
struct Committed {
    consumer: Reader,
    tpl: TopicPartitionList,
    topic: String,
    partitions: i32,
}

impl Committed {
    fn new(kafka: &KafkaConfig, group: &str, topic: &str, partitions: i32) -> anyhow::Result<Self> {
        // read_uncommitted: the offsets committed now, without waiting for an open transaction's
        // pending offsets to be decided ("require stable" of a read_committed fetch); only a
        // committed transaction's offsets are ever returned.
        let mut cfg = kafka.reader(Isolation::ReadUncommitted);
        cfg.set("group.id", group);
        Ok(Committed {
            consumer: cfg
                .create_with_context(Logged)
                .context("creating the offsets reader")?,
            tpl: partition_list(topic, 0..partitions),
            topic: topic.to_owned(),
            partitions,
        })
    }

    fn fetch(&self) -> anyhow::Result<Vec<Option<i64>>> {
        let committed = fetch_committed(&self.consumer, &self.tpl, FETCH_TIMEOUT)
            .context("fetching the group's committed offsets")?;
        Ok((0..self.partitions)
            .map(
                |p| match committed.find_partition(&self.topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => Some(o),
                    _ => None,
                },
            )
            .collect())
    }
}

/// A running pipeline instance.
struct Instance {
    child: ChildGuard,
    metrics: String,
    log: PathBuf,
}

/// What marks an event as having fully taken place ([`Window::anchor`]).
#[derive(Debug, Clone, Copy)]
enum Anchor {
    /// At once (the killed process is gone when the signal returns).
    Now,
    /// When this instance's process has exited.
    Exit(usize),
    /// When each of these instances has committed a transaction.
    Committed(&'static [usize]),
}

/// The state of one run.
struct Play<'a> {
    opts: &'a Options,
    protocol: GroupProtocol,
    repeat: usize,
    app_id: &'a str,
    topics: &'a Topics,
    rules: PathBuf,
    /// Time zero of the run's clock.
    origin: Instant,
    committed: Committed,
    progress: Progress,
    running: BTreeMap<usize, Instance>,
}

impl Play<'_> {
    fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    /// The start and the three events: the time to a steady group, and each event's result.
    fn all(
        &mut self,
        session: Duration,
        progress: &mut impl FnMut(&str),
    ) -> anyhow::Result<(f64, Vec<EventResult>)> {
        let timeout = self.opts.event_timeout;
        // Start: every instance committing, and every partition progressing.
        let t0 = self.now();
        for id in FIRST {
            self.spawn(id)?;
        }
        let mut window = Window::open_all(t0, self.opts.partitions as usize);
        let (t, settled) = self.watch(
            &mut window,
            Anchor::Committed(&FIRST),
            Instant::now() + self.opts.start_timeout,
            None,
        )?;
        if !settled {
            bail!(
                "the group did not become steady within {:?} (instances' logs in {})",
                self.opts.start_timeout,
                self.opts.log_dir.display()
            );
        }
        let start_s = window.close(t, true).closed_after;
        progress(&format!(
            "{} #{}: steady {start_s:.1} s after the start",
            self.protocol, self.repeat
        ));

        let mut events = Vec::new();
        for event in Event::ALL {
            let t0 = self.now();
            let mut window = Window::open(t0, &self.progress);
            let mut exit = None;
            let (anchor, deadline) = match event {
                Event::Sigterm => {
                    self.instance(STOPPED)?.child.signal("TERM")?;
                    (Anchor::Exit(STOPPED), timeout)
                }
                Event::Sigkill => {
                    let mut gone = self
                        .running
                        .remove(&KILLED)
                        .ok_or_else(|| anyhow!("instance {KILLED} is not running"))?;
                    gone.child.signal("KILL")?;
                    gone.child.0.wait()?;
                    (Anchor::Now, session + timeout)
                }
                Event::Join => {
                    self.spawn(JOINING)?;
                    (Anchor::Committed(&[JOINING]), timeout)
                }
            };
            let (t, settled) = self.watch(
                &mut window,
                anchor,
                Instant::now() + deadline,
                Some(&mut exit),
            )?;
            let closed = window.close(t, settled);
            let result = EventResult {
                protocol: self.protocol.as_str().to_owned(),
                repeat: self.repeat,
                event,
                idle_s: closed.idle,
                settled: closed.settled,
                anchor_s: closed.anchor_after,
                closed_s: closed.closed_after,
                exit,
            };
            progress(&result.to_string());
            events.push(result);
        }
        Ok((start_s, events))
    }

    fn instance(&self, id: usize) -> anyhow::Result<&Instance> {
        self.running
            .get(&id)
            .ok_or_else(|| anyhow!("instance {id} is not running"))
    }

    /// Polls the committed offsets into `window` every `opts.poll` until it settles (`true`) or
    /// `deadline` passes (`false`); returns the time of the last poll. The anchor is looked for
    /// at each poll; an instance exiting that should not (any but an awaited [`Anchor::Exit`]) is
    /// an error. The exit status of an awaited exit goes to `exit`.
    fn watch(
        &mut self,
        window: &mut Window,
        anchor: Anchor,
        deadline: Instant,
        mut exit: Option<&mut Option<String>>,
    ) -> anyhow::Result<(f64, bool)> {
        let mut next = Instant::now();
        loop {
            let committed = self.committed.fetch()?;
            let t = self.now();
            let advanced = self.progress.observe(t, &committed);
            window.observe(t, &advanced);
            if !window.anchored() && self.anchor_seen(anchor, exit.as_deref_mut())? {
                window.anchor(t);
            }
            self.check_running()?;
            if window.settled(t, self.opts.settle) {
                return Ok((t, true));
            }
            if Instant::now() >= deadline {
                return Ok((t, false));
            }
            next += self.opts.poll;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    }

    fn anchor_seen(
        &mut self,
        anchor: Anchor,
        exit: Option<&mut Option<String>>,
    ) -> anyhow::Result<bool> {
        Ok(match anchor {
            Anchor::Now => true,
            Anchor::Exit(id) => {
                let Some(instance) = self.running.get_mut(&id) else {
                    return Ok(true);
                };
                match instance.child.0.try_wait()? {
                    Some(status) => {
                        if let Some(exit) = exit {
                            *exit = Some(status.to_string());
                        }
                        self.running.remove(&id);
                        true
                    }
                    None => false,
                }
            }
            Anchor::Committed(ids) => ids.iter().all(|id| {
                self.running
                    .get(id)
                    .is_some_and(|i| m::scrape(&i.metrics, m::TRANSACTIONS_COMMITTED) >= 1.0)
            }),
        })
    }

    /// Fails if an instance that should be running has exited.
    fn check_running(&mut self) -> anyhow::Result<()> {
        for (id, instance) in &mut self.running {
            if let Some(status) = instance.child.0.try_wait()? {
                bail!(
                    "instance {id} exited with {status} (its log: {})",
                    instance.log.display()
                );
            }
        }
        Ok(())
    }

    /// Starts instance `id`, its log in the log folder.
    fn spawn(&mut self, id: usize) -> anyhow::Result<()> {
        let opts = self.opts;
        let metrics = format!("127.0.0.1:{}", free_port()?);
        let log = opts.log_dir.join(format!(
            "{}-{}-instance{id}.log",
            self.protocol, self.repeat
        ));
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(&opts.binary);
        cmd.args(["--rules", path_str(&self.rules)?])
            .args([
                "--app-id",
                self.app_id,
                "--bootstrap",
                &opts.kafka.bootstrap,
            ])
            // Its own transactional id; membership as shipped (dynamic).
            .args(["--instance-id", &id.to_string()])
            .args(["--group-protocol", self.protocol.as_str()])
            .args(["--input", &self.topics.input])
            .args(["--output", &self.topics.notifications])
            .args([
                "--commit-interval",
                &format!("{}ms", opts.commit_interval.as_millis()),
            ])
            .args(["--metrics-addr", &metrics]);
        if self.protocol == GroupProtocol::Classic {
            // Explicit, so that the report states it (the consumer protocol's is the broker's).
            cmd.args([
                "-X".to_owned(),
                format!(
                    "session.timeout.ms={}",
                    opts.classic_session_timeout.as_millis()
                ),
            ]);
        }
        let child = cmd
            .args(&opts.pipeline_args)
            // PIPELINE_LOG: the instances' RUST_LOG (with `-X debug=cgrp`, to trace a rebalance).
            .env(
                "RUST_LOG",
                std::env::var("PIPELINE_LOG").unwrap_or_else(|_| "warn,price_alerts=info".into()),
            )
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {}", opts.binary.display()))?;
        self.running.insert(
            id,
            Instance {
                child: ChildGuard(child),
                metrics,
                log,
            },
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_visits_every_symbol_in_turn_with_growing_seqs_and_crossings() {
        let symbols = 3;
        let ticks: Vec<Tick> = (0..60).map(|n| tick(n, symbols)).collect();
        assert_eq!(ticks[0].symbol, "RB0");
        assert_eq!(ticks[4].symbol, "RB1");
        for s in 0..symbols {
            let of: Vec<&Tick> = ticks.iter().filter(|t| t.symbol == symbol(s)).collect();
            assert_eq!(of.len(), 20);
            assert!(of.windows(2).all(|w| w[1].seq == w[0].seq + 1));
            // One upward crossing of 100 in 20 ticks: 99 -> 100 (at or above counts).
            let ups = of
                .windows(2)
                .filter(|w| w[0].price < Decimal::from(100) && w[1].price >= Decimal::from(100))
                .count();
            assert_eq!(ups, 1);
            assert!(of
                .iter()
                .all(|t| price_alerts::tick::valid_symbol(&t.symbol)));
        }
        assert_eq!(rules_of(symbols).len(), symbols);
    }
}
