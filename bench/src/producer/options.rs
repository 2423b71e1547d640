//! The command line of `producer-bench` and the validated options it turns into.
//!
//! The parser lives in the library so that its unit tests parse exactly what the binary parses;
//! the binary only calls [`BenchCli::parse`] and [`BenchCli::options`]. Values that clap cannot
//! check by itself (one record count per size, positive sizes and intervals) are checked in
//! [`BenchCli::options`], with a message naming the flag.

use super::mode::{expand, Mode, ModeKind};
use anyhow::bail;
use clap::Parser;
use price_alerts::cli::KafkaArgs;
use price_alerts::kafka::topics::unique_suffix;
use price_alerts::kafka::KafkaConfig;
use std::path::PathBuf;
use std::time::Duration;

/// Default number of measured records per run (per size, unless one count per size is given).
pub const DEFAULT_RECORDS: u64 = 100_000;

/// Producer throughput of the plain, idempotent, transactional and overlapped modes on a real
/// broker.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "producer-bench",
    version,
    about = "Producer throughput: plain vs idempotent vs transactional at several commit intervals",
    after_help = "Runs are interleaved (plain, idempotent, txn-10ms, ... then again) so that drift on a \
                  shared machine hits every mode alike. Results go to --out-dir as results.json, \
                  summary.csv, runs.csv and throughput.png; the table goes to stdout."
)]
pub struct BenchCli {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Record (value) sizes in bytes, comma-separated; a k/KiB or m/MiB suffix multiplies by 1024
    /// or 1024².
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "100,1024")]
    pub sizes: Vec<usize>,
    /// Measured records per run: one count for every size, or one per size in the order of --sizes.
    #[arg(long, value_delimiter = ',', conflicts_with = "duration")]
    pub records: Vec<u64>,
    /// Measure for this long per run instead of a record count (e.g. 10s).
    #[arg(long, value_parser = price_alerts::cli::duration)]
    pub duration: Option<Duration>,
    /// Partitions of each benchmark topic.
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// Runs of every configuration (mode and size); the report gives their median and range.
    #[arg(long, default_value_t = 3)]
    pub repeats: u32,
    /// Modes to run, comma-separated; `transactional` and `overlapped` run once per commit
    /// interval.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "plain,idempotent,transactional,overlapped"
    )]
    pub modes: Vec<ModeKind>,
    /// Commit intervals of the transactional modes, comma-separated durations (10ms,100ms,1s).
    #[arg(long, value_delimiter = ',', value_parser = price_alerts::cli::interval, default_value = "10ms,100ms,1s")]
    pub commit_intervals: Vec<Duration>,
    /// Records produced (and acknowledged or committed) before each run's measurement starts, to the
    /// same topic: connections, metadata and the transaction coordinator are warm when timing starts.
    #[arg(long, default_value_t = 10_000)]
    pub warmup: u64,
    /// Where results.json, summary.csv, runs.csv and throughput.png are written.
    #[arg(long, default_value = "bench/out")]
    pub out_dir: PathBuf,
    /// Write nothing to disk (print the table only).
    #[arg(long, conflicts_with = "out_dir")]
    pub no_output: bool,
    /// Prefix of the run's topics and transactional ids (default: a fresh random one).
    #[arg(long)]
    pub topic_prefix: Option<String>,
    /// Keep the benchmark topics instead of deleting them at the end.
    #[arg(long)]
    pub keep_topics: bool,
    /// Run nothing: redraw the plot and CSV files from this results.json, into its folder.
    #[arg(long, value_name = "RESULTS_JSON")]
    pub replot: Option<PathBuf>,
}

/// How much each run measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Workload {
    /// This many records per run, one count per size (same order as `BenchOptions::sizes`).
    Records(Vec<u64>),
    /// Records for this long per run.
    Duration(Duration),
}

/// What one measured run sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Records(u64),
    Duration(Duration),
}

/// Validated options of one benchmark.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The user's connection settings (admin, readers); the producers add the batching settings.
    pub kafka: KafkaConfig,
    /// Record sizes in bytes.
    pub sizes: Vec<usize>,
    pub workload: Workload,
    /// Partitions of each fresh topic.
    pub partitions: i32,
    /// Runs of each configuration.
    pub repeats: u32,
    /// Modes in the order they are interleaved.
    pub modes: Vec<Mode>,
    /// Warm-up records per run.
    pub warmup: u64,
    /// Output folder (`None`: print only).
    pub out_dir: Option<PathBuf>,
    /// Prefix of topic names and transactional ids, unique per benchmark.
    pub prefix: String,
    /// Delete the topics at the end?
    pub cleanup: bool,
    /// Draw a progress bar on stderr (only where stderr is a terminal).
    pub progress: bool,
}

impl BenchOptions {
    /// What one run of the size at `size_index` measures.
    pub fn limit(&self, size_index: usize) -> Limit {
        match &self.workload {
            // `options()` guarantees one count per size; a shorter list repeats its last count.
            Workload::Records(counts) => Limit::Records(
                counts
                    .get(size_index)
                    .or(counts.last())
                    .copied()
                    .unwrap_or(DEFAULT_RECORDS),
            ),
            Workload::Duration(d) => Limit::Duration(*d),
        }
    }
}

impl BenchCli {
    /// Checks what clap cannot and builds the options.
    pub fn options(&self) -> anyhow::Result<BenchOptions> {
        let kafka = self.kafka.config()?;
        if self.sizes.is_empty() {
            bail!("--sizes needs at least one size");
        }
        let workload = match (self.duration, self.records.as_slice()) {
            (Some(d), _) if d.is_zero() => bail!("--duration must be above zero"),
            (Some(d), _) => Workload::Duration(d),
            (None, []) => Workload::Records(vec![DEFAULT_RECORDS; self.sizes.len()]),
            (None, [n]) => Workload::Records(vec![*n; self.sizes.len()]),
            (None, counts) if counts.len() == self.sizes.len() => Workload::Records(counts.to_vec()),
            (None, counts) => bail!(
                "--records has {} counts for {} sizes: give one count for all sizes or one per size",
                counts.len(),
                self.sizes.len()
            ),
        };
        if let Workload::Records(counts) = &workload {
            if counts.contains(&0) {
                bail!("--records must be above zero");
            }
        }
        if self.partitions < 1 {
            bail!("--partitions must be at least 1");
        }
        if self.repeats < 1 {
            bail!("--repeats must be at least 1");
        }
        let modes = expand(&self.modes, &self.commit_intervals);
        if modes.is_empty() {
            bail!("no mode selected (the transactional modes need at least one --commit-intervals value)");
        }
        let prefix = match &self.topic_prefix {
            Some(p) => p.clone(),
            None => format!("producer-bench-{}-", unique_suffix()),
        };
        Ok(BenchOptions {
            kafka,
            sizes: self.sizes.clone(),
            workload,
            partitions: self.partitions,
            repeats: self.repeats,
            modes,
            warmup: self.warmup,
            out_dir: (!self.no_output).then(|| self.out_dir.clone()),
            prefix,
            cleanup: !self.keep_topics,
            progress: true,
        })
    }
}

/// A record size: bytes, or with a k/KiB, m/MiB suffix (powers of 1024, case-insensitive).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let (digits, factor) = if let Some(d) = lower
        .strip_suffix("kib")
        .or_else(|| lower.strip_suffix('k'))
    {
        (d, 1024)
    } else if let Some(d) = lower
        .strip_suffix("mib")
        .or_else(|| lower.strip_suffix('m'))
    {
        (d, 1024 * 1024)
    } else {
        (lower.strip_suffix('b').unwrap_or(&lower), 1)
    };
    let n: usize = digits
        .trim()
        .parse()
        .map_err(|_| format!("{t:?} is not a size (e.g. 100, 1k, 1KiB)"))?;
    let size = n
        .checked_mul(factor)
        .ok_or_else(|| format!("{t:?} is too large"))?;
    if size == 0 {
        return Err("a record size must be above zero".into());
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<BenchCli, clap::Error> {
        BenchCli::try_parse_from(std::iter::once("producer-bench").chain(args.iter().copied()))
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn defaults() {
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.sizes, vec![100, 1024]);
        assert_eq!(cli.repeats, 3);
        assert_eq!(cli.commit_intervals, vec![ms(10), ms(100), ms(1000)]);
        assert_eq!(cli.out_dir, PathBuf::from("bench/out"));
        let o = cli.options().unwrap();
        assert_eq!(
            o.workload,
            Workload::Records(vec![DEFAULT_RECORDS, DEFAULT_RECORDS])
        );
        assert_eq!(o.modes.len(), 8);
        assert_eq!(o.modes[0], Mode::Plain);
        assert_eq!(
            o.modes[6],
            Mode::Transactional {
                commit_interval: ms(1000)
            }
        );
        assert_eq!(
            o.modes[7],
            Mode::Overlapped {
                commit_interval: ms(1000)
            }
        );
        assert!(o.prefix.starts_with("producer-bench-"));
        assert!(o.cleanup);
        assert_eq!(o.out_dir, Some(PathBuf::from("bench/out")));
        assert_eq!(cli.replot, None);
        assert_eq!(
            parse(&["--replot", "x/results.json"]).unwrap().replot,
            Some(PathBuf::from("x/results.json"))
        );
    }

    #[test]
    fn one_record_count_per_size_or_one_for_all() {
        let o = parse(&["--sizes", "100,1k", "--records", "200000,50000"])
            .unwrap()
            .options()
            .unwrap();
        assert_eq!(o.sizes, vec![100, 1024]);
        assert_eq!(o.limit(0), Limit::Records(200_000));
        assert_eq!(o.limit(1), Limit::Records(50_000));
        let o = parse(&["--records", "7"]).unwrap().options().unwrap();
        assert_eq!(o.workload, Workload::Records(vec![7, 7]));
        let err = parse(&["--sizes", "100", "--records", "1,2"])
            .unwrap()
            .options()
            .unwrap_err();
        assert!(err.to_string().contains("one per size"), "{err}");
        assert!(parse(&["--records", "0"]).unwrap().options().is_err());
    }

    #[test]
    fn duration_instead_of_records() {
        let o = parse(&["--duration", "5s"]).unwrap().options().unwrap();
        assert_eq!(o.limit(1), Limit::Duration(Duration::from_secs(5)));
        assert!(parse(&["--duration", "5s", "--records", "10"]).is_err());
    }

    #[test]
    fn modes_and_intervals() {
        let o = parse(&[
            "--modes",
            "txn,idempotent",
            "--commit-intervals",
            "100ms,1s",
        ])
        .unwrap()
        .options()
        .unwrap();
        assert_eq!(
            o.modes,
            vec![
                Mode::Idempotent,
                Mode::Transactional {
                    commit_interval: ms(100)
                },
                Mode::Transactional {
                    commit_interval: ms(1000)
                },
            ]
        );
        assert!(parse(&["--modes", "exactly-twice"]).is_err());
        assert!(parse(&["--commit-intervals", "0"]).is_err());
        assert!(parse(&["--modes", "transactional", "--commit-intervals", ""]).is_err());
    }

    #[test]
    fn outputs_and_topics() {
        let o = parse(&["--no-output", "--keep-topics", "--topic-prefix", "t-"])
            .unwrap()
            .options()
            .unwrap();
        assert_eq!(o.out_dir, None);
        assert!(!o.cleanup);
        assert_eq!(o.prefix, "t-");
        assert!(parse(&["--no-output", "--out-dir", "x"]).is_err());
        assert!(parse(&["--repeats", "0"]).unwrap().options().is_err());
        assert!(parse(&["--partitions", "0"]).unwrap().options().is_err());
    }

    #[test]
    fn pass_through_properties_are_checked() {
        let o = parse(&["-X", "linger.ms=20", "--bootstrap", "h:9"])
            .unwrap()
            .options()
            .unwrap();
        assert_eq!(o.kafka.bootstrap, "h:9");
        assert_eq!(
            o.kafka.properties.get("linger.ms").map(String::as_str),
            Some("20")
        );
        assert!(parse(&["-X", "transactional.id=x"])
            .unwrap()
            .options()
            .is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("2m"), Ok(2 * 1024 * 1024));
        assert!(parse_size("0").is_err());
        assert!(parse_size("ten").is_err());
        assert!(parse_size("-1").is_err());
    }

    #[test]
    fn intervals() {
        use price_alerts::cli::interval;
        assert!(interval("100").is_err(), "a bare number needs a unit");
        assert_eq!(interval("250ms"), Ok(ms(250)));
        assert_eq!(interval("1s"), Ok(ms(1000)));
        assert!(interval("0ms").is_err());
        assert!(interval("soon").is_err());
    }
}
