//! The conformance fixture over a real uplink, against a tiny fake gateway: progress and log
//! messages mid-call, sampling and elicitation requests answered (or refused) by the gateway,
//! and a cancelled call that never answers.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use gateway_core::uplink::{Control, PROTOCOL_VERSION, RELATED_REQUEST_META};
use serde_json::{json, Value};
use sled_sim::fixture::{Fixture, TOOL_NAMES};
use sled_sim::net::{GatewayAddr, TokioConnect};
use sled_sim::uplink::{run_uplink_with, Backend, UplinkOptions};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

type Ws = WebSocketStream<TcpStream>;

const LIMIT: Duration = Duration::from_secs(10);

async fn next_json(ws: &mut Ws) -> Option<Value> {
    loop {
        match timeout(LIMIT, ws.next()).await.expect("a frame in time")? {
            Ok(Message::Text(t)) => return Some(serde_json::from_str(&t).unwrap()),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

async fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

fn call(id: u64, name: &str, arguments: Value, meta: Option<Value>) -> Value {
    let mut params = json!({"name": name, "arguments": arguments});
    if let Some(meta) = meta {
        params["_meta"] = meta;
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// Frames up to and including the response with `id`.
async fn until_response(ws: &mut Ws, id: u64) -> (Vec<Value>, Value) {
    let mut before = Vec::new();
    loop {
        let frame = next_json(ws).await.expect("the uplink stays open");
        if frame["id"] == json!(id) && frame.get("method").is_none() {
            return (before, frame);
        }
        before.push(frame);
    }
}

#[tokio::test]
async fn fixture_tools_talk_to_the_gateway_mid_call() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let gateway = GatewayAddr::parse(&format!("http://{addr}")).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let opts = UplinkOptions {
        sled_name: "conf-sled".to_owned(),
        ..UplinkOptions::default()
    };
    let backend = Backend::Handler(Arc::new(Fixture::new("conf")));
    let task = tokio::spawn(run_uplink_with(
        TokioConnect,
        gateway,
        backend,
        opts,
        async {
            let _ = stopped.await;
        },
    ));

    let (tcp, _) = listener.accept().await.unwrap();
    let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
    let hello: Control = serde_json::from_value(next_json(&mut ws).await.unwrap()).unwrap();
    assert_eq!(
        hello,
        Control::Hello {
            protocol: PROTOCOL_VERSION,
            project: "conf".into(),
            sled: "conf-sled".into(),
            token: None,
            key: None,
            fence: None,
            epoch_seen: None,
            moving: false,
        }
    );
    let welcome = Control::Welcome {
        protocol: PROTOCOL_VERSION,
        heartbeat_ms: 0,
        epoch: None,
    };
    ws.send(Message::text(welcome.to_text())).await.unwrap();

    // tools/list: every fixture tool.
    send(
        &mut ws,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    )
    .await;
    let (_, listed) = until_response(&mut ws, 1).await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, TOOL_NAMES);

    // Progress under the gateway's token, increasing, before the response.
    send(
        &mut ws,
        call(
            2,
            "test_tool_with_progress",
            json!({}),
            Some(json!({"progressToken": "gw-1-2"})),
        ),
    )
    .await;
    let (before, response) = until_response(&mut ws, 2).await;
    let progress: Vec<f64> = before
        .iter()
        .filter(|f| f["method"] == "notifications/progress")
        .inspect(|f| assert_eq!(f["params"]["progressToken"], "gw-1-2"))
        .map(|f| f["params"]["progress"].as_f64().unwrap())
        .collect();
    assert_eq!(progress, [0.0, 50.0, 100.0]);
    assert!(response["result"]["content"][0]["text"].is_string());

    // Log messages naming the call.
    send(&mut ws, call(3, "test_tool_with_logging", json!({}), None)).await;
    let (before, response) = until_response(&mut ws, 3).await;
    assert_eq!(before.len(), 3, "{before:?}");
    for f in &before {
        assert_eq!(f["method"], "notifications/message");
        assert_eq!(f["params"]["level"], "info");
        assert_eq!(f["params"]["_meta"][RELATED_REQUEST_META], 3);
    }
    assert!(response["result"].get("isError").is_none(), "{response}");

    // Sampling: a request naming the call; the answer makes the result.
    send(
        &mut ws,
        call(4, "test_sampling", json!({"prompt": "say hi"}), None),
    )
    .await;
    let request = next_json(&mut ws).await.unwrap();
    assert_eq!(request["method"], "sampling/createMessage");
    assert_eq!(request["params"]["_meta"][RELATED_REQUEST_META], 4);
    assert_eq!(
        request["params"]["messages"][0]["content"]["text"],
        "say hi"
    );
    let answer =
        json!({"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"});
    send(
        &mut ws,
        json!({"jsonrpc": "2.0", "id": request["id"], "result": answer}),
    )
    .await;
    let (_, response) = until_response(&mut ws, 4).await;
    assert_eq!(response["result"]["content"][0]["text"], "LLM response: hi");

    // Elicitation refused by the gateway: an isError result that says why.
    send(
        &mut ws,
        call(5, "test_elicitation", json!({"message": "who?"}), None),
    )
    .await;
    let request = next_json(&mut ws).await.unwrap();
    assert_eq!(request["method"], "elicitation/create");
    let refusal = json!({"code": -32601, "message": "no elicitation capability"});
    send(
        &mut ws,
        json!({"jsonrpc": "2.0", "id": request["id"], "error": refusal}),
    )
    .await;
    let (_, response) = until_response(&mut ws, 5).await;
    assert_eq!(response["result"]["isError"], true);
    let text = response["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("-32601") && text.contains("no elicitation capability"),
        "{text}"
    );

    // A call cancelled while it waits for its client never answers; the next one does.
    send(
        &mut ws,
        call(6, "test_sampling", json!({"prompt": "never mind"}), None),
    )
    .await;
    let request = next_json(&mut ws).await.unwrap();
    assert_eq!(request["method"], "sampling/createMessage");
    send(
        &mut ws,
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 6}}),
    )
    .await;
    // A late answer to the cancelled call's request goes nowhere.
    send(
        &mut ws,
        json!({"jsonrpc": "2.0", "id": request["id"], "result": answer}),
    )
    .await;
    send(&mut ws, call(7, "test_simple_text", json!({}), None)).await;
    let (before, response) = until_response(&mut ws, 7).await;
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(
        response["result"]["content"][0]["text"],
        "This is a simple text response for testing."
    );
    assert!(
        timeout(Duration::from_millis(200), ws.next())
            .await
            .is_err(),
        "nothing more (no answer to the cancelled call)"
    );

    // Unknown tools are -32602.
    send(&mut ws, call(8, "nope", json!({}), None)).await;
    let (_, response) = until_response(&mut ws, 8).await;
    assert_eq!(response["error"]["code"], -32602);

    let _ = stop.send(());
    timeout(LIMIT, task).await.unwrap().unwrap();
}
