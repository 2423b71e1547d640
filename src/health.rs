//! The operational HTTP endpoint of a long-running service: metrics, liveness, readiness.
//!
//! | path       | answers                                                                       |
//! |------------|-------------------------------------------------------------------------------|
//! | `/metrics` | Prometheus text format, every series from the start ([`crate::metrics`]), and the process's `process_*` series |
//! | `/healthz` | liveness: 200 while the processing loop made progress within `stall_after`, else 503; status "restoring, held" (200) while a restore waits, watched, on an undecided transaction |
//! | `/readyz`  | readiness: 200 once the service says it is ready (assigned, restored, not fenced, not paused), else 503 with the reason |
//! | other      | 404                                                                           |
//!
//! Liveness and readiness are separate on purpose: a service that is restoring a large state is
//! alive but not ready (an orchestrator must not restart it, nor route to it), and a loop stuck in
//! a call that never returns is not alive (restarting it is the cure). The bodies are short JSON.
//! The service reports through a [`Health`] handle: [`Health::beat`] on every loop iteration,
//! [`Health::ready`] and [`Health::not_ready`] as its state changes.
//!
//! A wait the loop watches is progress of a kind: a restore held by an undecided transaction
//! beats with [`Health::held`] at each fresh sighting of the hold (its leader answering that the
//! transaction is still open), which `/healthz` shows until [`Health::unheld`]; the watchdog
//! counts those beats like any other, and still ends a loop that neither beats nor sees its hold
//! (see [`crate::pipeline::held`]).

use anyhow::Context as _;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Liveness fails when the loop made no progress for this long. Above the longest call the loop
/// legitimately blocks in (a commit bounded by the transaction timeout, a restore of a large
/// state), so a slow moment is never mistaken for a stuck loop.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(60);

/// What a service reports about itself; cheap to clone and to update from any thread.
#[derive(Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

struct Inner {
    started: Instant,
    /// Milliseconds since `started` of the last beat.
    last_beat_ms: AtomicU64,
    stall_after: Duration,
    /// `None` when ready, else why not.
    not_ready: Mutex<Option<String>>,
    /// What a watched wait waits for ([`Health::held`]); `None` when the loop waits on nothing.
    held: Mutex<Option<String>>,
}

impl Health {
    /// A service that is alive and not ready yet ("starting").
    pub fn new(stall_after: Duration) -> Self {
        Health {
            inner: Arc::new(Inner {
                started: Instant::now(),
                last_beat_ms: AtomicU64::new(0),
                stall_after,
                not_ready: Mutex::new(Some("starting".to_owned())),
                held: Mutex::new(None),
            }),
        }
    }

    /// The processing loop made progress.
    pub fn beat(&self) {
        self.beat_at(Instant::now());
    }

    fn beat_at(&self, now: Instant) {
        // Rounded up from the nanosecond: a stall is never measured longer than it is, so the
        // watchdog never fires before its bound (rounded down, it fired 0.15 ms early in a test;
        // rounded up from whole microseconds, a beat 900 ns past a millisecond was stored as that
        // millisecond, and a stall measured 902 ns where 771 ns had passed).
        let ms = now
            .saturating_duration_since(self.inner.started)
            .as_nanos()
            .div_ceil(1_000_000);
        self.inner
            .last_beat_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The loop waits on `what`, and has just seen that it still does (a restore held by an
    /// undecided transaction, its leader asked a moment ago): a beat, and `/healthz` says
    /// "restoring, held" with `what` until [`Health::unheld`].
    pub fn held(&self, what: &str) {
        self.beat();
        if let Ok(mut h) = self.inner.held.lock() {
            if h.as_deref() != Some(what) {
                *h = Some(what.to_owned());
            }
        }
    }

    /// The watched wait is over.
    pub fn unheld(&self) {
        if let Ok(mut h) = self.inner.held.lock() {
            *h = None;
        }
    }

    /// What a watched wait waits for, if the loop is in one.
    pub fn held_on(&self) -> Option<String> {
        self.inner.held.lock().ok().and_then(|h| h.clone())
    }

    pub fn ready(&self) {
        self.set(None);
    }

    pub fn not_ready(&self, reason: &str) {
        self.set(Some(reason));
    }

    fn set(&self, reason: Option<&str>) {
        if let Ok(mut r) = self.inner.not_ready.lock() {
            if r.as_deref() != reason {
                *r = reason.map(str::to_owned);
            }
        }
    }

    /// Time since the last beat.
    pub fn since_progress(&self) -> Duration {
        self.since_progress_at(Instant::now())
    }

    fn since_progress_at(&self, now: Instant) -> Duration {
        let last = Duration::from_millis(self.inner.last_beat_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(self.inner.started)
            .saturating_sub(last)
    }

    pub fn is_alive(&self) -> bool {
        self.is_alive_at(Instant::now())
    }

    fn is_alive_at(&self, now: Instant) -> bool {
        self.since_progress_at(now) < self.inner.stall_after
    }

    /// Ends the process with status `exit_status` when the loop makes no progress (no
    /// [`Health::beat`]) for longer than `bound`, until the returned guard is dropped: the last
    /// line of defence against a call that never returns and that no deadline of the process
    /// reaches (librdkafka #5456, #5511 are the known ones; every transactional call has its own
    /// deadline, see [`crate::kafka::txn`]). Liveness (`/healthz`) says the same to an
    /// orchestrator; the watchdog does not need one. Arm it when the loop starts (start-up waits
    /// have their own bounds), and drop the guard before shutting down (shutdown has its own).
    pub fn watchdog(&self, bound: Duration, exit_status: u8) -> Watchdog {
        self.watchdog_with(bound, move |stalled| {
            tracing::error!(
                stalled_s = format!("{:.1}", stalled.as_secs_f64()),
                bound_s = bound.as_secs(),
                exit_status,
                "the processing loop made no progress within its bound; exiting for a restart"
            );
            crate::errln!(
                "stuck: no progress for {:.0} s (bound {} s); exiting with status {exit_status}",
                stalled.as_secs_f64(),
                bound.as_secs()
            );
            crate::exit::exit(i32::from(exit_status));
        })
    }

    /// [`Health::watchdog`] with what it does on a stall given (a test observes it instead).
    fn watchdog_with(
        &self,
        bound: Duration,
        on_stall: impl FnOnce(Duration) + Send + 'static,
    ) -> Watchdog {
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(true));
        self.beat();
        let (health, flag) = (self.clone(), Arc::clone(&armed));
        let check_every = (bound / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let spawned = std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || {
                while flag.load(Ordering::Relaxed) {
                    std::thread::sleep(check_every);
                    let stalled = health.since_progress();
                    if flag.load(Ordering::Relaxed) && stalled > bound {
                        on_stall(stalled);
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the watchdog; liveness still reports a stall");
        }
        Watchdog { armed }
    }

    /// `None` when ready, else why not.
    pub fn readiness(&self) -> Option<String> {
        self.inner
            .not_ready
            .lock()
            .map(|r| r.clone())
            .unwrap_or_else(|_| Some("health state poisoned".to_owned()))
    }
}

/// Disarms the watchdog of [`Health::watchdog`] when dropped.
pub struct Watchdog {
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.armed.store(false, Ordering::Relaxed);
    }
}

/// Installs the Prometheus recorder (histograms with [`crate::metrics::SECONDS_BUCKETS`]), runs
/// `describe` (the binary's own metrics, with HELP and TYPE, at zero: each binary's endpoint shows
/// only its own series) and describes the process's own (`process_*`, the same for every binary:
/// RSS, CPU, threads, file descriptors), and serves the endpoint on `addr`. The port is bound before this
/// returns, so a taken port is an error at start. Must run inside a tokio runtime.
pub async fn serve(
    addr: SocketAddr,
    health: Health,
    describe: impl FnOnce(),
) -> anyhow::Result<()> {
    let metrics = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_owned()),
            crate::metrics::SECONDS_BUCKETS,
        )
        .context("histogram buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    describe();
    let endpoint = Endpoint::new(health, metrics);
    endpoint.process.describe();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the HTTP endpoint on {addr}"))?;
    let app = router(endpoint);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the HTTP endpoint stopped");
        }
    });
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    Ok(())
}

/// What the endpoint's handlers share: the service's health and the metrics to render.
#[derive(Clone)]
struct Endpoint {
    health: Health,
    metrics: PrometheusHandle,
    /// The process's own gauges (`process_resident_memory_bytes`, `process_cpu_seconds_total`,
    /// `process_threads`, …), read from `/proc/self` at each scrape rather than on a timer: the
    /// figures are as fresh as the scrape, and nothing runs between scrapes.
    process: metrics_process::Collector,
}

impl Endpoint {
    fn new(health: Health, metrics: PrometheusHandle) -> Self {
        Endpoint {
            health,
            metrics,
            process: metrics_process::Collector::default(),
        }
    }

    /// The text of `/metrics`, with the process's series as of now.
    fn exposition(&self) -> String {
        self.process.collect();
        self.metrics.run_upkeep();
        self.metrics.render()
    }
}

fn router(endpoint: Endpoint) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .with_state(endpoint)
}

async fn render_metrics(State(endpoint): State<Endpoint>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        endpoint.exposition(),
    )
        .into_response()
}

async fn healthz(State(Endpoint { health, .. }): State<Endpoint>) -> Response {
    let since = health.since_progress().as_millis() as u64;
    if health.is_alive() {
        let body = match health.held_on() {
            None => json!({"status": "alive", "last_progress_ms_ago": since}),
            Some(held) => {
                json!({"status": "restoring, held", "held": held, "last_progress_ms_ago": since})
            }
        };
        (StatusCode::OK, Json(body)).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "stalled", "last_progress_ms_ago": since})),
        )
            .into_response()
    }
}

async fn readyz(State(Endpoint { health, .. }): State<Endpoint>) -> Response {
    match health.readiness() {
        None => (StatusCode::OK, Json(json!({"status": "ready"}))).into_response(),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "not ready", "reason": reason})),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// When the watchdog fired, if it did within `within` after the beats stopped.
    fn fired(
        h: &Health,
        bound: Duration,
        beat_for: Duration,
        within: Duration,
    ) -> Option<(Duration, Duration)> {
        let (tx, rx) = std::sync::mpsc::channel();
        let started = Instant::now();
        let _guard = h.watchdog_with(bound, move |_| {
            let _ = tx.send(started.elapsed());
        });
        let mut last_beat = Duration::ZERO;
        while started.elapsed() < beat_for {
            // Read before the beat: a thread preempted between the two would otherwise note
            // a later beat than the watchdog saw.
            last_beat = started.elapsed();
            h.beat();
            std::thread::sleep(Duration::from_millis(5));
        }
        // (when it fired, when the loop last beat): a loaded machine may pause the beating loop
        // past the bound, and then the watchdog rightly fires before `beat_for` ends.
        rx.recv_timeout(within).ok().map(|at| (at, last_beat))
    }

    #[test]
    fn the_watchdog_fires_once_the_loop_stops_beating_for_longer_than_its_bound() {
        let h = Health::new(Duration::from_secs(60));
        let bound = Duration::from_millis(200);
        // Beating for a second keeps it quiet; then it fires about a bound later.
        let (at, last_beat) = fired(&h, bound, Duration::from_secs(1), Duration::from_secs(5))
            .expect("the watchdog fired");
        if at < last_beat {
            // The beating loop itself was held up past the bound (a loaded machine): the
            // watchdog saw no beat for that long, which is what it is for.
            return;
        }
        assert!(
            at >= last_beat + bound,
            "fired at {at:?}, last beat at {last_beat:?}"
        );
        assert!(
            at < last_beat + Duration::from_secs(2),
            "fired at {at:?}, last beat at {last_beat:?}"
        );
    }

    /// The time since the last beat is never longer than it is: the watchdog must not fire
    /// before its bound.
    #[test]
    fn a_stall_is_never_measured_longer_than_it_is() {
        let h = Health::new(Duration::from_secs(60));
        for _ in 0..100 {
            let before = Instant::now();
            h.beat();
            let measured = h.since_progress();
            let at_most = before.elapsed();
            assert!(measured <= at_most, "{measured:?} > {at_most:?}");
        }
    }

    /// The same at the edge the loop above finds only by chance: a beat less than a microsecond
    /// past a whole millisecond.
    #[test]
    fn a_beat_just_past_a_millisecond_is_not_measured_as_that_millisecond() {
        let h = Health::new(Duration::from_secs(60));
        let beat = h.inner.started + Duration::from_nanos(5_000_900);
        h.beat_at(beat);
        assert_eq!(h.since_progress_at(beat), Duration::ZERO);
        let later = beat + Duration::from_micros(500);
        assert!(h.since_progress_at(later) <= Duration::from_micros(500));
    }

    #[test]
    fn a_disarmed_watchdog_never_fires() {
        let h = Health::new(Duration::from_secs(60));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        drop(h.watchdog_with(Duration::from_millis(50), move |_| {
            let _ = tx.send(());
        }));
        assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
    }

    /// The exposition of every binary carries the process's own series (RSS, CPU, threads, file
    /// descriptors), read at scrape time: the dashboard's memory and CPU panels rest on them.
    #[test]
    fn the_exposition_carries_the_process_memory_and_cpu() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let endpoint = Endpoint::new(Health::new(DEFAULT_STALL_AFTER), recorder.handle());
        let body = metrics::with_local_recorder(&recorder, || {
            endpoint.process.describe();
            endpoint.exposition()
        });
        let value = |name: &str| {
            body.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {name} sample in:\n{body}"))
        };
        let rss = value("process_resident_memory_bytes");
        assert!(
            rss > 1_000_000.0,
            "a test process holds more than 1 MB: {rss}"
        );
        assert!(value("process_threads") >= 1.0);
        assert!(value("process_start_time_seconds") > 1.6e9);
        assert!(value("process_cpu_seconds_total") >= 0.0);
        assert!(
            body.contains("# TYPE process_resident_memory_bytes gauge"),
            "{body}"
        );
    }

    #[test]
    fn liveness_follows_the_beats_and_readiness_the_reports() {
        let h = Health::new(Duration::from_secs(60));
        h.beat();
        assert!(h.is_alive());
        assert!(
            !h.is_alive_at(Instant::now() + Duration::from_secs(61)),
            "no beat for longer than stall_after"
        );
        assert_eq!(h.readiness().as_deref(), Some("starting"));
        h.ready();
        assert_eq!(h.readiness(), None);
        h.not_ready("restoring");
        assert_eq!(h.readiness().as_deref(), Some("restoring"));
    }

    /// A held wait beats (the watchdog counts it) and says what it waits for until it ends; the
    /// watchdog still fires once the sightings stop.
    #[test]
    fn a_held_wait_beats_while_it_is_seen_and_the_watchdog_fires_once_it_is_not() {
        let h = Health::new(Duration::from_secs(60));
        // Long beside the 20 ms between sightings, so that a loaded machine does not fire it.
        let bound = Duration::from_secs(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let _guard = h.watchdog_with(bound, move |_| {
            let _ = tx.send(());
        });
        let started = Instant::now();
        while started.elapsed() < bound * 3 {
            h.held("restoring, held by an undecided transaction: s [0]");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(rx.try_recv().is_err(), "fired while the hold was seen");
        assert_eq!(
            h.held_on().as_deref(),
            Some("restoring, held by an undecided transaction: s [0]")
        );
        // Sightings stop (a leader that no longer answers, a call that never returns).
        assert!(rx.recv_timeout(Duration::from_secs(5)).is_ok(), "fired");
        h.unheld();
        assert_eq!(h.held_on(), None);
    }
}
