//! Every error shape the gateway answers with, in one place.
//!
//! [`RpcError`] is a JSON-RPC error object (code, message, `data`); [`HttpError`] is a refusal at
//! the HTTP level (status, headers, and a JSON-RPC error body with a `null` id). Each shape is
//! built from a typed variant in one `match` with no catch-all arm, so a new variant forces a
//! decision here, and the snapshots in `core/src/snapshots` pin every shape.
//!
//! Every gateway-made error carries `data.kind`, a stable machine-readable name, so clients and
//! the simulation oracle never have to parse messages.

use std::time::Duration;

use serde_json::{json, Value};

use crate::coord::CoordError;
use crate::strict::Unreadable;

/// The retry hint of a coordination refusal at a limit.
const RETRY_AFTER_MS: u64 = 1000;

/// JSON-RPC 2.0 codes, and the MCP SDKs' code for a request that timed out.
pub(crate) mod code {
    pub(crate) const PARSE_ERROR: i64 = -32700;
    pub(crate) const INVALID_REQUEST: i64 = -32600;
    pub(crate) const METHOD_NOT_FOUND: i64 = -32601;
    pub(crate) const INVALID_PARAMS: i64 = -32602;
    pub(crate) const INTERNAL_ERROR: i64 = -32603;
    /// What MCP SDK clients use for a request that timed out.
    pub(crate) const REQUEST_TIMEOUT: i64 = -32001;
    /// A request the client cancelled (the code LSP uses; MCP defines none).
    pub(crate) const REQUEST_CANCELLED: i64 = -32800;
    /// 2026-07-28: an HTTP header disagrees with the body.
    pub(crate) const HEADER_MISMATCH: i64 = -32020;
    /// 2026-07-28: the request's protocol version is not one the server speaks.
    pub(crate) const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
    /// 2026-07-28: answering needs a client capability the request did not declare.
    pub(crate) const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
    /// Refusals at the HTTP level (unknown session, wrong content type, ...).
    pub(crate) const SERVER_ERROR: i64 = -32000;
}

/// Why a call's uplink went away while the call was pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UplinkLoss {
    /// The sled closed the connection, or it failed.
    Closed,
    /// A newer connection for the same project replaced this one.
    Replaced,
    /// The sled fell silent past the heartbeat timeout.
    HeartbeatTimeout,
    /// The gateway is shutting down.
    Shutdown,
    /// The project was removed from the registry (a reload of projects.toml).
    Unregistered,
    /// Another replica of the cluster claimed the project (this one lost its claim).
    Superseded,
    /// The call was relayed to the replica holding the project's uplink, which took it and
    /// then fell silent (it died, or was cut off).
    OwnerLost,
    /// The call was to be relayed to the replica holding the project's uplink, and nobody
    /// took it: it was not sent to the sled.
    NotRelayed,
    /// The call was to be relayed to the replica holding the project's uplink, and the
    /// cluster's engine stayed out of reach for the call's timeout: it was not sent.
    EngineUnreachable,
}

impl UplinkLoss {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            UplinkLoss::Closed => "its uplink closed",
            UplinkLoss::Replaced => "its uplink was replaced by a newer connection",
            UplinkLoss::HeartbeatTimeout => "its uplink missed its heartbeats",
            UplinkLoss::Shutdown => "the gateway is shutting down",
            UplinkLoss::Unregistered => "the project was removed from projects.toml",
            UplinkLoss::Superseded => "another gateway replica claimed the project",
            UplinkLoss::OwnerLost => {
                "the gateway replica holding its uplink took the call and then fell silent"
            }
            UplinkLoss::NotRelayed => {
                "no gateway replica took the call for the replica holding its uplink"
            }
            UplinkLoss::EngineUnreachable => {
                "its uplink is on another gateway replica, and this one could not reach the \
                 cluster's engine to relay the call within its timeout"
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            UplinkLoss::Closed => "closed",
            UplinkLoss::Replaced => "replaced",
            UplinkLoss::HeartbeatTimeout => "heartbeat_timeout",
            UplinkLoss::Shutdown => "shutdown",
            UplinkLoss::Unregistered => "unregistered",
            UplinkLoss::Superseded => "superseded",
            UplinkLoss::OwnerLost => "owner_lost",
            UplinkLoss::NotRelayed => "not_relayed",
            UplinkLoss::EngineUnreachable => "engine_unreachable",
        }
    }

    /// Whether the call may have reached the sled: `data.outcome`.
    fn outcome(self) -> &'static str {
        match self {
            UplinkLoss::NotRelayed | UplinkLoss::EngineUnreachable => "not_sent",
            UplinkLoss::Closed
            | UplinkLoss::Replaced
            | UplinkLoss::HeartbeatTimeout
            | UplinkLoss::Shutdown
            | UplinkLoss::Unregistered
            | UplinkLoss::Superseded
            | UplinkLoss::OwnerLost => "unknown",
        }
    }
}

/// A sled's request to the client of one of its calls that the gateway answers itself, up the
/// uplink, because it cannot be relayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SledRequestRefused {
    /// -32601: the request cannot reach a client; `why` says why.
    NotRelayable { why: String },
    /// The client of the call (of the stateless era) did not declare `capability`:
    /// [`code::MISSING_REQUIRED_CLIENT_CAPABILITY`], with the capability in
    /// `data.requiredCapabilities`.
    MissingCapability { capability: &'static str },
}

impl SledRequestRefused {
    /// The JSON-RPC error response to the sled's request `sled_id` (raw JSON text).
    pub(crate) fn response(&self, sled_id: &str) -> String {
        let error = match self {
            SledRequestRefused::NotRelayable { why } => {
                json!({ "code": code::METHOD_NOT_FOUND, "message": why })
            }
            SledRequestRefused::MissingCapability { capability } => json!({
                "code": code::MISSING_REQUIRED_CLIENT_CAPABILITY,
                "message": format!("the client of this call did not declare the '{capability}' capability"),
                "data": { "requiredCapabilities": { *capability: {} } },
            }),
        };
        crate::jsonrpc::raw_error_response(sled_id, &error.to_string())
    }
}

/// Which in-flight limit a refused call ran into (see `Config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallLimit {
    /// `max_calls_per_session`: the calling session has this many calls pending.
    Session,
    /// `max_calls_per_sled`: the project's sled has this many calls pending.
    Sled,
    /// `max_calls_per_identity`: the caller's identity (a client token, an OAuth subject) has
    /// this many calls pending, in all its sessions and without one.
    Identity,
}

impl CallLimit {
    /// The name of the setting, as `data.limit` carries it.
    pub fn name(self) -> &'static str {
        match self {
            CallLimit::Session => "max_calls_per_session",
            CallLimit::Sled => "max_calls_per_sled",
            CallLimit::Identity => "max_calls_per_identity",
        }
    }
}

/// A JSON-RPC error the gateway answers a request with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RpcError {
    /// The body is not JSON.
    Parse {
        detail: String,
    },
    /// The body is JSON but not a JSON-RPC 2.0 message.
    InvalidRequest {
        detail: String,
    },
    /// A JSON array: batches were removed from MCP in 2025-06-18.
    Batch,
    MethodNotFound {
        method: String,
    },
    /// The params of a method are malformed.
    InvalidParams {
        method: String,
        detail: String,
    },
    /// `arguments.project` is present but not a string.
    ProjectNotString {
        tool: String,
    },
    /// `arguments.project` is the empty string.
    ProjectEmpty {
        tool: String,
    },
    /// The named project is not in the registry.
    UnknownProject {
        project: String,
        registered: Vec<String>,
    },
    /// No `project` argument, and the session (or a sessionless request) has no default.
    NoProjectSelected {
        tool: String,
        registered: Vec<String>,
    },
    /// `switch_project` on a request that carries no `Mcp-Session-Id`.
    SwitchWithoutSession,
    /// The project is registered but its sled has no live uplink.
    SledNotConnected {
        project: String,
        sled: String,
    },
    /// The project's sled is held by another replica of the cluster, and this request cannot
    /// be relayed there (it was relayed here already, or it is a fleet-wide request).
    OwnedElsewhere {
        project: String,
        sled: String,
        replica: String,
    },
    /// The call was forwarded, then its uplink went away; it may or may not have been applied.
    UplinkLost {
        project: String,
        sled: String,
        loss: UplinkLoss,
    },
    /// The call was forwarded and no answer came within the project's deadline; it may or may
    /// not have been applied.
    Timeout {
        project: String,
        sled: String,
        waited: Duration,
    },
    /// The sled answered with something that is not a JSON-RPC response.
    BadSledResponse {
        project: String,
        sled: String,
    },
    /// The gateway is shutting down and takes no new calls.
    ShuttingDown,
    /// The client cancelled the call (`notifications/cancelled`); the sled was told.
    Cancelled {
        project: String,
    },
    /// 2026-07-28: `params._meta` lacks the per-request protocol fields.
    MissingEnvelope {
        missing: Vec<&'static str>,
    },
    /// 2026-07-28: an HTTP header (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`,
    /// `Mcp-Param-Project`) disagrees with the body.
    HeaderMismatch {
        header: &'static str,
    },
    /// 2026-07-28: a protocol version in `_meta` the gateway does not speak.
    UnsupportedVersion {
        requested: String,
        supported: Vec<&'static str>,
    },
    /// A tool that does not exist in this era (`switch_project` without sessions).
    UnknownTool {
        tool: String,
        why: &'static str,
    },
    /// Past a limit on calls in flight: the call was not sent, and may be retried later.
    TooManyCalls {
        project: String,
        sled: String,
        limit: CallLimit,
        max: usize,
        retry_after: Duration,
    },
    /// Past `max_fanouts_per_identity`: the caller's identity already has this many
    /// `aggregate_pipeline_status` fan-outs running; nothing was sent.
    TooManyFanouts {
        max: usize,
        retry_after: Duration,
    },
    /// A member the gateway could forward (`params`, or a response's `result` or `error`)
    /// holds what a strict JSON reader rejects: refused at once, nothing was sent.
    Unreadable {
        member: &'static str,
        problem: Unreadable,
    },
    /// 2026-07-28: the sled asked the client of a call for something (sampling, elicitation,
    /// roots) that the request's `clientCapabilities` did not declare. The call was cancelled at
    /// the sled.
    MissingClientCapability {
        project: String,
        sled: String,
        capability: &'static str,
    },
    /// `tasks/*` named a task this caller cannot reach: never made, made by another identity
    /// or session, altered, expired, or of another gateway. Every reason gets the same
    /// answer, so that nobody learns whether someone else's task exists (`crate::tasks`).
    UnknownTask {
        method: String,
    },
    /// A task-augmented call of a tool whose `execution.taskSupport` is absent or `forbidden`.
    TaskNotSupported {
        tool: String,
        project: String,
    },
    /// 2026-07-28: a tool that runs only as a task, or a `tasks/*` request, from a client
    /// whose request did not declare the tasks extension.
    TasksNotDeclared {
        what: String,
    },
    /// `tasks/result` of a task the gateway ran itself that failed or was cancelled.
    TaskEnded {
        status: &'static str,
        message: String,
    },
    /// The caller has [`crate::tasks::MAX_TASKS_PER_CREATOR`] live tasks: not sent.
    TooManyTasks {
        max: usize,
    },
    /// `[[access]]`: the caller may see the project but lacks the right this needs.
    Forbidden {
        project: String,
        right: &'static str,
        what: String,
    },
    /// 2026-07-28: a retry's `requestState` names no call waiting for its input (unknown,
    /// already used, expired with its call, or presented with another method or name).
    UnknownRequestState {
        method: String,
    },
    /// The sled said it could not read the frame carrying the call (an `unreadable` control
    /// frame): the call was not applied.
    SledUnreadable {
        project: String,
        sled: String,
        reason: String,
    },
    /// A coordination tool refused: bad input, a limit, or an act on a lease or key the
    /// caller may not act on (never a success-shaped no-op).
    Coordination {
        tool: &'static str,
        error: CoordError,
    },
    /// A coordination tool from a caller that is no agent: no session, and no `agent` handle.
    NoAgent {
        tool: &'static str,
    },
    /// An `agent` argument that is no handle this gateway issued.
    UnknownAgent {
        tool: &'static str,
    },
    /// A write to a resource another agent holds a live lease on: not sent.
    LeaseHeld {
        project: String,
        resource: String,
        holder: String,
        holder_name: Option<String>,
        expires_in: Duration,
    },
    /// A write to a resource of a project with `leases = "required"`, without the lease.
    LeaseRequired {
        project: String,
        resource: String,
    },
    /// A call to a project with live leases whose sled's tools are not listed yet (it just
    /// connected to a gateway that never saw its tools), so which writes need a lease is not
    /// known: not sent; retry in a moment.
    ToolsPending {
        project: String,
        sled: String,
        retry_after: Duration,
    },
    /// A coordination write took effect in this gateway, but its state store could not write
    /// it: it may be lost if the gateway restarts (it is written again with the project's
    /// next change). Retry in a moment.
    NotDurable {
        tool: String,
        project: String,
        retry_after: Duration,
    },
}

impl RpcError {
    pub fn code(&self) -> i64 {
        match self {
            RpcError::Parse { .. } => code::PARSE_ERROR,
            RpcError::InvalidRequest { .. } | RpcError::Batch => code::INVALID_REQUEST,
            RpcError::MethodNotFound { .. } => code::METHOD_NOT_FOUND,
            RpcError::InvalidParams { .. }
            | RpcError::ProjectNotString { .. }
            | RpcError::ProjectEmpty { .. }
            | RpcError::UnknownProject { .. }
            | RpcError::NoProjectSelected { .. }
            | RpcError::SwitchWithoutSession => code::INVALID_PARAMS,
            RpcError::SledNotConnected { .. }
            | RpcError::OwnedElsewhere { .. }
            | RpcError::UplinkLost { .. }
            | RpcError::BadSledResponse { .. }
            | RpcError::ShuttingDown => code::INTERNAL_ERROR,
            RpcError::Cancelled { .. } => code::REQUEST_CANCELLED,
            RpcError::MissingEnvelope { .. } | RpcError::UnknownTool { .. } => code::INVALID_PARAMS,
            RpcError::HeaderMismatch { .. } => code::HEADER_MISMATCH,
            RpcError::UnsupportedVersion { .. } => code::UNSUPPORTED_PROTOCOL_VERSION,
            RpcError::Timeout { .. } => code::REQUEST_TIMEOUT,
            RpcError::TooManyCalls { .. } | RpcError::TooManyFanouts { .. } => code::SERVER_ERROR,
            RpcError::Unreadable { .. } => code::INVALID_PARAMS,
            RpcError::SledUnreadable { .. } => code::INTERNAL_ERROR,
            RpcError::MissingClientCapability { .. } | RpcError::TasksNotDeclared { .. } => {
                code::MISSING_REQUIRED_CLIENT_CAPABILITY
            }
            RpcError::UnknownRequestState { .. } | RpcError::UnknownTask { .. } => {
                code::INVALID_PARAMS
            }
            RpcError::TaskNotSupported { .. } => code::METHOD_NOT_FOUND,
            RpcError::TaskEnded { .. } => code::INTERNAL_ERROR,
            RpcError::TooManyTasks { .. } => code::SERVER_ERROR,
            RpcError::Forbidden { .. } => code::SERVER_ERROR,
            RpcError::Coordination { error, .. } => match error {
                CoordError::BadName { .. }
                | CoordError::BadTtl { .. }
                | CoordError::TooLarge { .. }
                | CoordError::DuplicateToken(_) => code::INVALID_PARAMS,
                CoordError::NotHolder { .. }
                | CoordError::NoLease { .. }
                | CoordError::RevisionMismatch { .. }
                | CoordError::NoKey { .. }
                | CoordError::Limit { .. }
                | CoordError::InboxFull { .. }
                | CoordError::TooManyWaiters { .. }
                | CoordError::Exhausted { .. } => code::SERVER_ERROR,
            },
            RpcError::NoAgent { .. } | RpcError::UnknownAgent { .. } => code::INVALID_PARAMS,
            RpcError::LeaseHeld { .. }
            | RpcError::LeaseRequired { .. }
            | RpcError::ToolsPending { .. }
            | RpcError::NotDurable { .. } => code::SERVER_ERROR,
        }
    }

    /// The stable name carried in `data.kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            RpcError::Parse { .. } => "parse_error",
            RpcError::InvalidRequest { .. } => "invalid_request",
            RpcError::Batch => "batch_not_supported",
            RpcError::MethodNotFound { .. } => "method_not_found",
            RpcError::InvalidParams { .. } => "invalid_params",
            RpcError::ProjectNotString { .. } => "project_not_string",
            RpcError::ProjectEmpty { .. } => "project_empty",
            RpcError::UnknownProject { .. } => "unknown_project",
            RpcError::NoProjectSelected { .. } => "no_project_selected",
            RpcError::SwitchWithoutSession => "switch_without_session",
            RpcError::SledNotConnected { .. } => "sled_not_connected",
            RpcError::OwnedElsewhere { .. } => "sled_elsewhere",
            RpcError::UplinkLost { .. } => "uplink_lost",
            RpcError::Timeout { .. } => "timeout",
            RpcError::BadSledResponse { .. } => "bad_sled_response",
            RpcError::ShuttingDown => "shutting_down",
            RpcError::Cancelled { .. } => "cancelled",
            RpcError::MissingEnvelope { .. } => "missing_envelope",
            RpcError::HeaderMismatch { .. } => "header_mismatch",
            RpcError::UnsupportedVersion { .. } => "unsupported_protocol_version",
            RpcError::UnknownTool { .. } => "unknown_tool",
            RpcError::TooManyCalls { .. } | RpcError::TooManyFanouts { .. } => "too_many_calls",
            RpcError::Unreadable {
                problem: Unreadable::TooDeep { .. },
                ..
            } => "too_deep",
            RpcError::Unreadable {
                problem: Unreadable::Invalid { .. },
                ..
            } => "unreadable_value",
            RpcError::SledUnreadable { .. } => "sled_could_not_read",
            RpcError::MissingClientCapability { .. } | RpcError::TasksNotDeclared { .. } => {
                "missing_client_capability"
            }
            RpcError::UnknownRequestState { .. } => "unknown_request_state",
            RpcError::UnknownTask { .. } => "unknown_task",
            RpcError::TaskNotSupported { .. } => "task_not_supported",
            RpcError::TaskEnded { status, .. } => {
                if *status == "cancelled" {
                    "task_cancelled"
                } else {
                    "task_failed"
                }
            }
            RpcError::TooManyTasks { .. } => "too_many_tasks",
            RpcError::Forbidden { .. } => "forbidden",
            RpcError::Coordination { error, .. } => match error {
                CoordError::BadName { .. } => "bad_name",
                CoordError::BadTtl { .. } => "bad_ttl",
                CoordError::NotHolder { .. } => "not_holder",
                CoordError::NoLease { .. } => "no_lease",
                CoordError::RevisionMismatch { .. } => "revision_mismatch",
                CoordError::NoKey { .. } => "no_key",
                CoordError::Limit { .. } => "limit",
                CoordError::TooLarge { .. } => "too_large",
                CoordError::InboxFull { .. } => "inbox_full",
                CoordError::TooManyWaiters { .. } => "too_many_waiters",
                CoordError::DuplicateToken(_) => "duplicate_wait",
                CoordError::Exhausted { .. } => "exhausted",
            },
            RpcError::NoAgent { .. } => "no_agent",
            RpcError::UnknownAgent { .. } => "unknown_agent",
            RpcError::LeaseHeld { .. } => "lease_held",
            RpcError::LeaseRequired { .. } => "lease_required",
            RpcError::ToolsPending { .. } => "tools_pending",
            RpcError::NotDurable { .. } => "state_not_durable",
        }
    }

    pub fn message(&self) -> String {
        match self {
            RpcError::Parse { detail } => format!("Parse error: the body is not valid JSON ({detail})"),
            RpcError::InvalidRequest { detail } => format!("Invalid request: {detail}"),
            RpcError::Batch => "Invalid request: JSON-RPC batches are not supported (removed from MCP in 2025-06-18); send one message per request".into(),
            RpcError::MethodNotFound { method } => format!("Method not found: {method}"),
            RpcError::InvalidParams { method, detail } => format!("Invalid params for {method}: {detail}"),
            RpcError::ProjectNotString { tool } => format!(
                "Invalid params for {tool}: the `project` argument must be a string naming a registered project"
            ),
            RpcError::ProjectEmpty { tool } => format!(
                "Invalid params for {tool}: the `project` argument is empty; name a registered project, or omit it to use this session's default"
            ),
            RpcError::UnknownProject { project, registered } => format!(
                "Unknown project '{project}'; registered projects: {}",
                names(registered)
            ),
            RpcError::NoProjectSelected { tool, .. } => format!(
                "No project selected for {tool}: pass \"project\": \"<name>\" in the tool's arguments, or call switch_project to set this session's default project (list_projects names them)"
            ),
            RpcError::SwitchWithoutSession => "switch_project needs an MCP session: send initialize and repeat the Mcp-Session-Id header it returns on later requests, or pass \"project\": \"<name>\" in each tool call's arguments instead".into(),
            RpcError::SledNotConnected { project, sled } => format!(
                "Project '{project}' is registered but its sled '{sled}' has no live uplink to the gateway"
            ),
            RpcError::OwnedElsewhere { project, sled, replica } => format!(
                "Project '{project}''s sled '{sled}' is connected to gateway replica '{replica}', and this request cannot be relayed there; send it again"
            ),
            RpcError::UplinkLost { project, sled, loss } => format!(
                "Call to project '{project}' failed: {} (sled '{sled}'); the call may or may not have been applied",
                loss.describe()
            ),
            RpcError::Timeout { project, sled, waited } => format!(
                "Call to project '{project}' timed out after {} ms waiting for sled '{sled}'; the call may or may not have been applied",
                waited.as_millis()
            ),
            RpcError::BadSledResponse { project, sled } => format!(
                "Sled '{sled}' of project '{project}' answered with a malformed JSON-RPC response"
            ),
            RpcError::ShuttingDown => "The gateway is shutting down; retry against another gateway or after it restarts".into(),
            RpcError::Cancelled { project } => format!(
                "Request cancelled by the client; project '{project}' was told to stop; the call may or may not have been applied"
            ),
            RpcError::MissingEnvelope { missing } => format!(
                "Invalid params: params._meta must carry {} (protocol 2026-07-28 sends them on every request)",
                missing.iter().map(|m| format!("'{m}'")).collect::<Vec<_>>().join(" and ")
            ),
            RpcError::HeaderMismatch { header } => format!(
                "Header mismatch: the {header} header does not match the request body"
            ),
            RpcError::UnsupportedVersion { requested, supported } => format!(
                "Unsupported protocol version '{requested}'; this gateway speaks {} per request (and {} with initialize)",
                supported.join(", "),
                crate::http::PROTOCOL_VERSIONS.join(", ")
            ),
            RpcError::UnknownTool { tool, why } => format!("Unknown tool: {tool}; {why}"),
            RpcError::TooManyCalls { project, sled, limit, max, retry_after } => format!(
                "Too many calls in flight: {} already has {max} calls pending ({}); the call to project '{project}' was not sent; retry after {} ms",
                match limit {
                    CallLimit::Session => "this session".to_owned(),
                    CallLimit::Sled => format!("sled '{sled}'"),
                    CallLimit::Identity => "this caller's identity".to_owned(),
                },
                limit.name(),
                retry_after.as_millis()
            ),
            RpcError::TooManyFanouts { max, retry_after } => format!(
                "Too many fan-outs in flight: this caller's identity already has {max} aggregate_pipeline_status calls running (max_fanouts_per_identity); nothing was sent; retry after {} ms",
                retry_after.as_millis()
            ),
            RpcError::Unreadable { member, problem } => format!(
                "Invalid {member}: {problem}; a strict JSON reader would reject it, so it was not forwarded (values may nest at most {} levels, string escapes must be Unicode scalar values, numbers must fit a double)",
                crate::strict::MAX_CLIENT_DEPTH
            ),
            RpcError::MissingClientCapability { project, sled, capability } => format!(
                "Missing required client capability: sled '{sled}' of project '{project}' asked the client of this call for '{capability}', which the request's clientCapabilities did not declare; the call was cancelled at the sled"
            ),
            RpcError::UnknownTask { .. } => {
                "Failed to retrieve task: Task not found (never made, made by another caller, or expired)".to_owned()
            }
            RpcError::TaskNotSupported { tool, project } => format!(
                "Method not found: tool '{tool}' of project '{project}' does not run as a task (its execution.taskSupport is absent or \"forbidden\"): call it without `task`"
            ),
            RpcError::TasksNotDeclared { what } => format!(
                "Missing required client capability: {what} needs the io.modelcontextprotocol/tasks extension, which the request's clientCapabilities did not declare"
            ),
            RpcError::TaskEnded { status, message } => {
                format!("The task ended {status}, with no result: {message}")
            }
            RpcError::TooManyTasks { max } => format!(
                "Too many tasks: this caller has {max} live tasks, the most the gateway keeps per caller; wait for some to expire (their TTL) or use shorter TTLs"
            ),
            RpcError::Forbidden { project, right, what } => format!(
                "Forbidden: {what} on project '{project}' needs the '{right}' right, which this caller does not have there (projects.toml [[access]])"
            ),
            RpcError::UnknownRequestState { method } => format!(
                "Invalid params for {method}: requestState names no call waiting for input (it was used already, its call ended, or the retry's method or name differs from the original request's); send the request again without requestState"
            ),
            RpcError::SledUnreadable { project, sled, reason } => format!(
                "Sled '{sled}' of project '{project}' could not read the call ({reason}); the call was not applied"
            ),
            RpcError::Coordination { tool, error } => match error {
                CoordError::Limit { .. } | CoordError::InboxFull { .. } | CoordError::TooManyWaiters { .. } => {
                    format!("{tool} refused: {error}; retry after {} ms", RETRY_AFTER_MS)
                }
                CoordError::BadName { .. }
                | CoordError::BadTtl { .. }
                | CoordError::NotHolder { .. }
                | CoordError::NoLease { .. }
                | CoordError::RevisionMismatch { .. }
                | CoordError::NoKey { .. }
                | CoordError::TooLarge { .. }
                | CoordError::DuplicateToken(_)
                | CoordError::Exhausted { .. } => format!("{tool} refused: {error}"),
            },
            RpcError::NoAgent { tool } => format!(
                "{tool} needs an agent: send initialize and repeat its Mcp-Session-Id, or call checkin without a session to get an agent handle and pass it as \"agent\""
            ),
            RpcError::UnknownAgent { tool } => format!(
                "{tool}: the `agent` argument is not a handle this gateway issued (handles come from checkin, and end with the gateway)"
            ),
            RpcError::LeaseHeld { project, resource, holder, holder_name, expires_in } => format!(
                "Refused: {resource} of project '{project}' is leased by {}{holder} for {} ms more; claim it when it is released (wait wakes you) and retry",
                holder_name.as_deref().map(|n| format!("{n} / ")).unwrap_or_default(),
                expires_in.as_millis()
            ),
            RpcError::LeaseRequired { project, resource } => format!(
                "Refused: project '{project}' requires a lease for every write; claim {resource} first, then retry"
            ),
            RpcError::ToolsPending { project, sled, retry_after } => format!(
                "Not sent: sled '{sled}' of project '{project}' has just connected and its tools are not listed yet, so the gateway cannot tell which writes need a lease; retry after {} ms",
                retry_after.as_millis()
            ),
            RpcError::NotDurable { tool, project, retry_after } => format!(
                "{tool} on project '{project}' took effect in this gateway, but the gateway's state store could not write it, so it may be lost if the gateway restarts; check the state directory's disk and retry after {} ms",
                retry_after.as_millis()
            ),
        }
    }

    pub fn data(&self) -> Value {
        let kind = self.kind();
        match self {
            RpcError::Parse { .. }
            | RpcError::InvalidRequest { .. }
            | RpcError::Batch
            | RpcError::SwitchWithoutSession
            | RpcError::ShuttingDown => json!({ "kind": kind }),
            RpcError::MethodNotFound { method } => json!({ "kind": kind, "method": method }),
            RpcError::InvalidParams { method, .. } => json!({ "kind": kind, "method": method }),
            RpcError::ProjectNotString { tool } | RpcError::ProjectEmpty { tool } => {
                json!({ "kind": kind, "tool": tool })
            }
            RpcError::UnknownProject {
                project,
                registered,
            } => json!({ "kind": kind, "project": project, "registered": registered }),
            RpcError::NoProjectSelected { tool, registered } => {
                json!({ "kind": kind, "tool": tool, "registered": registered })
            }
            RpcError::SledNotConnected { project, sled }
            | RpcError::BadSledResponse { project, sled } => {
                json!({ "kind": kind, "project": project, "sled": sled })
            }
            RpcError::OwnedElsewhere {
                project,
                sled,
                replica,
            } => json!({ "kind": kind, "project": project, "sled": sled, "replica": replica }),
            RpcError::Cancelled { project } => {
                json!({ "kind": kind, "project": project, "outcome": "unknown" })
            }
            RpcError::MissingEnvelope { missing } => json!({ "kind": kind, "missing": missing }),
            RpcError::HeaderMismatch { header } => json!({ "kind": kind, "header": header }),
            RpcError::UnsupportedVersion {
                requested,
                supported,
            } => json!({ "kind": kind, "requested": requested, "supported": supported }),
            RpcError::UnknownTool { tool, .. } => json!({ "kind": kind, "tool": tool }),
            RpcError::UplinkLost {
                project,
                sled,
                loss,
            } => json!({
                "kind": kind, "project": project, "sled": sled,
                "reason": loss.name(), "outcome": loss.outcome(),
            }),
            RpcError::Timeout {
                project,
                sled,
                waited,
            } => json!({
                "kind": kind, "project": project, "sled": sled,
                "waited_ms": u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                "outcome": "unknown",
            }),
            RpcError::TooManyCalls {
                project,
                sled,
                limit,
                max,
                retry_after,
            } => json!({
                "kind": kind, "project": project, "sled": sled,
                "limit": limit.name(), "max": max,
                "retry_after_ms": u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
                "outcome": "not_sent",
            }),
            RpcError::TooManyFanouts { max, retry_after } => json!({
                "kind": kind, "limit": "max_fanouts_per_identity", "max": max,
                "retry_after_ms": u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
                "outcome": "not_sent",
            }),
            RpcError::Unreadable { member, problem } => match problem {
                Unreadable::TooDeep { limit } => {
                    json!({ "kind": kind, "member": member, "max_depth": limit })
                }
                Unreadable::Invalid { detail } => {
                    json!({ "kind": kind, "member": member, "detail": detail })
                }
            },
            RpcError::MissingClientCapability {
                project,
                sled,
                capability,
            } => json!({
                "kind": kind, "project": project, "sled": sled,
                "requiredCapabilities": { *capability: {} },
            }),
            RpcError::UnknownRequestState { method } | RpcError::UnknownTask { method } => {
                json!({ "kind": kind, "method": method })
            }
            RpcError::TaskNotSupported { tool, project } => {
                json!({ "kind": kind, "tool": tool, "project": project, "outcome": "not_sent" })
            }
            RpcError::TasksNotDeclared { what } => json!({
                "kind": kind, "what": what,
                "requiredCapabilities": { "extensions": { crate::tasks::EXTENSION: {} } },
            }),
            RpcError::TaskEnded { status, .. } => json!({ "kind": kind, "status": status }),
            RpcError::TooManyTasks { max } => json!({
                "kind": kind, "limit": "max_tasks_per_caller", "max": max, "outcome": "not_sent",
            }),
            RpcError::Forbidden {
                project,
                right,
                what,
            } => json!({ "kind": kind, "project": project, "right": right, "what": what }),
            RpcError::SledUnreadable {
                project,
                sled,
                reason,
            } => json!({
                "kind": kind, "project": project, "sled": sled,
                "reason": reason, "outcome": "not_sent",
            }),
            RpcError::Coordination { tool, error } => {
                let mut d = json!({ "kind": kind, "tool": tool });
                match error {
                    CoordError::BadName { what, reason } => {
                        d["what"] = json!(what);
                        d["reason"] = json!(reason);
                    }
                    CoordError::BadTtl { what } => d["what"] = json!(what),
                    CoordError::NotHolder { resource, holder } => {
                        d["resource"] = json!(resource);
                        d["holder"] = json!(holder);
                    }
                    CoordError::NoLease { resource, expired } => {
                        d["resource"] = json!(resource);
                        d["expired"] = json!(expired);
                    }
                    CoordError::RevisionMismatch { key, current } => {
                        d["key"] = json!(key);
                        d["current"] = json!(current);
                    }
                    CoordError::NoKey { key } => d["key"] = json!(key),
                    CoordError::Limit { which, max } => {
                        d["limit"] = json!(which.name());
                        d["max"] = json!(max);
                        d["retry_after_ms"] = json!(RETRY_AFTER_MS);
                    }
                    CoordError::TooLarge {
                        what,
                        max_bytes,
                        got,
                    } => {
                        d["what"] = json!(what);
                        d["max_bytes"] = json!(max_bytes);
                        d["got"] = json!(got);
                    }
                    CoordError::InboxFull { max, .. } | CoordError::TooManyWaiters { max } => {
                        d["max"] = json!(max);
                        d["retry_after_ms"] = json!(RETRY_AFTER_MS);
                    }
                    CoordError::DuplicateToken(_) | CoordError::Exhausted { .. } => {}
                }
                d
            }
            RpcError::NoAgent { tool } | RpcError::UnknownAgent { tool } => {
                json!({ "kind": kind, "tool": tool })
            }
            RpcError::LeaseHeld {
                project,
                resource,
                holder,
                holder_name,
                expires_in,
            } => json!({
                "kind": kind, "project": project, "resource": resource, "holder": holder,
                "holder_name": holder_name,
                "expires_in_ms": u64::try_from(expires_in.as_millis()).unwrap_or(u64::MAX),
                "outcome": "not_sent",
            }),
            RpcError::LeaseRequired { project, resource } => json!({
                "kind": kind, "project": project, "resource": resource, "outcome": "not_sent",
            }),
            RpcError::ToolsPending {
                project,
                sled,
                retry_after,
            } => json!({
                "kind": kind, "project": project, "sled": sled,
                "retry_after_ms": u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
                "outcome": "not_sent",
            }),
            RpcError::NotDurable {
                tool,
                project,
                retry_after,
            } => json!({
                "kind": kind, "tool": tool, "project": project, "durable": false,
                "retry_after_ms": u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
                "outcome": "applied",
            }),
        }
    }

    /// The JSON-RPC `error` object.
    pub fn to_json(&self) -> Value {
        json!({ "code": self.code(), "message": self.message(), "data": self.data() })
    }

    /// A whole JSON-RPC response carrying this error; `id` is the request's id as raw JSON text,
    /// or `None` when it could not be read (the response then has `"id": null`).
    pub fn response(&self, id: Option<&str>) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#,
            id.unwrap_or("null"),
            self.to_json()
        )
    }
}

/// A refusal at the HTTP level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The `Mcp-Session-Id` names no live session: it ended, expired, or never existed.
    UnknownSession,
    /// GET or DELETE without an `Mcp-Session-Id`.
    MissingSession { method: &'static str },
    /// The `Accept` header rules out every format the answer could take.
    NotAcceptable { need: &'static str },
    /// A browser `Origin` that is not allowed (DNS rebinding protection).
    ForbiddenOrigin { origin: String },
    /// An `MCP-Protocol-Version` this gateway does not speak.
    UnsupportedProtocolVersion { got: String },
    /// A second GET stream for a session that already has one open.
    StreamConflict,
    /// Client authentication is on and the request has no valid bearer token. With OAuth on,
    /// the challenge names the protected resource metadata and the scopes required.
    Unauthorized {
        /// Whether a bearer token was sent (the challenge then says `invalid_token`).
        presented: bool,
        /// The URL of the protected resource metadata (RFC 9728), with OAuth on.
        resource_metadata: Option<String>,
        /// The scopes required, space-separated, with OAuth on and scopes required.
        scope: Option<String>,
    },
    /// A valid access token without a scope this gateway requires.
    InsufficientScope {
        /// The scopes required, space-separated.
        scope: String,
        resource_metadata: String,
    },
    /// A method `/mcp` does not serve.
    MethodNotAllowed {
        method: &'static str,
        allow: &'static str,
    },
    /// A POST whose body is not declared as JSON.
    UnsupportedContentType { got: Option<String> },
    /// The gateway is shutting down.
    ShuttingDown,
    /// The body is larger than the configured limit (the server refuses it before reading on).
    PayloadTooLarge { limit: usize },
    /// The body could not be read off the connection.
    BodyUnreadable,
    /// The body did not arrive within the body read deadline (the server refuses it).
    BodyTimeout { secs: u64 },
    /// The server holds as many connections as it may, in all or from this address.
    TooManyConnections { per_address: bool },
    /// `initialize` with `max_sessions` sessions live and none idle enough to evict.
    TooManySessions { max: usize, retry_after: Duration },
    /// A replica of a cluster could not read the named session from the cluster's engine.
    SessionStoreUnavailable,
    /// A replica of a cluster could not write a new session to the cluster's engine: no
    /// session was made (its id, known to no other replica, is not given out).
    SessionNotStored,
}

impl HttpError {
    pub fn status(&self) -> u16 {
        match self {
            HttpError::UnknownSession => 404,
            HttpError::MissingSession { .. } => 400,
            HttpError::NotAcceptable { .. } => 406,
            HttpError::ForbiddenOrigin { .. } => 403,
            HttpError::UnsupportedProtocolVersion { .. } => 400,
            HttpError::StreamConflict => 409,
            HttpError::Unauthorized { .. } => 401,
            HttpError::InsufficientScope { .. } => 403,
            HttpError::MethodNotAllowed { .. } => 405,
            HttpError::UnsupportedContentType { .. } => 415,
            HttpError::ShuttingDown => 503,
            HttpError::PayloadTooLarge { .. } => 413,
            HttpError::BodyUnreadable => 400,
            HttpError::BodyTimeout { .. } => 408,
            HttpError::TooManyConnections { .. } => 503,
            HttpError::TooManySessions { .. } => 503,
            HttpError::SessionStoreUnavailable | HttpError::SessionNotStored => 503,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            HttpError::UnknownSession => "unknown_session",
            HttpError::MissingSession { .. } => "missing_session",
            HttpError::NotAcceptable { .. } => "not_acceptable",
            HttpError::ForbiddenOrigin { .. } => "forbidden_origin",
            HttpError::UnsupportedProtocolVersion { .. } => "unsupported_protocol_version",
            HttpError::StreamConflict => "stream_conflict",
            HttpError::Unauthorized { .. } => "unauthorized",
            HttpError::InsufficientScope { .. } => "insufficient_scope",
            HttpError::MethodNotAllowed { .. } => "method_not_allowed",
            HttpError::UnsupportedContentType { .. } => "unsupported_content_type",
            HttpError::ShuttingDown => "shutting_down",
            HttpError::PayloadTooLarge { .. } => "payload_too_large",
            HttpError::BodyUnreadable => "body_unreadable",
            HttpError::BodyTimeout { .. } => "body_timeout",
            HttpError::TooManyConnections { .. } => "too_many_connections",
            HttpError::TooManySessions { .. } => "too_many_sessions",
            HttpError::SessionStoreUnavailable => "session_store_unavailable",
            HttpError::SessionNotStored => "session_not_stored",
        }
    }

    pub fn message(&self) -> String {
        match self {
            HttpError::UnknownSession => "Session not found: it ended, expired or never existed; send initialize to start a new session".into(),
            HttpError::MissingSession { method } => format!(
                "Bad request: {method} on /mcp needs the Mcp-Session-Id header that initialize returned"
            ),
            HttpError::NotAcceptable { need } => format!(
                "Not acceptable: this answer is {need}; send an Accept header that allows it (clients send Accept: application/json, text/event-stream)"
            ),
            HttpError::ForbiddenOrigin { origin } => format!(
                "Forbidden: Origin '{origin}' is not allowed; the gateway accepts loopback origins and those given with --allow-origin"
            ),
            HttpError::UnsupportedProtocolVersion { got } => format!(
                "Bad request: unsupported MCP-Protocol-Version '{got}'; this gateway speaks {}",
                crate::http::PROTOCOL_VERSIONS.join(", ")
            ),
            HttpError::StreamConflict => "Conflict: this session already has an open GET stream; close it before opening another".into(),
            HttpError::Unauthorized { presented: false, resource_metadata: None, .. } => "Unauthorized: this gateway requires a bearer token (Authorization: Bearer <token>)".into(),
            HttpError::Unauthorized { presented: true, resource_metadata: None, .. } => "Unauthorized: the bearer token is not valid for this gateway".into(),
            HttpError::Unauthorized { presented: false, resource_metadata: Some(url), .. } => format!(
                "Unauthorized: this gateway requires an OAuth access token issued for it (Authorization: Bearer <token>); its protected resource metadata is at {url}"
            ),
            HttpError::Unauthorized { presented: true, resource_metadata: Some(url), .. } => format!(
                "Unauthorized: the bearer token is not a valid access token for this gateway; its protected resource metadata is at {url}"
            ),
            HttpError::InsufficientScope { scope, .. } => format!(
                "Forbidden: the access token lacks a scope this gateway requires; ask for: {scope}"
            ),
            HttpError::MethodNotAllowed { method, allow } => format!(
                "Method not allowed: {method} on /mcp for this protocol version; allowed: {allow}"
            ),
            HttpError::UnsupportedContentType { got } => format!(
                "Unsupported Content-Type {}: POST a JSON-RPC message with Content-Type: application/json",
                got.as_deref().map_or("(none)".to_owned(), |g| format!("'{g}'"))
            ),
            HttpError::ShuttingDown => "Service unavailable: the gateway is shutting down".into(),
            HttpError::PayloadTooLarge { limit } => format!(
                "Payload too large: the request body is over the limit of {limit} bytes"
            ),
            HttpError::BodyUnreadable => "Bad request: the request body could not be read".into(),
            HttpError::BodyTimeout { secs } => format!(
                "Request timeout: the request body did not arrive within {secs} s"
            ),
            HttpError::TooManyConnections { per_address: true } => "Service unavailable: too many connections from this address; close some, or retry in a moment".into(),
            HttpError::TooManyConnections { per_address: false } => "Service unavailable: the gateway holds its maximum of connections; retry in a moment".into(),
            HttpError::TooManySessions { max, retry_after } => format!(
                "Service unavailable: the gateway holds its maximum of {max} sessions (max_sessions) and none is idle enough to end; retry after {} s, or end unused sessions with DELETE",
                retry_secs(*retry_after)
            ),
            HttpError::SessionStoreUnavailable => "Service unavailable: this gateway replica cannot reach the cluster's engine to read the session; the session is not lost: retry in a moment".into(),
            HttpError::SessionNotStored => "Service unavailable: this gateway replica could not write the new session to the cluster's engine, so no session was made: send initialize again in a moment".into(),
        }
    }

    pub fn headers(&self) -> Vec<(&'static str, String)> {
        match self {
            HttpError::MethodNotAllowed { allow, .. } => vec![("Allow", (*allow).into())],
            HttpError::Unauthorized {
                presented,
                resource_metadata: None,
                ..
            } => {
                let error = if *presented {
                    r#", error="invalid_token""#
                } else {
                    ""
                };
                vec![(
                    "WWW-Authenticate",
                    format!(r#"Bearer realm="mcp-gateway"{error}"#),
                )]
            }
            // RFC 6750 §3 and RFC 9728 §5.1. The URL and scopes were checked when the file was
            // read to need no escaping in a quoted string.
            HttpError::Unauthorized {
                presented,
                resource_metadata: Some(url),
                scope,
            } => {
                let mut challenge = String::from("Bearer ");
                if *presented {
                    challenge.push_str(r#"error="invalid_token", "#);
                }
                challenge.push_str(&format!(r#"resource_metadata="{url}""#));
                if let Some(scope) = scope {
                    challenge.push_str(&format!(r#", scope="{scope}""#));
                }
                vec![("WWW-Authenticate", challenge)]
            }
            HttpError::InsufficientScope {
                scope,
                resource_metadata,
            } => vec![(
                "WWW-Authenticate",
                format!(
                    r#"Bearer error="insufficient_scope", scope="{scope}", resource_metadata="{resource_metadata}""#
                ),
            )],
            HttpError::ShuttingDown => vec![("Retry-After", "5".into())],
            HttpError::SessionStoreUnavailable
            | HttpError::SessionNotStored
            | HttpError::TooManyConnections { .. } => {
                vec![("Retry-After", "1".into())]
            }
            HttpError::TooManySessions { retry_after, .. } => {
                vec![("Retry-After", retry_secs(*retry_after).to_string())]
            }
            HttpError::UnknownSession
            | HttpError::MissingSession { .. }
            | HttpError::NotAcceptable { .. }
            | HttpError::ForbiddenOrigin { .. }
            | HttpError::UnsupportedProtocolVersion { .. }
            | HttpError::StreamConflict
            | HttpError::UnsupportedContentType { .. }
            | HttpError::PayloadTooLarge { .. }
            | HttpError::BodyUnreadable
            | HttpError::BodyTimeout { .. } => Vec::new(),
        }
    }

    /// The body: a JSON-RPC error response with a `null` id, as the MCP SDK servers send.
    pub fn body(&self) -> String {
        let error = json!({
            "code": code::SERVER_ERROR,
            "message": self.message(),
            "data": { "kind": self.kind(), "status": self.status() },
        });
        format!(r#"{{"jsonrpc":"2.0","id":null,"error":{error}}}"#)
    }

    /// The whole HTTP answer.
    pub fn reply(&self) -> crate::io::HttpReply {
        crate::io::HttpReply {
            status: self.status(),
            headers: self.headers(),
            body: Some(self.body()),
        }
    }
}

/// A `Retry-After` in whole seconds, rounded up, at least 1.
fn retry_secs(d: Duration) -> u64 {
    d.as_millis()
        .div_ceil(1000)
        .max(1)
        .try_into()
        .unwrap_or(u64::MAX)
}

fn names(v: &[String]) -> String {
    if v.is_empty() {
        "(none)".into()
    } else {
        v.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_rpc() -> Vec<(&'static str, RpcError)> {
        let registered = vec!["alpha".to_owned(), "beta".to_owned(), "gamma".to_owned()];
        vec![
            (
                "parse",
                RpcError::Parse {
                    detail: "expected value at line 1 column 1".into(),
                },
            ),
            (
                "invalid_request",
                RpcError::InvalidRequest {
                    detail: "`jsonrpc` must be \"2.0\"".into(),
                },
            ),
            ("batch", RpcError::Batch),
            (
                "method_not_found",
                RpcError::MethodNotFound {
                    method: "resources/list".into(),
                },
            ),
            (
                "invalid_params",
                RpcError::InvalidParams {
                    method: "tools/call".into(),
                    detail: "`name` must be a string".into(),
                },
            ),
            (
                "project_not_string",
                RpcError::ProjectNotString {
                    tool: "show".into(),
                },
            ),
            (
                "project_empty",
                RpcError::ProjectEmpty {
                    tool: "show".into(),
                },
            ),
            (
                "unknown_project",
                RpcError::UnknownProject {
                    project: "zeta".into(),
                    registered: registered.clone(),
                },
            ),
            (
                "no_project_selected",
                RpcError::NoProjectSelected {
                    tool: "show".into(),
                    registered,
                },
            ),
            ("switch_without_session", RpcError::SwitchWithoutSession),
            (
                "sled_not_connected",
                RpcError::SledNotConnected {
                    project: "gamma".into(),
                    sled: "gamma-sled".into(),
                },
            ),
            (
                "uplink_lost_closed",
                RpcError::UplinkLost {
                    project: "beta".into(),
                    sled: "beta".into(),
                    loss: UplinkLoss::Closed,
                },
            ),
            (
                "uplink_lost_replaced",
                RpcError::UplinkLost {
                    project: "beta".into(),
                    sled: "beta".into(),
                    loss: UplinkLoss::Replaced,
                },
            ),
            (
                "uplink_lost_heartbeat",
                RpcError::UplinkLost {
                    project: "beta".into(),
                    sled: "beta".into(),
                    loss: UplinkLoss::HeartbeatTimeout,
                },
            ),
            (
                "uplink_lost_shutdown",
                RpcError::UplinkLost {
                    project: "beta".into(),
                    sled: "beta".into(),
                    loss: UplinkLoss::Shutdown,
                },
            ),
            (
                "uplink_lost_unregistered",
                RpcError::UplinkLost {
                    project: "beta".into(),
                    sled: "beta".into(),
                    loss: UplinkLoss::Unregistered,
                },
            ),
            (
                "timeout",
                RpcError::Timeout {
                    project: "beta".into(),
                    sled: "beta".into(),
                    waited: Duration::from_millis(30_000),
                },
            ),
            (
                "bad_sled_response",
                RpcError::BadSledResponse {
                    project: "beta".into(),
                    sled: "beta".into(),
                },
            ),
            ("shutting_down", RpcError::ShuttingDown),
            (
                "cancelled",
                RpcError::Cancelled {
                    project: "beta".into(),
                },
            ),
            (
                "missing_envelope",
                RpcError::MissingEnvelope {
                    missing: vec!["io.modelcontextprotocol/protocolVersion"],
                },
            ),
            (
                "header_mismatch",
                RpcError::HeaderMismatch { header: "Mcp-Name" },
            ),
            (
                "unsupported_version",
                RpcError::UnsupportedVersion {
                    requested: "2099-01-01".into(),
                    supported: vec!["2026-07-28"],
                },
            ),
            (
                "unknown_tool",
                RpcError::UnknownTool {
                    tool: "switch_project".into(),
                    why:
                        "requests of protocol 2026-07-28 have no session: pass \"project\" per call",
                },
            ),
            (
                "too_many_calls_session",
                RpcError::TooManyCalls {
                    project: "beta".into(),
                    sled: "beta-sled".into(),
                    limit: CallLimit::Session,
                    max: 64,
                    retry_after: Duration::from_millis(1000),
                },
            ),
            (
                "too_many_calls_sled",
                RpcError::TooManyCalls {
                    project: "beta".into(),
                    sled: "beta-sled".into(),
                    limit: CallLimit::Sled,
                    max: 1024,
                    retry_after: Duration::from_millis(1000),
                },
            ),
            (
                "too_many_calls_identity",
                RpcError::TooManyCalls {
                    project: "beta".into(),
                    sled: "beta-sled".into(),
                    limit: CallLimit::Identity,
                    max: 256,
                    retry_after: Duration::from_millis(1000),
                },
            ),
            (
                "too_many_fanouts",
                RpcError::TooManyFanouts {
                    max: 4,
                    retry_after: Duration::from_millis(1000),
                },
            ),
            (
                "unreadable_too_deep",
                RpcError::Unreadable {
                    member: "params",
                    problem: Unreadable::TooDeep { limit: 64 },
                },
            ),
            (
                "unreadable_value",
                RpcError::Unreadable {
                    member: "params",
                    problem: Unreadable::Invalid {
                        detail: "lone leading surrogate in hex escape".into(),
                    },
                },
            ),
            (
                "coord_not_holder",
                RpcError::Coordination {
                    tool: "release",
                    error: CoordError::NotHolder {
                        resource: "story:beta-1".into(),
                        holder: Some("agent-2".into()),
                    },
                },
            ),
            (
                "coord_limit",
                RpcError::Coordination {
                    tool: "claim",
                    error: CoordError::Limit {
                        which: crate::coord::CoordLimit::LeasesPerAgent,
                        max: 64,
                    },
                },
            ),
            (
                "coord_revision_mismatch",
                RpcError::Coordination {
                    tool: "board_set",
                    error: CoordError::RevisionMismatch {
                        key: "plan".into(),
                        current: Some(7),
                    },
                },
            ),
            ("no_agent", RpcError::NoAgent { tool: "claim" }),
            ("unknown_agent", RpcError::UnknownAgent { tool: "claim" }),
            (
                "lease_held",
                RpcError::LeaseHeld {
                    project: "beta".into(),
                    resource: "story:beta-1".into(),
                    holder: "agent-1".into(),
                    holder_name: Some("ann".into()),
                    expires_in: Duration::from_millis(299_000),
                },
            ),
            (
                "lease_required",
                RpcError::LeaseRequired {
                    project: "beta".into(),
                    resource: "story:beta-1".into(),
                },
            ),
            (
                "tools_pending",
                RpcError::ToolsPending {
                    project: "beta".into(),
                    sled: "beta-sled".into(),
                    retry_after: Duration::from_millis(1000),
                },
            ),
            (
                "missing_client_capability",
                RpcError::MissingClientCapability {
                    project: "beta".into(),
                    sled: "beta-sled".into(),
                    capability: "sampling",
                },
            ),
            (
                "forbidden",
                RpcError::Forbidden {
                    project: "beta".into(),
                    right: "write",
                    what: "tools/call move_story".into(),
                },
            ),
            (
                "unknown_request_state",
                RpcError::UnknownRequestState {
                    method: "tools/call".into(),
                },
            ),
            (
                "sled_could_not_read",
                RpcError::SledUnreadable {
                    project: "beta".into(),
                    sled: "beta-sled".into(),
                    reason: "lone leading surrogate in hex escape".into(),
                },
            ),
        ]
    }

    #[test]
    fn rpc_error_shapes() {
        for (name, e) in all_rpc() {
            let body: Value = serde_json::from_str(&e.response(Some("7"))).unwrap();
            insta::assert_json_snapshot!(format!("rpc_{name}"), body);
        }
    }

    #[test]
    fn http_error_shapes() {
        let all = [
            HttpError::UnknownSession,
            HttpError::MissingSession { method: "DELETE" },
            HttpError::MethodNotAllowed {
                method: "GET",
                allow: "POST",
            },
            HttpError::UnsupportedContentType {
                got: Some("text/plain".into()),
            },
            HttpError::UnsupportedContentType { got: None },
            HttpError::ShuttingDown,
            HttpError::PayloadTooLarge { limit: 4 << 20 },
            HttpError::BodyUnreadable,
            HttpError::NotAcceptable {
                need: "text/event-stream",
            },
            HttpError::ForbiddenOrigin {
                origin: "http://evil.example".into(),
            },
            HttpError::UnsupportedProtocolVersion {
                got: "1999-01-01".into(),
            },
            HttpError::StreamConflict,
            HttpError::TooManySessions {
                max: 10_000,
                retry_after: Duration::from_millis(1000),
            },
            HttpError::Unauthorized {
                presented: false,
                resource_metadata: None,
                scope: None,
            },
            HttpError::Unauthorized {
                presented: true,
                resource_metadata: None,
                scope: None,
            },
            HttpError::Unauthorized {
                presented: false,
                resource_metadata: Some(
                    "https://gw.example.com/.well-known/oauth-protected-resource/mcp".into(),
                ),
                scope: Some("mcp".into()),
            },
            HttpError::Unauthorized {
                presented: true,
                resource_metadata: Some(
                    "https://gw.example.com/.well-known/oauth-protected-resource/mcp".into(),
                ),
                scope: None,
            },
            HttpError::InsufficientScope {
                scope: "mcp mcp:write".into(),
                resource_metadata:
                    "https://gw.example.com/.well-known/oauth-protected-resource/mcp".into(),
            },
        ];
        for (i, e) in all.iter().enumerate() {
            let body: Value = serde_json::from_str(&e.body()).unwrap();
            let shape = json!({ "status": e.status(), "headers": e.headers(), "body": body });
            insta::assert_json_snapshot!(format!("http_{i}_{}", e.kind()), shape);
        }
    }
}
