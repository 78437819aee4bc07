//! Authorization servers for tests over sockets: one of the tests' own (OpenID discovery and a
//! JWKS of Ed25519 keys on loopback, whose private halves sign any claims a test wants), and
//! npm's `oidc-provider` (a real, certified one) running `tests/clients/oidc_provider.mjs`.
//!
//! Included by the test files that need it with `#[path = "support/oauth.rs"] mod oauth;`,
//! beside `support/node.rs` as `mod node`.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use hyper::Method;
use serde_json::{json, Value};
use sled_sim::{McpClient, TokioConnect};
use tokio::io::AsyncBufReadExt;

use super::node;

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// An Ed25519 signing key, with its key id.
pub struct TestKey {
    kid: String,
    pub signing: ed25519_dalek::SigningKey,
}

impl TestKey {
    pub fn new(kid: &str, seed: u8) -> TestKey {
        TestKey {
            kid: kid.to_owned(),
            signing: ed25519_dalek::SigningKey::from_bytes(&[seed; 32]),
        }
    }

    /// The public half, as a JWK.
    pub fn jwk(&self) -> Value {
        json!({
            "kty": "OKP", "crv": "Ed25519", "use": "sig", "alg": "EdDSA", "kid": self.kid,
            "x": b64(self.signing.verifying_key().as_bytes()),
        })
    }

    /// Signs `claims` with `header` as given (EdDSA, whatever the header says).
    pub fn sign_raw(&self, header: &Value, claims: &Value) -> String {
        use ed25519_dalek::Signer as _;
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature = self.signing.sign(input.as_bytes());
        format!("{input}.{}", b64(&signature.to_bytes()))
    }

    /// An access token: `claims` signed by jsonwebtoken, under this key's id.
    pub fn token(&self, claims: &Value) -> String {
        // PKCS#8 v1 for Ed25519: a fixed prefix, then the 32-byte seed.
        let mut der = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        der.extend_from_slice(self.signing.as_bytes());
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        header.typ = Some("at+jwt".into());
        jsonwebtoken::encode(
            &header,
            claims,
            &jsonwebtoken::EncodingKey::from_ed_der(&der),
        )
        .expect("a token can be signed")
    }
}

/// OpenID discovery and a JWKS on a loopback port; counts JWKS fetches.
pub struct TestIssuer {
    pub url: String,
    keys: Arc<Mutex<Vec<Value>>>,
    jwks_fetches: Arc<AtomicUsize>,
    server: tokio::task::JoinHandle<()>,
}

impl TestIssuer {
    pub async fn start(keys: &[&TestKey]) -> TestIssuer {
        use axum::routing::get;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("bound"));
        let jwks = Arc::new(Mutex::new(keys.iter().map(|k| k.jwk()).collect::<Vec<_>>()));
        let fetches = Arc::new(AtomicUsize::new(0));
        let metadata = json!({"issuer": url, "jwks_uri": format!("{url}/jwks")});
        let app = axum::Router::new()
            .route(
                "/.well-known/openid-configuration",
                get(move || async move { axum::Json(metadata) }),
            )
            .route(
                "/jwks",
                get({
                    let jwks = jwks.clone();
                    let fetches = fetches.clone();
                    move || async move {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        let keys = jwks.lock().expect("not poisoned").clone();
                        axum::Json(json!({ "keys": keys }))
                    }
                }),
            );
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        TestIssuer {
            url,
            keys: jwks,
            jwks_fetches: fetches,
            server,
        }
    }

    pub fn set_keys(&self, keys: &[&TestKey]) {
        *self.keys.lock().expect("not poisoned") = keys.iter().map(|k| k.jwk()).collect();
    }

    pub fn fetches(&self) -> usize {
        self.jwks_fetches.load(Ordering::SeqCst)
    }
}

impl Drop for TestIssuer {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// `GET url` (any loopback HTTP URL): status and body.
pub async fn get(url: &str) -> (u16, Value) {
    let mut c = McpClient::connect(TokioConnect, url)
        .await
        .expect("the server is up");
    let (status, _, body) = c
        .send_raw(Method::GET, Vec::new(), &[("accept", "application/json")])
        .await
        .expect("an HTTP answer");
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// `POST url` of a form (`application/x-www-form-urlencoded`), with more headers: status and
/// body.
pub async fn post_form(url: &str, form: &[(&str, &str)], headers: &[(&str, &str)]) -> (u16, Value) {
    fn enc(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    }
    let body: Vec<String> = form
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect();
    let mut all = vec![
        ("content-type", "application/x-www-form-urlencoded"),
        ("accept", "application/json"),
    ];
    all.extend_from_slice(headers);
    let mut c = McpClient::connect(TokioConnect, url)
        .await
        .expect("the server is up");
    let (status, _, body) = c
        .send_raw(Method::POST, body.join("&").into_bytes(), &all)
        .await
        .expect("an HTTP answer");
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// A part of a JWT (0: the header, 1: the claims), read without checking anything.
pub fn jwt_part(token: &str, i: usize) -> Value {
    let part = token.split('.').nth(i).expect("a JWT part");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .expect("base64url");
    serde_json::from_slice(&bytes).expect("JSON")
}

/// The pinned oidc-provider.
pub const OIDC_PROVIDER: (&str, &str) = ("oidc-provider", "9.13.3");

/// A client of the provider: id and secret (see `tests/clients/oidc_provider.mjs`).
pub type ClientCredentials = (&'static str, &'static str);

/// Tokens of `ops-agent` carry no groups.
pub const OPS_AGENT: ClientCredentials = ("ops-agent", "ops-agent-secret-0123456789");
/// Tokens of `reader-agent` carry `groups: ["readers"]`.
pub const READER_AGENT: ClientCredentials = ("reader-agent", "reader-agent-secret-0123456789");

/// npm's oidc-provider, running `tests/clients/oidc_provider.mjs` for `resource` (and
/// `other_resource`) on a loopback port of its own, until [`Provider::stop`].
pub struct Provider {
    pub issuer: String,
    child: tokio::process::Child,
}

impl Provider {
    pub async fn start(resource: &str, other_resource: &str) -> Provider {
        let node = node::node().await;
        let dir = node::packages("oidc", &[OIDC_PROVIDER]).await;
        // Run from the install directory, so that the script's import finds the package. Each
        // provider copies it under a name of its own (process and count): two may start at once,
        // in one test binary or in two, and each removes its copy once it is ready.
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/oidc_provider.mjs");
        let script = dir.join(format!("oidc_provider_{}_{n}.mjs", std::process::id()));
        std::fs::copy(&source, &script).expect("the script can be copied next to the package");
        let mut cmd = node.command();
        cmd.current_dir(&dir)
            .arg(&script)
            .arg(resource)
            .arg(other_resource)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("node starts");
        let stdout = child.stdout.take().expect("piped");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let issuer = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.expect("stdout readable") {
                if let Some(issuer) = line.strip_prefix("READY ") {
                    return issuer.to_owned();
                }
            }
            panic!("oidc-provider ended before it was ready");
        })
        .await
        .expect("oidc-provider ready within 30 s");
        let _ = std::fs::remove_file(&script);
        Provider { issuer, child }
    }

    /// A token by the client-credentials grant (client_secret_basic) for `resource`, with
    /// `scope` when given: the status and the whole token response.
    pub async fn token(
        &self,
        (id, secret): ClientCredentials,
        resource: &str,
        scope: Option<&str>,
    ) -> (u16, Value) {
        let basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{id}:{secret}"))
        );
        let mut form = vec![("grant_type", "client_credentials"), ("resource", resource)];
        if let Some(s) = scope {
            form.push(("scope", s));
        }
        post_form(
            &format!("{}/token", self.issuer),
            &form,
            &[("authorization", &basic)],
        )
        .await
    }

    /// An access token by the client-credentials grant for `resource`, with `scope`.
    pub async fn access_token(
        &self,
        client: ClientCredentials,
        resource: &str,
        scope: &str,
    ) -> String {
        let (status, body) = self.token(client, resource, Some(scope)).await;
        assert_eq!(status, 200, "{body}");
        body["access_token"]
            .as_str()
            .expect("an access token")
            .to_owned()
    }

    /// Rotates the provider's signing key; the new key's id.
    pub async fn rotate(&self) -> String {
        let (status, body) = post_form(&format!("{}/test/rotate", self.issuer), &[], &[]).await;
        assert_eq!(status, 200);
        body["kid"].as_str().expect("a kid").to_owned()
    }

    pub async fn stop(mut self) {
        // End of its standard input ends it; kill it if it lingers.
        drop(self.child.stdin.take());
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}
