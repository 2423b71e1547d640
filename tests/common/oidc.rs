//! Helpers of the OAUTHBEARER tests (tests/oidc.rs): the secured broker's OAUTH listener
//! (`scripts/kafka.sh up --secure`), a local token endpoint with the broker's signing key and the
//! client secrets it wrote, and `[librdkafka]` files that log in with OIDC.

use super::secure::{secure, Secure};
use price_alerts::tools::token_endpoint::{Issuer, TokenEndpoint};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The secured broker seen from both of its client listeners.
pub struct Oidc {
    /// The SCRAM listener: the super-user's set-up and checks, `scripts/acls.sh`.
    pub scram: Secure,
    /// The OAUTHBEARER listener, for the binaries under test (same state folder).
    pub oauth: Secure,
    /// What the broker expects in a token's `iss` and `aud`.
    pub issuer: String,
    pub audience: String,
    /// Where the tests' config files go (removed by nobody: they are in the temp dir, mode 600).
    pub dir: PathBuf,
}

pub fn oidc(test: &str) -> Oidc {
    let scram = secure();
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set: run scripts/test.sh, or eval \"$(scripts/kafka.sh env --secure)\" \
                 after scripts/kafka.sh up --secure (it prints the OAUTHBEARER listener's settings)"
            )
        })
    };
    let oauth = Secure {
        bootstrap: var("KAFKA_SECURE_OAUTH_BOOTSTRAP"),
        dir: scram.dir.clone(),
    };
    let dir = std::env::temp_dir().join(super::prefix(test));
    std::fs::create_dir_all(&dir).expect("temp dir");
    Oidc {
        issuer: var("KAFKA_SECURE_OAUTH_ISSUER"),
        audience: var("KAFKA_SECURE_OAUTH_AUDIENCE"),
        scram,
        oauth,
        dir,
    }
}

impl Oidc {
    /// The OIDC client secret of `client`, as `up --secure` wrote it.
    pub fn secret(&self, client: &str) -> String {
        std::fs::read_to_string(
            self.scram
                .dir
                .join("credentials")
                .join(format!("{client}.oidc-secret")),
        )
        .expect("the client's OIDC secret")
        .trim()
        .to_owned()
    }

    /// Every OIDC client registration of the broker's state: client id to secret.
    pub fn clients(&self) -> BTreeMap<String, String> {
        let dir = self.scram.dir.join("credentials");
        std::fs::read_dir(&dir)
            .expect("the credentials folder")
            .filter_map(|e| {
                let name = e.expect("an entry").file_name().into_string().ok()?;
                let client = name.strip_suffix(".oidc-secret")?.to_owned();
                Some((client.clone(), self.secret(&client)))
            })
            .collect()
    }

    /// A token endpoint signing with the broker's trusted key, issuing tokens of `lifetime`.
    pub fn endpoint(&self, lifetime: Duration) -> TokenEndpoint {
        let oauth = self.scram.dir.join("oauth");
        let jwks: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(oauth.join("jwks.json")).expect("the broker's JWKS"),
        )
        .expect("JWKS JSON");
        let clients = self.clients();
        assert!(
            clients.len() >= 5,
            "up --secure wrote the OIDC client secrets"
        );
        TokenEndpoint::start(Issuer {
            issuer: self.issuer.clone(),
            audience: self.audience.clone(),
            kid: jwks["keys"][0]["kid"].as_str().expect("a kid").to_owned(),
            key: Issuer::load_key(&oauth.join("signing.key")).expect("the signing key"),
            clients,
            lifetime,
        })
        .expect("starting the token endpoint")
    }

    /// A mode-600 `[librdkafka]` file that logs in as OIDC client `client` with `secret` at
    /// `token_url`.
    pub fn config(&self, name: &str, client: &str, secret: &str, token_url: &str) -> PathBuf {
        use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
        let path = self.dir.join(format!("{name}.toml"));
        let ca = self.scram.dir.join("tls/ca.pem");
        let text = format!(
            "[librdkafka]\n\
             \"security.protocol\" = \"SASL_SSL\"\n\
             \"sasl.mechanism\" = \"OAUTHBEARER\"\n\
             \"sasl.oauthbearer.method\" = \"oidc\"\n\
             \"sasl.oauthbearer.client.id\" = \"{client}\"\n\
             \"sasl.oauthbearer.client.secret\" = \"{secret}\"\n\
             \"sasl.oauthbearer.token.endpoint.url\" = \"{token_url}\"\n\
             \"sasl.oauthbearer.scope\" = \"kafka\"\n\
             \"ssl.ca.location\" = \"{}\"\n",
            ca.display()
        );
        // Created owner-only, never readable by others for a moment.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .expect("creating the config file");
        std::io::Write::write_all(&mut f, text.as_bytes()).expect("writing the config file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        path
    }

    /// `client`'s config with its own secret.
    pub fn client_config(&self, client: &str, token_url: &str) -> PathBuf {
        self.config(client, client, &self.secret(client), token_url)
    }

    /// A binary of this crate on the OAUTHBEARER listener with the `[librdkafka]` file `config`.
    pub fn command(&self, binary: &str, config: &Path) -> std::process::Command {
        self.oauth.command_with(binary, config)
    }

    /// Fails if any secret of the broker (SCRAM passwords, OIDC client secrets, the signing
    /// key's PEM body) or any of `more` appears in `text`.
    pub fn assert_no_secret(&self, what: &str, text: &str, more: &[&str]) {
        self.scram.assert_no_password(what, text);
        for (client, secret) in self.clients() {
            assert!(
                !text.contains(&secret),
                "the OIDC secret of {client} appears in the output of {what}"
            );
        }
        let key = std::fs::read_to_string(self.scram.dir.join("oauth/signing.key"))
            .expect("the signing key");
        for line in key.lines().filter(|l| !l.starts_with("-----")) {
            assert!(
                !text.contains(line),
                "the signing key appears in the output of {what}"
            );
        }
        for m in more {
            assert!(
                !text.contains(m),
                "a secret appears in the output of {what}"
            );
        }
    }
}
