//! Where Kafka secrets may come from, and how they are kept out of sight.
//!
//! A password reaches the clients from one of two places: the `[librdkafka]` table of a
//! `--config` file that only its owner can read, or the `KAFKA_SASL_PASSWORD` environment
//! variable (what a Kubernetes secret or systemd credential usually becomes). Never from the
//! command line: every local user can read a process's arguments (`ps`, `/proc/*/cmdline`), so
//! `-X sasl.password=…` is refused with a message saying where to put it instead.
//!
//! Anything that prints a configuration ([`redacted`], the `Debug` of
//! [`KafkaConfig`](super::config::KafkaConfig)) shows a secret property as `[redacted]`; error
//! messages name a secret property, never its value.

use anyhow::{bail, Context as _};
use std::collections::BTreeMap;
use std::path::Path;

/// The environment variable a SASL password may come from.
pub const PASSWORD_ENV: &str = "KAFKA_SASL_PASSWORD";

/// Whether a librdkafka property holds a secret: passwords, client secrets, private keys.
pub fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password")
        || k.contains("secret")
        || k == "ssl.key.pem"
        || k == "sasl.oauthbearer.config"
}

/// `properties` with every secret value replaced, for logs and `Debug`.
pub fn redacted(properties: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    properties
        .iter()
        .map(|(k, v)| {
            (
                k.as_str(),
                if is_secret(k) {
                    "[redacted]"
                } else {
                    v.as_str()
                },
            )
        })
        .collect()
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
        check_owner_only(path, secret)?;
    }
    Ok(properties)
}

#[cfg(unix)]
fn check_owner_only(path: &Path, secret: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "config file {} holds {secret} but is readable by others (mode {:03o}): chmod 600 {}",
            path.display(),
            mode & 0o777,
            path.display()
        );
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_owner_only(_: &Path, _: &str) -> anyhow::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[test]
    fn secrets_are_named_never_shown() {
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
