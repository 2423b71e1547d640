//! The shipped alert rules against the real binaries, through a real Prometheus (issue 21).
//!
//! promtool's unit tests (tests/deploy.rs) prove the rules against series written by hand. This
//! test proves them against the metrics the stages really export: it starts a `prometheus`
//! server (the distribution's package, as promtool) that scrapes alert-pipeline, alert-sink and
//! alert-deliver every second, with a generated copy of `deploy/prometheus/alerts.yml` in which
//! only the `for:` durations are shortened (the expressions, their windows included, are the
//! shipped ones). It causes each condition for real and asserts through Prometheus' HTTP API
//! that the alert reaches `firing`, and that it clears after recovery where the rule's window
//! lets it clear within minutes. Then it runs every panel of the Grafana dashboard
//! (`deploy/grafana/price-alerts.json`) through the same Prometheus.
//!
//! Everything runs side by side in one test, so that the waits overlap. Two waits were long and
//! are no longer: PartitionWithoutProgress's `changes(...[5m]) == 0` held only once the frozen
//! member's commits before the freeze had left the window (Prometheus now starts after the
//! freeze, so it never saw them), and TransactionsAborting asks for aborts above 5% of every
//! instance's commits, which one aborting instance (at most one abort per 5 s once its back-off
//! has grown) reached only now and then (two abort now). The test took 55-67 s alone here, and
//! 89-94 s in two fresh-clone suite runs.
//!
//! Every stage here runs the classic group protocol, whatever the suite's `GROUP_PROTOCOL`
//! (tests/common): the stalled group needs a frozen member that keeps its partitions for the
//! whole test (a 900 s session), which the consumer protocol's session, the broker's (45 s),
//! does not allow, and the static restarts would be refused while a frozen member holds the id.
//!
//! | alert | caused by | clears in the test |
//! |---|---|---|
//! | DeadLettersWaiting | oversize ticks and injected poison dead-lettered | yes: the limit raised, the faults off, the DLQ replayed |
//! | DeadLetterOlderThanSla | a dead letter stamped 25 h ago in the DLQ (below) | yes, with the replay |
//! | DeadLetterRateSpike | the same dead letters: 4% of the input | no: `rate(...[10m])` keeps them 10 min |
//! | RetryStorm | `--inject-faults` over 5,000 ticks: > 5 failures/s over 5 min | no: `rate(...[5m])` |
//! | CommitsStopped | an instance that aborts every batch (`--test-abort-every 1`) while its input arrives | yes: restarted without it |
//! | TransactionsAborting | the same instance and a second one like it | no: `rate(...[5m])` |
//! | PartitionWithoutProgress | a group member frozen with SIGSTOP while its partitions get input | yes: thawed, it carries on, or its watchdog ends it first (status 75) and it is restarted with the same static id |
//! | SubscriberFailing | a subscriber that refuses connections (its circuit opens) | its circuit closes once it listens; the alert's failure-rate arm keeps `rate(...[5m])` |
//! | DeliveriesGivenUp | a subscriber answering 410 (parking lot), the refused one's exhausted buckets (DLQ) | no: `increase(...[10m])` |
//! | SinkPausedByDatabaseOutage | the sink's database connections cut (a relay, not the shared server) | yes: the relay restored |
//! | SinkDatabaseFlapping | three such cuts | no: `increase(...[30m])` |
//!
//! Not caused here, each for its reason: ConsumerLagGrowing (a lag above 10,000 growing for ten
//! minutes, over a 10-minute `deriv`), DeadLetterPublishFailing and NotAuthorised (a DLQ that
//! cannot be written, a right revoked: the secured broker of tests/security.rs), InstanceFenced
//! (a zombie instance: tests/transactions.rs), TransactionalCallsStuck (a coordinator frozen
//! inside a call: the 3-broker cluster of tests/coordinator.rs). Their metrics are still checked
//! to have series, so none of them is silent for lack of its metric.
//!
//! DeadLetterOlderThanSla's threshold is 24 h. The pipeline stamps a dead letter with the time it
//! writes it, so no run of a test can make one a day old; the test writes one dead letter into
//! the DLQ as the pipeline wrote it (a copy of a real one: key, value, headers) with a record
//! timestamp 25 h back. The watcher, the gauge, the scrape and the shipped rule do the rest.

mod common;

use common::postgres::{free_port, Relay, SinkRun};
use common::webhook::{Behaviour, Webhook};
use common::{free_addr, kafka, Pipeline, Run};
use price_alerts::kafka::config::GroupProtocol;
use price_alerts::rules::Rules;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rust_decimal::Decimal;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What the generated rules' `for:` becomes: an alert fires at the first evaluation after its
/// expression holds for a second.
const FOR: &str = "1s";
/// Bound on a stage's start, and on an alert reaching a state once its cause is in place
/// (scrapes and evaluations every second, watchers every second; a loaded 2-core machine).
const SOON: Duration = Duration::from_secs(180);
/// PartitionWithoutProgress holds once the frozen partitions' committed offsets are still over
/// the window's history: at most five minutes after the freeze.
const STALL: Duration = Duration::from_secs(5 * 60 + 120);
const EXIT: Duration = Duration::from_secs(60);
const PARTITIONS: i32 = 6;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `deploy/prometheus/alerts.yml` with every `for:` set to [`FOR`]; every other line as shipped.
fn rules_for_the_test() -> String {
    let shipped =
        std::fs::read_to_string(repo("deploy/prometheus/alerts.yml")).expect("alerts.yml");
    let generated: Vec<String> = shipped
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: {FOR}", &l[..l.len() - l.trim_start().len()]),
            None => l.to_owned(),
        })
        .collect();
    let changed = shipped
        .lines()
        .zip(&generated)
        .filter(|(a, b)| a != &b.as_str())
        .count();
    assert!(changed > 0, "some rule has a for:");
    generated.join("\n") + "\n"
}

/// A `prometheus` server in a temp dir, stopped when dropped.
struct Prometheus {
    addr: String,
    child: Child,
    dir: PathBuf,
}

impl Prometheus {
    /// Scrapes `jobs` (name, targets) every second and evaluates the test's rules every second.
    fn start(jobs: &[(&str, Vec<String>)]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "{}prometheus",
            price_alerts::kafka::topics::unique_suffix()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("alerts.yml"), rules_for_the_test()).expect("writing rules");
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\nrule_files:\n  - alerts.yml\nscrape_configs:\n",
        );
        for (job, targets) in jobs {
            let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n",
                list.join(", ")
            ));
        }
        std::fs::write(dir.join("prometheus.yml"), config).expect("writing the config");
        let addr = free_addr();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("prometheus not found: install the prometheus package (scripts/test.sh does)");
        let p = Prometheus { addr, child, dir };
        wait_for("Prometheus ready", SOON, || {
            common::http_get(&p.addr, "/-/ready").0 == 200
        });
        // Ready is not scraping: its discovery hands the targets over in rounds of 5 s. A condition
        // caused before the first scrape is missing from every `rate` and `increase`: the bulk's
        // failures before it (838 of 2,172) kept RetryStorm under its threshold in 5 runs of 14.
        let targets = jobs.iter().map(|(_, t)| t.len()).sum::<usize>();
        wait_for("Prometheus scraping every target", SOON, || {
            p.query("up == 1").is_ok_and(|r| r.len() == targets)
        });
        p
    }

    /// `GET path` answered with status success: its `data`.
    fn api(&self, path: &str) -> Result<Value, String> {
        let (status, body) = common::http_get(&self.addr, path);
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{status} {e}: {body}"))?;
        if v["status"] == "success" {
            Ok(v["data"].clone())
        } else {
            Err(format!("{status}: {}", v["error"]))
        }
    }

    /// An instant query's result vector.
    fn query(&self, promql: &str) -> Result<Vec<Value>, String> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(promql)))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The alerts in state `state` (`pending`, `firing`) named `name`, by their labels.
    fn alerts(&self, name: &str, state: &str) -> Vec<BTreeMap<String, String>> {
        let Ok(data) = self.api("/api/v1/alerts") else {
            return Vec::new();
        };
        data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["labels"]["alertname"] == name && a["state"] == state)
            .map(|a| {
                a["labels"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .collect()
    }

    fn firing(&self, name: &str) -> Vec<BTreeMap<String, String>> {
        self.alerts(name, "firing")
    }

    /// Waits until `name` fires (with `label` = `value` when given); returns when it did. When it
    /// does not, the failure shows what the rule's expression and its metrics' series say.
    fn wait_firing(&self, name: &str, label: Option<(&str, &str)>, within: Duration) -> Duration {
        let started = Instant::now();
        let fired = || {
            self.firing(name)
                .iter()
                .any(|a| label.is_none_or(|(k, v)| a.get(k).map(String::as_str) == Some(v)))
        };
        while !fired() {
            assert!(
                started.elapsed() < within,
                "never happened within {within:?}: {name} firing\n{}",
                self.explain(name)
            );
            thread::sleep(Duration::from_millis(250));
        }
        started.elapsed()
    }

    /// The rule `name`'s expression, what it evaluates to now, and every `alerts_` series it
    /// names, summed by their labels but `instance` and `job`.
    fn explain(&self, name: &str) -> String {
        let Ok(groups) = self.api("/api/v1/rules") else {
            return "(the rules could not be read)".into();
        };
        let Some(expr) = groups["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .find(|r| r["name"] == name)
            .and_then(|r| r["query"].as_str().map(str::to_owned))
        else {
            return format!("(no rule {name})");
        };
        let mut out = format!("expr: {expr}\nnow: {:?}", self.query(&expr));
        for q in [
            "sum_over_time(up[5m])",
            "count_over_time(up[5m])",
            "max_over_time(scrape_duration_seconds[5m])",
        ] {
            let r = self.query(q).unwrap_or_default();
            let by: Vec<String> = r
                .iter()
                .map(|v| format!("{} {}", v["metric"]["instance"], v["value"][1]))
                .collect();
            out.push_str(&format!("\n{q}: {by:?}"));
        }
        let metrics: BTreeSet<&str> = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("alerts_"))
            .collect();
        for m in metrics {
            out.push_str(&format!(
                "\n{m}: {:?}",
                self.query(&format!("sum without (instance, job) ({m})"))
            ));
            if m.ends_with("_total") {
                // Each series' first and last samples Prometheus holds, and their times.
                let raw = self.query(&format!("{m}[10m]")).unwrap_or_default();
                for series in raw {
                    let v = series["values"].as_array().cloned().unwrap_or_default();
                    out.push_str(&format!(
                        "\n  {}: {} samples, first {:?}, last {:?}",
                        series["metric"],
                        v.len(),
                        v.first(),
                        v.last()
                    ));
                }
                for range in ["1m", "5m"] {
                    out.push_str(&format!(
                        "\n  increase over {range}: {:?}",
                        self.query(&format!(
                            "sum without (instance, job) (increase({m}[{range}]))"
                        ))
                    ));
                }
            }
        }
        out
    }

    /// Waits until `name` is neither firing nor pending.
    fn wait_cleared(&self, name: &str, within: Duration) -> Duration {
        let started = Instant::now();
        wait_for(&format!("{name} cleared"), within, || {
            self.firing(name).is_empty() && self.alerts(name, "pending").is_empty()
        });
        started.elapsed()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Polls `cond` until it holds, failing after `within`.
fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "never happened within {within:?}: {what}"
        );
        thread::sleep(Duration::from_millis(250));
    }
}

fn tick(symbol: &str, price: i64, seq: u64) -> Vec<u8> {
    format!(r#"{{"symbol":"{symbol}","price":"{price}","seq":{seq}}}"#).into_bytes()
}

/// A seq that the pipeline's fault injection leaves alone (neither poison nor flaky).
fn clean_seq(seq: u64) -> bool {
    !seq.is_multiple_of(7) && !seq.is_multiple_of(25)
}

/// Produces ticks until stopped: a crossing of AAA on the main pipeline every round (a
/// notification for the sink and the deliverer), and one tick on every partition of the stalled
/// group's input and of the aborting instance's input (input that arrives).
fn trickle(
    main: String,
    stalled: String,
    aborting: String,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let producer: FutureProducer = kafka().idempotent_producer().create().expect("producer");
        let send = |topic: &str, partition: Option<i32>, key: &str, value: Vec<u8>| {
            send_tick(&producer, topic, partition, key, value)
        };
        let mut seq = 1_000_000;
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            seq += 1;
            while !clean_seq(seq) {
                seq += 1;
            }
            round += 1;
            let price = if round.is_multiple_of(2) { 90 } else { 110 };
            send(&main, None, "AAA", tick("AAA", price, seq));
            for p in 0..PARTITIONS {
                let symbol = format!("P{p}");
                send(&stalled, Some(p), &symbol, tick(&symbol, price, seq));
            }
            for p in 0..2 {
                send(&aborting, Some(p), "AAA", tick("AAA", price, seq));
            }
            thread::sleep(Duration::from_millis(500)); // input pacing, not a wait for a condition
        }
    })
}

/// Sends one record (to `partition`, or by its key); the trickle shrugs off a failed send.
fn send_tick(
    producer: &FutureProducer,
    topic: &str,
    partition: Option<i32>,
    key: &str,
    value: Vec<u8>,
) {
    let mut record = FutureRecord::to(topic).key(key).payload(&value);
    if let Some(p) = partition {
        record = record.partition(p);
    }
    let _ = futures::executor::block_on(producer.send(record, Duration::from_secs(30)));
}

/// Copies one dead letter of `dlq` (key, value, headers) back into it, stamped `age` ago.
fn dead_letter_aged(dlq: &str, age: Duration) {
    let letters = common::records_with_headers(dlq);
    let letter = letters.first().expect("a dead letter to copy");
    let mut headers = OwnedHeaders::new();
    for (k, v) in &letter.headers {
        headers = headers.insert(Header {
            key: k,
            value: Some(v.as_bytes()),
        });
    }
    let stamped = SystemTime::now()
        .checked_sub(age)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .expect("a time after the epoch")
        .as_millis() as i64;
    let producer: FutureProducer = kafka().idempotent_producer().create().expect("producer");
    let mut record = FutureRecord::to(dlq)
        .payload(letter.value.as_deref().unwrap_or_default())
        .headers(headers)
        .timestamp(stamped);
    if let Some(key) = &letter.key {
        record = record.key(key);
    }
    futures::executor::block_on(producer.send(record, Duration::from_secs(30)))
        .expect("the aged dead letter written");
}

/// Starts alert-deliver on `topic` for `subscribers` (name, url), serving metrics on `addr`.
fn spawn_deliver(
    prefix: &str,
    topic: &str,
    subscribers: &[(&str, String)],
    addr: &str,
) -> Pipeline {
    let mut toml = String::new();
    for (name, url) in subscribers {
        toml.push_str(&format!(
            "[subscribers.{name}]\nurl = \"{url}\"\nsymbols = [\"*\"]\nmax_in_flight = 8\n\n"
        ));
    }
    let dir = std::env::temp_dir().join(format!("{prefix}deliver"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let subscriptions = dir.join("subscriptions.toml");
    std::fs::write(&subscriptions, toml).expect("writing subscriptions");
    let child = Command::new(env!("CARGO_BIN_EXE_alert-deliver"))
        .args(["--bootstrap", &kafka().bootstrap])
        .args(["--subscriptions", subscriptions.to_str().expect("utf-8")])
        .args(["--topic", topic, "--buckets", "1s,2s"])
        .args(["--app-id", &format!("{prefix}app"), "--instance-id", "0"])
        .args([
            "--transaction-timeout",
            "30s",
            "--http-connect-timeout",
            "1s",
        ])
        .args(["--http-timeout", "2s", "--breaker-cooldown", "2s"])
        .args(["--metrics-addr", addr, "--lag-watch-interval", "1s"])
        .args(["--group-protocol", "classic"])
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,price_alerts=info".into()),
        )
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting alert-deliver");
    Pipeline::prefixed(child, "deliver")
}

/// Stops `p` with SIGTERM and waits for it.
fn stop(mut p: Pipeline) {
    p.signal_if_running("TERM");
    let _ = p.wait(EXIT);
}

fn ready(addr: &str) -> bool {
    common::http_get(addr, "/readyz").0 == 200
}

/// Every metric an alert rule's expression names.
fn rule_metrics() -> BTreeSet<String> {
    let shipped =
        std::fs::read_to_string(repo("deploy/prometheus/alerts.yml")).expect("alerts.yml");
    let doc = &yaml_rust2::YamlLoader::load_from_str(&shipped).expect("YAML")[0];
    let mut names = BTreeSet::new();
    for group in doc["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            let expr = rule["expr"].as_str().expect("expr");
            names.extend(
                expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| w.starts_with("alerts_"))
                    .map(str::to_owned),
            );
        }
    }
    names
}

/// Every panel's PromQL of the dashboard, with Grafana's variables replaced by values Prometheus
/// takes (a fixed rate window).
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo("deploy/grafana/price-alerts.json"))
        .expect("deploy/grafana/price-alerts.json");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    let mut panels: Vec<&Value> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .collect();
    while let Some(panel) = panels.pop() {
        // Rows hold panels of their own.
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                let title = panel["title"].as_str().unwrap_or("?").to_owned();
                let expr = expr
                    .replace("$__rate_interval", "1m")
                    .replace("$__interval", "15s")
                    .replace("$__range", "5m");
                out.push((title, expr));
            }
        }
    }
    out
}

#[test]
#[ignore = "needs a Kafka broker and PostgreSQL: run scripts/test.sh"]
fn shipped_alert_rules_fire_on_real_conditions_and_every_dashboard_panel_answers() {
    let started = Instant::now();
    let rules = Rules::from_pairs(
        ["AAA", "P0", "P1", "P2", "P3", "P4", "P5"]
            .map(|s| (s.to_owned(), vec![Decimal::from(100)])),
    );

    // The main pipeline: fault injection on, a small tick limit. Its notifications feed the sink
    // and the deliverer.
    let mut main = Run::new("prom-main", rules.clone());
    main.group_protocol = GroupProtocol::Classic;
    main.create_topics(3);
    main.faults.enabled = true;
    main.max_tick_bytes = 512;
    let main_addr = free_addr();
    main.extra = [
        "--metrics-addr",
        &main_addr,
        "--lag-watch-interval",
        "1s",
        "--dlq-watch-interval",
        "1s",
        // Restarted below: a static member takes its partitions back at once.
        "--static-membership",
    ]
    .map(String::from)
    .to_vec();
    let mut main_p = Some(main.spawn("0"));

    // A group with a member that will freeze, and one that exports the group's lag.
    let stalled = {
        let mut r = Run::new("prom-stall", rules.clone());
        r.group_protocol = GroupProtocol::Classic;
        // The frozen member keeps its partitions (no session expiry) for the whole test. The poll
        // interval is given too: without it the pipeline raises it for its group consumer only,
        // and librdkafka refuses its readers a session longer than their 300 s poll interval.
        // Static membership: the restart after the thaw (its watchdog ends it) takes the
        // partitions back at once instead of waiting for that session to expire.
        r.extra = ["--static-membership", "-X", "session.timeout.ms=900000"]
            .map(String::from)
            .to_vec();
        r
    };
    stalled.create_topics(PARTITIONS);
    let frozen = stalled.spawn("0");
    let watcher_addr = free_addr();
    let watcher = {
        let mut c = stalled.command("1");
        c.args([
            "--metrics-addr",
            &watcher_addr,
            "--lag-watch-interval",
            "1s",
        ]);
        Pipeline::prefixed(
            c.stderr(Stdio::piped()).spawn().expect("starting"),
            "stall-1",
        )
    };

    // Two instances that abort every batch while their input arrives. Two: one aborts at most
    // every 5 s once its back-off has grown (src/backoff.rs), 0.2/s, and TransactionsAborting asks
    // for aborts above 5% of every instance's commits, which the other stages alone make 3 to
    // 4/s here: with one, the rule held only now and then.
    let mut aborting = Run::new("prom-abort", rules.clone());
    aborting.group_protocol = GroupProtocol::Classic;
    aborting.create_topics(2);
    let abort_addrs = [free_addr(), free_addr()];
    let abort_addr = abort_addrs[0].clone();
    let spawn_aborting = |abort: bool| -> Vec<Pipeline> {
        abort_addrs
            .iter()
            .enumerate()
            .map(|(i, addr)| {
                let mut c = aborting.command(&i.to_string());
                // Static members: their restart below takes the partitions back at once, and
                // their first join skips the member-id handshake of KIP-394, which librdkafka
                // sometimes does twice, leaving the group waiting a session timeout (45 s) for
                // the id it dropped (librdkafka #5569).
                c.args(["--metrics-addr", addr, "--lag-watch-interval", "1s"])
                    .arg("--static-membership");
                if abort {
                    c.args(["--test-abort-every", "1"]);
                }
                Pipeline::prefixed(
                    c.stderr(Stdio::piped()).spawn().expect("starting"),
                    &format!("abort-{i}"),
                )
            })
            .collect()
    };
    let mut aborting_p = spawn_aborting(true);

    // The sink, its database behind a relay the test cuts.
    let mut sink = SinkRun::new("prom_sink", &main.output);
    sink.group_protocol = GroupProtocol::Classic;
    sink.extra = ["--reconnect-max", "1s"].map(String::from).to_vec();
    let relay = Relay::start(&sink.db.url);
    let sink_addr = format!("127.0.0.1:{}", free_port());
    let sink_p = {
        let child = sink
            .command(
                "0",
                &[
                    "--metrics-addr".into(),
                    sink_addr.clone(),
                    "--lag-watch-interval".into(),
                    "1s".into(),
                ],
            )
            .env("DATABASE_URL", relay.url(&sink.db.url))
            .spawn()
            .expect("starting alert-sink");
        Pipeline::from(child, "sink")
    };

    // The deliverer: one subscriber that accepts, one that refuses connections until it starts,
    // one that answers 410 Gone.
    let fine = Webhook::up(Behaviour::Ok);
    let mut down = Webhook::down(Behaviour::Ok);
    let gone = Webhook::up(Behaviour::Status(410));
    let deliver_addr = free_addr();
    let deliver_p = spawn_deliver(
        &main.prefix,
        &main.output,
        &[
            ("fine", fine.url()),
            ("down", down.url()),
            ("gone", gone.url()),
        ],
        &deliver_addr,
    );

    for addr in [
        &main_addr,
        &watcher_addr,
        &abort_addrs[0],
        &abort_addrs[1],
        &sink_addr,
        &deliver_addr,
    ] {
        wait_for(&format!("{addr} ready"), SOON, || ready(addr));
    }

    // The stalled group: a tick on every partition, committed, with both members owning some;
    // then the member that owns part of them is frozen, and only then do Prometheus and the
    // trickle start. The frozen partitions' committed offsets stand still in all the history
    // Prometheus has, and PartitionWithoutProgress (`changes(...[5m]) == 0`) holds as soon as
    // their ends move. With Prometheus started first, it held only once the commits before the
    // freeze had left the rule's 5-minute window: about 300 s of the test.
    let producer: FutureProducer = kafka().idempotent_producer().create().expect("producer");
    let mut rounds = 0u64;
    wait_for(
        "the stalled group commits on every partition, the watcher too",
        SOON,
        || {
            rounds += 1;
            for p in 0..PARTITIONS {
                let symbol = format!("P{p}");
                let value = tick(&symbol, 90, rounds);
                send_tick(&producer, &stalled.input, Some(p), &symbol, value);
            }
            thread::sleep(Duration::from_millis(500)); // input pacing, not a wait for a condition
            stalled.committed_per_partition().iter().all(|o| *o > 0)
                && price_alerts::metrics::scrape(
                    &watcher_addr,
                    "alerts_transactions_committed_total",
                ) > 0.0
        },
    );
    // Then its input stops; once all of it is committed, the offsets are final until the trickle.
    let ends = vec![rounds as i64; PARTITIONS as usize];
    wait_for("the stalled group caught up", SOON, || {
        stalled.committed_per_partition() == ends
    });
    let thaw = common::Thaw(frozen.child.id());
    frozen.signal("STOP");
    let frozen_at = Instant::now();
    // No input reaches the stalled group until the trickle starts: its offsets are final.
    let frozen_per_partition = stalled.committed_per_partition();
    let frozen_offsets = frozen_per_partition.iter().sum::<i64>() as f64;
    wait_for("the watcher's gauges show the frozen offsets", SOON, || {
        price_alerts::metrics::scrape(&watcher_addr, "alerts_group_committed_offset")
            == frozen_offsets
    });
    let prom = Prometheus::start(&[
        (
            "pipeline",
            vec![
                main_addr.clone(),
                watcher_addr.clone(),
                abort_addrs[0].clone(),
                abort_addrs[1].clone(),
            ],
        ),
        ("sink", vec![sink_addr.clone()]),
        ("deliver", vec![deliver_addr.clone()]),
    ]);
    let stop_trickle = Arc::new(AtomicBool::new(false));
    let trickler = trickle(
        main.input.clone(),
        stalled.input.clone(),
        aborting.input.clone(),
        Arc::clone(&stop_trickle),
    );

    // Dead letters: 100 oversize ticks, and 5,000 ticks through the fault injection (poison every
    // 25th seq, flaky every 7th: about 2,200 failed attempts, over 5/s across 5 minutes).
    let mut bulk: Vec<(Option<Vec<u8>>, Vec<u8>)> = (1..=5000u64)
        .map(|seq| {
            let symbol = format!("BULK{}", seq % 10);
            (Some(symbol.clone().into_bytes()), tick(&symbol, 50, seq))
        })
        .collect();
    for seq in 1..=100u64 {
        let mut value = tick("BIG", 50, seq);
        value.extend(std::iter::repeat_n(b' ', 600));
        bulk.push((Some(b"BIG".to_vec()), value));
    }
    let feed = price_alerts::kafka::feed::Feed::new(&kafka()).expect("feed");
    feed.send_raw(&main.input, &bulk).expect("loading the bulk");
    wait_for("dead letters in the DLQ", SOON, || {
        price_alerts::metrics::scrape(&main_addr, "alerts_dlq_unhandled") >= 300.0
    });
    dead_letter_aged(&main.topics().dlq, Duration::from_secs(25 * 3600));

    let mut times = BTreeMap::new();
    for name in [
        "DeadLettersWaiting",
        "DeadLetterOlderThanSla",
        "DeadLetterRateSpike",
        "RetryStorm",
        "CommitsStopped",
        "SubscriberFailing",
        "DeliveriesGivenUp",
    ] {
        let label = match name {
            "SubscriberFailing" => Some(("subscriber", "down")),
            "CommitsStopped" => Some(("instance", abort_addr.as_str())),
            _ => None,
        };
        times.insert(name, prom.wait_firing(name, label, SOON));
    }
    assert!(
        prom.firing("SubscriberFailing")
            .iter()
            .all(|a| a["subscriber"] == "down"),
        "only the refusing subscriber fails: {:?}",
        prom.firing("SubscriberFailing")
    );
    let given_up: BTreeSet<String> = prom
        .firing("DeliveriesGivenUp")
        .iter()
        .map(|a| a["topic"].clone())
        .collect();
    assert!(
        given_up.contains(&format!("{}.parking-lot", main.output)),
        "{given_up:?}"
    );

    // The sink's database goes away: the sink pauses, the alert fires; it comes back: it clears.
    // Two more short outages make it flap.
    relay.cut();
    times.insert(
        "SinkPausedByDatabaseOutage",
        prom.wait_firing("SinkPausedByDatabaseOutage", None, SOON),
    );
    relay.restore();
    times.insert(
        "SinkPausedByDatabaseOutage cleared",
        prom.wait_cleared("SinkPausedByDatabaseOutage", SOON),
    );
    for n in [2.0, 3.0] {
        relay.cut();
        wait_for("another outage", SOON, || {
            price_alerts::metrics::scrape(&sink_addr, "alerts_sink_db_outages_total") >= n
        });
        relay.restore();
        wait_for("the sink ready again", SOON, || ready(&sink_addr));
    }
    times.insert(
        "SinkDatabaseFlapping",
        prom.wait_firing("SinkDatabaseFlapping", None, SOON),
    );

    // The aborting instances abort after a back-off that grows to 5 s: 15 aborts in the
    // 5-minute window (0.05/s) take them about a minute. The rule sums over every instance.
    times.insert(
        "TransactionsAborting",
        prom.wait_firing("TransactionsAborting", None, SOON),
    );

    // While every stage runs and every condition holds: no rule is silent for lack of its metric: every metric a rule names has a series.
    let mut missing = Vec::new();
    for metric in rule_metrics() {
        if prom
            .query(&format!("count({metric})"))
            .map(|r| r.is_empty())
            .unwrap_or(true)
        {
            missing.push(metric);
        }
    }
    assert!(
        missing.is_empty(),
        "rules name metrics without a series: {missing:?}"
    );

    // The dashboard: every panel's query parses and answers with at least one series.
    let queries = dashboard_queries();
    assert!(
        queries.len() >= 15,
        "the panels issue 21 lists: {}",
        queries.len()
    );
    let mut failing = Vec::new();
    for (title, expr) in &queries {
        match prom.query(expr) {
            Ok(r) if !r.is_empty() => {}
            Ok(_) => failing.push(format!("{title}: no series: {expr}")),
            Err(e) => failing.push(format!("{title}: {e}: {expr}")),
        }
    }
    assert!(
        failing.is_empty(),
        "dashboard panels without an answer:\n{}",
        failing.join("\n")
    );

    // Recoveries: the subscriber listens; the aborting instance restarts without the hook; the
    // main pipeline restarts with the limit raised and the faults off, and its DLQ is replayed.
    down.start();
    // The rule's other arm (most calls failed over 5 minutes) keeps it firing for up to its
    // window; what recovery changes at once is the circuit, which the next probe closes.
    let closed = Instant::now();
    wait_for("the refused subscriber's circuit closed", SOON, || {
        prom.query(r#"max(alerts_deliver_circuit_state{subscriber="down"}) == 0"#)
            .is_ok_and(|r| !r.is_empty())
    });
    times.insert("SubscriberFailing's circuit closed", closed.elapsed());
    aborting_p.drain(..).for_each(stop);
    aborting_p = spawn_aborting(false);
    times.insert(
        "CommitsStopped cleared",
        prom.wait_cleared("CommitsStopped", SOON),
    );
    stop(main_p.take().expect("running"));
    main.faults.enabled = false;
    main.max_tick_bytes = price_alerts::tick::DEFAULT_MAX_TICK_BYTES;
    main_p = Some(main.spawn("0"));
    wait_for("the main pipeline ready again", SOON, || ready(&main_addr));
    let replay = Command::new(env!("CARGO_BIN_EXE_dlq-replay"))
        .args([
            "--dlq",
            &main.topics().dlq,
            "--bootstrap",
            &kafka().bootstrap,
        ])
        .args(["--transaction-timeout", "30s"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("dlq-replay");
    assert!(
        replay.status.success(),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    times.insert(
        "DeadLettersWaiting cleared",
        prom.wait_cleared("DeadLettersWaiting", SOON),
    );
    times.insert(
        "DeadLetterOlderThanSla cleared",
        prom.wait_cleared("DeadLetterOlderThanSla", SOON),
    );

    // The frozen member: its partitions get input and their committed offsets stand still.
    let frozen_partition = prom.wait_firing(
        "PartitionWithoutProgress",
        Some(("topic", &stalled.input)),
        STALL,
    );
    times.insert("PartitionWithoutProgress", frozen_partition);
    let stuck: BTreeSet<String> = prom
        .firing("PartitionWithoutProgress")
        .iter()
        .filter(|a| a["topic"] == stalled.input)
        .map(|a| a["partition"].clone())
        .collect();
    assert!(
        !stuck.is_empty() && stuck.len() < PARTITIONS as usize,
        "the frozen member's partitions, not the other's: {stuck:?}"
    );
    println!(
        "frozen for {:?} when PartitionWithoutProgress fired",
        frozen_at.elapsed()
    );
    drop(thaw);
    // Thawed, it carries on; or, when the freeze outlasted its watchdog's bound (110 s), the
    // watchdog may end it first (status 75, which asks a supervisor for a restart, played here):
    // the watchdog and the loop wake together at SIGCONT, and which of them runs first is the
    // scheduler's choice (the loop's first beat disarms the stall). Either way its partitions
    // move again.
    let mut frozen = frozen;
    let restarted = loop {
        if let Ok(Some(status)) = frozen.child.try_wait() {
            assert_eq!(
                status.code(),
                Some(75),
                "a thawed member ends only by its watchdog"
            );
            frozen = stalled.spawn("0");
            break true;
        }
        let now = stalled.committed_per_partition();
        let moved = |p: &String| {
            let p: usize = p.parse().expect("partition label");
            now[p] > frozen_per_partition[p]
        };
        if stuck.iter().all(moved) {
            break false;
        }
        assert!(
            frozen_at.elapsed() < STALL + SOON,
            "the thawed member neither ended nor made progress"
        );
        thread::sleep(Duration::from_millis(200));
    };
    println!(
        "thawed member: {}",
        if restarted {
            "ended by its watchdog, restarted"
        } else {
            "carried on"
        }
    );
    times.insert(
        "PartitionWithoutProgress cleared",
        prom.wait_cleared("PartitionWithoutProgress", SOON),
    );

    println!("times: {times:#?}");
    println!("whole test: {:?}", started.elapsed());
    stop_trickle.store(true, Ordering::Relaxed);
    let _ = trickler.join();
    for p in main_p.into_iter().chain(aborting_p) {
        stop(p);
    }
    for p in [sink_p, deliver_p, watcher, frozen] {
        stop(p);
    }
    drop(prom);
}
