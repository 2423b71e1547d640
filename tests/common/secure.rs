//! Helpers of the secure tests (tests/security.rs): the secured broker of scripts/test.sh
//! (`scripts/kafka.sh up --secure`), its users' configurations and passwords, `scripts/acls.sh`,
//! and one deployment on fresh names.

use price_alerts::kafka::feed::{produce_ticks, Landed};
use price_alerts::kafka::offsets::committed_offsets;
use price_alerts::kafka::secrets::read_config_file;
use price_alerts::kafka::topics::{self, DropTopics, Topics};
use price_alerts::kafka::KafkaConfig;
use price_alerts::oracle::{verify, VerifyReport};
use price_alerts::rules::Rules;
use price_alerts::tick::Tick;
use rust_decimal::Decimal;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a refused start may take: "within seconds".
pub const FAILS_WITHIN: Duration = Duration::from_secs(20);
/// `--connect-timeout` of every binary the secured tests start ([`Secure::command_with`]).
const CONNECT_TIMEOUT: &str = "60s";
pub const EXIT: Duration = Duration::from_secs(120);

/// The secured broker of scripts/test.sh.
pub struct Secure {
    pub bootstrap: String,
    pub dir: PathBuf,
}

pub fn secure() -> Secure {
    let (Ok(bootstrap), Ok(dir)) = (
        std::env::var("KAFKA_SECURE_BOOTSTRAP"),
        std::env::var("KAFKA_SECURE_DIR"),
    ) else {
        panic!(
            "KAFKA_SECURE_BOOTSTRAP and KAFKA_SECURE_DIR are not set: run scripts/test.sh, which starts the \
             secured broker (scripts/kafka.sh up --secure) and sets them (scripts/kafka.sh env --secure prints them)"
        );
    };
    Secure {
        bootstrap,
        dir: PathBuf::from(dir),
    }
}

impl Secure {
    /// The `[librdkafka]` file of a SCRAM user of the broker.
    pub fn config_file(&self, user: &str) -> PathBuf {
        self.dir.join("clients").join(format!("{user}.toml"))
    }

    /// A client configuration as `user` (admin is the super-user, for set-up and checks).
    pub fn kafka(&self, user: &str) -> KafkaConfig {
        let mut k = KafkaConfig::new(&self.bootstrap);
        for (key, value) in
            read_config_file(&self.config_file(user)).expect("the user's config file")
        {
            k.set(&key, &value).expect("a pass-through property");
        }
        k
    }

    /// Every password of the broker's users.
    pub fn passwords(&self) -> Vec<String> {
        let dir = self.dir.join("credentials");
        let passwords: Vec<String> = std::fs::read_dir(&dir)
            .expect("the credentials folder")
            .map(|e| {
                std::fs::read_to_string(e.expect("an entry").path())
                    .expect("a password")
                    .trim()
                    .to_owned()
            })
            .collect();
        assert!(
            passwords.len() >= 6 && passwords.iter().all(|p| p.len() >= 16),
            "the broker's users have passwords"
        );
        passwords
    }

    /// Fails if any password appears in `text` (what a binary printed).
    pub fn assert_no_password(&self, what: &str, text: &str) {
        for p in self.passwords() {
            assert!(
                !text.contains(&p),
                "a password appears in the output of {what}"
            );
        }
    }

    /// `scripts/acls.sh ARGS` against this broker.
    pub fn acls(&self, args: &[&str]) -> std::process::Child {
        Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/acls.sh"))
            .args(args)
            .env("KAFKA_SECURE_BOOTSTRAP", &self.bootstrap)
            .env("KAFKA_SECURE_DIR", &self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("running scripts/acls.sh")
    }

    /// Runs several `scripts/acls.sh` side by side and waits for all.
    pub fn acls_all(&self, calls: &[Vec<&str>]) {
        let children: Vec<_> = calls.iter().map(|c| (c.join(" "), self.acls(c))).collect();
        for (call, child) in children {
            let out = child.wait_with_output().expect("acls.sh");
            assert!(out.status.success(), "scripts/acls.sh {call} failed");
        }
    }

    /// A binary of this crate as `user`: the bootstrap, the user's config file, info logs.
    pub fn command(&self, binary: &str, user: &str) -> Command {
        self.command_with(binary, &self.config_file(user))
    }

    /// A binary of this crate with the `[librdkafka]` file `config`. Its start-up connect check
    /// waits up to [`CONNECT_TIMEOUT`] for an answer (the default 10 s was too short in a suite
    /// run with the load at 30 on two cores: "no broker at 127.0.0.1:29095 answered within
    /// 10s"); a refused login, TLS or token request still ends it at once.
    pub fn command_with(&self, binary: &str, config: &Path) -> Command {
        let mut c = Command::new(binary);
        c.args(["--bootstrap", &self.bootstrap, "--config"])
            .arg(config)
            .args(["--connect-timeout", CONNECT_TIMEOUT])
            .env("RUST_LOG", "warn,price_alerts=info")
            .env_remove("KAFKA_SASL_PASSWORD")
            .stdin(Stdio::null());
        c
    }
}

/// One deployment on fresh names: topics created by the super-user, rules written.
pub struct Deployment {
    pub app: String,
    pub input: String,
    pub output: String,
    pub rules: Rules,
    pub rules_path: PathBuf,
    /// The deployment's topics go when it does, deleted by the super-user who created them.
    _topics: DropTopics,
}

impl Deployment {
    pub fn new(s: &Secure, test: &str, partitions: i32) -> Self {
        let prefix = super::prefix(test);
        let rules =
            Rules::from_pairs((0..4).map(|i| (format!("SYM{i}"), vec![Decimal::from(100)])));
        let dir = std::env::temp_dir().join(format!("{prefix}rules"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let rules_path = dir.join("rules.toml");
        std::fs::write(&rules_path, rules.to_toml()).expect("writing rules");
        let d = Deployment {
            _topics: DropTopics::with_prefix(&s.kafka("admin"), &prefix),
            app: format!("{prefix}app"),
            input: format!("{prefix}market-updates"),
            output: format!("{prefix}notifications"),
            rules,
            rules_path,
        };
        futures::executor::block_on(topics::ensure(
            &s.kafka("admin"),
            &d.topics(),
            Some(partitions),
        ))
        .expect("creating topics");
        d
    }

    pub fn topics(&self) -> Topics {
        Topics::with(self.input.clone(), self.output.clone(), &self.app)
    }

    /// The names as both alert-pipeline and scripts/acls.sh take them.
    fn name_args(&self) -> [&str; 6] {
        [
            "--app-id",
            &self.app,
            "--input",
            &self.input,
            "--output",
            &self.output,
        ]
    }

    /// The pipeline's ACL arguments for scripts/acls.sh.
    pub fn pipeline_acls<'a>(&'a self, verb: &'a str, more: &[&'a str]) -> Vec<&'a str> {
        let mut a = vec![verb, "pipeline"];
        a.extend(self.name_args());
        a.extend_from_slice(more);
        a
    }

    /// `n` ticks per symbol, seqs from `from`, alternating 95/105 around the threshold 100, so
    /// nearly every tick is a crossing; loaded by the super-user.
    pub fn load(&self, s: &Secure, from: u64, n: u64) -> Vec<Landed> {
        let ticks: Vec<Tick> = (from..from + n)
            .flat_map(|seq| {
                (0..4).map(move |i| Tick {
                    symbol: format!("SYM{i}"),
                    price: Decimal::from(if seq % 2 == 0 { 95 } else { 105 }),
                    seq,
                    ts: None,
                })
            })
            .collect();
        produce_ticks(&s.kafka("admin"), &self.input, &ticks).expect("loading ticks")
    }

    /// The pipeline as User:pipeline.
    pub fn pipeline(&self, s: &Secure, more: &[&str]) -> Command {
        self.pipeline_with(s, &s.config_file("pipeline"), more)
    }

    /// The pipeline with the `[librdkafka]` file `config`.
    pub fn pipeline_with(&self, s: &Secure, config: &Path, more: &[&str]) -> Command {
        self.pipeline_timed(s, config, "30s", more)
    }

    /// The pipeline with the `[librdkafka]` file `config` and `--transaction-timeout
    /// txn_timeout` (the option takes one value: `more` cannot set it again).
    pub fn pipeline_timed(
        &self,
        s: &Secure,
        config: &Path,
        txn_timeout: &str,
        more: &[&str],
    ) -> Command {
        let mut c = s.command_with(env!("CARGO_BIN_EXE_alert-pipeline"), config);
        c.arg("--rules")
            .arg(&self.rules_path)
            .args(self.name_args())
            // A stable id, so the transactional id is `<app>-0`, as the ACL tests name it.
            .args(["--instance-id", "0"])
            .args(["--transaction-timeout", txn_timeout])
            .args(more);
        c
    }

    /// alert-deliver's ACL arguments for scripts/acls.sh.
    pub fn deliver_acls<'a>(&'a self, verb: &'a str, more: &[&'a str]) -> Vec<&'a str> {
        let mut a = vec![
            verb,
            "deliver",
            "--app-id",
            &self.app,
            "--output",
            &self.output,
        ];
        a.extend_from_slice(more);
        a
    }

    /// alert-deliver as User:deliver on the notifications, to the subscribers of `subscriptions`
    /// (a file of [`price_alerts::tools::subscriber::subscriptions_toml`]): buckets of 1 s and
    /// 2 s, instance id 0 (so the transactional id is `<app>-deliver-0`), a short connect
    /// timeout (the refusing subscriber fails at once either way) and a 10 s answer timeout: with
    /// 2 s, a fresh-clone suite run (load 30 on two cores) saw the accepting and the 410
    /// subscribers' local answers time out, and their deliveries go to the retry bucket too,
    /// which the end-to-end test rightly counts as extra hand-offs.
    pub fn deliver(&self, s: &Secure, subscriptions: &Path, more: &[&str]) -> Command {
        let mut c = s.command(env!("CARGO_BIN_EXE_alert-deliver"), "deliver");
        c.arg("--subscriptions")
            .arg(subscriptions)
            .args(["--topic", &self.output, "--app-id", &self.app])
            .args(["--instance-id", "0", "--buckets", "1s,2s"])
            .args([
                "--transaction-timeout",
                "30s",
                "--http-connect-timeout",
                "1s",
            ])
            .args(["--http-timeout", "10s", "--breaker-cooldown", "2s"])
            .args(more);
        c
    }

    /// Writes a subscriptions file for `subscribers` (name, url) in the deployment's temp dir.
    pub fn subscriptions(&self, subscribers: &[(&str, String)]) -> PathBuf {
        let names: Vec<String> = subscribers.iter().map(|(n, _)| (*n).to_owned()).collect();
        let toml = price_alerts::tools::subscriber::subscriptions_toml(&names, |n| {
            subscribers
                .iter()
                .find(|(name, _)| *name == n)
                .map(|(_, url)| url.clone())
                .unwrap_or_default()
        });
        let path = self.rules_path.with_file_name("subscriptions.toml");
        std::fs::write(&path, toml).expect("writing subscriptions");
        path
    }

    /// The group's committed offsets, read by the super-user (None where none).
    pub fn committed(&self, s: &Secure) -> Vec<Option<i64>> {
        committed_offsets(&s.kafka("admin"), &self.app, &self.input).expect("committed offsets")
    }

    pub fn verify(&self, s: &Secure) -> VerifyReport {
        verify(
            &s.kafka("admin"),
            &self.input,
            &self.output,
            &self.rules,
            price_alerts::tick::DEFAULT_MAX_TICK_BYTES,
            Default::default(),
        )
        .expect("the verifier runs")
    }
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `c` to its end, at most `timeout`; returns its output and how long it ran.
pub fn run(mut c: Command, timeout: Duration) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting a binary");
    // Read both pipes while waiting, so a chatty child never blocks on a full pipe.
    let (mut out, mut err) = (
        child.stdout.take().expect("stdout"),
        child.stderr.take().expect("stderr"),
    );
    let o = std::thread::spawn(move || std::io::read_to_string(&mut out).unwrap_or_default());
    let e = std::thread::spawn(move || std::io::read_to_string(&mut err).unwrap_or_default());
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            panic!("a binary did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let (stdout, stderr) = (o.join().unwrap_or_default(), e.join().unwrap_or_default());
    (
        Output {
            status,
            stdout: stdout.into_bytes(),
            stderr: stderr.into_bytes(),
        },
        took,
    )
}

/// A start of `binary` as `user` refused for lack of one right (ACL entry `skip` taken away): it
/// failed, within [`FAILS_WITHIN`], with a message naming the right (`right`: "lacks Write on
/// Topic …"), and printed no password. Returns the line that names it.
pub fn assert_refused_at_start(
    s: &Secure,
    (binary, user): (&str, &str),
    (skip, right): (&str, &str),
    out: &Output,
    took: Duration,
) -> String {
    let printed = text(out);
    s.assert_no_password(binary, &printed);
    assert!(
        !out.status.success(),
        "{binary}: without {skip} the start succeeded: {printed}"
    );
    assert!(
        printed.contains(&format!("not authorised: User:{user} {right}")),
        "{binary}: without {skip} the message names it ({right}): {printed}"
    );
    assert!(
        took < FAILS_WITHIN,
        "{binary}: without {skip} the start failed only after {took:?}"
    );
    printed
        .lines()
        .find(|l| l.contains("not authorised"))
        .unwrap_or_default()
        .to_owned()
}

/// The verifier found every expected notification exactly once and nothing else.
pub fn assert_exactly_once(report: &VerifyReport) {
    let counts = (
        report.missing.len(),
        report.duplicate.len(),
        report.unexpected.len(),
    );
    assert_eq!(
        counts,
        (0, 0, 0),
        "missing, duplicate, unexpected: {report}"
    );
}
