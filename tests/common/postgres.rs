//! PostgreSQL of the sink tests: the cluster of scripts/postgres.sh (or `DATABASE_URL`), a fresh
//! database per test, the queries the tests assert on, and an alert-sink child process.

use super::{kafka, Pipeline};
use price_alerts::sink::db;
use price_alerts::sink::options::{DatabaseUrl, DbOptions, TlsOptions};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Where the cluster of scripts/postgres.sh keeps its files.
pub fn state_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".postgres")
}

/// The server under test: `DATABASE_URL`, or the URL scripts/postgres.sh wrote.
pub fn admin_url() -> String {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        return url;
    }
    std::fs::read_to_string(state_dir().join("url"))
        .map(|s| s.trim().to_owned())
        .expect(
            "no DATABASE_URL and no .postgres/url: run scripts/postgres.sh up (or scripts/test.sh)",
        )
}

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let base = match base.split_once("://").and_then(|(_, rest)| rest.find('/')) {
        Some(_) => base.rsplit_once('/').map_or(base, |(b, _)| b),
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

pub fn options(url: &str) -> DbOptions {
    DbOptions {
        url: url.parse::<DatabaseUrl>().expect("url"),
        tls: TlsOptions::default(),
        // Generous: a debug build's SCRAM and TLS handshake on a loaded 2-core machine take seconds.
        connect_timeout: Duration::from_secs(30),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Runs one statement on the server's admin database.
fn admin(sql: &str) {
    runtime().block_on(async {
        let c = db::connect(&options(&admin_url()))
            .await
            .expect("connecting to the test cluster");
        c.batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    })
}

/// The cluster is shared by test processes running side by side (scripts/test.sh runs its test
/// files in two lanes), and one test stops it. An in-process lock cannot see the other lane, so
/// every use holds a shared `flock` on one file for as long as it talks to the server, and the
/// test that stops it trades its share for the exclusive lock for the time of the outage.
pub struct ClusterUse(std::fs::File);

impl ClusterUse {
    /// Waits while another test has the cluster stopped, then shares it until dropped.
    pub fn shared() -> Self {
        let dir = state_dir();
        std::fs::create_dir_all(&dir).expect("creating .postgres");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("tests.lock"))
            .expect("opening .postgres/tests.lock");
        file.lock_shared().expect("sharing .postgres/tests.lock");
        ClusterUse(file)
    }

    /// Waits until no other test in any process uses the cluster and keeps it alone until the
    /// guard is dropped; the share is taken again then.
    pub fn alone(&self) -> Alone<'_> {
        self.0.unlock().expect("unlocking .postgres/tests.lock");
        self.0.lock().expect("locking .postgres/tests.lock");
        Alone(&self.0)
    }
}

/// The cluster used by this test alone (see [`ClusterUse::alone`]).
pub struct Alone<'a>(&'a std::fs::File);

impl Drop for Alone<'_> {
    fn drop(&mut self) {
        let _ = self.0.unlock();
        let _ = self.0.lock_shared();
    }
}

/// A dead letter as stored.
#[derive(Debug, Clone)]
pub struct StoredDeadLetter {
    pub partition: i32,
    pub offset: i64,
    pub class: String,
    pub message: String,
    pub value: Option<Vec<u8>>,
    pub headers: serde_json::Value,
}

/// A fresh database of one test, dropped at the end.
pub struct TestDb {
    pub name: String,
    pub url: String,
    /// One connection for the test's queries (each new one costs a SCRAM exchange), made again
    /// after an error; its runtime drives it between queries.
    conn: std::sync::Mutex<Option<tokio_postgres::Client>>,
    rt: tokio::runtime::Runtime,
    /// Dropped after the database is: the cluster stays up while this test uses it.
    pub cluster: ClusterUse,
}

impl TestDb {
    pub fn create(test: &str) -> Self {
        let cluster = ClusterUse::shared();
        let name = format!("t_{test}_{}", price_alerts::kafka::topics::unique_suffix());
        admin(&format!("CREATE DATABASE {name}"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        TestDb {
            url: with_database(&admin_url(), &name),
            name,
            conn: std::sync::Mutex::new(None),
            rt,
            cluster,
        }
    }

    pub fn options(&self) -> DbOptions {
        options(&self.url)
    }

    /// Runs `f` with the test's connection to this database (connecting when there is none).
    pub fn with<T>(
        &self,
        f: impl AsyncFnOnce(&tokio_postgres::Client) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, String> {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        self.rt.block_on(async {
            if conn.as_ref().is_none_or(|c| c.is_closed()) {
                *conn = Some(
                    db::connect(&self.options())
                        .await
                        .map_err(|e| e.to_string())?,
                );
            }
            let c = conn.as_ref().expect("connected just above");
            let result = f(c).await.map_err(|e| e.to_string());
            if result.is_err() {
                *conn = None;
            }
            result
        })
    }

    pub fn ids(&self) -> Vec<String> {
        let mut ids = self
            .with(async |c| {
                Ok(c.query("SELECT id FROM alerts", &[])
                    .await?
                    .iter()
                    .map(|r| r.get(0))
                    .collect::<Vec<String>>())
            })
            .expect("reading ids");
        ids.sort();
        ids
    }

    pub fn count(&self, table: &str) -> i64 {
        self.with(async |c| {
            Ok(c.query_one(&format!("SELECT count(*) FROM {table}"), &[])
                .await?
                .get(0))
        })
        .expect("counting")
    }

    /// The stored offsets of `group` on `topic`, or an error while the database does not answer.
    pub fn try_offsets(&self, group: &str, topic: &str) -> Result<BTreeMap<i32, i64>, String> {
        self.with(async |c| {
            let rows = c
                .query("SELECT kafka_partition, next_offset FROM sink_offsets WHERE consumer_group = $1 AND topic = $2", &[&group, &topic])
                .await?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }

    pub fn offsets(&self, group: &str, topic: &str) -> BTreeMap<i32, i64> {
        self.try_offsets(group, topic)
            .expect("reading stored offsets")
    }

    /// Waits until the stored offsets of `group` reach `target` on every partition.
    pub fn wait_stored(
        &self,
        group: &str,
        topic: &str,
        target: &BTreeMap<i32, i64>,
        timeout: Duration,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.try_offsets(group, topic).unwrap_or_default();
            if target.iter().all(|(p, o)| now.get(p) == Some(o)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "stored offsets {now:?} never reached {target:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn dead_letters(&self) -> Vec<StoredDeadLetter> {
        self.with(async |c| {
            let rows = c
                .query(
                    "SELECT origin_partition, origin_offset, error_class, error_message, record_value, record_headers
                     FROM sink_dead_letters ORDER BY origin_partition, origin_offset",
                    &[],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| StoredDeadLetter {
                    partition: r.get(0),
                    offset: r.get(1),
                    class: r.get(2),
                    message: r.get(3),
                    value: r.get(4),
                    headers: r.get(5),
                })
                .collect())
        })
        .expect("reading dead letters")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).take();
        let name = self.name.clone();
        let _ = std::panic::catch_unwind(|| {
            admin(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        });
    }
}

/// A free TCP port on 127.0.0.1 (for a metrics endpoint).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Where one sink reads and writes.
pub struct SinkRun {
    pub topic: String,
    pub group: String,
    pub db: TestDb,
    /// Extra arguments for every instance.
    pub extra: Vec<String>,
    /// The group protocol of every instance (`--group-protocol`): the suite's unless set.
    pub group_protocol: price_alerts::kafka::config::GroupProtocol,
}

impl SinkRun {
    pub fn new(test: &str, topic: &str) -> Self {
        SinkRun {
            topic: topic.to_owned(),
            group: format!("{}sink", super::prefix(test)),
            db: TestDb::create(test),
            extra: Vec::new(),
            group_protocol: super::suite_protocol(),
        }
    }

    /// The command line of instance `instance` (the database URL goes in the environment).
    pub fn command(&self, instance: &str, more: &[String]) -> std::process::Command {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_alert-sink"));
        c.args([
            "--bootstrap",
            &kafka().bootstrap,
            "--topic",
            &self.topic,
            "--group",
            &self.group,
        ])
        .args(["--instance-id", instance])
        .args(["--group-protocol", self.group_protocol.as_str()])
        .args(&self.extra)
        .args(more)
        .env("DATABASE_URL", &self.db.url)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,price_alerts=info".into()),
        )
        .stdin(std::process::Stdio::null());
        c
    }

    /// Starts instance `instance` as a child process.
    pub fn spawn(&self, instance: &str, more: &[String]) -> Pipeline {
        let child = self
            .command(instance, more)
            .spawn()
            .expect("starting alert-sink");
        Pipeline {
            child,
            instance: instance.to_owned(),
        }
    }

    pub fn stored(&self) -> BTreeMap<i32, i64> {
        self.db.offsets(&self.group, &self.topic)
    }

    pub fn wait_stored(&self, target: &BTreeMap<i32, i64>, timeout: Duration) {
        self.db
            .wait_stored(&self.group, &self.topic, target, timeout)
    }

    /// Waits until the stored offsets sum to at least `at_least`.
    pub fn wait_progress(&self, at_least: i64, timeout: Duration) -> i64 {
        let deadline = Instant::now() + timeout;
        loop {
            let sum: i64 = self
                .db
                .try_offsets(&self.group, &self.topic)
                .unwrap_or_default()
                .values()
                .sum();
            if sum >= at_least {
                return sum;
            }
            assert!(
                Instant::now() < deadline,
                "stored offsets stuck at {sum} (wanted {at_least})"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A TCP relay between the sink and the test cluster, which a test cuts and restores: a database
/// outage as the sink sees it (its connections broken, new ones closed at once, both "database
/// unavailable" to the sink) while the server itself, shared with other tests, keeps running, and
/// the test's own connection (direct) can still read what is stored. Everything ends with it.
pub struct Relay {
    addr: std::net::SocketAddr,
    inner: std::sync::Arc<RelayInner>,
}

struct RelayInner {
    /// Relaying (true) or cut (false). Read and written under `conns`' lock, so a connection is
    /// either registered before a cut (and broken by it) or refused after it, never missed.
    up: std::sync::atomic::AtomicBool,
    /// Set when the relay is dropped: the accept loop ends.
    closed: std::sync::atomic::AtomicBool,
    /// Both ends of every relayed connection, to break them on a cut.
    conns: std::sync::Mutex<Vec<std::net::TcpStream>>,
}

impl Relay {
    /// A relay, up, to the host and port of `url`.
    pub fn start(url: &str) -> Self {
        use std::net::{TcpListener, TcpStream};
        use std::sync::atomic::Ordering::SeqCst;
        let upstream = host_port(url).to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the relay");
        let addr = listener.local_addr().expect("relay address");
        let inner = std::sync::Arc::new(RelayInner {
            up: true.into(),
            closed: false.into(),
            conns: std::sync::Mutex::new(Vec::new()),
        });
        let shared = std::sync::Arc::clone(&inner);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if shared.closed.load(SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let mut conns = shared.conns.lock().unwrap_or_else(|e| e.into_inner());
                if !shared.up.load(SeqCst) {
                    continue; // dropped: the client's connection closes at once
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                conns.extend([c2, s2]);
                drop(conns);
                let (c3, s3) = match (client.try_clone(), server.try_clone()) {
                    (Ok(c), Ok(s)) => (c, s),
                    _ => continue,
                };
                std::thread::spawn(move || pipe(client, server));
                std::thread::spawn(move || pipe(s3, c3));
            }
        });
        Relay { addr, inner }
    }

    /// `url` with its host and port replaced by the relay's.
    pub fn url(&self, url: &str) -> String {
        url.replacen(host_port(url), &self.addr.to_string(), 1)
    }

    /// The outage begins: relayed connections break, new ones are closed at once.
    pub fn cut(&self) {
        let mut conns = self.inner.conns.lock().unwrap_or_else(|e| e.into_inner());
        self.inner
            .up
            .store(false, std::sync::atomic::Ordering::SeqCst);
        for c in conns.drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    /// The outage ends: new connections are relayed again.
    pub fn restore(&self) {
        let _conns = self.inner.conns.lock().unwrap_or_else(|e| e.into_inner());
        self.inner
            .up
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.cut();
        // Wakes the accept loop, which then sees `closed`.
        let _ = std::net::TcpStream::connect(self.addr);
    }
}

/// Copies one direction of a relayed connection until either end closes, then closes both.
fn pipe(mut from: std::net::TcpStream, mut to: std::net::TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// The `host:port` of a `postgres://user:password@host:port/db` URL.
fn host_port(url: &str) -> &str {
    let rest = url.rsplit_once('@').map_or(url, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest)
}

/// A server of scripts/postgres.sh of a test's own: the script with a state folder of its own
/// (`PG_STATE`: data, port, password, URL), so it is not the suite's server, whose tests run
/// beside. Stopped and wiped when dropped, also after a failed test.
pub struct OwnServer {
    pub state: PathBuf,
}

impl OwnServer {
    pub fn new(name: &str) -> Self {
        let state =
            std::env::temp_dir().join(format!("price-alerts-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state);
        Self { state }
    }

    /// Runs the script with `args` (and `PG_PORT=first_port` when given).
    pub fn run(&self, args: &[&str], first_port: Option<u16>) -> std::process::Output {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/postgres.sh");
        let mut c =
            price_alerts::tools::chaos::database::postgres_command(&script, Some(&self.state));
        c.args(args);
        if let Some(p) = first_port {
            c.env("PG_PORT", p.to_string());
        }
        // Its own start and stop timeouts bound it (PG_START_TIMEOUT, PG_STOP_TIMEOUT: 60 s).
        c.output().expect("scripts/postgres.sh")
    }

    /// `up`, which must succeed: the URL it printed, its port and what it logged.
    pub fn up(&self, first_port: Option<u16>) -> (String, u16, String) {
        let out = self.run(&["up"], first_port);
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "postgres.sh up (PG_STATE={}, PG_PORT={first_port:?}) failed: {log}",
            self.state.display()
        );
        let url = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let port = url
            .rsplit_once('@')
            .and_then(|(_, at)| at.split('/').next())
            .and_then(|host| host.rsplit_once(':'))
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in the URL the script printed"));
        (url, port, log)
    }

    pub fn down(&self, args: &[&str]) {
        let out = self.run(&[&["down"], args].concat(), None);
        assert!(
            out.status.success(),
            "postgres.sh down {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn port_file(&self) -> PathBuf {
        self.state.join("port")
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let out = self.run(&["down", "--wipe"], None);
        if !out.status.success() {
            eprintln!(
                "scripts/postgres.sh down --wipe (PG_STATE={}): {}",
                self.state.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let _ = std::fs::remove_dir_all(&self.state);
    }
}
