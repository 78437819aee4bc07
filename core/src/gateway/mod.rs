//! The gateway state machine.
//!
//! Methods come in four groups, in the quinn-proto order: getters; [`Gateway::handle`] and
//! [`Gateway::handle_timeout`] take events in; [`Gateway::poll_output`] and
//! [`Gateway::poll_timeout`] take decisions out. After every `handle*` call, drain
//! `poll_output` and re-read `poll_timeout`.
//!
//! The handlers live beside this file: `client.rs` for what MCP clients send over HTTP,
//! `sled.rs` for uplinks and what sleds send.

mod client;
mod sled;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::error::{HttpError, RpcError, UplinkLoss};
use crate::jsonrpc::{self, ClientMessage, RawId};
use crate::registry::Registry;
use crate::session::Sessions;
use crate::tools::{self, CachedTool, LIST_PROJECTS, SWITCH_PROJECT};
use crate::uplink::{CloseCode, Control, PROTOCOL_VERSION};

/// An HTTP request to `/mcp`, named by the driver. The driver picks any token unique among the
/// requests still waiting for a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HttpToken(pub u64);

/// One uplink WebSocket connection, named by the driver; never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UplinkId(pub u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpMethod {
    Get,
    Post,
    Delete,
}

/// What the driver knows of an HTTP request to `/mcp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: HttpMethod,
    /// The `Mcp-Session-Id` header, if any.
    pub session: Option<String>,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    pub body: Vec<u8>,
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// An HTTP request to `/mcp`. Exactly one [`Output::Http`] with the same token follows,
    /// now or later, unless [`Input::HttpAborted`] comes first.
    Http {
        token: HttpToken,
        request: HttpRequest,
    },
    /// The client behind an HTTP request went away; no reply is wanted any more. A forwarded
    /// call is cancelled at its sled. Unknown or already answered tokens are ignored.
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
}

/// A decision for the driver to carry out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Answer the HTTP request with this token.
    Http { token: HttpToken, reply: HttpReply },
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
}

/// Settings of the state machine that are not per project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// How often the gateway pings each uplink.
    pub heartbeat_interval: Duration,
    /// Silence from a sled for this long closes its uplink.
    pub heartbeat_timeout: Duration,
    /// A new uplink must say hello within this.
    pub hello_timeout: Duration,
    /// Deadline of the gateway's own `tools/list` requests to a sled.
    pub refresh_timeout: Duration,
    /// Test-only: a known bug to plant, so the test suites can show that they catch it.
    #[cfg(feature = "planted-bugs")]
    pub planted: Option<PlantedBug>,
}

/// Bugs the simulation must be able to catch, planted on purpose (feature `planted-bugs`).
#[cfg(feature = "planted-bugs")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlantedBug {
    /// The design before story 1208: `switch_project` sets one active project shared by every
    /// session, and calls without `project` go there.
    SharedActiveProject,
    /// The proxy bug: the client's own id goes up the uplink and responses are matched by it
    /// alone, so two sessions using the same id get each other's answers.
    CorrelateByClientId,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heartbeat_interval: Duration::from_secs(5),
            heartbeat_timeout: Duration::from_secs(15),
            hello_timeout: Duration::from_secs(10),
            refresh_timeout: Duration::from_secs(30),
            #[cfg(feature = "planted-bugs")]
            planted: None,
        }
    }
}

/// Counters and gauges, for logs, metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub sessions: usize,
    pub live_uplinks: usize,
    pub pending_calls: usize,
    pub calls_forwarded: u64,
    pub calls_timed_out: u64,
    /// Responses from a sled that arrived after their call's deadline.
    pub responses_dropped_late: u64,
    /// Responses from a sled with an id the gateway never sent on that uplink.
    pub responses_dropped_unknown: u64,
    /// Frames from a sled that were not valid protocol messages.
    pub frames_invalid: u64,
}

/// MCP protocol versions this gateway speaks, newest first.
const PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// A sled's tool list is followed for at most this many pages.
const MAX_TOOL_PAGES: u32 = 100;

const INSTRUCTIONS: &str = "This gateway fronts many projects. Project tools take an optional \"project\" argument naming the registered project to run on (list_projects names them); without it a call goes to this session's default project, which switch_project sets for this session only.";

/// The gateway: registry, sessions, uplinks and the calls pending on them.
#[derive(Debug)]
pub struct Gateway {
    registry: Registry,
    config: Config,
    sessions: Sessions,
    /// The gateway's own tools, serialised once.
    gateway_tools: Vec<String>,
    /// Live state per registered project, by name.
    projects: HashMap<String, ProjectState>,
    uplinks: HashMap<UplinkId, Uplink>,
    /// Requests sent up an uplink and not yet answered, by uplink and the gateway's id.
    pending: HashMap<(UplinkId, u64), Pending>,
    /// Which pending call answers which HTTP request.
    by_token: HashMap<HttpToken, (UplinkId, u64)>,
    timers: BTreeSet<(Instant, Timer)>,
    outputs: VecDeque<Output>,
    shutting_down: bool,
    counters: Counters,
    /// Only with [`PlantedBug::SharedActiveProject`]: the one active project of the old design.
    #[cfg(feature = "planted-bugs")]
    shared_active: Option<String>,
}

#[derive(Debug, Default)]
struct ProjectState {
    /// The project's live uplink, if any.
    uplink: Option<UplinkId>,
    /// The tools its sled reported, once the first `tools/list` completed.
    tools: Option<Vec<CachedTool>>,
    /// Bumped at every new refresh, so an older refresh's pages are ignored.
    refresh: u64,
}

#[derive(Debug)]
struct Uplink {
    state: UplinkState,
    last_rx: Instant,
    /// The next id the gateway gives a request on this uplink.
    next_id: u64,
    ping_seq: u64,
    /// Ids of this uplink's pending requests.
    pending: BTreeSet<u64>,
    /// The armed hello or heartbeat timer.
    timer: Option<Instant>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum UplinkState {
    AwaitingHello,
    Live { project: String },
}

#[derive(Debug)]
enum Pending {
    /// A client's `tools/call`.
    Call {
        token: HttpToken,
        client_id: RawId,
        project: String,
        sent_at: Instant,
        deadline: Instant,
    },
    /// The gateway's own `tools/list`, one page of a refresh.
    ToolsList {
        project: String,
        refresh: u64,
        page: u32,
        tools: Vec<Value>,
        deadline: Instant,
    },
}

impl Pending {
    fn deadline(&self) -> Instant {
        match self {
            Pending::Call { deadline, .. } | Pending::ToolsList { deadline, .. } => *deadline,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// The deadline of a pending request.
    Request(UplinkId, u64),
    /// The hello deadline, or the next heartbeat, of an uplink.
    Uplink(UplinkId),
}

#[derive(Debug, Default)]
struct Counters {
    calls_forwarded: u64,
    calls_timed_out: u64,
    responses_dropped_late: u64,
    responses_dropped_unknown: u64,
    frames_invalid: u64,
}

/// Where a session-scoped request comes from.
#[derive(Debug, Clone, Copy)]
enum Caller<'a> {
    Session(&'a str),
    Sessionless,
}

impl Gateway {
    /// A gateway for `registry`. `seed` drives the session-id generator: give it fresh OS
    /// randomness in production, and a fixed value in tests and simulations.
    pub fn new(registry: Registry, config: Config, seed: [u8; 32]) -> Gateway {
        let projects = registry
            .names()
            .map(|n| (n.to_owned(), ProjectState::default()))
            .collect();
        Gateway {
            registry,
            config,
            sessions: Sessions::new(seed),
            gateway_tools: tools::gateway_tool_definitions(),
            projects,
            uplinks: HashMap::new(),
            pending: HashMap::new(),
            by_token: HashMap::new(),
            timers: BTreeSet::new(),
            outputs: VecDeque::new(),
            shutting_down: false,
            counters: Counters::default(),
            #[cfg(feature = "planted-bugs")]
            shared_active: None,
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn stats(&self) -> Stats {
        Stats {
            sessions: self.sessions.len(),
            live_uplinks: self
                .projects
                .values()
                .filter(|p| p.uplink.is_some())
                .count(),
            pending_calls: self.by_token.len(),
            calls_forwarded: self.counters.calls_forwarded,
            calls_timed_out: self.counters.calls_timed_out,
            responses_dropped_late: self.counters.responses_dropped_late,
            responses_dropped_unknown: self.counters.responses_dropped_unknown,
            frames_invalid: self.counters.frames_invalid,
        }
    }

    /// Whether `project`'s sled has a live uplink now.
    pub fn is_live(&self, project: &str) -> bool {
        self.projects
            .get(project)
            .is_some_and(|p| p.uplink.is_some())
    }

    /// The default project of a session, or `None` when the session is unknown or has none.
    pub fn session_default(&self, session: &str) -> Option<&str> {
        self.sessions.get(session)?.default_project.as_deref()
    }

    /// Takes one event in.
    pub fn handle(&mut self, now: Instant, input: Input) {
        match input {
            Input::Http { token, request } => self.on_http(now, token, request),
            Input::HttpAborted { token } => self.on_http_aborted(token),
            Input::UplinkOpened { uplink } => self.on_uplink_opened(now, uplink),
            Input::UplinkText { uplink, text } => self.on_uplink_text(now, uplink, &text),
            Input::UplinkBinary { uplink, len } => self.on_uplink_binary(uplink, len),
            Input::UplinkClosed { uplink } => {
                self.drop_uplink(uplink, UplinkLoss::Closed, None);
            }
            Input::Shutdown => self.on_shutdown(),
        }
    }

    /// Fires every timer due at `now` (pass the current time, not the deadline).
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(at, timer)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            match timer {
                Timer::Request(uplink, id) => self.on_request_deadline(now, uplink, id),
                Timer::Uplink(uplink) => self.on_uplink_timer(now, uplink),
            }
        }
    }

    /// The next decision to carry out, if any.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// When [`Gateway::handle_timeout`] should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|&(at, _)| at)
    }
}
