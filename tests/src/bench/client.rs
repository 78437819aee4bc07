//! A lean HTTP/1 client for the benchmark: one keep-alive connection, prebuilt bodies, no JSON
//! parsing on the hot path (the answer is only checked for a JSON-RPC `result` that is not an
//! `isError` one), so the client costs as little of the shared cores as possible.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One HTTP/1 connection to one address, reopened if the server closed it.
pub(crate) struct Conn {
    addr: SocketAddr,
    host: HeaderValue,
    sender: Option<SendRequest<Full<Bytes>>>,
    /// `Mcp-Session-Id` sent with every request, once known.
    pub(crate) session: Option<HeaderValue>,
    /// `MCP-Protocol-Version` sent with every request, once known.
    pub(crate) version: Option<HeaderValue>,
}

/// What came back.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) session: Option<String>,
    pub(crate) body: Bytes,
}

impl Answer {
    /// A 200 with a JSON-RPC result that is not a tool error.
    pub(crate) fn is_ok(&self) -> bool {
        self.status == 200
            && contains(&self.body, b"\"result\"")
            && !contains(&self.body, b"\"isError\":true")
    }
}

pub(crate) fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

impl Conn {
    pub(crate) async fn connect(addr: SocketAddr) -> Result<Conn, BoxError> {
        let mut c = Conn {
            addr,
            host: HeaderValue::from_str(&addr.to_string())?,
            sender: None,
            session: None,
            version: None,
        };
        c.open().await?;
        Ok(c)
    }

    /// The address this connects to.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    async fn open(&mut self) -> Result<(), BoxError> {
        self.sender = None;
        let stream = TcpStream::connect(self.addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        self.sender = Some(sender);
        Ok(())
    }

    /// POSTs `body` to `path` and reads the whole answer.
    pub(crate) async fn post(&mut self, path: &str, body: Bytes) -> Result<Answer, BoxError> {
        let usable = match self.sender.as_mut() {
            Some(s) if !s.is_closed() => s.ready().await.is_ok(),
            _ => false,
        };
        if !usable {
            self.open().await?;
        }
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .body(Full::new(body))?;
        let h = req.headers_mut();
        h.insert(HOST, self.host.clone());
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        if let Some(s) = &self.session {
            h.insert("mcp-session-id", s.clone());
        }
        if let Some(v) = &self.version {
            h.insert("mcp-protocol-version", v.clone());
        }
        let sender = self.sender.as_mut().ok_or("no connection")?;
        let result = async {
            let resp = sender.send_request(req).await?;
            let status = resp.status().as_u16();
            let session = resp
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, BoxError>(Answer {
                status,
                session,
                body,
            })
        }
        .await;
        if result.is_err() {
            self.sender = None;
        }
        result
    }

    /// `initialize` then `notifications/initialized`; keeps the session id and version.
    pub(crate) async fn initialize(&mut self, path: &str) -> Result<(), BoxError> {
        let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"gateway-bench","version":"0"}}}"#;
        let a = self.post(path, Bytes::from_static(init.as_bytes())).await?;
        if a.status != 200 {
            return Err(format!("initialize: HTTP {}", a.status).into());
        }
        let v: serde_json::Value = serde_json::from_slice(&a.body)?;
        let version = v["result"]["protocolVersion"]
            .as_str()
            .ok_or("initialize: no protocolVersion")?;
        self.version = Some(HeaderValue::from_str(version)?);
        if let Some(s) = a.session {
            self.session = Some(HeaderValue::from_str(&s)?);
        }
        let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let a = self.post(path, Bytes::from_static(note.as_bytes())).await?;
        if a.status != 202 && a.status != 200 {
            return Err(format!("notifications/initialized: HTTP {}", a.status).into());
        }
        Ok(())
    }
}
