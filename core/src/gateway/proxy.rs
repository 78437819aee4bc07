//! Forwarding a client's request to a project's sled: where it goes, and how it is sent. Tool
//! calls, and the rest of the MCP surface a project serves (resources, prompts, completion).
//! Also the way back for a sled's own requests to the client of a call (sampling, elicitation,
//! roots), and resource subscriptions.

use super::*;
use crate::trace;

/// The `_meta` key by which a client names the project of a request that has no `project`
/// argument (resources, completion), e.g. `"_meta": {"io.mcp-gateway/project": "beta"}`.
pub(crate) const PROJECT_META: &str = "io.mcp-gateway/project";

/// The `_meta` key under which a project with `forward_principal` learns who calls:
/// `{"issuer","subject","client_id"}` for an access token, `{"token": NAME}` for a client token.
pub(crate) const PRINCIPAL_META: &str = "io.mcp-gateway/principal";

/// Methods a project serves that the gateway forwards as they are.
pub(super) const PROXIED_METHODS: &[&str] = &[
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
];

/// Requests a sled may make of the client of one of its calls, and the client capability
/// each needs. The `tasks/*` ones are client-hosted tasks (2025-11-25): a sampling or an
/// elicitation the sled sent with `task`, which the client runs as a task of its own, polled
/// by the sled while its call lasts (the client's task ids pass as they are: they are the
/// client's, and only this call's sled talks to it).
pub(super) const SERVER_REQUESTS: &[(&str, &str)] = &[
    ("sampling/createMessage", "sampling"),
    ("elicitation/create", "elicitation"),
    ("roots/list", "roots"),
    ("tasks/get", "tasks"),
    ("tasks/result", "tasks"),
    ("tasks/list", "tasks"),
    ("tasks/cancel", "tasks"),
];

/// The stateless era's per-request log level key in `params._meta`.
pub(super) const MODERN_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";

/// A forwarded request's params: a JSON object's text, without `_meta`, and the `_meta` the
/// client sent (if any), which [`Gateway::forward`] rewrites and adds.
pub(super) struct Outgoing {
    pub(super) object: String,
    pub(super) meta: Option<Value>,
}

impl Outgoing {
    /// `params` as they are, but for `_meta`, which is taken out.
    pub(super) fn from_map(mut params: Map<String, Value>) -> Outgoing {
        let meta = params.remove("_meta");
        Outgoing {
            object: Value::Object(params).to_string(),
            meta,
        }
    }
}

/// A forwarded request's destination.
pub(super) struct Route {
    pub(super) project: String,
    pub(super) uplink: UplinkId,
    pub(super) timeout: Duration,
}

impl Gateway {
    /// Finds where a request goes: its explicit project (a string, not empty), else the
    /// caller's default; the project must be registered and its sled connected, here or (in a
    /// cluster) on another replica.
    pub(super) fn route(
        &self,
        req: &Req<'_>,
        explicit: Option<&Value>,
        what: &str,
    ) -> Result<Placement, RpcError> {
        let tool = what.to_owned();
        let project = match explicit {
            None => match self.default_of(req) {
                Some(p) => p.to_owned(),
                None => {
                    return Err(RpcError::NoProjectSelected {
                        tool,
                        registered: self.visible_projects(req.principal),
                    })
                }
            },
            Some(Value::String(p)) if p.is_empty() => return Err(RpcError::ProjectEmpty { tool }),
            Some(Value::String(p)) => p.clone(),
            Some(_) => return Err(RpcError::ProjectNotString { tool }),
        };
        // A project the caller may not see is answered as one that does not exist.
        let visible = self.sees(req.principal, &project);
        let Some((_, spec)) = self.registry.get(&project).filter(|_| visible) else {
            return Err(RpcError::UnknownProject {
                project,
                registered: self.visible_projects(req.principal),
            });
        };
        let state = self
            .projects
            .get(&project)
            .expect("every registered project has a state");
        match state.uplink {
            // Handed over: it waits for the next holder, though the old uplink is still here.
            Some(_) if self.handing_off(req, &project) => {
                Ok(Placement::Away(Away::Hold { project }))
            }
            Some(uplink) => Ok(Placement::Here(Route {
                timeout: spec.call_timeout,
                uplink,
                project,
            })),
            None => match self.away(req, &project)? {
                Some(away) => Ok(Placement::Away(away)),
                None => Err(RpcError::SledNotConnected {
                    sled: spec.sled.clone(),
                    project,
                }),
            },
        }
    }

    /// Sends a request up its route's uplink under a new id of the gateway's, and remembers
    /// whom to answer. The client's progress token is swapped for one of the gateway's, and a
    /// stateless client's protocol fields stay at the gateway. `tool` is the call's metrics
    /// label.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        mode: CallMode,
        route: Route,
        method: &str,
        params: Outgoing,
        tool: String,
        rewrite: Rewrite,
    ) -> Result<Served, RpcError> {
        let Req { now, token, .. } = *req;
        let Route {
            project,
            uplink: uplink_id,
            timeout,
        } = route;
        let Outgoing {
            object: params,
            meta,
        } = params;
        let mrtr = (mode.modern && mrtr::MRTR_METHODS.contains(&method)).then(|| {
            let owner = req.principal.session_owner(&self.registry);
            mrtr::Rounds::new(method, meta.as_ref(), timeout, owner)
        });
        let session = req.session().map(str::to_owned);
        // The identity whose budget the call counts in: every call of an authenticated caller,
        // in a session or not (security review finding 15).
        let owner = req.principal.session_owner(&self.registry);
        #[cfg(feature = "planted-bugs")]
        let owner = owner.filter(|_| {
            session.is_some() || self.config.planted != Some(PlantedBug::BudgetSkipsSessionless)
        });
        // Past a limit, refuse now: nothing queues behind a busy sled, session or identity.
        let sled_busy = self.calls.on_uplink(uplink_id);
        let session_busy = session.as_deref().map_or(0, |s| self.calls.in_session(s));
        let identity_busy = owner.as_deref().map_or(0, |o| self.calls.of_owner(o));
        let refused = if sled_busy >= self.config.max_calls_per_sled {
            Some((CallLimit::Sled, self.config.max_calls_per_sled))
        } else if owner.is_some() && identity_busy >= self.config.max_calls_per_identity {
            Some((CallLimit::Identity, self.config.max_calls_per_identity))
        } else if session.is_some() && session_busy >= self.config.max_calls_per_session {
            Some((CallLimit::Session, self.config.max_calls_per_session))
        } else {
            None
        };
        if let Some((limit, max)) = refused {
            self.counters.calls_refused += 1;
            self.call_metrics.count(&tool, &project, Outcome::Refused);
            tracing::debug!(
                project,
                limit = limit.name(),
                max,
                "call refused by a limit"
            );
            return Err(RpcError::TooManyCalls {
                sled: self.sled_of(&project),
                project,
                limit,
                max,
                retry_after: self.config.retry_after,
            });
        }
        let rpc_id = self.calls.next_id();
        #[cfg(feature = "planted-bugs")]
        let rpc_id = match self.config.planted {
            Some(PlantedBug::CorrelateByClientId) => id.as_str().parse::<u64>().unwrap_or(rpc_id),
            _ => rpc_id,
        };
        // The client's `_meta`, rewritten for the sled (`meta.rs`).
        let principal = self
            .registry
            .get(&project)
            .is_some_and(|(_, spec)| spec.forward_principal)
            .then(|| self.principal_meta(req.principal))
            .flatten();
        // Unguessable, so that no sled can aim progress at a call it was not sent (the
        // gateway also takes progress only from the uplink serving the call).
        let secret = {
            use rand_chacha::rand_core::RngCore;
            self.rng.next_u64()
        };
        let ask = meta::Ask {
            method,
            modern: mode.modern,
            progress_token: format!("gw-{}-{}-{secret:016x}", uplink_id.0, rpc_id),
            principal,
        };
        let rng = &mut self.rng;
        let rewritten = meta::outgoing(meta, ask, || {
            use rand_chacha::rand_core::RngCore;
            let mut span_id = [0u8; 8];
            rng.fill_bytes(&mut span_id);
            span_id
        })?;
        let meta::Rewritten {
            meta,
            progress,
            log_level,
            trace,
        } = rewritten;
        // The span to export when the call ends, only with export on.
        let span = trace
            .as_ref()
            .filter(|_| self.config.export_spans)
            .map(|(parent, span_id)| {
                let protocol_version = session
                    .as_deref()
                    .and_then(|s| self.sessions.get(s))
                    .map(|s| s.protocol_version.as_str());
                let target = trace::SpanTarget {
                    method,
                    params: &params,
                    listed_tool: tool != "_unlisted",
                    request_id: id.as_str(),
                    project: &project,
                    sled: self.sled_of(&project),
                    protocol_version,
                };
                let tracestate = meta
                    .as_ref()
                    .and_then(|m| m.get(trace::TRACESTATE))
                    .and_then(Value::as_str);
                Box::new(trace::CallSpan::new(parent, *span_id, tracestate, target))
            });
        let trace_id = trace.map(|(parent, _)| parent.trace_id);
        let params = meta::with_meta(params, meta.as_ref());
        let text = jsonrpc::request(rpc_id, method, &params);
        let deadline = now + timeout;
        self.calls.start(
            uplink_id,
            rpc_id,
            Pending::Call(Call {
                token,
                client_id: id.clone(),
                project,
                tool,
                sent_at: now,
                deadline,
                session,
                progress,
                stream_ok: mode.stream_ok,
                modern: mode.modern,
                streamed: false,
                rewrite,
                trace_id: None,
                span,
                log_level,
                mrtr,
                principal: tracing::enabled!(target: "audit", tracing::Level::INFO)
                    .then(|| self.principal_label(req.principal).into_boxed_str()),
                owner: owner.map(String::into_boxed_str),
            }),
        );
        self.counters.calls_forwarded += 1;
        tracing::debug!(
            trace_id = trace_id.as_deref().unwrap_or("-"),
            uplink = uplink_id.0,
            id = rpc_id,
            method,
            "request forwarded"
        );
        if let Some(call) = self.calls.call_mut(rpc_id) {
            call.trace_id = trace_id;
        }
        self.outputs.push_back(Output::UplinkSend {
            uplink: uplink_id,
            text,
        });
        Ok(Served::Later)
    }

    /// Resources, prompts and completion, forwarded to the project named by
    /// `_meta["io.mcp-gateway/project"]` (or, for `prompts/get`, the `project` argument), else
    /// to the caller's default.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn proxy_method(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        method: &str,
        params: Option<&RawValue>,
        mode: CallMode,
    ) -> Result<Served, RpcError> {
        let mut params: Map<String, Value> = jsonrpc::params_of(method, params)?;
        let mut explicit = match params.get_mut("_meta") {
            Some(Value::Object(meta)) => meta.remove(PROJECT_META),
            _ => None,
        };
        if method == "prompts/get" {
            if let Some(Value::Object(arguments)) = params.get_mut("arguments") {
                if let Some(p) = arguments.remove("project") {
                    explicit.get_or_insert(p);
                }
            }
        }
        let route = match self.route(req, explicit.as_ref(), method)? {
            Placement::Here(route) => route,
            Placement::Away(away) => return Ok(Served::Away(away)),
        };
        self.require(
            req.principal,
            &route.project,
            Right::Read,
            format_args!("{method}"),
        )?;
        let rewrite = match method {
            "prompts/list" => Rewrite::PromptsList,
            "resources/subscribe" | "resources/unsubscribe" => {
                if let (Some(s), Some(Value::String(uri))) = (req.session(), params.get("uri")) {
                    let key = (route.project.clone(), uri.clone());
                    if method == "resources/subscribe" {
                        let holder = crate::auth::Holder::of(req.principal, &self.registry);
                        self.subscriptions
                            .entry(key)
                            .or_default()
                            .insert(s.to_owned(), holder);
                    } else if let Some(set) = self.subscriptions.get_mut(&key) {
                        set.remove(s);
                        if set.is_empty() {
                            self.subscriptions.remove(&key);
                        }
                    }
                }
                Rewrite::None
            }
            _ => Rewrite::None,
        };
        self.forward(
            req,
            id,
            mode,
            route,
            method,
            Outgoing::from_map(params),
            method.to_owned(),
            rewrite,
        )
    }

    /// A sled's request for the client of one of its calls: relayed on that call's stream
    /// under an id of the gateway's, or refused when the client cannot take it.
    pub(super) fn relay_server_request(
        &mut self,
        now: Instant,
        uplink: UplinkId,
        sled_id: &RawValue,
        method: &str,
        params: Option<&RawValue>,
    ) {
        let refuse = |this: &mut Gateway, why: String| {
            this.outputs.push_back(Output::UplinkSend {
                uplink,
                text: SledRequestRefused::NotRelayable { why }.response(sled_id.get()),
            });
        };
        if method == "ping" {
            self.outputs.push_back(Output::UplinkSend {
                uplink,
                text: jsonrpc::ok_response(sled_id.get(), "{}"),
            });
            return;
        }
        let Some(&(_, capability)) = SERVER_REQUESTS.iter().find(|(m, _)| *m == method) else {
            return refuse(self, format!("Method not found: {method} (the gateway relays sampling/createMessage, elicitation/create and roots/list to the client of a call)"));
        };
        let mut params: Map<String, Value> = params
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or_default();
        let related = match params.get_mut("_meta") {
            Some(Value::Object(meta)) => meta.remove(RELATED_REQUEST_META).and_then(|r| r.as_u64()),
            _ => None,
        };
        if let Some(Value::Object(meta)) = params.get("_meta") {
            if meta.is_empty() {
                params.remove("_meta");
            }
        }
        let Some(related) = related else {
            return refuse(self, format!("{method} must name the call it belongs to in _meta[\"{RELATED_REQUEST_META}\"]: the gateway has no other way to reach a client"));
        };
        let Some(call) = self.calls.call_on(uplink, related) else {
            return refuse(
                self,
                format!(
                    "{method}: the call {related} is not pending (it finished, or was cancelled)"
                ),
            );
        };
        if call.modern {
            return self.ask_stateless_client(
                now,
                (uplink, related),
                sled_id,
                method,
                capability,
                params,
            );
        }
        let session = call.session.clone();
        let declared = session
            .as_deref()
            .and_then(|s| self.sessions.get(s))
            .is_some_and(|s| s.client_capabilities.get(capability).is_some());
        if !declared || !call.stream_ok {
            return refuse(self, format!("Method not found: the client of this call did not declare the '{capability}' capability (or cannot receive requests on its answer stream)"));
        }
        self.next_server_request += 1;
        let gateway_id = format!("\"gw-req-{}\"", self.next_server_request);
        // Kept as long as the call lasts, and only so many per call (finding 16).
        let request = calls::ServerRequest {
            uplink,
            sled_id: sled_id.get().into(),
            session,
        };
        if !self.calls.ask(related, gateway_id.clone(), request) {
            return refuse(
                self,
                format!(
                    "{method}: the call {related} already has {} requests waiting for its client; answer or drop one first",
                    calls::MAX_ASKS_PER_CALL
                ),
            );
        }
        let text = format!(
            r#"{{"jsonrpc":"2.0","id":{gateway_id},"method":"{method}","params":{}}}"#,
            Value::Object(params)
        );
        self.call_event(related, text);
    }

    /// A client's answer to a request the gateway relayed: back to the sled, under its id.
    pub(super) fn on_client_response(
        &mut self,
        scope: Scope<'_>,
        id: &RawId,
        result: Option<&RawValue>,
        error: Option<&RawValue>,
    ) {
        let Some(request) = self.calls.asked(id.as_str()) else {
            tracing::debug!(
                id = id.as_str(),
                "a client response to no request of the gateway's"
            );
            return;
        };
        let from = match scope {
            Scope::Session(s) => Some(s),
            Scope::Sessionless => None,
        };
        if request.session.as_deref() != from {
            tracing::warn!(
                id = id.as_str(),
                "a response from another session than the request's; ignored"
            );
            return;
        }
        let request = self
            .calls
            .take_asked(id.as_str())
            .expect("looked up just above");
        let text = match (result, error) {
            (Some(r), None) => jsonrpc::ok_response(&request.sled_id, r.get()),
            (None, Some(e)) => jsonrpc::raw_error_response(&request.sled_id, e.get()),
            _ => return,
        };
        if self.uplinks.contains_key(&request.uplink) {
            self.outputs.push_back(Output::UplinkSend {
                uplink: request.uplink,
                text,
            });
        }
    }

    /// A sled's `notifications/resources/updated`: to the sessions subscribed to that resource
    /// of that project, and no other.
    pub(super) fn on_resource_updated(&mut self, project: &str, params: Option<&RawValue>) {
        let uri = params
            .and_then(|p| serde_json::from_str::<Map<String, Value>>(p.get()).ok())
            .and_then(|p| p.get("uri").and_then(Value::as_str).map(str::to_owned));
        let Some(uri) = uri else {
            return;
        };
        self.notify_listeners_updated(project, &uri);
        // Only to subscribers who still see the project (a reload may have taken it away).
        let sessions: Vec<String> = self
            .subscriptions
            .get(&(project.to_owned(), uri.clone()))
            .map(|s| {
                s.iter()
                    .filter(|(_, holder)| self.holder_sees(holder, project))
                    .map(|(session, _)| session.clone())
                    .collect()
            })
            .unwrap_or_default();
        let data = jsonrpc::notification(
            "notifications/resources/updated",
            &json!({ "uri": uri }).to_string(),
        );
        for s in sessions {
            self.notify_session_anywhere(&s, data.clone());
        }
    }

    /// A sled's `list_changed` for resources or prompts: to the sessions whose default is its
    /// project, and which still see it.
    pub(super) fn notify_default_sessions(&mut self, project: &str, method: &str) {
        let affected: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                s.default_project.as_deref() == Some(project)
                    && self.holder_sees(&s.holder, project)
            })
            .map(|(id, _)| id.clone())
            .collect();
        let data = jsonrpc::notification(method, "{}");
        for id in affected {
            self.notify_session(&id, data.clone());
        }
    }
}

impl Gateway {
    /// After a reload: the resource subscriptions of sessions whose subscriber no longer sees
    /// the project end (security review finding 14). The sled keeps the client's own
    /// subscription; the gateway no longer delivers its updates.
    pub(super) fn end_revoked_subscriptions(&mut self) {
        let mut ended = 0;
        let keys: Vec<(String, String)> = self.subscriptions.keys().cloned().collect();
        for key in keys {
            let Some(subscribers) = self.subscriptions.get(&key) else {
                continue;
            };
            let revoked: Vec<String> = subscribers
                .iter()
                .filter(|(_, holder)| !self.holder_sees(holder, &key.0))
                .map(|(session, _)| session.clone())
                .collect();
            if revoked.is_empty() {
                continue;
            }
            ended += revoked.len();
            if let Some(subscribers) = self.subscriptions.get_mut(&key) {
                for session in revoked {
                    subscribers.remove(&session);
                }
                if subscribers.is_empty() {
                    self.subscriptions.remove(&key);
                }
            }
        }
        if ended > 0 {
            tracing::info!(
                subscriptions = ended,
                "resource subscriptions ended: their subscribers no longer see the project"
            );
        }
    }
}

/// How the gateway changes a result on its way back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Rewrite {
    None,
    /// A task-related answer (`tasks.rs`).
    Task(Box<super::tasks::TaskRewrite>),
    /// Each prompt gets an optional `project` argument, as tools get a property.
    PromptsList,
}

/// A `prompts/list` result with the optional `project` argument added to each prompt that
/// does not declare one.
pub(super) fn rewrite_prompts(result: &str) -> String {
    let Ok(mut v) = serde_json::from_str::<Value>(result) else {
        return result.to_owned();
    };
    if let Some(prompts) = v.get_mut("prompts").and_then(Value::as_array_mut) {
        for p in prompts {
            let Some(p) = p.as_object_mut() else { continue };
            let args = p.entry("arguments").or_insert_with(|| json!([]));
            let Some(args) = args.as_array_mut() else {
                continue;
            };
            if !args.iter().any(|a| a["name"] == "project") {
                args.push(json!({
                    "name": "project",
                    "description": "Registered project to get this prompt from (list_projects names them). Omit it for this session's default project.",
                    "required": false,
                }));
            }
        }
    }
    v.to_string()
}
