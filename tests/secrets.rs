//! No binary prints the value of a sensitive librdkafka property, however it was given and
//! whatever refuses it: on the command line (`-X`, refused for secret material), in a `--config`
//! file, or as a value librdkafka itself refuses. No broker is needed: every run ends at the
//! configuration check or at the start-up check of a bootstrap address that refuses connections.
//!
//! Failed before its fix: `sasl.oauthbearer.client.secret` in a config file (rust-rdkafka's
//! configuration error repeats the value), and `-X sasl.oauthbearer.assertion.private.key.
//! passphrase=…` (accepted on the command line, then echoed the same way).

mod common;

use price_alerts::kafka::secrets::{is_secret, SENSITIVE};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The binaries that take Kafka client properties, each with the arguments it needs to get as
/// far as connecting.
fn binaries(dir: &Path) -> Vec<(&'static str, Vec<String>)> {
    let rules = dir.join("rules.toml");
    std::fs::write(&rules, "[symbols]\nAAA = [\"100\"]\n").unwrap();
    let subs = dir.join("subscriptions.toml");
    std::fs::write(
        &subs,
        "[subscribers.a]\nurl = \"http://127.0.0.1:1/\"\nsymbols = [\"*\"]\n",
    )
    .unwrap();
    let path = |p: &PathBuf| p.to_str().unwrap().to_owned();
    vec![
        (
            env!("CARGO_BIN_EXE_alert-pipeline"),
            vec!["--rules".into(), path(&rules)],
        ),
        (
            env!("CARGO_BIN_EXE_alert-sink"),
            vec![
                "--database-url".into(),
                "postgres://sink@127.0.0.1:1/alerts".into(),
            ],
        ),
        (
            env!("CARGO_BIN_EXE_alert-deliver"),
            vec!["--subscriptions".into(), path(&subs)],
        ),
        (env!("CARGO_BIN_EXE_dlq-replay"), vec![]),
        (
            env!("CARGO_BIN_EXE_tick-gen"),
            vec!["--rules-out".into(), "/dev/null".into()],
        ),
        (env!("CARGO_BIN_EXE_txn-demo"), vec![]),
        (
            env!("CARGO_BIN_EXE_alert-verify"),
            vec!["--rules".into(), path(&rules)],
        ),
    ]
}

/// Runs `binary` against a bootstrap that refuses connections; returns its exit code and all it
/// printed (stdout and stderr).
fn run(binary: &str, args: &[String]) -> (Option<i32>, String) {
    let out = Command::new(binary)
        .args(args)
        .args(["--bootstrap", "127.0.0.1:1", "--connect-timeout", "1s"])
        .env("RUST_LOG", "debug")
        .env_remove("KAFKA_SASL_PASSWORD")
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs");
    let mut all = String::from_utf8_lossy(&out.stdout).into_owned();
    all.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code(), all)
}

/// A config file (mode 600) with `lines` in its `[librdkafka]` table.
fn config_file(dir: &Path, name: &str, lines: &[(&str, &str)]) -> String {
    let path = dir.join(format!("{name}.toml"));
    let mut text = String::from("[librdkafka]\n");
    for (k, v) in lines {
        text.push_str(&format!("{k:?} = {v:?}\n"));
    }
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn no_binary_prints_a_sensitive_value_however_it_is_given_or_refused() {
    let dir = std::env::temp_dir().join(common::prefix("secrets"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut runs = 0;
    for (i, key) in SENSITIVE.iter().enumerate() {
        // A value no message has any other reason to contain.
        let value = format!("hunter{i}-sensitive-value");
        let cli = vec!["-X".to_owned(), format!("{key}={value}")];
        let file = config_file(&dir, &format!("plain{i}"), &[(key, &value)]);
        // Refused by librdkafka: a login it cannot do in this build (OIDC needs libcurl), and
        // PEM that is not PEM, so the refusal quotes the configuration it refuses.
        let invalid = config_file(
            &dir,
            &format!("invalid{i}"),
            &[
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "OAUTHBEARER"),
                ("sasl.oauthbearer.method", "oidc"),
                ("ssl.certificate.pem", "not a certificate"),
                (key, &value),
            ],
        );
        let ways: [(&str, Vec<String>); 3] = [
            ("-X", cli),
            ("config file", vec!["--config".into(), file]),
            ("invalid", vec!["--config".into(), invalid]),
        ];
        // Each binary parses its client properties through the same code, so each (property,
        // way) runs one binary, in turn: every binary gets every way, and the run stays short.
        let all_binaries = binaries(&dir);
        for (w, (way, extra)) in ways.iter().enumerate() {
            let (binary, args) = &all_binaries[(i * ways.len() + w) % all_binaries.len()];
            let name = binary.rsplit('/').next().unwrap_or(binary);
            let all: Vec<String> = args.iter().chain(extra).cloned().collect();
            let (code, out) = run(binary, &all);
            runs += 1;
            assert!(
                !out.contains(&value),
                "{name}, {key} given by {way}: the value was printed:\n{out}"
            );
            assert_ne!(
                code,
                Some(0),
                "{name}, {key} by {way}: must fail here:\n{out}"
            );
            if *way == "-X" && is_secret(key) {
                assert!(
                    out.contains(&format!("-X {key} is refused")),
                    "{name}: {key} on the command line is refused, by name:\n{out}"
                );
            }
        }
    }
    println!("{runs} runs, no value printed");
}
