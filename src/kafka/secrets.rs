//! Where Kafka secrets may come from, and how they are kept out of sight.
//!
//! A password reaches the clients from one of two places: the `[librdkafka]` table of a
//! `--config` file that only its owner can read, or the `KAFKA_SASL_PASSWORD` environment
//! variable (what a Kubernetes secret or systemd credential usually becomes). Never from the
//! command line: every local user can read a process's arguments (`ps`, `/proc/*/cmdline`), so
//! `-X sasl.password=…` is refused with a message saying where to put it instead.
//!
//! Which properties are sensitive is librdkafka's own list ([`SENSITIVE`]). Anything that prints
//! a configuration ([`redacted`], the `Debug` of [`KafkaConfig`](super::config::KafkaConfig))
//! shows a sensitive property as `[redacted]`; error messages name it, never its value, and a
//! message made by librdkafka or rust-rdkafka that may quote one is scrubbed first ([`scrub`]).

use anyhow::{bail, Context as _};
use std::collections::BTreeMap;
use std::path::Path;

/// The environment variable a SASL password may come from.
pub const PASSWORD_ENV: &str = "KAFKA_SASL_PASSWORD";

/// Every property that librdkafka itself flags sensitive (`_RK_SENSITIVE` in its
/// `rdkafka_conf.c`, which its own configuration dumps redact): no value of one of these appears
/// in anything this project prints. A unit test keeps the list in step with the bundled
/// librdkafka, so a new sensitive property of a new release is not missed.
pub const SENSITIVE: &[&str] = &[
    "ssl.key.location",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl_key",
    "ssl.ca.pem",
    "ssl.keystore.password",
    "sasl.username",
    "sasl.password",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.assertion.private.key.file",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
];

/// Of [`SENSITIVE`], those that are no secret themselves, and may be given on the command line:
/// a user name, paths of files (whose contents are what is secret, and are protected by the
/// file's own mode), and a CA certificate (public by nature).
const NOT_SECRET: &[&str] = &[
    "sasl.username",
    "ssl.key.location",
    "ssl.ca.pem",
    "sasl.oauthbearer.assertion.private.key.file",
];

/// Whether the value of a librdkafka property must never be printed: librdkafka's sensitive
/// ones ([`SENSITIVE`]), and for safety anything named like a password or a secret.
pub fn is_sensitive(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    SENSITIVE.contains(&k.as_str()) || k.contains("password") || k.contains("secret")
}

/// Whether a librdkafka property holds secret material (passwords, passphrases, client secrets,
/// private keys): refused on the command line, and a config file that holds one must be readable
/// by its owner only.
pub fn is_secret(key: &str) -> bool {
    is_sensitive(key) && !NOT_SECRET.contains(&key.to_ascii_lowercase().as_str())
}

/// `properties` with every sensitive value replaced, for logs and `Debug`.
pub fn redacted(properties: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    properties
        .iter()
        .map(|(k, v)| {
            (
                k.as_str(),
                if is_sensitive(k) {
                    "[redacted]"
                } else {
                    v.as_str()
                },
            )
        })
        .collect()
}

/// `text` with every value of a sensitive property of `properties` replaced by `[redacted]`: for
/// messages made by others (librdkafka's, rust-rdkafka's) that may repeat a value, e.g. a
/// configuration error that quotes the property it refuses.
pub fn scrub(text: &str, properties: &BTreeMap<String, String>) -> String {
    let mut values: Vec<&str> = properties
        .iter()
        .filter(|(k, v)| is_sensitive(k) && !v.is_empty())
        .map(|(_, v)| v.as_str())
        .collect();
    // Longest first, so that a value containing another is replaced whole.
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    let mut out = text.to_owned();
    for v in values {
        out = out.replace(v, "[redacted]");
    }
    out
}

/// Refuses a secret given on the command line (`-X key=value`).
pub fn refuse_on_command_line(key: &str) -> anyhow::Result<()> {
    if is_secret(key) {
        bail!(
            "-X {key} is refused: a command line is readable by every local user (ps); put it in the \
             [librdkafka] table of a --config file readable only by its owner (chmod 600){}",
            if key == "sasl.password" { format!(", or in {PASSWORD_ENV}") } else { String::new() }
        );
    }
    Ok(())
}

/// The `[librdkafka]` table of a `--config` file, as strings. A file that holds a secret must be
/// readable by its owner only.
pub fn read_config_file(path: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    /// The file's only table.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct FileConfig {
        /// librdkafka properties for every client.
        #[serde(default)]
        librdkafka: BTreeMap<String, toml::Value>,
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    // toml's error quotes the offending line, which may hold a password: name the place only.
    let file: FileConfig = toml::from_str(&text).map_err(|e| {
        let at = e
            .span()
            .map(|s| format!(" at byte {}", s.start))
            .unwrap_or_default();
        anyhow::anyhow!(
            "config file {}: not a valid [librdkafka] table{at}: {}",
            path.display(),
            e.message()
        )
    })?;
    let properties: BTreeMap<String, String> = file
        .librdkafka
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                toml::Value::String(s) => s,
                other => other.to_string(),
            };
            (k, v)
        })
        .collect();
    if let Some(secret) = properties.keys().find(|k| is_secret(k)) {
        check_owner_only(path, "config file", secret)?;
    }
    Ok(properties)
}

/// Refuses `path`, a `kind` of file (named in the message) that holds `secret`, when anyone but
/// its owner may read or write it.
#[cfg(unix)]
pub fn check_owner_only(path: &Path, kind: &str, secret: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "{kind} {} holds {secret} but is readable by others (mode {:03o}): chmod 600 {}",
            path.display(),
            mode & 0o777,
            path.display()
        );
    }
    Ok(())
}

/// Refuses `path`, a `kind` of file that holds `secret`, when others may read it (Unix only).
#[cfg(not(unix))]
pub fn check_owner_only(_: &Path, _: &str, _: &str) -> anyhow::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::os::unix::fs::PermissionsExt as _;

    fn file(name: &str, text: &str, mode: u32) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("secrets-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kafka.toml");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn a_file_with_a_password_must_be_owner_only() {
        let text =
            "[librdkafka]\n\"sasl.username\" = \"u\"\n\"sasl.password\" = \"hunter2-secret\"\n";
        let err = read_config_file(&file("open", text, 0o644))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("holds sasl.password but is readable by others (mode 644): chmod 600"),
            "{err}"
        );
        assert!(!err.contains("hunter2"), "{err}");
        let props = read_config_file(&file("closed", text, 0o600)).unwrap();
        assert_eq!(
            props.get("sasl.password").map(String::as_str),
            Some("hunter2-secret")
        );
        // Without a secret the mode does not matter.
        read_config_file(&file("plain", "[librdkafka]\n\"linger.ms\" = 5\n", 0o644)).unwrap();
    }

    #[test]
    fn a_broken_file_is_refused_without_quoting_it() {
        let err = read_config_file(&file(
            "broken",
            "[librdkafka]\n\"sasl.password\" = hunter2-secret\n",
            0o600,
        ))
        .unwrap_err()
        .to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }

    /// `_RK_SENSITIVE` properties of the bundled librdkafka's `rdkafka_conf.c`: the rdkafka-sys
    /// of Cargo.lock, in cargo's registry (where the build unpacked it).
    fn librdkafka_sensitive() -> BTreeSet<String> {
        let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))
            .expect("Cargo.lock");
        let version = lock
            .split("[[package]]")
            .find(|p| p.contains("name = \"rdkafka-sys\""))
            .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
            .map(|v| v.trim_matches('"').to_owned())
            .expect("rdkafka-sys in Cargo.lock");
        let home = std::env::var_os("CARGO_HOME")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
            .expect("CARGO_HOME or HOME");
        let conf = std::fs::read_dir(home.join("registry/src"))
            .expect("cargo's registry")
            .filter_map(Result::ok)
            .map(|d| {
                d.path().join(format!(
                    "rdkafka-sys-{version}/librdkafka/src/rdkafka_conf.c"
                ))
            })
            .find(|p| p.exists())
            .expect("the bundled librdkafka's rdkafka_conf.c");
        let text = std::fs::read_to_string(&conf).expect("rdkafka_conf.c");
        // Entries read `{_RK_GLOBAL | _RK_SENSITIVE, "name", …`, the name maybe on the next line.
        text.split("_RK_SENSITIVE")
            .skip(1)
            .filter_map(|rest| {
                let head = rest.split('}').next()?;
                if !head.trim_start().starts_with(',') {
                    return None; // a use of the flag in code, not a property entry
                }
                let start = head.find('"')? + 1;
                let len = head[start..].find('"')?;
                Some(head[start..start + len].to_owned())
            })
            .collect()
    }

    #[test]
    fn the_sensitive_list_is_librdkafkas() {
        let ours: BTreeSet<String> = SENSITIVE.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(ours, librdkafka_sensitive());
        for k in NOT_SECRET {
            assert!(SENSITIVE.contains(k), "{k}");
        }
    }

    #[test]
    fn scrub_removes_every_sensitive_value_and_nothing_else() {
        let props = BTreeMap::from([
            (
                "sasl.oauthbearer.client.secret".to_owned(),
                "hunter2".to_owned(),
            ),
            ("sasl.username".to_owned(), "alice".to_owned()),
            ("linger.ms".to_owned(), "5".to_owned()),
        ]);
        let text = "Configuration property \"sasl.oauthbearer.client.secret\" not supported in this build: sasl.oauthbearer.client.secret hunter2 (user alice, linger 5)";
        let got = scrub(text, &props);
        assert!(!got.contains("hunter2") && !got.contains("alice"), "{got}");
        assert!(
            got.contains("linger 5") && got.contains("sasl.oauthbearer.client.secret"),
            "{got}"
        );
    }

    #[test]
    fn secrets_are_named_never_shown() {
        for key in SENSITIVE.iter().filter(|k| !NOT_SECRET.contains(k)) {
            assert!(refuse_on_command_line(key).is_err(), "{key}");
        }
        assert!(
            refuse_on_command_line("sasl.oauthbearer.assertion.private.key.passphrase").is_err()
        );
        assert!(refuse_on_command_line("sasl.password")
            .unwrap_err()
            .to_string()
            .contains("--config"));
        assert!(refuse_on_command_line("ssl.key.password").is_err());
        refuse_on_command_line("sasl.username").unwrap();
        let props = BTreeMap::from([
            ("sasl.password".to_owned(), "p".to_owned()),
            ("linger.ms".to_owned(), "5".to_owned()),
        ]);
        let shown = redacted(&props);
        assert_eq!(shown.get("sasl.password"), Some(&"[redacted]"));
        assert_eq!(shown.get("linger.ms"), Some(&"5"));
    }
}
