//! The shipped `gateway stdio` bridge, run as a desktop MCP client runs it: a child process fed
//! newline-delimited JSON-RPC on stdin, answering on stdout.

#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where `gateway stdio` takes its token from in one run.
pub enum Token<'a> {
    None,
    /// `--token-file FILE`.
    File(&'a Path),
    /// The `MCP_GATEWAY_TOKEN` environment variable.
    Env(&'a str),
}

/// Runs `gateway stdio --url url` with `token`, writes `messages` one per line, closes stdin,
/// and returns the lines it wrote (each a JSON-RPC message) once it exits.
pub async fn run(gateway: &Path, url: &str, token: Token<'_>, messages: &[Value]) -> Vec<Value> {
    run_with(gateway, url, token, &[], &[], messages).await
}

/// [`run`] with more arguments after `--url url`, and these environment variables set.
pub async fn run_with(
    gateway: &Path,
    url: &str,
    token: Token<'_>,
    args: &[&str],
    env: &[(&str, &str)],
    messages: &[Value],
) -> Vec<Value> {
    let mut cmd = tokio::process::Command::new(gateway);
    cmd.arg("stdio").arg("--url").arg(url).args(args);
    cmd.env_remove("MCP_GATEWAY_TOKEN");
    cmd.env_remove("MCP_GATEWAY_CA_FILE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    match token {
        Token::None => {}
        Token::File(path) => {
            cmd.arg("--token-file").arg(path);
        }
        Token::Env(t) => {
            cmd.env("MCP_GATEWAY_TOKEN", t);
        }
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("gateway stdio starts");
    let mut stdin = child.stdin.take().expect("piped");
    for m in messages {
        stdin
            .write_all(format!("{m}\n").as_bytes())
            .await
            .expect("the bridge reads its stdin");
    }
    drop(stdin);
    let mut out = String::new();
    let mut stdout = child.stdout.take().expect("piped");
    tokio::time::timeout(Duration::from_secs(30), stdout.read_to_string(&mut out))
        .await
        .expect("gateway stdio ends within 30 s of its input")
        .expect("its stdout reads");
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("gateway stdio exits")
        .expect("its status");
    assert!(status.success(), "gateway stdio exited {status}: {out}");
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The answer to request `id` among `lines`.
pub fn answer(lines: &[Value], id: i64) -> &Value {
    lines
        .iter()
        .find(|l| l["id"] == id)
        .unwrap_or_else(|| panic!("no answer to {id} in {lines:?}"))
}

/// An `initialize`, its `initialized`, and `then` (numbered from 2).
pub fn session(then: &[Value]) -> Vec<Value> {
    let mut messages = vec![
        serde_json::json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":{},
            "clientInfo":{"name":"desktop-client","version":"1"}}}),
        serde_json::json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    ];
    messages.extend_from_slice(then);
    messages
}
