//! The bottom floor of the gateway's files: answers to a client and to a sled, and questions
//! about the state, which call nothing else of the gateway's. Every other file may call them.

use super::*;

impl Gateway {
    /// Who a request would make a task for, or may reach the tasks of.
    pub(super) fn creator_of(&self, req: &Req<'_>) -> crate::tasks::Creator {
        crate::tasks::Creator {
            owner: req
                .principal
                .session_owner(&self.registry)
                .map(String::into_boxed_str),
            session: req.session().map(Box::from),
        }
    }

    /// The wall-clock time at `now`, in milliseconds since the Unix epoch.
    pub(super) fn wall_ms(&self, now: Instant) -> u64 {
        let (at, ms) = self.wall_origin.unwrap_or((now, 0));
        let since = u64::try_from(now.saturating_duration_since(at).as_millis()).unwrap_or(0);
        ms.saturating_add(since)
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

    /// Whether `project`'s sled has a live uplink now.
    pub fn is_live(&self, project: &str) -> bool {
        self.projects
            .get(project)
            .is_some_and(|p| p.uplink.is_some())
    }

    pub(super) fn sled_of(&self, project: &str) -> String {
        self.registry
            .get(project)
            .map_or_else(|| project.to_owned(), |(_, p)| p.sled.clone())
    }

    pub(super) fn send_cancelled(&mut self, uplink: UplinkId, rpc_id: u64, reason: &str) {
        if !self.uplinks.contains_key(&uplink) {
            return;
        }
        let params = json!({ "requestId": rpc_id, "reason": reason }).to_string();
        self.outputs.push_back(Output::UplinkSend {
            uplink,
            text: jsonrpc::notification("notifications/cancelled", &params),
        });
    }

    pub(super) fn live_project(&self, id: UplinkId) -> Option<String> {
        match &self.uplinks.get(&id)?.state {
            UplinkState::Live { project } => Some(project.clone()),
            UplinkState::AwaitingHello
            | UplinkState::AwaitingProof(_)
            | UplinkState::AwaitingClaim { .. }
            | UplinkState::Retiring { .. } => None,
        }
    }

    pub(super) fn next_event_id(&mut self) -> u64 {
        self.next_event += 1;
        self.next_event
    }

    /// Books a call that left the pending table: its session's count, and the metrics.
    pub(super) fn call_ended(
        &mut self,
        now: Instant,
        call: &Call,
        outcome: Outcome,
        took: Option<Duration>,
    ) {
        if let Some(principal) = &call.principal {
            tracing::info!(
                target: "audit",
                principal = &**principal,
                project = call.project,
                tool = call.tool,
                outcome = outcome.name(),
                trace_id = call.trace_id.as_deref().unwrap_or("-"),
                "call"
            );
        }
        tracing::debug!(
            trace_id = call.trace_id.as_deref().unwrap_or("-"),
            project = call.project,
            tool = call.tool,
            outcome = outcome.name(),
            took_us = took.map_or(0, |t| u64::try_from(t.as_micros()).unwrap_or(u64::MAX)),
            "call ended"
        );
        if let Some(span) = &call.span {
            // Ended by its answer or deadline at `sent_at + took`; otherwise now.
            let end = took.map_or(now, |t| call.sent_at + t);
            let record = span.finish(outcome, call.sent_at, end);
            self.outputs.push_back(Output::Span(Box::new(record)));
        }
        self.call_metrics.count(&call.tool, &call.project, outcome);
        if let Some(took) = took {
            self.call_metrics.observe(&call.project, took);
        }
    }

    /// A parked call ends without its client (deadline, uplink lost, shutdown): its handle is
    /// forgotten. Returns whether the call was parked.
    pub(super) fn forget_parked(&mut self, call: &mut Call) -> bool {
        match call.mrtr.as_mut().and_then(|m| m.take_parked()) {
            Some(handle) => {
                self.retries.forget(&handle);
                true
            }
            None => false,
        }
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

/// A result object as the stateless era requires it: `"resultType":"complete"` unless it has a
/// `resultType`, and the gateway's `serverInfo` in `_meta` (a sled's own `_meta` keys kept,
/// but the era's reserved keys are the gateway's to set). A result the gateway made whole
/// already (it starts with `{"resultType":`) is returned as it is.
pub(super) fn with_result_type(result: &str) -> String {
    if result.starts_with(r#"{"resultType":"#) {
        return result.to_owned();
    }
    let Ok(mut top) = serde_json::from_str::<BTreeMap<String, &RawValue>>(result) else {
        return result.to_owned();
    };
    let mut meta: Map<String, Value> = top
        .get("_meta")
        .and_then(|m| serde_json::from_str(m.get()).ok())
        .unwrap_or_default();
    meta.retain(|k, _| !k.starts_with("io.modelcontextprotocol/"));
    meta.insert(
        META_SERVER_INFO.into(),
        serde_json::from_str(&server_info()).expect("JSON"),
    );
    let meta = serde_json::value::to_raw_value(&meta).expect("a map serialises");
    let complete = RawValue::from_string(r#""complete""#.to_owned()).expect("JSON");
    top.insert("_meta".into(), &meta);
    let result_type = top.remove("resultType");
    let mut out = String::with_capacity(result.len() + 128);
    out.push_str(r#"{"resultType":"#);
    out.push_str(result_type.unwrap_or(&complete).get());
    for (k, v) in top {
        out.push(',');
        out.push_str(&Value::String(k).to_string());
        out.push(':');
        out.push_str(v.get());
    }
    out.push('}');
    out
}

/// The era's key for the server's identity in each result's `_meta`.
pub(super) const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// The gateway's `serverInfo`, as JSON text.
pub(super) fn server_info() -> String {
    json!({ "name": "mcp-gateway", "version": env!("CARGO_PKG_VERSION") }).to_string()
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
