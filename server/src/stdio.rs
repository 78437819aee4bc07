//! `gateway stdio --url URL`: a bridge that lets an MCP client that only speaks the stdio
//! transport (it launches its server as a subprocess and exchanges newline-delimited JSON-RPC
//! on the child's stdin and stdout) use a gateway's Streamable HTTP endpoint.
//!
//! # What it does
//!
//! - Each line of input is one JSON-RPC message. It is POSTed to the URL on its own task, so a
//!   slow `tools/call` never holds up a `ping` or a `notifications/cancelled` sent after it.
//!   Connections are HTTP/1.1 keep-alive, pooled.
//! - A JSON answer is written as one line of output; an SSE answer (`text/event-stream`) is
//!   written one line per event as the events arrive, so progress reaches the client while the
//!   call runs; a 202 writes nothing.
//! - Messages read while an `initialize` is in flight wait for its answer (a client that pipes
//!   several lines at once gets them sent with the new session).
//! - After a successful `initialize` the bridge keeps the `Mcp-Session-Id` and the negotiated
//!   protocol version for every later request, and opens the session's event stream
//!   (`GET` with `Accept: text/event-stream`) before it hands the `initialize` answer over, so no
//!   server-to-client notification is missed. A stream that drops is reopened with
//!   `Last-Event-ID` (bounded retries with backoff); a 405 or another 4xx means no stream.
//! - Every request gets exactly one answer. HTTP errors whose body is not the request's own
//!   JSON-RPC response, an unreachable gateway, and a session the gateway no longer knows
//!   (404) become JSON-RPC errors (-32603) that say what happened; the unreachable case names
//!   the URL and where it came from (`--url`). Failed notifications are only logged.
//! - With a token ([`BridgeOptions::token`]: `--token-file FILE`, else `MCP_GATEWAY_TOKEN`),
//!   every request carries it as `Authorization: Bearer`; a 401 says which token was sent, or
//!   that none was and how to give one.
//! - Output lines are written by one task fed by a channel, so lines never interleave.
//! - At the end of the input: requests in flight get [`BridgeOptions::drain_timeout`] to
//!   finish, the session is ended with `DELETE`, and [`bridge`] returns.
//!
//! Logs go through `tracing` (the binary sends them to stderr): the output is the protocol
//! channel and carries nothing else.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use gateway_client::{Connect, HttpUrl, TlsTrust, TokioConnect};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::{AbortHandle, JoinHandle, JoinSet};
use tokio::time::Instant;

/// The session header.
const SESSION_HEADER: &str = "mcp-session-id";
/// The negotiated protocol version header, sent after initialize.
const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";
/// The 2026-07-28 routing headers, mirrored from the body.
const METHOD_HEADER: &str = "mcp-method";
const NAME_HEADER: &str = "mcp-name";
/// Where a 2026-07-28 request carries its protocol version.
const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// The SSE resumption header.
const LAST_EVENT_ID_HEADER: &str = "last-event-id";
/// JSON-RPC "internal error": what the bridge answers when it cannot get the gateway's answer.
const INTERNAL_ERROR: i64 = -32603;
/// JSON-RPC "parse error": a line of input that is not JSON.
const PARSE_ERROR: i64 = -32700;
/// JSON-RPC "invalid request": a line of input over the size limit.
const INVALID_REQUEST: i64 = -32600;
/// How many idle keep-alive connections the bridge keeps.
const MAX_IDLE_CONNECTIONS: usize = 16;
/// How many output lines may queue for the writer before producers wait.
const OUTPUT_QUEUE: usize = 1024;
/// After a streamed answer's response event, how long the bridge waits for the stream to end
/// before it drops it.
const STREAM_END_GRACE: Duration = Duration::from_secs(2);
/// A stream that stayed open this long counts as a success, resetting the retry budget.
const STREAM_HEALTHY_AFTER: Duration = Duration::from_secs(5);

/// Settings of [`bridge_with`]; [`Default`] gives the ones `gateway stdio` uses.
#[derive(Debug, Clone)]
pub struct BridgeOptions {
    /// Where the URL came from, named in errors: `--url` for the command line.
    pub url_source: String,
    /// How long opening a connection to the gateway (TCP, and TLS for `https://`) may take.
    pub connect_timeout: Duration,
    /// At the end of the input, how long requests in flight get to finish.
    pub drain_timeout: Duration,
    /// How long the final `DELETE` of the session may take.
    pub delete_timeout: Duration,
    /// How long the `initialize` answer waits for the session's event stream to open.
    pub stream_open_wait: Duration,
    /// How many times in a row the event stream may fail to (re)open before the bridge gives up
    /// on it.
    pub stream_retries: u32,
    /// The first delay before reopening the event stream; it doubles on each failure in a row.
    pub stream_backoff: Duration,
    /// The longest delay before reopening the event stream.
    pub stream_backoff_max: Duration,
    /// The longest line of input (and the longest SSE line) accepted, in bytes.
    pub max_line_bytes: usize,
    /// The bearer token sent with every request, if any.
    pub token: Option<BridgeToken>,
    /// The certificate authorities an `https://` gateway is verified against (default: the
    /// system's).
    pub trust: TlsTrust,
}

/// A bearer token for the gateway and where it came from (`--token-file FILE`,
/// `MCP_GATEWAY_TOKEN`), which a 401 names. Its `Debug` never shows the token.
#[derive(Clone)]
pub struct BridgeToken {
    /// The token itself.
    pub token: String,
    /// Where it came from, as a phrase for messages.
    pub from: String,
}

impl std::fmt::Debug for BridgeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BridgeToken")
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

impl Default for BridgeOptions {
    fn default() -> Self {
        BridgeOptions {
            url_source: "--url".to_owned(),
            connect_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(10),
            delete_timeout: Duration::from_secs(2),
            stream_open_wait: Duration::from_secs(2),
            stream_retries: 8,
            stream_backoff: Duration::from_millis(100),
            stream_backoff_max: Duration::from_secs(5),
            max_line_bytes: 16 << 20,
            token: None,
            trust: TlsTrust::system(),
        }
    }
}

/// Why [`bridge`] stopped other than at the end of its input.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The gateway URL could not be understood; nothing was sent.
    #[error("invalid {source_name} {url:?}: {reason}")]
    Url {
        /// Where the URL came from (`--url`).
        source_name: String,
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The token cannot be sent in an HTTP header; nothing was sent.
    #[error("the token from {from} cannot be sent in an Authorization header (it holds a control character or a line break)")]
    Token {
        /// Where it came from.
        from: String,
    },
    /// Reading the client's messages failed.
    #[error("cannot read the client's messages: {0}")]
    Input(#[source] io::Error),
    /// Writing to the client failed (it went away); the bridge stopped.
    #[error("cannot write to the client: {0}")]
    Output(#[source] io::Error),
}

/// Bridges the newline-delimited JSON-RPC of `input` and `output` to the MCP endpoint at `url`
/// over real TCP, with the default [`BridgeOptions`]. Returns `Ok` at the end of the input,
/// after the session was ended.
pub async fn bridge<R, W>(url: &str, input: R, output: W) -> Result<(), BridgeError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    bridge_with(TokioConnect, url, input, output, BridgeOptions::default()).await
}

/// [`bridge`], over any [`Connect`] and with explicit options.
pub async fn bridge_with<C, R, W>(
    connector: C,
    url: &str,
    input: R,
    output: W,
    opts: BridgeOptions,
) -> Result<(), BridgeError>
where
    C: Connect,
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let bad_url = |reason: String| BridgeError::Url {
        source_name: opts.url_source.clone(),
        url: url.to_owned(),
        reason,
    };
    let target = HttpUrl::parse(url).map_err(|e| bad_url(e.reason))?;
    let host = HeaderValue::from_str(&target.host_port())
        .map_err(|_| bad_url("the host cannot be sent in a Host header".to_owned()))?;
    if target.path == "/" {
        tracing::warn!(
            url,
            "the URL has no path; the gateway's MCP endpoint is /mcp"
        );
    }

    let authorization = match &opts.token {
        Some(t) => {
            let mut value =
                HeaderValue::from_str(&format!("Bearer {}", t.token)).map_err(|_| {
                    BridgeError::Token {
                        from: t.from.clone(),
                    }
                })?;
            value.set_sensitive(true);
            Some(value)
        }
        None => None,
    };
    let (out_tx, out_rx) = mpsc::channel(OUTPUT_QUEUE);
    let (close_tx, close_rx) = oneshot::channel();
    let mut writer = tokio::spawn(write_lines(output, out_rx, close_rx));
    let max_line = opts.max_line_bytes;
    let drain_timeout = opts.drain_timeout;
    let delete_timeout = opts.delete_timeout;
    let shared = Arc::new(Shared {
        connector,
        url: url.to_owned(),
        host,
        authorization,
        target,
        opts,
        idle: Mutex::new(Vec::new()),
        session: Mutex::new(SessionState::default()),
        gate: Arc::default(),
        stateless_calls: Mutex::default(),
        out: out_tx,
    });

    let mut reader = LineReader::new(input, max_line);
    let mut tasks = JoinSet::new();
    let mut writer_done = None;
    let input_result = loop {
        tokio::select! {
            line = reader.next_line() => match line {
                Ok(Some(line)) => {
                    dispatch(&shared, &mut tasks, line).await;
                    while tasks.try_join_next().is_some() {}
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            },
            r = &mut writer => {
                writer_done = Some(r);
                break Ok(());
            }
        }
    };

    if writer_done.is_none() {
        // The client may still be reading: let the requests in flight finish.
        let drained = tokio::time::timeout(drain_timeout, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                in_flight = tasks.len(),
                "input ended; requests still in flight after {drain_timeout:?} are abandoned"
            );
        }
    }
    tasks.shutdown().await;

    let (stream, session) = {
        let mut s = shared.session();
        (s.stream.take(), s.id.take())
    };
    if let Some(stream) = stream {
        stream.abort();
        let _ = stream.await;
    }
    if let Some(id) = session {
        match tokio::time::timeout(delete_timeout, shared.delete_session(&id)).await {
            Ok(Ok(status)) => tracing::debug!(status, "ended the session"),
            Ok(Err(e)) => tracing::warn!("could not end the session: {e}"),
            Err(_) => tracing::warn!("could not end the session within {delete_timeout:?}"),
        }
    }

    let written = match writer_done {
        Some(r) => r,
        None => {
            let _ = close_tx.send(());
            writer.await
        }
    };
    let written = written.unwrap_or_else(|e| Err(io::Error::other(e)));
    input_result.map_err(BridgeError::Input)?;
    written.map_err(BridgeError::Output)
}

/// Writes each line and a newline, flushing after each, until `close` fires (then writes what
/// is queued) or every sender is gone; then shuts the output down.
async fn write_lines<W: AsyncWrite + Unpin>(
    mut output: W,
    mut lines: mpsc::Receiver<String>,
    mut close: oneshot::Receiver<()>,
) -> io::Result<()> {
    async fn put<W: AsyncWrite + Unpin>(output: &mut W, line: String) -> io::Result<()> {
        let mut bytes = line.into_bytes();
        bytes.push(b'\n');
        output.write_all(&bytes).await?;
        output.flush().await
    }
    loop {
        tokio::select! {
            biased;
            line = lines.recv() => match line {
                Some(line) => put(&mut output, line).await?,
                None => break,
            },
            _ = &mut close => {
                while let Ok(line) = lines.try_recv() {
                    put(&mut output, line).await?;
                }
                break;
            }
        }
    }
    output.shutdown().await
}

/// What the bridge knows about the session.
#[derive(Debug, Default)]
struct SessionState {
    /// The `Mcp-Session-Id` from the last successful initialize.
    id: Option<String>,
    /// The protocol version negotiated there.
    version: Option<String>,
    /// The gateway no longer knows the session (404): requests other than `initialize` get an
    /// error saying so, until the client initializes again.
    gone: bool,
    /// The task relaying the session's event stream.
    stream: Option<JoinHandle<()>>,
}

/// What every task shares.
struct Shared<C: Connect> {
    connector: C,
    /// The URL as given, for messages.
    url: String,
    host: HeaderValue,
    /// `Bearer <token>`, marked sensitive, when there is a token.
    authorization: Option<HeaderValue>,
    target: HttpUrl,
    opts: BridgeOptions,
    /// Idle keep-alive connections.
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
    session: Mutex<SessionState>,
    /// Held for writing by an `initialize` in flight; other messages pass through it for
    /// reading before they are sent.
    gate: Arc<tokio::sync::RwLock<()>>,
    /// Stateless-era requests in flight, by id (as JSON text): a client's
    /// `notifications/cancelled` aborts the task, which closes the call's response.
    stateless_calls: Mutex<HashMap<String, AbortHandle>>,
    out: mpsc::Sender<String>,
}

/// How an exchange with the gateway failed.
#[derive(Debug)]
enum ExchangeError {
    /// No connection could be opened.
    Connect(io::Error),
    /// The connection failed while the request was being sent or answered.
    Lost(String),
}

/// What a line of input expects back.
#[derive(Debug, Clone)]
enum Expect {
    /// A request: exactly one response with this id (`null` for input the bridge could not
    /// read an id from).
    Answer { id: Value, method: Option<String> },
    /// A notification, or a response to a server-to-client request: nothing.
    Nothing { method: Option<String> },
}

impl Expect {
    fn method(&self) -> &str {
        match self {
            Expect::Answer { method, .. } | Expect::Nothing { method } => {
                method.as_deref().unwrap_or("(none)")
            }
        }
    }
}

impl<C: Connect> Shared<C> {
    fn session(&self) -> MutexGuard<'_, SessionState> {
        self.session.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn emit(&self, line: String) {
        if self.out.send(line).await.is_err() {
            tracing::debug!("the output is closed; a line was dropped");
        }
    }

    async fn emit_error(&self, id: &Value, message: String, data: Value) {
        self.emit(error_line(id, INTERNAL_ERROR, &message, data))
            .await;
    }

    fn unreachable_message(&self, cause: &io::Error) -> String {
        format!(
            "cannot reach the MCP gateway at {} (from {}): {}",
            self.url,
            self.opts.url_source,
            describe_io(cause)
        )
    }

    fn lost_message(&self, cause: &str) -> String {
        format!(
            "the connection to the MCP gateway at {} (from {}) failed during the request: {cause}; \
             the request may or may not have been carried out",
            self.url, self.opts.url_source
        )
    }

    /// Opens a new HTTP/1 connection.
    async fn open(&self) -> io::Result<SendRequest<Full<Bytes>>> {
        let limit = self.opts.connect_timeout;
        let dial = gateway_client::dial(&self.connector, &self.target, &self.opts.trust);
        let stream = match tokio::time::timeout(limit, dial).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {limit:?}"),
                ))
            }
        };
        let (sender, conn) = http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(io::Error::other)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "gateway connection ended");
            }
        });
        Ok(sender)
    }

    /// An idle pooled connection that is ready, if there is one.
    async fn pooled(&self) -> Option<SendRequest<Full<Bytes>>> {
        loop {
            let mut sender = {
                let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
                idle.pop()?
            };
            if sender.is_closed() {
                continue;
            }
            if sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    /// Gives a connection whose last answer was read in full back to the pool.
    fn check_in(&self, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE_CONNECTIONS {
            idle.push(sender);
        }
    }

    /// Builds a request to the endpoint.
    fn request(
        &self,
        method: Method,
        accept: &'static str,
        body: Bytes,
        session: Option<(&str, Option<&str>)>,
        extra: &[(&'static str, String)],
    ) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(body.clone()));
        *request.method_mut() = method;
        match self.target.path.parse() {
            Ok(uri) => *request.uri_mut() = uri,
            // HttpUrl refuses paths with whitespace or control characters; a path the http
            // crate still refuses is sent as `/`, and the gateway's answer will say so.
            Err(e) => tracing::warn!(path = %self.target.path, error = %e, "unusable URL path"),
        }
        let headers = request.headers_mut();
        headers.insert(HOST, self.host.clone());
        headers.insert(ACCEPT, HeaderValue::from_static(accept));
        if let Some(authorization) = &self.authorization {
            headers.insert(AUTHORIZATION, authorization.clone());
        }
        if !body.is_empty() {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        let mut add = |name: &'static str, value: &str| match HeaderValue::from_str(value) {
            Ok(v) => {
                headers.insert(name, v);
            }
            Err(_) => tracing::warn!(header = name, value, "not sendable as a header; left out"),
        };
        if let Some((id, version)) = session {
            add(SESSION_HEADER, id);
            if let Some(version) = version {
                add(PROTOCOL_VERSION_HEADER, version);
            }
        }
        for (name, value) in extra {
            add(name, value);
        }
        request
    }

    /// Sends `request` on a pooled connection, or a new one. Returns the answer's head and the
    /// connection, to be checked in once the body is read.
    async fn send(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<(Response<Incoming>, SendRequest<Full<Bytes>>), ExchangeError> {
        let mut request = request;
        if let Some(mut sender) = self.pooled().await {
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, sender)),
                Err(mut e) => match e.take_message() {
                    // Never written: the pooled connection had closed. Try a new one.
                    Some(unsent) => request = unsent,
                    None => return Err(ExchangeError::Lost(error_chain(&e.into_error()))),
                },
            }
        }
        let mut sender = self.open().await.map_err(ExchangeError::Connect)?;
        match sender.send_request(request).await {
            Ok(response) => Ok((response, sender)),
            Err(e) => Err(ExchangeError::Lost(error_chain(&e))),
        }
    }

    /// Ends the session; returns the HTTP status.
    async fn delete_session(&self, id: &str) -> Result<u16, String> {
        let version = self.session().version.clone();
        let request = self.request(
            Method::DELETE,
            "application/json, text/event-stream",
            Bytes::new(),
            Some((id, version.as_deref())),
            &[],
        );
        match self.send(request).await {
            Ok((response, sender)) => {
                let status = response.status().as_u16();
                if response.into_body().collect().await.is_ok() {
                    self.check_in(sender);
                }
                Ok(status)
            }
            Err(ExchangeError::Connect(e)) => Err(self.unreachable_message(&e)),
            Err(ExchangeError::Lost(e)) => Err(self.lost_message(&e)),
        }
    }

    /// Marks the session `id` as gone (when it is still the current one) and stops its stream.
    fn session_gone(&self, id: &str) {
        let mut s = self.session();
        if s.id.as_deref() == Some(id) {
            s.id = None;
            s.version = None;
            s.gone = true;
            if let Some(stream) = s.stream.take() {
                stream.abort();
            }
        }
    }
}

/// Reads one line of input and starts its exchange.
async fn dispatch<C: Connect>(shared: &Arc<Shared<C>>, tasks: &mut JoinSet<()>, line: Line) {
    let bytes = match line {
        Line::TooLong => {
            let limit = shared.opts.max_line_bytes;
            tracing::warn!(limit, "a line of input is over the size limit; dropped");
            let message = format!("the message is longer than the bridge's limit of {limit} bytes");
            shared
                .emit(error_line(
                    &Value::Null,
                    INVALID_REQUEST,
                    &message,
                    json!({}),
                ))
                .await;
            return;
        }
        Line::Text(bytes) => bytes,
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let message: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "a line of input is not JSON");
            let message = format!("Parse error: the line is not JSON: {e}");
            shared
                .emit(error_line(&Value::Null, PARSE_ERROR, &message, json!({})))
                .await;
            return;
        }
    };
    let method = message
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let routing = stateless_headers(&message);
    if method.as_deref() == Some("notifications/cancelled") {
        // The stateless era cancels by closing the call's response: when the request named is a
        // stateless call in flight, its task is aborted (which closes its connection) and the
        // notification goes no further. Otherwise the gateway gets it as usual.
        let target = message.pointer("/params/requestId").map(Value::to_string);
        let call = target.as_ref().and_then(|target| {
            shared
                .stateless_calls
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(target)
        });
        if let Some(call) = call {
            tracing::debug!(request = ?target, "cancelled: closing the call's response");
            call.abort();
            return;
        }
    }
    let expect = match (&message, &method) {
        (Value::Object(m), Some(_)) => match m.get("id") {
            Some(id) => Expect::Answer {
                id: id.clone(),
                method,
            },
            None => Expect::Nothing { method },
        },
        // A response to a server-to-client request: the gateway acknowledges it with 202.
        (Value::Object(m), None) if m.contains_key("result") || m.contains_key("error") => {
            Expect::Nothing { method: None }
        }
        // Not a JSON-RPC message (a batch, say): the gateway's error says what is wrong, with
        // a null id.
        _ => Expect::Answer {
            id: Value::Null,
            method,
        },
    };
    // Messages read after an `initialize` wait for its answer, so that they carry the session
    // it creates (a client piping several lines at once does not wait itself).
    let initialize = matches!(&expect, Expect::Answer { method: Some(m), .. } if m == "initialize");
    let init_guard = if initialize {
        Some(Arc::clone(&shared.gate).write_owned().await)
    } else {
        None
    };
    let stateless_id = match &expect {
        Expect::Answer { id, .. } if !routing.is_empty() => Some(id.to_string()),
        _ => None,
    };
    let task_shared = Arc::clone(shared);
    let handle = tasks.spawn(async move {
        let shared = task_shared;
        match init_guard {
            Some(guard) => {
                forward(&shared, Bytes::from(bytes), expect, routing).await;
                drop(guard);
            }
            None => {
                drop(shared.gate.read().await);
                forward(&shared, Bytes::from(bytes), expect, routing).await;
            }
        }
    });
    if let Some(id) = stateless_id {
        let mut calls = shared
            .stateless_calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        calls.retain(|_, call| !call.is_finished());
        calls.insert(id, handle);
    }
}

/// POSTs one message and relays what comes back.
async fn forward<C: Connect>(
    shared: &Arc<Shared<C>>,
    body: Bytes,
    expect: Expect,
    routing: Vec<(&'static str, String)>,
) {
    let initialize = matches!(&expect, Expect::Answer { method: Some(m), .. } if m == "initialize");
    // A stateless-era message (its version in `_meta`) belongs to no session.
    let stateless = !routing.is_empty();
    let (gone, session) = {
        let s = shared.session();
        let session = match (&s.id, initialize || stateless) {
            (Some(id), false) => Some((id.clone(), s.version.clone())),
            _ => None,
        };
        (s.gone && !initialize && !stateless, session)
    };
    if gone {
        return session_gone_error(shared, &expect, None).await;
    }
    let request = shared.request(
        Method::POST,
        "application/json, text/event-stream",
        body,
        session.as_ref().map(|(id, v)| (id.as_str(), v.as_deref())),
        &routing,
    );
    let (response, sender) = match shared.send(request).await {
        Ok(r) => r,
        Err(e) => {
            let message = match e {
                ExchangeError::Connect(e) => shared.unreachable_message(&e),
                ExchangeError::Lost(e) => shared.lost_message(&e),
            };
            tracing::error!(method = expect.method(), "{message}");
            if let Expect::Answer { id, .. } = &expect {
                shared
                    .emit_error(id, message, json!({ "url": shared.url }))
                    .await;
            }
            return;
        }
    };
    let status = response.status();
    let session_header = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let is_sse = is_event_stream(&response);
    let body = response.into_body();

    if status.is_success() && is_sse {
        let answer = relay_post_stream(shared, body, &expect, initialize, session_header).await;
        match answer {
            Ok(true) => shared.check_in(sender),
            Ok(false) => {
                if let Expect::Answer { id, .. } = &expect {
                    let message = "the gateway's event stream ended without the response";
                    tracing::warn!(method = expect.method(), "{message}");
                    shared
                        .emit_error(id, message.to_owned(), json!({ "status": status.as_u16() }))
                        .await;
                }
            }
            Err(e) => {
                let message = shared.lost_message(&e);
                tracing::error!(method = expect.method(), "{message}");
                if let Expect::Answer { id, .. } = &expect {
                    shared
                        .emit_error(id, message, json!({ "url": shared.url }))
                        .await;
                }
            }
        }
        return;
    }

    let bytes = match body.collect().await {
        Ok(collected) => {
            shared.check_in(sender);
            collected.to_bytes()
        }
        Err(e) => {
            let message = shared.lost_message(&error_chain(&e));
            tracing::error!(method = expect.method(), "{message}");
            if let Expect::Answer { id, .. } = &expect {
                shared
                    .emit_error(id, message, json!({ "url": shared.url }))
                    .await;
            }
            return;
        }
    };
    let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();

    if status.is_success() {
        let Expect::Answer { id, .. } = &expect else {
            if !bytes.is_empty() {
                tracing::debug!(%status, "a notification got a body; ignored");
            }
            return;
        };
        match parsed {
            Some(message) => {
                if initialize {
                    initialized(shared, &message, session_header).await;
                }
                shared.emit(one_line(&bytes, &message)).await;
            }
            None if bytes.is_empty() => {
                let message =
                    format!("the MCP gateway answered HTTP {status} without a body to a request");
                tracing::warn!(method = expect.method(), "{message}");
                shared
                    .emit_error(id, message, json!({ "status": status.as_u16() }))
                    .await;
            }
            None => {
                let message = format!(
                    "the MCP gateway answered HTTP {status} with a body that is not JSON: {}",
                    excerpt(&bytes)
                );
                tracing::warn!(method = expect.method(), "{message}");
                shared
                    .emit_error(id, message, json!({ "status": status.as_u16() }))
                    .await;
            }
        }
        return;
    }

    // An HTTP error.
    let sent_session = session.map(|(id, _)| id);
    if status == StatusCode::NOT_FOUND {
        if let Some(id) = &sent_session {
            shared.session_gone(id);
        }
    }
    let Expect::Answer { id, .. } = &expect else {
        tracing::warn!(
            method = expect.method(),
            %status,
            "the gateway refused a notification: {}",
            gateway_message(parsed.as_ref(), &bytes)
        );
        return;
    };
    if let Some(message) = parsed.as_ref().filter(|m| is_response_to(m, id)) {
        shared.emit(one_line(&bytes, message)).await;
        return;
    }
    if status == StatusCode::NOT_FOUND && sent_session.is_some() {
        return session_gone_error(shared, &expect, sent_session.as_deref()).await;
    }
    let detail = gateway_message(parsed.as_ref(), &bytes);
    let mut message = format!("the MCP gateway answered HTTP {status}: {detail}");
    if status == StatusCode::UNAUTHORIZED {
        message.push_str(&match &shared.opts.token {
            Some(t) => format!(" (the bridge sent the token from {})", t.from),
            None => " (the bridge sent no token: give one with --token-file FILE or the \
                     MCP_GATEWAY_TOKEN environment variable)"
                .to_owned(),
        });
    }
    tracing::warn!(method = expect.method(), "{message}");
    let mut data = json!({ "status": status.as_u16() });
    if let Some(error) = parsed.as_ref().and_then(|m| m.get("error")) {
        data["gateway_error"] = error.clone();
    }
    shared.emit_error(id, message, data).await;
}

/// Answers a request for a session the gateway no longer knows.
async fn session_gone_error<C: Connect>(shared: &Shared<C>, expect: &Expect, id: Option<&str>) {
    let message = "the MCP session is gone (it expired, or the gateway restarted): \
                   the client must initialize again";
    match expect {
        Expect::Answer { id: request, .. } => {
            tracing::warn!(method = expect.method(), session = id, "{message}");
            shared
                .emit_error(
                    request,
                    message.to_owned(),
                    json!({ "status": 404, "kind": "session_gone" }),
                )
                .await;
        }
        Expect::Nothing { .. } => {
            tracing::warn!(
                method = expect.method(),
                session = id,
                "notification dropped: {message}"
            );
        }
    }
}

/// Relays a streamed answer to a POST, line by line. Returns whether the response to the
/// request arrived (for a notification: whether the stream ended cleanly).
async fn relay_post_stream<C: Connect>(
    shared: &Arc<Shared<C>>,
    mut body: Incoming,
    expect: &Expect,
    initialize: bool,
    session_header: Option<String>,
) -> Result<bool, String> {
    let mut parser = SseParser::new(shared.opts.max_line_bytes);
    let mut events = Vec::new();
    let mut answered = false;
    loop {
        let frame = if answered {
            // The response is in: the stream should end now; do not wait long for it.
            match tokio::time::timeout(STREAM_END_GRACE, body.frame()).await {
                Ok(f) => f,
                Err(_) => return Ok(true),
            }
        } else {
            body.frame().await
        };
        let Some(frame) = frame else {
            return Ok(answered || matches!(expect, Expect::Nothing { .. }));
        };
        let frame = match frame {
            Ok(f) => f,
            Err(e) if answered => {
                tracing::debug!(error = %e, "a streamed answer ended badly after its response");
                return Ok(true);
            }
            Err(e) => return Err(error_chain(&e)),
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        parser
            .push(&data, &mut events)
            .map_err(|()| "an event stream line is over the size limit".to_owned())?;
        for event in events.drain(..) {
            let Some((line, message)) = event_message(&event) else {
                continue;
            };
            if let Expect::Answer { id, .. } = expect {
                if is_response_to(&message, id) {
                    answered = true;
                    if initialize {
                        initialized(shared, &message, session_header.clone()).await;
                    }
                }
            }
            shared.emit(line).await;
        }
    }
}

/// After `initialize` answered `message`: keeps the session, and opens its event stream
/// (waiting briefly for it, so that no notification sent after the answer is missed).
async fn initialized<C: Connect>(
    shared: &Arc<Shared<C>>,
    message: &Value,
    session_header: Option<String>,
) {
    let Some(result) = message.get("result") else {
        return;
    };
    let version = result
        .get("protocolVersion")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let (opened_tx, opened_rx) = oneshot::channel();
    let old = {
        let mut s = shared.session();
        let old = (s.id.take(), s.stream.take());
        s.id = session_header.clone();
        s.version = version;
        s.gone = false;
        if let Some(id) = session_header {
            let task_shared = Arc::clone(shared);
            s.stream = Some(tokio::spawn(async move {
                event_stream(&task_shared, id, opened_tx).await;
            }));
        } else {
            tracing::debug!("initialize gave no session id: no event stream");
        }
        old
    };
    if let Some(stream) = old.1 {
        stream.abort();
    }
    if let Some(old_id) = old.0 {
        tracing::debug!("the client initialized again; ending its previous session");
        if let Err(e) = shared.delete_session(&old_id).await {
            tracing::debug!("could not end the previous session: {e}");
        }
    }
    let _ = tokio::time::timeout(shared.opts.stream_open_wait, opened_rx).await;
}

/// Relays the session's event stream, reopening it with `Last-Event-ID` when it drops. Sends
/// on `opened` once the first attempt has an answer (whatever it is).
async fn event_stream<C: Connect>(
    shared: &Arc<Shared<C>>,
    session: String,
    opened: oneshot::Sender<()>,
) {
    let mut opened = Some(opened);
    let mut last_event_id: Option<String> = None;
    let mut failures = 0u32;
    loop {
        if failures > 0 {
            if failures > shared.opts.stream_retries {
                tracing::warn!(
                    attempts = failures,
                    "giving up on the session's event stream: server-to-client notifications \
                     (tools/list_changed) will not reach the client"
                );
                return;
            }
            let exp = failures.saturating_sub(1).min(16);
            let delay = shared
                .opts
                .stream_backoff
                .saturating_mul(1 << exp)
                .min(shared.opts.stream_backoff_max);
            tokio::time::sleep(delay).await;
        }
        let version = {
            let s = shared.session();
            if s.id.as_deref() != Some(session.as_str()) {
                return;
            }
            s.version.clone()
        };
        let request = shared.request(
            Method::GET,
            "text/event-stream",
            Bytes::new(),
            Some((&session, version.as_deref())),
            &last_event_id
                .iter()
                .map(|l| (LAST_EVENT_ID_HEADER, l.clone()))
                .collect::<Vec<_>>(),
        );
        // The stream holds its connection for as long as it lasts: a connection of its own.
        let answer = match shared.open().await {
            Ok(mut sender) => sender
                .send_request(request)
                .await
                .map_err(|e| shared.lost_message(&error_chain(&e))),
            Err(e) => Err(shared.unreachable_message(&e)),
        };
        if let Some(tx) = opened.take() {
            let _ = tx.send(());
        }
        let response = match answer {
            Ok(r) => r,
            Err(message) => {
                tracing::warn!("session event stream: {message}");
                failures += 1;
                continue;
            }
        };
        let status = response.status();
        if status.is_success() && is_event_stream(&response) {
            let started = Instant::now();
            let mut delivered = false;
            let ended = relay_get_stream(
                shared,
                response.into_body(),
                &mut last_event_id,
                &mut delivered,
            )
            .await;
            match ended {
                Ok(()) => tracing::info!("the session's event stream ended; reopening it"),
                Err(e) => tracing::info!("the session's event stream broke ({e}); reopening it"),
            }
            if delivered || started.elapsed() >= STREAM_HEALTHY_AFTER {
                failures = 1;
            } else {
                failures += 1;
            }
            continue;
        }
        let bytes = response
            .into_body()
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .unwrap_or_default();
        let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
        let detail = gateway_message(parsed.as_ref(), &bytes);
        if status == StatusCode::METHOD_NOT_ALLOWED {
            tracing::info!("the gateway offers no session event stream (HTTP 405)");
            return;
        }
        if status == StatusCode::NOT_FOUND {
            tracing::warn!("session event stream: the session is gone (HTTP 404): {detail}");
            shared.session_gone(&session);
            return;
        }
        if status.is_client_error() {
            tracing::warn!("no session event stream: HTTP {status}: {detail}");
            return;
        }
        tracing::warn!("session event stream: HTTP {status}: {detail}");
        failures += 1;
    }
}

/// Relays a GET stream's events until it ends.
async fn relay_get_stream<C: Connect>(
    shared: &Shared<C>,
    mut body: Incoming,
    last_event_id: &mut Option<String>,
    delivered: &mut bool,
) -> Result<(), String> {
    let mut parser = SseParser::new(shared.opts.max_line_bytes);
    let mut events = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| error_chain(&e))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        parser
            .push(&data, &mut events)
            .map_err(|()| "an event stream line is over the size limit".to_owned())?;
        for event in events.drain(..) {
            if let Some(id) = &event.id {
                *last_event_id = Some(id.clone());
            }
            if let Some((line, _)) = event_message(&event) {
                *delivered = true;
                shared.emit(line).await;
            }
        }
    }
    Ok(())
}

/// An event's data as one line of JSON, and the message; `None` for events without data or
/// with data that is not JSON (logged).
fn event_message(event: &SseEvent) -> Option<(String, Value)> {
    if event.data.is_empty() {
        return None;
    }
    match serde_json::from_str::<Value>(&event.data) {
        Ok(message) => Some((one_line(event.data.as_bytes(), &message), message)),
        Err(e) => {
            tracing::warn!(error = %e, data = %excerpt(event.data.as_bytes()), "an event's data is not JSON; dropped");
            None
        }
    }
}

/// `bytes` as one line: as is when it is one already (the gateway's exact text), else the
/// message re-serialised compactly.
fn one_line(bytes: &[u8], message: &Value) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.contains(['\n', '\r']) {
        message.to_string()
    } else {
        text.to_owned()
    }
}

/// Whether `message` is a JSON-RPC response with id `id`.
fn is_response_to(message: &Value, id: &Value) -> bool {
    message.get("method").is_none()
        && (message.get("result").is_some() || message.get("error").is_some())
        && message.get("id") == Some(id)
}

fn is_event_stream(response: &Response<Incoming>) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        })
}

/// The headers a 2026-07-28 (stateless) message needs, mirrored from its body: its
/// `MCP-Protocol-Version` (from `params._meta`), `Mcp-Method`, and `Mcp-Name` for the methods
/// that name something. Empty for a message of the session era.
fn stateless_headers(message: &Value) -> Vec<(&'static str, String)> {
    let version = message
        .pointer("/params/_meta")
        .and_then(|m| m.get(META_PROTOCOL_VERSION))
        .and_then(Value::as_str);
    let (Some(version), Some(method)) = (version, message.get("method").and_then(Value::as_str))
    else {
        return Vec::new();
    };
    let mut headers = vec![
        (PROTOCOL_VERSION_HEADER, encode_header_value(version)),
        (METHOD_HEADER, encode_header_value(method)),
    ];
    let name_key = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    };
    let name = name_key
        .and_then(|k| message.get("params").and_then(|p| p.get(k)))
        .and_then(Value::as_str);
    if let Some(name) = name {
        headers.push((NAME_HEADER, encode_header_value(name)));
    }
    headers
}

/// A header value as 2026-07-28 sends it: as is when it is visible ASCII without edge
/// whitespace, else `=?base64?…?=`.
fn encode_header_value(value: &str) -> String {
    let plain = value.bytes().all(|b| (0x20..=0x7e).contains(&b))
        && value.trim() == value
        && !(value.starts_with("=?base64?") && value.ends_with("?="));
    if plain {
        return value.to_owned();
    }
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::from("=?base64?");
    for chunk in value.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out.push_str("?=");
    out
}

/// A JSON-RPC error response.
fn error_line(id: &Value, code: i64, message: &str, data: Value) -> String {
    // Written by hand to keep the usual member order (serde_json sorts an object's keys).
    let message = Value::from(message);
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":{code},"message":{message},"data":{data}}}}}"#
    )
}

/// What the gateway said in an error body: its JSON-RPC error message, or the text.
fn gateway_message(parsed: Option<&Value>, bytes: &[u8]) -> String {
    match parsed
        .and_then(|m| m.get("error"))
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
    {
        Some(message) => message.to_owned(),
        None if bytes.is_empty() => "(no body)".to_owned(),
        None => excerpt(bytes),
    }
}

/// The start of a body, for messages.
fn excerpt(bytes: &[u8]) -> String {
    const MAX: usize = 200;
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    match text.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// An I/O error as a person would say it.
fn describe_io(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        io::ErrorKind::TimedOut => format!("timed out ({e})"),
        _ => e.to_string(),
    }
}

/// An error and its sources, joined with `: `.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// A line of input.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// Its bytes, without the newline (and a `\r` before it).
    Text(Vec<u8>),
    /// It was longer than the limit; its bytes were skipped.
    TooLong,
}

/// Splits input into lines, with a size limit. `next_line` is cancel-safe: bytes are only
/// consumed from the reader once they are in `buf`.
struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    too_long: bool,
    max: usize,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: Vec::new(),
            too_long: false,
            max,
        }
    }

    /// The next line; `None` at the end of the input. A last line without a newline counts.
    async fn next_line(&mut self) -> io::Result<Option<Line>> {
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                if self.buf.is_empty() && !self.too_long {
                    return Ok(None);
                }
                return Ok(Some(self.take()));
            }
            let (chunk, used, complete) = match available.iter().position(|&b| b == b'\n') {
                Some(i) => (&available[..i], i + 1, true),
                None => (available, available.len(), false),
            };
            if !self.too_long {
                if self.buf.len() + chunk.len() > self.max {
                    self.too_long = true;
                    self.buf = Vec::new();
                } else {
                    self.buf.extend_from_slice(chunk);
                }
            }
            self.inner.consume(used);
            if complete {
                return Ok(Some(self.take()));
            }
        }
    }

    fn take(&mut self) -> Line {
        if std::mem::take(&mut self.too_long) {
            self.buf.clear();
            return Line::TooLong;
        }
        let mut line = std::mem::take(&mut self.buf);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Line::Text(line)
    }
}

/// One Server-Sent Event.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SseEvent {
    /// Its `id` field, if it had one.
    id: Option<String>,
    /// Its `data` fields joined with `\n` (empty when it had none).
    data: String,
}

/// An incremental `text/event-stream` parser: lines end in `\n` or `\r\n`; comments, `event`
/// and `retry` fields are skipped; an incomplete event at the end is dropped.
struct SseParser {
    line: Vec<u8>,
    data: Option<String>,
    id: Option<String>,
    max: usize,
}

impl SseParser {
    fn new(max: usize) -> Self {
        SseParser {
            line: Vec::new(),
            data: None,
            id: None,
            max,
        }
    }

    /// Feeds `chunk`, pushing each completed event onto `events`. Fails on a line over the
    /// size limit.
    fn push(&mut self, mut chunk: &[u8], events: &mut Vec<SseEvent>) -> Result<(), ()> {
        while let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            if self.line.len() + i > self.max {
                return Err(());
            }
            self.line.extend_from_slice(&chunk[..i]);
            chunk = &chunk[i + 1..];
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.field(&line, events);
        }
        if self.line.len() + chunk.len() > self.max {
            return Err(());
        }
        self.line.extend_from_slice(chunk);
        Ok(())
    }

    fn field(&mut self, line: &[u8], events: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.data.is_some() || self.id.is_some() {
                events.push(SseEvent {
                    id: self.id.take(),
                    data: self.data.take().unwrap_or_default(),
                });
            }
            return;
        }
        if line.first() == Some(&b':') {
            return;
        }
        let line = String::from_utf8_lossy(line);
        let (name, value) = match line.split_once(':') {
            Some((name, value)) => (name, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        match name {
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut parser = SseParser::new(1024);
        let mut events = Vec::new();
        for chunk in chunks {
            parser.push(chunk, &mut events).unwrap();
        }
        events
    }

    fn event(id: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            id: id.map(str::to_owned),
            data: data.to_owned(),
        }
    }

    #[test]
    fn sse_events_are_parsed_across_chunks() {
        let body: &[u8] = b": keep-alive\n\nevent: message\r\nid: 7\r\ndata: {\"a\":\r\ndata:1}\r\n\r\nid: 8\ndata: x\n\ndata: cut";
        let whole = parse_all(&[body]);
        assert_eq!(
            whole,
            vec![event(Some("7"), "{\"a\":\n1}"), event(Some("8"), "x")]
        );
        // Byte by byte gives the same events.
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(parse_all(&bytes), whole);
        // An id-only event (a priming event) is reported for its id.
        assert_eq!(
            parse_all(&[b"id: 3\ndata:\n\n"]),
            vec![event(Some("3"), "")]
        );
        assert_eq!(parse_all(&[b"id: 4\n\n"]), vec![event(Some("4"), "")]);
    }

    #[test]
    fn sse_lines_over_the_limit_fail() {
        let mut parser = SseParser::new(8);
        let mut events = Vec::new();
        assert!(parser.push(b"data: 1\n", &mut events).is_ok());
        assert!(parser.push(b"data: 123456789", &mut events).is_err());
        let mut parser = SseParser::new(8);
        assert!(parser.push(b"data: 12345678\n", &mut events).is_err());
    }

    #[tokio::test]
    async fn input_lines_are_split_and_bounded() {
        let input: &[u8] = b"one\r\n\ntoo long a line\nlast";
        let mut reader = LineReader::new(input, 8);
        let mut lines = Vec::new();
        while let Some(line) = reader.next_line().await.unwrap() {
            lines.push(line);
        }
        assert_eq!(
            lines,
            vec![
                Line::Text(b"one".to_vec()),
                Line::Text(Vec::new()),
                Line::TooLong,
                Line::Text(b"last".to_vec()),
            ]
        );
    }

    #[test]
    fn one_line_keeps_the_text_or_compacts_it() {
        let v = json!({"a": 1});
        assert_eq!(one_line(b" {\"a\": 1}\n", &v), "{\"a\": 1}");
        assert_eq!(one_line(b"{\n\"a\": 1}", &v), "{\"a\":1}");
    }

    #[test]
    fn responses_are_matched_by_id() {
        let r = json!({"jsonrpc": "2.0", "id": 3, "result": {}});
        assert!(is_response_to(&r, &json!(3)));
        assert!(!is_response_to(&r, &json!("3")));
        let n = json!({"jsonrpc": "2.0", "method": "x", "id": 3});
        assert!(!is_response_to(&n, &json!(3)));
        let e = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700}});
        assert!(is_response_to(&e, &Value::Null));
    }

    #[test]
    fn stateless_messages_get_their_routing_headers() {
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "whoami", "arguments": {}, "_meta": {META_PROTOCOL_VERSION: "2026-07-28"}}});
        assert_eq!(
            stateless_headers(&call),
            vec![
                (PROTOCOL_VERSION_HEADER, "2026-07-28".to_owned()),
                (METHOD_HEADER, "tools/call".to_owned()),
                (NAME_HEADER, "whoami".to_owned()),
            ]
        );
        let legacy = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "whoami"}});
        assert!(stateless_headers(&legacy).is_empty());
        assert_eq!(encode_header_value("plain name"), "plain name");
        assert_eq!(encode_header_value("héllo"), "=?base64?aMOpbGxv?=");
        assert_eq!(encode_header_value(" a"), "=?base64?IGE=?=");
        assert_eq!(encode_header_value("é"), "=?base64?w6k=?=");
        assert_eq!(
            encode_header_value("=?base64?x?="),
            "=?base64?PT9iYXNlNjQ/eD89?="
        );
    }

    #[test]
    fn error_lines_are_json_rpc() {
        let line = error_line(&json!("a"), INTERNAL_ERROR, "boom", json!({"status": 500}));
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["id"], "a");
        assert_eq!(v["error"]["code"], -32603);
        assert_eq!(v["error"]["message"], "boom");
        assert_eq!(v["error"]["data"]["status"], 500);
        assert_eq!(
            describe_io(&io::Error::from(io::ErrorKind::ConnectionRefused)),
            "connection refused"
        );
        assert_eq!(excerpt("é".repeat(300).as_bytes()).chars().count(), 201);
    }
}
