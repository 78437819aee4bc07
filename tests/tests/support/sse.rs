#![allow(dead_code)] // each test file uses the part it needs
//! Long-lived SSE answers read over a raw connection: a session's GET stream, and the
//! stateless era's `subscriptions/listen`.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The events of one open SSE answer.
pub(crate) type Events = BufReader<TcpStream>;

/// Sends `head` (and `body`) on a new connection and reads the status line, which must be 200;
/// the rest is the stream.
async fn open(addr: SocketAddr, head: String, body: &str) -> Events {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    reader
}

/// Opens a session's GET stream.
pub(crate) async fn open_get_stream(addr: SocketAddr, session: &str) -> Events {
    open_get_stream_as(addr, session, None).await
}

/// Opens a session's GET stream as the client token `bearer`, if one is given.
pub(crate) async fn open_get_stream_as(
    addr: SocketAddr,
    session: &str,
    bearer: Option<&str>,
) -> Events {
    let authorization = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "GET /mcp HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nMcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n{authorization}\r\n"
    );
    open(addr, head, "").await
}

/// Opens a stateless `subscriptions/listen` (protocol 2026-07-28) with these `notifications`
/// and, when `project` is given, naming it in `_meta`.
pub(crate) async fn open_listen(
    addr: SocketAddr,
    notifications: Value,
    project: Option<&str>,
) -> Events {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    if let Some(p) = project {
        meta["io.mcp-gateway/project"] = json!(p);
    }
    let body = json!({"jsonrpc": "2.0", "id": "listen", "method": "subscriptions/listen",
        "params": {"notifications": notifications, "_meta": meta}})
    .to_string();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: subscriptions/listen\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    open(addr, head, &body).await
}

/// Opens a stateless `subscriptions/listen` (protocol 2026-07-28) with `params` as given (its
/// `_meta` included), as the client token `bearer`, if one is given.
pub(crate) async fn open_listen_as(
    addr: SocketAddr,
    params: Value,
    bearer: Option<&str>,
) -> Events {
    let authorization = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let body = json!({"jsonrpc": "2.0", "id": "listen", "method": "subscriptions/listen",
        "params": params})
    .to_string();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: subscriptions/listen\r\n{authorization}Content-Length: {}\r\n\r\n",
        body.len()
    );
    open(addr, head, &body).await
}

/// Reads SSE `data:` lines until one holds `needle` (20 s at most); returns that line.
pub(crate) async fn next_event_with(events: &mut Events, needle: &str) -> String {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let mut line = String::new();
            assert!(
                events.read_line(&mut line).await.unwrap() > 0,
                "the stream ended"
            );
            if line.starts_with("data:") && line.contains(needle) {
                return line;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no event with {needle:?} within 20 s"))
}

/// Reads SSE `data:` lines until one holds `needle` (20 s at most); returns every `data:` line
/// read, that one last.
pub(crate) async fn data_until(events: &mut Events, needle: &str) -> Vec<String> {
    tokio::time::timeout(Duration::from_secs(20), async {
        let mut data = Vec::new();
        loop {
            let mut line = String::new();
            assert!(
                events.read_line(&mut line).await.unwrap() > 0,
                "the stream ended"
            );
            if line.starts_with("data:") {
                let last = line.contains(needle);
                data.push(line);
                if last {
                    return data;
                }
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no event with {needle:?} within 20 s"))
}
