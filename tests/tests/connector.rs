//! `gateway-sled` (issue 26) with an MCP server nobody here wrote: npm's
//! `@modelcontextprotocol/server-everything`, run by the connector as a child over stdio and
//! reached through a real gateway, over a real uplink with a token and an identity key.
//!
//! - Everything it lists is listed by the gateway with `project` injected, and its tools,
//!   prompts, completion, resources and logging level answer through the gateway; its
//!   long-running operation's progress reaches the caller; its own sampling and elicitation
//!   requests reach the calling client, and the client's answers reach it; the log messages
//!   it sends of its own accord reach the session's own stream.
//! - The same over Streamable HTTP: server-everything as its own process, the connector its
//!   client at a URL.
//! - A child killed during a call: the call is answered at once (`upstream_exited`, outcome
//!   unknown), a call meanwhile is refused at once (`upstream_down`), and the child is started
//!   again and serves. A server at a URL that goes away: the call in flight is answered at once
//!   (`upstream_unreachable`), calls meanwhile are refused, and a new session is made once it
//!   is back.
//! - A child that writes what is not JSON-RPC (lines that are not JSON, answers to ids never
//!   asked): each is logged and skipped, and calls go on.
//! - npm's `@modelcontextprotocol/server-memory`, which knows nothing of leases and names the
//!   entities it writes inside arrays, with the lease config `examples/sleds.toml` ships: two
//!   sessions writing one entity are kept apart, and the holder's fenced writes go through.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use sled_sim::{McpClient, TokioConnect};
use tokio::process::{Child, Command};

#[path = "support/node.rs"]
mod node;
#[path = "support/processes.rs"]
mod processes;
#[path = "support/python.rs"]
mod python;

/// The MCP servers the tests run, pinned.
const SERVERS: [(&str, &str); 1] = [("@modelcontextprotocol/server-everything", "2026.8.31")];

const TOKEN: &str = "everything-uplink-token-0123";

fn projects_toml() -> String {
    format!(
        "default = \"everything\"\n[[project]]\nname = \"everything\"\nurl = \"http://127.0.0.1:9\"\ntoken = \"{TOKEN}\"\n\
         call_timeout_ms = 60000\n"
    )
}

/// Node and server-everything's stdio entry point.
async fn everything_command() -> Vec<String> {
    let node = node::node().await;
    let dir = node::packages("servers", &SERVERS).await;
    let entry = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    vec![
        node.node.display().to_string(),
        entry.display().to_string(),
        "stdio".into(),
    ]
}

/// `gateway-sled` for project `everything` of the gateway at `url`, serving the server that
/// `upstream` names (`--` and a command, or `--url` and a URL); its token from a file, its
/// key in `dir`, its log in `dir/sled.log`.
fn connector(url: &str, dir: &Path, upstream: &[String]) -> Child {
    connector_for("everything", url, dir, upstream)
}

/// [`connector`] for `project` (whose uplink token is also [`TOKEN`]).
fn connector_for(project: &str, url: &str, dir: &Path, upstream: &[String]) -> Child {
    let token = dir.join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let log = std::fs::File::create(dir.join("sled.log")).unwrap();
    Command::new(processes::workspace_bin("gateway-sled"))
        .args(["--gateway", url, "--project", project, "--token-file"])
        .arg(&token)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(upstream)
        .env("RUST_LOG", "info,gateway_connector=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("gateway-sled starts")
}

async fn session(url: &str) -> McpClient<TokioConnect> {
    let mut c = McpClient::connect(TokioConnect, &format!("{url}/mcp"))
        .await
        .unwrap();
    c.set_timeout(Some(Duration::from_secs(30)));
    c.initialize().await.unwrap();
    c
}

/// Calls `echo` until the server answers and the gateway lists its tools to this session
/// (whose default project is `everything`), within 60 s.
async fn until_served(c: &mut McpClient<TokioConnect>, log: &Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let r = c
            .tools_call(
                json!("ready"),
                "echo",
                json!({"project": "everything", "message": "ready?"}),
            )
            .await
            .unwrap();
        // Served, and listed: a call can reach the server before the gateway has its tools
        // (the first listing may find it starting), and tools/list shows them only after.
        if r["result"]["content"][0]["text"] == "Echo: ready?" {
            let listed = c.tools_list(json!("listed?"), None).await.unwrap();
            let tools = listed["result"]["tools"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if tools.iter().any(|t| t["name"] == "echo") {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "server-everything never answered through the gateway: {r}\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `--` and `command`: a stdio server for [`connector`].
fn stdio(command: Vec<String>) -> Vec<String> {
    std::iter::once("--".to_owned()).chain(command).collect()
}

/// server-everything over Streamable HTTP on `port`, as its own process.
async fn everything_http(port: u16, dir: &Path) -> Child {
    let command = everything_command().await;
    let log = std::fs::File::create(dir.join("server.log")).unwrap();
    let child = Command::new(&command[0])
        .arg(&command[1])
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("server-everything starts");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "server-everything did not listen on {port}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child
}

fn text(r: &Value) -> &str {
    r["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {r}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_stdio_is_a_project_of_the_gateway() {
    let command = everything_command().await;
    let gw = processes::SingleGateway::start(&projects_toml()).await;
    let dir = processes::scratch("connector");
    // The child's environment from the command line (`--env`), and its working directory.
    let mut upstream = vec![
        "--env".to_owned(),
        "GATEWAY_SLED_CHECK=set-by-the-connector".to_owned(),
        "--cwd".to_owned(),
        dir.display().to_string(),
    ];
    upstream.extend(stdio(command));
    let _sled = connector(&gw.url(), &dir, &upstream);
    everything_through_the_gateway(&gw.url(), &dir).await;
    let mut c = session(&gw.url()).await;
    let env = c
        .tools_call(json!(1), "get-env", json!({"project": "everything"}))
        .await
        .unwrap();
    assert!(
        text(&env).contains("\"GATEWAY_SLED_CHECK\": \"set-by-the-connector\""),
        "{env}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_streamable_http_is_a_project_of_the_gateway() {
    let gw = processes::SingleGateway::start(&projects_toml()).await;
    let dir = processes::scratch("connector-http");
    let port = processes::free_port();
    let _server = everything_http(port, &dir).await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let _sled = connector(&gw.url(), &dir, &["--url".to_owned(), url]);
    everything_through_the_gateway(&gw.url(), &dir).await;
}

/// What a client of the gateway at `url` finds of server-everything, behind the connector
/// logging to `dir/sled.log`.
async fn everything_through_the_gateway(url: &str, dir: &Path) {
    let mut c = session(url).await;
    until_served(&mut c, &dir.join("sled.log")).await;

    // Its tools, listed as the session's default project's: each with `project` injected.
    let switched = c
        .tools_call(json!(1), "switch_project", json!({"project": "everything"}))
        .await
        .unwrap();
    assert_eq!(
        switched["result"]["structuredContent"]["live"], true,
        "{switched}"
    );
    let listed = c.tools_list(json!(2), None).await.unwrap();
    let tools = listed["result"]["tools"].as_array().unwrap();
    for name in [
        "echo",
        "get-sum",
        "trigger-long-running-operation",
        "get-env",
    ] {
        let tool = tools
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not listed: {listed}"));
        assert_eq!(
            tool["inputSchema"]["properties"]["project"]["type"], "string",
            "{tool}"
        );
    }
    let sum = c
        .tools_call(json!(3), "get-sum", json!({"a": 2, "b": 3}))
        .await
        .unwrap();
    assert_eq!(text(&sum), "The sum of 2 and 3 is 5.");

    // Progress of its long-running operation, under the caller's own token.
    let mut progress = Vec::new();
    let (done, _) = c
        .request_streaming(
            json!(4),
            "tools/call",
            json!({"name": "trigger-long-running-operation",
                   "arguments": {"duration": 1, "steps": 3},
                   "_meta": {"progressToken": "mine"}}),
            &[],
            &mut |_| json!(null),
            &mut |n| progress.push(n.clone()),
        )
        .await
        .unwrap();
    assert!(
        text(&done).starts_with("Long running operation completed"),
        "{done}"
    );
    let steps: Vec<(Value, Value)> = progress
        .iter()
        .filter(|n| n["method"] == "notifications/progress")
        .map(|n| {
            (
                n["params"]["progressToken"].clone(),
                n["params"]["progress"].clone(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            (json!("mine"), json!(1)),
            (json!("mine"), json!(2)),
            (json!("mine"), json!(3))
        ],
        "{progress:?}"
    );

    // Prompts with arguments, completion, resources and templates, the logging level.
    let prompt = c
        .request(
            json!(5),
            "prompts/get",
            json!({"name": "args-prompt", "arguments": {"city": "Paris"}}),
        )
        .await
        .unwrap();
    assert_eq!(
        prompt["result"]["messages"][0]["content"]["text"], "What's weather in Paris?",
        "{prompt}"
    );
    let completion = c
        .request(
            json!(6),
            "completion/complete",
            json!({"ref": {"type": "ref/prompt", "name": "completable-prompt"},
                   "argument": {"name": "department", "value": "E"}}),
        )
        .await
        .unwrap();
    assert_eq!(
        completion["result"]["completion"]["values"],
        json!(["Engineering"]),
        "{completion}"
    );
    let resources = c
        .request(json!(7), "resources/list", json!({}))
        .await
        .unwrap();
    let first = resources["result"]["resources"][0]["uri"]
        .as_str()
        .unwrap_or_else(|| panic!("{resources}"))
        .to_owned();
    let read = c
        .request(json!(8), "resources/read", json!({"uri": first}))
        .await
        .unwrap();
    assert!(read["result"]["contents"][0]["text"].is_string(), "{read}");
    let templates = c
        .request(json!(9), "resources/templates/list", json!({}))
        .await
        .unwrap();
    assert!(
        !templates["result"]["resourceTemplates"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{templates}"
    );
    let level = c
        .request(json!(10), "logging/setLevel", json!({"level": "debug"}))
        .await
        .unwrap();
    assert_eq!(level["result"], json!({}), "{level}");

    // The server's own sampling and elicitation requests, answered by a client that declared
    // both, through the gateway.
    let mut asker = McpClient::connect(TokioConnect, &format!("{url}/mcp"))
        .await
        .unwrap();
    asker.set_timeout(Some(Duration::from_secs(30)));
    asker
        .initialize_with(json!({"sampling": {}, "elicitation": {}}))
        .await
        .unwrap();
    let answer = &mut |r: &Value| match r["method"].as_str() {
        Some("sampling/createMessage") => json!({"jsonrpc": "2.0", "id": r["id"], "result": {
            "role": "assistant", "model": "test-model", "stopReason": "endTurn",
            "content": {"type": "text", "text": "sampled by the test"}}}),
        _ => json!({"jsonrpc": "2.0", "id": r["id"], "result": {"action": "decline"}}),
    };
    let (sampled, asked) = asker
        .request_answering(
            json!(11),
            "tools/call",
            json!({"name": "trigger-sampling-request",
                   "arguments": {"project": "everything", "prompt": "hi", "maxTokens": 10}}),
            answer,
        )
        .await
        .unwrap();
    assert!(text(&sampled).contains("sampled by the test"), "{sampled}");
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(
        asked[0].request["params"]["messages"][0]["content"]["text"],
        "Resource trigger-sampling-request context: hi"
    );
    let (elicited, asked) = asker
        .request_answering(
            json!(12),
            "tools/call",
            json!({"name": "trigger-elicitation-request", "arguments": {"project": "everything"}}),
            answer,
        )
        .await
        .unwrap();
    assert_eq!(
        asked[0].request["method"], "elicitation/create",
        "{asked:?}"
    );
    assert!(text(&elicited).contains("declined"), "{elicited}");

    // A log message the server sends of its own accord (its simulated logging, every 5 s),
    // naming no call, reaches the session's own stream: its default project is the server's.
    let mut listener = McpClient::connect(TokioConnect, &format!("{url}/mcp"))
        .await
        .unwrap();
    listener.set_session_id(c.session_id().map(str::to_owned));
    listener.set_protocol_version(c.protocol_version().map(str::to_owned));
    let (heard, mut hear) = tokio::sync::mpsc::unbounded_channel();
    let listening = tokio::spawn(async move {
        let _ = listener
            .listen(1 << 20, &mut move |m| {
                let _ = heard.send(m);
            })
            .await;
    });
    let on = c
        .tools_call(json!(13), "toggle-simulated-logging", json!({}))
        .await
        .unwrap();
    assert!(text(&on).contains("Started"), "{on}");
    let logged = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(m) = hear.recv().await {
            if m["method"] == "notifications/message" {
                return Some(m);
            }
        }
        None
    })
    .await;
    let off = c
        .tools_call(json!(14), "toggle-simulated-logging", json!({}))
        .await
        .unwrap();
    assert!(text(&off).contains("Stopped"), "{off}");
    listening.abort();
    let logged = logged
        .ok()
        .flatten()
        .expect("the server's own log message reached the session's stream");
    assert!(
        logged["params"]["data"]
            .as_str()
            .is_some_and(|d| d.contains("message")),
        "{logged}"
    );

    // The project's identity key was made on first run, readable by its owner only.
    let key = dir.join("state/everything.key");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
}

/// The pid of `parent`'s one child.
fn child_of(parent: u32) -> u32 {
    let out = std::process::Command::new("pgrep")
        .args(["-P", &parent.to_string()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("{parent} has no child"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_mid_call_fails_its_calls_at_once_and_is_started_again() {
    let command = everything_command().await;
    let gw = processes::SingleGateway::start(&projects_toml()).await;
    let dir = processes::scratch("connector-dies");
    let sled = connector(&gw.url(), &dir, &stdio(command));
    let log = dir.join("sled.log");
    let mut c = session(&gw.url()).await;
    until_served(&mut c, &log).await;

    // A 30 s operation; its server is killed a second in.
    let server = child_of(sled.id().unwrap());
    let killer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = std::process::Command::new("kill")
            .args(["-9", &server.to_string()])
            .status();
    });
    let long = c
        .tools_call(
            json!(1),
            "trigger-long-running-operation",
            json!({"project": "everything", "duration": 30, "steps": 2}),
        )
        .await
        .unwrap();
    killer.await.unwrap();
    assert_eq!(long["error"]["data"]["kind"], "upstream_exited", "{long}");
    assert_eq!(long["error"]["data"]["outcome"], "unknown", "{long}");
    assert_eq!(long["error"]["data"]["project"], "everything", "{long}");
    assert!(
        long["error"]["data"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("SIGKILL")),
        "{long}"
    );
    // Served again once it is started again.
    until_served(&mut c, &log).await;
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(log_text.contains("restarting it"), "{log_text}");
}

/// Drain on shutdown (the sled-uplink library's): a connector told to stop (SIGTERM) during a
/// call answers it before its uplink closes, and a call that arrives meanwhile is refused at
/// once (`sled_shutting_down`, not applied); only then does it stop its server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_told_to_stop_answers_the_calls_running_first() {
    let command = everything_command().await;
    let gw = processes::SingleGateway::start(&projects_toml()).await;
    let dir = processes::scratch("connector-drain");
    let mut sled = connector(&gw.url(), &dir, &stdio(command));
    let log = dir.join("sled.log");
    let mut c = session(&gw.url()).await;
    until_served(&mut c, &log).await;

    // A 3 s operation; the connector is told to stop a second in, and another call comes
    // half a second after that.
    let pid = sled.id().unwrap();
    let url = gw.url();
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut other = session(&url).await;
        other
            .tools_call(
                json!(2),
                "echo",
                json!({"project": "everything", "message": "too late"}),
            )
            .await
            .unwrap()
    });
    let long = c
        .tools_call(
            json!(1),
            "trigger-long-running-operation",
            json!({"project": "everything", "duration": 3, "steps": 3}),
        )
        .await
        .unwrap();
    let late = late.await.unwrap();
    assert!(
        long["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("completed")),
        "the call running at SIGTERM is answered: {long}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(
        late["error"]["data"]["kind"], "sled_shutting_down",
        "{late}"
    );
    assert_eq!(late["error"]["data"]["outcome"], "not_sent", "{late}");
    let status = tokio::time::timeout(Duration::from_secs(20), sled.wait())
        .await
        .expect("the connector stops once its calls are answered")
        .unwrap();
    assert!(status.success(), "{status}");
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(log_text.contains("every call answered"), "{log_text}");
}

/// A stdio MCP server that writes what no client should take: a line over 16 MiB, a line that
/// is not JSON, an answer to an id never asked, a JSON-RPC message of no kind; then serves one
/// tool, `ping2`.
const UNRULY: &str = r#"
const rl = require('readline').createInterface({ input: process.stdin });
const out = (m) => process.stdout.write(JSON.stringify(m) + '\n');
rl.on('line', (line) => {
  const m = JSON.parse(line);
  if (m.method === 'initialize') {
    process.stdout.write('"' + 'x'.repeat(17 * 1024 * 1024) + '"\n');
    process.stdout.write('this is not JSON\n');
    out({ jsonrpc: '2.0', id: 99999, result: {} });
    out({ jsonrpc: '2.0' });
    out({ jsonrpc: '2.0', id: m.id, result: { protocolVersion: '2025-11-25', capabilities: { tools: {} },
          serverInfo: { name: 'unruly', version: '0' } } });
  } else if (m.method === 'tools/list') {
    out({ jsonrpc: '2.0', id: m.id, result: { tools: [{ name: 'ping2', inputSchema: { type: 'object' } }] } });
  } else if (m.method === 'tools/call') {
    process.stdout.write('{"half": \n');
    out({ jsonrpc: '2.0', id: m.id, result: { content: [{ type: 'text', text: 'pong' }] } });
  }
});
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_server_writes_that_is_not_json_rpc_is_logged_and_skipped() {
    let node = node::node().await;
    let gw = processes::SingleGateway::start(&projects_toml()).await;
    let dir = processes::scratch("connector-unruly");
    let script: PathBuf = dir.join("unruly.js");
    std::fs::write(&script, UNRULY).unwrap();
    let _sled = connector(
        &gw.url(),
        &dir,
        &stdio(vec![
            node.node.display().to_string(),
            script.display().to_string(),
        ]),
    );
    let mut c = session(&gw.url()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let answer = loop {
        let r = c
            .tools_call(json!(1), "ping2", json!({"project": "everything"}))
            .await
            .unwrap();
        if r.get("result").is_some() || tokio::time::Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(text(&answer), "pong", "{answer}");
    let log = std::fs::read_to_string(dir.join("sled.log")).unwrap();
    for said in [
        "a message over the limit",
        "a line that is not a JSON object",
        "answered a request that is not in flight",
        "neither request, response nor notification",
    ] {
        assert!(log.contains(said), "{said}: {log}");
    }
    assert!(
        !log.contains("restarting it"),
        "the server was never restarted: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_at_a_url_that_goes_away_fails_calls_at_once_and_is_found_again() {
    let gw = processes::SingleGateway::start(&projects_toml()).await;
    let dir = processes::scratch("connector-http-away");
    let port = processes::free_port();
    let mut server = everything_http(port, &dir).await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let _sled = connector(&gw.url(), &dir, &["--url".to_owned(), url]);
    let log = dir.join("sled.log");
    let mut c = session(&gw.url()).await;
    until_served(&mut c, &log).await;

    // Gone during a 30 s operation: the call is answered at once, outcome unknown.
    let pid = server.id().unwrap();
    let killer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    });
    let long = c
        .tools_call(
            json!(1),
            "trigger-long-running-operation",
            json!({"project": "everything", "duration": 30, "steps": 2}),
        )
        .await
        .unwrap();
    killer.await.unwrap();
    let _ = server.wait().await;
    assert_eq!(
        long["error"]["data"]["kind"], "upstream_unreachable",
        "{long}"
    );
    assert_eq!(long["error"]["data"]["outcome"], "unknown", "{long}");
    // Meanwhile: refused at once, naming the project and why.
    let down = c
        .tools_call(
            json!(2),
            "echo",
            json!({"project": "everything", "message": "x"}),
        )
        .await
        .unwrap();
    assert_eq!(down["error"]["data"]["kind"], "upstream_down", "{down}");
    assert_eq!(down["error"]["data"]["project"], "everything", "{down}");
    // Back on the same port (a new process, so a new session): served again.
    let _server = everything_http(port, &dir).await;
    until_served(&mut c, &log).await;
}

/// A server that cannot start: its project is down in `gateway_health`, naming why, calls are
/// refused at once with the reason, and `gateway doctor` fails on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_start_is_down_in_health_and_doctor_says_why() {
    let gw = processes::SingleGateway::start(&projects_toml()).await;
    let dir = processes::scratch("connector-missing");
    let _sled = connector(
        &gw.url(),
        &dir,
        &stdio(vec!["/nonexistent/mcp-server".to_owned()]),
    );
    let mut c = session(&gw.url()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let row = loop {
        let health = c
            .tools_call(json!(1), "gateway_health", json!({}))
            .await
            .unwrap();
        let row = health["result"]["structuredContent"]["projects"][0].clone();
        if row["upstream"]["state"] == "down" || tokio::time::Instant::now() > deadline {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(row["status"], "down", "{row}");
    assert!(
        row["reasons"][0].as_str().is_some_and(
            |r| r.starts_with("its MCP server is down: cannot start /nonexistent/mcp-server")
        ),
        "{row}"
    );
    let refused = c
        .tools_call(
            json!(2),
            "echo",
            json!({"project": "everything", "message": "x"}),
        )
        .await
        .unwrap();
    // Refused at once, by the connector (the tool is not listed: the gateway sends it anyway,
    // as a call to a tool its sled may list later), or as the server starts once more.
    assert_eq!(
        refused["error"]["data"]["kind"], "upstream_down",
        "{refused}"
    );
    assert!(
        refused["error"]["data"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("/nonexistent/mcp-server") || r.contains("starting")),
        "{refused}"
    );
    let doctor = Command::new(processes::workspace_bin("gateway"))
        .args(["doctor", "--url", &format!("{}/mcp", gw.url())])
        .env_remove("MCP_GATEWAY_TOKEN")
        .env_remove("MCP_GATEWAY_URL")
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&doctor.stdout);
    assert!(!doctor.status.success(), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("FAIL")
            && l.contains("project everything")
            && l.contains("its MCP server is down")),
        "{out}"
    );
}

/// Runs a Node program to completion within 120 s: its status and its stdout.
async fn run_node(mut cmd: Command, what: &str) -> (bool, String) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what} finished within 120 s"))
        .unwrap_or_else(|e| panic!("{what} ran: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        println!("{what} stderr:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    (out.status.success(), stdout)
}

/// The clients people use, against server-everything behind the connector: the TypeScript
/// SDK (tools, progress, its own sampling and elicitation answers, prompts, completion,
/// resources, a subscription's `resources/updated`, a cancellation that reaches the server), the Python SDK in both eras (calls,
/// progress, sampling), and the Inspector CLI (lists and calls); over stdio, then over
/// server-everything's Streamable HTTP transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_and_the_inspector_use_server_everything_through_the_connector() {
    let command = everything_command().await;
    let dir = processes::scratch("connector-sdks");
    sdks_and_inspector(&dir, &stdio(command), "stdio").await;
    let dir = processes::scratch("connector-sdks-http");
    let port = processes::free_port();
    let _server = everything_http(port, &dir).await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    sdks_and_inspector(&dir, &["--url".to_owned(), url], "http").await;
}

async fn sdks_and_inspector(dir: &Path, upstream: &[String], kind: &str) {
    let node = node::node().await;
    let python = python::python_with_sdk().await;
    let gw = processes::SingleGateway::start(&projects_toml()).await;
    let _sled = connector(&gw.url(), dir, upstream);
    let log = dir.join("sled.log");
    let mut c = session(&gw.url()).await;
    until_served(&mut c, &log).await;
    let mcp = format!("{}/mcp", gw.url());

    // The TypeScript SDK, run from its install directory so that its imports find it.
    let script = node.script("ts_connector_client.mjs");
    let mut cmd = node.command();
    cmd.arg(&script).arg(&mcp).arg(kind);
    let (ok, stdout) = run_node(cmd, "the TypeScript client").await;
    println!("{stdout}");
    assert!(ok && stdout.contains(" passed, 0 failed"), "{stdout}");
    // Its cancellation reached the server: the connector sent it on.
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains("cancelling a call at the MCP server"),
        "{log_text}"
    );

    python::run_checks(&python, "python_connector_client.py", &[&mcp]).await;

    // The Inspector CLI lists and calls.
    let inspector = node.bin("@modelcontextprotocol/inspector", "mcp-inspector");
    let mut cmd = node.command();
    cmd.arg(&inspector).args([
        "--cli",
        &mcp,
        "--transport",
        "http",
        "--method",
        "tools/list",
    ]);
    let (ok, stdout) = run_node(cmd, "the Inspector CLI").await;
    assert!(ok, "{stdout}");
    let listed: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let echo = listed["tools"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == "echo"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(
        echo["inputSchema"]["properties"]["project"]["type"],
        "string"
    );
    let mut cmd = node.command();
    cmd.arg(&inspector)
        .args([
            "--cli",
            &mcp,
            "--transport",
            "http",
            "--method",
            "tools/call",
        ])
        .args(["--tool-name", "echo", "--tool-arg", "message=inspected"]);
    let (ok, stdout) = run_node(cmd, "the Inspector CLI").await;
    assert!(ok, "{stdout}");
    let called: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(called["content"][0]["text"], "Echo: inspected", "{stdout}");
}

/// A stdio MCP server that knows nothing of leases: `write_note` appends the arguments and
/// `_meta` of each call it gets to the file its first argument names.
const NOTES: &str = r#"
const fs = require('fs');
const seen = process.argv[2];
const rl = require('readline').createInterface({ input: process.stdin });
const out = (m) => process.stdout.write(JSON.stringify(m) + '\n');
rl.on('line', (line) => {
  const m = JSON.parse(line);
  if (m.method === 'initialize') {
    out({ jsonrpc: '2.0', id: m.id, result: { protocolVersion: '2025-11-25', capabilities: { tools: {} },
          serverInfo: { name: 'notes', version: '0' } } });
  } else if (m.method === 'tools/list') {
    out({ jsonrpc: '2.0', id: m.id, result: { tools: [{ name: 'write_note', inputSchema: { type: 'object',
          properties: { title: { type: 'string' }, body: { type: 'string' } }, required: ['title'] } }] } });
  } else if (m.method === 'tools/call') {
    fs.appendFileSync(seen, JSON.stringify({ arguments: m.params.arguments, meta: m.params._meta ?? null }) + '\n');
    out({ jsonrpc: '2.0', id: m.id, result: { content: [{ type: 'text', text: 'written' }] } });
  }
});
"#;

/// The notes server behind a connector that leases `write_note`'s `title` as `note:`: the
/// connector's arguments, and the file where the server records each call it gets.
async fn notes_upstream(dir: &Path) -> (Vec<String>, PathBuf) {
    let node = node::node().await;
    let script = dir.join("notes.js");
    std::fs::write(&script, NOTES).unwrap();
    let seen = dir.join("seen.jsonl");
    let mut args = vec!["--lease".to_owned(), "write_note=title:note".to_owned()];
    args.extend(stdio(vec![
        node.node.display().to_string(),
        script.display().to_string(),
        seen.display().to_string(),
    ]));
    (args, seen)
}

fn seen_calls(seen: &Path) -> Vec<Value> {
    std::fs::read_to_string(seen)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Leases for a server that knows nothing of them, through a real gateway whose project
/// requires them: a write without the lease is refused by the gateway, one under it reaches
/// the server (its fence taken out), the fence is kept on disk, and a restarted connector
/// reports it in its hello, so the gateway's next fence is above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_for_a_server_that_knows_nothing_of_them() {
    let toml = projects_toml() + "leases = \"required\"\n";
    let gw = processes::SingleGateway::start(&toml).await;
    let dir = processes::scratch("connector-leases");
    let (args, seen) = notes_upstream(&dir).await;
    let mut sled = connector(&gw.url(), &dir, &args);
    let mut c = session(&gw.url()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    // Until listed: the gateway then knows the lease.
    let refused = loop {
        let r = c
            .tools_call(
                json!(1),
                "write_note",
                json!({"title": "x", "body": "no lease"}),
            )
            .await
            .unwrap();
        if r["error"]["data"]["kind"] == "lease_required" || tokio::time::Instant::now() > deadline
        {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        refused["error"]["data"]["kind"], "lease_required",
        "{refused}"
    );
    assert_eq!(refused["error"]["data"]["resource"], "note:x", "{refused}");

    let agent = c.tools_call(json!(2), "checkin", json!({})).await.unwrap();
    let handle = agent["result"]["structuredContent"]["handle"].clone();
    let claim = c
        .tools_call(
            json!(3),
            "claim",
            json!({"resource": "note:x", "agent": handle}),
        )
        .await
        .unwrap();
    let fence = claim["result"]["structuredContent"]["fence"]
        .as_u64()
        .unwrap_or_else(|| panic!("{claim}"));
    let written = c
        .tools_call(
            json!(4),
            "write_note",
            json!({"title": "x", "body": "leased"}),
        )
        .await
        .unwrap();
    assert_eq!(
        written["result"]["content"][0]["text"], "written",
        "{written}"
    );
    let calls = seen_calls(&seen);
    assert_eq!(
        calls.len(),
        1,
        "only the leased write reached the server: {calls:?}"
    );
    assert_eq!(calls[0]["arguments"]["body"], "leased");
    assert!(
        calls[0]["meta"]
            .get(gateway_core::uplink::FENCE_META)
            .is_none(),
        "the server never sees the fence: {calls:?}"
    );
    let kept: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("state/everything.fences.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(kept, json!({"note:x": fence}));

    // A restarted connector says, in its hello, the highest fence it has accepted.
    sled.kill().await.unwrap();
    let (args, _) = notes_upstream(&dir).await;
    let _sled = connector(&gw.url(), &dir, &args);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let listed = c
            .tools_call(json!(5), "list_projects", json!({}))
            .await
            .unwrap();
        let floor = listed["result"]["structuredContent"]["projects"][0]["fence_floor"].clone();
        if floor == json!(fence) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{listed}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The connector's own fence check, as a gateway drives it: a write whose fence is below one
/// the connector accepted since (the lease was lost while the write was on its way) is refused
/// with sled-sim's `stale_fence`, and one whose fence names another resource with
/// `fence_mismatch`; the server sees neither. Driven by a stand-in for the gateway's uplink
/// endpoint, which sends the frames in that order.
type Uplink = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// The next text frame from the connector, as JSON.
async fn frame(ws: &mut Uplink) -> Value {
    use futures_util::StreamExt;
    loop {
        let m = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("a frame within 30 s")
            .expect("the uplink is open")
            .unwrap();
        if let tokio_tungstenite::tungstenite::Message::Text(t) = m {
            return serde_json::from_str(&t).unwrap();
        }
    }
}

/// Sends a request down the uplink: its response (frames before it are passed over).
async fn ask(ws: &mut Uplink, id: u64, method: &str, params: Value) -> Value {
    use futures_util::SinkExt;
    let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    ws.send(tokio_tungstenite::tungstenite::Message::text(
        request.to_string(),
    ))
    .await
    .unwrap();
    loop {
        let f = frame(ws).await;
        if f["id"] == id {
            return f;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connector_refuses_a_stale_fence_before_the_server_sees_the_write() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let dir = processes::scratch("connector-stale");
    let (args, seen) = notes_upstream(&dir).await;
    let _sled = connector(&url, &dir, &args);
    let (tcp, _) = tokio::time::timeout(Duration::from_secs(30), listener.accept())
        .await
        .expect("the connector dials")
        .unwrap();
    let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
    let hello = frame(&mut ws).await;
    assert_eq!(hello["uplink"], "hello", "{hello}");
    assert!(
        hello.get("fence").is_none(),
        "no fence accepted yet: {hello}"
    );
    ws.send(Message::text(
        r#"{"uplink":"welcome","protocol":1,"heartbeat_ms":60000}"#,
    ))
    .await
    .unwrap();
    // Once the server runs, list and call.
    loop {
        let f = frame(&mut ws).await;
        if f["uplink"] == "upstream" && f["state"] == "running" {
            break;
        }
    }
    let listed = ask(&mut ws, 1, "tools/list", json!({})).await;
    assert_eq!(
        listed["result"]["tools"][0]["inputSchema"]["properties"]["title"]
            [gateway_core::uplink::LEASE_KEYWORD],
        "note",
        "{listed}"
    );
    let fenced = |title: &str, resource: &str, fence: u64| {
        json!({"name": "write_note", "arguments": {"title": title, "body": format!("fence {fence}")},
               "_meta": {gateway_core::uplink::FENCE_META: {"resource": resource, "fence": fence}}})
    };
    let newer = ask(&mut ws, 2, "tools/call", fenced("x", "note:x", 7)).await;
    assert_eq!(newer["result"]["content"][0]["text"], "written", "{newer}");
    let stale = ask(&mut ws, 3, "tools/call", fenced("x", "note:x", 6)).await;
    assert_eq!(stale["result"]["isError"], true, "{stale}");
    assert_eq!(
        stale["result"]["structuredContent"]["kind"], "stale_fence",
        "{stale}"
    );
    assert_eq!(
        stale["result"]["structuredContent"]["highest"], 7,
        "{stale}"
    );
    let other = ask(&mut ws, 4, "tools/call", fenced("y", "note:x", 8)).await;
    assert_eq!(
        other["result"]["structuredContent"]["kind"], "fence_mismatch",
        "{other}"
    );
    let calls = seen_calls(&seen);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["arguments"]["body"], "fence 7");
}

/// A stdio MCP server that never answers a call: it records each notification it gets.
const SILENT: &str = r#"
const fs = require('fs');
const heard = process.argv[2];
const rl = require('readline').createInterface({ input: process.stdin });
const out = (m) => process.stdout.write(JSON.stringify(m) + '\n');
rl.on('line', (line) => {
  const m = JSON.parse(line);
  if (m.method === 'initialize') {
    out({ jsonrpc: '2.0', id: m.id, result: { protocolVersion: '2025-11-25', capabilities: { tools: {} },
          serverInfo: { name: 'silent', version: '0' } } });
  } else if (m.method === 'tools/list') {
    out({ jsonrpc: '2.0', id: m.id, result: { tools: [{ name: 'hang', inputSchema: { type: 'object' } }] } });
  } else if (m.id === undefined) {
    fs.appendFileSync(heard, JSON.stringify(m) + '\n');
  }
});
"#;

/// A call whose uplink connection closes before the server answers leaves nothing behind in
/// the connector: the server is told to stop (`notifications/cancelled` naming its own id for
/// the call), and the connector serves on over the next connection. Driven by a stand-in for
/// the gateway's uplink endpoint, which drops the connection during the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_uplink_connection_closes_is_cancelled_at_the_server() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;

    let node = node::node().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let dir = processes::scratch("connector-abandoned");
    let script = dir.join("silent.js");
    std::fs::write(&script, SILENT).unwrap();
    let heard = dir.join("heard.jsonl");
    let _sled = connector(
        &url,
        &dir,
        &stdio(vec![
            node.node.display().to_string(),
            script.display().to_string(),
            heard.display().to_string(),
        ]),
    );
    let accept = || async {
        let (tcp, _) = tokio::time::timeout(Duration::from_secs(30), listener.accept())
            .await
            .expect("the connector dials")
            .unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let hello = frame(&mut ws).await;
        assert_eq!(hello["uplink"], "hello", "{hello}");
        ws.send(Message::text(
            r#"{"uplink":"welcome","protocol":1,"heartbeat_ms":60000}"#,
        ))
        .await
        .unwrap();
        loop {
            let f = frame(&mut ws).await;
            if f["uplink"] == "upstream" && f["state"] == "running" {
                break ws;
            }
        }
    };
    let mut ws = accept().await;
    ws.send(Message::text(
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
               "params": {"name": "hang", "arguments": {}}})
        .to_string(),
    ))
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(ws);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let cancelled = loop {
        let lines = std::fs::read_to_string(&heard).unwrap_or_default();
        let found = lines
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|m| m["method"] == "notifications/cancelled");
        if let Some(m) = found {
            break m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no cancellation reached the server: {lines}\n{}",
            std::fs::read_to_string(dir.join("sled.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        cancelled["params"]["requestId"].is_u64(),
        "the server's own id: {cancelled}"
    );
    assert!(
        cancelled["params"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("connection")),
        "{cancelled}"
    );
    // It serves on over its next connection.
    let mut ws = accept().await;
    let listed = ask(&mut ws, 1, "tools/list", json!({})).await;
    assert_eq!(listed["result"]["tools"][0]["name"], "hang", "{listed}");
}

/// An upstream that never answers: the call ends at the project's deadline (the gateway's
/// `timeout`), and the cancellation the gateway then sends reaches the server, naming the
/// server's own id for the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_server_never_answers_ends_at_its_deadline_and_is_cancelled_at_the_server() {
    let node = node::node().await;
    let toml = projects_toml().replace("call_timeout_ms = 60000", "call_timeout_ms = 1500");
    let gw = processes::SingleGateway::start(&toml).await;
    let dir = processes::scratch("connector-silent");
    let script = dir.join("silent.js");
    std::fs::write(&script, SILENT).unwrap();
    let heard = dir.join("heard.jsonl");
    let _sled = connector(
        &gw.url(),
        &dir,
        &stdio(vec![
            node.node.display().to_string(),
            script.display().to_string(),
            heard.display().to_string(),
        ]),
    );
    let mut c = session(&gw.url()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let timed_out = loop {
        let r = c
            .tools_call(json!(1), "hang", json!({"project": "everything"}))
            .await
            .unwrap();
        if r["error"]["data"]["kind"] == "timeout" || tokio::time::Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(timed_out["error"]["data"]["kind"], "timeout", "{timed_out}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let cancelled = loop {
        let heard = std::fs::read_to_string(&heard).unwrap_or_default();
        if let Some(line) = heard
            .lines()
            .find(|l| l.contains("notifications/cancelled"))
        {
            break serde_json::from_str::<Value>(line).unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no cancellation: {heard}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The server's own id for the call: the connector's, not the gateway's.
    assert!(cancelled["params"]["requestId"].is_u64(), "{cancelled}");
}

/// A server's `readOnlyHint` is not a grant (where-the-issues-meet §12): server-everything
/// annotates `echo` and `get-sum` read-only. A reader is refused both on a project that trusts
/// no hints, and may call only what `read_only_tools` lists on one that lists `echo`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_read_only_hints_grant_a_reader_nothing_unless_projects_toml_says_so() {
    let command = everything_command().await;
    let toml = format!(
        "client_tokens = [{{ name = \"reader\", token = \"reader-token-0123456789\" }}]\n\
         [[project]]\nname = \"everything\"\nurl = \"http://127.0.0.1:9\"\ntoken = \"{TOKEN}\"\n\
         [[project]]\nname = \"listed\"\nurl = \"http://127.0.0.1:9\"\ntoken = \"{TOKEN}\"\n\
         read_only_tools = [\"echo\"]\n\
         [[access]]\ntoken = \"reader\"\nprojects = [\"*\"]\nright = \"read\"\n"
    );
    let gw = processes::SingleGateway::start(&toml).await;
    let (a, b) = (
        processes::scratch("connector-hints-a"),
        processes::scratch("connector-hints-b"),
    );
    let _sleds = (
        connector_for("everything", &gw.url(), &a, &stdio(command.clone())),
        connector_for("listed", &gw.url(), &b, &stdio(command)),
    );
    let mut c = McpClient::connect(TokioConnect, &format!("{}/mcp", gw.url()))
        .await
        .unwrap();
    c.set_bearer_token(Some("reader-token-0123456789".into()));
    c.initialize().await.unwrap();
    let call = async |c: &mut McpClient<TokioConnect>, project: &str, tool: &str, args: Value| {
        let mut args = args;
        args["project"] = json!(project);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let r = c.tools_call(json!(1), tool, args.clone()).await.unwrap();
            // Until the project's server is up and listed.
            let kind = r["error"]["data"]["kind"].as_str().unwrap_or_default();
            let waiting = matches!(
                kind,
                "sled_not_connected" | "upstream_down" | "tools_pending"
            );
            if !waiting || tokio::time::Instant::now() > deadline {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let listed = call(&mut c, "listed", "echo", json!({"message": "read"})).await;
    assert_eq!(text(&listed), "Echo: read", "{listed}");
    for (project, tool, args) in [
        ("everything", "echo", json!({"message": "x"})),
        ("everything", "get-sum", json!({"a": 1, "b": 2})),
        ("listed", "get-sum", json!({"a": 1, "b": 2})),
    ] {
        let r = call(&mut c, project, tool, args).await;
        assert_eq!(
            r["error"]["data"]["kind"], "forbidden",
            "{project} {tool}: {r}"
        );
        assert_eq!(
            r["error"]["data"]["right"], "write",
            "{project} {tool}: {r}"
        );
    }
}

/// Several projects in one connector process, one uplink each, from a config file as
/// `examples/sleds.toml` writes one: server-everything over stdio as `everything` (its uplink
/// token from a file) and over Streamable HTTP as `web` (its token from the environment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connector_serves_several_projects_from_a_config_file() {
    let command = everything_command().await;
    let toml = format!(
        "{}[[project]]\nname = \"web\"\nurl = \"http://127.0.0.1:9\"\ntoken = \"{TOKEN}\"\n",
        projects_toml()
    );
    let gw = processes::SingleGateway::start(&toml).await;
    let dir = processes::scratch("connector-several");
    let port = processes::free_port();
    let _server = everything_http(port, &dir).await;
    std::fs::write(dir.join("everything.token"), TOKEN).unwrap();
    let quoted: Vec<String> = command.iter().map(|c| format!("{c:?}")).collect();
    let config = format!(
        "gateway = \"{}\"\nstate_dir = \"{}\"\n\n\
         [[project]]\nname = \"everything\"\ncommand = [{}]\ntoken_file = \"{}\"\n\n\
         [[project]]\nname = \"web\"\nurl = \"http://127.0.0.1:{port}/mcp\"\ntoken_env = \"WEB_UPLINK_TOKEN\"\n",
        gw.url(),
        dir.join("state").display(),
        quoted.join(", "),
        dir.join("everything.token").display(),
    );
    std::fs::write(dir.join("sleds.toml"), config).unwrap();
    let log = dir.join("sled.log");
    let _sled = Command::new(processes::workspace_bin("gateway-sled"))
        .arg("--config")
        .arg(dir.join("sleds.toml"))
        .env("WEB_UPLINK_TOKEN", TOKEN)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut c = session(&gw.url()).await;
    for project in ["everything", "web"] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let r = c
                .tools_call(
                    json!(1),
                    "echo",
                    json!({"project": project, "message": project}),
                )
                .await
                .unwrap();
            if r["result"]["content"][0]["text"] == format!("Echo: {project}") {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{project}: {r}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // One identity key per project.
    for project in ["everything", "web"] {
        assert!(dir.join(format!("state/{project}.key")).exists());
    }
    let health = c
        .tools_call(json!(2), "gateway_health", json!({}))
        .await
        .unwrap();
    let states: Vec<Value> = health["result"]["structuredContent"]["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["upstream"]["state"].clone())
        .collect();
    assert_eq!(states, [json!("running"), json!("running")], "{health}");
}

/// npm's server-memory, pinned: a server that knows nothing of leases and names the entities
/// it writes inside arrays.
const MEMORY: [(&str, &str); 1] = [("@modelcontextprotocol/server-memory", "2026.8.31")];

/// The leases server-memory's writing tools take, as `examples/sleds.toml` ships them: its
/// `[project.leases]` table, verbatim (a test of the connector parses the whole file).
fn shipped_memory_leases() -> String {
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/sleds.toml"
    ))
    .unwrap();
    let table = shipped
        .split("[project.leases]\n")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("examples/sleds.toml has server-memory's [project.leases]");
    format!("[project.leases]\n{table}\n")
}

/// Issue 26: two sessions write the same entity of npm's server-memory, through the gateway and
/// the connector with the lease config of `examples/sleds.toml`. The second is refused naming the first, whether the
/// entity is the only one its call names or one of several; the holder's writes go through,
/// fenced (the connector keeps the fence on disk); a free entity is written by anyone; once
/// released, the other takes the lease with a higher fence and writes. The server's graph
/// holds exactly the writes that were let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_writing_one_entity_of_server_memory_are_kept_apart_by_leases() {
    let toml =
        "default = \"memory\"\n[[project]]\nname = \"memory\"\nurl = \"http://127.0.0.1:9\"\n"
            .to_owned()
            + &format!("token = \"{TOKEN}\"\ncall_timeout_ms = 60000\n");
    let gw = processes::SingleGateway::start(&toml).await;
    let dir = processes::scratch("connector-memory");
    let node = node::node().await;
    let modules = node::packages("memory", &MEMORY).await;
    let entry = modules.join("node_modules/@modelcontextprotocol/server-memory/dist/index.js");
    std::fs::write(dir.join("memory.token"), TOKEN).unwrap();
    let config = format!(
        "gateway = \"{}\"\nstate_dir = \"{}\"\n\n[[project]]\nname = \"memory\"\n\
         command = [{:?}, {:?}]\nenv = {{ MEMORY_FILE_PATH = {:?} }}\ntoken_file = {:?}\n{}",
        gw.url(),
        dir.join("state").display(),
        node.node.display().to_string(),
        entry.display().to_string(),
        dir.join("memory.jsonl").display().to_string(),
        dir.join("memory.token").display().to_string(),
        shipped_memory_leases(),
    );
    std::fs::write(dir.join("sleds.toml"), config).unwrap();
    let _sled = Command::new(processes::workspace_bin("gateway-sled"))
        .arg("--config")
        .arg(dir.join("sleds.toml"))
        .env("RUST_LOG", "info,gateway_connector=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("sled.log")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("gateway-sled starts");
    let (mut a, mut b) = (session(&gw.url()).await, session(&gw.url()).await);

    // Until the gateway lists the tools, with the spot the connector marked.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let listed = a.tools_list(json!(1), None).await.unwrap();
        let marked = listed["result"]["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["name"] == "add_observations")
            .map(|t| {
                t["inputSchema"]["properties"]["observations"]["items"]["properties"]["entityName"]
                    [gateway_core::uplink::LEASE_KEYWORD]
                    .clone()
            });
        if marked == Some(json!("entity")) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "server-memory's tools never listed with their lease: {listed}\n{}",
            std::fs::read_to_string(dir.join("sled.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let call = |name: &'static str, arguments: Value| {
        let mut arguments = arguments;
        arguments["project"] = json!("memory");
        (name, arguments)
    };
    async fn run(c: &mut McpClient<TokioConnect>, (name, arguments): (&str, Value)) -> Value {
        c.tools_call(json!(name), name, arguments).await.unwrap()
    }
    fn ok(r: &Value) {
        assert!(
            r["result"].is_object() && r["result"]["isError"] != true,
            "not written: {r}"
        );
    }
    let entity = |name: &str, note: &str| json!({"name": name, "entityType": "person", "observations": [note]});
    run(&mut a, call("checkin", json!({"name": "ann"}))).await;
    run(&mut b, call("checkin", json!({"name": "bob"}))).await;
    let claim = run(&mut a, call("claim", json!({"resource": "entity:alice"}))).await;
    let fence = claim["result"]["structuredContent"]["fence"]
        .as_u64()
        .unwrap_or_else(|| panic!("{claim}"));

    // The holder writes alice.
    ok(&run(
        &mut a,
        call(
            "create_entities",
            json!({"entities": [entity("alice", "likes tea")]}),
        ),
    )
    .await);
    // The other is refused naming the holder: alone, among others, and by each writing tool.
    let refusals = [
        call(
            "add_observations",
            json!({"observations": [{"entityName": "alice", "contents": ["bob was here"]}]}),
        ),
        call(
            "create_entities",
            json!({"entities": [entity("bob", "b"), entity("alice", "bob's alice")]}),
        ),
        call(
            "delete_entities",
            json!({"entityNames": ["carol", "alice"]}),
        ),
        call(
            "delete_observations",
            json!({"deletions": [{"entityName": "alice", "observations": ["likes tea"]}]}),
        ),
    ];
    for refused in refusals {
        let tool = refused.0;
        let r = run(&mut b, refused).await;
        assert_eq!(r["error"]["data"]["kind"], "lease_held", "{tool}: {r}");
        assert_eq!(
            r["error"]["data"]["resource"], "entity:alice",
            "{tool}: {r}"
        );
        assert_eq!(r["error"]["data"]["holder_name"], "ann", "{tool}: {r}");
    }
    // A free entity is anyone's to write; the holder goes on writing hers.
    ok(&run(
        &mut b,
        call(
            "create_entities",
            json!({"entities": [entity("bob", "likes coffee")]}),
        ),
    )
    .await);
    ok(&run(
        &mut a,
        call(
            "add_observations",
            json!({"observations": [{"entityName": "alice", "contents": ["reads a lot"]}]}),
        ),
    )
    .await);
    let kept: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("state/memory.fences.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        kept,
        json!({"entity:alice": fence}),
        "the connector kept the fence"
    );

    // Released: bob takes it, with a higher fence, and writes.
    let r = run(&mut a, call("release", json!({"resource": "entity:alice"}))).await;
    assert_eq!(r["result"]["structuredContent"]["released"], true, "{r}");
    let claim = run(&mut b, call("claim", json!({"resource": "entity:alice"}))).await;
    let next = claim["result"]["structuredContent"]["fence"]
        .as_u64()
        .unwrap_or_else(|| panic!("{claim}"));
    assert!(next > fence);
    ok(&run(
        &mut b,
        call(
            "add_observations",
            json!({"observations": [{"entityName": "alice", "contents": ["met bob"]}]}),
        ),
    )
    .await);

    // The graph holds what was let through, and nothing that was refused.
    let graph = run(&mut a, call("read_graph", json!({}))).await;
    let graph = graph["result"]["structuredContent"].clone();
    let observations = |name: &str| -> Vec<Value> {
        graph["entities"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .map(|e| e["observations"].as_array().cloned().unwrap_or_default())
            .unwrap_or_else(|| panic!("no {name} in {graph}"))
    };
    assert_eq!(
        observations("alice"),
        vec![json!("likes tea"), json!("reads a lot"), json!("met bob")],
        "{graph}"
    );
    assert_eq!(observations("bob"), vec![json!("likes coffee")], "{graph}");
}

/// Tasks (MCP 2025-11-25) through the connector, to server-everything's
/// `simulate-research-query` (`execution.taskSupport: "required"`, four stages of a second),
/// over stdio and over Streamable HTTP, driven by a stand-in for the gateway's uplink (the
/// gateway does not relay tasks yet): the tool's `execution` passes through in `tools/list`,
/// a `tools/call` with `params.task` gets the server's `CreateTaskResult`, `tasks/get` and
/// `tasks/list` reach the server, `tasks/result` waits the task out (longer than any deadline
/// of the connector's own would allow a call to), a `notifications/tasks/status` from the
/// server comes up the uplink, and a second task is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_pass_through_the_connector_to_server_everything() {
    let dir = processes::scratch("connector-tasks");
    let port = processes::free_port();
    let _server = everything_http(port, &dir).await;
    let http = vec!["--url".to_owned(), format!("http://127.0.0.1:{port}/mcp")];
    for (kind, upstream) in [("stdio", stdio(everything_command().await)), ("http", http)] {
        tasks_through_the_connector(&dir.join(kind), &upstream, kind).await;
    }
}

async fn tasks_through_the_connector(dir: &Path, upstream: &[String], kind: &str) {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;

    std::fs::create_dir_all(dir).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let _sled = connector(&url, dir, upstream);
    let (tcp, _) = tokio::time::timeout(Duration::from_secs(30), listener.accept())
        .await
        .expect("the connector dials")
        .unwrap();
    let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
    assert_eq!(frame(&mut ws).await["uplink"], "hello");
    ws.send(Message::text(
        r#"{"uplink":"welcome","protocol":1,"heartbeat_ms":60000}"#,
    ))
    .await
    .unwrap();
    loop {
        let f = frame(&mut ws).await;
        if f["uplink"] == "upstream" && f["state"] == "running" {
            break;
        }
    }
    // The conditional tools are registered once the server is initialized: list until it is
    // there.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let research = loop {
        let listed = ask(&mut ws, 1, "tools/list", json!({})).await;
        let tools = listed["result"]["tools"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if let Some(t) = tools
            .into_iter()
            .find(|t| t["name"] == "simulate-research-query")
        {
            break t;
        }
        assert!(tokio::time::Instant::now() < deadline, "{kind}: {listed}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        research["execution"]["taskSupport"], "required",
        "{kind}: {research}"
    );

    let call = |topic: &str| {
        json!({"name": "simulate-research-query", "arguments": {"topic": topic},
               "task": {"ttl": 60_000}, "_meta": {"progressToken": format!("gw-{topic}")}})
    };
    let created = ask(&mut ws, 2, "tools/call", call("tides")).await;
    let task = &created["result"]["task"];
    assert_eq!(task["status"], "working", "{kind}: {created}");
    let task_id = task["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{kind}: {created}"))
        .to_owned();
    assert!(
        task["createdAt"].is_string() && task["ttl"].is_u64(),
        "{kind}: {created}"
    );
    let got = ask(&mut ws, 3, "tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(got["result"]["taskId"], task_id.as_str(), "{kind}: {got}");
    assert_eq!(got["result"]["status"], "working", "{kind}: {got}");

    // tasks/result waits for the four stages; the status notifications come up meanwhile.
    let started = tokio::time::Instant::now();
    ws.send(Message::text(
        json!({"jsonrpc": "2.0", "id": 4, "method": "tasks/result", "params": {"taskId": task_id}})
            .to_string(),
    ))
    .await
    .unwrap();
    let mut statuses = Vec::new();
    let result = loop {
        let f = frame(&mut ws).await;
        if f["method"] == "notifications/tasks/status" {
            assert_eq!(f["params"]["taskId"], task_id.as_str(), "{kind}: {f}");
            // The project's, not the call's in flight (the tasks/result): it names the task.
            assert!(
                f.pointer(&format!(
                    "/params/_meta/{}",
                    gateway_core::uplink::RELATED_REQUEST_META.replace('/', "~1")
                ))
                .is_none(),
                "{kind}: {f}"
            );
            statuses.push(
                f["params"]["status"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
        } else if f["id"] == 4 {
            break f;
        }
    };
    assert!(
        started.elapsed() > Duration::from_secs(2),
        "{kind}: answered before the task ended"
    );
    assert!(
        result["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("tides")),
        "{kind}: {result}"
    );
    assert_eq!(
        result["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        task_id.as_str(),
        "{kind}: {result}"
    );
    // The completion's notification may follow the result; wait for it a moment.
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while !statuses.iter().any(|s| s == "completed") && tokio::time::Instant::now() < until {
        let Ok(f) = tokio::time::timeout(Duration::from_millis(500), frame(&mut ws)).await else {
            continue;
        };
        if f["method"] == "notifications/tasks/status" && f["params"]["taskId"] == task_id.as_str()
        {
            statuses.push(
                f["params"]["status"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
        }
    }
    assert!(
        statuses.iter().any(|s| s == "working"),
        "{kind}: {statuses:?}"
    );
    assert!(
        statuses.iter().any(|s| s == "completed"),
        "{kind}: {statuses:?}"
    );

    // A second task, cancelled: it stays cancelled, and tasks/list shows both.
    let second = ask(&mut ws, 5, "tools/call", call("comets")).await;
    let second_id = second["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{kind}: {second}"))
        .to_owned();
    assert_ne!(second_id, task_id);
    let cancelled = ask(&mut ws, 6, "tasks/cancel", json!({"taskId": second_id})).await;
    assert_eq!(
        cancelled["result"]["status"], "cancelled",
        "{kind}: {cancelled}"
    );
    let again = ask(&mut ws, 7, "tasks/cancel", json!({"taskId": second_id})).await;
    assert_eq!(again["error"]["code"], -32602, "{kind}: {again}");
    let listed = ask(&mut ws, 8, "tasks/list", json!({})).await;
    let listed: Vec<(String, String)> = listed["result"]["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("{kind}: {listed}"))
        .iter()
        .map(|t| {
            (
                t["taskId"].as_str().unwrap_or_default().to_owned(),
                t["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert!(
        listed.contains(&(task_id.clone(), "completed".to_owned())),
        "{kind}: {listed:?}"
    );
    assert!(
        listed.contains(&(second_id.clone(), "cancelled".to_owned())),
        "{kind}: {listed:?}"
    );
    let unknown = ask(&mut ws, 9, "tasks/get", json!({"taskId": "no-such-task"})).await;
    assert_eq!(unknown["error"]["code"], -32602, "{kind}: {unknown}");
}

/// `gateway serve --connector sleds.toml`: the connector's projects served inside the gateway's
/// process. server-everything answers through it as through gateway-sled (all that
/// `everything_through_the_gateway` tries, and its health in `gateway_health`); the uplink in
/// memory still presents its token and identity key (a project whose token is wrong is
/// refused, as over a socket); and at SIGTERM the gateway exits cleanly, its children with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_a_connector_config_in_its_own_process() {
    let command = everything_command().await;
    let toml = format!(
        "{}[[project]]\nname = \"wrong\"\nurl = \"http://127.0.0.1:9\"\ntoken = \"{TOKEN}\"\n",
        projects_toml()
    );
    let gw = processes::SingleGateway::prepare(&toml);
    let dir = processes::scratch("connector-in-process");
    std::fs::write(dir.join("everything.token"), TOKEN).unwrap();
    std::fs::write(dir.join("wrong.token"), "not-the-uplink-token-0123").unwrap();
    let quoted: Vec<String> = command.iter().map(|c| format!("{c:?}")).collect();
    let config = format!(
        "state_dir = \"{}\"\n\n\
         [[project]]\nname = \"everything\"\ncommand = [{}]\ntoken_file = \"{}\"\n\n\
         [[project]]\nname = \"wrong\"\ncommand = [{}]\ntoken_file = \"{}\"\n",
        dir.join("state").display(),
        quoted.join(", "),
        dir.join("everything.token").display(),
        quoted.join(", "),
        dir.join("wrong.token").display(),
    );
    std::fs::write(dir.join("sleds.toml"), &config).unwrap();
    // Named as the shared helpers expect a connector's log.
    let log = dir.join("sled.log");
    let mut gateway = gw
        .command()
        .arg("--connector")
        .arg(dir.join("sleds.toml"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    assert!(
        processes::wait_healthy(gw.port, Duration::from_secs(20)).await,
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // All of server-everything, as through gateway-sled (the helper reads the log it names).
    everything_through_the_gateway(&gw.url(), &dir).await;
    assert!(dir.join("state/everything.key").exists());
    let mut c = session(&gw.url()).await;
    let health = c
        .tools_call(json!(3), "gateway_health", json!({}))
        .await
        .unwrap();
    let everything = health["result"]["structuredContent"]["projects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["project"] == "everything")
        .cloned()
        .unwrap_or_else(|| panic!("{health}"));
    assert_eq!(everything["upstream"]["state"], "running", "{health}");

    // The project with the wrong token is never welcomed: its calls say so, and the gateway's
    // log says why.
    let refused = c
        .tools_call(
            json!(4),
            "echo",
            json!({"project": "wrong", "message": "x"}),
        )
        .await
        .unwrap();
    assert!(refused.get("error").is_some(), "{refused}");
    let text_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        text_log.contains("serving in the gateway's process"),
        "{text_log}"
    );
    assert!(
        text_log.contains("project 'wrong' requires its uplink token; the hello had a wrong token"),
        "{text_log}"
    );

    // SIGTERM: a clean exit, and the servers it started are gone.
    let pid = gateway.id().unwrap();
    let children = processes::children_of(pid);
    assert!(!children.is_empty(), "no server process under the gateway");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let status = tokio::time::timeout(Duration::from_secs(30), gateway.wait())
        .await
        .expect("the gateway exits within 30 s of SIGTERM")
        .unwrap();
    assert!(
        status.success(),
        "{status}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    for child in children {
        assert!(
            !processes::alive(child),
            "server {child} outlived the gateway"
        );
    }
}
