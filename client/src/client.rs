//! A small MCP Streamable-HTTP client over hyper 1, generic over [`Connect`] so tests and
//! simulations can drive a gateway (or a sled's direct endpoint).
//!
//! One HTTP/1 connection at a time, reopened automatically when it closed. After
//! [`McpClient::initialize`] every request carries the `Mcp-Session-Id` the server gave and the
//! negotiated `MCP-Protocol-Version`. Responses may be `application/json` or a
//! `text/event-stream`; for the latter the JSON-RPC response is picked out of the events.

use std::io;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE, HOST};
use hyper::{HeaderMap, Method, Request};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tracing::debug;

use crate::net::{Connect, HttpUrl};
use crate::tls::{dial, TlsTrust};

/// The session header.
pub const SESSION_HEADER: &str = "mcp-session-id";
/// The protocol version header sent after initialize.
pub const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";
/// The protocol version [`McpClient::initialize`] asks for.
pub const PROTOCOL_VERSION: &str = "2025-11-25";
/// The `clientInfo.name` [`McpClient::initialize`] sends unless told otherwise
/// ([`McpClient::set_client_name`]).
pub const DEFAULT_CLIENT_NAME: &str = "gateway-client";
/// How long a request may take by default (see [`McpClient::set_timeout`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// What went wrong with a request.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connecting, writing or reading failed (HTTP protocol errors included).
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The server answered with a non-success status.
    #[error("HTTP {status}: {body}")]
    Http { status: u16, body: String },
    /// The response body was not the JSON expected.
    #[error("invalid JSON in the response: {0}")]
    Json(#[from] serde_json::Error),
    /// No complete response within the timeout (the connection is dropped).
    #[error("no response within {0:?}")]
    Timeout(Duration),
    /// The response was well-formed but not what MCP says it should be.
    #[error("protocol error: {0}")]
    Protocol(String),
}

fn hyper_err(e: hyper::Error) -> ClientError {
    ClientError::Io(io::Error::other(e))
}

/// The JSON-RPC response to a server's request, once it is made
/// ([`McpClient::request_streaming_async`]).
pub type AnswerFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Value> + Send>>;

/// An MCP client session against one endpoint.
pub struct McpClient<C: Connect> {
    connector: C,
    trust: TlsTrust,
    url: HttpUrl,
    host_port: String,
    sender: Option<SendRequest<Full<Bytes>>>,
    session_id: Option<String>,
    protocol_version: Option<String>,
    timeout: Option<Duration>,
    client_name: String,
    authorization: Option<String>,
}

impl<C: Connect> std::fmt::Debug for McpClient<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpClient")
            .field("url", &self.url)
            .field("connected", &self.sender.is_some())
            .field("session_id", &self.session_id)
            .field("protocol_version", &self.protocol_version)
            .finish()
    }
}

impl<C: Connect> McpClient<C> {
    /// Parses `url` (`http://host:port/mcp`, or `https://…`, verified against the system's
    /// CA certificates) and opens the HTTP/1 connection.
    pub async fn connect(connector: C, url: &str) -> io::Result<Self> {
        McpClient::connect_with(connector, url, TlsTrust::system()).await
    }

    /// [`McpClient::connect`], verifying an `https://` server against `trust`.
    pub async fn connect_with(connector: C, url: &str, trust: TlsTrust) -> io::Result<Self> {
        let url =
            HttpUrl::parse(url).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut client = McpClient {
            connector,
            trust,
            host_port: url.host_port(),
            url,
            sender: None,
            session_id: None,
            protocol_version: None,
            timeout: Some(DEFAULT_TIMEOUT),
            client_name: DEFAULT_CLIENT_NAME.to_owned(),
            authorization: None,
        };
        client.open().await?;
        Ok(client)
    }

    async fn open(&mut self) -> io::Result<()> {
        self.sender = None;
        let stream = dial(&self.connector, &self.url, &self.trust).await?;
        let (sender, conn) = http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(io::Error::other)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(error = %e, "MCP client connection ended");
            }
        });
        self.sender = Some(sender);
        Ok(())
    }

    /// A ready sender, reconnecting if the connection closed.
    async fn ready(&mut self) -> io::Result<&mut SendRequest<Full<Bytes>>> {
        let usable = match self.sender.as_mut() {
            Some(s) if !s.is_closed() => s.ready().await.is_ok(),
            _ => false,
        };
        if !usable {
            self.open().await?;
        }
        self.sender
            .as_mut()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no connection"))
    }

    /// The session id the server gave at initialize, if any.
    pub fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    /// Replaces the session id sent with each request (`None`: send none).
    pub fn set_session_id(&mut self, id: Option<String>) {
        self.session_id = id;
    }

    /// The protocol version negotiated at initialize, if any.
    pub fn protocol_version(&self) -> Option<&str> {
        self.protocol_version.as_deref()
    }

    /// Replaces the `MCP-Protocol-Version` sent with each request (`None`: send none).
    pub fn set_protocol_version(&mut self, version: Option<String>) {
        self.protocol_version = version;
    }

    /// How long one request may take (`None`: forever). The default is [`DEFAULT_TIMEOUT`].
    pub fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
    }

    /// The `clientInfo.name` sent at initialize (default [`DEFAULT_CLIENT_NAME`]).
    pub fn set_client_name(&mut self, name: impl Into<String>) {
        self.client_name = name.into();
    }

    /// Sends `Authorization: Bearer <token>` with every request (`None`: no such header).
    pub fn set_bearer_token(&mut self, token: Option<String>) {
        self.authorization = token.map(|t| format!("Bearer {t}"));
    }

    /// The endpoint URL.
    pub fn url(&self) -> &HttpUrl {
        &self.url
    }

    /// Sends one HTTP request to the endpoint with the default headers (`Host`, `Accept`,
    /// `Content-Type` when there is a body, the session id and protocol version when known),
    /// then `headers`: each replaces the header of that name, and an empty value removes it.
    /// Returns status, headers and the whole body.
    pub async fn send_raw(
        &mut self,
        method: Method,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Result<(u16, HeaderMap, Bytes), ClientError> {
        let request = self.build_request(method, body, headers)?;
        let limit = self.timeout;
        let exchange = async {
            let sender = self.ready().await?;
            let response = sender.send_request(request).await.map_err(hyper_err)?;
            let (parts, body) = response.into_parts();
            let bytes = body.collect().await.map_err(hyper_err)?.to_bytes();
            Ok::<_, ClientError>((parts.status.as_u16(), parts.headers, bytes))
        };
        let result = match limit {
            Some(limit) => match tokio::time::timeout(limit, exchange).await {
                Ok(r) => r,
                Err(_) => {
                    self.sender = None;
                    return Err(ClientError::Timeout(limit));
                }
            },
            None => exchange.await,
        };
        if result.is_err() {
            // The connection may be half-way through a response: start afresh next time.
            self.sender = None;
        }
        result
    }

    /// The request [`McpClient::send_raw`] sends.
    fn build_request(
        &self,
        method: Method,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Result<Request<Full<Bytes>>, ClientError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(self.url.path.as_str());
        let map = builder
            .headers_mut()
            .ok_or_else(|| ClientError::Protocol("bad request path".to_owned()))?;
        let invalid = |what: &str| {
            ClientError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid header {what}"),
            ))
        };
        let value = |v: &str| HeaderValue::from_str(v).map_err(|_| invalid(v));
        map.insert(HOST, value(&self.host_port)?);
        map.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        if !body.is_empty() {
            map.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(id) = &self.session_id {
            map.insert(SESSION_HEADER, value(id)?);
        }
        if let Some(v) = &self.protocol_version {
            map.insert(PROTOCOL_VERSION_HEADER, value(v)?);
        }
        if let Some(v) = &self.authorization {
            let mut v = HeaderValue::from_str(v).map_err(|_| invalid("Authorization"))?;
            v.set_sensitive(true);
            map.insert(hyper::header::AUTHORIZATION, v);
        }
        for (name, v) in headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid(name))?;
            if v.is_empty() {
                map.remove(&name);
            } else {
                map.insert(name, value(v)?);
            }
        }
        builder
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// POSTs `body` as is (see [`McpClient::send_raw`] for the headers); for tests that send
    /// garbage.
    pub async fn post_raw(
        &mut self,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Result<(u16, HeaderMap, Bytes), ClientError> {
        self.send_raw(Method::POST, body, headers).await
    }

    /// Sends a JSON-RPC request and returns the whole JSON-RPC response object (a JSON-RPC
    /// error is a successful return). A non-2xx status is [`ClientError::Http`].
    pub async fn request(
        &mut self,
        id: Value,
        method: &str,
        params: Value,
    ) -> Result<Value, ClientError> {
        self.exchange(id, method, params).await.map(|(v, _)| v)
    }

    async fn exchange(
        &mut self,
        id: Value,
        method: &str,
        params: Value,
    ) -> Result<(Value, HeaderMap), ClientError> {
        let mut msg = json!({ "jsonrpc": "2.0", "id": id, "method": method });
        if !params.is_null() {
            msg["params"] = params;
        }
        let (status, headers, body) = self.post_raw(msg.to_string().into_bytes(), &[]).await?;
        if !(200..300).contains(&status) {
            return Err(ClientError::Http {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        if status == 202 || body.is_empty() {
            return Err(ClientError::Protocol(format!(
                "HTTP {status} without a body in answer to request {method}"
            )));
        }
        let is_sse = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        let response = if is_sse {
            response_from_sse(&body, &id)?
        } else {
            serde_json::from_slice(&body)?
        };
        Ok((response, headers))
    }

    /// Sends a JSON-RPC request and reads its answer; when the answer is an event stream, each
    /// request the server sends on it (e.g. `sampling/createMessage`) is answered as it comes
    /// with the JSON-RPC response `answer` makes of it, POSTed on a connection of its own (the
    /// stream holds this one). Returns the JSON-RPC response and every request seen, each with
    /// the HTTP status its answer got (or why it got none). Under the client's timeout as a whole.
    pub async fn request_answering(
        &mut self,
        id: Value,
        method: &str,
        params: Value,
        answer: &mut (dyn FnMut(&Value) -> Value + Send),
    ) -> Result<(Value, Vec<AnsweredRequest>), ClientError> {
        self.request_streaming(id, method, params, &[], answer, &mut |_| {})
            .await
    }

    /// [`McpClient::request_answering`] with `headers` on the POST (each replaces the default
    /// of that name, as in [`McpClient::send_raw`]), handing `notified` each notification the
    /// server sends on the answer's event stream (`notifications/progress`, say) as it comes.
    pub async fn request_streaming(
        &mut self,
        id: Value,
        method: &str,
        params: Value,
        headers: &[(&str, &str)],
        answer: &mut (dyn FnMut(&Value) -> Value + Send),
        notified: &mut (dyn FnMut(&Value) + Send),
    ) -> Result<(Value, Vec<AnsweredRequest>), ClientError> {
        let answer = &mut |m: &Value| -> AnswerFuture {
            let reply = answer(m);
            Box::pin(async move { reply })
        };
        self.request_streaming_async(id, method, params, headers, answer, notified)
            .await
    }

    /// [`McpClient::request_streaming`] whose answers to the server's requests take time to
    /// make (a relay asks someone else): `answer` returns a future of the JSON-RPC response,
    /// awaited before the stream is read further.
    pub async fn request_streaming_async(
        &mut self,
        id: Value,
        method: &str,
        params: Value,
        headers: &[(&str, &str)],
        answer: &mut (dyn FnMut(&Value) -> AnswerFuture + Send),
        notified: &mut (dyn FnMut(&Value) + Send),
    ) -> Result<(Value, Vec<AnsweredRequest>), ClientError> {
        let mut msg = json!({ "jsonrpc": "2.0", "id": id, "method": method });
        if !params.is_null() {
            msg["params"] = params;
        }
        let request = self.build_request(Method::POST, msg.to_string().into_bytes(), headers)?;
        let limit = self.timeout;
        let exchange = async {
            let sender = self.ready().await?;
            let response = sender.send_request(request).await.map_err(hyper_err)?;
            let (parts, mut body) = response.into_parts();
            let status = parts.status.as_u16();
            let is_sse = parts
                .headers
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
            if !(200..300).contains(&status) || !is_sse {
                let bytes = body.collect().await.map_err(hyper_err)?.to_bytes();
                if !(200..300).contains(&status) {
                    return Err(ClientError::Http {
                        status,
                        body: String::from_utf8_lossy(&bytes).into_owned(),
                    });
                }
                if bytes.is_empty() {
                    return Err(ClientError::Protocol(format!(
                        "HTTP {status} without a body in answer to request {method}"
                    )));
                }
                return Ok((serde_json::from_slice(&bytes)?, Vec::new()));
            }
            let mut seen = Vec::new();
            let mut events = SseEvents::default();
            let mut found: Option<Value> = None;
            let mut fallback: Option<Value> = None;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(hyper_err)?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                for m in events.push(&data) {
                    let is_response = m.get("result").is_some() || m.get("error").is_some();
                    if is_response && m.get("id") == Some(&id) {
                        found = Some(m);
                    } else if is_response {
                        fallback = Some(m);
                    } else if m.get("method").is_some() && m.get("id").is_some() {
                        let reply = answer(&m).await;
                        let answered = self.post_aside(reply.to_string().into_bytes()).await;
                        seen.push(AnsweredRequest {
                            request: m,
                            answered: answered.map_err(|e| e.to_string()),
                        });
                    } else if m.get("method").is_some() {
                        notified(&m);
                    }
                }
            }
            let response = found.or(fallback).ok_or_else(|| {
                ClientError::Protocol("the event stream held no JSON-RPC response".to_owned())
            })?;
            Ok((response, seen))
        };
        let result = match limit {
            Some(limit) => match tokio::time::timeout(limit, exchange).await {
                Ok(r) => r,
                Err(_) => Err(ClientError::Timeout(limit)),
            },
            None => exchange.await,
        };
        if result.is_err() {
            self.sender = None;
        }
        result
    }

    /// Drops the connection. An answer still streaming on it is abandoned: the server sees the
    /// connection close, which in 2026-07-28 cancels the request. The next request connects
    /// anew.
    pub fn disconnect(&mut self) {
        self.sender = None;
    }

    /// POSTs `body` on a connection of its own; returns the HTTP status.
    async fn post_aside(&self, body: Vec<u8>) -> Result<u16, ClientError> {
        let stream = dial(&self.connector, &self.url, &self.trust).await?;
        let (mut sender, conn) = http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(hyper_err)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(error = %e, "MCP client side connection ended");
            }
        });
        let request = self.build_request(Method::POST, body, &[])?;
        let response = sender.send_request(request).await.map_err(hyper_err)?;
        let status = response.status().as_u16();
        response.into_body().collect().await.map_err(hyper_err)?;
        Ok(status)
    }

    /// Opens the session's standalone event stream (a GET, on a connection of its own) and
    /// hands `on_message` each JSON-RPC message the server sends on it, until the server ends
    /// it (`Ok`). A server that offers none answers 405: [`ClientError::Http`], as for any
    /// other non-2xx status. An event over `max_event` bytes ends the stream with an error.
    /// No timeout: the stream is meant to stay open; drop the future to close it.
    pub async fn listen(
        &self,
        max_event: usize,
        on_message: &mut (dyn FnMut(Value) + Send),
    ) -> Result<(), ClientError> {
        let stream = dial(&self.connector, &self.url, &self.trust).await?;
        let (mut sender, conn) = http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(hyper_err)?;
        let conn = tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(error = %e, "MCP client event stream connection ended");
            }
        });
        // The connection ends with the stream, whoever stops first.
        struct Abort(tokio::task::JoinHandle<()>);
        impl Drop for Abort {
            fn drop(&mut self) {
                self.0.abort();
            }
        }
        let _conn = Abort(conn);
        let request =
            self.build_request(Method::GET, Vec::new(), &[("accept", "text/event-stream")])?;
        let response = sender.send_request(request).await.map_err(hyper_err)?;
        let (parts, mut body) = response.into_parts();
        let status = parts.status.as_u16();
        if !(200..300).contains(&status) {
            let bytes = body.collect().await.map_err(hyper_err)?.to_bytes();
            return Err(ClientError::Http {
                status,
                body: String::from_utf8_lossy(&bytes).into_owned(),
            });
        }
        let is_sse = parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if !is_sse {
            return Err(ClientError::Protocol(format!(
                "the answer to GET {} is not an event stream",
                self.url.path
            )));
        }
        let mut events = SseEvents::default();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(hyper_err)?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            for m in events.push(&data) {
                on_message(m);
            }
            if events.pending() > max_event {
                return Err(ClientError::Protocol(format!(
                    "an event over {max_event} bytes on the event stream"
                )));
            }
        }
        Ok(())
    }

    /// Sends a JSON-RPC notification; returns the HTTP status (202 expected). A non-2xx status
    /// is [`ClientError::Http`].
    pub async fn notify(&mut self, method: &str, params: Value) -> Result<u16, ClientError> {
        let mut msg = json!({ "jsonrpc": "2.0", "method": method });
        if !params.is_null() {
            msg["params"] = params;
        }
        let (status, _, body) = self.post_raw(msg.to_string().into_bytes(), &[]).await?;
        if !(200..300).contains(&status) {
            return Err(ClientError::Http {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        Ok(status)
    }

    /// Starts a session: `initialize` (forgetting any previous session id), keeps the
    /// `Mcp-Session-Id` and the negotiated version, then sends `notifications/initialized`.
    /// Returns the whole JSON-RPC response; a JSON-RPC error is [`ClientError::Protocol`].
    pub async fn initialize(&mut self) -> Result<Value, ClientError> {
        self.initialize_with(json!({})).await
    }

    /// [`McpClient::initialize`] declaring the client's `capabilities` (e.g. `{"sampling": {}}`).
    pub async fn initialize_with(&mut self, capabilities: Value) -> Result<Value, ClientError> {
        self.session_id = None;
        self.protocol_version = None;
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": capabilities,
            "clientInfo": { "name": self.client_name, "version": env!("CARGO_PKG_VERSION") },
        });
        // A 503 (a replica that could not write the new session to its cluster's engine, or
        // one shutting down) made no session: initialize is tried again, twice, a second
        // apart, as its Retry-After says.
        let mut tries = 0;
        let (response, headers) = loop {
            match self.exchange(json!(0), "initialize", params.clone()).await {
                Err(ClientError::Http { status: 503, .. }) if tries < 2 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                answer => break answer?,
            }
        };
        if let Some(error) = response.get("error") {
            return Err(ClientError::Protocol(format!("initialize failed: {error}")));
        }
        self.session_id = headers
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.protocol_version = response["result"]["protocolVersion"]
            .as_str()
            .map(str::to_owned);
        self.notify("notifications/initialized", Value::Null)
            .await?;
        Ok(response)
    }

    /// `tools/call` with `name` and `arguments`; returns the whole JSON-RPC response.
    pub async fn tools_call(
        &mut self,
        id: Value,
        name: &str,
        arguments: Value,
    ) -> Result<Value, ClientError> {
        self.request(
            id,
            "tools/call",
            json!({ "name": name, "arguments": arguments }),
        )
        .await
    }

    /// `tools/list`, one page; returns the whole JSON-RPC response.
    pub async fn tools_list(
        &mut self,
        id: Value,
        cursor: Option<&str>,
    ) -> Result<Value, ClientError> {
        let params = match cursor {
            Some(c) => json!({ "cursor": c }),
            None => json!({}),
        };
        self.request(id, "tools/list", params).await
    }

    /// Ends the session with `DELETE`; returns the HTTP status. The session id is forgotten
    /// when the server accepted it (2xx) or did not know it (404).
    pub async fn delete_session(&mut self) -> Result<u16, ClientError> {
        let (status, _, _) = self.send_raw(Method::DELETE, Vec::new(), &[]).await?;
        if (200..300).contains(&status) || status == 404 {
            self.session_id = None;
        }
        Ok(status)
    }
}

/// A request the server sent on a call's event stream, and how the client's answer fared.
#[derive(Debug, Clone, PartialEq)]
pub struct AnsweredRequest {
    /// The JSON-RPC request as received.
    pub request: Value,
    /// The HTTP status of the POST that carried the answer, or why it got none.
    pub answered: Result<u16, String>,
}

/// The JSON-RPC message in one SSE event (its `data:` lines), if any.
/// An event stream read as it arrives: bytes in, each complete event's JSON-RPC message out.
/// Events are cut on whole bytes, so a character split across two reads arrives whole.
#[derive(Default)]
struct SseEvents {
    buf: Vec<u8>,
}

impl SseEvents {
    /// Adds `data`; returns the messages of the events it completed (an event whose data is
    /// no JSON is passed over).
    fn push(&mut self, data: &[u8]) -> Vec<Value> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            let lf = self.buf.windows(2).position(|w| w == b"\n\n");
            let crlf = self.buf.windows(4).position(|w| w == b"\r\n\r\n");
            let (end, sep) = match (lf, crlf) {
                (Some(a), Some(b)) if b < a => (b, 4),
                (Some(a), _) => (a, 2),
                (None, Some(b)) => (b, 4),
                (None, None) => break,
            };
            let event: Vec<u8> = self.buf.drain(..end + sep).collect();
            let text = String::from_utf8_lossy(&event).replace("\r\n", "\n");
            if let Some(m) = sse_message(&text) {
                out.push(m);
            }
        }
        out
    }

    /// Bytes of an event not complete yet.
    fn pending(&self) -> usize {
        self.buf.len()
    }
}

fn sse_message(event: &str) -> Option<Value> {
    let data: Vec<&str> = event
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    if data.is_empty() {
        return None;
    }
    serde_json::from_str(&data.join("\n")).ok()
}

/// Picks the JSON-RPC response out of a `text/event-stream` body: the event whose data is a
/// response with id `id`, or failing that the last response in the stream.
pub fn response_from_sse(body: &[u8], id: &Value) -> Result<Value, ClientError> {
    let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
    let mut fallback = None;
    for event in text.split("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            continue;
        }
        let Ok(msg) = serde_json::from_str::<Value>(&data.join("\n")) else {
            continue;
        };
        let is_response = msg.get("result").is_some() || msg.get("error").is_some();
        if is_response && msg.get("id") == Some(id) {
            return Ok(msg);
        }
        if is_response {
            fallback = Some(msg);
        }
    }
    fallback.ok_or_else(|| {
        ClientError::Protocol("the event stream held no JSON-RPC response".to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events come whole however the stream is cut: a character split across two reads, CRLF
    /// line ends, an event waiting for its end.
    #[test]
    fn events_are_cut_on_whole_bytes() {
        let mut events = SseEvents::default();
        let text = "data: {\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":{\"s\":\"é\"}}\n\n";
        let bytes = text.as_bytes();
        let cut = text.find('é').unwrap() + 1; // inside the two bytes of é
        assert!(events.push(&bytes[..cut]).is_empty());
        let got = events.push(&bytes[cut..]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["params"]["s"], "é");
        let got = events.push(b"event: message\r\ndata: {\"id\":1}\r\n\r\ndata: {\"id\":2}");
        assert_eq!(got, vec![json!({"id": 1})]);
        assert_eq!(events.pending(), "data: {\"id\":2}".len());
        assert_eq!(events.push(b"\n\n"), vec![json!({"id": 2})]);
        assert_eq!(events.pending(), 0);
    }
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that answers `answers` in turn, one per request, over keep-alive connections;
    /// gives back the bodies it was sent.
    async fn scripted(answers: Vec<String>) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut answers = answers.into_iter().peekable();
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = Vec::new();
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        let mut chunk = [0u8; 4096];
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while buf.len() < end + 4 + len {
                        let mut chunk = [0u8; 4096];
                        let n = conn.read(&mut chunk).await.unwrap();
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let body: Vec<u8> = buf.drain(..end + 4 + len).skip(end + 4).collect();
                    seen.push(String::from_utf8(body).unwrap());
                    let Some(answer) = answers.next() else {
                        return seen;
                    };
                    conn.write_all(answer.as_bytes()).await.unwrap();
                    if answers.peek().is_none() {
                        return seen;
                    }
                }
            }
            seen
        });
        (url, task)
    }

    fn http(status: &str, headers: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn initialize_tries_again_after_a_503_that_made_no_session() {
        let refused = r#"{"jsonrpc":"2.0","id":0,"error":{"code":-32000,"message":"no session was made","data":{"kind":"session_not_stored"}}}"#;
        let ok = r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"t","version":"0"}}}"#;
        let (url, server) = scripted(vec![
            http("503 Service Unavailable", "retry-after: 1\r\n", refused),
            http("200 OK", "mcp-session-id: s-2\r\n", ok),
            http("202 Accepted", "", ""),
        ])
        .await;
        let mut c = McpClient::connect(crate::TokioConnect, &url).await.unwrap();
        c.initialize().await.unwrap();
        assert_eq!(c.session_id(), Some("s-2"));
        drop(c);
        let seen = server.await.unwrap();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(seen[0].contains("\"initialize\"") && seen[1].contains("\"initialize\""));
        assert!(seen[2].contains("notifications/initialized"));

        // Three refusals in a row: the third is the caller's.
        let refusal = http("503 Service Unavailable", "retry-after: 1\r\n", refused);
        let (url, _server) = scripted(vec![refusal.clone(), refusal.clone(), refusal]).await;
        let mut c = McpClient::connect(crate::TokioConnect, &url).await.unwrap();
        assert!(matches!(
            c.initialize().await,
            Err(ClientError::Http { status: 503, .. })
        ));
    }

    #[test]
    fn sse_response_is_found() {
        let body = b"event: message\r\nid: 1\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\r\n\r\n\
id: 2\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"id\":7,\"result\":{}}\n\n";
        let r = response_from_sse(body, &json!(7)).unwrap();
        assert_eq!(r["id"], 7);
        let r = response_from_sse(body, &json!(8)).unwrap();
        assert_eq!(r["id"], 7);
        assert!(response_from_sse(b": keepalive\n\n", &json!(1)).is_err());
        assert!(response_from_sse(b"data: {not json\n\n", &json!(1)).is_err());
    }
}
