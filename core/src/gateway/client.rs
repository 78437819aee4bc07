//! What MCP clients send: HTTP requests to `/mcp`, the gateway tools, and forwarding calls.

use super::*;

/// `tools/call` params. The arguments stay raw: the gateway's own tools read them as a
/// `Map`, a project's tool only has `project` taken out and the rest passed on as written.
#[derive(Deserialize)]
struct CallParams<'a> {
    name: String,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<&'a RawValue>,
}

/// Reads raw `tools/call` arguments as `T` (absent: `{}`), failing as invalid params.
fn call_arguments<'a, T: Deserialize<'a>>(arguments: Option<&'a RawValue>) -> Result<T, RpcError> {
    jsonrpc::params_of("tools/call", arguments)
}

#[derive(Deserialize)]
struct InitializeParams {
    #[serde(rename = "protocolVersion")]
    protocol_version: String,
    #[serde(default)]
    capabilities: Value,
}

impl Gateway {
    // ---- HTTP ----

    pub(super) fn on_http(&mut self, now: Instant, token: HttpToken, request: HttpRequest) {
        if self.shutting_down {
            return self.http_error(token, HttpError::ShuttingDown);
        }
        let identity = match crate::auth::authenticate(
            &self.registry,
            request.authorization.as_deref(),
            &request.access_token,
        ) {
            Ok(identity) => identity,
            Err(refusal) => return self.http_error(token, refusal),
        };
        let req = Req {
            now,
            token,
            principal: &identity,
            relayed: request.relayed,
            scope: Scope::Sessionless,
        };
        if self.clustered() {
            self.gathers.serving(&request);
        }
        if request.relayed {
            self.admit_relayed();
        }
        // A session another replica of the cluster made is read from the engine first.
        if self.park_for_session(token, &request) {
            return;
        }
        // A session is bound to the identity that created it: another one naming it is told
        // it does not exist, exactly as for an id that never did.
        let owner = identity.session_owner();
        if let Some(s) = request
            .session
            .as_deref()
            .and_then(|id| self.sessions.get(id))
        {
            if s.owner != owner {
                tracing::debug!("a session named by an identity other than its own");
                return self.http_error(token, HttpError::UnknownSession);
            }
        }
        if !headers::origin_allowed(request.origin.as_deref(), &self.config.allowed_origins) {
            let origin = request.origin.unwrap_or_default();
            tracing::warn!(origin, "request from a browser origin that is not allowed");
            return self.http_error(token, HttpError::ForbiddenOrigin { origin });
        }
        if request
            .protocol_version
            .as_deref()
            .is_some_and(headers::is_modern)
        {
            return self.on_modern(&req, request);
        }
        if let Some(v) = request.protocol_version.as_deref() {
            if !headers::supported_version(v) {
                let got = v.to_owned();
                return self.http_error(token, HttpError::UnsupportedProtocolVersion { got });
            }
        }
        match request.method {
            HttpMethod::Get => self.on_get(now, token, request),
            HttpMethod::Delete => match request.session.as_deref() {
                None => self.http_error(token, HttpError::MissingSession { method: "DELETE" }),
                Some(id) => match self.sessions.remove(id) {
                    Some(session) => {
                        if let Some(stream) = session.stream {
                            self.close_session_stream(stream);
                        }
                        let id = id.to_owned();
                        self.coordination_session_ended(now, &id);
                        self.store_session(now, &id);
                        self.reply(token, 204, Vec::new(), None)
                    }
                    None => self.http_error(token, HttpError::UnknownSession),
                },
            },
            HttpMethod::Post => self.on_post(&req, request, owner),
        }
    }

    /// `owner`: who a session created by this request belongs to
    /// ([`crate::Identity::session_owner`]).
    pub(super) fn on_post(&mut self, req: &Req<'_>, request: HttpRequest, owner: Option<String>) {
        let Req { now, token, .. } = *req;
        if !is_json(request.content_type.as_deref()) {
            return self.http_error(
                token,
                HttpError::UnsupportedContentType {
                    got: request.content_type,
                },
            );
        }
        if !headers::accepts(request.accept.as_deref(), "application/json") {
            return self.http_error(
                token,
                HttpError::NotAcceptable {
                    need: "application/json",
                },
            );
        }
        // A call that asks for progress is answered on an SSE stream when the client names
        // that format in Accept; everything else is one JSON answer.
        let stream_ok = headers::names(request.accept.as_deref(), "text/event-stream");
        let message = match jsonrpc::parse_client(&request.body) {
            Ok(m) => m,
            Err(bad) => {
                let body = bad.error.response(bad.id.as_ref().map(RawId::as_str));
                return self.reply(token, 400, Vec::new(), Some(body));
            }
        };
        if let ClientMessage::Request { id, method, params } = &message {
            if method == "initialize" {
                return self.on_initialize(req, id, *params, owner);
            }
        }
        let scope = match request.session.as_deref() {
            None => Scope::Sessionless,
            Some(id) => match self.sessions.get_mut(id) {
                Some(s) => {
                    s.last_seen = now;
                    Scope::Session(id)
                }
                None => return self.http_error(token, HttpError::UnknownSession),
            },
        };
        let req = &req.in_scope(scope);
        if let Scope::Session(id) = scope {
            self.touch_session(now, id);
        }
        match message {
            ClientMessage::Notification { method, params } => {
                tracing::trace!(method, "client notification");
                if method == "notifications/cancelled" {
                    if let Scope::Session(session) = scope {
                        let session = session.to_owned();
                        self.on_client_cancelled(now, &session, params);
                    }
                }
                self.reply(token, 202, Vec::new(), None)
            }
            ClientMessage::Response { id, result, error } => {
                self.on_client_response(scope, &id, result, error);
                self.reply(token, 202, Vec::new(), None)
            }
            ClientMessage::Request { id, method, params } => {
                let mode = CallMode {
                    stream_ok,
                    modern: false,
                };
                let answer = match method.as_str() {
                    "ping" => Ok(Served::Now("{}".to_owned())),
                    "tools/list" => self.tools_list(req, params),
                    "tools/call" => self.tools_call(req, &id, params, mode),
                    // A 2026-07-28 client probing for the stateless era without the header.
                    "server/discover" => Ok(Served::Now(self.discover())),
                    // Log messages reach only the session whose call produced them; the level
                    // is the session's own.
                    "logging/setLevel" => self.set_log_level(now, scope, params).map(Served::Now),
                    m if proxy::PROXIED_METHODS.contains(&m) => {
                        self.proxy_method(req, &id, m, params, mode)
                    }
                    _ => Err(RpcError::MethodNotFound { method }),
                };
                match answer {
                    // In a cluster, a change of the session (a switch, a log level) is in the
                    // engine before it is confirmed: the client's next request, on any
                    // replica, comes after it.
                    Ok(Served::Now(result)) => {
                        let reply = HttpReply {
                            status: 200,
                            headers: Vec::new(),
                            body: Some(jsonrpc::ok_response(id.as_str(), &result)),
                        };
                        match request.session.as_deref() {
                            Some(session) => self.reply_when_stored(token, session, reply),
                            None => self.outputs.push_back(Output::Http { token, reply }),
                        }
                    }
                    // Forwarded: the reply comes with the sled's response.
                    Ok(Served::Later) => {}
                    Ok(Served::Away(Away::Relay { project, replica })) => {
                        self.relay(now, token, replica, project, id.as_str(), false, request)
                    }
                    Ok(Served::Away(Away::Hold { project })) => self.hold(token, project, request),
                    Ok(Served::AwaitListing { project }) => {
                        self.hold_for_listing(now, token, request, &id, project, false)
                    }
                    Err(e) => {
                        self.reply(token, 200, Vec::new(), Some(e.response(Some(id.as_str()))))
                    }
                }
            }
        }
    }

    pub(super) fn on_initialize(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        params: Option<&RawValue>,
        owner: Option<String>,
    ) {
        let Req { now, token, .. } = *req;
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
        if self.sessions.len() >= self.config.max_sessions {
            let calls = &self.calls;
            match self.sessions.evict_lru(|id| calls.in_session(id) > 0) {
                Some(evicted) => {
                    self.coordination_session_ended(now, &evicted);
                    self.counters.sessions_evicted += 1;
                    tracing::info!(
                        max = self.config.max_sessions,
                        "session limit reached; the least recently used idle session ended"
                    );
                }
                None => {
                    self.counters.sessions_refused += 1;
                    tracing::warn!(
                        max = self.config.max_sessions,
                        "session limit reached and no session is idle; initialize refused"
                    );
                    return self.http_error(
                        token,
                        HttpError::TooManySessions {
                            max: self.config.max_sessions,
                            retry_after: self.config.retry_after,
                        },
                    );
                }
            }
        }
        // A new session starts on the file's default, if its caller may see it.
        let default = self
            .registry
            .default_project()
            .filter(|p| self.sees(req.principal, p))
            .map(str::to_owned);
        let session =
            self.sessions
                .create(default, (*version).to_owned(), params.capabilities, now);
        if let Some(s) = self.sessions.get_mut(&session) {
            s.owner = owner;
        }
        self.store_session(now, &session);
        self.arm_sweep(now);
        let result = json!({
            "protocolVersion": version,
            "capabilities": {
                "tools": { "listChanged": true },
                "resources": { "subscribe": true, "listChanged": true },
                "prompts": { "listChanged": true },
                "completions": {},
                "logging": {},
            },
            "serverInfo": { "name": "mcp-gateway", "version": env!("CARGO_PKG_VERSION") },
            "instructions": INSTRUCTIONS,
        });
        let body = jsonrpc::ok_response(id.as_str(), &result.to_string());
        let reply = HttpReply {
            status: 200,
            headers: vec![("Mcp-Session-Id", session.clone())],
            body: Some(body),
        };
        // In a cluster the session is in the engine before its id is given out, so that the
        // next request finds it on any replica.
        self.reply_when_stored(token, &session, reply);
    }

    pub(super) fn on_http_aborted(&mut self, now: Instant, token: HttpToken) {
        if self.relay_or_hold_aborted(now, token)
            || self.listing_holds.abort(token)
            || self.listener_gone(now, token)
            || self.coordination_aborted(token)
        {
            return;
        }
        if let Some(session) = self.get_streams.remove(&token) {
            if let Some(s) = self.sessions.get_mut(&session) {
                if s.stream == Some(token) {
                    s.stream = None;
                }
            }
            return;
        }
        self.post_streams.remove(&token);
        if self.abort_fanout(token) || self.abort_health(token) {
            return;
        }
        let Some((id, uplink, p)) = self.calls.take_by_token(token) else {
            return;
        };
        if let Pending::Call(call) = &p {
            self.call_ended(now, call, Outcome::Aborted, None);
        }
        self.send_cancelled(uplink, id, "the client went away");
    }

    /// The caller's default project: its session's, or the file's for a sessionless request.
    pub(super) fn default_of(&self, req: &Req<'_>) -> Option<&str> {
        #[cfg(feature = "planted-bugs")]
        if self.config.planted == Some(PlantedBug::SharedActiveProject) {
            if let Some(active) = &self.shared_active {
                return Some(active);
            }
        }
        match req.scope {
            Scope::Session(id) => self.sessions.get(id)?.default_project.as_deref(),
            // Not one the principal may not see: naming it would reveal it.
            Scope::Sessionless => self
                .registry
                .default_project()
                .filter(|p| self.sees(req.principal, p)),
        }
    }

    /// The merged tool list, one page of it: gateway tools, then the caller's default
    /// project's. The cursor is the offset of the page, as text.
    pub(super) fn tools_list(
        &self,
        req: &Req<'_>,
        params: Option<&RawValue>,
    ) -> Result<Served, RpcError> {
        self.tools_page(req, params).map(|page| match page {
            Ok(result) => Served::Now(result),
            Err(away) => Served::Away(away),
        })
    }

    /// [`Gateway::tools_list`]'s page, or where the list is made.
    fn tools_page(
        &self,
        req: &Req<'_>,
        params: Option<&RawValue>,
    ) -> Result<Result<String, Away>, RpcError> {
        #[derive(Deserialize)]
        struct ListParams {
            #[serde(default)]
            cursor: Option<String>,
        }
        let params: ListParams = jsonrpc::params_of("tools/list", params)?;
        let default = self.default_of(req).filter(|p| self.sees(req.principal, p));
        // In a cluster, the default's tools are known where its sled is: the list is made
        // there (a list relayed here by mistake lists the gateway's tools only).
        if let Some(project) = default.filter(|p| !self.is_live(p) && !req.relayed) {
            if let Some(replica) = self.relay_target(project) {
                let project = project.to_owned();
                return Ok(Err(Away::Relay { project, replica }));
            }
        }
        let project = default.and_then(|p| self.projects.get(p));
        let project_tools = project.and_then(|p| p.tools.as_deref()).unwrap_or(&[]);
        let total = self.gateway_tools.len() + project_tools.len();
        let page = self.config.tools_page_size.max(1);
        if params.cursor.is_none() && total <= page {
            // The common case: one page, assembled from two joined listings.
            let listing = project.and_then(|p| p.listing.as_deref()).unwrap_or("");
            let mut s = String::with_capacity(self.gateway_listing.len() + listing.len() + 16);
            s.push_str(r#"{"tools":["#);
            s.push_str(&self.gateway_listing);
            if !listing.is_empty() {
                s.push(',');
                s.push_str(listing);
            }
            s.push_str("]}");
            return Ok(Ok(s));
        }
        let start = match params.cursor.as_deref() {
            None => 0,
            Some(c) => match c
                .strip_prefix("tools-")
                .and_then(|n| n.parse::<usize>().ok())
            {
                Some(n) if n < total => n,
                _ => {
                    return Err(RpcError::InvalidParams {
                        method: "tools/list".into(),
                        detail: format!(
                            "unknown cursor '{c}': pass a nextCursor from a previous page, or none"
                        ),
                    })
                }
            },
        };
        let end = total.min(start.saturating_add(page));
        let page: Vec<&str> = self
            .gateway_tools
            .iter()
            .map(String::as_str)
            .chain(project_tools.iter().map(|t| t.json.as_str()))
            .skip(start)
            .take(end - start)
            .collect();
        let mut s = String::with_capacity(page.iter().map(|t| t.len() + 1).sum::<usize>() + 48);
        s.push_str(r#"{"tools":["#);
        for (i, t) in page.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(t);
        }
        s.push(']');
        if end < total {
            s.push_str(&format!(r#","nextCursor":"tools-{end}""#));
        }
        s.push('}');
        Ok(Ok(s))
    }

    /// A client's `notifications/cancelled`: the session's latest pending call with that id
    /// is released, and its sled told under the gateway's own id.
    pub(super) fn on_client_cancelled(
        &mut self,
        now: Instant,
        session: &str,
        params: Option<&RawValue>,
    ) {
        #[derive(Deserialize)]
        struct CancelParams<'a> {
            #[serde(rename = "requestId", borrow)]
            request_id: &'a RawValue,
        }
        let Some(Ok(p)) = params.map(|p| serde_json::from_str::<CancelParams>(p.get())) else {
            tracing::debug!(
                session,
                "notifications/cancelled without a requestId; ignored"
            );
            return;
        };
        let wanted = p.request_id.get();
        // The planted bug looks at every session's calls.
        #[cfg(feature = "planted-bugs")]
        let any_session = self.config.planted == Some(PlantedBug::CancelAcrossSessions);
        #[cfg(not(feature = "planted-bugs"))]
        let any_session = false;
        let found = self
            .calls
            .latest_with_client_id((!any_session).then_some(session), wanted);
        // No such call: it may be held for its project's tools, or it finished already (the
        // race the spec says to tolerate).
        let Some(key) = found else {
            if let Some((project, held)) = self.listing_holds.cancel(session, wanted) {
                self.counters.calls_cancelled += 1;
                let body = RpcError::Cancelled { project }.response(Some(&held.id));
                self.reply(held.token, 200, Vec::new(), Some(body));
            }
            return;
        };
        let Some((uplink, Pending::Call(call))) = self.calls.take(key) else {
            return;
        };
        self.counters.calls_cancelled += 1;
        self.send_cancelled(uplink, key, "cancelled by the client");
        let body = RpcError::Cancelled {
            project: call.project.clone(),
        }
        .response(Some(call.client_id.as_str()));
        self.finish_call(now, call, body, Outcome::Cancelled, None);
    }

    /// Answers a `tools/call` now, forwards it, or says where it goes instead.
    pub(super) fn tools_call(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        params: Option<&RawValue>,
        mode: CallMode,
    ) -> Result<Served, RpcError> {
        let CallMode { stream_ok, modern } = mode;
        let now = req.now;
        let params: CallParams = jsonrpc::params_of("tools/call", params)?;
        let gateway_tool = [
            SWITCH_PROJECT,
            LIST_PROJECTS,
            GATEWAY_HEALTH,
            FLEET_IDENTITY,
            AGGREGATE_PIPELINE_STATUS,
        ]
        .contains(&params.name.as_str());
        if let Some(&tool) = coordination::COORDINATION_TOOLS
            .iter()
            .find(|t| **t == params.name)
        {
            let arguments: Map<String, Value> = call_arguments(params.arguments)?;
            let meta = match params.meta {
                Some(m) => Some(call_arguments::<Value>(Some(m))?),
                None => None,
            };
            return self.coordination_call(req, id, tool, &arguments, meta.as_ref(), mode);
        }
        if gateway_tool {
            let arguments: Map<String, Value> = call_arguments(params.arguments)?;
            return match params.name.as_str() {
                SWITCH_PROJECT if modern => Err(RpcError::UnknownTool {
                    tool: SWITCH_PROJECT.into(),
                    why: "requests of protocol 2026-07-28 have no session to keep a default in: pass \"project\" in each call's arguments",
                }),
                SWITCH_PROJECT => self.switch_project(req, &arguments).map(Served::Now),
                LIST_PROJECTS => self.list_projects(req, &arguments).map(Served::Now),
                GATEWAY_HEALTH => self.gateway_health_call(req, id, modern, &arguments),
                FLEET_IDENTITY => self.fleet_identity(req, &arguments).map(Served::Now),
                _ => self.aggregate_pipeline_status(req, id, modern, &arguments),
            };
        }
        // A project's tool: its arguments are looked at only for `project`.
        let mut arguments: BTreeMap<String, &RawValue> = call_arguments(params.arguments)?;
        let explicit = match arguments.get("project") {
            Some(p) => Some(call_arguments::<Value>(Some(p))?),
            None => None,
        };
        let tool = params.name;
        let route = match self.route(req, explicit.as_ref(), &tool)? {
            Placement::Here(route) => route,
            Placement::Away(away) => return Ok(Served::Away(away)),
        };
        let listed = self
            .projects
            .get(&route.project)
            .and_then(|s| s.tools.as_deref())
            .and_then(|ts| ts.iter().find(|t| t.name == tool));
        // A tool the sled annotates read-only needs `read`; any other (unlisted ones too), `write`.
        let need = if listed.is_some_and(|t| t.read_only) {
            Right::Read
        } else {
            Right::Write
        };
        self.require(
            req.principal,
            &route.project,
            need,
            format_args!("tools/call {tool}"),
        )?;
        if !listed.is_some_and(|t| t.declares_project) {
            arguments.remove("project");
        }
        // The metrics label: the tool if the sled lists it (clients must not grow the set).
        let label = match listed {
            Some(_) => tool.clone(),
            None => "_unlisted".to_owned(),
        };
        let lease = match listed {
            Some(t) => t.lease.clone(),
            // Not listed now: the sled's uplink came back and its tools are not listed again
            // yet. Writes stay checked by what it listed last, or wait for the listing.
            None => match self.remembered_lease(now, &route.project, &tool) {
                Some(lease) => lease,
                None => {
                    return Ok(Served::AwaitListing {
                        project: route.project,
                    })
                }
            },
        };
        #[derive(serde::Serialize)]
        struct Forwarded<'a> {
            name: &'a str,
            arguments: &'a BTreeMap<String, &'a RawValue>,
        }
        let object = serde_json::to_string(&Forwarded {
            name: &tool,
            arguments: &arguments,
        })
        .map_err(|e| RpcError::InvalidParams {
            method: "tools/call".into(),
            detail: jsonrpc::clean_serde_message(&e),
        })?;
        let mut meta = match params.meta {
            Some(m) => Some(call_arguments::<Value>(Some(m))?),
            None => None,
        };
        // The fence is the gateway's to give: a client's is never passed on. An agent handle
        // (callers without a session) says who writes, and is never passed on either.
        let mut handle = None;
        if let Some(Value::Object(m)) = meta.as_mut() {
            m.remove(FENCE_META);
            handle = m.remove(coordination::AGENT_META);
            if m.is_empty() {
                meta = None;
            }
        }
        // A write to a resource the sled declared leasable: refused if another agent holds
        // it, fenced if the caller does.
        let leased = lease.as_ref().and_then(|(property, kind)| {
            let value = arguments.get(property)?;
            let value: String = serde_json::from_str(value.get()).ok()?;
            Some(format!("{kind}:{value}"))
        });
        if let Some(resource) = leased {
            let agent = self.writer_of(req.scope, handle.as_ref())?;
            if let Some(fence) =
                self.check_lease(now, agent.as_deref(), &route.project, &resource)?
            {
                let m = meta.get_or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(m) = m {
                    m.insert(
                        FENCE_META.to_owned(),
                        json!({ "resource": resource, "fence": fence }),
                    );
                }
            }
        }
        self.forward(
            req,
            id,
            CallMode { stream_ok, modern },
            route,
            "tools/call",
            proxy::Outgoing { object, meta },
            label,
            proxy::Rewrite::None,
        )
    }

    /// `logging/setLevel`: the session's own threshold for the log messages of its calls.
    pub(super) fn set_log_level(
        &mut self,
        now: Instant,
        scope: Scope<'_>,
        params: Option<&RawValue>,
    ) -> Result<String, RpcError> {
        #[derive(Deserialize)]
        struct LevelParams {
            level: String,
        }
        let p: LevelParams = jsonrpc::params_of("logging/setLevel", params)?;
        let Some(rank) = log_rank(&p.level) else {
            return Err(RpcError::InvalidParams {
                method: "logging/setLevel".into(),
                detail: format!(
                    "unknown level '{}': one of {}",
                    p.level,
                    LOG_LEVELS.join(", ")
                ),
            });
        };
        if let Scope::Session(s) = scope {
            if let Some(session) = self.sessions.get_mut(s) {
                session.log_level = Some(rank);
            }
            self.store_session(now, s);
        }
        Ok("{}".to_owned())
    }

    pub(super) fn switch_project(
        &mut self,
        req: &Req<'_>,
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
        let now = req.now;
        let Scope::Session(session) = req.scope else {
            return Err(RpcError::SwitchWithoutSession);
        };
        let sid = session;
        if self.registry.get(&project).is_none() || !self.sees(req.principal, &project) {
            return Err(RpcError::UnknownProject {
                project,
                registered: self.visible_projects(req.principal),
            });
        }
        let live = self.is_live(&project);
        let session = self
            .sessions
            .get_mut(session)
            .expect("the caller's session was looked up for this request");
        let previous = session.default_project.replace(project.clone());
        let changed = previous.as_deref() != Some(project.as_str());
        #[cfg(feature = "planted-bugs")]
        if self.config.planted == Some(PlantedBug::SharedActiveProject) {
            self.shared_active = Some(project.clone());
        }
        // In a cluster, written even when unchanged here: this replica's copy may be older
        // than the engine's (a switch through another replica a moment ago).
        if changed || self.clustered() {
            self.store_session(now, sid);
        }
        if changed {
            // This session's tools/list now shows another project's tools.
            self.notify_session(sid, streams::TOOLS_LIST_CHANGED.to_owned());
        }
        Ok(tool_result(json!({
            "project": project,
            "previous": previous,
            "live": live,
            "scope": "session",
        })))
    }

    pub(super) fn list_projects(
        &self,
        req: &Req<'_>,
        arguments: &Map<String, Value>,
    ) -> Result<String, RpcError> {
        only_arguments(LIST_PROJECTS, arguments, &[])?;
        let active = self.default_of(req).filter(|p| self.sees(req.principal, p));
        let projects: Vec<Value> = self
            .registry
            .projects()
            .iter()
            .filter(|p| self.sees(req.principal, &p.name))
            .map(|p| {
                let mut entry = json!({
                    "name": p.name,
                    "url": p.url,
                    "ssh_port": p.ssh_port,
                    "host_path": p.host_path,
                    "kind": p.kind.as_str(),
                    "sled": p.sled,
                    "live": self.is_live(&p.name) || self.relay_target(&p.name).is_some(),
                    "active": active == Some(p.name.as_str()),
                });
                // In a cluster: the replica that holds the project's uplink.
                if let Some(replica) = self.holder_of(&p.name) {
                    entry["replica"] = json!(replica);
                }
                // The live sled's high-water mark of accepted fences, when its hello reported
                // one; every fence granted since is above it, which `gateway doctor` checks.
                let floor = self
                    .projects
                    .get(&p.name)
                    .and_then(|s| s.uplink)
                    .and_then(|id| self.uplinks.get(&id))
                    .and_then(|u| u.fence_floor);
                if let Some(floor) = floor {
                    entry["fence_floor"] = json!(floor);
                }
                entry
            })
            .collect();
        Ok(tool_result(
            json!({ "projects": projects, "active": active }),
        ))
    }

    /// Holds a write until `project`'s tools are listed, for at most [`Config::listing_hold`]
    /// or the call's own timeout; at that deadline it is refused `tools_pending`, with the
    /// HTTP status of the request's era (`modern`) (`listing_holds.rs`).
    pub(super) fn hold_for_listing(
        &mut self,
        now: Instant,
        token: HttpToken,
        request: HttpRequest,
        id: &RawId,
        project: String,
        modern: bool,
    ) {
        let refusal = RpcError::ToolsPending {
            sled: self.sled_of(&project),
            project: project.clone(),
            retry_after: self.config.retry_after,
        };
        let status = if modern {
            headers::modern_status(refusal.code())
        } else {
            200
        };
        let bound = self
            .registry
            .get(&project)
            .map_or(self.config.listing_hold, |(_, spec)| {
                spec.call_timeout.min(self.config.listing_hold)
            });
        tracing::debug!(
            token = token.0,
            project,
            "held until the project's tools are listed"
        );
        let held = listing_holds::Held {
            token,
            session: request.session.clone(),
            id: id.as_str().to_owned(),
            until: now + bound,
            expired: HttpReply {
                status,
                headers: Vec::new(),
                body: Some(refusal.response(Some(id.as_str()))),
            },
            request,
        };
        self.listing_holds.hold(&project, held);
    }

    /// Serves again the requests held for `project`'s tools: they are listed, or its sled went
    /// away (then they are answered as for any call without a sled).
    pub(super) fn release_listing_holds(&mut self, now: Instant, project: &str) {
        for (token, request) in self.listing_holds.release(project) {
            self.on_http(now, token, request);
        }
    }

    /// Held requests whose project's tools did not come in time are refused `tools_pending`.
    pub(super) fn listing_holds_timeout(&mut self, now: Instant) {
        for (token, reply) in self.listing_holds.expired(now) {
            tracing::debug!(
                token = token.0,
                "held past the listing's deadline: tools_pending"
            );
            self.outputs.push_back(Output::Http { token, reply });
        }
    }

    pub(super) fn reply(
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

    pub(super) fn http_error(&mut self, token: HttpToken, e: HttpError) {
        self.outputs.push_back(Output::Http {
            token,
            reply: e.reply(),
        });
    }
}

/// MCP's log levels, least severe first (RFC 5424).
pub(super) const LOG_LEVELS: &[&str] = &[
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// A log level's rank in [`LOG_LEVELS`].
pub(super) fn log_rank(level: &str) -> Option<u8> {
    LOG_LEVELS
        .iter()
        .position(|l| *l == level)
        .and_then(|i| u8::try_from(i).ok())
}

/// Whether a Content-Type names JSON (`application/json`, parameters allowed).
pub(super) fn is_json(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// Refuses arguments a gateway tool does not take.
pub(super) fn only_arguments(
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
pub(super) fn tool_result(structured: Value) -> String {
    // Serialised once: the text content is that serialisation, escaped as a JSON string.
    // Keys in serde_json's (sorted) order, as `json!` would write them.
    tool_result_raw(&structured.to_string())
}

/// [`tool_result`] of a structured result already serialised (`raw` must be a JSON object).
pub(super) fn tool_result_raw(raw: &str) -> String {
    let text = Value::from(raw).to_string();
    let mut out = String::with_capacity(text.len() + raw.len() + 64);
    out.push_str(r#"{"content":[{"text":"#);
    out.push_str(&text);
    out.push_str(r#","type":"text"}],"structuredContent":"#);
    out.push_str(raw);
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-assembled tool result is byte for byte what `json!` would write.
    #[test]
    fn tool_result_matches_json_macro() {
        for structured in [
            json!({}),
            json!({"b": [1, 2], "a": "quote \" backslash \\ newline \n tab \t é 🚀", "c": null}),
            json!({"nested": {"z": {"y": "</script>"}, "x": 1.5}}),
        ] {
            let expected = json!({
                "content": [{ "type": "text", "text": structured.to_string() }],
                "structuredContent": structured,
            })
            .to_string();
            assert_eq!(tool_result(structured), expected);
        }
    }
}
