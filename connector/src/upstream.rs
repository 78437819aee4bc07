//! What the two kinds of upstream (a child over stdio, a server over Streamable HTTP) share:
//! their state, and the errors that answer a call they could not take or finish.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use gateway_core::uplink::{Control, UpstreamState, RELATED_REQUEST_META};
use serde_json::{json, Value};
use sled_uplink::uplink::RequestError;
use sled_uplink::CallContext;
use tokio::sync::broadcast;
use tokio::time::Instant;

/// The first restart (or re-initialization) delay.
pub const BACKOFF_MIN: Duration = Duration::from_millis(250);
/// The longest restart delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A server that served this long resets the backoff.
pub const STABLE_AFTER: Duration = Duration::from_secs(60);
/// How long the server's sampling or elicitation request may wait for the client's answer
/// (a person may be answering); the call's own deadline at the gateway ends it sooner.
pub const CLIENT_ANSWER_WAIT: Duration = Duration::from_secs(600);

/// The delay before the next start after `failures` in a row: doubling from
/// [`BACKOFF_MIN`] to [`BACKOFF_MAX`].
pub fn backoff(failures: u32) -> Duration {
    BACKOFF_MIN
        .saturating_mul(1 << failures.min(16))
        .min(BACKOFF_MAX)
}

/// `n` (a notification) naming the gateway's call `call` in `params._meta`, so that the
/// gateway relays it to that call's client.
pub fn related_to(mut n: Value, call: u64) -> Value {
    if !n.get("params").is_some_and(Value::is_object) {
        n["params"] = json!({});
    }
    if let Some(params) = n["params"].as_object_mut() {
        let meta = params.entry("_meta").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert(RELATED_REQUEST_META.to_owned(), json!(call));
        }
    }
    n
}

/// The server's notifications that are its project's, not one call's: the gateway refreshes
/// its listings on a list change, tells the subscribers of a resource it was updated, and the
/// creator of a task its new status (`notifications/tasks/status`, which names the task, not
/// the call that made it).
pub const PROJECT_NOTIFICATIONS: [&str; 5] = [
    "notifications/tools/list_changed",
    "notifications/resources/list_changed",
    "notifications/prompts/list_changed",
    "notifications/resources/updated",
    TASK_STATUS,
];

/// A task's status notification (MCP 2025-11-25 tasks).
pub const TASK_STATUS: &str = "notifications/tasks/status";

/// How many tasks' progress routes a connector keeps at most ([`TaskProgressRoutes`]).
pub const MAX_TASK_ROUTES: usize = 10_000;

/// Where the progress of a server's task goes once the call that created it was answered
/// (MCP 2025-11-25: the call's progress token stays valid until the task is terminal): a
/// task-augmented `tools/call` answered with a `CreateTaskResult` leaves its progress token
/// here, routed to that call's context (its uplink connection) while it lives, and to the
/// project's notices after, until the server says the task is terminal or its `ttl` passed.
#[derive(Default)]
pub struct TaskProgressRoutes {
    routes: Mutex<BTreeMap<String, TaskRoute>>,
}

struct TaskRoute {
    ctx: CallContext,
    task_id: String,
    until: Option<Instant>,
}

impl TaskProgressRoutes {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, TaskRoute>> {
        self.routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The server answered the call of `ctx`, which carried `params.task` when `as_task`:
    /// a `CreateTaskResult` keeps the call's progress token for the task.
    pub fn on_answer(&self, as_task: bool, answer: &Value, ctx: &CallContext) {
        let (Some(token), Some(task_id)) = (
            ctx.progress_token(),
            answer
                .pointer("/result/task/taskId")
                .and_then(Value::as_str),
        ) else {
            return;
        };
        if !as_task {
            return;
        }
        let now = Instant::now();
        let until = answer
            .pointer("/result/task/ttl")
            .and_then(Value::as_u64)
            .and_then(|ms| now.checked_add(Duration::from_millis(ms)));
        let mut routes = self.lock();
        routes.retain(|_, r| r.until.is_none_or(|u| u > now));
        if routes.len() >= MAX_TASK_ROUTES {
            return;
        }
        routes.insert(
            token.to_string(),
            TaskRoute {
                ctx: ctx.clone(),
                task_id: task_id.to_owned(),
                until,
            },
        );
    }

    /// A `notifications/tasks/status` from the server: a terminal one ends its task's route.
    pub fn on_status(&self, n: &Value) {
        let terminal = matches!(
            n.pointer("/params/status").and_then(Value::as_str),
            Some("completed" | "failed" | "cancelled")
        );
        if let (true, Some(task_id)) = (
            terminal,
            n.pointer("/params/taskId").and_then(Value::as_str),
        ) {
            self.lock().retain(|_, r| r.task_id != task_id);
        }
    }

    /// A `notifications/progress` that names no call in flight: sent up for the task whose
    /// token it carries, on the connection of the call that made it while that lives, else on
    /// `notices`. False when it is no task's.
    pub fn route(&self, n: &Value, notices: &broadcast::Sender<String>) -> bool {
        let Some(token) = n.pointer("/params/progressToken") else {
            return false;
        };
        let now = Instant::now();
        let ctx = {
            let mut routes = self.lock();
            routes.retain(|_, r| r.until.is_none_or(|u| u > now));
            match routes.get(&token.to_string()) {
                Some(r) => r.ctx.clone(),
                None => return false,
            }
        };
        ctx.send_as_is(n) || notices.send(n.to_string()).is_ok()
    }

    /// How many tasks' progress is routed now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no task's progress is routed.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// The requests a server may make of the calling client, relayed to it through the gateway
/// (not roots, which are a client's and not one call's).
pub const RELAYED_REQUESTS: [&str; 2] = ["sampling/createMessage", "elicitation/create"];

/// The answer to the server's own request `m` that needs no client: `ping`'s, or the refusal
/// of what the connector does not relay. `None` for sampling and elicitation.
pub fn answer_at_once(m: &Value) -> Option<Value> {
    let id = m.get("id").cloned().unwrap_or(Value::Null);
    let method = m.get("method").and_then(Value::as_str).unwrap_or_default();
    if method == "ping" {
        return Some(json!({"jsonrpc": "2.0", "id": id, "result": {}}));
    }
    (!RELAYED_REQUESTS.contains(&method)).then(|| {
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601,
            "message": format!("gateway-sled does not relay {method}")}})
    })
}

/// The server's own request `m` during a call: [`answer_at_once`] when it can be, else
/// (sampling, elicitation) asked of the call's client through the gateway (`ctx`). The
/// JSON-RPC response to give the server.
pub async fn relay_request(ctx: &CallContext, m: &Value) -> Value {
    if let Some(answer) = answer_at_once(m) {
        return answer;
    }
    let id = m.get("id").cloned().unwrap_or(Value::Null);
    let method = m.get("method").and_then(Value::as_str).unwrap_or_default();
    let params = m.get("params").cloned().unwrap_or_else(|| json!({}));
    match ctx.request(method, params, CLIENT_ANSWER_WAIT).await {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(RequestError::Rpc { code, message }) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
        Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603,
            "message": format!("the client's answer to {method} did not come: {e}")}}),
    }
}

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
