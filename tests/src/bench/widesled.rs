//! A sled that exposes many tools, emulated in the benchmark over the uplink protocol
//! (`gateway_core::uplink`): hello, pongs, one `tools/list` page with every tool, and a small
//! result for any `tools/call`. sled-sim's sleds have 13 tools; this is how the benchmark gets
//! a project with 1,000.

use futures_util::{SinkExt, StreamExt};
use gateway_core::uplink::{Control, PROTOCOL_VERSION, UPLINK_PATH};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::client::BoxError;

/// The `result` of a `tools/list` holding `n` tools, each with a small but realistic schema.
pub(crate) fn tools_result(n: usize) -> Value {
    let tools: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "name": format!("tool_{i:04}"),
                "description": format!("Tool number {i} of this project: does one thing to a story and reports what it did."),
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "story_id": {"type": "string", "description": "The story to act on."},
                        "note": {"type": "string", "description": "Free text."},
                        "count": {"type": "integer", "minimum": 0}
                    },
                    "required": ["story_id"]
                }
            })
        })
        .collect();
    json!({ "tools": tools })
}

/// Connects one sled for `project` to the gateway on `port` and serves until the socket
/// closes. Returns once the gateway has welcomed it; the serving goes on in a task.
pub(crate) async fn connect(
    port: u16,
    project: String,
    tools: std::sync::Arc<String>,
) -> Result<tokio::task::JoinHandle<()>, BoxError> {
    let url = format!("ws://127.0.0.1:{port}{UPLINK_PATH}");
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str()).await?;
    let hello = Control::Hello {
        protocol: PROTOCOL_VERSION,
        project: project.clone(),
        sled: project.clone(),
        token: None,
        key: None,
        fence: None,
        epoch_seen: None,
        moving: false,
    };
    ws.send(Message::text(hello.to_text())).await?;
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) if t.contains("\"welcome\"") => break,
            Some(Ok(Message::Text(t))) if t.contains("\"closing\"") => {
                return Err(format!("{project}: refused: {}", t.as_str()).into())
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.into()),
            None => return Err(format!("{project}: closed before welcome").into()),
        }
    }
    Ok(tokio::spawn(async move {
        while let Some(Ok(msg)) = ws.next().await {
            let Message::Text(text) = msg else { continue };
            let Ok(v) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            let reply = if let Some(seq) = v.get("uplink").and(v.get("seq")) {
                Some(json!({"uplink": "pong", "seq": seq}).to_string())
            } else if let (Some(id), Some(method)) = (v.get("id"), v["method"].as_str()) {
                Some(match method {
                    "tools/list" => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{tools}}}"#),
                    "tools/call" => json!({"jsonrpc": "2.0", "id": id, "result": {
                        "content": [{"type": "text", "text": "done"}],
                        "structuredContent": {"project": project}
                    }})
                    .to_string(),
                    _ => json!({"jsonrpc": "2.0", "id": id,
                        "error": {"code": -32601, "message": "Method not found"}})
                    .to_string(),
                })
            } else {
                None
            };
            if let Some(r) = reply {
                if ws.send(Message::text(r)).await.is_err() {
                    break;
                }
            }
        }
    }))
}
