//! The metrics of the processor, in one place, so log lines and counters never drift apart.
//!
//! Counters use the `metrics` facade; `alert-pipeline --metrics-addr` installs a Prometheus
//! exporter. Without an exporter the calls are no-ops. Everything is counted at commit, so a redo
//! after an abort is never counted twice: the figures are those of committed work.

use metrics::{counter, histogram};
use std::collections::BTreeMap;
use std::time::Duration;

/// A batch committed: its input, outputs and dead letters per class.
pub fn committed(
    dead_letters: &BTreeMap<&'static str, u64>,
    records: u64,
    notifications: u64,
    stale: u64,
    retried: u64,
    took: Duration,
) {
    counter!("alerts_transactions_committed_total").increment(1);
    counter!("alerts_ticks_committed_total").increment(records);
    counter!("alerts_notifications_committed_total").increment(notifications);
    counter!("alerts_ticks_stale_total").increment(stale);
    counter!("alerts_ticks_retried_total").increment(retried);
    for (class, n) in dead_letters {
        counter!("alerts_ticks_dead_lettered_total", "class" => *class).increment(*n);
    }
    histogram!("alerts_commit_seconds").record(took.as_secs_f64());
}

/// A transaction aborted (or, at least once, a batch given up).
pub fn aborted() {
    counter!("alerts_transactions_aborted_total").increment(1);
}

/// Partitions whose state was restored from the changelog.
pub fn restored(partitions: usize) {
    counter!("alerts_partitions_restored_total").increment(partitions as u64);
}

/// Serves the Prometheus endpoint on `addr`, if given (`--metrics-addr` of the binaries). Call it
/// inside the tokio runtime: the listener runs on it.
pub fn serve(addr: Option<std::net::SocketAddr>) -> anyhow::Result<()> {
    if let Some(addr) = addr {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .map_err(|e| anyhow::anyhow!("metrics endpoint on {addr}: {e}"))?;
    }
    Ok(())
}

/// Sum of the samples of metric `name` on a Prometheus endpoint (0 while it does not answer):
/// how the benchmark and the tests read a running pipeline's counters.
pub fn scrape(addr: &str, name: &str) -> f64 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else { return 0.0 };
    if s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).is_err() {
        return 0.0;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines()
        .filter(|l| l.split([' ', '{']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
