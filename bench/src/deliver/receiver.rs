//! The subscribers' side of deliver-bench: one axum listener in the bench's process, a path per
//! subscriber (`/hook/<name>`), answering 200 at once and remembering when each
//! `Idempotency-Key` was first accepted. A name that starts with `hang-` accepts the request and
//! never answers (the outage of a hanging subscriber; a refusing one is a URL with no listener).
//! With `close` set, each answer carries `Connection: close`, so every request needs a new
//! connection: the same client, without keep-alive.
//!
//! It runs on a runtime of its own (two workers) on threads of its own, so the bench's waiting
//! never slows the answers; it shares the machine's cores with the runner it measures, the same
//! for the deliverer and the reference.

use anyhow::Context as _;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use price_alerts::deliver::http::IDEMPOTENCY_KEY;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Default)]
struct Shared {
    close: AtomicBool,
    /// Requests answered 200, repeats included.
    requests: AtomicU64,
    /// Each key's first accept.
    first: Mutex<HashMap<String, Instant>>,
}

/// The listener; stopped when dropped.
pub struct Receiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the receiver saw since its last [`Receiver::reset`].
pub struct Seen {
    /// First accept of each key.
    pub first: HashMap<String, Instant>,
    /// Requests answered 200, repeats included.
    pub requests: u64,
}

impl Receiver {
    pub fn start() -> anyhow::Result<Receiver> {
        let shared = Arc::new(Shared::default());
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").context("binding the receiver")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let state = shared.clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("receiver".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let app = axum::Router::new()
                        .route("/hook/{name}", axum::routing::post(accept))
                        .with_state(state);
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(async {
                            let _ = stopped.await;
                        })
                        .await;
                });
                // A hanging subscriber's requests never end: do not wait for them.
                runtime.shutdown_background();
            })?;
        Ok(Receiver {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The URL of subscriber `name`.
    pub fn url(&self, name: &str) -> String {
        format!("http://{}/hook/{name}", self.addr)
    }

    /// Answer with `Connection: close` (a new connection per request) or not.
    pub fn set_close(&self, close: bool) {
        self.shared.close.store(close, Ordering::Relaxed);
    }

    /// Distinct keys accepted so far.
    pub fn distinct(&self) -> usize {
        self.shared.first.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Forgets every key; returns what was seen.
    pub fn reset(&self) -> Seen {
        let first = self
            .shared
            .first
            .lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default();
        Seen {
            first,
            requests: self.shared.requests.swap(0, Ordering::Relaxed),
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    _body: axum::body::Bytes,
) -> impl IntoResponse {
    if name.starts_with("hang-") {
        std::future::pending::<()>().await;
    }
    let now = Instant::now();
    let Some(key) = headers.get(IDEMPOTENCY_KEY).and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, HeaderMap::new());
    };
    if let Ok(mut first) = shared.first.lock() {
        first.entry(key.to_owned()).or_insert(now);
    }
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let mut answer = HeaderMap::new();
    if shared.close.load(Ordering::Relaxed) {
        answer.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    (StatusCode::OK, answer)
}
