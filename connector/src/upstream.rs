//! What the two kinds of upstream (a child over stdio, a server over Streamable HTTP) share:
//! their state, and the errors that answer a call they could not take or finish.

use gateway_core::uplink::{Control, UpstreamState};
use serde_json::{json, Value};

/// What the server is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Being started or initialized.
    Starting,
    /// Initialized: calls go to it.
    Running,
    /// Not serving: why.
    Down(String),
}

/// The `upstream` control frame saying `status` to the gateway (for `gateway_health` and
/// `gateway doctor`), with how many times the server was started again.
pub fn status_frame(status: &Status, restarts: u64) -> String {
    let (state, reason) = match status {
        Status::Starting => (UpstreamState::Starting, None),
        Status::Running => (UpstreamState::Running, None),
        Status::Down(reason) => (UpstreamState::Down, Some(reason.clone())),
    };
    Control::Upstream {
        state,
        reason,
        restarts,
    }
    .to_text()
}

/// The JSON-RPC error answering `id`, a call to `project`'s server that it could not take
/// (`upstream_down`, outcome `not_sent`) or that ended without its answer (`upstream_exited`
/// for a child, `upstream_unreachable` for a server at a URL; outcome `unknown`: it may have
/// acted).
pub fn upstream_error(id: &Value, project: &str, kind: &str, outcome: &str, reason: &str) -> Value {
    let message = match kind {
        "upstream_down" => format!("project {project}'s MCP server is not running: {reason}"),
        "upstream_unreachable" => format!(
            "project {project}'s MCP server could not be reached during the call ({reason}); whether it acted is unknown"
        ),
        _ => format!(
            "project {project}'s MCP server exited during the call ({reason}); whether it acted is unknown"
        ),
    };
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": -32603,
            "message": message,
            "data": {"kind": kind, "project": project, "reason": reason, "outcome": outcome},
        },
    })
}
