//! The stdio bridge against the real gateway and emulated sleds over loopback, with in-memory
//! pipes as the client's stdin and stdout.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use gateway_core::{ProjectSpec, Registry};
use gateway_server::stdio::{bridge, bridge_with, BridgeError, BridgeOptions};
use gateway_server::{serve, ServerOptions};
use serde_json::{json, Value};
use sled_sim::{Fleet, McpClient, SledOptions, TokioConnect};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Bounds a step of a test, so a hang fails instead of blocking CI.
async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("step did not finish within 20 s")
}

/// A gateway for alpha and beta (default alpha) on a loopback port.
struct Gateway {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Gateway {
    async fn start() -> Gateway {
        Gateway::start_on("127.0.0.1:0".parse().unwrap(), 3).await
    }

    async fn start_on(addr: SocketAddr, seed: u8) -> Gateway {
        let registry = Registry::from_projects(
            vec![
                ProjectSpec::new("alpha", "http://127.0.0.1:9101"),
                ProjectSpec::new("beta", "http://127.0.0.1:9102"),
            ],
            Some("alpha"),
        )
        .unwrap()
        .allowing_unauthenticated_uplinks();
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let mut opts = ServerOptions::new(registry, [seed; 32]);
        opts.shutdown_grace = Duration::from_millis(500);
        let task = tokio::spawn(serve(listener, opts, async {
            let _ = stopped.await;
        }));
        Gateway {
            addr,
            stop: Some(stop),
            task,
        }
    }

    fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    fn fleet(&self, latency: Duration) -> Fleet {
        let names = vec!["alpha".to_owned(), "beta".to_owned()];
        let opts = SledOptions {
            latency,
            ..SledOptions::default()
        };
        Fleet::spawn(&format!("http://{}", self.addr), &names, opts)
    }

    /// Waits until alpha and beta are live and alpha's tools are listed.
    async fn wait_live(&self) {
        let mut c = McpClient::connect(TokioConnect, &self.mcp_url())
            .await
            .unwrap();
        within(async {
            loop {
                let r = c
                    .tools_call(json!(0), "list_projects", json!({}))
                    .await
                    .unwrap();
                let live = r["result"]["structuredContent"]["projects"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|p| p["live"] == true)
                    .count();
                if live == 2 {
                    let tools = c.tools_list(json!(1), None).await.unwrap();
                    let listed = tools["result"]["tools"].as_array().unwrap().len();
                    if listed > gateway_core::GATEWAY_TOOLS.len() {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        within(self.task).await.unwrap().unwrap();
    }
}

/// The client's side of a bridge: its stdin and stdout.
struct Client {
    stdin: Option<DuplexStream>,
    stdout: Lines<BufReader<DuplexStream>>,
    bridge: JoinHandle<Result<(), BridgeError>>,
}

impl Client {
    fn start(url: &str) -> Client {
        Client::start_with(url, BridgeOptions::default())
    }

    fn start_with(url: &str, opts: BridgeOptions) -> Client {
        let (stdin, bridge_in) = tokio::io::duplex(1 << 16);
        let (bridge_out, stdout) = tokio::io::duplex(1 << 16);
        let url = url.to_owned();
        let bridge = tokio::spawn(async move {
            bridge_with(
                TokioConnect,
                &url,
                BufReader::new(bridge_in),
                bridge_out,
                opts,
            )
            .await
        });
        Client {
            stdin: Some(stdin),
            stdout: BufReader::new(stdout).lines(),
            bridge,
        }
    }

    async fn send(&mut self, message: Value) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        let mut line = message.to_string();
        line.push('\n');
        stdin.write_all(line.as_bytes()).await.unwrap();
    }

    /// The next line of output, as JSON.
    async fn recv(&mut self) -> Value {
        let line = within(self.stdout.next_line())
            .await
            .unwrap()
            .expect("the output ended");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// Sends a request and returns the next line, which must be its response.
    async fn call(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let r = self.recv().await;
        assert_eq!(r["id"], id, "expected the response to {id} next: {r}");
        r
    }

    async fn initialize(&mut self, id: i64) -> Value {
        let r = self
            .call(
                id,
                "initialize",
                json!({
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "stdio-test", "version": "0"},
                }),
            )
            .await;
        assert_eq!(r["result"]["protocolVersion"], "2025-11-25", "{r}");
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        r
    }

    /// Closes stdin; the bridge must return Ok and close stdout.
    async fn finish(mut self) {
        self.stdin.take();
        within(self.bridge).await.unwrap().unwrap();
        assert_eq!(within(self.stdout.next_line()).await.unwrap(), None);
    }
}

fn structured(r: &Value) -> &Value {
    assert!(r.get("error").is_none(), "unexpected error: {r}");
    assert_ne!(r["result"]["isError"], true, "tool error: {r}");
    &r["result"]["structuredContent"]
}

#[tokio::test]
async fn a_session_through_the_bridge() {
    let gw = Gateway::start().await;
    let fleet = gw.fleet(Duration::ZERO);
    gw.wait_live().await;
    let mut c = Client::start(&gw.mcp_url());

    c.initialize(1).await;
    // notifications/initialized wrote nothing: the next line is the ping's answer.
    let r = c.call(2, "ping", json!({})).await;
    assert_eq!(r["result"], json!({}));

    // tools/list: the gateway's tools, then alpha's with `project` injected.
    let r = c.call(3, "tools/list", json!({})).await;
    let tools = r["result"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    let gateway_tools = gateway_core::GATEWAY_TOOLS.len();
    assert_eq!(names[..gateway_tools], *gateway_core::GATEWAY_TOOLS);
    assert!(names.contains(&"create_story"), "{names:?}");
    assert!(tools.len() >= 14, "{names:?}");
    assert_eq!(
        tools[gateway_tools]["inputSchema"]["properties"]["project"]["type"],
        "string"
    );

    // A per-call project.
    let r = c
        .call(
            4,
            "tools/call",
            json!({"name": "whoami", "arguments": {"project": "beta"}}),
        )
        .await;
    assert_eq!(structured(&r)["project"], "beta");

    // switch_project: its answer, and list_changed on the session's GET stream.
    c.send(json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "switch_project", "arguments": {"project": "beta"}}}))
        .await;
    let (mut answered, mut notified) = (false, false);
    while !(answered && notified) {
        let line = c.recv().await;
        if line["id"] == 5 {
            assert!(line.get("error").is_none(), "{line}");
            answered = true;
        } else {
            assert_eq!(line["method"], "notifications/tools/list_changed", "{line}");
            assert!(line.get("id").is_none(), "{line}");
            notified = true;
        }
    }
    // The session's default is now beta.
    let r = c
        .call(6, "tools/call", json!({"name": "whoami", "arguments": {}}))
        .await;
    assert_eq!(structured(&r)["project"], "beta");

    // A line that is not JSON is a parse error from the bridge; a batch is the gateway's
    // refusal, relayed (its id is null, as the request's could not be read).
    c.stdin
        .as_mut()
        .unwrap()
        .write_all(b"{not json\n")
        .await
        .unwrap();
    let r = c.recv().await;
    assert_eq!(
        (r["id"].clone(), r["error"]["code"].clone()),
        (Value::Null, json!(-32700))
    );
    c.send(json!([{"jsonrpc": "2.0", "id": 7, "method": "ping"}]))
        .await;
    let r = c.recv().await;
    assert_eq!(
        (r["id"].clone(), r["error"]["code"].clone()),
        (Value::Null, json!(-32600)),
        "{r}"
    );

    c.finish().await;
    fleet.shutdown().await;
    gw.stop().await;
}

#[tokio::test]
async fn progress_streams_and_slow_calls_do_not_block_others() {
    let gw = Gateway::start().await;
    let fleet = gw.fleet(Duration::from_millis(800));
    gw.wait_live().await;
    let mut c = Client::start(&gw.mcp_url());
    c.initialize(1).await;

    // A slow call with a progress token, then a fast one: the fast one is answered first,
    // and the slow one's progress comes before its answer, while it runs.
    c.send(
        json!({"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {
        "name": "whoami", "arguments": {"project": "beta"}, "_meta": {"progressToken": "tok"}}}),
    )
    .await;
    let sent = tokio::time::Instant::now();
    c.send(json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call",
        "params": {"name": "list_projects", "arguments": {}}}))
        .await;
    let first = c.recv().await;
    assert_eq!(first["id"], 11, "the fast call first: {first}");
    let progress = c.recv().await;
    assert_eq!(progress["method"], "notifications/progress", "{progress}");
    assert_eq!(progress["params"]["progressToken"], "tok");
    let at_progress = sent.elapsed();
    let answer = c.recv().await;
    assert_eq!(answer["id"], 10, "{answer}");
    assert_eq!(structured(&answer)["project"], "beta");
    assert!(
        sent.elapsed() >= at_progress + Duration::from_millis(200),
        "progress was relayed as it came, not with the answer ({at_progress:?}, {:?})",
        sent.elapsed()
    );

    // A slow call, then its cancellation: the cancel is not stuck behind the call, which ends
    // at once with -32800.
    c.send(
        json!({"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": {
        "name": "whoami", "arguments": {"project": "alpha"}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sent = tokio::time::Instant::now();
    c.send(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 12, "reason": "changed my mind"}}),
    )
    .await;
    let r = c.recv().await;
    assert_eq!(
        (r["id"].clone(), r["error"]["code"].clone()),
        (json!(12), json!(-32800)),
        "{r}"
    );
    assert!(
        sent.elapsed() < Duration::from_millis(600),
        "{:?}",
        sent.elapsed()
    );

    // A call in flight at the end of the input is still answered before the bridge returns.
    c.send(
        json!({"jsonrpc": "2.0", "id": 13, "method": "tools/call", "params": {
        "name": "whoami", "arguments": {"project": "alpha"}}}),
    )
    .await;
    c.stdin.take();
    let r = c.recv().await;
    assert_eq!(structured(&r)["project"], "alpha");
    c.finish().await;
    fleet.shutdown().await;
    gw.stop().await;
}

/// What a fake MCP server saw: method, session header, protocol version header, body.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(String, Option<String>, Option<String>, String)>>>;

/// A fake MCP endpoint, to see exactly what the bridge sends and how it takes odd answers:
/// `initialize` gives session `s1` and version 2025-06-18; GET is 405; method `boom` is a
/// 500 with a text body; `teapot` is a 400 whose body is the request's own JSON-RPC error;
/// notifications get 202; DELETE 204.
async fn fake_server() -> (String, Seen) {
    use axum::http::{HeaderMap, Method, StatusCode};
    use axum::response::IntoResponse;
    let seen: Seen = Seen::default();
    let log = seen.clone();
    let handler = move |method: Method, headers: HeaderMap, body: String| {
        let log = log.clone();
        async move {
            let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
            log.lock().unwrap().push((
                method.to_string(),
                header("mcp-session-id"),
                header("mcp-protocol-version"),
                body.clone(),
            ));
            let json = [("content-type", "application/json")];
            match method {
                Method::GET => return StatusCode::METHOD_NOT_ALLOWED.into_response(),
                Method::DELETE => return StatusCode::NO_CONTENT.into_response(),
                _ => {}
            }
            let msg: Value = serde_json::from_str(&body).unwrap();
            let id = msg["id"].clone();
            match msg["method"].as_str().unwrap() {
                "initialize" => (
                    [
                        ("content-type", "application/json"),
                        ("mcp-session-id", "s1"),
                    ],
                    json!({"jsonrpc": "2.0", "id": id, "result": {
                        "protocolVersion": "2025-06-18", "capabilities": {},
                        "serverInfo": {"name": "fake", "version": "0"}}})
                    .to_string(),
                )
                    .into_response(),
                "boom" => (StatusCode::INTERNAL_SERVER_ERROR, "kaput").into_response(),
                "teapot" => (
                    StatusCode::BAD_REQUEST,
                    json,
                    json!({"jsonrpc": "2.0", "id": id,
                        "error": {"code": -32602, "message": "short and stout"}})
                    .to_string(),
                )
                    .into_response(),
                _ if id.is_null() => StatusCode::ACCEPTED.into_response(),
                _ => (
                    json,
                    json!({"jsonrpc": "2.0", "id": id, "result": {}}).to_string(),
                )
                    .into_response(),
            }
        }
    };
    let app = axum::Router::new().route("/mcp", axum::routing::any(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

#[tokio::test]
async fn headers_http_errors_and_the_delete_at_eof() {
    let (url, seen) = fake_server().await;
    let mut c = Client::start(&url);
    let r = c
        .call(
            1,
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "stdio-test", "version": "0"}}),
        )
        .await;
    assert_eq!(r["result"]["protocolVersion"], "2025-06-18");
    c.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    // A 500 with a text body: an error for the request that names the status and the text.
    let r = c.call(2, "boom", json!({})).await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("HTTP 500") && message.contains("kaput"),
        "{message}"
    );
    assert_eq!(r["error"]["data"]["status"], 500);
    // A 400 whose body is the request's own JSON-RPC error: relayed as is.
    let r = c.call(3, "teapot", json!({})).await;
    assert_eq!(
        r["error"],
        json!({"code": -32602, "message": "short and stout"})
    );
    c.finish().await;

    let seen = seen.lock().unwrap().clone();
    let methods: Vec<&str> = seen.iter().map(|(m, ..)| m.as_str()).collect();
    // initialize, then the GET (405: no stream, no retry), the rest, and DELETE last.
    assert_eq!(methods[..2], ["POST", "GET"], "{seen:?}");
    assert_eq!(
        methods.iter().filter(|m| **m == "GET").count(),
        1,
        "{seen:?}"
    );
    assert_eq!(methods.last(), Some(&"DELETE"), "{seen:?}");
    assert_eq!(seen.len(), 6, "{seen:?}");
    // initialize carries no session; everything after it carries the session and the
    // negotiated version.
    assert_eq!((&seen[0].1, &seen[0].2), (&None, &None));
    for (method, session, version, body) in &seen[1..] {
        assert_eq!(session.as_deref(), Some("s1"), "{method} {body}");
        assert_eq!(version.as_deref(), Some("2025-06-18"), "{method} {body}");
    }
}

#[tokio::test]
async fn a_gateway_restart_means_a_new_session() {
    let gw = Gateway::start().await;
    let addr = gw.addr;
    let url = gw.mcp_url();
    let mut c = Client::start_with(
        &url,
        BridgeOptions {
            stream_backoff: Duration::from_millis(50),
            ..BridgeOptions::default()
        },
    );
    c.initialize(1).await;
    let r = c.call(2, "ping", json!({})).await;
    assert_eq!(r["result"], json!({}));

    // The gateway restarts (a new seed: new session ids); the old session is unknown there.
    gw.stop().await;
    let gw = Gateway::start_on(addr, 4).await;
    let r = c.call(3, "tools/list", json!({})).await;
    assert_eq!(r["error"]["code"], -32603, "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("session is gone") && message.contains("initialize again"),
        "{message}"
    );
    // Until the client initializes again, requests get the same answer (never served
    // without the session the client thinks it has).
    let r = c.call(4, "ping", json!({})).await;
    assert_eq!(r["error"]["data"]["kind"], "session_gone", "{r}");
    c.initialize(5).await;
    let r = c.call(6, "tools/list", json!({})).await;
    assert!(r["result"]["tools"].is_array(), "{r}");
    c.finish().await;
    gw.stop().await;
}

#[tokio::test]
async fn an_unreachable_gateway_is_named_with_its_flag() {
    // A port where nothing listens.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    drop(listener);
    let mut c = Client::start(&url);
    c.send(
        json!({"jsonrpc": "2.0", "id": "a", "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "stdio-test", "version": "0"}}}),
    )
    .await;
    let r = c.recv().await;
    assert_eq!(r["id"], "a");
    assert_eq!(r["error"]["code"], -32603);
    let message = r["error"]["message"].as_str().unwrap();
    assert_eq!(
        message,
        format!("cannot reach the MCP gateway at {url} (from --url): connection refused")
    );
    // A notification that cannot be delivered writes nothing; the next request is answered.
    c.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    let r = c.call(2, "ping", json!({})).await;
    assert!(
        r["error"]["message"].as_str().unwrap().contains(&url),
        "{r}"
    );
    c.finish().await;
}

#[tokio::test]
async fn a_bad_url_is_refused_naming_the_flag() {
    let (_stdin, input) = tokio::io::duplex(64);
    let (output, _stdout) = tokio::io::duplex(64);
    let e = bridge("127.0.0.1:7878/mcp", BufReader::new(input), output)
        .await
        .unwrap_err();
    assert!(matches!(e, BridgeError::Url { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "invalid --url \"127.0.0.1:7878/mcp\": expected http://host:port or https://host:port"
    );
}

/// A 2026-07-28 request: version and capabilities in `_meta`, no session.
fn stateless(id: i64, method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

#[tokio::test]
async fn a_stateless_era_client_through_the_bridge() {
    let gw = Gateway::start().await;
    let fleet = gw.fleet(Duration::from_millis(800));
    gw.wait_live().await;
    let mut c = Client::start(&gw.mcp_url());

    // The bridge mirrors the body into the era's headers, so the gateway serves the era:
    // one tools/list for everyone, without switch_project.
    c.send(stateless(1, "tools/list", json!({}))).await;
    let r = c.recv().await;
    assert_eq!(r["id"], 1, "{r}");
    assert_eq!(r["result"]["tools"][0]["name"], "list_projects", "{r}");
    c.send(stateless(
        2,
        "tools/call",
        json!({"name": "whoami", "arguments": {"project": "beta"}}),
    ))
    .await;
    let r = c.recv().await;
    assert_eq!(structured(&r)["project"], "beta");

    // This era cancels by closing the response: the bridge does that for the client's
    // notifications/cancelled, and the call is never answered.
    c.send(stateless(
        3,
        "tools/call",
        json!({"name": "whoami", "arguments": {"project": "alpha"}}),
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.send(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 3}}),
    )
    .await;
    c.send(stateless(4, "tools/list", json!({}))).await;
    let r = c.recv().await;
    assert_eq!(r["id"], 4, "{r}");
    // Long enough for the cancelled call to have been answered, had it not been.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    c.send(stateless(5, "tools/list", json!({}))).await;
    let r = c.recv().await;
    assert_eq!(r["id"], 5, "nothing for the cancelled call: {r}");
    c.finish().await;
    fleet.shutdown().await;
    gw.stop().await;
}
