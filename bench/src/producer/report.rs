//! The benchmark report: per-configuration summaries, the printed table, JSON and CSV.
//!
//! A configuration is a mode and a record size. Its summary is the median and range of its
//! repeats' records/s and MB/s, the ratio of its median to the idempotent median of the same size
//! (the cost of transactions over what every transactional producer already pays), and for
//! transactional modes the p50/p99 of the commit durations pooled over all its repeats.
//!
//! Next to the median-over-median ratio the summary gives the paired ratio: each repeat's
//! records/s over the idempotent records/s of the same repeat (they ran within seconds of each
//! other), then the median and range of those. On a shared machine whose speed drifts from one
//! repeat to the next, the pairs cancel most of the drift that the medians keep.
//! Summaries are computed by [`summarize`], a pure function of the runs.

use super::mode::Mode;
use super::runner::RunResult;
use crate::stats::{percentile, ratio, Spread};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

/// Summary of one configuration (mode and size) over its repeats.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub mode: String,
    pub commit_interval_ms: Option<u64>,
    pub record_size: usize,
    /// Completed (not interrupted) runs summarised.
    pub runs: usize,
    pub records_per_s: Option<Spread>,
    pub mb_per_s: Option<Spread>,
    /// Median records/s over the idempotent median of the same size.
    pub ratio_to_idempotent: Option<f64>,
    /// Per repeat: records/s over the same repeat's idempotent records/s; their median and range.
    pub paired_ratio_to_idempotent: Option<Spread>,
    /// Commit durations, pooled over the repeats (transactional modes).
    pub commit_p50_ms: Option<f64>,
    pub commit_p99_ms: Option<f64>,
    pub commits: u64,
    pub aborted_transactions: u64,
    pub failed_deliveries: u64,
    /// Where the committed transactions' time went (transactional modes), pooled over the repeats.
    #[serde(default)]
    pub timeline: Option<Timeline>,
}

/// Percentiles of [`TxnTimes`](super::runner::TxnTimes) over a configuration's transactions.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Timeline {
    pub transactions: usize,
    pub open_p50_ms: f64,
    pub records_p50: f64,
    pub drain_p50_ms: f64,
    pub drain_p99_ms: f64,
    pub end_p50_ms: f64,
    pub end_p99_ms: f64,
    /// How long the sending loop waited for a transaction's outcome (the whole commit when
    /// commits are sequential).
    #[serde(default)]
    pub blocked_p50_ms: f64,
    #[serde(default)]
    pub blocked_p99_ms: f64,
}

impl Timeline {
    fn of(runs: &[&RunResult]) -> Option<Timeline> {
        let txns: Vec<_> = runs.iter().flat_map(|r| r.transactions.iter()).collect();
        let pick = |f: fn(&super::runner::TxnTimes) -> f64| {
            txns.iter().map(|t| f(t)).collect::<Vec<f64>>()
        };
        let (open, records, drain, end, blocked) = (
            pick(|t| t.open_ms),
            pick(|t| t.records as f64),
            pick(|t| t.drain_ms),
            pick(|t| t.end_ms),
            pick(|t| t.blocked_ms),
        );
        Some(Timeline {
            transactions: txns.len(),
            open_p50_ms: percentile(&open, 50.0)?,
            records_p50: percentile(&records, 50.0)?,
            drain_p50_ms: percentile(&drain, 50.0)?,
            drain_p99_ms: percentile(&drain, 99.0)?,
            end_p50_ms: percentile(&end, 50.0)?,
            end_p99_ms: percentile(&end, 99.0)?,
            blocked_p50_ms: percentile(&blocked, 50.0)?,
            blocked_p99_ms: percentile(&blocked, 99.0)?,
        })
    }
}

/// Summaries in the order sizes x modes; interrupted runs are left out (they measured less).
pub fn summarize(runs: &[RunResult], modes: &[Mode], sizes: &[usize]) -> Vec<Summary> {
    let mut out = Vec::new();
    for &size in sizes {
        let idem_label = Mode::Idempotent.label();
        let idem_median = median_of(runs, &idem_label, size);
        let idem_by_repeat: BTreeMap<u32, f64> = complete(runs, &idem_label, size)
            .map(|r| (r.repeat, r.records_per_s))
            .collect();
        for mode in modes {
            let label = mode.label();
            let mine: Vec<&RunResult> = complete(runs, &label, size).collect();
            let rps: Vec<f64> = mine.iter().map(|r| r.records_per_s).collect();
            let mbps: Vec<f64> = mine.iter().map(|r| r.mb_per_s).collect();
            let latencies: Vec<f64> = mine
                .iter()
                .flat_map(|r| r.commit_latencies_ms.iter().copied())
                .collect();
            let records_per_s = Spread::of(&rps);
            let paired: Vec<f64> = mine
                .iter()
                .filter_map(|r| ratio(r.records_per_s, *idem_by_repeat.get(&r.repeat)?))
                .collect();
            out.push(Summary {
                mode: label.clone(),
                commit_interval_ms: mode.commit_interval().map(|d| d.as_millis() as u64),
                record_size: size,
                runs: mine.len(),
                records_per_s,
                mb_per_s: Spread::of(&mbps),
                ratio_to_idempotent: match (records_per_s, idem_median) {
                    (Some(s), Some(idem)) => ratio(s.median, idem),
                    _ => None,
                },
                paired_ratio_to_idempotent: Spread::of(&paired),
                commit_p50_ms: percentile(&latencies, 50.0),
                commit_p99_ms: percentile(&latencies, 99.0),
                commits: mine.iter().map(|r| r.commits).sum(),
                aborted_transactions: mine.iter().map(|r| r.aborted_transactions).sum(),
                failed_deliveries: mine.iter().map(|r| r.failed_deliveries).sum(),
                timeline: Timeline::of(&mine),
            });
        }
    }
    out
}

fn complete<'a>(
    runs: &'a [RunResult],
    label: &'a str,
    size: usize,
) -> impl Iterator<Item = &'a RunResult> + 'a {
    runs.iter()
        .filter(move |r| r.mode == label && r.record_size == size && !r.interrupted)
}

fn median_of(runs: &[RunResult], label: &str, size: usize) -> Option<f64> {
    let v: Vec<f64> = complete(runs, label, size)
        .map(|r| r.records_per_s)
        .collect();
    Spread::of(&v).map(|s| s.median)
}

/// What was run, with which settings, on what.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    pub bootstrap: String,
    pub partitions: i32,
    pub repeats: u32,
    pub warmup_records: u64,
    pub record_sizes: Vec<usize>,
    /// Measured records per run, per size (record-count mode).
    pub records: Option<Vec<u64>>,
    /// Measured seconds per run (duration mode).
    pub duration_s: Option<f64>,
    pub modes: Vec<String>,
    /// The librdkafka properties of each mode's producer (secrets redacted, bootstrap and
    /// transactional.id left out).
    pub producer_properties: BTreeMap<String, BTreeMap<String, String>>,
    pub librdkafka_version: String,
}

/// The machine the figures come from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: Option<usize>,
    pub memory_total_bytes: Option<u64>,
    pub os: String,
    pub arch: String,
}

impl Machine {
    pub fn this() -> Machine {
        Machine {
            cpus: std::thread::available_parallelism().ok().map(|n| n.get()),
            memory_total_bytes: std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|m| mem_total(&m)),
            os: std::env::consts::OS.into(),
            arch: std::env::consts::ARCH.into(),
        }
    }
}

/// `MemTotal` of /proc/meminfo, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The whole report: written as results.json, summarised in the table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchReport {
    /// When the benchmark started (RFC 3339, UTC).
    pub started_at: String,
    pub settings: Settings,
    pub machine: Machine,
    /// Every run, in schedule order.
    pub runs: Vec<RunResult>,
    pub summaries: Vec<Summary>,
    /// The benchmark was stopped before its schedule ended.
    pub interrupted: bool,
}

impl BenchReport {
    /// The summary of a mode label and size.
    pub fn summary(&self, mode: &str, size: usize) -> Option<&Summary> {
        self.summaries
            .iter()
            .find(|s| s.mode == mode && s.record_size == size)
    }

    /// One row per configuration.
    pub fn summary_csv(&self) -> String {
        let mut s = String::from(
            "mode,commit_interval_ms,record_size,runs,records_per_s_median,records_per_s_min,records_per_s_max,\
             mb_per_s_median,mb_per_s_min,mb_per_s_max,ratio_to_idempotent,paired_ratio_median,paired_ratio_min,\
             paired_ratio_max,commit_p50_ms,commit_p99_ms,commits,\
             aborted_transactions,failed_deliveries\n",
        );
        for m in &self.summaries {
            let spread = |x: Option<Spread>| match x {
                Some(x) => format!("{:.1},{:.1},{:.1}", x.median, x.min, x.max),
                None => ",,".into(),
            };
            let mb = |x: Option<Spread>| match x {
                Some(x) => format!("{:.3},{:.3},{:.3}", x.median, x.min, x.max),
                None => ",,".into(),
            };
            let paired = match m.paired_ratio_to_idempotent {
                Some(x) => format!("{:.4},{:.4},{:.4}", x.median, x.min, x.max),
                None => ",,".into(),
            };
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{},{},{},{}",
                m.mode,
                opt(m.commit_interval_ms.map(|v| v.to_string())),
                m.record_size,
                m.runs,
                spread(m.records_per_s),
                mb(m.mb_per_s),
                opt(m.ratio_to_idempotent.map(|v| format!("{v:.4}"))),
                paired,
                opt(m.commit_p50_ms.map(|v| format!("{v:.2}"))),
                opt(m.commit_p99_ms.map(|v| format!("{v:.2}"))),
                m.commits,
                m.aborted_transactions,
                m.failed_deliveries
            );
        }
        s
    }

    /// One row per run.
    pub fn runs_csv(&self) -> String {
        let mut s = String::from(
            "sequence,repeat,mode,commit_interval_ms,record_size,topic,warmup_records,sent,records,failed_deliveries,\
             aborted_transactions,commits,elapsed_s,records_per_s,mb_per_s,interrupted\n",
        );
        for r in &self.runs {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{},{},{},{:.4},{:.1},{:.3},{}",
                r.sequence,
                r.repeat,
                r.mode,
                opt(r.commit_interval_ms.map(|v| v.to_string())),
                r.record_size,
                r.topic,
                r.warmup_records,
                r.sent,
                r.records,
                r.failed_deliveries,
                r.aborted_transactions,
                r.commits,
                r.elapsed_s,
                r.records_per_s,
                r.mb_per_s,
                r.interrupted
            );
        }
        s
    }
}

fn opt(v: Option<String>) -> String {
    v.unwrap_or_default()
}

/// 1234567.8 -> "1,234,568".
pub fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let digits = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0.0 && digits != "0" {
        out.insert(0, '-');
    }
    out
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        let workload = match (&s.records, s.duration_s) {
            (Some(r), _) => format!(
                "records/run {}",
                r.iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join("/")
            ),
            (None, Some(d)) => format!("{d} s/run"),
            (None, None) => String::new(),
        };
        writeln!(
            f,
            "producer-bench: {} partitions, {} repeats, {workload}, warm-up {} records, librdkafka {}{}",
            s.partitions,
            s.repeats,
            s.warmup_records,
            s.librdkafka_version,
            if self.interrupted { " (INTERRUPTED: partial results)" } else { "" }
        )?;
        writeln!(
            f,
            "{:<7} {:<13} {:>4}  {:>30}  {:>24}  {:>6}  {:>20}  {:>17}",
            "size",
            "mode",
            "runs",
            "records/s median (min-max)",
            "MB/s median (min-max)",
            "/idem",
            "paired /idem (range)",
            "commit p50/p99 ms"
        )?;
        for m in &self.summaries {
            let rps = m
                .records_per_s
                .map(|x| {
                    format!(
                        "{} ({}-{})",
                        thousands(x.median),
                        thousands(x.min),
                        thousands(x.max)
                    )
                })
                .unwrap_or_else(|| "-".into());
            let mbps = m
                .mb_per_s
                .map(|x| format!("{:.2} ({:.2}-{:.2})", x.median, x.min, x.max))
                .unwrap_or_else(|| "-".into());
            let r = m
                .ratio_to_idempotent
                .map(|v| format!("{v:.3}"))
                .unwrap_or_else(|| "-".into());
            let paired = m
                .paired_ratio_to_idempotent
                .map(|x| format!("{:.3} ({:.3}-{:.3})", x.median, x.min, x.max))
                .unwrap_or_else(|| "-".into());
            let lat = match (m.commit_p50_ms, m.commit_p99_ms) {
                (Some(a), Some(b)) => format!("{a:.1}/{b:.1}"),
                _ => "-".into(),
            };
            writeln!(
                f,
                "{:<7} {:<13} {:>4}  {rps:>30}  {mbps:>24}  {r:>6}  {paired:>20}  {lat:>17}",
                format!("{} B", m.record_size),
                m.mode,
                m.runs
            )?;
            if m.aborted_transactions > 0 || m.failed_deliveries > 0 {
                writeln!(
                    f,
                    "        (aborted transactions {}, failed deliveries {}: not counted)",
                    m.aborted_transactions, m.failed_deliveries
                )?;
            }
        }
        let timelines: Vec<_> = self
            .summaries
            .iter()
            .filter_map(|m| Some((m, m.timeline?)))
            .collect();
        if !timelines.is_empty() {
            writeln!(
                f,
                "\nwhere a committed transaction's time goes (p50, and p99 where given; ms):"
            )?;
            writeln!(
                f,
                "{:<7} {:<13} {:>6}  {:>9}  {:>9}  {:>15}  {:>15}  {:>15}",
                "size",
                "mode",
                "txns",
                "open",
                "records",
                "drain p50/p99",
                "EndTxn p50/p99",
                "blocked p50/p99"
            )?;
            for (m, t) in timelines {
                writeln!(
                    f,
                    "{:<7} {:<13} {:>6}  {:>9.1}  {:>9.0}  {:>15}  {:>15}  {:>15}",
                    format!("{} B", m.record_size),
                    m.mode,
                    t.transactions,
                    t.open_p50_ms,
                    t.records_p50,
                    format!("{:.1}/{:.1}", t.drain_p50_ms, t.drain_p99_ms),
                    format!("{:.1}/{:.1}", t.end_p50_ms, t.end_p99_ms),
                    format!("{:.1}/{:.1}", t.blocked_p50_ms, t.blocked_p99_ms),
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn run(mode: Mode, size: usize, rps: f64, commits: &[f64]) -> RunResult {
        RunResult {
            mode: mode.label(),
            commit_interval_ms: mode.commit_interval().map(|d| d.as_millis() as u64),
            record_size: size,
            repeat: 0,
            sequence: 0,
            topic: "t".into(),
            warmup_records: 0,
            sent: 1000,
            records: 1000,
            failed_deliveries: 0,
            aborted_transactions: 0,
            commits: commits.len() as u64,
            elapsed_s: 1000.0 / rps,
            records_per_s: rps,
            mb_per_s: rps * size as f64 / 1048576.0,
            transactions: Vec::new(),
            commit_latencies_ms: commits.to_vec(),
            interrupted: false,
        }
    }

    fn report(runs: Vec<RunResult>, modes: &[Mode], sizes: &[usize]) -> BenchReport {
        BenchReport {
            started_at: "2026-01-01T00:00:00Z".into(),
            settings: Settings {
                bootstrap: "h:1".into(),
                partitions: 3,
                repeats: 3,
                warmup_records: 0,
                record_sizes: sizes.to_vec(),
                records: Some(vec![1000; sizes.len()]),
                duration_s: None,
                modes: modes.iter().map(|m| m.label()).collect(),
                producer_properties: BTreeMap::new(),
                librdkafka_version: "x".into(),
            },
            machine: Machine::this(),
            summaries: summarize(&runs, modes, sizes),
            runs,
            interrupted: false,
        }
    }

    #[test]
    fn summaries_give_median_range_ratio_and_commit_percentiles() {
        let txn = Mode::Transactional {
            commit_interval: Duration::from_millis(100),
        };
        let modes = [Mode::Idempotent, txn];
        let mut runs = vec![
            run(Mode::Idempotent, 1024, 100.0, &[]),
            run(Mode::Idempotent, 1024, 120.0, &[]),
            run(Mode::Idempotent, 1024, 90.0, &[]),
            run(txn, 1024, 97.0, &[1.0, 2.0]),
            run(txn, 1024, 80.0, &[3.0]),
            run(txn, 1024, 99.0, &[4.0, 50.0]),
        ];
        for (i, r) in runs.iter_mut().enumerate() {
            r.repeat = (i % 3) as u32;
        }
        // An interrupted run is not summarised.
        let mut cut = run(txn, 1024, 1.0, &[999.0]);
        cut.interrupted = true;
        runs.push(cut);
        let r = report(runs, &modes, &[1024]);
        let idem = r.summary("idempotent", 1024).unwrap();
        assert_eq!(
            idem.records_per_s,
            Some(Spread {
                n: 3,
                median: 100.0,
                min: 90.0,
                max: 120.0
            })
        );
        assert_eq!(idem.ratio_to_idempotent, Some(1.0));
        assert_eq!(idem.commit_p50_ms, None);
        let t = r.summary("txn-100ms", 1024).unwrap();
        assert_eq!(t.runs, 3);
        assert_eq!(t.records_per_s.map(|s| s.median), Some(97.0));
        assert_eq!(t.ratio_to_idempotent, Some(0.97));
        // Paired by repeat: 97/100, 80/120, 99/90.
        let p = t.paired_ratio_to_idempotent.unwrap();
        assert_eq!(p.n, 3);
        assert!(
            (p.median - 0.97).abs() < 1e-12 && (p.min - 80.0 / 120.0).abs() < 1e-12,
            "{p:?}"
        );
        assert!((p.max - 1.1).abs() < 1e-12, "{p:?}");
        assert_eq!(t.commit_p50_ms, Some(3.0));
        assert_eq!(t.commit_p99_ms, Some(50.0));
        assert_eq!(t.commits, 5);
        assert_eq!(t.commit_interval_ms, Some(100));
    }

    #[test]
    fn no_ratio_without_an_idempotent_baseline() {
        let r = report(
            vec![run(Mode::Plain, 100, 10.0, &[])],
            &[Mode::Plain],
            &[100],
        );
        let s = r.summary("plain", 100).unwrap();
        assert_eq!(s.ratio_to_idempotent, None);
        assert!(r.to_string().contains("plain"));
    }

    #[test]
    fn csv_has_a_header_and_one_row_per_item() {
        let modes = [Mode::Plain, Mode::Idempotent];
        let r = report(
            vec![
                run(Mode::Plain, 100, 10.0, &[]),
                run(Mode::Idempotent, 100, 5.0, &[]),
            ],
            &modes,
            &[100, 1024],
        );
        let summary = r.summary_csv();
        let lines: Vec<&str> = summary.lines().collect();
        assert_eq!(lines.len(), 1 + 4);
        let columns = lines[0].split(',').count();
        assert!(
            lines.iter().all(|l| l.split(',').count() == columns),
            "{summary}"
        );
        assert!(
            lines[1].starts_with("plain,,100,1,10.0,10.0,10.0,"),
            "{}",
            lines[1]
        );
        assert!(lines[1].contains(",2.0000,"), "{}", lines[1]);
        let runs = r.runs_csv();
        assert_eq!(runs.lines().count(), 3);
        let columns = runs.lines().next().unwrap().split(',').count();
        assert!(
            runs.lines().all(|l| l.split(',').count() == columns),
            "{runs}"
        );
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(1234567.8), "1,234,568");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(0.2), "0");
        assert_eq!(thousands(-1234.0), "-1,234");
    }

    #[test]
    fn meminfo() {
        assert_eq!(
            mem_total("MemTotal:       24576000 kB\nMemFree: 1 kB\n"),
            Some(24576000 * 1024)
        );
        assert_eq!(mem_total("nothing"), None);
    }
}
