//! The stateless era (protocol 2026-07-28) on the same `/mcp`: no `initialize` and no session;
//! every request carries its protocol version and client capabilities in `params._meta`, and
//! the `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers, which must agree with the
//! body. `tools/list` is the same for every caller, and a call names its project per call
//! (mirrored by clients into `Mcp-Param-Project`, which must agree with the argument).

use super::*;
use basics::{server_info, with_result_type, META_SERVER_INFO};

/// How long a client may cache the stateless `tools/list` and `server/discover` answers.
const LIST_TTL_MS: u64 = 5_000;

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "_meta", default)]
    meta: Option<Map<String, Value>>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    /// `resources/read`'s name, for a retry's check.
    #[serde(borrow, default)]
    uri: Option<&'a RawValue>,
    /// A retry of a request answered `input_required`.
    #[serde(rename = "requestState", default)]
    request_state: Option<String>,
    /// `tasks/*`' task, which `Mcp-Name` must repeat.
    #[serde(rename = "taskId", default)]
    task_id: Option<Value>,
    /// Only `project` is read here; the other arguments are skipped, not built (tools/call
    /// parses them once, when it forwards).
    #[serde(default)]
    arguments: Option<ProjectArgument>,
}

#[derive(Deserialize)]
struct ProjectArgument {
    #[serde(default)]
    project: Option<Value>,
}

/// What the checks of a stateless request learned on the way.
pub(super) struct Checked {
    /// The request's `requestState`: it is a retry.
    pub(super) request_state: Option<String>,
    /// Its name (tool or prompt) or resource URI, which a retry must repeat.
    pub(super) name: Option<String>,
    /// The request declares the tasks extension (`io.modelcontextprotocol/tasks`).
    pub(super) tasks: bool,
}

/// The requests of the stateless era forwarded to a project besides `tools/call`.
const MODERN_PROXIED: &[&str] = &[
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "prompts/list",
    "prompts/get",
    "completion/complete",
];

impl Gateway {
    pub(super) fn on_modern(&mut self, req: &Req<'_>, request: HttpRequest) {
        let Req { now, token, .. } = *req;
        let method = match request.method {
            HttpMethod::Post => "POST",
            HttpMethod::Get => "GET",
            HttpMethod::Delete => "DELETE",
        };
        if request.method != HttpMethod::Post {
            return self.http_error(
                token,
                HttpError::MethodNotAllowed {
                    method,
                    allow: "POST",
                },
            );
        }
        if !basics::is_json(request.content_type.as_deref()) {
            let got = request.content_type;
            return self.http_error(token, HttpError::UnsupportedContentType { got });
        }
        if !headers::accepts(request.accept.as_deref(), "application/json") {
            let need = "application/json";
            return self.http_error(token, HttpError::NotAcceptable { need });
        }
        let stream_ok = headers::names(request.accept.as_deref(), "text/event-stream");
        let message = match jsonrpc::parse_client(&request.body) {
            Ok(m) => m,
            Err(bad) => {
                let id = bad.id.as_ref().map(RawId::as_str);
                return self.reply(token, 400, Vec::new(), Some(bad.error.response(id)));
            }
        };
        let (id, rpc_method, params) = match message {
            // No client-to-server notifications are defined in this era (a client cancels by
            // closing the response stream); they are acknowledged and dropped.
            ClientMessage::Notification { .. } | ClientMessage::Response { .. } => {
                return self.reply(token, 202, Vec::new(), None)
            }
            ClientMessage::Request { id, method, params } => (id, method, params),
        };
        let mut retry = false;
        let answer = self
            .modern_checks(&request, &rpc_method, params)
            .and_then(|checked| match rpc_method.as_str() {
                // A retry with the input a sled asked for: to the parked call it names.
                m if checked.request_state.is_some() && mrtr::MRTR_METHODS.contains(&m) => {
                    retry = true;
                    self.resume(req, &id, m, checked, params, stream_ok)
                }
                "server/discover" => Ok(Served::Now(self.discover(checked.tasks))),
                "tools/list" => Ok(Served::Now(self.modern_tools_list(req.principal))),
                m if tasks::MODERN_TASK_METHODS.contains(&m) && !checked.tasks => {
                    Err(RpcError::TasksNotDeclared { what: m.to_owned() })
                }
                m if tasks::MODERN_TASK_METHODS.contains(&m) => self.tasks_request(
                    req,
                    &id,
                    m,
                    params,
                    CallMode {
                        stream_ok,
                        modern: true,
                    },
                ),
                "subscriptions/listen" if !stream_ok => Err(RpcError::InvalidParams {
                    method: rpc_method.clone(),
                    detail: "subscriptions/listen answers with an event stream: send Accept: text/event-stream".into(),
                }),
                "subscriptions/listen" => self.listen(req, &id, params),
                "tools/call" => self
                    .tools_call(
                        req,
                        &id,
                        params,
                        CallMode {
                            stream_ok,
                            modern: true,
                        },
                    )
                    .inspect(|_| self.name_call(token, checked.name)),
                // Routed per request like a tool call: to the project named in
                // `_meta["io.mcp-gateway/project"]` (or prompts/get's `project` argument), else
                // the file's default. Subscriptions go through `subscriptions/listen` instead.
                m if MODERN_PROXIED.contains(&m) => self
                    .proxy_method(
                        req,
                        &id,
                        m,
                        params,
                        CallMode {
                            stream_ok,
                            modern: true,
                        },
                    )
                    .inspect(|_| self.name_call(token, checked.name)),
                _ => Err(RpcError::MethodNotFound { method: rpc_method }),
            });
        match answer {
            Ok(Served::Now(result)) => {
                let body = jsonrpc::ok_response(id.as_str(), &with_result_type(&result));
                self.reply(token, 200, Vec::new(), Some(body));
            }
            Ok(Served::Coordinated {
                result,
                tool,
                project,
            }) => {
                let body = jsonrpc::ok_response(id.as_str(), &with_result_type(&result));
                let reply = HttpReply {
                    status: 200,
                    headers: Vec::new(),
                    body: Some(body),
                };
                self.answer_coordinated(
                    now,
                    token,
                    (reply, id.as_str(), headers::modern_status),
                    (tool, project),
                );
            }
            Ok(Served::Later) => {}
            Ok(Served::Away(Away::Relay { project, replica })) => {
                self.relay(now, token, replica, project, id.as_str(), true, request);
                if retry {
                    self.relay_is_retry(token);
                }
            }
            Ok(Served::Away(Away::Hold { project })) => self.hold(now, token, project, request),
            Ok(Served::AwaitListing { project }) => {
                self.hold_for_listing(now, token, request, &id, project, true)
            }
            Err(e) => {
                let status = headers::modern_status(e.code());
                self.reply(
                    token,
                    status,
                    Vec::new(),
                    Some(e.response(Some(id.as_str()))),
                );
            }
        }
    }

    /// The per-request protocol fields, and the routing headers against the body.
    fn modern_checks(
        &self,
        request: &HttpRequest,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<Checked, RpcError> {
        let envelope: Envelope = jsonrpc::params_of(method, params)?;
        let meta = envelope.meta.unwrap_or_default();
        let missing: Vec<&'static str> = [
            headers::META_PROTOCOL_VERSION,
            headers::META_CLIENT_CAPABILITIES,
        ]
        .into_iter()
        .filter(|k| !meta.contains_key(*k))
        .collect();
        if !missing.is_empty() {
            return Err(RpcError::MissingEnvelope { missing });
        }
        let version = meta.get(headers::META_PROTOCOL_VERSION);
        if request.protocol_version.as_deref() != version.and_then(Value::as_str) {
            return Err(RpcError::HeaderMismatch {
                header: "MCP-Protocol-Version",
            });
        }
        if request.mcp_method.as_deref() != Some(method) {
            return Err(RpcError::HeaderMismatch {
                header: "Mcp-Method",
            });
        }
        if MODERN_PROXIED.contains(&method) {
            // The project a proxied request names in its body, which the header must mirror.
            let in_meta = meta.get(proxy::PROJECT_META).and_then(Value::as_str);
            let in_arguments = envelope
                .arguments
                .as_ref()
                .and_then(|a| a.project.as_ref())
                .and_then(Value::as_str);
            let project = in_meta.or(if method == "prompts/get" {
                in_arguments
            } else {
                None
            });
            if let Some(h) = request.mcp_param_project.as_deref() {
                if headers::decode_header_value(h).as_deref() != project {
                    return Err(RpcError::HeaderMismatch {
                        header: "Mcp-Param-Project",
                    });
                }
            }
        }
        if method == "tools/call" {
            let name: Option<String> = envelope
                .name
                .and_then(|n| serde_json::from_str(n.get()).ok());
            let header = request
                .mcp_name
                .as_deref()
                .and_then(headers::decode_header_value);
            if name.is_some() && header != name {
                return Err(RpcError::HeaderMismatch { header: "Mcp-Name" });
            }
            let project = envelope
                .arguments
                .as_ref()
                .and_then(|a| a.project.as_ref())
                .and_then(Value::as_str);
            if let Some(h) = request.mcp_param_project.as_deref() {
                if headers::decode_header_value(h).as_deref() != project {
                    return Err(RpcError::HeaderMismatch {
                        header: "Mcp-Param-Project",
                    });
                }
            }
        }
        if tasks::MODERN_TASK_METHODS.contains(&method) {
            // Intermediaries route a task's requests by it (the extension's routing header).
            let header = request
                .mcp_name
                .as_deref()
                .and_then(headers::decode_header_value);
            match (&envelope.task_id, header) {
                (Some(Value::String(id)), Some(h)) if *id == h => {}
                (Some(Value::String(_)), _) => {
                    return Err(RpcError::HeaderMismatch { header: "Mcp-Name" })
                }
                _ => {
                    return Err(RpcError::InvalidParams {
                        method: method.to_owned(),
                        detail: "`taskId` must be a string".into(),
                    })
                }
            }
        }
        let name = envelope
            .name
            .or(envelope.uri)
            .and_then(|n| serde_json::from_str(n.get()).ok());
        let checked = Checked {
            request_state: envelope.request_state,
            name,
            tasks: tasks::meta_declares_tasks(&meta),
        };
        match version {
            Some(Value::String(v)) if headers::is_modern(v) => Ok(checked),
            Some(Value::String(v)) => Err(RpcError::UnsupportedVersion {
                requested: v.clone(),
                supported: headers::MODERN_VERSIONS.to_vec(),
            }),
            _ => Err(RpcError::MissingEnvelope {
                missing: vec![headers::META_PROTOCOL_VERSION],
            }),
        }
    }

    /// Gives a just-forwarded call the name a retry of it must repeat.
    fn name_call(&mut self, token: HttpToken, name: Option<String>) {
        let Some(key) = self.calls.key_of(token) else {
            return;
        };
        if let Some(call) = self.calls.call_mut(key) {
            if let Some(m) = call.mrtr.as_mut() {
                m.name = name;
            }
        }
    }

    /// The `server/discover` result: what a stateless client learns instead of initialize.
    /// `tasks`: the request declared the tasks extension, which is then offered too (and only
    /// then: a client that did not declare it is never shown it).
    pub(super) fn discover(&self, tasks: bool) -> String {
        let mut capabilities = json!({
            "tools": { "listChanged": true },
            "resources": { "subscribe": true, "listChanged": true },
            "prompts": { "listChanged": true },
            "completions": {},
        });
        if tasks {
            capabilities["extensions"] = json!({ crate::tasks::EXTENSION: {} });
        }
        json!({
            "supportedVersions": headers::MODERN_VERSIONS,
            "capabilities": capabilities,
            "instructions": INSTRUCTIONS,
            "ttlMs": LIST_TTL_MS,
            "cacheScope": "private",
            "_meta": {
                "io.modelcontextprotocol/serverInfo": {
                    "name": "mcp-gateway",
                    "version": env!("CARGO_PKG_VERSION"),
                }
            },
        })
        .to_string()
    }

    /// The stateless `tools/list`: the same for every caller (with `[[access]]`, for every
    /// caller who may see the same projects). The gateway's tools that need no session
    /// (`list_projects`), then every live project's tools in registry order, each name once
    /// (the first project to list a name gives its schema), each with `project`. Cached while
    /// no rules make it depend on the caller.
    pub(super) fn modern_tools_list(&mut self, who: &crate::auth::Identity) -> String {
        let open = self.registry.rules().is_open();
        if let Some(cached) = self.modern_listing.as_ref().filter(|_| open) {
            return cached.clone();
        }
        let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let mut parts: Vec<&str> = Vec::new();
        for (name, def) in tools::GATEWAY_TOOLS.iter().zip(&self.gateway_tools) {
            if *name != SWITCH_PROJECT {
                parts.push(def);
            }
        }
        for p in self.registry.projects() {
            // A project whose sled is on another replica: as that replica listed it.
            let local = self.projects.get(&p.name).and_then(|s| s.tools.as_deref());
            let Some(ts) = local.or_else(|| self.remote_tools(&p.name)) else {
                continue;
            };
            if !open && !self.sees(who, &p.name) {
                continue;
            }
            for t in ts {
                if seen.insert(t.name.as_str()) {
                    parts.push(&t.json);
                }
            }
        }
        let mut s = String::with_capacity(parts.iter().map(|p| p.len() + 1).sum::<usize>() + 64);
        // Made whole here (resultType, serverInfo) so that the cached text is sent as it is.
        s.push_str(r#"{"resultType":"complete","tools":["#);
        s.push_str(&parts.join(","));
        s.push_str(&format!(
            r#"],"ttlMs":{LIST_TTL_MS},"cacheScope":"private","_meta":{{"{META_SERVER_INFO}":{}}}}}"#,
            server_info()
        ));
        if open {
            self.modern_listing = Some(s.clone());
        }
        s
    }
}
