//! The stateless era (protocol 2026-07-28) on the same `/mcp`: no `initialize` and no session;
//! every request carries its protocol version and client capabilities in `params._meta`, and
//! the `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers, which must agree with the
//! body. `tools/list` is the same for every caller, and a call names its project per call
//! (mirrored by clients into `Mcp-Param-Project`, which must agree with the argument).

use super::*;

/// How long a client may cache the stateless `tools/list` and `server/discover` answers.
const LIST_TTL_MS: u64 = 5_000;

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "_meta", default)]
    meta: Option<Map<String, Value>>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
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
    pub(super) fn on_modern(&mut self, now: Instant, token: HttpToken, request: HttpRequest) {
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
        if !client::is_json(request.content_type.as_deref()) {
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
        let answer = self
            .modern_checks(&request, &rpc_method, params)
            .and_then(|()| match rpc_method.as_str() {
                "server/discover" => Ok(Some(self.discover())),
                "tools/list" => Ok(Some(self.modern_tools_list())),
                "subscriptions/listen" if !stream_ok => Err(RpcError::InvalidParams {
                    method: rpc_method.clone(),
                    detail: "subscriptions/listen answers with an event stream: send Accept: text/event-stream".into(),
                }),
                "subscriptions/listen" => {
                    self.listen(token, &id, params);
                    Ok(None)
                }
                "tools/call" => self.tools_call(
                    now,
                    token,
                    Caller::Sessionless,
                    &id,
                    params,
                    CallMode {
                        stream_ok,
                        modern: true,
                    },
                ),
                // Routed per request like a tool call: to the project named in
                // `_meta["io.mcp-gateway/project"]` (or prompts/get's `project` argument), else
                // the file's default. Subscriptions go through `subscriptions/listen` instead.
                m if MODERN_PROXIED.contains(&m) => self.proxy_method(
                    now,
                    token,
                    Caller::Sessionless,
                    &id,
                    m,
                    params,
                    CallMode {
                        stream_ok,
                        modern: true,
                    },
                ),
                _ => Err(RpcError::MethodNotFound { method: rpc_method }),
            });
        match answer {
            Ok(Some(result)) => {
                let body = jsonrpc::ok_response(id.as_str(), &with_result_type(&result));
                self.reply(token, 200, Vec::new(), Some(body));
            }
            Ok(None) => {}
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
    ) -> Result<(), RpcError> {
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
        match version {
            Some(Value::String(v)) if headers::is_modern(v) => Ok(()),
            Some(Value::String(v)) => Err(RpcError::UnsupportedVersion {
                requested: v.clone(),
                supported: headers::MODERN_VERSIONS.to_vec(),
            }),
            _ => Err(RpcError::MissingEnvelope {
                missing: vec![headers::META_PROTOCOL_VERSION],
            }),
        }
    }

    /// The `server/discover` result: what a stateless client learns instead of initialize.
    pub(super) fn discover(&self) -> String {
        json!({
            "supportedVersions": headers::MODERN_VERSIONS,
            "capabilities": { "tools": {}, "resources": {}, "prompts": {}, "completions": {} },
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

    /// The stateless `tools/list`: the same for every caller. The gateway's tools that need no
    /// session (`list_projects`), then every live project's tools in registry order, each
    /// name once (the first project to list a name gives its schema), each with `project`.
    pub(super) fn modern_tools_list(&mut self) -> String {
        if let Some(cached) = &self.modern_listing {
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
            let Some(ts) = self.projects.get(&p.name).and_then(|s| s.tools.as_deref()) else {
                continue;
            };
            for t in ts {
                if seen.insert(t.name.as_str()) {
                    parts.push(&t.json);
                }
            }
        }
        let mut s = String::with_capacity(parts.iter().map(|p| p.len() + 1).sum::<usize>() + 64);
        s.push_str(r#"{"tools":["#);
        s.push_str(&parts.join(","));
        s.push_str(&format!(
            r#"],"ttlMs":{LIST_TTL_MS},"cacheScope":"private"}}"#
        ));
        self.modern_listing = Some(s.clone());
        s
    }
}

impl Gateway {
    /// `subscriptions/listen`: a long-lived SSE answer carrying the change notifications the
    /// client asked for. The gateway honors `toolsListChanged` (its stateless `tools/list`
    /// changes when a project's sled comes, goes or changes its tools); the acknowledgment
    /// names what is honored.
    fn listen(&mut self, token: HttpToken, id: &RawId, params: Option<&RawValue>) {
        let wants_tools = params
            .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
            .is_some_and(|p| p["notifications"]["toolsListChanged"] == true);
        let honored = if wants_tools {
            json!({ "toolsListChanged": true })
        } else {
            json!({})
        };
        let subscription: Value = serde_json::from_str(id.as_str()).expect("ids are JSON");
        let ack = json!({
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {
                "notifications": honored,
                "_meta": { "io.modelcontextprotocol/subscriptionId": subscription },
            },
        });
        self.outputs.push_back(Output::StreamOpen { token });
        let n = Some(self.next_event_id());
        self.outputs.push_back(Output::StreamEvent {
            token,
            id: n,
            data: ack.to_string(),
        });
        if wants_tools {
            self.listens.insert(token, id.clone());
        } else {
            // Nothing to listen to: end the subscription at once, gracefully.
            self.end_listen(token, id);
        }
    }

    /// Tells every listener that the stateless `tools/list` changed.
    pub(super) fn notify_listeners_tools_changed(&mut self) {
        let listens: Vec<(HttpToken, RawId)> =
            self.listens.iter().map(|(t, i)| (*t, i.clone())).collect();
        for (token, id) in listens {
            let subscription: Value = serde_json::from_str(id.as_str()).expect("ids are JSON");
            let data = json!({
                "jsonrpc": "2.0",
                "method": "notifications/tools/list_changed",
                "params": { "_meta": { "io.modelcontextprotocol/subscriptionId": subscription } },
            });
            let n = Some(self.next_event_id());
            self.outputs.push_back(Output::StreamEvent {
                token,
                id: n,
                data: data.to_string(),
            });
        }
    }

    /// Ends every subscription gracefully (shutdown).
    pub(super) fn end_listens(&mut self) {
        for (token, id) in std::mem::take(&mut self.listens) {
            self.end_listen(token, &id);
        }
    }

    fn end_listen(&mut self, token: HttpToken, id: &RawId) {
        let result = format!(
            r#"{{"resultType":"complete","_meta":{{"io.modelcontextprotocol/subscriptionId":{}}}}}"#,
            id.as_str()
        );
        let n = Some(self.next_event_id());
        self.outputs.push_back(Output::StreamEvent {
            token,
            id: n,
            data: jsonrpc::ok_response(id.as_str(), &result),
        });
        self.outputs.push_back(Output::StreamClose { token });
    }
}

/// A result object with `"resultType":"complete"` added, as the stateless era requires.
pub(super) fn with_result_type(result: &str) -> String {
    let trimmed = result.trim_start();
    match trimmed.strip_prefix('{') {
        Some(rest) if !result.contains(r#""resultType""#) => {
            let sep = if rest.trim_start().starts_with('}') {
                ""
            } else {
                ","
            };
            format!(r#"{{"resultType":"complete"{sep}{rest}"#)
        }
        _ => result.to_owned(),
    }
}
