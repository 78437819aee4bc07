//! A sled's direct MCP endpoint over plain HTTP (`POST /mcp`), the way operators reached a
//! project before the gateway. Stateless: no session id, JSON responses, notifications get 202.
//! It runs the same [`SharedSled`] as the uplink, so both see the same stories. `GET /` is the
//! health check the gateway probes. [`silent_router`] is an endpoint that has stopped answering.

use std::fmt::Debug;
use std::future::Future;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use crate::mcp::{codes, error_response, SharedSled};

/// The router: `POST /mcp` runs one JSON-RPC message against the sled; `GET` and `DELETE` on
/// `/mcp` answer 405 (no SSE stream, no sessions). `GET /` answers 200
/// `{"project": <name>, "status": "ok"}`: the health check the gateway probes at a project's
/// registered URL.
pub fn router(sled: SharedSled) -> Router {
    Router::new()
        .route("/", get(health))
        .route("/mcp", post(mcp_post).get(not_allowed).delete(not_allowed))
        .with_state(sled)
}

/// A router that accepts any request on any path and never answers it: an endpoint that has
/// stopped responding, for health-probe timeouts.
pub fn silent_router() -> Router {
    Router::new().fallback(never_answer)
}

async fn never_answer() -> Response {
    std::future::pending().await
}

async fn health(State(sled): State<SharedSled>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"project": sled.project_name(), "status": "ok"}),
    )
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn mcp_post(State(sled): State<SharedSled>, body: Bytes) -> Response {
    let msg: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return json_response(
                StatusCode::BAD_REQUEST,
                &error_response(Value::Null, codes::PARSE_ERROR, format!("Parse error: {e}")),
            );
        }
    };
    if msg.is_array() {
        return json_response(
            StatusCode::BAD_REQUEST,
            &error_response(
                Value::Null,
                codes::INVALID_REQUEST,
                "Invalid Request: JSON-RPC batches are not supported",
            ),
        );
    }
    // run_tests (for its duration, or as a task) and tasks/* are answered asynchronously.
    let answer = match sled.handle_async(&msg, None) {
        Some(answer) => answer.await,
        None => sled.handle(&msg),
    };
    match answer {
        Some(resp) => json_response(StatusCode::OK, &resp),
        None => StatusCode::ACCEPTED.into_response(),
    }
}

async fn not_allowed() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST")],
        "this endpoint is stateless: POST JSON-RPC messages only",
    )
        .into_response()
}

/// Serves [`silent_router`] on `listener` until `shutdown` completes. The requests it holds
/// never finish, so the caller should bound how long it waits for this to return.
pub async fn serve_silent<L>(
    listener: L,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: Debug,
{
    axum::serve(listener, silent_router())
        .with_graceful_shutdown(shutdown)
        .await
}

/// Serves [`router`] on `listener` until `shutdown` completes.
pub async fn serve<L>(
    listener: L,
    sled: SharedSled,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: Debug,
{
    axum::serve(listener, router(sled))
        .with_graceful_shutdown(shutdown)
        .await
}
