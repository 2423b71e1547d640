//! The pipeline as a child process, as the benchmarks run it: a guard that kills it if a run
//! fails half-way, a free port for its metrics endpoint, signals, its peak RSS from /proc, and
//! the fresh topics each run gets.

use anyhow::{anyhow, bail};
use price_alerts::kafka::topics::{self, unique_suffix, DropTopics, Topics};
use price_alerts::kafka::KafkaConfig;
use std::path::Path;
use std::process::{Child, Command};

/// Runs `run` with fresh topics (input, notifications and the app's own, named `<tag>-<random>-…`)
/// of `partitions` partitions, and the app id they belong to; deletes every topic of that prefix
/// afterwards, whatever `run` returned, also if it panicked.
pub fn with_fresh_topics<T>(
    kafka: &KafkaConfig,
    tag: &str,
    partitions: i32,
    run: impl FnOnce(&str, &Topics) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let prefix = format!("{tag}-{}-", unique_suffix());
    let app_id = format!("{prefix}app");
    let topics = Topics::with(
        format!("{prefix}market-updates"),
        format!("{prefix}notifications"),
        &app_id,
    );
    let _topics = DropTopics::with_prefix(kafka, &prefix);
    futures::executor::block_on(topics::ensure(kafka, &topics, Some(partitions)))?;
    run(&app_id, &topics)
}

/// The child process, killed if the run fails half-way.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    /// Sends `signal` (`TERM`, `KILL`, …) to the child.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.0.id().to_string()])
            .status()?;
        if !status.success() {
            bail!("could not send SIG{signal} to the pipeline");
        }
        Ok(())
    }

    /// Peak resident set of the child so far (`VmHWM`), in MiB (0 when /proc cannot tell).
    pub fn peak_rss_mib(&self) -> f64 {
        peak_rss_kib(self.0.id()).unwrap_or(0) as f64 / 1024.0
    }

    /// Resets the child's peak resident set to its current one (Linux 4.0+: `5` to
    /// `/proc/PID/clear_refs`), so that a later [`ChildGuard::peak_rss_mib`] is the peak of what
    /// came after, not of start-up.
    pub fn reset_peak_rss(&self) -> anyhow::Result<()> {
        std::fs::write(format!("/proc/{}/clear_refs", self.0.id()), "5")?;
        Ok(())
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The folder of the running benchmark, where `cargo build --release --workspace --bins` put the
/// binaries it starts as children.
pub fn bin_dir() -> anyhow::Result<std::path::PathBuf> {
    std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow!("locating the binaries folder"))
}

/// Polls `f` every 20 ms until it is true, at most `limit`.
pub fn wait_until(
    limit: std::time::Duration,
    what: &str,
    mut f: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + limit;
    while !f() {
        if std::time::Instant::now() > deadline {
            bail!("{what} did not happen within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

/// A port nothing listens on right now, for the child's metrics endpoint.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str()
        .ok_or_else(|| anyhow!("path {} is not UTF-8", p.display()))
}

/// Peak resident set of a process, from /proc (Linux).
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
