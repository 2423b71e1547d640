//! `test-subscriber`: local webhook receivers for alert-deliver, to watch the delivery paths
//! without a real endpoint (`scripts/demo.sh` part 4). One listener, one path per subscriber, each
//! answering as told:
//!
//! | behaviour      | answers                                                                |
//! |----------------|------------------------------------------------------------------------|
//! | `accept`       | 200 to everything                                                      |
//! | `fail-for:5s`  | 503 from its first request for that long, then 200: the retry buckets  |
//! | `status:410`   | that status to everything (410 Gone: the parking lot; another 4xx: the DLQ) |
//!
//! The outage of `fail-for` begins with the subscriber's first request, not with the process, so
//! it is seen whatever the time the deliverer takes to start. Each subscriber counts its requests
//! by `Idempotency-Key` (`<notification id>/<subscriber>`, the same on every attempt): distinct
//! keys, all requests, keys answered 2xx, and the answers given. The counts are printed when the
//! process is stopped (SIGINT/SIGTERM), and the subscriptions file alert-deliver needs (every
//! subscriber, every symbol) is written once the port is bound, so a script can wait for it.

use anyhow::{bail, Context as _};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a subscriber answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// 200 to everything.
    Accept,
    /// 503 for this long from its first request, then 200.
    FailFor(Duration),
    /// This status to everything.
    Status(StatusCode),
}

impl fmt::Display for Behaviour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Behaviour::Accept => write!(f, "accept"),
            Behaviour::FailFor(d) => write!(f, "fail-for:{}", humantime::format_duration(*d)),
            Behaviour::Status(s) => write!(f, "status:{}", s.as_u16()),
        }
    }
}

/// A subscriber as given on the command line: `NAME=BEHAVIOUR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub name: String,
    pub behaviour: Behaviour,
}

impl std::str::FromStr for Spec {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let (name, how) = s
            .split_once('=')
            .context("a subscriber is NAME=accept, NAME=fail-for:DURATION or NAME=status:CODE")?;
        if !crate::deliver::subscriptions::valid_name(name) {
            bail!("subscriber name {name:?} must be 1 to 64 bytes of a-z, 0-9, '-', '_', '.'");
        }
        let behaviour = match how.split_once(':') {
            None if how == "accept" => Behaviour::Accept,
            Some(("fail-for", d)) => Behaviour::FailFor(
                crate::duration::duration(d).map_err(|e| anyhow::anyhow!("{name}: {e}"))?,
            ),
            Some(("status", code)) => Behaviour::Status(
                code.parse::<u16>()
                    .ok()
                    .and_then(|c| StatusCode::from_u16(c).ok())
                    .with_context(|| format!("{name}: {code:?} is not an HTTP status"))?,
            ),
            _ => {
                bail!("{name}: unknown behaviour {how:?} (accept, fail-for:DURATION, status:CODE)")
            }
        };
        Ok(Spec {
            name: name.to_owned(),
            behaviour,
        })
    }
}

/// What one subscriber saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// Requests per Idempotency-Key (every attempt).
    pub requests: BTreeMap<String, u64>,
    /// Keys answered 2xx at least once.
    pub accepted: BTreeSet<String>,
    /// Answers given, by status.
    pub answers: BTreeMap<u16, u64>,
}

/// One subscriber: how it answers, since when it fails, what it saw.
#[derive(Debug)]
struct Subscriber {
    behaviour: Behaviour,
    /// The first request (a `fail-for` outage starts there).
    first: Option<Instant>,
    seen: Seen,
}

impl Subscriber {
    /// The answer to a request arriving `now`, counted.
    fn answer(&mut self, key: &str, now: Instant) -> StatusCode {
        let first = *self.first.get_or_insert(now);
        let status = match self.behaviour {
            Behaviour::Accept => StatusCode::OK,
            Behaviour::FailFor(d) if now < first + d => StatusCode::SERVICE_UNAVAILABLE,
            Behaviour::FailFor(_) => StatusCode::OK,
            Behaviour::Status(s) => s,
        };
        *self.seen.requests.entry(key.to_owned()).or_default() += 1;
        *self.seen.answers.entry(status.as_u16()).or_default() += 1;
        if status.is_success() {
            self.seen.accepted.insert(key.to_owned());
        }
        status
    }
}

type Shared = Arc<Mutex<BTreeMap<String, Subscriber>>>;

/// The lock, also after a handler panicked holding it (each update leaves the counts whole).
fn lock(
    m: &Mutex<BTreeMap<String, Subscriber>>,
) -> std::sync::MutexGuard<'_, BTreeMap<String, Subscriber>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What every subscriber saw, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report(pub Vec<(String, Behaviour, Seen)>);

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<12} {:<14} {:>8} {:>13} {:>13}  answers",
            "subscriber", "behaviour", "requests", "distinct keys", "accepted keys"
        )?;
        for (name, behaviour, seen) in &self.0 {
            let answers: Vec<String> = seen
                .answers
                .iter()
                .map(|(status, n)| format!("{status}x{n}"))
                .collect();
            writeln!(
                f,
                "{:<12} {:<14} {:>8} {:>13} {:>13}  {}",
                name,
                behaviour.to_string(),
                seen.requests.values().sum::<u64>(),
                seen.requests.len(),
                seen.accepted.len(),
                answers.join(" ")
            )?;
        }
        Ok(())
    }
}

/// The running receivers.
pub struct Receivers {
    pub addr: std::net::SocketAddr,
    order: Vec<String>,
    shared: Shared,
}

impl Receivers {
    /// Binds `listen` and serves `specs` on the current tokio runtime.
    pub async fn start(listen: std::net::SocketAddr, specs: &[Spec]) -> anyhow::Result<Self> {
        if specs.is_empty() {
            bail!("no subscriber: give --subscriber NAME=BEHAVIOUR");
        }
        let mut map = BTreeMap::new();
        for s in specs {
            let sub = Subscriber {
                behaviour: s.behaviour,
                first: None,
                seen: Seen::default(),
            };
            if map.insert(s.name.clone(), sub).is_some() {
                bail!("subscriber {} given twice", s.name);
            }
        }
        let shared: Shared = Arc::new(Mutex::new(map));
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let addr = listener.local_addr().context("the bound address")?;
        let app = axum::Router::new()
            .route("/hook/{name}", axum::routing::post(hook))
            .with_state(Arc::clone(&shared));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Receivers {
            addr,
            order: specs.iter().map(|s| s.name.clone()).collect(),
            shared,
        })
    }

    /// The URL of subscriber `name`.
    pub fn url(&self, name: &str) -> String {
        format!("http://{}/hook/{name}", self.addr)
    }

    /// alert-deliver's subscriptions file: every subscriber, every symbol.
    pub fn subscriptions_toml(&self) -> String {
        subscriptions_toml(&self.order, |n| self.url(n))
    }

    /// What each subscriber saw so far.
    pub fn report(&self) -> Report {
        let subs = lock(&self.shared);
        Report(
            self.order
                .iter()
                .filter_map(|n| {
                    subs.get(n)
                        .map(|s| (n.clone(), s.behaviour, s.seen.clone()))
                })
                .collect(),
        )
    }
}

/// Serves `specs` on `listen`, writes the subscriptions file to `subscriptions_out` (whole, by a
/// rename) once bound, and returns what they saw when `shutdown` resolves.
pub async fn serve(
    listen: std::net::SocketAddr,
    specs: &[Spec],
    subscriptions_out: Option<&std::path::Path>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<Report> {
    let receivers = Receivers::start(listen, specs).await?;
    if let Some(path) = subscriptions_out {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, receivers.subscriptions_toml())
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    }
    tracing::info!(addr = %receivers.addr, subscribers = specs.len(), "test-subscriber listening");
    shutdown.await;
    Ok(receivers.report())
}

async fn hook(
    State(shared): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let status = match lock(&shared).get_mut(&name) {
        Some(s) => s.answer(&key, Instant::now()),
        None => StatusCode::NOT_FOUND,
    };
    // One line per request, as it comes, at debug so that the demo's terminal is not flooded:
    // the compose project's `webhook` turns it on (RUST_LOG) for `docker compose logs -f
    // webhook`; the counts come when the receiver stops.
    tracing::debug!(subscriber = %name, key = %key, status = status.as_u16(), "webhook request");
    status
}

/// alert-deliver's subscriptions file for local receivers: each of `names`, at `url_of(name)`,
/// for every symbol (this tool's and the chaos runner's).
pub fn subscriptions_toml(names: &[String], url_of: impl Fn(&str) -> String) -> String {
    names
        .iter()
        .map(|n| {
            format!(
                "[subscribers.{n}]\nurl = \"{}\"\nsymbols = [\"*\"]\n\n",
                url_of(n)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_refuse() {
        let s: Spec = "flaky=fail-for:5s".parse().unwrap();
        assert_eq!(s.behaviour, Behaviour::FailFor(Duration::from_secs(5)));
        assert_eq!(
            "gone=status:410".parse::<Spec>().unwrap().behaviour,
            Behaviour::Status(StatusCode::GONE)
        );
        assert_eq!(
            "ok=accept".parse::<Spec>().unwrap().behaviour,
            Behaviour::Accept
        );
        for bad in ["x", "x=maybe", "x=fail-for:5", "x=status:abc", "X Y=accept"] {
            assert!(bad.parse::<Spec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_failing_subscriber_fails_from_its_first_request_for_its_time_only() {
        let t0 = Instant::now();
        let mut s = Subscriber {
            behaviour: Behaviour::FailFor(Duration::from_secs(5)),
            first: None,
            seen: Seen::default(),
        };
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        assert_eq!(s.answer("a/flaky", at(10)), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(s.answer("a/flaky", at(14)), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(s.answer("a/flaky", at(15)), StatusCode::OK);
        assert_eq!(s.answer("b/flaky", at(16)), StatusCode::OK);
        assert_eq!(s.seen.requests.values().sum::<u64>(), 4);
        assert_eq!((s.seen.requests.len(), s.seen.accepted.len()), (2, 2));
        assert_eq!(s.seen.answers, BTreeMap::from([(200, 2), (503, 2)]));
    }

    #[test]
    fn the_receivers_answer_over_http_and_report_by_key() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let specs: Vec<Spec> = ["ok=accept", "gone=status:410"]
                .iter()
                .map(|s| s.parse().unwrap())
                .collect();
            let r = Receivers::start("127.0.0.1:0".parse().unwrap(), &specs)
                .await
                .unwrap();
            let client = reqwest::Client::new();
            let post = |name: &str, key: &str| {
                client
                    .post(r.url(name))
                    .header("Idempotency-Key", key)
                    .body("{}")
                    .send()
            };
            assert_eq!(post("ok", "a/ok").await.unwrap().status().as_u16(), 200);
            assert_eq!(post("ok", "a/ok").await.unwrap().status().as_u16(), 200);
            assert_eq!(post("gone", "a/gone").await.unwrap().status().as_u16(), 410);
            assert_eq!(post("nobody", "a/x").await.unwrap().status().as_u16(), 404);
            let report = r.report();
            let ok = &report.0[0].2;
            assert_eq!((ok.requests["a/ok"], ok.accepted.len()), (2, 1));
            assert_eq!(report.0[1].2.accepted.len(), 0);
            let text = report.to_string();
            assert!(text.contains("status:410"), "{text}");
            assert!(r.subscriptions_toml().contains("[subscribers.gone]"));
            let parsed =
                crate::deliver::Subscriptions::parse(&r.subscriptions_toml(), "t").unwrap();
            assert_eq!(parsed.len(), 2);
        });
    }
}
