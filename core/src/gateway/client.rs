//! What MCP clients send: HTTP requests to `/mcp`, the gateway tools, and forwarding calls.

use super::*;

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

impl Gateway {
    // ---- HTTP ----

    pub(super) fn on_http(&mut self, now: Instant, token: HttpToken, request: HttpRequest) {
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

    pub(super) fn on_post(&mut self, now: Instant, token: HttpToken, request: HttpRequest) {
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

    pub(super) fn on_initialize(
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

    pub(super) fn on_http_aborted(&mut self, token: HttpToken) {
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
    pub(super) fn default_of(&self, caller: Caller<'_>) -> Option<&str> {
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

    pub(super) fn tools_list(&self, caller: Caller<'_>) -> String {
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
    pub(super) fn tools_call(
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

    pub(super) fn switch_project(
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

    pub(super) fn list_projects(
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

    pub(super) fn registered(&self) -> Vec<String> {
        self.registry.names().map(str::to_owned).collect()
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
