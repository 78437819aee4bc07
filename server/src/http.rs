//! The axum side: routes, turning a request into a [`HttpRequest`] and a [`HttpReply`] into a
//! response. Everything about what the answer *is* belongs to the core.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use gateway_core::{HttpError, HttpMethod, HttpReply, HttpRequest, HttpToken};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::sync::mpsc;

use crate::driver::{Command, HttpMsg, STREAM_QUEUE};
use crate::Ids;

/// The header that carries the MCP session id. `HeaderMap` lookups ignore case.
const SESSION_HEADER: &str = "mcp-session-id";

/// The header that carries the negotiated MCP protocol version.
const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";

/// The read and write buffers of an uplink WebSocket.
const UPLINK_BUFFER_BYTES: usize = 8 * 1024;

/// What every handler shares.
#[derive(Debug, Clone)]
pub(crate) struct AppState {
    pub(crate) cmd: mpsc::Sender<Command>,
    pub(crate) ids: Arc<Ids>,
    pub(crate) max_body_bytes: usize,
    /// The server's own counts, for `/metrics`.
    pub(crate) counters: Arc<crate::fleet::ServerCounters>,
    /// Verifies bearer tokens as OAuth access tokens and serves the metadata.
    pub(crate) oauth: Arc<crate::oauth::ResourceServer>,
    /// Whether `/metrics` is served here (see `ops.rs`).
    pub(crate) metrics: Arc<crate::ops::MetricsPlacement>,
    /// Who may send a body (`admission.rs`).
    pub(crate) admission: Arc<crate::admission::Admission>,
    /// How long a request's body may take to arrive once its head has.
    pub(crate) body_timeout: std::time::Duration,
}

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/mcp", get(mcp).post(mcp).delete(mcp))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        // RFC 9728: at the root, and suffixed with the path of the resource, `/mcp`.
        .route(gateway_core::auth::METADATA_PATH, get(resource_metadata))
        .route(
            &format!("{}/mcp", gateway_core::auth::METADATA_PATH),
            get(resource_metadata),
        )
        .route(gateway_core::uplink::UPLINK_PATH, get(uplink))
        .with_state(state)
}

async fn healthz() -> &'static str {
    "ok"
}

/// `GET /metrics` on the MCP port: the core's counts in the OpenMetrics text format, unless
/// they have a listen address of their own or client authentication is on (then 404; see
/// `ops.rs`).
async fn metrics(State(state): State<AppState>) -> Response {
    if !state.metrics.on_mcp_port() {
        return crate::ops::not_here();
    }
    crate::ops::metrics_response(&state.cmd, &state.counters).await
}

/// The protected resource metadata (RFC 9728) when projects.toml has `[oauth]`; else 404. Any
/// origin may read it (browser-based clients discover the authorization server with it).
async fn resource_metadata(State(state): State<AppState>) -> Response {
    match state.oauth.metadata() {
        Some(json) => (
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
                (header::CACHE_CONTROL, "max-age=300"),
            ],
            json,
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn uplink(
    State(state): State<AppState>,
    connection: Option<axum::Extension<crate::limits::Connection>>,
    ws: WebSocketUpgrade,
) -> Response {
    // Until its welcome, an uplink may send a few KiB (its hello and its proof), not the
    // 16 MiB a live sled's message may be (`limits.rs`).
    let connection = connection.map(|axum::Extension(c)| c);
    if let Some(c) = &connection {
        c.budget.limit(crate::limits::PRE_WELCOME_BYTES);
    }
    // tungstenite zero-fills its read buffer before every read: at its 128 KiB default that
    // was two thirds of the gateway's instructions, and 150 KiB of memory per uplink.
    ws.read_buffer_size(UPLINK_BUFFER_BYTES)
        .write_buffer_size(UPLINK_BUFFER_BYTES)
        .max_message_size(crate::MAX_UPLINK_MESSAGE_BYTES)
        .max_frame_size(crate::MAX_UPLINK_MESSAGE_BYTES)
        .on_failed_upgrade(|e| tracing::warn!(error = %e, "uplink WebSocket upgrade failed"))
        .on_upgrade(move |socket| crate::uplink::run(socket, state, connection))
}

async fn mcp(
    State(state): State<AppState>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let method = match method {
        Method::POST => HttpMethod::Post,
        Method::GET => HttpMethod::Get,
        Method::DELETE => HttpMethod::Delete,
        // The router sends only these three here.
        _ => return StatusCode::METHOD_NOT_ALLOWED.into_response(),
    };
    let authorization = header_text(&headers, header::AUTHORIZATION);
    // Verified here, in this request's task (it may wait for the issuer's keys), and checked
    // against the registry in force before the body is read: a request without the right
    // credentials costs neither its body's memory nor the driver's time (`admission.rs`).
    let access_token = state.oauth.check(authorization.as_deref()).await;
    if let Err(refused) = state
        .admission
        .check(authorization.as_deref(), &access_token)
    {
        state
            .counters
            .http_refused_before_body
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return refusal(refused);
    }
    let read = tokio::time::timeout(
        state.body_timeout,
        Limited::new(body, state.max_body_bytes).collect(),
    );
    let Ok(read) = read.await else {
        state
            .counters
            .http_body_timeouts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(timeout = ?state.body_timeout, "request body too slow");
        return refusal(HttpError::BodyTimeout {
            secs: state.body_timeout.as_secs().max(1),
        });
    };
    let body = match read {
        Ok(collected) => collected.to_bytes().to_vec(),
        Err(e) if e.is::<LengthLimitError>() => {
            tracing::debug!(limit = state.max_body_bytes, "request body too large");
            return refusal(HttpError::PayloadTooLarge {
                limit: state.max_body_bytes,
            });
        }
        Err(e) => {
            tracing::debug!(error = %e, "could not read a request body");
            return refusal(HttpError::BodyUnreadable);
        }
    };
    let request = HttpRequest {
        method,
        session: header_text(&headers, HeaderName::from_static(SESSION_HEADER)),
        content_type: header_text(&headers, header::CONTENT_TYPE),
        accept: header_text(&headers, header::ACCEPT),
        protocol_version: header_text(&headers, HeaderName::from_static(PROTOCOL_VERSION_HEADER)),
        origin: header_text(&headers, header::ORIGIN),
        last_event_id: header_text(&headers, HeaderName::from_static("last-event-id")),
        mcp_method: header_text(&headers, HeaderName::from_static("mcp-method")),
        mcp_name: header_text(&headers, HeaderName::from_static("mcp-name")),
        mcp_param_project: header_text(&headers, HeaderName::from_static("mcp-param-project")),
        // Only another replica relays; a client cannot say so.
        relayed: false,
        authorization,
        access_token,
        body,
    };
    let token = state.ids.next_http();
    tracing::debug!(
        token = token.0,
        ?method,
        session = request.session.as_deref(),
        bytes = request.body.len(),
        "/mcp request"
    );
    let (reply_tx, mut reply_rx) = mpsc::channel(STREAM_QUEUE);
    let cmd = Command::Http {
        token,
        request: Box::new(request),
        reply: reply_tx,
    };
    if state.cmd.send(cmd).await.is_err() {
        return refusal(HttpError::ShuttingDown);
    }
    // From here on the driver has the request: if this future is dropped (the client went away)
    // the guard tells it so.
    let mut guard = AbortGuard {
        token,
        cmd: Some(state.cmd),
    };
    match reply_rx.recv().await {
        Some(HttpMsg::Reply(reply)) => {
            guard.disarm();
            reply_response(reply)
        }
        // The guard goes with the stream: a client that disconnects drops it.
        Some(HttpMsg::Open) => sse_response(reply_rx, guard),
        Some(HttpMsg::Event { .. } | HttpMsg::Close) => {
            guard.disarm();
            tracing::error!(token = token.0, "stream event before the stream opened");
            refusal(HttpError::ShuttingDown)
        }
        // The driver dropped the request without an answer: it is gone.
        None => {
            guard.disarm();
            refusal(HttpError::ShuttingDown)
        }
    }
}

/// A `text/event-stream` answer fed by the driver; it ends at [`HttpMsg::Close`].
fn sse_response(rx: mpsc::Receiver<HttpMsg>, guard: AbortGuard) -> Response {
    let events = futures_util::stream::unfold((rx, guard), |(mut rx, mut guard)| async move {
        match rx.recv().await {
            Some(HttpMsg::Event { id, data }) => {
                let mut event = Event::default().event("message").data(data);
                if let Some(id) = id {
                    event = event.id(id.to_string());
                }
                Some((Ok::<_, std::convert::Infallible>(event), (rx, guard)))
            }
            // Closed by the core (or the driver went away): nothing to abort.
            Some(HttpMsg::Close) | None => {
                guard.disarm();
                None
            }
            Some(HttpMsg::Open | HttpMsg::Reply(_)) => {
                tracing::error!("a second answer on an open stream; ending it");
                None
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Reports [`Command::HttpAborted`] when dropped while armed (`cmd` is `Some`).
struct AbortGuard {
    token: HttpToken,
    cmd: Option<mpsc::Sender<Command>>,
}

impl AbortGuard {
    /// The request was answered: nothing to report when dropped.
    fn disarm(&mut self) {
        self.cmd.take();
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        let Some(cmd) = self.cmd.take() else { return };
        let aborted = Command::HttpAborted { token: self.token };
        match cmd.try_send(aborted) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(aborted)) => {
                // Drop cannot wait; let a task wait for room instead.
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        let _ = cmd.send(aborted).await;
                    });
                }
            }
        }
    }
}

/// A header's value as text; bytes that are not UTF-8 are replaced, so the core sees (and
/// refuses) a session id that cannot exist rather than none at all.
fn header_text(headers: &HeaderMap, name: HeaderName) -> Option<String> {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// The core's answer as an HTTP response.
pub(crate) fn reply_response(reply: HttpReply) -> Response {
    let HttpReply {
        status,
        headers,
        body,
    } = reply;
    let status = StatusCode::from_u16(status).unwrap_or_else(|_| {
        tracing::error!(status, "the core answered with an invalid HTTP status");
        StatusCode::INTERNAL_SERVER_ERROR
    });
    let mut response = match body {
        Some(body) => {
            let mut r = Response::new(Body::from(body));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        None => Response::new(Body::empty()),
    };
    *response.status_mut() = status;
    for (name, value) in headers {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            (Ok(name), Ok(value)) => {
                response.headers_mut().append(name, value);
            }
            _ => tracing::error!(name, value, "the core answered with an invalid header"),
        }
    }
    response
}

/// An answer the server gives before the core sees the request; its shape comes from the core.
fn refusal(e: HttpError) -> Response {
    reply_response(e.reply())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parts(r: Response) -> (u16, Vec<(String, String)>, String) {
        let status = r.status().as_u16();
        let headers = r
            .headers()
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8(body.to_vec()).unwrap())
    }

    fn check(reply: HttpReply, want: (u16, &[(&str, &str)], &str)) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (status, headers, body) = rt.block_on(parts(reply_response(reply)));
        let want_headers: Vec<(String, String)> = want
            .1
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(
            (status, headers, body.as_str()),
            (want.0, want_headers, want.2)
        );
    }

    #[test]
    fn reply_with_body_is_json() {
        check(
            HttpReply {
                status: 200,
                headers: vec![("Mcp-Session-Id", "abc".into())],
                body: Some(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.into()),
            },
            (
                200,
                &[
                    ("content-type", "application/json"),
                    ("mcp-session-id", "abc"),
                ],
                r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            ),
        );
    }

    #[test]
    fn reply_without_body_has_no_content_type() {
        check(
            HttpReply {
                status: 202,
                headers: vec![],
                body: None,
            },
            (202, &[], ""),
        );
    }

    #[test]
    fn bad_status_and_header_do_not_panic() {
        check(
            HttpReply {
                status: 1000,
                headers: vec![("Allow", "GET, POST".into()), ("X-Bad", "a\nb".into())],
                body: None,
            },
            (500, &[("allow", "GET, POST")], ""),
        );
    }

    #[test]
    fn too_large_is_the_cores_shape() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let e = HttpError::PayloadTooLarge { limit: 4194304 };
        let (status, headers, body) = rt.block_on(parts(refusal(e.clone())));
        assert_eq!(status, 413);
        assert_eq!(
            headers,
            [("content-type".to_owned(), "application/json".to_owned())]
        );
        assert_eq!(body, e.body());
    }
}
