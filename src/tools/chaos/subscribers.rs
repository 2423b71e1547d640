//! The webhook subscribers of an all-stage chaos run: local HTTP servers (axum, on a runtime of
//! their own) that `alert-deliver` posts to, started and read by the runner itself.
//!
//! Each records, per `Idempotency-Key` (`<notification id>/<subscriber>`), how many requests it
//! got and whether it accepted one: "accepted" is what a receiver that deduplicates on the key
//! keeps, the first 2xx of each key. Delivery is at least once (a killed deliverer repeats its
//! batch), acceptance exactly once, so the check is on the set of accepted keys.
//!
//! One subscriber may fail: inside its outage it answers 503 to everything, so the deliverer's
//! retry buckets (and its circuit breaker) carry its notifications until it recovers. The outage
//! begins with the first request at or after its start (the deliverers of a chaos run can be
//! stalled by a rebalance for a session timeout, and an outage nobody saw would test nothing)
//! and lasts a fixed time, shorter than the sum of the bucket delays, so no notification runs
//! out of buckets and none should reach the deliverer's DLQ.
//!
//! ```text
//!   alert-deliver ──POST /hook/<name>──► server ──► per-name log: requests per key, accepted keys
//!                                          └─ failing name inside its window: 503
//! ```

use anyhow::Context as _;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// When the failing subscriber fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outage {
    /// From the start of the chaos: the first request from then on begins the outage.
    pub after: Duration,
    /// From that first request.
    pub lasts: Duration,
}

/// The failing subscriber's outage, as it goes.
#[derive(Debug, Clone)]
struct Failing {
    name: String,
    /// The outage may begin from here.
    from: Instant,
    lasts: Duration,
    /// Begun at this instant (the first request at or after `from`).
    begun: Option<Instant>,
}

impl Failing {
    /// Whether a request to `name` arriving `now` is refused (beginning the outage if due).
    fn refuses(&mut self, name: &str, now: Instant) -> bool {
        if name != self.name || now < self.from {
            return false;
        }
        let begun = *self.begun.get_or_insert(now);
        now < begun + self.lasts
    }
}

/// What one subscriber saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// Requests per key (every attempt, whatever the answer).
    pub requests: BTreeMap<String, u64>,
    /// Keys answered 2xx at least once.
    pub accepted: BTreeSet<String>,
    /// Requests answered 503 by the outage.
    pub refused: u64,
}

/// Shared by the handlers and the runner.
struct Shared {
    seen: Mutex<BTreeMap<String, Seen>>,
    /// The failing subscriber's outage, once the chaos has started.
    failing: Mutex<Option<Failing>>,
}

/// The running servers (one listener, a path per subscriber).
pub struct Subscribers {
    addr: std::net::SocketAddr,
    names: Vec<String>,
    failing: String,
    shared: Arc<Shared>,
    /// Owns the server task; dropping it stops the server.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Subscribers {
    /// Starts listening on a free port of 127.0.0.1 for `names`; `failing` (one of them) fails
    /// once [`Subscribers::chaos_started`] is called, for its outage.
    pub fn start(names: &[&str], failing: &str) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            // Two: a deliverer's burst of requests must not wait behind one slow handler.
            .worker_threads(2)
            .thread_name("chaos-subscribers")
            .enable_all()
            .build()
            .context("the subscribers' runtime")?;
        let shared = Arc::new(Shared {
            seen: Mutex::new(
                names
                    .iter()
                    .map(|n| ((*n).to_owned(), Seen::default()))
                    .collect(),
            ),
            failing: Mutex::new(None),
        });
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .context("binding the subscribers' port")?;
        let addr = listener.local_addr().context("the subscribers' address")?;
        let app = axum::Router::new()
            .route("/hook/{name}", axum::routing::post(hook))
            .with_state(Arc::clone(&shared));
        runtime.spawn(async move { axum::serve(listener, app).await });
        Ok(Subscribers {
            addr,
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            failing: failing.to_owned(),
            shared,
            runtime: Some(runtime),
        })
    }

    /// The subscribers' names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The failing subscriber's name.
    pub fn failing(&self) -> &str {
        &self.failing
    }

    /// The URL of subscriber `name`.
    pub fn url(&self, name: &str) -> String {
        format!("http://{}/hook/{name}", self.addr)
    }

    /// The subscriptions file of alert-deliver: every subscriber, every symbol.
    pub fn subscriptions_toml(&self) -> String {
        crate::tools::subscriber::subscriptions_toml(&self.names, |n| self.url(n))
    }

    /// The chaos starts now: the failing subscriber's outage is placed from here.
    pub fn chaos_started(&self, outage: Outage) {
        *lock(&self.shared.failing) = Some(Failing {
            name: self.failing.clone(),
            from: Instant::now() + outage.after,
            lasts: outage.lasts,
            begun: None,
        });
    }

    /// What subscriber `name` saw so far.
    pub fn seen(&self, name: &str) -> Seen {
        lock(&self.shared.seen)
            .get(name)
            .cloned()
            .unwrap_or_default()
    }
}

impl Drop for Subscribers {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// The lock, also after a handler panicked holding it (what it guards stays consistent: each
/// update is one insert).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn hook(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let now = Instant::now();
    let failing = lock(&shared.failing)
        .as_mut()
        .is_some_and(|f| f.refuses(&name, now));
    let mut seen = lock(&shared.seen);
    let Some(s) = seen.get_mut(&name) else {
        return StatusCode::NOT_FOUND;
    };
    *s.requests.entry(key.clone()).or_default() += 1;
    if failing {
        s.refused += 1;
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    s.accepted.insert(key);
    StatusCode::OK
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(url: &str, key: &str) -> u16 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            reqwest::Client::new()
                .post(url)
                .header("Idempotency-Key", key)
                .body("{}")
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    }

    #[test]
    fn the_failing_subscriber_refuses_inside_its_window_and_accepts_after_it() {
        let subs = Subscribers::start(&["steady", "flaky"], "flaky").unwrap();
        assert_eq!(post(&subs.url("flaky"), "a/flaky"), 200, "no outage yet");
        subs.chaos_started(Outage {
            after: Duration::ZERO,
            lasts: Duration::from_millis(300),
        });
        assert_eq!(post(&subs.url("flaky"), "b/flaky"), 503);
        assert_eq!(post(&subs.url("steady"), "b/steady"), 200, "only one fails");
        std::thread::sleep(Duration::from_millis(400)); // the outage's length is the scenario
        assert_eq!(post(&subs.url("flaky"), "b/flaky"), 200);
        assert_eq!(post(&subs.url("flaky"), "b/flaky"), 200, "a repeat is fine");
        let flaky = subs.seen("flaky");
        assert_eq!(
            flaky.accepted,
            ["a/flaky", "b/flaky"].map(String::from).into()
        );
        assert_eq!((flaky.requests["b/flaky"], flaky.refused), (3, 1));
        assert_eq!(subs.seen("steady").accepted.len(), 1);
        assert!(subs.subscriptions_toml().contains("[subscribers.flaky]"));
    }

    #[test]
    fn an_outage_begins_with_the_first_request_after_its_start() {
        let t0 = Instant::now();
        let mut f = Failing {
            name: "flaky".into(),
            from: t0 + Duration::from_secs(10),
            lasts: Duration::from_secs(5),
            begun: None,
        };
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(!f.refuses("flaky", at(9)), "not yet");
        assert!(!f.refuses("steady", at(20)), "another subscriber");
        assert!(f.refuses("flaky", at(20)), "the first request begins it");
        assert!(f.refuses("flaky", at(24)));
        assert!(!f.refuses("flaky", at(25)), "over 5 s after it began");
    }
}
