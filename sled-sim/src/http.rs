//! A sled's direct MCP endpoint over plain HTTP (`POST /mcp`), the way operators reached a
//! project before the gateway. Stateless: no session id, JSON responses, notifications get 202.
//! It runs the same [`SharedSled`] as the uplink, so both see the same stories.

use std::fmt::Debug;
use std::future::Future;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::Value;

use crate::mcp::{codes, error_response, SharedSled};

/// The router: `POST /mcp` runs one JSON-RPC message against the sled; `GET` and `DELETE` on
/// `/mcp` answer 405 (no SSE stream, no sessions).
pub fn router(sled: SharedSled) -> Router {
    Router::new()
        .route("/mcp", post(mcp_post).get(not_allowed).delete(not_allowed))
        .with_state(sled)
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
    match sled.handle(&msg) {
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
