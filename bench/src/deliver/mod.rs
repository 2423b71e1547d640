//! What alert-deliver delivers, and what its guarantees cost (`deliver-bench`).
//!
//! Every run gets a fresh notifications topic and application id (so its own retry buckets, DLQ
//! and parking lot), and the runner as a child process, as it is deployed. The subscribers are
//! paths of one local receiver in the bench's process ([`receiver`]): 200 at once, counted by
//! `Idempotency-Key`.
//! - **Throughput.** `deliveries / fan-out` notifications are pre-loaded; the runner starts; the
//!   clock runs from the receiver's first accepted request to the one that completes the last
//!   (notification, subscriber) key. deliveries/s = keys / that time.
//! - **The reference** ([`reference`]) is a plain at-most-once loop with alert-deliver's own HTTP
//!   client and per-subscriber bound, and none of its guarantees. deliver / reference is the
//!   cost of the guarantees; the two run one after the other in each repeat, so drift on a shared
//!   machine hits both.
//! - **Fan-out** is how many subscribers want each notification (`symbols = ["*"]`); the
//!   **population** is how many the subscriptions file holds: the others each want two symbols
//!   that never occur, the many-subscribers-on-few-symbols shape of a real file, which costs
//!   matching and memory but no request.
//! - **Latency.** Notifications are written in a transaction every 20 ms, at half the repeat's
//!   saturation rate (deliver, fan-out 10); latency = a key's first accept - the return of the
//!   `commit_transaction` that made its notification visible (both on the bench's clock).
//! - **Resources.** The runner's peak RSS (`VmHWM`) and CPU seconds (utime + stime, at 100 ticks
//!   a second) from /proc when its last key is accepted, per 10,000 deliveries; start-up is
//!   included (a fraction of a second).
//! - **Outage.** One of the ten subscribers refuses connections (its URL is a port nobody
//!   listens on) or hangs (its requests are accepted and never answered): the other nine's
//!   deliveries/s and latency, against no outage. An outage run measures the outage as it lasts,
//!   not its onset: a warm-up of [`WARM_UP`] notifications goes first, and the measured ones are
//!   written once the outage's circuit has opened. The onset is measured on its own: the
//!   **detection** time, from the warm-up's first accept to the circuit's opening (a hanging
//!   subscriber holds a batch for the delivery deadline until then).
//!
//! [`cli`] is `deliver-bench`'s command line (the benchmark's and the reference's) and the flow
//! its `main` runs.

pub mod cli;
pub mod plot;
pub mod receiver;
pub mod reference;

use crate::child::{free_port, peak_rss_kib, wait_until, ChildGuard};
use crate::stats::{median, percentile, Spread};
use anyhow::{bail, Context as _};
use price_alerts::kafka::feed::Feed;
use price_alerts::kafka::topics::{create_topics, unique_suffix, Cleanup, DropTopics, TopicSpec};
use price_alerts::kafka::KafkaConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
use receiver::Receiver;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub kafka: KafkaConfig,
    /// The folder of the release binaries (`alert-deliver`, `deliver-bench`).
    pub bin_dir: PathBuf,
    pub repeats: usize,
    /// Deliveries per throughput run (the notifications are this divided by the fan-out).
    pub deliveries: usize,
    pub partitions: i32,
    pub fanouts: Vec<usize>,
    /// Subscribers in the file for the population runs (deliver only), at `population_fanout`.
    pub populations: Vec<usize>,
    /// The fan-out of the keep-alive, population, latency and outage runs.
    pub population_fanout: usize,
    /// How long each latency run writes notifications.
    pub latency_for: Duration,
    /// Only the fan-out runs (deliver and the reference at each of `fanouts`): a quick A/B of
    /// alert-deliver's settings or builds.
    pub throughput_only: bool,
    /// Where the runners' logs go.
    pub log_dir: PathBuf,
    /// Extra arguments for alert-deliver (e.g. `--max-batch 1000`), to find where its time goes.
    pub deliver_args: Vec<String>,
    /// The runners' RUST_LOG.
    pub runner_log: String,
}

/// Who delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Runner {
    Deliver,
    Reference,
}

/// One subscriber out of service during the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Outage {
    None,
    /// Connections refused.
    Refuse,
    /// Requests accepted, never answered.
    Hang,
}

/// What one run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Measure {
    /// Pre-loaded backlog: deliveries/s.
    Throughput,
    /// Paced at this many notifications a second: latency.
    Latency { rate: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Case {
    pub runner: Runner,
    pub measure: Measure,
    pub fanout: usize,
    /// Subscribers in the file (at least the fan-out).
    pub population: usize,
    pub keep_alive: bool,
    pub outage: Outage,
}

impl Case {
    pub fn label(&self) -> String {
        let mut s = format!(
            "{} fan-out {}",
            match self.runner {
                Runner::Deliver => "deliver",
                Runner::Reference => "reference",
            },
            self.fanout
        );
        if self.population != self.fanout {
            let _ = write!(s, ", {} in the file", self.population);
        }
        if !self.keep_alive {
            s.push_str(", new connection per request");
        }
        match self.outage {
            Outage::None => {}
            Outage::Refuse => s.push_str(", 1 subscriber refusing"),
            Outage::Hang => s.push_str(", 1 subscriber hanging"),
        }
        if let Measure::Latency { .. } = self.measure {
            s.push_str(", paced");
        }
        s
    }

    fn healthy(&self) -> usize {
        match self.outage {
            Outage::None => self.fanout,
            Outage::Refuse | Outage::Hang => self.fanout - 1,
        }
    }
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub repeat: usize,
    pub case: Case,
    /// Keys to accept: notifications x healthy subscribers.
    pub keys: usize,
    pub deliveries_per_sec: f64,
    /// Requests beyond one per key (at-least-once repeats).
    pub repeats_seen: u64,
    pub peak_rss_mib: f64,
    pub cpu_s_per_10k: f64,
    pub latency_p50_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
    /// Outage runs: seconds from the warm-up's first accept to the outage's circuit opening.
    pub detection_s: Option<f64>,
}

/// Notifications of an outage run's warm-up: enough for the breaker's default 3 failures in the
/// first batch.
pub const WARM_UP: usize = 20;

/// The throughput cases of one repeat, in the order they run.
pub fn throughput_cases(opts: &Options) -> Vec<Case> {
    let case = |runner, fanout, population, keep_alive, outage| Case {
        runner,
        measure: Measure::Throughput,
        fanout,
        population,
        keep_alive,
        outage,
    };
    let f = opts.population_fanout;
    let mut cases = Vec::new();
    for &fanout in &opts.fanouts {
        for runner in [Runner::Deliver, Runner::Reference] {
            cases.push(case(runner, fanout, fanout, true, Outage::None));
        }
    }
    if opts.throughput_only {
        return cases;
    }
    for runner in [Runner::Deliver, Runner::Reference] {
        cases.push(case(runner, f, f, false, Outage::None));
    }
    for &population in opts.populations.iter().filter(|&&p| p > f) {
        cases.push(case(Runner::Deliver, f, population, true, Outage::None));
    }
    for outage in [Outage::Refuse, Outage::Hang] {
        cases.push(case(Runner::Deliver, f, f, true, outage));
    }
    cases
}

/// Runs the repeats; `progress` is told of each run.
pub fn run(opts: &Options, mut progress: impl FnMut(&RunResult)) -> anyhow::Result<Vec<RunResult>> {
    let receiver = Receiver::start()?;
    std::fs::create_dir_all(&opts.log_dir)?;
    let mut out = Vec::new();
    for repeat in 0..opts.repeats {
        for case in throughput_cases(opts) {
            let r = one(opts, &receiver, case, repeat)
                .with_context(|| format!("{} (repeat {repeat})", case.label()))?;
            progress(&r);
            out.push(r);
        }
        if opts.throughput_only {
            continue;
        }
        // Half of this repeat's saturation, deliver at the fan-out of the latency runs.
        let saturated = out
            .iter()
            .find(|r| {
                r.repeat == repeat
                    && r.case.runner == Runner::Deliver
                    && r.case.fanout == opts.population_fanout
                    && r.case.population == opts.population_fanout
                    && r.case.keep_alive
                    && r.case.outage == Outage::None
            })
            .map(|r| r.deliveries_per_sec)
            .context("no deliver run at the latency runs' fan-out")?;
        let rate = ((saturated / 2.0) / opts.population_fanout as f64).max(1.0) as usize;
        for outage in [Outage::None, Outage::Refuse, Outage::Hang] {
            let case = Case {
                runner: Runner::Deliver,
                measure: Measure::Latency { rate },
                fanout: opts.population_fanout,
                population: opts.population_fanout,
                keep_alive: true,
                outage,
            };
            let r = one(opts, &receiver, case, repeat)
                .with_context(|| format!("{} (repeat {repeat})", case.label()))?;
            progress(&r);
            out.push(r);
        }
    }
    Ok(out)
}

/// The subscriptions file of `case`: `hot-i` (or `hang-0`) wanting every symbol, and the rest of
/// the population each wanting two symbols that never occur.
fn subscriptions(case: &Case, url: impl Fn(&str) -> String, refused: &str) -> String {
    let mut toml = String::new();
    for i in 0..case.fanout {
        let (name, url) = match (i, case.outage) {
            (0, Outage::Refuse) => ("refused-0".to_owned(), format!("{refused}/hook/refused-0")),
            (0, Outage::Hang) => ("hang-0".to_owned(), url("hang-0")),
            _ => (format!("hot-{i}"), url(&format!("hot-{i}"))),
        };
        let _ = writeln!(
            toml,
            "[subscribers.{name}]\nurl = \"{url}\"\nsymbols = [\"*\"]\n"
        );
    }
    for i in 0..case.population.saturating_sub(case.fanout) {
        let (a, b) = (
            price_alerts::tools::generate::symbol(1_000 + 2 * i),
            price_alerts::tools::generate::symbol(1_001 + 2 * i),
        );
        let _ = writeln!(
            toml,
            "[subscribers.cold-{i}]\nurl = \"{}\"\nsymbols = [\"{a}\", \"{b}\"]\n",
            url(&format!("cold-{i}"))
        );
    }
    toml
}

/// The (name, URL) of each subscriber that wants every notification, for the reference.
pub fn hot_urls(toml: &str) -> anyhow::Result<Vec<(String, String)>> {
    #[derive(serde::Deserialize)]
    struct File {
        subscribers: std::collections::BTreeMap<String, Sub>,
    }
    #[derive(serde::Deserialize)]
    struct Sub {
        url: String,
        symbols: Vec<String>,
    }
    let file: File = toml::from_str(toml)?;
    Ok(file
        .subscribers
        .into_iter()
        .filter(|(_, s)| s.symbols.iter().any(|x| x == "*"))
        .map(|(name, s)| (name, s.url))
        .collect())
}

/// CPU seconds (user + system) of a process so far, from /proc/PID/stat (Linux, 100 ticks a
/// second).
fn cpu_seconds(pid: u32) -> Option<f64> {
    cpu_seconds_of(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU seconds from the text of /proc/PID/stat.
fn cpu_seconds_of(stat: &str) -> Option<f64> {
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Stops the runner (SIGKILL: nothing of its shutdown is measured); its CPU seconds and peak RSS
/// (MiB) first.
fn stop(child: ChildGuard) -> (f64, f64) {
    let pid = child.0.id();
    (
        cpu_seconds(pid).unwrap_or(f64::NAN),
        peak_rss_kib(pid).unwrap_or(0) as f64 / 1024.0,
    )
}

/// The runner of `case` as a child process.
fn start(
    opts: &Options,
    case: &Case,
    topic: &str,
    app: &str,
    subscriptions: &Path,
    log: &Path,
) -> anyhow::Result<(ChildGuard, Option<String>)> {
    let mut metrics = None;
    let mut c = match case.runner {
        Runner::Deliver => {
            let mut c = Command::new(opts.bin_dir.join("alert-deliver"));
            c.arg("--subscriptions")
                .arg(subscriptions)
                .args(["--topic", topic, "--app-id", app])
                .args(&opts.deliver_args);
            // Served as in production, where they are scraped: the gauges' readers run too.
            let addr = format!("127.0.0.1:{}", free_port()?);
            c.args(["--metrics-addr", &addr]);
            metrics = Some(addr);
            c
        }
        Runner::Reference => {
            let mut c = Command::new(opts.bin_dir.join("deliver-bench"));
            c.arg("reference")
                .arg("--subscriptions")
                .arg(subscriptions)
                .args(["--topic", topic])
                .args(["--partitions", &opts.partitions.to_string()]);
            c
        }
    };
    c.args(["--bootstrap", &opts.kafka.bootstrap])
        .env("RUST_LOG", &opts.runner_log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?);
    Ok((
        ChildGuard(c.spawn().context("starting the runner")?),
        metrics,
    ))
}

/// An outage run's warm-up: [`WARM_UP`] notifications delivered to the healthy subscribers and
/// the outage subscriber's circuit open (or half-open); the receiver is then reset. Returns the
/// seconds from the warm-up's first accept to the circuit seen open (polled every 100 ms).
fn warm_up(
    opts: &Options,
    receiver: &Receiver,
    case: &Case,
    topic: &str,
    metrics: Option<&str>,
) -> anyhow::Result<Option<f64>> {
    let Some(addr) = metrics.filter(|_| case.outage != Outage::None) else {
        return Ok(None);
    };
    Feed::new(&opts.kafka)?.send_raw(topic, &crate::sink::notifications(WARM_UP, 1))?;
    wait_until(Duration::from_secs(120), "the warm-up accepted", || {
        receiver.distinct() >= WARM_UP * case.healthy()
    })?;
    // 0 closed, 1 open, 2 half-open; only the outage subscriber's circuit can leave 0.
    wait_until(
        Duration::from_secs(120),
        "the outage's circuit open",
        || price_alerts::metrics::scrape(addr, "alerts_deliver_circuit_state") >= 1.0,
    )?;
    let opened = Instant::now();
    let (accepted, _) = take_seen(receiver);
    let first = accepted
        .iter()
        .min()
        .context("nothing of the warm-up accepted")?;
    Ok(Some(opened.duration_since(*first).as_secs_f64()))
}

/// One run of `case`, on fresh topics.
fn one(
    opts: &Options,
    receiver: &Receiver,
    case: Case,
    repeat: usize,
) -> anyhow::Result<RunResult> {
    let prefix = format!("dbench-{}-", unique_suffix());
    let _drop = DropTopics::with_prefix(&opts.kafka, &prefix);
    let topic = format!("{prefix}notifications");
    let app = format!("{prefix}app");
    futures::executor::block_on(create_topics(
        &opts.kafka,
        &[TopicSpec {
            name: topic.clone(),
            partitions: opts.partitions,
            cleanup: Cleanup::Delete,
            retention: None,
        }],
    ))?;
    receiver.set_close(!case.keep_alive);
    receiver.reset();
    let refused = format!("http://127.0.0.1:{}", free_port()?);
    let toml = subscriptions(&case, |name| receiver.url(name), &refused);
    let file = std::env::temp_dir().join(format!("{prefix}subscriptions.toml"));
    std::fs::write(&file, &toml)?;
    let log = opts.log_dir.join(format!(
        "{repeat}-{}.log",
        case.label().replace([' ', ','], "_")
    ));
    let result = match case.measure {
        Measure::Throughput => throughput(opts, receiver, &case, &topic, &app, &file, &log, repeat),
        Measure::Latency { rate } => latency(
            opts, receiver, &case, rate, &topic, &app, &file, &log, repeat,
        ),
    };
    let _ = std::fs::remove_file(&file);
    result
}

/// Keys accepted: their first accept times, and the requests beyond one per key.
fn take_seen(receiver: &Receiver) -> (Vec<Instant>, u64) {
    let seen = receiver.reset();
    let keys = seen.first.len() as u64;
    (
        seen.first.into_values().collect(),
        seen.requests.saturating_sub(keys),
    )
}

#[allow(clippy::too_many_arguments)]
fn throughput(
    opts: &Options,
    receiver: &Receiver,
    case: &Case,
    topic: &str,
    app: &str,
    subscriptions: &Path,
    log: &Path,
    repeat: usize,
) -> anyhow::Result<RunResult> {
    let notifications = (opts.deliveries / case.fanout).max(1);
    let records = crate::sink::notifications(notifications, 5_000 + repeat as u64);
    let keys = notifications * case.healthy();
    // Pre-loaded, or for an outage run written after its warm-up (the runner then waits at the
    // end of its input, and the clock starts at the first accept as for the others).
    let feed = Feed::new(&opts.kafka)?;
    if case.outage == Outage::None {
        feed.send_raw(topic, &records)?;
    }
    let (child, metrics) = start(opts, case, topic, app, subscriptions, log)?;
    let detection_s = warm_up(opts, receiver, case, topic, metrics.as_deref())?;
    if case.outage != Outage::None {
        feed.send_raw(topic, &records)?;
    }
    wait_until(Duration::from_secs(900), "every key accepted", || {
        receiver.distinct() >= keys
    })?;
    let (cpu, rss) = stop(child);
    let (accepted, repeats_seen) = take_seen(receiver);
    let (Some(first), Some(last)) = (accepted.iter().min(), accepted.iter().max()) else {
        bail!("nothing accepted");
    };
    let took = last.duration_since(*first).as_secs_f64().max(1e-3);
    Ok(RunResult {
        repeat,
        case: *case,
        keys,
        deliveries_per_sec: keys as f64 / took,
        repeats_seen,
        peak_rss_mib: rss,
        cpu_s_per_10k: cpu / (keys as f64 / 10_000.0),
        latency_p50_ms: None,
        latency_p99_ms: None,
        detection_s,
    })
}

#[allow(clippy::too_many_arguments)]
fn latency(
    opts: &Options,
    receiver: &Receiver,
    case: &Case,
    rate: usize,
    topic: &str,
    app: &str,
    subscriptions: &Path,
    log: &Path,
    repeat: usize,
) -> anyhow::Result<RunResult> {
    const EVERY: Duration = Duration::from_millis(20);
    const CALL: Duration = Duration::from_secs(30);
    let total = (rate as f64 * opts.latency_for.as_secs_f64()) as usize + 1;
    let records = crate::sink::notifications(total, 9_000 + repeat as u64);
    let ids: Vec<String> = records
        .iter()
        .map(|(_, v)| {
            serde_json::from_slice::<serde_json::Value>(v)
                .ok()
                .and_then(|j| j["id"].as_str().map(str::to_owned))
                .unwrap_or_default()
        })
        .collect();
    let producer: BaseProducer = opts
        .kafka
        .transactional_producer(&format!("{app}-bench-writer"), Duration::from_secs(30))?
        .create()
        .context("creating the bench's transactional producer")?;
    producer.init_transactions(CALL)?;
    let (child, metrics) = start(opts, case, topic, app, subscriptions, log)?;
    let detection_s = warm_up(opts, receiver, case, topic, metrics.as_deref())?;
    // The first notification alone, until it is accepted: the runner owns its partitions.
    let mut committed: HashMap<&str, Instant> = HashMap::new();
    let mut write = |range: std::ops::Range<usize>| -> anyhow::Result<()> {
        producer.begin_transaction()?;
        for i in range.clone() {
            let (key, value) = &records[i];
            let mut r = BaseRecord::<Vec<u8>, Vec<u8>>::to(topic).payload(value);
            if let Some(key) = key {
                r = r.key(key);
            }
            producer.send(r).map_err(|(e, _)| e)?;
        }
        producer.commit_transaction(CALL)?;
        let at = Instant::now();
        for id in &ids[range] {
            committed.insert(id, at);
        }
        Ok(())
    };
    write(0..1)?;
    wait_until(
        Duration::from_secs(120),
        "the first notification accepted",
        || receiver.distinct() >= case.healthy(),
    )?;
    let started = Instant::now();
    let mut sent = 1;
    while sent < total {
        let due = ((started.elapsed().as_secs_f64() * rate as f64) as usize + 1).min(total);
        if due > sent {
            write(sent..due)?;
            sent = due;
        }
        std::thread::sleep(EVERY);
    }
    let paced_for = started.elapsed();
    let keys = total * case.healthy();
    wait_until(Duration::from_secs(600), "every key accepted", || {
        receiver.distinct() >= keys
    })?;
    let (cpu, rss) = stop(child);
    let seen = receiver.reset();
    let mut latencies: Vec<f64> = seen
        .first
        .iter()
        .filter_map(|(key, accepted)| {
            let id = key.rsplit_once('/')?.0;
            let at = committed.get(id)?;
            Some(accepted.saturating_duration_since(*at).as_secs_f64() * 1_000.0)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    Ok(RunResult {
        repeat,
        case: *case,
        keys,
        deliveries_per_sec: keys as f64 / paced_for.as_secs_f64(),
        repeats_seen: seen.requests.saturating_sub(seen.first.len() as u64),
        peak_rss_mib: rss,
        cpu_s_per_10k: cpu / (keys as f64 / 10_000.0),
        latency_p50_ms: percentile(&latencies, 50.0),
        latency_p99_ms: percentile(&latencies, 99.0),
        detection_s,
    })
}

/// One case over the repeats.
#[derive(Debug, Clone, Serialize)]
pub struct CaseSummary {
    pub case: Case,
    pub deliveries_per_sec: Option<Spread>,
    /// Median over the repeats of deliver / reference at the same fan-out and connection mode
    /// (deliver runs only, where a reference ran).
    pub ratio_to_reference: Option<f64>,
    /// Median over the repeats of this run / the no-outage run (outage runs only).
    pub ratio_to_no_outage: Option<f64>,
    pub latency_p50_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
    pub peak_rss_mib: Option<f64>,
    pub cpu_s_per_10k: Option<f64>,
    pub repeats_seen: u64,
    /// Outage runs: median seconds until the outage's circuit opened.
    pub detection_s: Option<f64>,
}

/// A case without its paced rate (which changes per repeat).
fn kind(c: &Case) -> Case {
    let mut c = *c;
    if let Measure::Latency { .. } = c.measure {
        c.measure = Measure::Latency { rate: 0 };
    }
    c
}

pub fn summarize(results: &[RunResult]) -> Vec<CaseSummary> {
    let mut kinds: Vec<Case> = Vec::new();
    for r in results {
        if !kinds.contains(&kind(&r.case)) {
            kinds.push(kind(&r.case));
        }
    }
    let paired = |r: &RunResult, other: Case| {
        results
            .iter()
            .find(|o| o.repeat == r.repeat && kind(&o.case) == other)
            .map(|o| r.deliveries_per_sec / o.deliveries_per_sec)
    };
    kinds
        .into_iter()
        .map(|k| {
            let runs: Vec<&RunResult> = results.iter().filter(|r| kind(&r.case) == k).collect();
            let of = |f: fn(&RunResult) -> Option<f64>| -> Option<f64> {
                median(&runs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
            };
            let ratio_to_reference = (k.runner == Runner::Deliver && k.outage == Outage::None)
                .then(|| {
                    let reference = Case {
                        runner: Runner::Reference,
                        ..k
                    };
                    median(
                        &runs
                            .iter()
                            .filter_map(|r| paired(r, reference))
                            .collect::<Vec<_>>(),
                    )
                })
                .flatten();
            let ratio_to_no_outage = (k.outage != Outage::None)
                .then(|| {
                    let healthy = Case {
                        outage: Outage::None,
                        ..k
                    };
                    // Healthy deliveries/s: the outage run delivers to one subscriber fewer.
                    median(
                        &runs
                            .iter()
                            .filter_map(|r| paired(r, healthy))
                            .map(|x| x * k.fanout as f64 / k.healthy() as f64)
                            .collect::<Vec<_>>(),
                    )
                })
                .flatten();
            CaseSummary {
                case: k,
                deliveries_per_sec: Spread::of(
                    &runs
                        .iter()
                        .map(|r| r.deliveries_per_sec)
                        .collect::<Vec<_>>(),
                ),
                ratio_to_reference,
                ratio_to_no_outage,
                latency_p50_ms: of(|r| r.latency_p50_ms),
                latency_p99_ms: of(|r| r.latency_p99_ms),
                peak_rss_mib: of(|r| Some(r.peak_rss_mib)),
                cpu_s_per_10k: of(|r| Some(r.cpu_s_per_10k)),
                repeats_seen: runs.iter().map(|r| r.repeats_seen).sum(),
                detection_s: of(|r| r.detection_s),
            }
        })
        .collect()
}

fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

pub fn table(summaries: &[CaseSummary]) -> String {
    let mut t = String::from(
        "| case | deliveries/s median (min-max) | / reference | / no outage | p50 ms | p99 ms | peak RSS MiB | CPU s per 10k | repeated requests | detection s |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in summaries {
        let rate = s.deliveries_per_sec.map_or_else(
            || "-".to_owned(),
            |d| format!("{:.0} ({:.0}-{:.0})", d.median, d.min, d.max),
        );
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.case.label(),
            rate,
            fmt(s.ratio_to_reference, 2),
            fmt(s.ratio_to_no_outage, 2),
            fmt(s.latency_p50_ms, 0),
            fmt(s.latency_p99_ms, 0),
            fmt(s.peak_rss_mib, 1),
            fmt(s.cpu_s_per_10k, 2),
            s.repeats_seen,
            fmt(s.detection_s, 1)
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use price_alerts::deliver::subscriptions::Subscriptions;

    fn case(fanout: usize, population: usize, outage: Outage) -> Case {
        Case {
            runner: Runner::Deliver,
            measure: Measure::Throughput,
            fanout,
            population,
            keep_alive: true,
            outage,
        }
    }

    #[test]
    fn a_subscriptions_file_has_the_fan_out_and_the_population_the_case_says() {
        let url = |name: &str| format!("http://127.0.0.1:1/hook/{name}");
        for (c, hot) in [
            (case(10, 10, Outage::None), 10),
            (case(10, 10_000, Outage::None), 10),
            (case(10, 100, Outage::Refuse), 10),
            (case(1, 1, Outage::None), 1),
        ] {
            let toml = subscriptions(&c, url, "http://127.0.0.1:2");
            // alert-deliver's own parser accepts it, with every subscriber in it.
            let parsed = Subscriptions::parse(&toml, "bench").expect("a valid file");
            assert_eq!(parsed.len(), c.population);
            // Exactly `fanout` subscribers want a notification's symbol; none of the others does.
            let symbol = price_alerts::tools::generate::symbol(7);
            assert_eq!(parsed.of_symbol(&symbol).count(), hot, "{c:?}");
            // The reference delivers to the same ones.
            assert_eq!(hot_urls(&toml).expect("parsed").len(), hot);
        }
        let refusing = subscriptions(&case(10, 10, Outage::Refuse), url, "http://127.0.0.1:2");
        assert!(refusing.contains("http://127.0.0.1:2/hook/refused-0"));
        let hanging = subscriptions(&case(10, 10, Outage::Hang), url, "http://127.0.0.1:2");
        assert!(hanging.contains("[subscribers.hang-0]"));
    }

    #[test]
    fn cpu_seconds_are_read_past_a_command_name_with_spaces() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
        let stat = "4242 (alert deliver) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 125 0 0 20 0 9 0";
        assert_eq!(cpu_seconds_of(stat), Some(3.75));
        assert_eq!(cpu_seconds_of("garbage"), None);
    }

    #[test]
    fn ratios_pair_each_repeat_with_its_own_reference() {
        let result = |repeat, runner, rate| RunResult {
            repeat,
            case: Case {
                runner,
                ..case(10, 10, Outage::None)
            },
            keys: 1,
            deliveries_per_sec: rate,
            repeats_seen: 0,
            peak_rss_mib: 0.0,
            cpu_s_per_10k: 0.0,
            latency_p50_ms: None,
            latency_p99_ms: None,
            detection_s: None,
        };
        let results = [
            result(0, Runner::Deliver, 800.0),
            result(0, Runner::Reference, 1000.0),
            result(1, Runner::Deliver, 400.0),
            result(1, Runner::Reference, 400.0),
            result(2, Runner::Deliver, 900.0),
            result(2, Runner::Reference, 1000.0),
        ];
        let s = summarize(&results);
        let deliver = s
            .iter()
            .find(|s| s.case.runner == Runner::Deliver)
            .expect("deliver summarised");
        // Paired: 0.8, 1.0, 0.9 -> 0.9 (unpaired medians would say 800 / 1000 = 0.8).
        assert_eq!(deliver.ratio_to_reference, Some(0.9));
        assert_eq!(deliver.deliveries_per_sec.map(|d| d.median), Some(800.0));
    }
}
