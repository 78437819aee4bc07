//! The gateway state machine.
//!
//! Methods come in four groups, in the quinn-proto order: getters; [`Gateway::handle`] and
//! [`Gateway::handle_timeout`] take events in; [`Gateway::poll_output`] and
//! [`Gateway::poll_timeout`] take decisions out. After every `handle*` call, drain
//! `poll_output` and re-read `poll_timeout`.

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

#[derive(Deserialize)]
struct CallParams<'a> {
    name: String,
    #[serde(default)]
    arguments: Option<Map<String, Value>>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<&'a RawValue>,
}

#[derive(serde::Serialize)]
struct ForwardParams<'a> {
    name: &'a str,
    arguments: &'a Map<String, Value>,
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    meta: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct InitializeParams {
    #[serde(rename = "protocolVersion")]
    protocol_version: String,
}

#[derive(Deserialize)]
struct ToolsPage {
    tools: Vec<Value>,
    #[serde(rename = "nextCursor", default)]
    next_cursor: Option<String>,
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

    // ---- HTTP ----

    fn on_http(&mut self, now: Instant, token: HttpToken, request: HttpRequest) {
        if self.shutting_down {
            return self.http_error(token, HttpError::ShuttingDown);
        }
        match request.method {
            HttpMethod::Get => {
                self.http_error(token, HttpError::MethodNotAllowed { method: "GET" })
            }
            HttpMethod::Delete => match request.session.as_deref() {
                None => self.http_error(token, HttpError::MissingSession),
                Some(id) => match self.sessions.remove(id) {
                    Some(_) => self.reply(token, 204, Vec::new(), None),
                    None => self.http_error(token, HttpError::UnknownSession),
                },
            },
            HttpMethod::Post => self.on_post(now, token, request),
        }
    }

    fn on_post(&mut self, now: Instant, token: HttpToken, request: HttpRequest) {
        if !is_json(request.content_type.as_deref()) {
            return self.http_error(
                token,
                HttpError::UnsupportedContentType {
                    got: request.content_type,
                },
            );
        }
        let message = match jsonrpc::parse_client(&request.body) {
            Ok(m) => m,
            Err(bad) => {
                let body = bad.error.response(bad.id.as_ref().map(RawId::as_str));
                return self.reply(token, 400, Vec::new(), Some(body));
            }
        };
        if let ClientMessage::Request { id, method, params } = &message {
            if method == "initialize" {
                return self.on_initialize(now, token, id, *params);
            }
        }
        let caller = match request.session.as_deref() {
            None => Caller::Sessionless,
            Some(id) => match self.sessions.get_mut(id) {
                Some(s) => {
                    s.last_seen = now;
                    Caller::Session(id)
                }
                None => return self.http_error(token, HttpError::UnknownSession),
            },
        };
        match message {
            ClientMessage::Notification { method } => {
                tracing::trace!(method, "client notification");
                self.reply(token, 202, Vec::new(), None)
            }
            ClientMessage::Response => self.reply(token, 202, Vec::new(), None),
            ClientMessage::Request { id, method, params } => {
                let answer = match method.as_str() {
                    "ping" => Ok(Some("{}".to_owned())),
                    "tools/list" => Ok(Some(self.tools_list(caller))),
                    "tools/call" => self.tools_call(now, token, caller, &id, params),
                    _ => Err(RpcError::MethodNotFound { method }),
                };
                match answer {
                    Ok(Some(result)) => self.reply(
                        token,
                        200,
                        Vec::new(),
                        Some(jsonrpc::ok_response(id.as_str(), &result)),
                    ),
                    // Forwarded: the reply comes with the sled's response.
                    Ok(None) => {}
                    Err(e) => {
                        self.reply(token, 200, Vec::new(), Some(e.response(Some(id.as_str()))))
                    }
                }
            }
        }
    }

    fn on_initialize(
        &mut self,
        now: Instant,
        token: HttpToken,
        id: &RawId,
        params: Option<&RawValue>,
    ) {
        let params: InitializeParams = match jsonrpc::params_of("initialize", params) {
            Ok(p) => p,
            Err(e) => {
                return self.reply(token, 200, Vec::new(), Some(e.response(Some(id.as_str()))))
            }
        };
        let version = PROTOCOL_VERSIONS
            .iter()
            .find(|v| **v == params.protocol_version)
            .unwrap_or(&PROTOCOL_VERSIONS[0]);
        let default = self.registry.default_project().map(str::to_owned);
        let session = self.sessions.create(default, (*version).to_owned(), now);
        let result = json!({
            "protocolVersion": version,
            "capabilities": { "tools": { "listChanged": false } },
            "serverInfo": { "name": "mcp-gateway", "version": env!("CARGO_PKG_VERSION") },
            "instructions": INSTRUCTIONS,
        });
        let body = jsonrpc::ok_response(id.as_str(), &result.to_string());
        self.reply(token, 200, vec![("Mcp-Session-Id", session)], Some(body));
    }

    fn on_http_aborted(&mut self, token: HttpToken) {
        let Some(key) = self.by_token.remove(&token) else {
            return;
        };
        if let Some(p) = self.pending.remove(&key) {
            self.timers
                .remove(&(p.deadline(), Timer::Request(key.0, key.1)));
            if let Some(u) = self.uplinks.get_mut(&key.0) {
                u.pending.remove(&key.1);
            }
            self.send_cancelled(key.0, key.1, "the client went away");
        }
    }

    /// The caller's default project: its session's, or the file's for a sessionless request.
    fn default_of(&self, caller: Caller<'_>) -> Option<&str> {
        #[cfg(feature = "planted-bugs")]
        if self.config.planted == Some(PlantedBug::SharedActiveProject) {
            if let Some(active) = &self.shared_active {
                return Some(active);
            }
        }
        match caller {
            Caller::Session(id) => self.sessions.get(id)?.default_project.as_deref(),
            Caller::Sessionless => self.registry.default_project(),
        }
    }

    fn tools_list(&self, caller: Caller<'_>) -> String {
        let project_tools = self
            .default_of(caller)
            .and_then(|p| self.projects.get(p))
            .and_then(|p| p.tools.as_deref())
            .unwrap_or(&[]);
        let len: usize = self.gateway_tools.iter().map(String::len).sum::<usize>()
            + project_tools
                .iter()
                .map(|t| t.json.len() + 1)
                .sum::<usize>();
        let mut s = String::with_capacity(len + 16);
        s.push_str(r#"{"tools":["#);
        let all = self
            .gateway_tools
            .iter()
            .map(String::as_str)
            .chain(project_tools.iter().map(|t| t.json.as_str()));
        for (i, t) in all.enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(t);
        }
        s.push_str("]}");
        s
    }

    /// Answers a `tools/call` now (`Ok(Some)`), or forwards it (`Ok(None)`).
    fn tools_call(
        &mut self,
        now: Instant,
        token: HttpToken,
        caller: Caller<'_>,
        id: &RawId,
        params: Option<&RawValue>,
    ) -> Result<Option<String>, RpcError> {
        let params: CallParams = jsonrpc::params_of("tools/call", params)?;
        let mut arguments = params.arguments.unwrap_or_default();
        match params.name.as_str() {
            SWITCH_PROJECT => return self.switch_project(caller, &arguments).map(Some),
            LIST_PROJECTS => return self.list_projects(caller, &arguments).map(Some),
            _ => {}
        }
        let tool = params.name;
        let project = match arguments.get("project") {
            None => match self.default_of(caller) {
                Some(p) => p.to_owned(),
                None => {
                    return Err(RpcError::NoProjectSelected {
                        tool,
                        registered: self.registered(),
                    })
                }
            },
            Some(Value::String(p)) if p.is_empty() => return Err(RpcError::ProjectEmpty { tool }),
            Some(Value::String(p)) => p.clone(),
            Some(_) => return Err(RpcError::ProjectNotString { tool }),
        };
        let Some((_, spec)) = self.registry.get(&project) else {
            return Err(RpcError::UnknownProject {
                project,
                registered: self.registered(),
            });
        };
        let timeout = spec.call_timeout;
        let state = self
            .projects
            .get(&project)
            .expect("every registered project has a state");
        let Some(uplink_id) = state.uplink else {
            return Err(RpcError::SledNotConnected {
                sled: spec.sled.clone(),
                project,
            });
        };
        let declares_project = state
            .tools
            .as_deref()
            .and_then(|ts| ts.iter().find(|t| t.name == tool))
            .is_some_and(|t| t.declares_project);
        if !declares_project {
            arguments.remove("project");
        }
        let forward = serde_json::to_string(&ForwardParams {
            name: &tool,
            arguments: &arguments,
            meta: params.meta,
        })
        .expect("tool call params always serialise");
        let uplink = self
            .uplinks
            .get_mut(&uplink_id)
            .expect("a project's live uplink exists");
        let rpc_id = uplink.next_id;
        #[cfg(feature = "planted-bugs")]
        let rpc_id = match self.config.planted {
            Some(PlantedBug::CorrelateByClientId) => id.as_str().parse::<u64>().unwrap_or(rpc_id),
            _ => rpc_id,
        };
        uplink.next_id = uplink.next_id.max(rpc_id + 1);
        uplink.pending.insert(rpc_id);
        let deadline = now + timeout;
        self.pending.insert(
            (uplink_id, rpc_id),
            Pending::Call {
                token,
                client_id: id.clone(),
                project,
                sent_at: now,
                deadline,
            },
        );
        self.by_token.insert(token, (uplink_id, rpc_id));
        self.timers
            .insert((deadline, Timer::Request(uplink_id, rpc_id)));
        self.counters.calls_forwarded += 1;
        self.outputs.push_back(Output::UplinkSend {
            uplink: uplink_id,
            text: jsonrpc::request(rpc_id, "tools/call", &forward),
        });
        Ok(None)
    }

    fn switch_project(
        &mut self,
        caller: Caller<'_>,
        arguments: &Map<String, Value>,
    ) -> Result<String, RpcError> {
        only_arguments(SWITCH_PROJECT, arguments, &["project"])?;
        let project = match arguments.get("project") {
            None => {
                return Err(RpcError::InvalidParams {
                    method: SWITCH_PROJECT.into(),
                    detail: "the `project` argument is required: name a registered project".into(),
                })
            }
            Some(Value::String(p)) if p.is_empty() => {
                return Err(RpcError::ProjectEmpty {
                    tool: SWITCH_PROJECT.into(),
                })
            }
            Some(Value::String(p)) => p.clone(),
            Some(_) => {
                return Err(RpcError::ProjectNotString {
                    tool: SWITCH_PROJECT.into(),
                })
            }
        };
        let Caller::Session(session) = caller else {
            return Err(RpcError::SwitchWithoutSession);
        };
        if self.registry.get(&project).is_none() {
            return Err(RpcError::UnknownProject {
                project,
                registered: self.registered(),
            });
        }
        let live = self.is_live(&project);
        let session = self
            .sessions
            .get_mut(session)
            .expect("the caller's session was looked up for this request");
        let previous = session.default_project.replace(project.clone());
        #[cfg(feature = "planted-bugs")]
        if self.config.planted == Some(PlantedBug::SharedActiveProject) {
            self.shared_active = Some(project.clone());
        }
        Ok(tool_result(json!({
            "project": project,
            "previous": previous,
            "live": live,
            "scope": "session",
        })))
    }

    fn list_projects(
        &self,
        caller: Caller<'_>,
        arguments: &Map<String, Value>,
    ) -> Result<String, RpcError> {
        only_arguments(LIST_PROJECTS, arguments, &[])?;
        let active = self.default_of(caller);
        let projects: Vec<Value> = self
            .registry
            .projects()
            .iter()
            .map(|p| {
                json!({
                    "name": p.name,
                    "url": p.url,
                    "ssh_port": p.ssh_port,
                    "host_path": p.host_path,
                    "kind": p.kind.as_str(),
                    "sled": p.sled,
                    "live": self.is_live(&p.name),
                    "active": active == Some(p.name.as_str()),
                })
            })
            .collect();
        Ok(tool_result(
            json!({ "projects": projects, "active": active }),
        ))
    }

    fn registered(&self) -> Vec<String> {
        self.registry.names().map(str::to_owned).collect()
    }

    fn reply(
        &mut self,
        token: HttpToken,
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Option<String>,
    ) {
        self.outputs.push_back(Output::Http {
            token,
            reply: HttpReply {
                status,
                headers,
                body,
            },
        });
    }

    fn http_error(&mut self, token: HttpToken, e: HttpError) {
        self.outputs.push_back(Output::Http {
            token,
            reply: e.reply(),
        });
    }

    // ---- uplinks ----

    fn on_uplink_opened(&mut self, now: Instant, id: UplinkId) {
        let at = now + self.config.hello_timeout;
        self.uplinks.insert(
            id,
            Uplink {
                state: UplinkState::AwaitingHello,
                last_rx: now,
                next_id: 0,
                ping_seq: 0,
                pending: BTreeSet::new(),
                timer: Some(at),
            },
        );
        self.timers.insert((at, Timer::Uplink(id)));
        if self.shutting_down {
            self.close_uplink(
                id,
                CloseCode::GoingAway,
                "the gateway is shutting down".into(),
            );
        }
    }

    fn on_uplink_binary(&mut self, id: UplinkId, len: usize) {
        let Some(uplink) = self.uplinks.get(&id) else {
            return;
        };
        self.counters.frames_invalid += 1;
        tracing::warn!(
            uplink = id.0,
            len,
            "binary frame on an uplink; the protocol is text frames"
        );
        if uplink.state == UplinkState::AwaitingHello {
            self.close_uplink(
                id,
                CloseCode::ProtocolError,
                "expected a hello text frame first".into(),
            );
        }
    }

    fn on_uplink_text(&mut self, now: Instant, id: UplinkId, text: &str) {
        let Some(uplink) = self.uplinks.get_mut(&id) else {
            return;
        };
        uplink.last_rx = now;
        let awaiting_hello = uplink.state == UplinkState::AwaitingHello;
        let message = match jsonrpc::parse_object(text.as_bytes()) {
            Ok(m) => m,
            Err(e) => return self.invalid_frame(id, awaiting_hello, &e.message()),
        };
        if m_is_control(&message) {
            match serde_json::from_str::<Control>(text) {
                Ok(Control::Hello {
                    protocol,
                    project,
                    sled,
                }) if awaiting_hello => self.on_hello(now, id, protocol, project, sled),
                Ok(Control::Pong { .. }) if !awaiting_hello => {}
                Ok(other) => self.invalid_frame(
                    id,
                    awaiting_hello,
                    &format!("unexpected control frame {}", other.to_text()),
                ),
                Err(e) => {
                    self.invalid_frame(id, awaiting_hello, &format!("bad control frame: {e}"))
                }
            }
            return;
        }
        if awaiting_hello {
            return self.invalid_frame(id, true, "expected a hello control frame first");
        }
        if let Some(method) = message.method {
            let method: String = serde_json::from_str(method.get()).unwrap_or_default();
            match message.id {
                // The uplink protocol has no sled-to-gateway requests yet.
                Some(rid) => {
                    let e = RpcError::MethodNotFound { method };
                    self.outputs.push_back(Output::UplinkSend {
                        uplink: id,
                        text: e.response(Some(rid.get())),
                    });
                }
                None if method == "notifications/tools/list_changed" => {
                    if let Some(project) = self.live_project(id) {
                        self.start_refresh(now, id, project);
                    }
                }
                None => {}
            }
            return;
        }
        let Some(rid) = message.id.and_then(|r| r.get().parse::<u64>().ok()) else {
            self.counters.responses_dropped_unknown += 1;
            return;
        };
        let Some(pending) = self.pending.remove(&(id, rid)) else {
            let sent = self.uplinks.get(&id).is_some_and(|u| rid < u.next_id);
            if sent {
                self.counters.responses_dropped_late += 1;
                tracing::debug!(uplink = id.0, id = rid, "late response dropped");
            } else {
                self.counters.responses_dropped_unknown += 1;
                tracing::warn!(
                    uplink = id.0,
                    id = rid,
                    "response to an id never sent; dropped"
                );
            }
            return;
        };
        self.timers
            .remove(&(pending.deadline(), Timer::Request(id, rid)));
        if let Some(u) = self.uplinks.get_mut(&id) {
            u.pending.remove(&rid);
        }
        match pending {
            Pending::Call {
                token,
                client_id,
                project,
                ..
            } => {
                self.by_token.remove(&token);
                let body = match (message.result, message.error) {
                    (Some(result), None) => jsonrpc::ok_response(client_id.as_str(), result.get()),
                    (None, Some(error)) if error.get().starts_with('{') => {
                        jsonrpc::raw_error_response(client_id.as_str(), error.get())
                    }
                    _ => {
                        self.counters.frames_invalid += 1;
                        let sled = self.sled_of(&project);
                        RpcError::BadSledResponse { project, sled }
                            .response(Some(client_id.as_str()))
                    }
                };
                self.reply(token, 200, Vec::new(), Some(body));
            }
            Pending::ToolsList {
                project,
                refresh,
                page,
                mut tools,
                ..
            } => {
                let current = self
                    .projects
                    .get(&project)
                    .is_some_and(|p| p.refresh == refresh);
                if !current {
                    return;
                }
                let parsed = match (message.result, message.error) {
                    (Some(r), None) => serde_json::from_str::<ToolsPage>(r.get())
                        .map_err(|e| jsonrpc::clean_serde_message(&e)),
                    (_, Some(e)) => Err(format!(
                        "the sled answered tools/list with an error: {}",
                        e.get()
                    )),
                    (None, None) => Err("the response has neither result nor error".into()),
                };
                match parsed {
                    Ok(p) => {
                        tools.extend(p.tools);
                        match p.next_cursor {
                            Some(cursor) if page + 1 < MAX_TOOL_PAGES => {
                                self.send_tools_list(
                                    now,
                                    id,
                                    project,
                                    refresh,
                                    page + 1,
                                    tools,
                                    Some(cursor),
                                );
                            }
                            _ => {
                                let prepared = tools::prepare_sled_tools(&project, tools);
                                tracing::info!(
                                    project,
                                    tools = prepared.len(),
                                    "project tools refreshed"
                                );
                                if let Some(state) = self.projects.get_mut(&project) {
                                    state.tools = Some(prepared);
                                }
                            }
                        }
                    }
                    Err(e) => {
                        self.counters.frames_invalid += 1;
                        tracing::warn!(project, "tools/list from the sled failed: {e}");
                    }
                }
            }
        }
    }

    fn invalid_frame(&mut self, id: UplinkId, awaiting_hello: bool, detail: &str) {
        self.counters.frames_invalid += 1;
        tracing::warn!(uplink = id.0, "invalid uplink frame: {detail}");
        if awaiting_hello {
            self.close_uplink(
                id,
                CloseCode::ProtocolError,
                format!("expected hello: {detail}"),
            );
        }
    }

    fn on_hello(
        &mut self,
        now: Instant,
        id: UplinkId,
        protocol: u32,
        project: String,
        sled: String,
    ) {
        if protocol != PROTOCOL_VERSION {
            return self.close_uplink(
                id,
                CloseCode::ProtocolError,
                format!("uplink protocol {protocol} is not supported; this gateway speaks {PROTOCOL_VERSION}"),
            );
        }
        if self.registry.get(&project).is_none() {
            tracing::warn!(
                uplink = id.0,
                project,
                sled,
                "uplink for an unregistered project refused"
            );
            return self.close_uplink(
                id,
                CloseCode::UnknownProject,
                format!(
                    "project '{project}' is not registered (registered: {})",
                    self.registered().join(", ")
                ),
            );
        }
        let state = self
            .projects
            .get_mut(&project)
            .expect("registered projects have a state");
        if let Some(old) = state.uplink.take() {
            tracing::info!(
                project,
                old = old.0,
                new = id.0,
                "uplink replaced by a newer connection"
            );
            self.drop_uplink(
                old,
                UplinkLoss::Replaced,
                Some((
                    CloseCode::Replaced,
                    format!("replaced by a newer uplink for project '{project}'"),
                )),
            );
        }
        tracing::info!(uplink = id.0, project, sled, "uplink live");
        let state = self
            .projects
            .get_mut(&project)
            .expect("registered projects have a state");
        state.uplink = Some(id);
        state.tools = None;
        let uplink = self.uplinks.get_mut(&id).expect("the uplink said hello");
        uplink.state = UplinkState::Live {
            project: project.clone(),
        };
        if let Some(at) = uplink.timer.take() {
            self.timers.remove(&(at, Timer::Uplink(id)));
        }
        let at = now + self.config.heartbeat_interval;
        uplink.timer = Some(at);
        self.timers.insert((at, Timer::Uplink(id)));
        let welcome = Control::Welcome {
            protocol: PROTOCOL_VERSION,
            heartbeat_ms: u64::try_from(self.config.heartbeat_interval.as_millis())
                .unwrap_or(u64::MAX),
        };
        self.outputs.push_back(Output::UplinkSend {
            uplink: id,
            text: welcome.to_text(),
        });
        self.start_refresh(now, id, project);
    }

    fn live_project(&self, id: UplinkId) -> Option<String> {
        match &self.uplinks.get(&id)?.state {
            UplinkState::Live { project } => Some(project.clone()),
            UplinkState::AwaitingHello => None,
        }
    }

    fn start_refresh(&mut self, now: Instant, id: UplinkId, project: String) {
        let Some(state) = self.projects.get_mut(&project) else {
            return;
        };
        state.refresh += 1;
        let refresh = state.refresh;
        self.send_tools_list(now, id, project, refresh, 0, Vec::new(), None);
    }

    #[allow(clippy::too_many_arguments)]
    fn send_tools_list(
        &mut self,
        now: Instant,
        id: UplinkId,
        project: String,
        refresh: u64,
        page: u32,
        tools: Vec<Value>,
        cursor: Option<String>,
    ) {
        let Some(uplink) = self.uplinks.get_mut(&id) else {
            return;
        };
        let rpc_id = uplink.next_id;
        uplink.next_id += 1;
        uplink.pending.insert(rpc_id);
        let deadline = now + self.config.refresh_timeout;
        let params = match &cursor {
            Some(c) => json!({ "cursor": c }).to_string(),
            None => "{}".to_owned(),
        };
        self.pending.insert(
            (id, rpc_id),
            Pending::ToolsList {
                project,
                refresh,
                page,
                tools,
                deadline,
            },
        );
        self.timers.insert((deadline, Timer::Request(id, rpc_id)));
        self.outputs.push_back(Output::UplinkSend {
            uplink: id,
            text: jsonrpc::request(rpc_id, "tools/list", &params),
        });
    }

    fn send_cancelled(&mut self, uplink: UplinkId, rpc_id: u64, reason: &str) {
        if !self.uplinks.contains_key(&uplink) {
            return;
        }
        let params = json!({ "requestId": rpc_id, "reason": reason }).to_string();
        self.outputs.push_back(Output::UplinkSend {
            uplink,
            text: jsonrpc::notification("notifications/cancelled", &params),
        });
    }

    fn on_request_deadline(&mut self, now: Instant, uplink: UplinkId, rpc_id: u64) {
        let Some(pending) = self.pending.remove(&(uplink, rpc_id)) else {
            return;
        };
        if let Some(u) = self.uplinks.get_mut(&uplink) {
            u.pending.remove(&rpc_id);
        }
        match pending {
            Pending::Call {
                token,
                client_id,
                project,
                sent_at,
                ..
            } => {
                self.by_token.remove(&token);
                self.counters.calls_timed_out += 1;
                let sled = self.sled_of(&project);
                tracing::warn!(project, sled, "call timed out");
                let e = RpcError::Timeout {
                    project,
                    sled,
                    waited: now.saturating_duration_since(sent_at),
                };
                self.reply(
                    token,
                    200,
                    Vec::new(),
                    Some(e.response(Some(client_id.as_str()))),
                );
                self.send_cancelled(
                    uplink,
                    rpc_id,
                    "the gateway's deadline for this call expired",
                );
            }
            Pending::ToolsList { project, .. } => {
                tracing::warn!(project, "tools/list to the sled timed out");
            }
        }
    }

    fn on_uplink_timer(&mut self, now: Instant, id: UplinkId) {
        let Some(uplink) = self.uplinks.get_mut(&id) else {
            return;
        };
        uplink.timer = None;
        match uplink.state {
            UplinkState::AwaitingHello => {
                self.close_uplink(
                    id,
                    CloseCode::HelloTimeout,
                    "no hello within the hello timeout".into(),
                );
            }
            UplinkState::Live { .. } => {
                let silent = now.saturating_duration_since(uplink.last_rx);
                if silent >= self.config.heartbeat_timeout {
                    let reason = format!("no frame from the sled for {} ms", silent.as_millis());
                    tracing::warn!(uplink = id.0, "{reason}; closing");
                    self.drop_uplink(
                        id,
                        UplinkLoss::HeartbeatTimeout,
                        Some((CloseCode::HeartbeatTimeout, reason)),
                    );
                    return;
                }
                uplink.ping_seq += 1;
                let ping = Control::Ping {
                    seq: uplink.ping_seq,
                };
                let at = now + self.config.heartbeat_interval;
                uplink.timer = Some(at);
                self.timers.insert((at, Timer::Uplink(id)));
                self.outputs.push_back(Output::UplinkSend {
                    uplink: id,
                    text: ping.to_text(),
                });
            }
        }
    }

    fn close_uplink(&mut self, id: UplinkId, code: CloseCode, reason: String) {
        self.drop_uplink(id, UplinkLoss::Closed, Some((code, reason)));
    }

    /// Forgets an uplink: its project loses its sled and tools, its pending calls fail now.
    /// With `close`, the driver is told to close the socket with that code and reason.
    fn drop_uplink(&mut self, id: UplinkId, loss: UplinkLoss, close: Option<(CloseCode, String)>) {
        let Some(uplink) = self.uplinks.remove(&id) else {
            return;
        };
        if let Some(at) = uplink.timer {
            self.timers.remove(&(at, Timer::Uplink(id)));
        }
        if let Some((code, reason)) = close {
            let closing = Control::Closing {
                code: code.code(),
                reason: reason.clone(),
            };
            self.outputs.push_back(Output::UplinkSend {
                uplink: id,
                text: closing.to_text(),
            });
            self.outputs.push_back(Output::UplinkClose {
                uplink: id,
                code: code.code(),
                reason,
            });
        }
        if let UplinkState::Live { project } = &uplink.state {
            if let Some(state) = self.projects.get_mut(project) {
                if state.uplink == Some(id) {
                    tracing::info!(uplink = id.0, project, "uplink gone");
                    state.uplink = None;
                    state.tools = None;
                    state.refresh += 1;
                }
            }
        }
        for rpc_id in uplink.pending {
            let Some(pending) = self.pending.remove(&(id, rpc_id)) else {
                continue;
            };
            self.timers
                .remove(&(pending.deadline(), Timer::Request(id, rpc_id)));
            if let Pending::Call {
                token,
                client_id,
                project,
                ..
            } = pending
            {
                self.by_token.remove(&token);
                let sled = self.sled_of(&project);
                let e = RpcError::UplinkLost {
                    project,
                    sled,
                    loss,
                };
                self.reply(
                    token,
                    200,
                    Vec::new(),
                    Some(e.response(Some(client_id.as_str()))),
                );
            }
        }
    }

    fn on_shutdown(&mut self) {
        self.shutting_down = true;
        let ids: BTreeSet<UplinkId> = self.uplinks.keys().copied().collect();
        for id in ids {
            self.drop_uplink(
                id,
                UplinkLoss::Shutdown,
                Some((CloseCode::GoingAway, "the gateway is shutting down".into())),
            );
        }
    }

    fn sled_of(&self, project: &str) -> String {
        self.registry
            .get(project)
            .map_or_else(|| project.to_owned(), |(_, p)| p.sled.clone())
    }
}

fn m_is_control(m: &jsonrpc::RawMessage<'_>) -> bool {
    m.uplink.is_some()
}

/// Whether a Content-Type names JSON (`application/json`, parameters allowed).
fn is_json(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// Refuses arguments a gateway tool does not take.
fn only_arguments(
    tool: &str,
    arguments: &Map<String, Value>,
    allowed: &[&str],
) -> Result<(), RpcError> {
    match arguments.keys().find(|k| !allowed.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(RpcError::InvalidParams {
            method: tool.to_owned(),
            detail: format!(
                "unknown argument `{k}`; {tool} takes {}",
                if allowed.is_empty() {
                    "no arguments".to_owned()
                } else {
                    allowed
                        .iter()
                        .map(|a| format!("`{a}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        }),
    }
}

/// A tool result whose text is the structured content, serialised.
fn tool_result(structured: Value) -> String {
    json!({
        "content": [{ "type": "text", "text": structured.to_string() }],
        "structuredContent": structured,
    })
    .to_string()
}
