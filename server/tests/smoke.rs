//! Black-box smoke test: `serve` on a real loopback socket, spoken to in hand-written HTTP/1.1.
//! It drives the real core, so it needs `gateway_core::Gateway` implemented.

use std::net::SocketAddr;
use std::time::Duration;

use gateway_core::{ProjectSpec, Registry};
use gateway_server::{serve, ServerOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Every exchange must finish within this; a hang fails the test.
const PATIENCE: Duration = Duration::from_secs(10);

fn registry() -> Registry {
    Registry::from_projects(
        vec![
            ProjectSpec::new("alpha", "http://127.0.0.1:9101"),
            ProjectSpec::new("beta", "http://127.0.0.1:9102"),
        ],
        Some("alpha"),
    )
    .expect("a valid registry")
}

/// Sends one request with `Connection: close` and returns the status code, the head and the body.
async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("write head");
    stream.write_all(body).await.expect("write body");
    // Read to the end; a reset after the answer (the server closing with our body unread) ends
    // the answer like EOF does.
    let mut response = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = stream.read(&mut buf).await {
            response.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .unwrap_or_else(|_| panic!("no answer to {method} {path} within {PATIENCE:?}"));
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, head.to_owned(), body.to_owned())
}

#[tokio::test]
async fn healthz_and_garbage_json_get_answers_and_shutdown_returns() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let mut opts = ServerOptions::new(registry(), [7; 32]);
    opts.shutdown_grace = Duration::from_secs(1);
    opts.max_body_bytes = 1024;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, opts, async {
        let _ = stop_rx.await;
    }));

    let (status, _, body) = exchange(addr, "GET", "/healthz", &[], b"").await;
    assert_eq!((status, body.as_str()), (200, "ok"));

    let json = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    let (status, head, _) = exchange(addr, "POST", "/mcp", &json, b"{this is not json").await;
    assert!((400..500).contains(&status), "garbage JSON got {head}");

    let (status, _, body) = exchange(addr, "POST", "/mcp", &json, &[b' '; 2048]).await;
    assert_eq!(status, 413);
    assert_eq!(
        body,
        gateway_core::HttpError::PayloadTooLarge { limit: 1024 }.body()
    );

    let _ = stop_tx.send(());
    tokio::time::timeout(PATIENCE, server)
        .await
        .expect("serve returns after shutdown")
        .expect("serve task")
        .expect("serve result");
}
