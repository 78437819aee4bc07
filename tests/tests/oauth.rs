//! The gateway as an OAuth 2.1 resource server (issue 17), over loopback sockets: protected
//! resource metadata, the 401 and 403 challenges, and JWT access tokens checked against the
//! issuer's JWKS.
//!
//! Two authorization servers: one made here (an axum app serving OpenID discovery and a JWKS of
//! Ed25519 keys whose private halves the tests hold, counting JWKS fetches), to sign the tokens
//! a real provider will not make (expired, for a forged key id, `alg: none`, wrong claim
//! types); and npm's `oidc-provider` (OpenID certified, installed into `target/clients/oidc/`
//! on first use and run by `tests/clients/oidc_provider.mjs`), issuing tokens by the
//! client-credentials grant for the resource asked for, rotating its key on demand. The Python
//! SDK's client-credentials provider goes from the 401 through discovery to a token.

use std::net::SocketAddr;
use std::time::Duration;

use gateway_core::OAuthConfig;
use gateway_server::oauth::OAuthOptions;
use gateway_server::ServerOptions;
use serde_json::{json, Value};
use sled_sim::{Fleet, McpClient, SledOptions, TokioConnect};

#[path = "support/node.rs"]
mod node;
#[path = "support/oauth.rs"]
mod oauth;
#[path = "support/processes.rs"]
mod processes;
#[path = "support/python.rs"]
mod python;
#[path = "support/stdio.rs"]
mod stdio;

use oauth::{b64, get, jwt_part, now, post_form, Provider, TestIssuer, TestKey, OPS_AGENT};

const PROJECTS: [&str; 2] = ["alpha", "beta"];

/// Claims of a good access token from `issuer` for `resource`, with `scope`.
fn claims(issuer: &str, resource: &str, scope: &str) -> Value {
    json!({
        "iss": issuer, "sub": "agent-7", "aud": resource, "client_id": "ops-bot",
        "iat": now(), "exp": now() + 300, "scope": scope, "groups": ["ops"],
    })
}

// ---- the gateway under test ----

/// The real gateway (projects alpha and beta, default alpha) with `[oauth]` for its own
/// address, and a sled per project.
struct OAuthGateway {
    addr: SocketAddr,
    /// `http://<addr>/mcp`: the endpoint, and the resource URI.
    resource: String,
    fleet: Fleet,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

const COOLDOWN: Duration = Duration::from_millis(400);

impl OAuthGateway {
    async fn start(issuer: &str) -> OAuthGateway {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        OAuthGateway::start_on(listener, issuer).await
    }

    /// The gateway served on `listener`, trusting `issuer`.
    async fn start_on(listener: tokio::net::TcpListener, issuer: &str) -> OAuthGateway {
        gateway_tests::init_tracing();
        let addr = listener.local_addr().expect("bound");
        let resource = format!("http://{addr}/mcp");
        let oauth = OAuthConfig::new(&resource, vec![issuer.to_owned()], vec!["mcp".into()])
            .expect("a valid [oauth]");
        let registry = gateway_tests::registry(&PROJECTS, Some("alpha")).with_oauth(oauth);
        let mut opts = ServerOptions::new(registry, [9; 32]);
        opts.oauth = OAuthOptions {
            jwks_cooldown: COOLDOWN,
            ..OAuthOptions::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(gateway_server::serve(listener, opts, async {
            let _ = stopped.await;
        }));
        let names: Vec<String> = PROJECTS.iter().map(|p| (*p).to_owned()).collect();
        let fleet = Fleet::spawn(&format!("http://{addr}"), &names, SledOptions::default());
        OAuthGateway {
            addr,
            resource,
            fleet,
            stop,
            server,
        }
    }

    /// Waits (at most 15 s) until both sleds are live and alpha's tools listed, asking with
    /// `token`.
    async fn wait_live(&self, token: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let (status, _, body) = self.post(Some(token), list_projects()).await;
            assert_eq!(status, 200, "{body}");
            let projects = body["result"]["structuredContent"]["projects"].clone();
            let live = PROJECTS.iter().all(|name| {
                projects
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["name"] == *name && p["live"] == true))
            });
            let (_, _, tools) = self.post(Some(token), tools_list()).await;
            let listed = tools["result"]["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["name"] == "whoami"));
            if live && listed {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the sleds did not come up within 15 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// POSTs a JSON-RPC message with `Authorization: Bearer <token>` when given: status, the
    /// `WWW-Authenticate` header, and the body as JSON.
    async fn post(&self, token: Option<&str>, body: Value) -> (u16, Option<String>, Value) {
        self.post_with(token.map(|t| format!("Bearer {t}")), &[], body)
            .await
    }

    async fn post_with(
        &self,
        authorization: Option<String>,
        extra: &[(&str, &str)],
        body: Value,
    ) -> (u16, Option<String>, Value) {
        let mut c = McpClient::connect(TokioConnect, &self.resource)
            .await
            .expect("the gateway is up");
        let mut headers = extra.to_vec();
        if let Some(a) = &authorization {
            headers.push(("authorization", a));
        }
        let (status, h, body) = c
            .post_raw(body.to_string().into_bytes(), &headers)
            .await
            .expect("an HTTP answer");
        let challenge = h
            .get("www-authenticate")
            .map(|v| v.to_str().expect("ASCII").to_owned());
        (
            status,
            challenge,
            serde_json::from_slice(&body).unwrap_or(Value::Null),
        )
    }

    fn metadata_url(&self) -> String {
        format!(
            "http://{}/.well-known/oauth-protected-resource/mcp",
            self.addr
        )
    }

    async fn stop(self) {
        self.fleet.shutdown().await;
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(20), self.server)
            .await
            .expect("the gateway stopped within 20 s")
            .expect("the server task did not panic")
            .expect("serve returned Ok");
    }
}

fn list_projects() -> Value {
    json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_projects","arguments":{}}})
}

fn tools_list() -> Value {
    json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}})
}

fn whoami(project: Option<&str>) -> Value {
    let arguments = match project {
        Some(p) => json!({ "project": p }),
        None => json!({}),
    };
    json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":arguments}})
}

/// `GET url` (any loopback HTTP URL): status and body.
fn challenge_401(gw: &OAuthGateway, presented: bool) -> String {
    let error = if presented {
        r#"error="invalid_token", "#
    } else {
        ""
    };
    format!(
        r#"Bearer {error}resource_metadata="{}", scope="mcp""#,
        gw.metadata_url()
    )
}

// ---- the tests ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_tokens_signed_here_are_checked_and_refused_without_detail() {
    let k1 = TestKey::new("k1", 1);
    let issuer = TestIssuer::start(&[&k1]).await;
    let gw = OAuthGateway::start(&issuer.url).await;
    let good = k1.token(&claims(&issuer.url, &gw.resource, "mcp"));
    gw.wait_live(&good).await;

    // The protected resource metadata, at the path-suffixed and the root well-known URL.
    let want = json!({
        "resource": gw.resource,
        "authorization_servers": [issuer.url],
        "scopes_supported": ["mcp"],
        "bearer_methods_supported": ["header"],
        "resource_name": "mcp-gateway",
    });
    assert_eq!(get(&gw.metadata_url()).await, (200, want.clone()));
    let root = format!("http://{}/.well-known/oauth-protected-resource", gw.addr);
    assert_eq!(get(&root).await, (200, want));

    // No token: 401 pointing at the metadata, with the scope needed.
    let (status, challenge, body) = gw.post(None, tools_list()).await;
    assert_eq!(status, 401);
    assert_eq!(challenge, Some(challenge_401(&gw, false)));
    assert_eq!(body["error"]["data"]["kind"], "unauthorized");

    // A good token: the merged tools/list, a call to the default project and one to beta.
    let (status, _, body) = gw.post(Some(&good), tools_list()).await;
    assert_eq!(status, 200);
    let names: Vec<&str> = body["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"list_projects") && names.contains(&"whoami"),
        "{names:?}"
    );
    for (project, want) in [(None, "alpha"), (Some("beta"), "beta")] {
        let (status, _, body) = gw.post(Some(&good), whoami(project)).await;
        assert_eq!(status, 200);
        assert_eq!(
            body["result"]["structuredContent"]["project"], want,
            "{body}"
        );
    }

    // Every refusal looks the same: one status, one challenge, one body, whatever the reason.
    let (status, reference_challenge, reference_body) =
        gw.post(Some("garbage"), tools_list()).await;
    assert_eq!(status, 401);
    assert_eq!(reference_challenge, Some(challenge_401(&gw, true)));
    let stranger = TestKey::new("k1", 99);
    let base = claims(&issuer.url, &gw.resource, "mcp");
    let with = |name: &str, value: Value| {
        let mut c = base.clone();
        c[name] = value;
        c
    };
    let without = |name: &str| {
        let mut c = base.clone();
        c.as_object_mut().unwrap().remove(name);
        c
    };
    let unsigned = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"at+jwt"}"#),
        b64(base.to_string().as_bytes())
    );
    let hs256 = {
        // The classic confusion: HMAC keyed with the public key the JWKS publishes.
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("k1".into());
        jsonwebtoken::encode(
            &header,
            &base,
            &jsonwebtoken::EncodingKey::from_secret(k1.signing.verifying_key().as_bytes()),
        )
        .unwrap()
    };
    let refused: Vec<(&str, String)> = vec![
        (
            "a token for another resource",
            k1.token(&with("aud", json!("http://127.0.0.1:1/mcp"))),
        ),
        ("expired", k1.token(&with("exp", json!(now() - 120)))),
        ("not valid yet", k1.token(&with("nbf", json!(now() + 600)))),
        (
            "signed by a key the issuer does not have, under its kid",
            stranger.token(&base),
        ),
        ("a forged kid", TestKey::new("forged-kid", 98).token(&base)),
        ("alg: none", unsigned.clone()),
        ("alg: none with a signature", format!("{unsigned}c2ln")),
        ("HS256 keyed with the public key", hs256),
        (
            "RS256 named for an Ed25519 key",
            k1.sign_raw(&json!({"alg":"RS256","kid":"k1"}), &base),
        ),
        (
            "another issuer",
            k1.token(&with("iss", json!("http://127.0.0.1:1"))),
        ),
        (
            "the issuer with a trailing slash",
            k1.token(&with("iss", json!(format!("{}/", issuer.url)))),
        ),
        ("exp as a string", k1.token(&with("exp", json!("tomorrow")))),
        ("aud as a number", k1.token(&with("aud", json!(7)))),
        (
            "scope as an array",
            k1.token(&with("scope", json!(["mcp"]))),
        ),
        (
            "groups of objects",
            k1.token(&with("groups", json!([{"a": 1}]))),
        ),
        ("no sub", k1.token(&without("sub"))),
        ("no exp", k1.token(&without("exp"))),
        (
            "a critical header",
            k1.sign_raw(&json!({"alg":"EdDSA","kid":"k1","crit":["x"]}), &base),
        ),
        (
            "a DPoP proof for a token",
            k1.sign_raw(&json!({"alg":"EdDSA","kid":"k1","typ":"dpop+jwt"}), &base),
        ),
        ("a good token cut short", good[..good.len() - 4].to_owned()),
    ];
    for (what, token) in &refused {
        let started = std::time::Instant::now();
        let (status, challenge, body) = gw.post(Some(token), tools_list()).await;
        assert_eq!(status, 401, "{what}");
        assert_eq!(challenge, reference_challenge, "{what}");
        assert_eq!(body, reference_body, "{what}: no detail in the body");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{what}: refused in {:?}",
            started.elapsed()
        );
    }

    // A valid token without the scope: 403 naming it.
    let (status, challenge, body) = gw
        .post(
            Some(&k1.token(&with("scope", json!("openid other")))),
            tools_list(),
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(
        challenge,
        Some(format!(
            r#"Bearer error="insufficient_scope", scope="mcp", resource_metadata="{}""#,
            gw.metadata_url()
        ))
    );
    assert_eq!(body["error"]["data"]["kind"], "insufficient_scope");

    // A session is its principal's: the same subject carries on, another gets 404.
    let mut c = McpClient::connect(TokioConnect, &gw.resource)
        .await
        .unwrap();
    c.set_bearer_token(Some(good.clone()));
    c.initialize().await.expect("initialize with a good token");
    let session = c.session_id().expect("a session").to_owned();
    let (status, _, _) = gw
        .post_with(
            Some(format!("Bearer {good}")),
            &[("mcp-session-id", &session)],
            whoami(None),
        )
        .await;
    assert_eq!(status, 200);
    let other = k1.token(&with("sub", json!("agent-8")));
    let (status, _, body) = gw
        .post_with(
            Some(format!("Bearer {other}")),
            &[("mcp-session-id", &session)],
            whoami(None),
        )
        .await;
    assert_eq!(
        (status, body["error"]["data"]["kind"].as_str()),
        (404, Some("unknown_session"))
    );

    // A flood of forged key ids: each refused at once, the issuer asked at most once per
    // cooldown.
    tokio::time::sleep(COOLDOWN).await;
    let before = issuer.fetches();
    let started = std::time::Instant::now();
    let flood = 40;
    for i in 0..flood {
        let token = TestKey::new(&format!("forged-{i}"), 50).token(&base);
        let (status, _, _) = gw.post(Some(&token), tools_list()).await;
        assert_eq!(status, 401);
    }
    let elapsed = started.elapsed();
    let fetched = issuer.fetches() - before;
    let allowed = 1 + (elapsed.as_millis() / COOLDOWN.as_millis()) as usize;
    assert!(
        fetched >= 1 && fetched <= allowed,
        "{fetched} JWKS fetches for {flood} forged kids in {elapsed:?} (at most {allowed})"
    );

    // The issuer rotates its key: the gateway learns the new one without a restart.
    let k2 = TestKey::new("k2", 2);
    issuer.set_keys(&[&k2, &k1]);
    tokio::time::sleep(COOLDOWN).await;
    let rotated = k2.token(&claims(&issuer.url, &gw.resource, "mcp"));
    let (status, _, body) = gw.post(Some(&rotated), whoami(Some("beta"))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["structuredContent"]["project"], "beta");
    let (status, _, _) = gw.post(Some(&good), tools_list()).await;
    assert_eq!(status, 200, "the old key still verifies what it signed");

    gw.stop().await;
}

// ---- a real OpenID provider ----

/// npm's oidc-provider, running `tests/clients/oidc_provider.mjs` for `resource` (and
/// `other_resource`), on a loopback port of its own.
const OTHER_RESOURCE: &str = "https://other.example.com/mcp";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_from_a_real_openid_provider() {
    // The provider must know the gateway's resource and the gateway its issuer: the gateway's
    // port is bound first, the provider started for it, then the gateway served on it.
    let gw_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let gw_addr = gw_listener.local_addr().expect("bound");
    let resource = format!("http://{gw_addr}/mcp");
    let provider = Provider::start(&resource, OTHER_RESOURCE).await;
    let gw = OAuthGateway::start_on(gw_listener, &provider.issuer).await;
    assert_eq!(gw.resource, resource);

    // Discovery as a client does it, with raw requests: the 401 names the metadata, the
    // metadata the authorization server, its metadata the token endpoint.
    let (status, challenge, _) = gw.post(None, tools_list()).await;
    assert_eq!(status, 401);
    let challenge = challenge.expect("a challenge");
    let metadata_url = challenge
        .split("resource_metadata=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("resource_metadata in the challenge");
    let (status, metadata) = get(metadata_url).await;
    assert_eq!(status, 200);
    assert_eq!(metadata["resource"], resource);
    let server = metadata["authorization_servers"][0].as_str().unwrap();
    assert_eq!(server, provider.issuer);
    let (status, as_metadata) =
        get(&format!("{server}/.well-known/oauth-authorization-server")).await;
    assert_eq!(status, 200);
    let token_endpoint = as_metadata["token_endpoint"]
        .as_str()
        .expect("a token endpoint");
    let (status, token) = post_form(
        token_endpoint,
        &[
            ("grant_type", "client_credentials"),
            ("client_id", "ops-agent-post"),
            ("client_secret", OPS_AGENT.1),
            ("resource", &resource),
            ("scope", "mcp"),
        ],
        &[],
    )
    .await;
    assert_eq!(status, 200, "{token}");
    let first = token["access_token"].as_str().expect("a token").to_owned();
    assert_eq!(jwt_part(&first, 1)["aud"], resource.as_str());

    // It works: tools/list and a call to a project.
    gw.wait_live(&first).await;
    let (status, _, body) = gw.post(Some(&first), whoami(Some("beta"))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["structuredContent"]["project"], "beta");

    // A stdio-only desktop client gets in with the same token through `gateway stdio`, given
    // in the environment as its configuration's "env" would.
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
        "params":{"name":"whoami","arguments":{"project":"beta"}}});
    let lines = stdio::run(
        &processes::workspace_bin("gateway"),
        &resource,
        stdio::Token::Env(&first),
        &stdio::session(&[call]),
    )
    .await;
    assert_eq!(
        stdio::answer(&lines, 2)["result"]["structuredContent"]["project"],
        "beta",
        "{lines:?}"
    );

    // The provider's token for another resource is refused like any invalid token; one
    // without the scope gets 403.
    let elsewhere = provider
        .access_token(OPS_AGENT, OTHER_RESOURCE, "mcp")
        .await;
    assert_eq!(jwt_part(&elsewhere, 1)["aud"], OTHER_RESOURCE);
    let (status, challenge, _) = gw.post(Some(&elsewhere), tools_list()).await;
    assert_eq!((status, challenge), (401, Some(challenge_401(&gw, true))));
    let (status, unscoped) = provider.token(OPS_AGENT, &resource, None).await;
    assert_eq!(status, 200, "{unscoped}");
    let unscoped = unscoped["access_token"]
        .as_str()
        .expect("a token")
        .to_owned();
    let (status, _, body) = gw.post(Some(&unscoped), tools_list()).await;
    assert_eq!(
        (status, body["error"]["data"]["kind"].as_str()),
        (403, Some("insufficient_scope"))
    );

    // The provider rotates its key; its next token is signed with the new one, which the
    // gateway fetches without a restart.
    let old_kid = jwt_part(&first, 0)["kid"].as_str().unwrap().to_owned();
    let new_kid = provider.rotate().await;
    assert_ne!(new_kid, old_kid);
    tokio::time::sleep(COOLDOWN).await;
    let rotated = provider.access_token(OPS_AGENT, &resource, "mcp").await;
    assert_eq!(jwt_part(&rotated, 0)["kid"], new_kid.as_str());
    let (status, _, body) = gw.post(Some(&rotated), whoami(None)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["structuredContent"]["project"], "alpha");

    gw.stop().await;
    provider.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_goes_from_the_401_to_a_token_by_client_credentials() {
    let python = python::python_with_sdk().await;
    let gw_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let resource = format!("http://{}/mcp", gw_listener.local_addr().expect("bound"));
    let provider = Provider::start(&resource, OTHER_RESOURCE).await;
    let gw = OAuthGateway::start_on(gw_listener, &provider.issuer).await;
    gw.wait_live(&provider.access_token(OPS_AGENT, &resource, "mcp").await)
        .await;

    python::run_checks(
        &python,
        "python_oauth_client.py",
        &[&resource, &provider.issuer, OPS_AGENT.0, OPS_AGENT.1],
    )
    .await;

    // The README's example, `examples/oauth_client.py` as shipped, its secret in a file.
    let dir = processes::scratch("oauth-example");
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, OPS_AGENT.1).unwrap();
    let run = tokio::process::Command::new(&python)
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/oauth_client.py"))
        .env("GATEWAY_URL", &resource)
        .env("OAUTH_ISSUER", &provider.issuer)
        .env("OAUTH_CLIENT_ID", OPS_AGENT.0)
        .env("OAUTH_CLIENT_SECRET_FILE", &secret_file)
        .env_remove("OAUTH_CLIENT_SECRET")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("examples/oauth_client.py finished within 120 s")
        .expect("examples/oauth_client.py ran");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "examples/oauth_client.py failed:\n{printed}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tools: Vec<&str> = printed.lines().collect();
    assert!(
        tools.contains(&"list_projects") && tools.contains(&"whoami"),
        "examples/oauth_client.py did not list the gateway's and the projects' tools: {tools:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    gw.stop().await;
    provider.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_follows_projects_toml_when_it_is_reloaded() {
    gateway_tests::init_tracing();
    let k1 = TestKey::new("k1", 1);
    let issuer = TestIssuer::start(&[&k1]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("bound");
    let resource = format!("http://{addr}/mcp");
    let dir = std::env::temp_dir().join(format!("gateway-oauth-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("projects.toml");
    let plain = "[[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n";
    let with_oauth = format!(
        "{plain}\n[oauth]\nresource = \"{resource}\"\nauthorization_servers = [\"{}\"]\nrequired_scopes = [\"mcp\"]\n",
        issuer.url
    );
    std::fs::write(&path, plain).unwrap();
    let registry = gateway_core::Registry::parse("projects.toml", plain).unwrap();
    let mut opts = ServerOptions::new(registry, [3; 32]);
    opts.reload_from = Some((path.clone(), plain.to_owned()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(gateway_server::serve(listener, opts, async {
        let _ = stopped.await;
    }));
    let ping = || json!({"jsonrpc":"2.0","id":1,"method":"ping"});
    let ask = |token: Option<String>| {
        let resource = resource.clone();
        async move {
            let mut c = McpClient::connect(TokioConnect, &resource).await.unwrap();
            c.set_bearer_token(token);
            let (status, _, _) = c
                .post_raw(ping().to_string().into_bytes(), &[])
                .await
                .unwrap();
            status
        }
    };
    let metadata = format!("http://{addr}/.well-known/oauth-protected-resource/mcp");
    assert_eq!(ask(None).await, 200, "no authentication yet");
    assert_eq!(get(&metadata).await.0, 404);

    // [oauth] comes in: a token is needed from the next request on, and the metadata is served.
    std::fs::write(&path, &with_oauth).unwrap();
    let until = |want: u16| {
        let ask = &ask;
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while ask(None).await != want {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no reload to {want} within 10 s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    until(401).await;
    assert_eq!(get(&metadata).await.0, 200);
    let token = k1.token(&claims(&issuer.url, &resource, "mcp"));
    assert_eq!(ask(Some(token)).await, 200);

    // And goes again.
    std::fs::write(&path, plain).unwrap();
    until(200).await;
    assert_eq!(get(&metadata).await.0, 404);

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("stopped")
        .expect("no panic")
        .expect("serve returned Ok");
    let _ = std::fs::remove_dir_all(&dir);
}
