//! `rules-bench`: how soon an alert put with `alert-rules put` is in force (issue 42's goal: its
//! first possible notification within 1 s of the put returning, p99, at 1,000 ticks/s).
//!
//! One `alert-pipeline --live-rules` over a paced stream: every symbol's price swings between 90
//! and 110 on each of its ticks, so each of its ticks crosses 100. Puts, one at a time at a steady
//! pace, each of an alert at 100 (both directions) on a symbol that had none: the first
//! notification naming it, read by a read_committed reader, ends the measure. That time holds
//! the put's own acknowledgement wait (not counted: the clock starts when the put returns), the
//! wait for that symbol's next tick (at most the tick period), the barrier round trip, and the
//! commit. The tick period is `symbols / rate`: 100 symbols at 1,000 ticks/s is 100 ms.

pub mod cli;

use crate::child::{free_port, with_fresh_topics, ChildGuard};
use crate::stats::percentile;
use anyhow::{bail, Context as _};
use price_alerts::kafka::feed::Feed;
use price_alerts::kafka::read::reader;
use price_alerts::kafka::tpl::position_list;
use price_alerts::kafka::{Isolation, KafkaConfig};
use price_alerts::rules::live::{Alert, Watch};
use price_alerts::tick::Tick;
use price_alerts::tools::alerts::RulesTopic;
use rdkafka::consumer::Consumer;
use rdkafka::{Message, Offset};
use rust_decimal::Decimal;
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub kafka: KafkaConfig,
    pub binary: PathBuf,
    pub partitions: i32,
    /// Symbols of the paced stream (each without an alert until its put).
    pub symbols: usize,
    /// Ticks per second over all symbols.
    pub rate: usize,
    /// Alerts put, one at a time.
    pub puts: usize,
    /// Time between two puts.
    pub every: Duration,
    pub commit_interval: String,
}

/// What was measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub puts: usize,
    /// Puts whose alert fired (every one should).
    pub fired: usize,
    /// Put returned -> first notification read, per put (ms), in put order.
    pub in_force_ms: Vec<f64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The tick period of one symbol (ms): a bound on the wait for its next tick.
    pub tick_period_ms: f64,
    /// How long each put took to be acknowledged (ms), in put order.
    pub put_ms: Vec<f64>,
    /// The timestamp of the tick whose notification was the first, less the put's return (ms):
    /// where the in-force time went (the join: this; the commit and the read: the rest).
    pub tick_after_put_ms: Vec<f64>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "puts {}, fired {}; put returned -> first notification: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (a symbol's tick period {:.0} ms)",
            self.puts, self.fired, self.p50_ms, self.p99_ms, self.max_ms, self.tick_period_ms
        )
    }
}

pub fn run(opts: &Options) -> anyhow::Result<Report> {
    with_fresh_topics(&opts.kafka, "lbench", opts.partitions, |app_id, topics| {
        let kafka = &opts.kafka;
        let rules = rt()?.block_on(RulesTopic::open(kafka, app_id, None, &topics.input))?;
        let metrics_addr = format!("127.0.0.1:{}", free_port()?);
        let child = Command::new(&opts.binary)
            .args([
                "--live-rules",
                "--app-id",
                app_id,
                "--bootstrap",
                &kafka.bootstrap,
            ])
            .args(["--input", &topics.input, "--output", &topics.notifications])
            .args(["--commit-interval", &opts.commit_interval])
            .args(["--metrics-addr", &metrics_addr])
            // PIPELINE_LOG: the pipeline's RUST_LOG, to read where a hold's time goes.
            .env(
                "RUST_LOG",
                std::env::var("PIPELINE_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", opts.binary.display()))?;
        let child = ChildGuard(child);
        let deadline = Instant::now() + Duration::from_secs(120);
        while price_alerts::metrics::scrape(&metrics_addr, "alerts_partitions_restored_total")
            < f64::from(opts.partitions)
        {
            if Instant::now() > deadline {
                bail!("the pipeline never reported its partitions restored");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // The reader of the notifications: the first time each alert id is seen.
        let seen: Arc<Mutex<HashMap<String, (Instant, String)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let tail = {
            let (kafka, topic, seen, stop) = (
                kafka.clone(),
                topics.notifications.clone(),
                Arc::clone(&seen),
                Arc::clone(&stop),
            );
            let partitions = opts.partitions;
            std::thread::spawn(move || -> anyhow::Result<()> {
                let r = reader(&kafka, Isolation::ReadCommitted)?;
                r.assign(&position_list(
                    &topic,
                    (0..partitions).map(|p| (p, Offset::Beginning)),
                )?)?;
                while !stop.load(Ordering::Relaxed) {
                    let Some(Ok(m)) = r.poll(Duration::from_millis(20)) else {
                        continue;
                    };
                    let n: price_alerts::alert::Notification =
                        match serde_json::from_slice(m.payload().unwrap_or_default()) {
                            Ok(n) => n,
                            Err(_) => continue,
                        };
                    if let (Some(a), Ok(mut seen)) = (n.alert, seen.lock()) {
                        seen.entry(a.id)
                            .or_insert_with(|| (Instant::now(), n.tick_ts.clone()));
                    }
                }
                Ok(())
            })
        };
        // The paced stream, in 10 ms slices.
        let feeder = {
            let (kafka, topic, stop) = (kafka.clone(), topics.input.clone(), Arc::clone(&stop));
            let (symbols, rate) = (opts.symbols, opts.rate);
            std::thread::spawn(move || -> anyhow::Result<()> {
                let feed = Feed::new(&kafka)?;
                let per_slice = (rate / 100).max(1);
                let started = Instant::now();
                let mut n = 0u64;
                let mut slice = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let ticks: Vec<Tick> = (0..per_slice)
                        .map(|_| {
                            let i = n as usize % symbols;
                            let round = n / symbols as u64;
                            n += 1;
                            Tick {
                                symbol: format!("LB{i}"),
                                price: Decimal::from(if round.is_multiple_of(2) {
                                    90
                                } else {
                                    110
                                }),
                                seq: round + 1,
                                ts: None,
                            }
                        })
                        .collect();
                    feed.send_ticks(&topic, &ticks)?;
                    slice += 1;
                    let next = started + Duration::from_millis(10 * slice);
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                }
                Ok(())
            })
        };
        // Warm up: every symbol has a price before the first put.
        std::thread::sleep(Duration::from_secs(3));
        let runtime = rt()?;
        let mut returned = Vec::with_capacity(opts.puts);
        let mut put_ms = Vec::with_capacity(opts.puts);
        for k in 0..opts.puts {
            let alert = Alert {
                symbol: format!("LB{}", k % opts.symbols),
                threshold: Decimal::from(100),
                direction: Watch::Both,
                subscriber: None,
                one_shot: false,
                rearm_band: None,
            };
            let id = format!("lb-{k}");
            let asked = Instant::now();
            runtime.block_on(rules.put(&id, &alert))?;
            put_ms.push(asked.elapsed().as_secs_f64() * 1e3);
            returned.push((id, Instant::now(), std::time::SystemTime::now()));
            std::thread::sleep(opts.every);
        }
        // The last put's notification: a few tick periods and a commit.
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        let fed = feeder.join();
        let tailed = tail.join();
        drop(child);
        match (fed, tailed) {
            (Ok(Ok(())), Ok(Ok(()))) => {}
            (Ok(Err(e)), _) | (_, Ok(Err(e))) => return Err(e),
            _ => bail!("a bench thread panicked"),
        }
        let seen = seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        let mut in_force_ms: Vec<f64> = Vec::new();
        let mut tick_after_put_ms: Vec<f64> = Vec::new();
        for (id, at, wall) in &returned {
            if let Some((t, tick_ts)) = seen.get(id) {
                in_force_ms.push(t.saturating_duration_since(*at).as_secs_f64() * 1e3);
                let tick = time::OffsetDateTime::parse(
                    tick_ts,
                    &time::format_description::well_known::Rfc3339,
                )
                .map(|t| t.unix_timestamp_nanos() as f64 / 1e6)
                .unwrap_or(f64::NAN);
                let put = wall
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64() * 1e3)
                    .unwrap_or(f64::NAN);
                tick_after_put_ms.push(tick - put);
            }
        }
        let fired = in_force_ms.len();
        let mut sorted = in_force_ms.clone();
        sorted.sort_by(f64::total_cmp);
        Ok(Report {
            puts: opts.puts,
            fired,
            p50_ms: percentile(&sorted, 50.0).unwrap_or(f64::NAN),
            p99_ms: percentile(&sorted, 99.0).unwrap_or(f64::NAN),
            max_ms: sorted.last().copied().unwrap_or(f64::NAN),
            in_force_ms,
            tick_period_ms: opts.symbols as f64 * 1e3 / opts.rate as f64,
            put_ms,
            tick_after_put_ms,
        })
    })
}

fn rt() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
