//! The operations endpoints: `/metrics` (and `/healthz`), and where `/metrics` is served.
//!
//! - With a listen address of its own ([`crate::serve_with_metrics`], `gateway serve
//!   --metrics-listen ADDR`), `/metrics` and `/healthz` are served there, by an accept loop
//!   that is one more task (no thread, so it runs on turmoil too), and `/metrics` is never
//!   served on the MCP port.
//! - Without one, `/metrics` is served on the MCP port only while client authentication is
//!   off (no `client_tokens`, no `[oauth]` in projects.toml): a gateway that asks its clients
//!   who they are does not hand its call counts, projects and tool names to anyone who can
//!   reach `/mcp`. With authentication on it answers 404 there.
//!
//! Reloading projects.toml: the decision follows the file in force, from the next request.
//! Authentication turned on takes `/metrics` off the MCP port at once; turned off, it comes
//! back (as it would on a restart with that file). The metrics address, if any, is fixed for
//! the life of the process.
//!
//! The metrics listener holds only a *weak* sender of the driver's channel, so it never keeps
//! the driver alive at shutdown; a scrape that finds the driver gone gets 503.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use gateway_core::{HttpError, Registry};
use tokio::sync::mpsc;

use crate::driver::Command;
use crate::fleet::ServerCounters;

/// Whether client authentication is on for `registry`: client tokens or `[oauth]`.
pub(crate) fn client_auth_on(registry: &Registry) -> bool {
    !registry.client_tokens().is_empty() || registry.oauth().is_some()
}

/// Where `/metrics` is served, as the registry in force and the listen addresses say.
#[derive(Debug)]
pub(crate) struct MetricsPlacement {
    /// `/metrics` has a listen address of its own.
    own_listener: bool,
    /// Client authentication is on in the registry in force.
    auth_on: AtomicBool,
}

impl MetricsPlacement {
    pub(crate) fn new(own_listener: bool, registry: &Registry) -> Arc<MetricsPlacement> {
        let placement = MetricsPlacement {
            own_listener,
            auth_on: AtomicBool::new(client_auth_on(registry)),
        };
        if !own_listener && placement.auth_on.load(Ordering::Relaxed) {
            tracing::info!(
                "client authentication is on: /metrics is not served on the MCP port (give it a \
                 listen address of its own: gateway serve --metrics-listen ADDR)"
            );
        }
        Arc::new(placement)
    }

    /// Whether the MCP port answers `GET /metrics`.
    pub(crate) fn on_mcp_port(&self) -> bool {
        !self.own_listener && !self.auth_on.load(Ordering::Relaxed)
    }

    /// Follows a reloaded projects.toml.
    pub(crate) fn follow(&self, registry: &Registry) {
        let on = client_auth_on(registry);
        let was = self.auth_on.swap(on, Ordering::Relaxed);
        if was != on && !self.own_listener {
            if on {
                tracing::info!(
                    "client authentication turned on: /metrics is no longer served on the MCP port"
                );
            } else {
                tracing::info!(
                    "client authentication turned off: /metrics is served on the MCP port again"
                );
            }
        }
    }
}

/// What the metrics listener's handlers share.
#[derive(Debug, Clone)]
struct OpsState {
    /// Weak: the metrics listener does not keep the driver alive.
    cmd: mpsc::WeakSender<Command>,
    /// The MCP port's server counts, rendered at `/metrics`.
    counters: Arc<ServerCounters>,
}

/// The metrics listener's routes: `GET /metrics` and `GET /healthz`; anything else is 404.
pub(crate) fn router(cmd: mpsc::WeakSender<Command>, counters: Arc<ServerCounters>) -> Router {
    Router::new()
        .route("/metrics", get(ops_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(OpsState { cmd, counters })
}

async fn ops_metrics(State(state): State<OpsState>) -> Response {
    match state.cmd.upgrade() {
        Some(cmd) => metrics_response(&cmd, &state.counters).await,
        None => crate::http::reply_response(HttpError::ShuttingDown.reply()),
    }
}

/// `GET /metrics`: the core's counts and the server's in the OpenMetrics text format. The
/// driver hands over a snapshot and goes on; rendering happens here, in the caller's task.
pub(crate) async fn metrics_response(
    cmd: &mpsc::Sender<Command>,
    counters: &ServerCounters,
) -> Response {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let snapshot = match cmd.send(Command::Metrics { reply: tx }).await {
        Ok(()) => rx.await.ok(),
        Err(_) => None,
    };
    match snapshot {
        Some(m) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
            )],
            crate::metrics::render(&m, counters),
        )
            .into_response(),
        None => crate::http::reply_response(HttpError::ShuttingDown.reply()),
    }
}

/// The MCP port's answer to `GET /metrics` when it does not serve them.
pub(crate) fn not_here() -> Response {
    StatusCode::NOT_FOUND.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_core::{OAuthConfig, ProjectSpec, Secret};

    fn plain() -> Registry {
        Registry::from_projects(
            vec![ProjectSpec::new("alpha", "http://127.0.0.1:9101")],
            None,
        )
        .unwrap()
    }

    #[test]
    fn metrics_leave_the_mcp_port_when_clients_authenticate_or_have_an_address() {
        let tokens = plain().with_client_tokens(vec![Secret::new("client-token-0123456789")]);
        let oauth = plain().with_oauth(
            OAuthConfig::new(
                "https://gw.example.com/mcp",
                vec!["https://id.example.com".into()],
                vec![],
            )
            .unwrap(),
        );
        assert!(MetricsPlacement::new(false, &plain()).on_mcp_port());
        assert!(!MetricsPlacement::new(false, &tokens).on_mcp_port());
        assert!(!MetricsPlacement::new(false, &oauth).on_mcp_port());
        for r in [plain(), tokens.clone(), oauth.clone()] {
            assert!(!MetricsPlacement::new(true, &r).on_mcp_port());
        }
        // A reload follows the file in force.
        let p = MetricsPlacement::new(false, &plain());
        p.follow(&oauth);
        assert!(!p.on_mcp_port());
        p.follow(&plain());
        assert!(p.on_mcp_port());
        p.follow(&tokens);
        assert!(!p.on_mcp_port());
        let p = MetricsPlacement::new(true, &oauth);
        p.follow(&plain());
        assert!(!p.on_mcp_port(), "an address of its own stays its own");
    }
}
