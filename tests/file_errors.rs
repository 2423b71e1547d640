//! Every binary's file errors, as a new user meets them: a missing rules, subscriptions, config,
//! certificate or output file stops the binary at start with one line that names the path once
//! and the operating system's cause once (it used to say the cause twice: "No such file or
//! directory (os error 2): No such file or directory (os error 2)").
//!
//! No broker and no database: every file here is read before anything is connected to, and the
//! bootstrap address is a closed port, so a binary that got as far as the broker would fail with
//! another message.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// What the operating system says of a missing file.
const ENOENT: &str = "No such file or directory (os error 2)";

/// A path under a directory that does not exist, unique to this test process.
fn missing(name: &str) -> String {
    format!("/nonexistent-{}/{name}", std::process::id())
}

/// A file that exists (its content is never parsed by the cases that use it).
fn existing() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml").to_owned()
}

/// A valid rules file of this test process, written once: tests run side by side, and one that
/// wrote it again (truncate, then write) while another's binary read it gave that binary an empty
/// file ("missing field `symbols`", seen in a fresh-clone suite run).
fn rules() -> PathBuf {
    static RULES: OnceLock<PathBuf> = OnceLock::new();
    RULES
        .get_or_init(|| {
            let path =
                std::env::temp_dir().join(format!("file-errors-rules-{}.toml", std::process::id()));
            std::fs::write(&path, "[symbols]\nBBCA = [\"10000\"]\n").expect("writing the rules");
            path
        })
        .clone()
}

fn bin(name: &str) -> PathBuf {
    let path = match name {
        "alert-pipeline" => env!("CARGO_BIN_EXE_alert-pipeline"),
        "alert-sink" => env!("CARGO_BIN_EXE_alert-sink"),
        "alert-deliver" => env!("CARGO_BIN_EXE_alert-deliver"),
        "alert-verify" => env!("CARGO_BIN_EXE_alert-verify"),
        "tick-gen" => env!("CARGO_BIN_EXE_tick-gen"),
        "dlq-replay" => env!("CARGO_BIN_EXE_dlq-replay"),
        "txn-demo" => env!("CARGO_BIN_EXE_txn-demo"),
        other => panic!("no binary {other}"),
    };
    Path::new(path).to_owned()
}

/// Runs `binary` with `args` (and a broker nobody answers at) and asserts that it fails with one
/// error line naming `path` exactly once and the cause exactly once.
fn assert_names_once(binary: &str, args: &[&str], path: &str) {
    let line = error_line(binary, args);
    let case = format!("{binary} {}", args.join(" "));
    assert_eq!(
        line.matches(path).count(),
        1,
        "{case}: the path once\n{line}"
    );
    assert_eq!(
        line.matches(ENOENT).count(),
        1,
        "{case}: the cause once\n{line}"
    );
}

/// Runs `binary` with `args` (and a broker nobody answers at), asserts that it fails with one
/// error line, and returns that line.
fn error_line(binary: &str, args: &[&str]) -> String {
    // The broker flags go after a leading subcommand (dlq-replay's inspect takes them) and
    // before a trailing one (alert-sink's migrate does not).
    let (sub, rest) = match args.split_first() {
        Some((&"inspect", rest)) => (&args[..1], rest),
        _ => (&args[..0], args),
    };
    let out = Command::new(bin(binary))
        .args(sub)
        .args(["--bootstrap", "127.0.0.1:1", "--connect-timeout", "1s"])
        .args(rest)
        .env_remove("KAFKA_BOOTSTRAP")
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running the binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let case = format!("{binary} {}", args.join(" "));
    assert!(
        !out.status.success(),
        "{case}: exited 0 with a missing file\n{stderr}"
    );
    let prefix = format!("{binary}: ");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with(&prefix)).collect();
    assert_eq!(lines.len(), 1, "{case}: one error line\n{stderr}");
    lines[0].to_owned()
}

#[test]
fn rules_files() {
    let path = missing("rules.toml");
    assert_names_once("alert-pipeline", &["--rules", &path], &path);
    assert_names_once("alert-verify", &["--rules", &path], &path);
}

#[test]
fn the_subscriptions_file() {
    let path = missing("subscriptions.toml");
    assert_names_once("alert-deliver", &["--subscriptions", &path], &path);
}

#[test]
fn config_files_of_every_binary() {
    let path = missing("kafka.toml");
    let rules = rules();
    let rules = rules.to_str().expect("a UTF-8 temp dir");
    let url = "postgres://u:pw@127.0.0.1:1/d";
    let cases: [(&str, Vec<&str>); 7] = [
        ("alert-pipeline", vec!["--rules", rules]),
        ("alert-sink", vec!["--database-url", url]),
        ("alert-deliver", vec!["--subscriptions", rules]),
        ("alert-verify", vec!["--rules", rules]),
        ("tick-gen", vec!["--ticks", "1"]),
        ("dlq-replay", vec!["inspect"]),
        ("txn-demo", vec![]),
    ];
    for (binary, mut args) in cases {
        args.extend(["--config", &path]);
        assert_names_once(binary, &args, &path);
    }
}

#[test]
fn database_certificate_files() {
    let url = "postgres://u:pw@127.0.0.1:1/d";
    let cert = existing();
    let absent = missing("client.pem");
    assert_names_once(
        "alert-sink",
        &["--database-url", url, "--db-ssl-root-cert", &absent],
        &absent,
    );
    assert_names_once(
        "alert-sink",
        &[
            "--database-url",
            url,
            "--db-ssl-cert",
            &absent,
            "--db-ssl-key",
            &cert,
        ],
        &absent,
    );
    assert_names_once(
        "alert-sink",
        &[
            "--database-url",
            url,
            "--db-ssl-cert",
            &cert,
            "--db-ssl-key",
            &absent,
        ],
        &absent,
    );
    let in_url = format!("{url}?sslmode=verify-full&sslrootcert={absent}");
    assert_names_once(
        "alert-sink",
        &["--database-url", &in_url, "migrate"],
        &absent,
    );
    let rules = rules();
    assert_names_once(
        "alert-verify",
        &[
            "--rules",
            rules.to_str().expect("a UTF-8 temp dir"),
            "--table",
            "--database-url",
            url,
            "--db-ssl-root-cert",
            &absent,
        ],
        &absent,
    );
}

#[test]
fn kafka_certificate_files() {
    let rules = rules();
    let rules = rules.to_str().expect("a UTF-8 temp dir");
    let absent = missing("broker.pem");
    for property in ["ssl.ca.location", "ssl.certificate.location"] {
        let set = format!("{property}={absent}");
        let args = ["--rules", rules, "-X", "security.protocol=ssl", "-X", &set];
        assert_names_once("alert-pipeline", &args, &absent);
    }
    // librdkafka counts the key's location sensitive, and the project prints no such value: the
    // property and the cause, not the path.
    let set = format!("ssl.key.location={absent}");
    let line = error_line(
        "alert-pipeline",
        &["--rules", rules, "-X", "security.protocol=ssl", "-X", &set],
    );
    assert!(!line.contains(&absent), "{line}");
    assert_eq!(line.matches("ssl.key.location").count(), 1, "{line}");
    assert_eq!(line.matches(ENOENT).count(), 1, "{line}");
}

#[test]
fn the_rules_output_of_tick_gen() {
    let path = missing("rules-out.toml");
    assert_names_once("tick-gen", &["--rules-only", "--rules-out", &path], &path);
}
