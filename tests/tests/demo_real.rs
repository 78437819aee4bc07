//! `gateway demo --real` (issue 26): the demo's emulated fleet plus one real MCP server, npm's
//! `@modelcontextprotocol/server-everything`, as a fourth project `everything`, run over stdio
//! by gateway-sled's connector inside the demo's process.
//!
//! - With the pinned server (`--real-command "<node> <its dist/index.js> stdio"`): its tools
//!   are listed through the gateway's /mcp with `project` injected, its `echo` answers when
//!   called with `project: "everything"`, alpha still answers, and the server stops with the
//!   demo.
//! - Without Node on PATH (and no `--real-command`): the demo serves alpha, beta and gamma and
//!   says that the real server was not started, and why.

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

/// The server the demo runs, pinned as the connector's tests pin it (the same install).
const SERVERS: [(&str, &str); 1] = [("@modelcontextprotocol/server-everything", "2026.8.31")];

/// What the demo prints when it starts without the real server for want of Node.
const NO_NODE: &str = "gateway demo --real: Node is not installed (no `npx` on PATH); starting without the real server";

/// `gateway demo` on a port of its own, with `args` after `demo`, and `path` as its PATH when
/// given; its stdout and stderr in `dir/demo.log`.
struct Demo {
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl Demo {
    async fn start(dir: &Path, args: &[String], path: Option<&Path>) -> Demo {
        let port = processes::free_port();
        let log = dir.join("demo.log");
        let file = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(processes::workspace_bin("gateway"));
        command
            .args(["demo", "--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .kill_on_drop(true);
        if let Some(path) = path {
            command.env("PATH", path);
        }
        let child = command.spawn().expect("gateway demo starts");
        let demo = Demo {
            child: Some(child),
            port,
            log,
        };
        assert!(
            processes::wait_healthy(port, Duration::from_secs(30)).await,
            "gateway demo did not come up:\n{}",
            demo.log()
        );
        demo
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .and_then(Child::id)
            .expect("the demo runs")
    }

    /// SIGTERM, as Ctrl-C: the demo must exit within 30 s, with success.
    async fn terminate(&mut self) {
        let mut child = self.child.take().expect("the demo runs");
        let pid = child.id().expect("the demo runs").to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap();
        assert!(sent.success());
        let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .unwrap_or_else(|_| panic!("the demo did not exit within 30 s:\n{}", self.log()))
            .unwrap();
        assert!(
            status.success(),
            "the demo exited {status}:\n{}",
            self.log()
        );
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
    }
}

async fn session(url: &str) -> McpClient<TokioConnect> {
    let mut c = McpClient::connect(TokioConnect, url).await.unwrap();
    c.set_timeout(Some(Duration::from_secs(30)));
    c.initialize().await.unwrap();
    c
}

/// The projects `list_projects` says are live, in its order.
async fn live_projects(url: &str) -> Vec<String> {
    let mut c = McpClient::connect(TokioConnect, url).await.unwrap();
    let r = c
        .tools_call(json!(1), "list_projects", json!({}))
        .await
        .unwrap();
    r["result"]["structuredContent"]["projects"]
        .as_array()
        .unwrap_or_else(|| panic!("no projects in {r}"))
        .iter()
        .filter(|p| p["live"] == true)
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect()
}

/// Waits (up to `limit`) until exactly `want` are live.
async fn until_live(demo: &Demo, want: &[&str], limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let live = live_projects(&demo.url()).await;
        if live == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "live: {live:?}, not {want:?}:\n{}",
            demo.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// alpha answers a call of its own, through the demo.
async fn alpha_answers(c: &mut McpClient<TokioConnect>) {
    let r = c
        .tools_call(json!("alpha"), "whoami", json!({"project": "alpha"}))
        .await
        .unwrap();
    assert_eq!(r["result"]["structuredContent"]["project"], "alpha", "{r}");
}

fn text(r: &Value) -> &str {
    r["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {r}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_serves_server_everything_as_a_fourth_project() {
    let node = node::node().await;
    let servers = node::packages("servers", &SERVERS).await;
    let entry = servers.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let command = format!("{} {} stdio", node.node.display(), entry.display());
    let dir = processes::scratch("demo-real");
    let mut demo = Demo::start(
        &dir,
        &["--real".to_owned(), "--real-command".to_owned(), command],
        None,
    )
    .await;
    let url = demo.url();

    // The banner names the real project and how to call it.
    let banner = demo.log();
    for part in [
        "real MCP server, project everything",
        &format!("Its command: {}", node.node.display()),
        r#""name":"echo","arguments":{"message":"hello from the gateway","project":"everything"}"#,
    ] {
        assert!(banner.contains(part), "{part} is not in:\n{banner}");
    }

    // The real server's echo answers when named, once it has started (it is a child of the
    // demo's, with an uplink of its own).
    let mut c = session(&url).await;
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
        if r["result"]["content"][0]["text"] == "Echo: ready?" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "server-everything never answered through the demo: {r}\n{}",
            demo.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    until_live(
        &demo,
        &["alpha", "beta", "gamma", "everything"],
        Duration::from_secs(30),
    )
    .await;

    // Its tools, listed as this session's default project's, each with `project` injected
    // (polled: the gateway lists them once the server has answered its tools/list).
    let switched = c
        .tools_call(json!(1), "switch_project", json!({"project": "everything"}))
        .await
        .unwrap();
    assert_eq!(
        switched["result"]["structuredContent"]["live"], true,
        "{switched}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let tools = loop {
        let listed = c.tools_list(json!(2), None).await.unwrap();
        let tools = listed["result"]["tools"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if tools.iter().any(|t| t["name"] == "echo") {
            break tools;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "everything's tools are not listed: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for name in ["echo", "get-sum", "get-env"] {
        let tool = tools
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not listed: {tools:?}"));
        assert_eq!(
            tool["inputSchema"]["properties"]["project"]["type"], "string",
            "{tool}"
        );
    }
    // The emulated sleds' tools are not everything's.
    assert!(!tools.iter().any(|t| t["name"] == "create_story"));

    // echo, named and as the session's default; and alpha as before.
    let named = c
        .tools_call(
            json!(3),
            "echo",
            json!({"project": "everything", "message": "through the gateway"}),
        )
        .await
        .unwrap();
    assert_eq!(text(&named), "Echo: through the gateway");
    let by_default = c
        .tools_call(json!(4), "get-sum", json!({"a": 2, "b": 3}))
        .await
        .unwrap();
    assert_eq!(text(&by_default), "The sum of 2 and 3 is 5.");
    alpha_answers(&mut c).await;

    // gateway_health shows the real server running.
    let mut h = McpClient::connect(TokioConnect, &url).await.unwrap();
    let health = h
        .tools_call(json!(5), "gateway_health", json!({}))
        .await
        .unwrap();
    let everything = health["result"]["structuredContent"]["projects"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["project"] == "everything"))
        .unwrap_or_else(|| panic!("everything is not in {health}"))
        .clone();
    assert_eq!(everything["status"], "up", "{everything}");
    assert_eq!(everything["upstream"]["state"], "running", "{everything}");

    // The server is the demo's child, and it stops with the demo.
    let children = processes::children_of(demo.pid());
    assert!(
        !children.is_empty(),
        "the demo runs no child:\n{}",
        demo.log()
    );
    demo.terminate().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<u32> = children
            .iter()
            .copied()
            .filter(|p| processes::alive(*p))
            .collect();
        if left.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            for p in &left {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &p.to_string()])
                    .status();
            }
            panic!(
                "the real server ({left:?}) outlived the demo by 10 s:\n{}",
                demo.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_node_the_demo_starts_without_the_real_server_and_says_why() {
    let dir = processes::scratch("demo-real-no-node");
    // A PATH with nothing on it: no npx, no node.
    let empty = dir.join("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let mut demo = Demo::start(&dir, &["--real".to_owned()], Some(&empty)).await;

    until_live(&demo, &["alpha", "beta", "gamma"], Duration::from_secs(30)).await;
    let mut c = session(&demo.url()).await;
    alpha_answers(&mut c).await;
    // everything is not registered at all.
    let r = c
        .tools_call(
            json!(1),
            "echo",
            json!({"project": "everything", "message": "x"}),
        )
        .await
        .unwrap();
    assert_eq!(r["error"]["data"]["kind"], "unknown_project", "{r}");

    let log = demo.log();
    assert!(log.contains(NO_NODE), "{log}");
    assert!(
        log.contains("Real server: not started: Node is not installed (no `npx` on PATH)"),
        "{log}"
    );
    assert!(
        !log.contains("real MCP server, project everything"),
        "{log}"
    );
    assert!(
        processes::children_of(demo.pid()).is_empty(),
        "the demo started a child:\n{log}"
    );
    demo.terminate().await;
    let _ = std::fs::remove_dir_all(&dir);
}
