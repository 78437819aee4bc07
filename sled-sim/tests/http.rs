//! The direct HTTP endpoint driven by `McpClient` over real loopback TCP: client, router and
//! model working together.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use sled_sim::client::{ClientError, McpClient};
use sled_sim::mcp::{SharedSled, Sled};
use sled_sim::model::Project;
use sled_sim::net::TokioConnect;

const LIMIT: Duration = Duration::from_secs(10);

async fn serve(sled: SharedSled) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        sled_sim::http::serve(listener, sled, std::future::pending())
            .await
            .unwrap();
    });
    (addr, task)
}

fn structured(resp: &Value) -> &Value {
    assert!(resp.get("error").is_none(), "{resp}");
    assert_eq!(resp["result"].get("isError"), None, "{resp}");
    &resp["result"]["structuredContent"]
}

#[tokio::test]
async fn client_http_and_model_work_together() {
    tokio::time::timeout(LIMIT, async {
        let sled = SharedSled::new(Sled::new(Project::new("beta"), "beta", 9));
        let (addr, server) = serve(sled.clone()).await;
        let mut client = McpClient::connect(TokioConnect, &format!("http://{addr}/mcp"))
            .await
            .unwrap();

        let init = client.initialize().await.unwrap();
        assert_eq!(init["id"], 0);
        assert_eq!(init["result"]["protocolVersion"], "2025-11-25");
        assert_eq!(init["result"]["serverInfo"]["name"], "sled-sim");
        assert_eq!(
            client.session_id(),
            None,
            "the direct endpoint is stateless"
        );
        assert_eq!(client.protocol_version(), Some("2025-11-25"));

        let list = client.tools_list(json!(1), None).await.unwrap();
        assert_eq!(list["id"], 1);
        let tools = list["result"]["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 14);
        assert!(tools.iter().any(|t| t["name"] == "create_story"));

        let created = client
            .tools_call(
                json!(2),
                "create_story",
                json!({ "name": "Fix login", "acceptance_criteria": ["works"], "origin": "test" }),
            )
            .await
            .unwrap();
        assert_eq!(created["id"], 2);
        let story = &structured(&created)["story"];
        assert_eq!(story["id"], "beta-1");
        assert_eq!(structured(&created)["project"], "beta");

        let shown = client
            .tools_call(json!("three"), "show", json!({ "story_id": "beta-1" }))
            .await
            .unwrap();
        assert_eq!(shown["id"], "three");
        assert_eq!(structured(&shown)["story"]["name"], "Fix login");
        assert_eq!(structured(&shown)["story"]["origin"], "test");

        // The same story is in the shared model.
        let name = sled.with(|s| s.project().story("beta-1").map(|st| st.name.clone()));
        assert_eq!(name.as_deref(), Some("Fix login"));

        // Validation errors are tool results; unknown tools are JSON-RPC errors.
        let bad = client
            .tools_call(json!(4), "show", json!({ "story_id": "beta-2" }))
            .await
            .unwrap();
        assert_eq!(bad["result"]["isError"], true);
        let unknown = client
            .tools_call(json!(5), "nope", json!({}))
            .await
            .unwrap();
        assert_eq!(unknown["error"]["code"], -32602);
        assert_eq!(unknown["error"]["message"], "Unknown tool: nope");

        server.abort();
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn raw_requests_and_reconnects() {
    tokio::time::timeout(LIMIT, async {
        let sled = SharedSled::new(Sled::seeded("gamma", 1));
        let (addr, server) = serve(sled).await;
        let mut client = McpClient::connect(TokioConnect, &format!("http://{addr}/mcp"))
            .await
            .unwrap();

        let (status, headers, body) = client.post_raw(b"{not json".to_vec(), &[]).await.unwrap();
        assert_eq!(status, 400);
        assert_eq!(headers["content-type"], "application/json");
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], -32700);

        let (status, _, body) = client.post_raw(b"[]".to_vec(), &[]).await.unwrap();
        assert_eq!(status, 400);
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], -32600);

        let status = client
            .notify("notifications/initialized", Value::Null)
            .await
            .unwrap();
        assert_eq!(status, 202);

        let (status, _, _) = client
            .send_raw(
                hyper::Method::GET,
                Vec::new(),
                &[("accept", "text/event-stream")],
            )
            .await
            .unwrap();
        assert_eq!(status, 405);

        // The server closes the connection after this response; the next request must
        // reconnect by itself.
        let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec();
        let (status, headers, _) = client
            .post_raw(ping, &[("connection", "close")])
            .await
            .unwrap();
        assert_eq!(status, 200);
        assert_eq!(headers["connection"], "close");
        for i in 0..3 {
            let pong = client.request(json!(i), "ping", Value::Null).await.unwrap();
            assert_eq!(pong["result"], json!({}));
        }

        let who = client
            .tools_call(json!(9), "whoami", json!({}))
            .await
            .unwrap();
        assert_eq!(who["result"]["structuredContent"]["project"], "gamma");

        // Wrong path: a 404 is an HTTP error.
        let mut other = McpClient::connect(TokioConnect, &format!("http://{addr}/nope"))
            .await
            .unwrap();
        match other.request(json!(1), "ping", Value::Null).await {
            Err(ClientError::Http { status: 404, .. }) => {}
            other => panic!("expected HTTP 404, got {other:?}"),
        }

        // Nothing listening: connect fails with an I/O error.
        server.abort();
        let _ = server.await;
        let dead = McpClient::connect(TokioConnect, &format!("http://{addr}/mcp")).await;
        assert!(
            dead.is_err() || {
                let mut c = dead.unwrap();
                c.request(json!(1), "ping", Value::Null).await.is_err()
            }
        );
        assert!(McpClient::connect(TokioConnect, "wss://x/mcp")
            .await
            .is_err());
    })
    .await
    .expect("test timed out");
}

/// Sends one raw HTTP/1.1 request and reads the whole answer (the server closes after it).
async fn raw_request(addr: SocketAddr, request: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

#[tokio::test]
async fn get_root_is_a_health_check() {
    tokio::time::timeout(LIMIT, async {
        let sled = SharedSled::new(Sled::seeded("gamma", 2));
        let (addr, server) = serve(sled).await;
        let answer = raw_request(
            addr,
            "GET / HTTP/1.1\r\nHost: sled\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{head}"
        );
        let body: Value = serde_json::from_str(body).unwrap();
        assert_eq!(body, json!({"project": "gamma", "status": "ok"}));
        server.abort();
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn the_silent_router_accepts_and_never_answers() {
    tokio::time::timeout(LIMIT, async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(sled_sim::http::serve_silent(listener, async {
            let _ = stopped.await;
        }));
        for request in [
            "GET / HTTP/1.1\r\nHost: sled\r\nConnection: close\r\n\r\n",
            "POST /mcp HTTP/1.1\r\nHost: sled\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
            "GET /anything/else HTTP/1.1\r\nHost: sled\r\nConnection: close\r\n\r\n",
        ] {
            // The connection is accepted; the answer never comes.
            let waited =
                tokio::time::timeout(Duration::from_millis(300), raw_request(addr, request)).await;
            assert!(waited.is_err(), "{request:?} was answered: {waited:?}");
        }
        // The McpClient's own timeout fires too.
        let mut client = McpClient::connect(TokioConnect, &format!("http://{addr}/mcp"))
            .await
            .unwrap();
        client.set_timeout(Some(Duration::from_millis(200)));
        assert!(client.initialize().await.is_err());
        let _ = stop.send(());
        // Held requests keep a graceful shutdown waiting; the caller bounds it.
        let _ = tokio::time::timeout(Duration::from_millis(200), server).await;
    })
    .await
    .expect("test timed out");
}
