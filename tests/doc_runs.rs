//! Every command the pages show runs (issue 45): `tests/docs.rs` proves that each one still
//! parses, this file that each one does what a reader who types it gets, an exit code of 0.
//!
//! # Who runs what
//! Each command that README.md, docs/*.md and bench/README.md show for a binary of the processor
//! or a `scripts/` file ([`doc_commands`] says what counts as one) is run by exactly one of:
//! - a runner script, found there verbatim ([`doc_commands::runs_verbatim`]): `scripts/demo.sh`
//!   (the demo: `target/release/txn-demo` is its `"$BIN/txn-demo"`), `scripts/test.sh` (the
//!   brokers and PostgreSQL it starts and stops: `scripts/kafka.sh up --brokers 3`, `down --secure
//!   --wipe`, …) or `.ci/run` (`scripts/test.sh`). Those are the commands that start, stop or wipe
//!   whole environments, which must not run beside the other tests;
//! - a test of the cluster's lane, which may take a broker of the 3-broker cluster down
//!   ([`doc_commands::lane_test`] says which): `tests/doc_runs_cluster.rs` (`scripts/kafka.sh
//!   broker 2 kill`, `broker 2 start`, a cluster broker's log followed), and `tests/chaos.rs`'s
//!   short runs, one for each mode of the pages' `alert-chaos` commands, which run each of them
//!   with its counts and durations turned down to the short run's;
//! - [`the_secured_examples_run`], on the secured broker (lane a, beside tests/security.rs): a
//!   command for a secured cluster (`--bootstrap kafka-1:9094`), with the config file the page
//!   shows just before it;
//! - the two broker tests below, which run every other one against the suite's broker (and
//!   PostgreSQL), and fail on the first that does not exit 0. A command the page shows as partial
//!   (`...`) cannot be run, so it fails here too: show it whole or put it in prose.
//!
//! The benchmarks' commands are bench/tests/doc_runs.rs's. [`NOT_YET_RUN`] would list a shown
//! command nothing can run yet, with why (none is, now);
//! [`every_shown_command_has_a_runner`] fails when an entry there is no longer shown, and a new
//! command that nothing can run fails the broker tests.
//!
//! # How a command is run
//! - Each code block is one example, its commands run in order in a folder of their own (with
//!   `config/` of the repository beside them, as `config/rules.toml` is in a checkout). A block
//!   that starts `alert-pipeline` or `tick-gen` makes its own data, in names of its own; every
//!   other block is an operator's commands on a system that runs already, *the world*: built once
//!   per test by [`World::build`] (a tick stream with two malformed ticks, the pipeline over it,
//!   alert-sink into a database of the test's own, alert-deliver to three local subscribers, one
//!   answering 400 and one 410), so that the DLQs, buckets, group and table the pages inspect hold
//!   something.
//! - Names: every topic, group and transactional id the pages name derives from
//!   `price-alerts`, `market-updates` or `notifications`. A word that is one of them or starts with
//!   one and `.` or `-` gets the block's prefix, and an argument the command leaves at such a
//!   default (`--app-id`, `--input`, `--output`, `--topic`) is given with the prefix, so the runs
//!   disturb no other test beside them.
//! - Placeholders, from [`placeholder_value`]: `NAME` (a subscriber), `BROKERS`, a listen address
//!   `127.0.0.1:PORT` (a free port, the same within a block), `$(scripts/postgres.sh url)` (the
//!   test's database), and for the secured examples the broker `kafka-1:PORT`, the config file's
//!   and the CA's paths under `/etc/price-alerts/` and the token endpoint's URL; a secret the page
//!   elides (`"…"`) is the broker's own ([`SecuredBroker::secret`]). Any other `$VAR` or `<…>`
//!   fails the test: add its value there.
//! - `target/release/NAME` and `NAME` run the test build of NAME (target/debug): the same code.
//! - A daemon (alert-pipeline, alert-sink and alert-deliver without `--exit-when-idle`,
//!   test-subscriber) is started and waited for until it is ready: `/readyz` answers 200 when the
//!   command shows a `--metrics-addr`, else the log line of [`DAEMONS`]. Never a sleep; every wait
//!   has a deadline. Then SIGTERM, and its exit code must be 0. One shown with `&` keeps running
//!   until the block's last command has run. Every other command must exit 0 by itself.
//!
//! Broker tests: `#[ignore]`d under a plain `cargo test`; scripts/test.sh runs them (lane a),
//! with `KAFKA_BOOTSTRAP` and `DATABASE_URL`, and the secured broker's `KAFKA_SECURE_*`.

mod common;
mod doc_commands;

use doc_commands::{LaneTest, Shown};
use price_alerts::kafka::topics::{self, DropTopics, Topics};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The scripts that run shown commands verbatim: the demo, the suite, CI's entry point.
const RUNNERS: &[&str] = &["scripts/demo.sh", "scripts/test.sh", ".ci/run"];

/// Shown commands nothing runs yet, as (page, the command as [`Shown`] prints it after its
/// `page:line: `, why). Each must still be shown: an entry whose command left the page fails
/// [`every_shown_command_has_a_runner`].
const NOT_YET_RUN: &[(&str, &str, &str)] = &[];

/// The daemons among the processor's binaries and the log line that says one is ready, when the
/// command shows no `--metrics-addr` to ask `/readyz`.
const DAEMONS: &[(&str, &str)] = &[
    ("alert-pipeline", "partitions assigned"),
    ("alert-sink", "alert-sink starting"),
    ("alert-deliver", "alert-deliver"),
    ("test-subscriber", "test-subscriber listening"),
];

/// How long a one-shot command, a daemon's readiness and a daemon's exit after SIGTERM may take.
const RUN_BOUND: Duration = Duration::from_secs(180);
const READY_BOUND: Duration = Duration::from_secs(90);
const STOP_BOUND: Duration = Duration::from_secs(45);

/// The names every topic, group and transactional id of the pages derives from.
const BASES: &[&str] = &["price-alerts", "market-updates", "notifications"];

/// Who runs a shown command.
#[derive(Debug, PartialEq)]
enum Runner {
    /// A runner script holds it verbatim, at this line.
    Script(&'static str, usize),
    /// It is a runner script itself (`scripts/demo.sh`, `scripts/test.sh` run by `.ci/run`).
    Itself,
    /// Nothing yet: [`NOT_YET_RUN`].
    NotYet(&'static str),
    /// A test of the cluster's lane ([`doc_commands::lane_test`]).
    Lane(LaneTest),
    /// The secured broker's test here: a command for a secured cluster ([`secured`]).
    Secured,
    /// The broker tests here.
    Here,
}

/// Whether a shown command is one for a secured cluster: it names the pages' production broker,
/// `kafka-1:PORT` (docs/security.md's examples), whose listeners [`placeholder_value`] gives
/// the secured broker's.
fn secured(shown: &Shown) -> bool {
    shown.args.iter().any(|a| a.starts_with("kafka-1:"))
}

/// The command as [`Shown`] prints it, without its `page:line: `.
fn rendered(shown: &Shown) -> String {
    let all = shown.to_string();
    all.split_once(": ")
        .map(|(_, c)| c.to_owned())
        .unwrap_or(all)
}

/// A runner script and the commands it runs, as (line, words).
type ScriptCommands = (&'static str, Vec<(usize, Vec<String>)>);

/// Each runner script's commands.
fn runner_commands() -> Vec<ScriptCommands> {
    RUNNERS
        .iter()
        .map(|r| {
            let text = std::fs::read_to_string(root().join(r)).expect("a runner script");
            (*r, doc_commands::script_commands(&text))
        })
        .collect()
}

/// Who runs `shown`.
fn runner(shown: &Shown, runners: &[ScriptCommands]) -> Runner {
    if let Some((_, _, why)) = NOT_YET_RUN
        .iter()
        .find(|(page, cmd, _)| *page == shown.page && *cmd == rendered(shown))
    {
        return Runner::NotYet(why);
    }
    if let Some(test) = doc_commands::lane_test(shown) {
        return Runner::Lane(test);
    }
    if secured(shown) {
        return Runner::Secured;
    }
    for (name, commands) in runners {
        if let Some(line) = doc_commands::runs_verbatim(commands, shown) {
            return Runner::Script(name, line);
        }
    }
    if shown.args.is_empty() && RUNNERS.contains(&shown.binary.as_str()) {
        return Runner::Itself;
    }
    Runner::Here
}

/// Every shown command: the processor's binaries', then the scripts'.
fn all_shown() -> Vec<Shown> {
    let binaries = doc_commands::binaries(&root().join("src/bin"));
    let mut shown = doc_commands::shown_commands(&root(), &binaries);
    shown.extend(doc_commands::shown_scripts(&root()));
    shown.sort_by(|a, b| (a.page.as_str(), a.line).cmp(&(b.page.as_str(), b.line)));
    shown
}

#[test]
fn every_shown_command_has_a_runner() {
    let runners = runner_commands();
    let shown = all_shown();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for s in &shown {
        let r = runner(s, &runners);
        eprintln!("{s}\n    {r:?}");
        let key = match r {
            Runner::Script(name, _) => format!("run by {name}"),
            Runner::Itself => "a runner script itself".to_owned(),
            Runner::NotYet(_) => "not yet run".to_owned(),
            Runner::Lane(LaneTest::ClusterBrokers) => "run by tests/doc_runs_cluster.rs".to_owned(),
            Runner::Lane(LaneTest::Chaos) => "run turned down by tests/chaos.rs".to_owned(),
            Runner::Secured => "run by tests/doc_runs.rs on the secured broker".to_owned(),
            Runner::Here => "run by tests/doc_runs.rs".to_owned(),
        };
        *counts.entry(key).or_default() += 1;
    }
    eprintln!("{} shown commands: {counts:?}", shown.len());
    let stale: Vec<String> = NOT_YET_RUN
        .iter()
        .filter(|(page, cmd, _)| !shown.iter().any(|s| s.page == *page && rendered(s) == *cmd))
        .map(|(page, cmd, _)| format!("{page}: {cmd}"))
        .collect();
    assert!(
        stale.is_empty(),
        "NOT_YET_RUN names commands no page shows any more (remove them):\n{}",
        stale.join("\n")
    );
    // A partial command cannot be run: the broker tests would fail on it; say so here already.
    let partial: Vec<String> = shown
        .iter()
        .filter(|s| s.partial && runner(s, &runners) == Runner::Here)
        .map(|s| s.to_string())
        .collect();
    assert!(
        partial.is_empty(),
        "partial commands (`...`) that nothing can run: show them whole, or in prose:\n{}",
        partial.join("\n")
    );
    assert!(shown.len() >= 50, "found the commands: {shown:#?}");
}

#[test]
fn scripts_are_read_as_a_shell_runs_them() {
    let commands = doc_commands::script_commands(
        "x() {\n  cluster) if ! scripts/kafka.sh status --brokers 3 >/dev/null 2>&1; then a=1; scripts/kafka.sh up & pids+=($!); fi ;;\n}\n\
         \"$BIN/txn-demo\"\nDATABASE_URL=$(scripts/postgres.sh url)\nexec scripts/test.sh\n\
         \"$BIN/alert-sink\" --app-id \"$run\" \\\n  --exit-when-idle 3s # a comment\n",
    );
    let words: Vec<Vec<&str>> = commands
        .iter()
        .map(|(_, w)| w.iter().map(String::as_str).collect())
        .collect();
    for want in [
        vec!["scripts/kafka.sh", "status", "--brokers", "3"],
        vec!["scripts/kafka.sh", "up"],
        vec!["txn-demo"],
        vec!["scripts/postgres.sh", "url"],
        vec!["scripts/test.sh"],
        vec!["alert-sink", "--app-id", "$run", "--exit-when-idle", "3s"],
    ] {
        assert!(words.contains(&want), "{want:?} not in {words:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Running

/// One block's place: its folder, its prefix, its test values.
struct Place {
    dir: PathBuf,
    prefix: String,
    database_url: Option<String>,
    /// The secured broker, for the secured examples ([`Runner::Secured`]).
    secured: Option<SecuredBroker>,
    /// The free address each shown listen address stands for, within the place.
    addrs: Mutex<BTreeMap<String, String>>,
}

impl Place {
    fn new(name: &str, prefix: &str, database_url: Option<String>) -> Self {
        let dir = std::env::temp_dir().join(format!("{prefix}{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a folder for the block");
        std::os::unix::fs::symlink(root().join("config"), dir.join("config"))
            .expect("config/ beside the block's commands");
        Place {
            dir,
            prefix: prefix.to_owned(),
            database_url,
            secured: None,
            addrs: Mutex::new(BTreeMap::new()),
        }
    }

    /// A name of the pages in this place: `notifications.dlq` is `<prefix>notifications.dlq`.
    fn name(&self, word: &str) -> Option<String> {
        BASES.iter().find_map(|base| {
            let rest = word.strip_prefix(base)?;
            (rest.is_empty() || rest.starts_with('.') || rest.starts_with('-'))
                .then(|| format!("{}{word}", self.prefix))
        })
    }

    /// A word of a shown command with its names and placeholders given this place's values.
    fn word(&self, word: &str) -> String {
        if let Some((flag, value)) = word.split_once('=').filter(|(f, _)| f.starts_with("--")) {
            return format!("{flag}={}", self.word(value));
        }
        if let Some(name) = self.name(word) {
            return name;
        }
        if let Some(v) = placeholder_value(self, word) {
            return v;
        }
        assert!(
            !doc_commands::placeholder(word),
            "no test value for the placeholder {word:?}: add one to placeholder_value"
        );
        word.to_owned()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The test values of the pages' placeholders: one small table.
fn placeholder_value(place: &Place, word: &str) -> Option<String> {
    Some(match word {
        // A subscriber of the world's subscriptions (the one that answers 400: its dead letters).
        "NAME" => "ops-desk".to_owned(),
        "BROKERS" => common::kafka().bootstrap.clone(),
        // The secured examples (docs/security.md): the secured broker's SCRAM and OAUTHBEARER
        // listeners, the config file the command names (written from the page's block,
        // [`write_secured_config`]), the broker's CA, and the test's token endpoint.
        "kafka-1:9094" => place.secured.as_ref()?.bootstrap.clone(),
        "kafka-1:9095" => place.secured.as_ref()?.oauth_bootstrap.clone(),
        "/etc/price-alerts/kafka.toml" => {
            place.secured.as_ref()?;
            place.dir.join("kafka.toml").display().to_string()
        }
        "/etc/price-alerts/ca.pem" => {
            let ca = place.secured.as_ref()?.state.join("tls/ca.pem");
            ca.display().to_string()
        }
        "https://idp.example.com/oauth2/token" => place.secured.as_ref()?.token_url.clone(),
        "$(scripts/postgres.sh url)" => place.database_url.clone()?,
        w if w.starts_with("127.0.0.1:") && w[10..].parse::<u16>().is_ok() => place
            .addrs
            .lock()
            .expect("addresses")
            .entry(w.to_owned())
            .or_insert_with(common::free_addr)
            .clone(),
        _ => return None,
    })
}

/// The program and arguments a shown command runs in `place`.
fn command_of(place: &Place, shown: &Shown) -> Command {
    let mut args: Vec<String> = shown.args.iter().map(|a| place.word(a)).collect();
    let program = if shown.binary.starts_with("scripts/") {
        root().join(&shown.binary)
    } else {
        args = with_defaults_in_place(place, &shown.binary, args);
        doc_commands::bin_dir().join(&shown.binary)
    };
    let mut cmd = Command::new(program);
    cmd.args(&args)
        .current_dir(&place.dir)
        .env_remove("RUST_LOG");
    if let Some(url) = &place.database_url {
        // As `export DATABASE_URL=$(scripts/postgres.sh url)` on the sink's page.
        cmd.env("DATABASE_URL", url);
    }
    for (name, value) in &shown.env {
        cmd.env(name, place.word(value));
    }
    cmd
}

/// `args` with every argument the command leaves at a default that is a name of the pages given
/// as that name in `place` (the subcommand's after the others, the top level's first).
fn with_defaults_in_place(place: &Place, binary: &str, args: Vec<String>) -> Vec<String> {
    let mut parser = doc_commands::processor_parser(binary).expect("a binary of src/bin");
    parser.build();
    let given = |long: &str| {
        args.iter()
            .any(|a| a == &format!("--{long}") || a.starts_with(&format!("--{long}=")))
    };
    let defaults = |cmd: &clap::Command| -> Vec<String> {
        cmd.get_arguments()
            .filter_map(|a| {
                let long = a.get_long()?;
                let default = a.get_default_values().first()?.to_str()?;
                let name = place.name(default)?;
                (!given(long)).then(|| format!("--{long}={name}"))
            })
            .collect()
    };
    let sub = args.iter().find_map(|a| parser.find_subcommand(a).cloned());
    let mut out = defaults(&parser);
    out.extend(args.iter().cloned());
    if let Some(sub) = sub {
        out.extend(defaults(&sub));
    }
    out
}

/// A started command, its output copied to the test's stderr (tagged with its page line) and kept.
struct Running {
    child: Child,
    what: String,
    output: Arc<Mutex<String>>,
    /// Set once a line holding the readiness needle was printed.
    ready_line: Arc<AtomicBool>,
}

impl Running {
    fn start(mut cmd: Command, what: String, needle: Option<&str>) -> Self {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
        let output = Arc::new(Mutex::new(String::new()));
        let ready_line = Arc::new(AtomicBool::new(false));
        let out: Vec<Box<dyn std::io::Read + Send>> = vec![
            Box::new(child.stdout.take().expect("stdout piped")),
            Box::new(child.stderr.take().expect("stderr piped")),
        ];
        for stream in out {
            let (output, ready_line) = (output.clone(), ready_line.clone());
            let needle = needle.map(str::to_owned);
            let tag = what.split(": ").next().unwrap_or("").to_owned();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    if needle.as_deref().is_some_and(|n| line.contains(n)) {
                        ready_line.store(true, Ordering::Relaxed);
                    }
                    eprintln!("[{tag}] {line}");
                    let mut o = output.lock().expect("output");
                    o.push_str(&line);
                    o.push('\n');
                }
            });
        }
        Running {
            child,
            what,
            output,
            ready_line,
        }
    }

    /// Its exit status once it exited within `bound`; killed and failed after that.
    fn wait(&mut self, bound: Duration) -> ExitStatus {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("{}: still running after {bound:?}", self.what);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until `ready` holds, at most `bound`; fails if the process exits first.
    fn wait_ready(&mut self, mut ready: impl FnMut(&Running) -> bool) {
        let deadline = Instant::now() + READY_BOUND;
        while !ready(self) {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!(
                    "{}: exited ({status}) before it was ready; its output:\n{}",
                    self.what,
                    self.output.lock().expect("output")
                );
            }
            assert!(
                Instant::now() < deadline,
                "{}: not ready within {READY_BOUND:?}",
                self.what
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, then its exit code must be 0.
    fn stop(mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let status = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status()
                .expect("kill");
            assert!(status.success(), "{}: kill -TERM failed", self.what);
        }
        let status = self.wait(STOP_BOUND);
        self.assert_success(status, "after SIGTERM");
    }

    fn assert_success(&self, status: ExitStatus, when: &str) {
        assert!(
            status.success(),
            "{}: exited with {status} {when}; its output:\n{}",
            self.what,
            self.output.lock().expect("output")
        );
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A failing test leaves nothing running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a shown command keeps running until stopped, and what says it is ready.
fn daemon(shown: &Shown) -> Option<&'static str> {
    let (_, needle) = DAEMONS.iter().find(|(b, _)| *b == shown.binary)?;
    (!shown.args.iter().any(|a| a.starts_with("--exit-when-idle"))).then_some(*needle)
}

/// The listen address a command shows (`--metrics-addr ADDR`), in `place`.
fn metrics_addr(place: &Place, shown: &Shown) -> Option<String> {
    let at = shown.args.iter().position(|a| a == "--metrics-addr")?;
    Some(place.word(shown.args.get(at + 1)?))
}

/// Runs one block's commands in order in `place`; fails on the first that does not exit 0.
/// Returns what each printed, as (the command, its output).
fn run_block(place: &Place, block: &[&Shown]) -> Vec<(String, Arc<Mutex<String>>)> {
    let mut background: Vec<Running> = Vec::new();
    let mut outputs = Vec::new();
    for shown in block {
        let what = shown.to_string();
        eprintln!("doc_runs: {what}");
        let started = Instant::now();
        let needle = daemon(shown);
        let mut running = Running::start(command_of(place, shown), what.clone(), needle);
        outputs.push((what.clone(), running.output.clone()));
        if needle.is_some() {
            match metrics_addr(place, shown) {
                Some(addr) => running.wait_ready(|_| common::http_get(&addr, "/readyz").0 == 200),
                None => running.wait_ready(|r| r.ready_line.load(Ordering::Relaxed)),
            }
            if shown.background {
                background.push(running);
            } else {
                running.stop();
            }
        } else if shown.background {
            background.push(running);
        } else {
            let status = running.wait(RUN_BOUND);
            running.assert_success(status, "");
        }
        eprintln!("doc_runs: {what}: ok in {:.1?}", started.elapsed());
    }
    for running in background {
        running.stop();
    }
    outputs
}

/// The blocks of the shown commands the tests here run on the suite's broker, in page order.
fn blocks_here() -> Vec<Vec<Shown>> {
    blocks_run_by(Runner::Here)
}

/// The blocks of the shown commands `who` runs, in page order.
fn blocks_run_by(who: Runner) -> Vec<Vec<Shown>> {
    let runners = runner_commands();
    let mut blocks: Vec<Vec<Shown>> = Vec::new();
    for s in all_shown() {
        if runner(&s, &runners) != who {
            continue;
        }
        match blocks.last_mut() {
            Some(b) if b[0].page == s.page && b[0].block == s.block => b.push(s),
            _ => blocks.push(vec![s]),
        }
    }
    blocks
}

/// Whether a block makes its own data: it starts the pipeline or generates ticks.
fn makes_its_own_data(block: &[Shown]) -> bool {
    block
        .iter()
        .any(|s| s.binary == "alert-pipeline" || s.binary == "tick-gen")
}

/// A running system for the blocks that inspect one: see the module's doc.
struct World {
    place: Place,
    _db: common::postgres::TestDb,
    subscribers: Option<Running>,
}

impl World {
    fn build(prefix: &str) -> Self {
        let db = common::postgres::TestDb::create("doc_runs");
        let place = Place::new("world", prefix, Some(db.url.clone()));
        let bin = |name: &str, args: &[&str]| {
            let mut c = Command::new(doc_commands::bin_dir().join(name));
            c.args(args)
                .current_dir(&place.dir)
                .env_remove("RUST_LOG")
                .env("DATABASE_URL", &db.url);
            c
        };
        let run = |name: &str, args: &[&str]| {
            let what = format!("world: {name} {}", args.join(" "));
            let mut r = Running::start(bin(name, args), what, None);
            let status = r.wait(RUN_BOUND);
            r.assert_success(status, "");
        };
        let (input, output, app) = (
            format!("{prefix}market-updates"),
            format!("{prefix}notifications"),
            format!("{prefix}price-alerts"),
        );
        let mut subscribers = Running::start(
            bin(
                "test-subscriber",
                &[
                    "--subscriber",
                    "steady=accept",
                    "--subscriber",
                    "ops-desk=status:400",
                    "--subscriber",
                    "gone=status:410",
                    "--subscriptions-out",
                    "subscriptions.toml",
                ],
            ),
            "world: test-subscriber".into(),
            Some("test-subscriber listening"),
        );
        subscribers.wait_ready(|r| {
            r.ready_line.load(Ordering::Relaxed)
                && std::fs::metadata(place.dir.join("subscriptions.toml"))
                    .is_ok_and(|m| m.len() > 0)
        });
        run(
            "tick-gen",
            &[
                "--topic",
                &input,
                "--partitions",
                "3",
                "--symbols",
                "10",
                "--ticks",
                "1500",
                "--rules-out",
                "rules.toml",
            ],
        );
        // Two ticks that do not decode: dead letters of class permanent.* for the DLQ pages.
        common::produce_with_headers(&input, "BBCA", b"not json", &[]);
        common::produce_with_headers(&input, "TLKM", b"", &[]);
        let app_args = ["--app-id", &app];
        run(
            "alert-pipeline",
            &[
                &app_args[..],
                &[
                    "--rules",
                    "rules.toml",
                    "--input",
                    &input,
                    "--output",
                    &output,
                    "--exit-when-idle",
                    "3s",
                ],
            ]
            .concat(),
        );
        run(
            "alert-sink",
            &[
                &app_args[..],
                &["--topic", &output, "--exit-when-idle", "3s"],
            ]
            .concat(),
        );
        run(
            "alert-deliver",
            &[
                &app_args[..],
                &[
                    "--topic",
                    &output,
                    "--subscriptions",
                    "subscriptions.toml",
                    "--exit-when-idle",
                    "3s",
                ],
            ]
            .concat(),
        );
        World {
            place,
            _db: db,
            subscribers: Some(subscribers),
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(s) = self.subscribers.take() {
            if !std::thread::panicking() {
                s.stop();
            }
        }
    }
}

#[test]
#[ignore = "needs a Kafka broker: run scripts/test.sh"]
fn the_blocks_that_make_their_own_data_run() {
    let started = Instant::now();
    let prefix = common::prefix("docown");
    let _topics = common::drop_topics(&prefix);
    let blocks: Vec<Vec<Shown>> = blocks_here()
        .into_iter()
        .filter(|b| makes_its_own_data(b))
        .collect();
    assert!(!blocks.is_empty(), "found the blocks");
    for block in &blocks {
        let place = Place::new(
            &format!("b{}", block[0].line),
            &format!("{prefix}b{}-", block[0].line),
            None,
        );
        run_block(&place, &block.iter().collect::<Vec<_>>());
    }
    eprintln!(
        "doc_runs: {} blocks in {:.1?}",
        blocks.len(),
        started.elapsed()
    );
}

#[test]
#[ignore = "needs a Kafka broker and PostgreSQL: run scripts/test.sh"]
fn the_blocks_on_a_running_system_run() {
    let started = Instant::now();
    let prefix = common::prefix("docworld");
    let _topics = common::drop_topics(&prefix);
    let blocks: Vec<Vec<Shown>> = blocks_here()
        .into_iter()
        .filter(|b| !makes_its_own_data(b))
        .collect();
    assert!(!blocks.is_empty(), "found the blocks");
    let world = World::build(&prefix);
    eprintln!("doc_runs: the world built in {:.1?}", started.elapsed());
    for block in &blocks {
        run_block(&world.place, &block.iter().collect::<Vec<_>>());
    }
    drop(world);
    eprintln!(
        "doc_runs: {} blocks in {:.1?}",
        blocks.len(),
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// The secured examples

/// The secured broker of scripts/test.sh (`scripts/kafka.sh up --secure`), as the secured
/// examples' placeholders need it.
struct SecuredBroker {
    /// The SCRAM listener (`KAFKA_SECURE_BOOTSTRAP`).
    bootstrap: String,
    /// The OAUTHBEARER listener (`KAFKA_SECURE_OAUTH_BOOTSTRAP`).
    oauth_bootstrap: String,
    /// The broker's state folder (`KAFKA_SECURE_DIR`): its CA, its users' passwords and OIDC
    /// client secrets.
    state: PathBuf,
    /// The test's token endpoint, signing with the broker's trusted key.
    token_url: String,
}

impl SecuredBroker {
    /// The secret the page elides (`"…"`) as the value of `property`, for the principal the file
    /// names: the SCRAM password of its `sasl.username`, or the OIDC client secret of its
    /// `sasl.oauthbearer.client.id`, as `up --secure` wrote them.
    fn secret(&self, property: &str, file: &BTreeMap<String, String>) -> String {
        let (name_property, suffix) = match property {
            "sasl.password" => ("sasl.username", "password"),
            "sasl.oauthbearer.client.secret" => ("sasl.oauthbearer.client.id", "oidc-secret"),
            _ => panic!("the page elides {property}: say here which secret stands for it"),
        };
        let name = file
            .get(name_property)
            .unwrap_or_else(|| panic!("{property} elided, but no {name_property} in the file"));
        let path = self
            .state
            .join("credentials")
            .join(format!("{name}.{suffix}"));
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("the broker's {suffix} of {name}: {e}"))
            .trim()
            .to_owned()
    }
}

/// Writes the config file a secured example names (`--config FILE`): the page's code block just
/// before the command's (a `[librdkafka]` table), each value given this place's
/// ([`placeholder_value`]: the CA, the token endpoint) and each elided secret (`"…"`) the
/// broker's ([`SecuredBroker::secret`]). Created owner-only (mode 600), as the page says and the
/// binaries require of a file that holds a secret; never printed.
fn write_secured_config(place: &Place, shown: &Shown) {
    use std::os::unix::fs::OpenOptionsExt as _;
    let broker = place.secured.as_ref().expect("a secured place");
    let at = shown.args.iter().position(|a| a == "--config");
    let Some(path) = at.and_then(|i| shown.args.get(i + 1)) else {
        return;
    };
    let text = std::fs::read_to_string(root().join(&shown.page)).expect("the page");
    let blocks = doc_commands::code_blocks(&text);
    let own = blocks
        .iter()
        .position(|(start, _)| *start == shown.block)
        .expect("the command's block");
    let lines: Vec<&str> = match own.checked_sub(1).map(|i| &blocks[i].1) {
        Some(lines) if lines.first().is_some_and(|(_, l)| l == "[librdkafka]") => {
            lines.iter().map(|(_, l)| l.as_str()).collect()
        }
        _ => panic!("{shown}: no [librdkafka] block just before it, for {path}"),
    };
    // `"property" = "value"` lines, as (property, value); the others (the table, comments) kept.
    let pair = |line: &str| -> Option<(String, String)> {
        let (k, v) = line.split_once(" = ")?;
        let unquote = |x: &str| Some(x.trim().strip_prefix('"')?.strip_suffix('"')?.to_owned());
        Some((unquote(k)?, unquote(v)?))
    };
    let file: BTreeMap<String, String> = lines.iter().filter_map(|l| pair(l)).collect();
    let mut written = String::new();
    for line in &lines {
        match pair(line) {
            Some((property, value)) => {
                let value = match value.as_str() {
                    "…" | "..." => broker.secret(&property, &file),
                    v => placeholder_value(place, v).unwrap_or_else(|| v.to_owned()),
                };
                assert!(
                    !value.contains(['"', '\\']),
                    "{property}: a value that needs escaping in TOML"
                );
                written.push_str(&format!("\"{property}\" = \"{value}\"\n"));
            }
            None => {
                written.push_str(line);
                written.push('\n');
            }
        }
    }
    let path = PathBuf::from(place.word(path));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    std::io::Write::write_all(&mut f, written.as_bytes()).expect("writing the config file");
}

/// The secured examples of docs/security.md, each block as the others here: the page's config
/// file written ([`write_secured_config`]), the command run with the secured broker's
/// listener for `kafka-1:PORT` and the repository's `config/rules.toml` as its `rules.toml`,
/// waited for until ready, SIGTERM, exit 0. The principal (User:pipeline, the SCRAM user and the
/// OIDC client id alike) has exactly the ACLs `scripts/acls.sh` grants its role on the names the
/// command runs with, on topics the super-user created (the page's "No Create"); nothing it
/// printed holds a password or secret of the broker.
#[test]
#[ignore = "needs the secured broker: run scripts/test.sh"]
fn the_secured_examples_run() {
    let started = Instant::now();
    let oidc = common::oidc::oidc("docsecure");
    let endpoint = oidc.endpoint(Duration::from_secs(300));
    let prefix = common::prefix("docsecure");
    let admin = oidc.scram.kafka("admin");
    let _topics = DropTopics::with_prefix(&admin, &prefix);
    let blocks = blocks_run_by(Runner::Secured);
    assert!(!blocks.is_empty(), "found the secured examples");
    // The names every block runs with: the pipeline's defaults in this test's prefix.
    let (app, input, output) = (
        format!("{prefix}price-alerts"),
        format!("{prefix}market-updates"),
        format!("{prefix}notifications"),
    );
    futures::executor::block_on(topics::ensure(
        &admin,
        &Topics::with(input.clone(), output.clone(), &app),
        Some(2),
    ))
    .expect("the super-user creates the topics");
    oidc.scram.acls_all(&[vec![
        "apply", "pipeline", "--app-id", &app, "--input", &input, "--output", &output,
    ]]);
    eprintln!("doc_runs: topics and ACLs in {:.1?}", started.elapsed());
    for block in &blocks {
        let mut place = Place::new(&format!("b{}", block[0].line), &prefix, None);
        place.secured = Some(SecuredBroker {
            bootstrap: oidc.scram.bootstrap.clone(),
            oauth_bootstrap: oidc.oauth.bootstrap.clone(),
            state: oidc.scram.dir.clone(),
            token_url: endpoint.token_url(),
        });
        std::fs::copy(
            root().join("config/rules.toml"),
            place.dir.join("rules.toml"),
        )
        .expect("the rules beside the command");
        for shown in block {
            write_secured_config(&place, shown);
        }
        for (what, output) in run_block(&place, &block.iter().collect::<Vec<_>>()) {
            oidc.assert_no_secret(&what, &output.lock().expect("output"), &[]);
        }
    }
    // The OAUTHBEARER example logged in with a token of the test's endpoint, not by chance.
    let oauth = blocks
        .iter()
        .flatten()
        .any(|s| s.args.iter().any(|a| a == "kafka-1:9095"));
    let counts = endpoint.counts();
    assert!(
        !oauth || counts.issued.get("pipeline").copied().unwrap_or(0) >= 1,
        "the OAUTHBEARER example got its token from the endpoint: {counts:?}"
    );
    eprintln!(
        "doc_runs: {} secured blocks in {:.1?}",
        blocks.len(),
        started.elapsed()
    );
}
