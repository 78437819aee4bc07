//! Hostile uplinks over real sockets: an oversized frame, garbled frames, binary frames,
//! responses to ids never sent, and frames before the hello. Each ends in a close or a
//! counted drop; the gateway keeps serving its real sled and its clients.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use gateway_tests::Stack;
use serde_json::json;
use sled_sim::{McpClient, SledOptions, TokioConnect};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

async fn connect(
    addr: std::net::SocketAddr,
) -> tokio_tungstenite::WebSocketStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let config = WebSocketConfig::default()
        .max_message_size(None)
        .max_frame_size(None);
    let (ws, _) = tokio_tungstenite::client_async_with_config(
        format!("ws://{addr}/uplink"),
        tcp,
        Some(config),
    )
    .await
    .unwrap();
    ws
}

/// Reads until the gateway closes the connection (or 5 s pass).
async fn closed(ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>) -> bool {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return true,
                Some(Ok(_)) => {}
            }
        }
    })
    .await
    .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_uplinks_are_closed_or_ignored_and_the_gateway_keeps_serving() {
    let registry = gateway_tests::registry(&["alpha", "beta"], Some("alpha"));
    let stack = Stack::start(registry, &["alpha"], SledOptions::default()).await;
    let addr = stack.addr;

    // A 17 MiB frame (the limit is 16 MiB): the connection is closed.
    let mut ws = connect(addr).await;
    let _ = ws.send(Message::text("x".repeat(17 << 20))).await;
    assert!(
        closed(&mut ws).await,
        "an oversized frame closes the uplink"
    );

    // Garbage, binary and a JSON-RPC message before the hello: closed with a protocol error.
    for first in [
        Message::text("{{{garbage"),
        Message::binary(vec![0u8, 159, 146, 150]),
        Message::text(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
    ] {
        let mut ws = connect(addr).await;
        ws.send(first).await.unwrap();
        assert!(closed(&mut ws).await);
    }

    // A live uplink for beta that then misbehaves: garbage, binary, responses to ids never
    // sent, unexpected control frames. All counted and ignored; beta stays live.
    let mut beta = connect(addr).await;
    beta.send(Message::text(
        r#"{"uplink":"hello","protocol":1,"project":"beta","sled":"beta"}"#,
    ))
    .await
    .unwrap();
    for m in [
        Message::text("not json"),
        Message::binary(vec![1, 2, 3]),
        Message::text(r#"{"jsonrpc":"2.0","id":999999,"result":{}}"#),
        Message::text(r#"{"jsonrpc":"2.0","id":"x","error":{"code":1,"message":"m"}}"#),
        Message::text(r#"{"uplink":"welcome","protocol":1,"heartbeat_ms":1}"#),
        Message::text(r#"{"uplink":"nonsense"}"#),
        Message::text("[]"),
    ] {
        beta.send(m).await.unwrap();
    }
    let mut c = McpClient::connect(TokioConnect, &stack.url())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let r = c
            .tools_call(json!(1), "list_projects", json!({}))
            .await
            .unwrap();
        let live: Vec<bool> = r["result"]["structuredContent"]["projects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["live"] == true)
            .collect();
        if live == [true, true] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "beta is not live: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The real sled still serves; the gateway still answers.
    let r = c
        .tools_call(json!(2), "whoami", json!({"project": "alpha"}))
        .await
        .unwrap();
    assert_eq!(r["result"]["structuredContent"]["project"], "alpha");
    drop(beta);
    stack.stop().await;
}
