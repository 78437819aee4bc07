//! Tool schemas as real MCP servers write them (issue 26): a root that is a `$ref` into
//! `$defs`, compositions (`allOf`, `anyOf`, `oneOf`), closed objects. The gateway adds
//! `project` to each; a client that validates its arguments against the listed schema, with
//! the validator the official TypeScript SDK uses (Ajv, JSON Schema 2020-12), must accept a
//! call that names its project, and the server must never see `project`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use gateway_tests::Stack;
use serde_json::{json, Value};
use sled_sim::{McpClient, SledOptions, TokioConnect};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

#[path = "support/node.rs"]
mod node;

/// The tools of the server behind beta: one of each shape, with arguments it accepts.
fn shapes() -> Vec<(Value, Value)> {
    let closed = |props: Value, required: Value| json!({"type": "object", "properties": props, "required": required, "additionalProperties": false});
    vec![
        (
            json!({"name": "closed", "inputSchema":
                closed(json!({"name": {"type": "string"}}), json!(["name"]))}),
            json!({"name": "x"}),
        ),
        (
            json!({"name": "by_ref", "inputSchema": {
                "$ref": "#/$defs/Args",
                "$defs": {"Args": closed(json!({"entityName": {"type": "string"}}), json!(["entityName"]))}
            }}),
            json!({"entityName": "x"}),
        ),
        (
            json!({"name": "all_of", "inputSchema": {
                "allOf": [
                    {"$ref": "#/$defs/Base"},
                    {"properties": {"n": {"type": "integer"}}, "required": ["n"]}
                ],
                "unevaluatedProperties": false,
                "$defs": {"Base": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}
            }}),
            json!({"id": "x", "n": 1}),
        ),
        (
            json!({"name": "any_of", "inputSchema": {"anyOf": [
                closed(json!({"a": {"type": "string"}}), json!(["a"])),
                closed(json!({"b": {"type": "string"}}), json!(["b"]))
            ]}}),
            json!({"b": "x"}),
        ),
        (
            json!({"name": "one_of", "inputSchema": {"oneOf": [
                closed(json!({"kind": {"const": "file"}, "path": {"type": "string"}}), json!(["kind", "path"])),
                closed(json!({"kind": {"const": "url"}, "url": {"type": "string"}}), json!(["kind", "url"]))
            ]}}),
            json!({"kind": "url", "url": "x"}),
        ),
    ]
}

/// A minimal server on beta's uplink: lists `tools`, and answers each call with its arguments
/// (also sent on the channel returned).
async fn sled(addr: std::net::SocketAddr, tools: Vec<Value>) -> mpsc::UnboundedReceiver<Value> {
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/uplink"))
        .await
        .expect("the uplink connects");
    let (mut tx, mut rx) = ws.split();
    tx.send(Message::text(
        r#"{"uplink":"hello","protocol":1,"project":"beta","sled":"beta"}"#,
    ))
    .await
    .unwrap();
    let (calls_tx, calls) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(Message::Text(text))) = rx.next().await {
            let Ok(m) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            let (Some(id), Some(method)) = (m.get("id"), m["method"].as_str()) else {
                continue;
            };
            let result = match method {
                "tools/list" => json!({"tools": tools}),
                "tools/call" => {
                    let args = m["params"]["arguments"].clone();
                    let _ = calls_tx.send(args.clone());
                    json!({"content": [{"type": "text", "text": args.to_string()}]})
                }
                _ => json!({}),
            };
            let answer = json!({"jsonrpc": "2.0", "id": id, "result": result});
            if tx.send(Message::text(answer.to_string())).await.is_err() {
                return;
            }
        }
    });
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validating_client_accepts_project_in_schemas_of_every_shape() {
    gateway_tests::init_tracing();
    let node = node::node().await;
    let registry = gateway_tests::registry(&["alpha", "beta"], Some("beta"));
    let stack = Stack::start(registry, &["alpha"], SledOptions::default()).await;
    let shapes = shapes();
    let mut calls = sled(stack.addr, shapes.iter().map(|(t, _)| t.clone()).collect()).await;

    let mut c = McpClient::connect(TokioConnect, &stack.url())
        .await
        .unwrap();
    c.initialize().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let listed: Vec<Value> = loop {
        let r = c.tools_list(json!(1), None).await.unwrap();
        let tools = r["result"]["tools"].as_array().cloned().unwrap_or_default();
        if tools.iter().any(|t| t["name"] == "by_ref") {
            break tools;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "beta's tools are not listed: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // For each shape: with `project`, the listed schema accepts the arguments and the server's
    // own refuses them (so this check can fail); without it, and with an argument nobody
    // declared, the listed schema decides as the server's does.
    let mut cases = Vec::new();
    for (tool, args) in &shapes {
        let name = tool["name"].as_str().unwrap();
        let schema = listed
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| t["inputSchema"].clone())
            .unwrap_or_else(|| panic!("{name} is listed"));
        let mut with_project = args.clone();
        with_project["project"] = json!("beta");
        let mut stray = args.clone();
        stray["zzz"] = json!(1);
        for (what, schema, args, valid) in [
            ("listed, with project", &schema, &with_project, true),
            (
                "the server's, with project",
                &tool["inputSchema"],
                &with_project,
                false,
            ),
            ("listed, without project", &schema, args, true),
            ("listed, an undeclared argument", &schema, &stray, false),
        ] {
            cases.push(json!({"name": format!("{name}: {what}"), "schema": schema, "args": args, "valid": valid}));
        }
    }
    let file = node.dir.join("schema_cases.json");
    std::fs::write(&file, json!({ "cases": cases }).to_string()).unwrap();
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/validate_schemas.mjs");
    let script = node.dir.join("validate_schemas.mjs");
    std::fs::copy(&source, &script).expect("the script can be copied next to Ajv");
    let mut cmd = node.command();
    cmd.arg(&script)
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the validator finishes")
        .expect("the validator runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "a schema decided wrongly:\n{stdout}");
    assert!(
        stdout.contains(&format!("{} passed, 0 failed", cases.len())),
        "{stdout}"
    );

    // Called through the gateway, each reaches the server without `project`.
    for (i, (tool, args)) in shapes.iter().enumerate() {
        let mut with_project = args.clone();
        with_project["project"] = json!("beta");
        let name = tool["name"].as_str().unwrap();
        let r = c
            .tools_call(json!(10 + i), name, with_project)
            .await
            .unwrap();
        assert!(r["result"]["content"].is_array(), "{name}: {r}");
        let seen = tokio::time::timeout(Duration::from_secs(5), calls.recv())
            .await
            .expect("the server is called")
            .unwrap();
        assert_eq!(
            &seen, args,
            "{name}: the server sees its own arguments only"
        );
    }
    stack.stop().await;
}
