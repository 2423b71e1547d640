//! A subscriber endpoint the test controls: a local HTTP server (axum) that answers as it is told
//! and records every request's `Idempotency-Key`, when it came and what it answered. "Accepted" is
//! what a receiver that deduplicates on the key would keep: the first 2xx of each key.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// How the endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// 200 to everything.
    Ok,
    /// This status to everything.
    Status(u16),
    /// This status to everything, after thinking this long (a slow failing endpoint).
    StatusAfter(u16, std::time::Duration),
    /// The first request of each key: 429 with `Retry-After: <secs>`; later ones: 200.
    TooManyOnce { retry_after_secs: u64 },
}

/// One request as the endpoint saw it.
#[derive(Debug, Clone)]
pub struct Request {
    pub key: String,
    pub at: SystemTime,
    pub status: u16,
}

#[derive(Default)]
struct Log {
    requests: Vec<Request>,
    accepted: BTreeSet<String>,
}

/// A running (or not yet listening) endpoint.
pub struct Webhook {
    pub addr: String,
    behaviour: Behaviour,
    log: Arc<Mutex<Log>>,
    /// While set, every request is taken and never answered (a hanging endpoint).
    hanging: Arc<AtomicBool>,
    /// While not 0, every request is answered with this status (a failing endpoint).
    failing: Arc<AtomicU16>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Webhook {
    /// An endpoint on a free port that does not listen yet: connections are refused until
    /// [`Webhook::start`].
    pub fn down(behaviour: Behaviour) -> Self {
        Webhook {
            addr: refusing_addr(),
            behaviour,
            log: Arc::default(),
            hanging: Arc::default(),
            failing: Arc::default(),
            runtime: None,
        }
    }

    /// From the next request on, the endpoint hangs: it takes every connection and request and
    /// never answers, until [`Webhook::recover`]. Requests it never answered are not logged.
    pub fn hang(&self) {
        self.hanging.store(true, Ordering::SeqCst);
    }

    /// From the next request on, the endpoint answers `status` to every request, whatever its
    /// behaviour, until [`Webhook::recover`].
    pub fn fail(&self, status: u16) {
        self.failing.store(status, Ordering::SeqCst);
    }

    /// A hanging or failing endpoint answers again (as its behaviour says) from the next request on.
    pub fn recover(&self) {
        self.hanging.store(false, Ordering::SeqCst);
        self.failing.store(0, Ordering::SeqCst);
    }

    /// An endpoint that listens at once.
    pub fn up(behaviour: Behaviour) -> Self {
        let mut w = Self::down(behaviour);
        w.start();
        w
    }

    /// Starts listening on its address.
    pub fn start(&mut self) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let state = (
            self.behaviour,
            Arc::clone(&self.log),
            Arc::clone(&self.hanging),
            Arc::clone(&self.failing),
        );
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(&self.addr))
            .expect("binding the webhook");
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(hook))
            .with_state(state);
        runtime.spawn(async move { axum::serve(listener, app).await });
        self.runtime = Some(runtime);
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.log.lock().unwrap().requests.clone()
    }

    /// The keys accepted (first 2xx of each).
    pub fn accepted(&self) -> BTreeSet<String> {
        self.log.lock().unwrap().accepted.clone()
    }

    /// Requests per key.
    pub fn per_key(&self) -> BTreeMap<String, Vec<Request>> {
        let mut out: BTreeMap<String, Vec<Request>> = BTreeMap::new();
        for r in self.requests() {
            out.entry(r.key.clone()).or_default().push(r);
        }
        out
    }
}

/// A free port below the ephemeral range (32768 up on Linux). A port inside it can be picked as
/// the source port of a connection to itself: Linux then completes a TCP "simultaneous open" with
/// no one listening, and the request hangs until its timeout instead of being refused.
fn refusing_addr() -> String {
    use rand::Rng;
    for _ in 0..1000 {
        let port: u16 = rand::rng().random_range(20_000..32_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return format!("127.0.0.1:{port}");
        }
    }
    panic!("no free port below the ephemeral range")
}

impl Drop for Webhook {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

type Shared = (Behaviour, Arc<Mutex<Log>>, Arc<AtomicBool>, Arc<AtomicU16>);

async fn hook(
    State((behaviour, log, hanging, failing)): State<Shared>,
    headers: HeaderMap,
    _body: Bytes,
) -> Response {
    if hanging.load(Ordering::SeqCst) {
        // The scenario: a request that is never answered (the client gives up on it).
        return std::future::pending().await;
    }
    let at = SystemTime::now();
    if let Behaviour::StatusAfter(_, think) = behaviour {
        tokio::time::sleep(think).await; // the endpoint's own slowness, part of the scenario
    }
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut log = log.lock().unwrap();
    let seen = log.requests.iter().any(|r| r.key == key);
    let failing = failing.load(Ordering::SeqCst);
    let (status, retry_after) = match behaviour {
        _ if failing != 0 => (failing, None),
        Behaviour::Ok => (200, None),
        Behaviour::Status(s) | Behaviour::StatusAfter(s, _) => (s, None),
        Behaviour::TooManyOnce { retry_after_secs } if !seen => (429, Some(retry_after_secs)),
        Behaviour::TooManyOnce { .. } => (200, None),
    };
    if (200..300).contains(&status) {
        log.accepted.insert(key.clone());
    }
    log.requests.push(Request { key, at, status });
    let code = StatusCode::from_u16(status).expect("a status code");
    match retry_after {
        Some(s) => (code, [("retry-after", s.to_string())]).into_response(),
        None => code.into_response(),
    }
}
