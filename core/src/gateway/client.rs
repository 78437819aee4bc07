//! What MCP clients send: HTTP requests to `/mcp`, the gateway tools, and forwarding calls.

use super::*;
use basics::{is_json, log_rank, LOG_LEVELS};

#[derive(Deserialize)]
struct InitializeParams {
    #[serde(rename = "protocolVersion")]
    protocol_version: String,
    #[serde(default)]
    capabilities: Value,
}

impl Gateway {
    // ---- HTTP ----

    pub(super) fn on_http(&mut self, now: Instant, token: HttpToken, mut request: HttpRequest) {
        if self.shutting_down {
            return self.http_error(token, HttpError::ShuttingDown);
        }
        let identity = match crate::auth::authenticate(
            &self.registry,
            request.authorization.as_deref(),
            &request.access_token,
            request.relayed,
        ) {
            Ok(identity) => identity,
            Err(refusal) => return self.http_error(token, refusal),
        };
        // From here on the request says who it comes from, not what credential it showed: a
        // request relayed to another replica, held, or asked of others in parts carries no
        // bearer token (security review finding 3).
        request.authorization = None;
        request.access_token = identity.as_relayed(&self.registry);
        let credentials = if self.clustered() {
            crate::gather::Credentials::of(&request)
        } else {
            crate::gather::Credentials::default()
        };
        let req = Req {
            now,
            token,
            principal: &identity,
            relayed: request.relayed,
            scope: Scope::Sessionless,
            credentials: &credentials,
        };
        if request.relayed {
            self.admit_relayed();
        }
        // A session another replica of the cluster made is read from the engine first.
        if self.park_for_session(token, &request) {
            return;
        }
        // A session is bound to the identity that created it: another one naming it is told
        // it does not exist, exactly as for an id that never did.
        let owner = identity.session_owner(&self.registry);
        if let Some(s) = request
            .session
            .as_deref()
            .and_then(|id| self.sessions.get_mut(id))
        {
            if s.owner != owner {
                tracing::debug!("a session named by an identity other than its own");
                return self.http_error(token, HttpError::UnknownSession);
            }
            // What is delivered to the session is decided on its owner as its latest request
            // proved it (an OAuth principal's groups may change with its next token).
            s.holder = crate::auth::Holder::of(&identity, &self.registry);
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
                    m if tasks::HANDSHAKE_TASK_METHODS.contains(&m) => {
                        self.tasks_request(req, &id, m, params, mode)
                    }
                    // A 2026-07-28 client probing for the stateless era without the header.
                    "server/discover" => Ok(Served::Now(self.discover(false))),
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
                    // A coordination call: once what it changed is durable.
                    Ok(Served::Coordinated {
                        result,
                        tool,
                        project,
                    }) => {
                        let reply = HttpReply {
                            status: 200,
                            headers: Vec::new(),
                            body: Some(jsonrpc::ok_response(id.as_str(), &result)),
                        };
                        self.answer_coordinated(
                            now,
                            token,
                            (reply, id.as_str(), |_| 200),
                            (tool, project),
                        );
                    }
                    // Forwarded: the reply comes with the sled's response.
                    Ok(Served::Later) => {}
                    Ok(Served::Away(Away::Relay { project, replica })) => {
                        self.relay(now, token, replica, project, id.as_str(), false, request)
                    }
                    Ok(Served::Away(Away::Hold { project })) => {
                        self.hold(now, token, project, request)
                    }
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
        // Quotas are per identity (security review finding 8): at its own quota a caller can
        // end only its own idle sessions; at the table's limit, its own first, then another
        // identity's idle session that holds no live lease. Nobody else's leases are ever
        // ended by someone's initialize.
        // With authentication off there are no identities to tell apart: only the table's
        // limit holds.
        let own_full = owner.is_some()
            && self.sessions.owned_by(&owner) >= self.config.max_sessions_per_identity;
        let table_full = self.sessions.len() >= self.config.max_sessions;
        if own_full || table_full {
            let calls = &self.calls;
            let mut evicted = self
                .sessions
                .evict_lru(|id, s| s.owner == owner && calls.in_session(id) == 0);
            if evicted.is_none() && !own_full {
                let coordination = &self.coordination;
                evicted = self.sessions.evict_lru(|id, _| {
                    calls.in_session(id) == 0 && !coordination.session_holds_leases(now, id)
                });
            }
            let max = if own_full {
                self.config.max_sessions_per_identity
            } else {
                self.config.max_sessions
            };
            match evicted {
                Some(evicted) => {
                    self.coordination_session_ended(now, &evicted);
                    self.store_session(now, &evicted);
                    self.counters.sessions_evicted += 1;
                    tracing::info!(
                        max,
                        own = own_full,
                        "session limit reached; the least recently used idle session ended"
                    );
                }
                None => {
                    self.counters.sessions_refused += 1;
                    tracing::warn!(
                        max,
                        own = own_full,
                        "session limit reached and no session may end; initialize refused"
                    );
                    return self.http_error(
                        token,
                        HttpError::TooManySessions {
                            max,
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
        self.sessions.set_owner(&session, owner);
        if let Some(s) = self.sessions.get_mut(&session) {
            s.holder = crate::auth::Holder::of(req.principal, &self.registry);
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
                // Tasks (2025-11-25) are relayed to the sleds whose tools support them.
                "tasks": {
                    "list": {},
                    "cancel": {},
                    "requests": { "tools": { "call": {} } },
                },
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
        // next request finds it on any replica; one the engine did not take is not given out
        // at all (503, retry). A single gateway gives it out anyway: it serves the session
        // itself, and only a restart would lose it.
        let checked = self.clustered();
        #[cfg(feature = "planted-bugs")]
        let checked = checked && self.config.planted != Some(PlantedBug::HandOutUnwrittenSession);
        let if_unwritten = checked.then(|| HttpError::SessionNotStored.reply());
        self.reply_when_stored_or(token, &session, reply, if_unwritten);
    }

    pub(super) fn on_http_aborted(&mut self, now: Instant, token: HttpToken) {
        if self.relay_or_hold_aborted(token)
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
        if self.abort_fanout(token) || self.abort_health(token) || self.own_wait_aborted(token) {
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

    /// After a reload: ends the sessions whose client token (or OAuth issuer) the new file no
    /// longer admits, as a DELETE would (their leases are released, their streams closed).
    pub(super) fn end_revoked_sessions(&mut self, now: Instant) {
        let revoked: Vec<String> = self
            .sessions
            .iter_mut()
            .filter(|(_, s)| {
                s.owner
                    .as_deref()
                    .is_some_and(|o| !crate::auth::owner_still_admitted(o, &self.registry))
            })
            .map(|(id, _)| id.clone())
            .collect();
        if !revoked.is_empty() {
            tracing::info!(
                sessions = revoked.len(),
                "sessions of revoked credentials ended"
            );
        }
        for id in revoked {
            if let Some(session) = self.sessions.remove(&id) {
                if let Some(stream) = session.stream {
                    self.close_session_stream(stream);
                }
                self.coordination_session_ended(now, &id);
                self.store_session(now, &id);
            }
        }
    }

    /// Ends the sessions idle past the TTL, and re-arms itself while sessions remain.
    pub(super) fn on_session_sweep(&mut self, now: Instant) {
        self.sweep_armed = false;
        if let Some(cutoff) = now.checked_sub(self.config.session_idle_ttl) {
            let gone = self.sessions.expire(cutoff);
            if !gone.is_empty() {
                tracing::info!(sessions = gone.len(), "idle sessions expired");
            }
            self.counters.sessions_expired += gone.len() as u64;
            for session in &gone {
                self.coordination_session_ended(now, session);
            }
        }
        self.arm_sweep(now);
    }
}
