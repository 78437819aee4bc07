//! MCP clients nobody here wrote, against the real gateway and fleet over loopback: the
//! official Python SDK (PyPI `mcp`). The client is installed on first use into
//! `target/clients/` from the package registry; later runs reuse it.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use gateway_tests::Stack;
use sled_sim::SledOptions;
use tokio::process::Command;

#[path = "support/python.rs"]
mod python;
use python::python_with_sdk;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_lists_calls_switches_hears_list_changed_and_cancels() {
    gateway_tests::init_tracing();
    let python = python_with_sdk().await;
    // delta is served by the conformance fixture: its test_sampling asks the client.
    let opts = SledOptions {
        latency: Duration::from_millis(300),
        fixture_projects: vec!["delta".into()],
        ..SledOptions::default()
    };
    let names = ["alpha", "beta", "gamma", "delta"];
    let mut stack =
        Stack::start(gateway_tests::registry(&names, Some("alpha")), &names, opts).await;
    let addr = stack.addr;

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/python_client.py");
    let mut child = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{addr}/mcp"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the Python client starts");
    let stdout_pipe = child.stdout.take().expect("piped");
    let mut stderr_pipe = child.stderr.take().expect("piped");
    let run = async {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt};
        let mut lines = tokio::io::BufReader::new(stdout_pipe).lines();
        let mut stdout = String::new();
        while let Some(line) = lines.next_line().await.expect("stdout is readable") {
            // The script listens for the stateless era's list_changed: change the tool list.
            if line == "LISTENING" {
                assert!(stack.fleet.stop("gamma"));
            }
            stdout.push_str(&line);
            stdout.push('\n');
        }
        let mut stderr = String::new();
        let _ = stderr_pipe.read_to_string(&mut stderr).await;
        let status = child.wait().await.expect("the Python client ran");
        (status, stdout, stderr)
    };
    let (status, stdout, stderr) = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the Python client finished within 120 s");
    println!("{stdout}");
    assert!(
        status.success(),
        "the Python SDK checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    stack.stop().await;
}

// The TypeScript SDK and the MCP Inspector CLI, on Node 22; Node and both packages come from
// the npm registry into `target/clients/node/` on first use (tests/tests/support/node.rs).

#[path = "support/node.rs"]
mod node;

/// The real gateway in front of alpha, beta and gamma (default alpha), whose sleds take
/// `latency` per call, over loopback.
struct Abc {
    url: String,
    stack: Stack,
}

impl Abc {
    async fn start(latency: Duration) -> Abc {
        let names = ["alpha", "beta", "gamma"];
        let opts = SledOptions {
            latency,
            ..SledOptions::default()
        };
        let stack =
            Stack::start(gateway_tests::registry(&names, Some("alpha")), &names, opts).await;
        Abc {
            url: stack.url(),
            stack,
        }
    }

    async fn stop(self) {
        self.stack.stop().await;
    }
}

/// Runs a Node program to completion within `limit`: its status and its stdout.
async fn run_node(mut cmd: Command, what: &str, limit: Duration) -> (bool, String) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what} finished within {limit:?}"))
        .unwrap_or_else(|e| panic!("{what} ran: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        println!("{what} stderr:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    (out.status.success(), stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_lists_calls_switches_hears_list_changed_and_cancels() {
    gateway_tests::init_tracing();
    let node = node::node().await;
    let gateway = Abc::start(Duration::from_millis(300)).await;

    // Run from the install directory, so that the script's imports find the SDK there.
    let script = node.script("ts_client.mjs");
    let mut cmd = node.command();
    cmd.arg(&script).arg(&gateway.url);
    let (ok, stdout) = run_node(cmd, "the TypeScript client", Duration::from_secs(120)).await;
    println!("{stdout}");
    assert!(ok, "the TypeScript SDK checks failed:\n{stdout}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_cli_lists_and_calls_tools() {
    gateway_tests::init_tracing();
    let node = node::node().await;
    let gateway = Abc::start(Duration::ZERO).await;
    let inspector = node.bin("@modelcontextprotocol/inspector", "mcp-inspector");

    // The README's command: `npx @modelcontextprotocol/inspector@2.12.0 --cli URL --transport
    // http --method tools/list`.
    let mut cmd = node.command();
    cmd.arg(&inspector)
        .args(["--cli", &gateway.url, "--transport", "http"])
        .args(["--method", "tools/list"]);
    let (ok, stdout) = run_node(cmd, "the Inspector CLI", Duration::from_secs(60)).await;
    assert!(ok, "inspector --cli --method tools/list failed:\n{stdout}");
    let listed: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("the Inspector printed JSON ({e}):\n{stdout}"));
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools array:\n{stdout}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    println!("tools/list through the Inspector: {names:?}");
    assert_eq!(names[..2], ["switch_project", "list_projects"], "{names:?}");
    assert!(
        names.contains(&"whoami") && names.contains(&"create_story"),
        "{names:?}"
    );

    let mut cmd = node.command();
    cmd.arg(&inspector)
        .args(["--cli", &gateway.url, "--transport", "http"])
        .args(["--method", "tools/call", "--tool-name", "whoami"])
        .args(["--tool-arg", "project=beta"]);
    let (ok, stdout) = run_node(cmd, "the Inspector CLI", Duration::from_secs(60)).await;
    assert!(ok, "inspector --cli --method tools/call failed:\n{stdout}");
    let called: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("the Inspector printed JSON ({e}):\n{stdout}"));
    assert_eq!(called["structuredContent"]["project"], "beta", "{stdout}");
    gateway.stop().await;
}
