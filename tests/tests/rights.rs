//! Per-project rights (`[[access]]` in projects.toml, issue 17) over loopback sockets, with
//! real access tokens: the gateway is an OAuth resource server (`[oauth]`), its rules name the
//! tokens' subject, client id and group, and every check is made on what the verified token
//! says.
//!
//! - Tokens signed here (an issuer of the tests' own, `support/oauth.rs`): a token with `read`
//!   on alpha reads alpha, is refused writing it (`forbidden`, typed, before the slow sled could
//!   have answered, nothing sent) and reading beta or gamma (answered exactly as a project that
//!   is not registered); `tools/list`, `list_projects` and `gateway_health` show it alpha only;
//!   one audit line per forwarded call and per refusal, naming the principal, never a token.
//! - A reload of projects.toml that changes the rules applies to the next request.
//! - npm's `oidc-provider` issues client-credentials tokens (with a `groups` claim for
//!   `reader-agent`), and the Python SDK works within its rights and is refused outside them
//!   (`tests/clients/python_rights_client.py`).
//!
//! The audit lines are read from this binary's own log subscriber (`init_logs`), which every
//! test installs first: the gateway runs in-process.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use gateway_core::Registry;
use gateway_server::oauth::OAuthOptions;
use gateway_server::ServerOptions;
use serde_json::{json, Value};
use sled_sim::{Fleet, McpClient, SledOptions, TokioConnect};

#[path = "support/node.rs"]
mod node;
#[path = "support/oauth.rs"]
mod oauth;
#[path = "support/python.rs"]
mod python;

use oauth::{now, Provider, TestIssuer, TestKey, OPS_AGENT, READER_AGENT};

// ---- the log, and the audit lines in it ----

/// Every log line of target `audit` at info, as JSON, from every test of this binary.
#[derive(Clone, Default)]
struct AuditLog(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for AuditLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl AuditLog {
    /// The lines so far, each one JSON object (`fields` holds the line's fields).
    fn lines(&self) -> Vec<Value> {
        let raw = self.0.lock().expect("not poisoned").clone();
        String::from_utf8(raw)
            .expect("log lines are UTF-8")
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON log line"))
            .collect()
    }

    /// The raw text so far.
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().expect("not poisoned").clone()).expect("UTF-8")
    }

    /// The fields of the lines whose `principal` is `principal`.
    fn of(&self, principal: &str) -> Vec<Value> {
        self.lines()
            .into_iter()
            .map(|l| l["fields"].clone())
            .filter(|f| f["principal"] == principal)
            .collect()
    }
}

/// Installs this binary's log subscriber, once: the usual test output (`RUST_LOG`, default
/// warnings) and, whatever `RUST_LOG` says, the audit lines into the returned log.
fn init_logs() -> AuditLog {
    static LOG: OnceLock<AuditLog> = OnceLock::new();
    LOG.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        use tracing_subscriber::Layer as _;
        let log = AuditLog::default();
        let writer = log.clone();
        let usual = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_test_writer()
                    .with_filter(usual),
            )
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(move || writer.clone())
                    .with_filter(
                        tracing_subscriber::filter::Targets::new()
                            .with_target("audit", tracing::Level::INFO),
                    ),
            )
            .try_init()
            .expect("this binary's tests install the only log subscriber");
        log
    })
    .clone()
}

// ---- the gateway under test ----

/// The fleet: alpha and beta serve the story model, gamma the conformance fixture (whose tools,
/// `test_*`, no story sled has).
const PROJECTS: [&str; 3] = ["alpha", "beta", "gamma"];

/// projects.toml: alpha (the default), beta, gamma, `[oauth]` for `resource` and `issuer`, and
/// `rules`.
fn projects_toml(resource: &str, issuer: &str, rules: &str) -> String {
    format!(
        r#"default = "alpha"
allow_unauthenticated_uplinks = true

[[project]]
name = "alpha"
url = "http://127.0.0.1:9101"
trust_read_only_hints = true

[[project]]
name = "beta"
url = "http://127.0.0.1:9102"
trust_read_only_hints = true

[[project]]
name = "gamma"
url = "http://127.0.0.1:9103"
trust_read_only_hints = true

[oauth]
resource = "{resource}"
authorization_servers = ["{issuer}"]
required_scopes = ["mcp"]

{rules}"#
    )
}

/// The real gateway serving a projects.toml it reloads (written to a directory of its own),
/// and a sled per project.
struct RightsGateway {
    /// `http://<addr>/mcp`: the endpoint, and the resource URI.
    resource: String,
    dir: PathBuf,
    fleet: Fleet,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl RightsGateway {
    /// Serves `text` on `listener` (whose address `text`'s resource names).
    async fn start(
        name: &str,
        listener: tokio::net::TcpListener,
        text: &str,
        sleds: SledOptions,
    ) -> RightsGateway {
        let addr = listener.local_addr().expect("bound");
        let dir =
            std::env::temp_dir().join(format!("gateway-rights-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let path = dir.join("projects.toml");
        std::fs::write(&path, text).expect("projects.toml is written");
        let registry = Registry::parse("projects.toml", text).expect("a valid projects.toml");
        let mut opts = ServerOptions::new(registry, [11; 32]);
        opts.reload_from = Some((path, text.to_owned()));
        opts.oauth = OAuthOptions {
            jwks_cooldown: Duration::from_millis(400),
            ..OAuthOptions::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(gateway_server::serve(listener, opts, async {
            let _ = stopped.await;
        }));
        let names: Vec<String> = PROJECTS.iter().map(|p| (*p).to_owned()).collect();
        let fleet = Fleet::spawn(
            &format!("http://{addr}"),
            &names,
            SledOptions {
                fixture_projects: vec!["gamma".into()],
                ..sleds
            },
        );
        RightsGateway {
            resource: format!("http://{addr}/mcp"),
            dir,
            fleet,
            stop,
            server,
        }
    }

    /// Replaces projects.toml at once (the gateway reads it again within 2 s): written beside
    /// it and renamed over it, so the gateway never reads half a file.
    fn rewrite(&self, text: &str) {
        let next = self.dir.join("projects.toml.next");
        std::fs::write(&next, text).expect("projects.toml is written");
        std::fs::rename(&next, self.dir.join("projects.toml")).expect("and put in place");
    }

    /// Waits (at most 15 s) until every sled is live and every project's tools are listed, as
    /// seen by `token`, which must have a right on every project.
    async fn wait_live(&self, token: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        // Each project's own tools, by a session switched to it: the stateless list is a union
        // in which one project's tools stand for another's (alpha's and beta's have the same
        // names), so it cannot tell that each sled's list has arrived.
        let mut c = self.session(token).await;
        loop {
            let (_, listed) = self
                .post(Some(token), tool("list_projects", json!({})))
                .await;
            let live = listed["result"]["structuredContent"]["projects"]
                .as_array()
                .is_some_and(|ps| {
                    ps.iter().filter(|p| p["live"] == true).count() == PROJECTS.len()
                });
            let mut listed_all = live;
            for (i, project) in PROJECTS.iter().enumerate() {
                if !listed_all {
                    break;
                }
                let id = json!(1000 + i);
                c.tools_call(id.clone(), "switch_project", json!({ "project": project }))
                    .await
                    .expect("switch_project");
                let tools = tool_names(&c.tools_list(id, None).await.expect("tools/list"));
                listed_all = tools.len() > gateway_core::GATEWAY_TOOLS.len();
            }
            if listed_all {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the sleds did not come up within 15 s: {listed}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// POSTs a JSON-RPC message, sessionless, with the bearer token when given: the status and
    /// the body.
    async fn post(&self, token: Option<&str>, body: Value) -> (u16, Value) {
        let mut c = McpClient::connect(TokioConnect, &self.resource)
            .await
            .expect("the gateway is up");
        c.set_bearer_token(token.map(str::to_owned));
        let (status, _, body) = c
            .post_raw(body.to_string().into_bytes(), &[])
            .await
            .expect("an HTTP answer");
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// POSTs a request of the stateless era (2026-07-28): the JSON-RPC response.
    async fn post_stateless(&self, token: &str, mut body: Value) -> Value {
        let method = body["method"].as_str().expect("a request").to_owned();
        body["params"]["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        let mut c = McpClient::connect(TokioConnect, &self.resource)
            .await
            .expect("the gateway is up");
        c.set_bearer_token(Some(token.to_owned()));
        let (status, _, body) = c
            .post_raw(
                body.to_string().into_bytes(),
                &[
                    ("mcp-protocol-version", "2026-07-28"),
                    ("mcp-method", &method),
                ],
            )
            .await
            .expect("an HTTP answer");
        assert_eq!(status, 200);
        serde_json::from_slice(&body).expect("a JSON answer")
    }

    /// A session of the handshake era, opened with `token`.
    async fn session(&self, token: &str) -> McpClient<TokioConnect> {
        let mut c = McpClient::connect(TokioConnect, &self.resource)
            .await
            .expect("the gateway is up");
        c.set_bearer_token(Some(token.to_owned()));
        c.initialize().await.expect("initialize");
        c
    }

    async fn stop(self) {
        self.fleet.shutdown().await;
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(20), self.server)
            .await
            .expect("the gateway stopped within 20 s")
            .expect("the server task did not panic")
            .expect("serve returned Ok");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tool(name: &str, arguments: Value) -> Value {
    json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":name,"arguments":arguments}})
}

fn tools_list() -> Value {
    json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}})
}

fn tool_names(answer: &Value) -> Vec<String> {
    answer["result"]["tools"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .filter_map(|t| t["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The names `list_projects` answers with.
fn project_names(answer: &Value) -> Vec<String> {
    answer["result"]["structuredContent"]["projects"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn listed_projects(c: &mut McpClient<TokioConnect>) -> Vec<String> {
    project_names(
        &c.tools_call(json!(10), "list_projects", json!({}))
            .await
            .expect("an answer"),
    )
}

fn create_story(project: &str, name: &str) -> Value {
    json!({"name": name, "acceptance_criteria": [], "project": project})
}

/// Whether `project`'s story sled holds a story named `name`.
fn has_story(fleet: &Fleet, project: &str, name: &str) -> bool {
    fleet
        .sled(project)
        .expect("a story sled")
        .with(|s| s.project().iter().any(|st| st.name == name))
}

// ---- an issuer of the tests' own ----

/// Claims of an access token for `resource` from `issuer`, with the scope `mcp`.
fn claims(issuer: &str, resource: &str, sub: &str, client_id: &str, groups: &[&str]) -> Value {
    json!({
        "iss": issuer, "sub": sub, "aud": resource, "client_id": client_id,
        "iat": now(), "exp": now() + 600, "scope": "mcp", "groups": groups,
    })
}

/// The rules of the tests with tokens signed here: `ops` may do everything, the client
/// `reader-bot` read alpha, the subject `writer-1` write beta.
const RULES: &str = r#"
[[access]]
group = "ops"
projects = ["*"]
right = "admin"

[[access]]
client_id = "reader-bot"
projects = ["alpha"]
right = "read"

[[access]]
subject = "writer-1"
projects = ["beta"]
right = "write"
"#;

/// Three tokens from `issuer` for `resource`: ops (group `ops`), the reader (client
/// `reader-bot`) and the writer (subject `writer-1`).
fn tokens(key: &TestKey, issuer: &str, resource: &str) -> [String; 3] {
    [
        key.token(&claims(issuer, resource, "ops-1", "ops-console", &["ops"])),
        key.token(&claims(
            issuer,
            resource,
            "agent-r",
            "reader-bot",
            &["staff"],
        )),
        key.token(&claims(issuer, resource, "writer-1", "w-bot", &[])),
    ]
}

// ---- the tests ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_has_the_rights_its_claims_give_and_no_more() {
    let audit = init_logs();
    let key = TestKey::new("k1", 21);
    let issuer = TestIssuer::start(&[&key]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let resource = format!("http://{}/mcp", listener.local_addr().expect("bound"));
    // alpha's sled is slow: a call that reached it could not be answered in under a second.
    let slow = Duration::from_secs(1);
    let gw = RightsGateway::start(
        "claims",
        listener,
        &projects_toml(&resource, &issuer.url, RULES),
        SledOptions {
            latency_overrides: [("alpha".to_owned(), slow)].into(),
            ..SledOptions::default()
        },
    )
    .await;
    let [ops, reader, writer] = tokens(&key, &issuer.url, &resource);
    gw.wait_live(&ops).await;

    // The reader, in a session: alpha is all there is.
    let mut c = gw.session(&reader).await;
    assert_eq!(listed_projects(&mut c).await, ["alpha"]);
    let tools = tool_names(&c.tools_list(json!(2), None).await.expect("tools/list"));
    assert!(
        ["list_projects", "whoami", "create_story"]
            .iter()
            .all(|t| tools.iter().any(|x| x == t)),
        "{tools:?}"
    );

    // It reads alpha: a tool the sled annotates readOnlyHint, in a trace.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let r = c
        .request(
            json!(3),
            "tools/call",
            json!({"name":"whoami","arguments":{},"_meta":{
                "traceparent": format!("00-{trace_id}-00f067aa0ba902b7-01")}}),
        )
        .await
        .expect("an answer");
    assert_eq!(r["result"]["structuredContent"]["project"], "alpha", "{r}");

    // It may not write alpha: refused at once, typed, naming the project and the right, and
    // nothing reaches the sled.
    let started = tokio::time::Instant::now();
    let r = c
        .tools_call(
            json!(4),
            "create_story",
            create_story("alpha", "by the reader"),
        )
        .await
        .expect("an answer");
    let took = started.elapsed();
    assert_eq!(r["error"]["code"], -32000, "{r}");
    assert_eq!(r["error"]["data"]["kind"], "forbidden");
    assert_eq!(r["error"]["data"]["project"], "alpha");
    assert_eq!(r["error"]["data"]["right"], "write");
    assert!(took < slow / 2, "the refusal took {took:?}");
    assert!(!has_story(&gw.fleet, "alpha", "by the reader"));

    // beta and gamma are answered exactly as a project that is not registered.
    let zeta = c
        .tools_call(json!(5), "whoami", json!({"project":"zeta"}))
        .await
        .expect("an answer");
    assert_eq!(zeta["error"]["data"]["kind"], "unknown_project", "{zeta}");
    assert_eq!(zeta["error"]["data"]["registered"], json!(["alpha"]));
    for hidden in ["beta", "gamma"] {
        let r = c
            .tools_call(json!(5), "whoami", json!({ "project": hidden }))
            .await
            .expect("an answer");
        let as_unknown = zeta.to_string().replace("zeta", hidden);
        assert_eq!(r.to_string(), as_unknown, "{hidden}");
    }
    let r = c
        .tools_call(json!(6), "switch_project", json!({"project":"beta"}))
        .await
        .expect("an answer");
    assert_eq!(r["error"]["data"]["kind"], "unknown_project", "{r}");
    let (_, health) = gw
        .post(Some(&reader), tool("gateway_health", json!({})))
        .await;
    let health = health.to_string();
    assert!(
        health.contains("alpha") && !health.contains("beta") && !health.contains("gamma"),
        "{health}"
    );

    // The stateless tools/list is every visible project's tools: the reader's has none of
    // gamma's, which ops sees.
    let reader_tools = tool_names(&gw.post_stateless(&reader, tools_list()).await);
    let ops_tools = tool_names(&gw.post_stateless(&ops, tools_list()).await);
    assert!(
        reader_tools.iter().any(|t| t == "whoami"),
        "{reader_tools:?}"
    );
    assert!(
        !reader_tools.iter().any(|t| t.starts_with("test_")),
        "{reader_tools:?}"
    );
    assert!(
        ops_tools.iter().any(|t| t == "test_simple_text"),
        "{ops_tools:?}"
    );

    // The writer (by subject) writes beta, and alpha is not there for it.
    let (_, r) = gw
        .post(
            Some(&writer),
            tool("create_story", create_story("beta", "by the writer")),
        )
        .await;
    assert!(
        r["result"]["structuredContent"]["story"]["id"].is_string(),
        "{r}"
    );
    assert!(has_story(&gw.fleet, "beta", "by the writer"));
    let (_, r) = gw
        .post(Some(&writer), tool("whoami", json!({"project":"alpha"})))
        .await;
    assert_eq!(r["error"]["data"]["kind"], "unknown_project", "{r}");
    assert_eq!(r["error"]["data"]["registered"], json!(["beta"]));

    // The audit lines: one per forwarded call and per refusal, naming the principal, the
    // project, the tool, the outcome and the trace; never a token.
    let lines = audit.of("oauth:agent-r client:reader-bot");
    let read = lines
        .iter()
        .find(|l| l["tool"] == "whoami" && l["project"] == "alpha")
        .unwrap_or_else(|| panic!("an audit line for the read: {lines:?}"));
    assert_eq!(read["outcome"], "ok", "{read}");
    assert_eq!(read["trace_id"], trace_id, "{read}");
    let refusal = lines
        .iter()
        .find(|l| l["outcome"] == "forbidden")
        .unwrap_or_else(|| panic!("an audit line for the refusal: {lines:?}"));
    assert_eq!(refusal["project"], "alpha", "{refusal}");
    assert_eq!(refusal["right"], "write", "{refusal}");
    assert!(
        lines.iter().all(|l| l["project"] == "alpha"),
        "the reader's hidden projects are never touched: {lines:?}"
    );
    let writes = audit.of("oauth:writer-1 client:w-bot");
    assert!(
        writes
            .iter()
            .any(|l| (&l["project"], &l["tool"], &l["outcome"])
                == (&json!("beta"), &json!("create_story"), &json!("ok"))),
        "{writes:?}"
    );
    let text = audit.text();
    for token in [&ops, &reader, &writer] {
        let signature = token.rsplit('.').next().expect("a signature");
        assert!(!text.contains(signature), "a token in the audit log");
    }

    c.delete_session().await.expect("the session ends");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_of_the_rules_applies_to_the_next_request() {
    init_logs();
    let key = TestKey::new("k1", 22);
    let issuer = TestIssuer::start(&[&key]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let resource = format!("http://{}/mcp", listener.local_addr().expect("bound"));
    let before = projects_toml(&resource, &issuer.url, RULES);
    let gw = RightsGateway::start("reload", listener, &before, SledOptions::default()).await;
    let [ops, reader, _] = tokens(&key, &issuer.url, &resource);
    gw.wait_live(&ops).await;
    let mut c = gw.session(&reader).await;
    assert_eq!(listed_projects(&mut c).await, ["alpha"]);

    // The reader's rule becomes write on alpha and read on beta.
    let after = projects_toml(
        &resource,
        &issuer.url,
        &RULES.replace(
            "client_id = \"reader-bot\"\nprojects = [\"alpha\"]\nright = \"read\"",
            "client_id = \"reader-bot\"\nprojects = [\"alpha\"]\nright = \"write\"\n\n[[access]]\nclient_id = \"reader-bot\"\nprojects = [\"beta\"]\nright = \"read\"",
        ),
    );
    assert_ne!(after, before);
    // Each rewrite: once one request sees the new rules, every request after it does, in the
    // same session (which lives through it).
    for (text, visible, may_write_alpha) in [
        (&after, vec!["alpha", "beta"], true),
        (&before, vec!["alpha"], false),
    ] {
        gw.rewrite(text);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while listed_projects(&mut c).await != visible {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the new rules never applied"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let name = format!("after the reload to {visible:?}");
        let w = c
            .tools_call(json!(1), "create_story", create_story("alpha", &name))
            .await
            .expect("an answer");
        let r = c
            .tools_call(json!(2), "whoami", json!({"project":"beta"}))
            .await
            .expect("an answer");
        if may_write_alpha {
            assert!(
                w["result"]["structuredContent"]["story"]["id"].is_string(),
                "{w}"
            );
            assert!(has_story(&gw.fleet, "alpha", &name));
            assert_eq!(r["result"]["structuredContent"]["project"], "beta", "{r}");
        } else {
            assert_eq!(w["error"]["data"]["kind"], "forbidden", "{w}");
            assert!(!has_story(&gw.fleet, "alpha", &name));
            assert_eq!(r["error"]["data"]["kind"], "unknown_project", "{r}");
        }
        assert_eq!(listed_projects(&mut c).await, visible);
    }
    gw.stop().await;
}

const OTHER_RESOURCE: &str = "https://other.example.com/mcp";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_works_within_its_rights_with_a_real_providers_token() {
    let audit = init_logs();
    let python = python::python_with_sdk().await;
    // The provider must know the gateway's resource and the gateway its issuer: the port is
    // bound first, the provider started for it, then the gateway served on it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let resource = format!("http://{}/mcp", listener.local_addr().expect("bound"));
    let provider = Provider::start(&resource, OTHER_RESOURCE).await;
    // reader-agent: read on alpha through its token's group, write on beta through its client
    // id, nothing on gamma.
    let rules = r#"
[[access]]
client_id = "ops-agent"
projects = ["*"]
right = "admin"

[[access]]
group = "readers"
projects = ["alpha"]
right = "read"

[[access]]
client_id = "reader-agent"
projects = ["beta"]
right = "write"
"#;
    let gw = RightsGateway::start(
        "python",
        listener,
        &projects_toml(&resource, &provider.issuer, rules),
        SledOptions::default(),
    )
    .await;
    gw.wait_live(&provider.access_token(OPS_AGENT, &resource, "mcp").await)
        .await;
    let token = provider.access_token(READER_AGENT, &resource, "mcp").await;
    let claims = oauth::jwt_part(&token, 1);
    assert_eq!(
        (&claims["client_id"], &claims["groups"]),
        (&json!("reader-agent"), &json!(["readers"])),
        "{claims}"
    );

    python::run_checks(
        &python,
        "python_rights_client.py",
        &[&resource, &provider.issuer, READER_AGENT.0, READER_AGENT.1],
    )
    .await;

    // What the SDK did, as the sleds and the audit log saw it.
    for era in ["legacy", "2026-07-28"] {
        let name = format!("written by the python rights client ({era})");
        assert!(has_story(&gw.fleet, "beta", &name), "{era}");
        assert!(!has_story(&gw.fleet, "alpha", &name), "{era}");
    }
    let lines = audit.of("oauth:reader-agent client:reader-agent");
    let count = |project: &str, tool: &str, outcome: &str| {
        lines
            .iter()
            .filter(|l| {
                l["project"] == project
                    && (l["tool"] == tool || l["what"].as_str().is_some_and(|w| w.ends_with(tool)))
                    && l["outcome"] == outcome
            })
            .count()
    };
    assert_eq!(count("beta", "create_story", "ok"), 2, "{lines:?}");
    assert_eq!(count("alpha", "create_story", "forbidden"), 2, "{lines:?}");
    assert!(count("alpha", "whoami", "ok") >= 2, "{lines:?}");
    assert!(
        lines.iter().all(|l| l["project"] != "gamma"),
        "gamma is never touched: {lines:?}"
    );

    gw.stop().await;
    provider.stop().await;
}
