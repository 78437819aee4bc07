//! The core's I/O vocabulary: what the driver hands the state machine ([`Input`], with the HTTP
//! requests, uplinks and probes it names) and what it gets back ([`Output`]). Every module of
//! the core may use these; they use nothing of the gateway's.

use std::time::Duration;

use crate::registry::Registry;

/// An HTTP request to `/mcp`, named by the driver. The driver picks any token unique among the
/// requests still waiting for a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HttpToken(pub u64);

/// An HTTP health probe the gateway asked for ([`Output::Probe`]), named by the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProbeId(pub u64);

/// How an HTTP health probe ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The project's `url` answered a `GET` with this HTTP status.
    Status(u16),
    /// No HTTP answer: the connection failed, or the driver's own timeout fired. Says why.
    Failed(String),
}

/// One uplink WebSocket connection, named by the driver; never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UplinkId(pub u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HttpMethod {
    #[default]
    Post,
    Get,
    Delete,
}

/// What the driver knows of an HTTP request to `/mcp`: its method, the headers that matter,
/// and the body. Header names are matched without regard to case by the driver.
///
/// Its `Debug` output shows no secret: the `Authorization` header and the session id (which
/// lets whoever holds it act as the session) are shown only as present or absent, and the
/// body only by its length.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct HttpRequest {
    pub method: HttpMethod,
    /// `Mcp-Session-Id`.
    pub session: Option<String>,
    /// `Content-Type`.
    pub content_type: Option<String>,
    /// `Accept`.
    pub accept: Option<String>,
    /// `MCP-Protocol-Version`.
    pub protocol_version: Option<String>,
    /// `Origin`.
    pub origin: Option<String>,
    /// `Last-Event-ID`, on a GET that resumes a stream.
    pub last_event_id: Option<String>,
    /// `Mcp-Method` (2026-07-28).
    pub mcp_method: Option<String>,
    /// `Mcp-Name` (2026-07-28).
    pub mcp_name: Option<String>,
    /// `Mcp-Param-Project` (2026-07-28): the `project` argument, mirrored by the client.
    pub mcp_param_project: Option<String>,
    /// Relayed by another replica of the cluster, which found this one holding the uplink
    /// of the request's project: it is served here or answered, never relayed again.
    pub relayed: bool,
    /// `Authorization`. Used only to let the request in; never forwarded to a sled.
    pub authorization: Option<String>,
    /// What the server found when it verified the bearer token as an OAuth access token
    /// (only when projects.toml has `[oauth]`); the core decides on it (`auth.rs`).
    pub access_token: crate::auth::AccessToken,
    pub body: Vec<u8>,
}

impl std::fmt::Debug for HttpRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let present = |v: &Option<String>| if v.is_some() { "<present>" } else { "<absent>" };
        f.debug_struct("HttpRequest")
            .field("method", &self.method)
            .field("session", &present(&self.session))
            .field("content_type", &self.content_type)
            .field("accept", &self.accept)
            .field("protocol_version", &self.protocol_version)
            .field("origin", &self.origin)
            .field("last_event_id", &self.last_event_id)
            .field("mcp_method", &self.mcp_method)
            .field("mcp_name", &self.mcp_name)
            .field("mcp_param_project", &self.mcp_param_project)
            .field("relayed", &self.relayed)
            .field("authorization", &present(&self.authorization))
            .field("access_token", &self.access_token)
            .field("body", &format_args!("<{} bytes>", self.body.len()))
            .finish()
    }
}

/// The answer to an HTTP request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    pub status: u16,
    /// Headers to set, beside `Content-Type: application/json` when there is a body.
    pub headers: Vec<(&'static str, String)>,
    /// A JSON document, or `None` for an empty body.
    pub body: Option<String>,
}

/// An event for the gateway.
// Inputs are handed over once and never stored, so a large `Http` variant costs a move, not
// memory; boxing it would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// An HTTP request to `/mcp`. Exactly one [`Output::Http`] or [`Output::StreamOpen`] with
    /// the same token follows, now or later, unless [`Input::HttpAborted`] comes first; after a
    /// `StreamOpen`, [`Output::StreamEvent`]s and then one [`Output::StreamClose`].
    Http {
        token: HttpToken,
        request: HttpRequest,
    },
    /// The client behind an HTTP request went away (or stopped reading its stream); nothing
    /// more is wanted for it. A forwarded call is cancelled at its sled; a GET stream is
    /// detached from its session. Unknown or finished tokens are ignored.
    HttpAborted { token: HttpToken },
    /// A sled opened an uplink WebSocket.
    UplinkOpened { uplink: UplinkId },
    /// A text frame arrived on an uplink.
    UplinkText { uplink: UplinkId, text: String },
    /// A frame that is not text (binary) arrived on an uplink.
    UplinkBinary { uplink: UplinkId, len: usize },
    /// An uplink closed or failed. Unknown or already forgotten uplinks are ignored.
    UplinkClosed { uplink: UplinkId },
    /// The gateway stops: every pending call fails now, every uplink is closed, and new
    /// requests are refused (503); an uplink opened afterwards is closed at once with
    /// `GoingAway`.
    Shutdown,
    /// Shutdown is coming (issue 30): a replica of a cluster hands every project it holds
    /// over before [`Input::Shutdown`]. Each sled is asked to open a new uplink (once the
    /// coordination writes in flight are done), which another replica claims; requests for
    /// the project wait for that holder, and the old uplink closes once the calls running on
    /// it are answered. New uplinks are refused from now. [`crate::Gateway::handing_over`]
    /// says while a project still waits for its next holder. Nothing on a single gateway.
    Handover,
    /// A new registry (projects.toml changed). Added projects are routable at once; a removed
    /// project's uplink is closed and its pending calls fail with `uplink_lost`, reason
    /// `unregistered`; sessions and the other uplinks are kept.
    Reload { registry: Registry },
    /// An HTTP health probe asked for by [`Output::Probe`] ended. Unknown or late probes
    /// (past the probe's deadline, which the core keeps itself) are ignored.
    ProbeDone {
        probe: ProbeId,
        outcome: ProbeOutcome,
    },
    /// What the cluster's engine said (only with [`crate::Config::cluster`]).
    Cluster(crate::cluster::ClusterEvent),
}

/// A decision for the driver to carry out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Answer the HTTP request with this token.
    Http { token: HttpToken, reply: HttpReply },
    /// Answer the HTTP request with this token by a `200` Server-Sent Events stream
    /// (`Content-Type: text/event-stream`), whose events follow.
    StreamOpen { token: HttpToken },
    /// Send one SSE event (`event: message`, the `id` when given, `data:` the JSON message)
    /// on an open stream.
    StreamEvent {
        token: HttpToken,
        id: Option<u64>,
        data: String,
    },
    /// End an open stream.
    StreamClose { token: HttpToken },
    /// Send a text frame up an uplink.
    UplinkSend { uplink: UplinkId, text: String },
    /// Close the WebSocket with this code and reason, after sending the frames queued before
    /// it (the last of which is a `closing` control frame). The gateway has forgotten the
    /// uplink: later events for it are ignored.
    UplinkClose {
        uplink: UplinkId,
        code: u16,
        reason: String,
    },
    /// `GET` the project's `url` and report the status with [`Input::ProbeDone`]; give up
    /// after `timeout` (the core also stops waiting then). For projects without a live uplink.
    Probe {
        probe: ProbeId,
        project: String,
        url: String,
        timeout: Duration,
    },
    /// The pinned sled keys changed: replace the pin file's content with `text` (atomically:
    /// write a temporary file, then rename it over the old one). The text is the whole file,
    /// so a later `SavePins` supersedes an earlier one that was not written yet.
    SavePins { text: String },
    /// Export this span of the gateway's (only with [`crate::Config::export_spans`]): a forwarded
    /// request that carried a client's valid `traceparent` ended. Boxed: spans are rare
    /// beside the other outputs.
    Span(Box<crate::SpanRecord>),
    /// Something for the cluster's engine to do (only with [`crate::Config::cluster`]).
    Cluster(crate::cluster::ClusterAction),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requests_debug_output_shows_no_secret() {
        let r = HttpRequest {
            session: Some("sess-5ecret-id".into()),
            authorization: Some("Bearer tok-5ecret".into()),
            body: br#"{"password":"hunter2"}"#.to_vec(),
            ..HttpRequest::default()
        };
        let shown = format!(
            "{r:?} {:?}",
            Input::Http {
                token: HttpToken(1),
                request: r.clone()
            }
        );
        for secret in ["5ecret", "hunter2"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("authorization: \"<present>\""), "{shown}");
        assert!(shown.contains("<22 bytes>"), "{shown}");
    }
}
