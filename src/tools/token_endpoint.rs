//! A small OIDC token endpoint (OAuth 2.0 client credentials, RFC 6749 §4.4) for the
//! OAUTHBEARER tests: what Keycloak, Entra ID or Okta is to a managed cluster, made small enough
//! that a test can start it, stop it, and make it issue short-lived or bad tokens.
//!
//! librdkafka with `sasl.oauthbearer.method=oidc` POSTs `grant_type=client_credentials` (and
//! `scope=…` when `sasl.oauthbearer.scope` is set) to `sasl.oauthbearer.token.endpoint.url`, with
//! the client id and secret in an HTTP Basic `Authorization` header. This endpoint checks them
//! against its registrations ([`Issuer::clients`]) and answers
//!
//! ```text
//! {"access_token": "<JWT>", "token_type": "Bearer", "expires_in": <seconds>}
//! ```
//!
//! The JWT is signed RS256 with the issuer's key (`kid` in its header) and carries `iss`, `aud`,
//! `sub` (the client id: the broker's principal is `User:<sub>`), `iat`, `nbf`, `exp` and `scope`.
//! A wrong secret or an unknown client gets 401 `invalid_client`, another grant 400
//! `unsupported_grant_type`; neither answer repeats what was sent. `GET /jwks` serves the public
//! key as a JWKS (the local broker reads the same key from the file `scripts/kafka.sh up
//! --secure` writes beside the private key).
//!
//! What a test controls: the token lifetime (short, so librdkafka's refresh and the broker's
//! re-authentication happen during a run), [`Mode`] (tokens the broker must refuse), and
//! [`TokenEndpoint::stop`] (an endpoint that is down). It counts what it issued and refused per
//! client, so a test can assert that tokens were refreshed.
//!
//! Plain HTTP on 127.0.0.1, on purpose: it is a test fixture. A real token endpoint is HTTPS, and
//! the client secret travels only to it.

use anyhow::Context as _;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private};
use openssl::rsa::Rsa;
use openssl::sign::Signer;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What the endpoint issues and to whom. `Debug` shows neither the key nor the secrets.
pub struct Issuer {
    /// `iss` of every token: the broker's `sasl.oauthbearer.expected.issuer`.
    pub issuer: String,
    /// `aud` of every token: the broker's `sasl.oauthbearer.expected.audience`.
    pub audience: String,
    /// `kid` in the JWT header: the key's id in the broker's JWKS.
    pub kid: String,
    /// The RSA signing key (its public half is what the broker trusts).
    pub key: PKey<Private>,
    /// Registered clients: client id to secret. The client id is the token's `sub`.
    pub clients: BTreeMap<String, String>,
    /// `exp - iat` of every token, and the `expires_in` of the answer.
    pub lifetime: Duration,
}

impl fmt::Debug for Issuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issuer")
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("kid", &self.kid)
            .field("key", &"[redacted]")
            .field("clients", &self.clients.keys().collect::<Vec<_>>())
            .field("lifetime", &self.lifetime)
            .finish()
    }
}

impl Issuer {
    /// The key from a PEM file (PKCS8 or PKCS1): `oauth/signing.key` of the secured broker.
    pub fn load_key(path: &std::path::Path) -> anyhow::Result<PKey<Private>> {
        let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        // openssl's error would not quote the key, but say only what is known.
        PKey::private_key_from_pem(&pem)
            .map_err(|_| anyhow::anyhow!("{} is not an RSA private key in PEM", path.display()))
    }

    /// The JWKS of the signing key: `{"keys": [{"kty": "RSA", "kid", "n", "e", …}]}`.
    pub fn jwks(&self) -> anyhow::Result<serde_json::Value> {
        let rsa = self.key.rsa().context("the signing key is not RSA")?;
        Ok(serde_json::json!({"keys": [{
            "kty": "RSA",
            "use": "sig",
            "alg": "RS256",
            "kid": self.kid,
            "n": URL_SAFE_NO_PAD.encode(rsa.n().to_vec()),
            "e": URL_SAFE_NO_PAD.encode(rsa.e().to_vec()),
        }]}))
    }

    /// A signed token for `client`, issued at `now` (seconds since the epoch), signed with `key`.
    fn token(
        &self,
        key: &PKey<Private>,
        client: &str,
        scope: Option<&str>,
        now: u64,
        lifetime: Duration,
    ) -> anyhow::Result<String> {
        let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": self.kid});
        let claims = serde_json::json!({
            "iss": self.issuer,
            "aud": self.audience,
            "sub": client,
            "iat": now,
            "nbf": now,
            "exp": now + lifetime.as_secs().max(1),
            "scope": scope.unwrap_or("kafka"),
            "jti": format!("{client}-{now}-{}", rand::random::<u32>()),
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header)?),
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims)?)
        );
        // RS256: RSASSA-PKCS1-v1_5 with SHA-256, openssl's default padding for an RSA key.
        let mut signer = Signer::new(MessageDigest::sha256(), key).context("RS256 signer")?;
        signer.update(signing_input.as_bytes())?;
        let signature = signer.sign_to_vec().context("signing the token")?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature)
        ))
    }
}

/// What kind of token the endpoint issues; a test switches it while clients run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// Good tokens: the broker accepts them.
    Valid = 0,
    /// Tokens signed by another key under the same `kid`: the broker refuses the signature.
    WrongKey = 1,
    /// Tokens that expired before they were issued: the broker refuses them as expired.
    Expired = 2,
    /// No tokens: every request is answered 401 `invalid_client`, as when a client's secret was
    /// rotated or its registration disabled at the provider.
    Refuse = 3,
}

/// What was issued and refused, per client id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Tokens issued, per client id.
    pub issued: BTreeMap<String, u64>,
    /// When each of them was issued, per client id, in order: a client that refreshes its token
    /// gets one at least once a lifetime.
    pub issued_at: BTreeMap<String, Vec<Instant>>,
    /// Requests answered 401 (wrong secret, unknown client, no credentials), per client id as
    /// sent (`-` when none could be read).
    pub refused: BTreeMap<String, u64>,
}

/// The endpoint's state shared with its handlers.
struct Shared {
    issuer: Issuer,
    /// The key of [`Mode::WrongKey`] tokens: made once, trusted by nobody.
    wrong_key: PKey<Private>,
    mode: AtomicU8,
    counts: Mutex<Counts>,
}

/// A running endpoint on 127.0.0.1, on its own runtime (the tests that use it are synchronous).
/// Dropping it stops it.
pub struct TokenEndpoint {
    addr: SocketAddr,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl TokenEndpoint {
    /// Starts the endpoint on a free port of 127.0.0.1.
    pub fn start(issuer: Issuer) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            // One is plenty: a handful of clients ask for a token every few seconds at most.
            .worker_threads(1)
            .thread_name("token-endpoint")
            .enable_all()
            .build()
            .context("the token endpoint's runtime")?;
        let wrong_key = PKey::from_rsa(Rsa::generate(2048).context("an RSA key")?)?;
        let shared = Arc::new(Shared {
            issuer,
            wrong_key,
            mode: AtomicU8::new(Mode::Valid as u8),
            counts: Mutex::new(Counts::default()),
        });
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .context("binding the token endpoint's port")?;
        let addr = listener
            .local_addr()
            .context("the token endpoint's address")?;
        let app = axum::Router::new()
            .route("/token", axum::routing::post(token))
            .route("/jwks", axum::routing::get(jwks))
            .with_state(Arc::clone(&shared));
        runtime.spawn(async move { axum::serve(listener, app).await });
        Ok(TokenEndpoint {
            addr,
            shared,
            runtime: Some(runtime),
        })
    }

    /// `sasl.oauthbearer.token.endpoint.url`.
    pub fn token_url(&self) -> String {
        format!("http://{}/token", self.addr)
    }

    /// The JWKS of the signing key.
    pub fn jwks_url(&self) -> String {
        format!("http://{}/jwks", self.addr)
    }

    /// From now on, issue tokens of this kind.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::SeqCst);
    }

    /// What was issued and refused so far.
    pub fn counts(&self) -> Counts {
        self.shared
            .counts
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    /// Stops serving: the port is closed when this returns (connections are refused).
    pub fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

impl Drop for TokenEndpoint {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An OAuth error answer (RFC 6749 §5.2): the error code and a fixed description, nothing of the
/// request (librdkafka reports the body as the reason).
fn oauth_error(status: StatusCode, error: &str) -> Response {
    let description = match error {
        "invalid_client" => "client authentication failed (unknown client id or wrong secret)",
        "unsupported_grant_type" => "only grant_type=client_credentials is served",
        _ => "the token could not be made",
    };
    let body = serde_json::json!({"error": error, "error_description": description});
    let mut response = (status, axum::Json(body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Basic realm=\"token\""),
        );
    }
    response
}

/// The client id and secret of an HTTP Basic `Authorization` header. RFC 6749 §2.3.1 has them
/// form-urlencoded before the base64; librdkafka sends them as they are. Both read the same for
/// ids and secrets without reserved characters; percent escapes are decoded.
fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))?;
    let decoded = String::from_utf8(STANDARD.decode(encoded.trim()).ok()?).ok()?;
    let (id, secret) = decoded.split_once(':')?;
    Some((form_decode(id), form_decode(secret)))
}

/// `application/x-www-form-urlencoded` decoding of one name or value.
fn form_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(hi), Some(lo)) => {
                        // Two hex digits: at most 255.
                        out.push((hi * 16 + lo) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The fields of a form body.
fn form_fields(body: &str) -> BTreeMap<String, String> {
    body.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (form_decode(k), form_decode(v))
        })
        .collect()
}

/// Constant-time comparison of a presented secret with the registered one.
fn same_secret(presented: &str, registered: &str) -> bool {
    presented.len() == registered.len()
        && openssl::memcmp::eq(presented.as_bytes(), registered.as_bytes())
}

async fn token(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: String) -> Response {
    let fields = form_fields(&body);
    let Some((client, secret)) = basic_credentials(&headers) else {
        count(&shared, |c| &mut c.refused, "-");
        return oauth_error(StatusCode::UNAUTHORIZED, "invalid_client");
    };
    let refusing = shared.mode.load(Ordering::SeqCst) == Mode::Refuse as u8;
    let known = !refusing
        && shared
            .issuer
            .clients
            .get(&client)
            .is_some_and(|registered| same_secret(&secret, registered));
    if !known {
        count(&shared, |c| &mut c.refused, &client);
        return oauth_error(StatusCode::UNAUTHORIZED, "invalid_client");
    }
    if fields.get("grant_type").map(String::as_str) != Some("client_credentials") {
        return oauth_error(StatusCode::BAD_REQUEST, "unsupported_grant_type");
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let lifetime = shared.issuer.lifetime;
    let mode = shared.mode.load(Ordering::SeqCst);
    let (key, issued_at) = match mode {
        m if m == Mode::WrongKey as u8 => (&shared.wrong_key, now),
        // Issued a lifetime and a minute ago: expired beyond any clock skew the broker allows.
        m if m == Mode::Expired as u8 => (
            &shared.issuer.key,
            now.saturating_sub(lifetime.as_secs() + 60),
        ),
        _ => (&shared.issuer.key, now),
    };
    let scope = fields.get("scope").map(String::as_str);
    match shared
        .issuer
        .token(key, &client, scope, issued_at, lifetime)
    {
        Ok(access_token) => {
            count(&shared, |c| &mut c.issued, &client);
            if let Ok(mut counts) = shared.counts.lock() {
                let at = counts.issued_at.entry(client.clone()).or_default();
                at.push(Instant::now());
            }
            axum::Json(serde_json::json!({
                "access_token": access_token,
                "token_type": "Bearer",
                "expires_in": lifetime.as_secs(),
            }))
            .into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "token endpoint: signing failed");
            oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error")
        }
    }
}

fn count(shared: &Shared, which: fn(&mut Counts) -> &mut BTreeMap<String, u64>, client: &str) {
    if let Ok(mut counts) = shared.counts.lock() {
        *which(&mut counts).entry(client.to_owned()).or_default() += 1;
    }
}

async fn jwks(State(shared): State<Arc<Shared>>) -> Response {
    match shared.issuer.jwks() {
        Ok(jwks) => axum::Json(jwks).into_response(),
        Err(_) => oauth_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer(lifetime: Duration) -> Issuer {
        Issuer {
            issuer: "iss-test".into(),
            audience: "aud-test".into(),
            kid: "kid-test".into(),
            key: PKey::from_rsa(Rsa::generate(2048).unwrap()).unwrap(),
            clients: [("pipeline".to_owned(), "s3cret-value-1234".to_owned())].into(),
            lifetime,
        }
    }

    fn part(token: &str, i: usize) -> serde_json::Value {
        let p = token.split('.').nth(i).unwrap();
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(p).unwrap()).unwrap()
    }

    #[test]
    fn a_token_is_an_rs256_jwt_with_the_claims_the_broker_checks_and_verifies_with_the_jwks() {
        let i = issuer(Duration::from_secs(15));
        let t = i
            .token(&i.key, "pipeline", None, 1_000, i.lifetime)
            .unwrap();
        assert_eq!(part(&t, 0)["alg"], "RS256");
        assert_eq!(part(&t, 0)["kid"], "kid-test");
        let claims = part(&t, 1);
        assert_eq!(
            (
                &claims["iss"],
                &claims["aud"],
                &claims["sub"],
                &claims["exp"]
            ),
            (
                &serde_json::json!("iss-test"),
                &serde_json::json!("aud-test"),
                &serde_json::json!("pipeline"),
                &serde_json::json!(1_015)
            )
        );
        // The signature verifies with the public key rebuilt from the JWKS alone.
        let jwks = i.jwks().unwrap();
        let n = URL_SAFE_NO_PAD
            .decode(jwks["keys"][0]["n"].as_str().unwrap())
            .unwrap();
        let e = URL_SAFE_NO_PAD
            .decode(jwks["keys"][0]["e"].as_str().unwrap())
            .unwrap();
        let public = Rsa::from_public_components(
            openssl::bn::BigNum::from_slice(&n).unwrap(),
            openssl::bn::BigNum::from_slice(&e).unwrap(),
        )
        .unwrap();
        let public = PKey::from_rsa(public).unwrap();
        let (input, sig) = t.rsplit_once('.').unwrap();
        let mut v = openssl::sign::Verifier::new(MessageDigest::sha256(), &public).unwrap();
        v.update(input.as_bytes()).unwrap();
        assert!(v.verify(&URL_SAFE_NO_PAD.decode(sig).unwrap()).unwrap());
    }

    #[test]
    fn basic_credentials_and_form_fields_are_read_as_librdkafka_sends_them() {
        let mut h = HeaderMap::new();
        let value = format!("Basic {}", STANDARD.encode("pipeline:ab%2Bc+d"));
        h.insert(header::AUTHORIZATION, value.parse().unwrap());
        assert_eq!(
            basic_credentials(&h),
            Some(("pipeline".into(), "ab+c d".into()))
        );
        let f = form_fields("grant_type=client_credentials&scope=kafka%20read");
        assert_eq!(f["grant_type"], "client_credentials");
        assert_eq!(f["scope"], "kafka read");
        assert_eq!(form_decode("100%"), "100%");
    }

    #[test]
    fn debug_shows_neither_the_key_nor_the_secrets() {
        let shown = format!("{:?}", issuer(Duration::from_secs(1)));
        assert!(!shown.contains("s3cret-value-1234") && !shown.contains("PRIVATE"));
        assert!(shown.contains("pipeline"));
    }
}
