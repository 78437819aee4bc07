//! Server-Sent Events: each session's GET stream (server-to-client notifications, resumable
//! with `Last-Event-ID`), answers that become streams when a sled sends something for the
//! client before its response (progress, log messages), and the idle sweep that ends
//! sessions.

use super::*;
use crate::cluster::{Announcement, ClusterAction};

impl Gateway {
    /// Opens a session's GET stream, replaying the events after `last_event_id` first.
    pub(super) fn on_get(&mut self, now: Instant, token: HttpToken, request: HttpRequest) {
        if !headers::accepts(request.accept.as_deref(), "text/event-stream") {
            return self.http_error(
                token,
                HttpError::NotAcceptable {
                    need: "text/event-stream",
                },
            );
        }
        let Some(id) = request.session else {
            return self.http_error(token, HttpError::MissingSession { method: "GET" });
        };
        let Some(session) = self.sessions.get_mut(&id) else {
            return self.http_error(token, HttpError::UnknownSession);
        };
        if session.stream.is_some() {
            return self.http_error(token, HttpError::StreamConflict);
        }
        session.stream = Some(token);
        session.last_seen = now;
        let after = request
            .last_event_id
            .as_deref()
            .and_then(|l| l.trim().parse::<u64>().ok());
        let replay: Vec<(u64, String)> = match after {
            Some(after) => session
                .replay
                .iter()
                .filter(|(n, _)| *n > after)
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        self.get_streams.insert(token, id);
        self.outputs.push_back(Output::StreamOpen { token });
        for (n, data) in replay {
            self.outputs.push_back(Output::StreamEvent {
                token,
                id: Some(n),
                data,
            });
        }
    }

    /// Sends a server-to-client message on a session's GET stream, keeping it for replay.
    /// A session with no open stream keeps it for when one opens with `Last-Event-ID`.
    pub(super) fn notify_session(&mut self, session: &str, data: String) {
        let n = self.next_event_id();
        let keep = self.config.replay_events;
        let Some(s) = self.sessions.get_mut(session) else {
            return;
        };
        s.replay.push_back((n, data.clone()));
        while s.replay.len() > keep {
            s.replay.pop_front();
        }
        if let Some(token) = s.stream {
            self.outputs.push_back(Output::StreamEvent {
                token,
                id: Some(n),
                data,
            });
        }
    }

    /// Tells every session whose default is `project`, and which still sees it, that its tool
    /// list changed.
    pub(super) fn notify_tools_changed(&mut self, project: &str) {
        let affected: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                s.default_project.as_deref() == Some(project)
                    && self.holder_sees(&s.holder, project)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in affected {
            self.notify_session(&id, TOOLS_LIST_CHANGED.to_owned());
        }
    }

    /// Ends a session's GET stream, if it has one open.
    pub(super) fn close_session_stream(&mut self, token: HttpToken) {
        if self.get_streams.remove(&token).is_some() {
            self.outputs.push_back(Output::StreamClose { token });
        }
    }

    /// Answers a forwarded call: a JSON reply, or the last event of its stream. `took` is the
    /// latency to record, when the call ended by the sled's answer or the deadline.
    pub(super) fn finish_call(
        &mut self,
        now: Instant,
        mut call: Call,
        body: String,
        outcome: Outcome,
        took: Option<Duration>,
    ) {
        if let Some(span) = call.span.as_mut().filter(|_| outcome != Outcome::Ok) {
            span.error_code = error_code(&body);
        }
        self.call_ended(now, &call, outcome, took);
        // A parked stateless call has no request to answer: its handle goes with it.
        if self.forget_parked(&mut call) {
            return;
        }
        if !call.streamed {
            let status = if call.modern {
                error_code(&body).map_or(200, headers::modern_status)
            } else {
                200
            };
            return self.reply(call.token, status, Vec::new(), Some(body));
        }
        if self.post_streams.remove(&call.token) {
            let id = Some(self.next_event_id());
            self.outputs.push_back(Output::StreamEvent {
                token: call.token,
                id,
                data: body,
            });
            self.outputs
                .push_back(Output::StreamClose { token: call.token });
        }
    }

    /// Relays a sled's `notifications/progress` to the call it belongs to, under the client's
    /// own progress token.
    /// Returns the progress (its gateway token and params) when no pending call has its
    /// token: the creating call of a task still running, answered since (`tasks.rs`).
    pub(super) fn relay_progress(
        &mut self,
        uplink: UplinkId,
        params: Option<&RawValue>,
    ) -> Option<(String, Map<String, Value>)> {
        let Some(mut params) =
            params.and_then(|p| serde_json::from_str::<Map<String, Value>>(p.get()).ok())
        else {
            self.counters.frames_invalid += 1;
            return None;
        };
        let Some(Value::String(gateway_token)) = params.get("progressToken") else {
            self.counters.frames_invalid += 1;
            return None;
        };
        // Only the call's own sled can report its progress.
        let Some(key) = self.calls.by_progress(uplink, gateway_token) else {
            // The call finished (a task's creating call, whose task still runs, goes on), was
            // never asked for progress, or is another sled's.
            let gateway_token = gateway_token.clone();
            return Some((gateway_token, params));
        };
        let call = self.calls.call(key)?;
        let (_, client_token) = call.progress.as_ref()?;
        let client_token: Value =
            serde_json::from_str(client_token.get()).expect("a progress token is JSON");
        #[cfg(feature = "planted-bugs")]
        let key = match self.config.planted {
            // The planted bug: the latest pending call under the same client token, anyone's.
            Some(PlantedBug::ProgressByClientToken) => self
                .calls
                .iter()
                .filter_map(|(k, p)| match p {
                    Pending::Call(c)
                        if c.progress.as_ref().is_some_and(|(_, t)| {
                            serde_json::from_str::<Value>(t.get()).ok().as_ref()
                                == Some(&client_token)
                        }) =>
                    {
                        Some((c.sent_at, *k))
                    }
                    _ => None,
                })
                .max()
                .map_or(key, |(_, k)| k),
            _ => key,
        };
        params.insert("progressToken".into(), client_token);
        let data =
            jsonrpc::notification("notifications/progress", &Value::Object(params).to_string());
        self.call_event(key, data);
        None
    }

    /// Relays a sled's notification about one call (a log message, say) to that call's
    /// client. The sled names the call by the gateway's request id in
    /// `params._meta["io.mcp-gateway/relatedRequest"]`; the key is removed on the way.
    pub(super) fn relay_related(
        &mut self,
        uplink: UplinkId,
        method: &str,
        params: Option<&RawValue>,
    ) {
        let Some(mut params) =
            params.and_then(|p| serde_json::from_str::<Map<String, Value>>(p.get()).ok())
        else {
            return;
        };
        let related = match params.get_mut("_meta") {
            Some(Value::Object(meta)) => meta.remove(RELATED_REQUEST_META),
            _ => None,
        };
        let Some(related) = related.and_then(|r| r.as_u64()) else {
            // A log message of the project's own, naming no call.
            if method == "notifications/message" {
                self.project_log(uplink, params);
            }
            return;
        };
        let Some(Value::Object(meta)) = params.get_mut("_meta") else {
            return;
        };
        // Only a call on this sled's own uplink; its log threshold: the request's own
        // (stateless era), else its session's (logging/setLevel).
        let Some(call) = self.calls.call_on(uplink, related) else {
            return;
        };
        let threshold = call.log_level.or_else(|| {
            call.session
                .as_deref()
                .and_then(|s| self.sessions.get(s))
                .and_then(|s| s.log_level)
        });
        if meta.is_empty() {
            params.remove("_meta");
        }
        if method == "notifications/message" {
            // Below the calling session's own level (logging/setLevel): not relayed.
            let level = params
                .get("level")
                .and_then(Value::as_str)
                .and_then(basics::log_rank);
            if let (Some(level), Some(threshold)) = (level, threshold) {
                if level < threshold {
                    return;
                }
            }
        }
        let data = jsonrpc::notification(method, &Value::Object(params).to_string());
        self.call_event(related, data);
    }

    /// A sled's log message that names no call (a server logging of its own accord): to the
    /// GET streams of the sessions here whose default project is the sled's and which still
    /// see it, each at its own level (`logging/setLevel`; every level when it set none).
    fn project_log(&mut self, uplink: UplinkId, mut params: Map<String, Value>) {
        let Some(project) = self.live_project(uplink) else {
            return;
        };
        let level = params
            .get("level")
            .and_then(Value::as_str)
            .and_then(basics::log_rank);
        let Some(level) = level else {
            // Not a log message MCP knows: nobody's threshold can place it.
            return;
        };
        if params
            .get("_meta")
            .is_some_and(|m| m.as_object().is_some_and(Map::is_empty))
        {
            params.remove("_meta");
        }
        let sessions: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                s.default_project.as_deref() == Some(project.as_str())
                    && s.log_level.is_none_or(|threshold| level >= threshold)
                    && self.holder_sees(&s.holder, &project)
            })
            .map(|(id, _)| id.clone())
            .collect();
        let data =
            jsonrpc::notification("notifications/message", &Value::Object(params).to_string());
        for id in sessions {
            self.notify_session(&id, data.clone());
        }
    }

    /// Sends a message for the client of a pending call, turning its answer into an SSE stream
    /// if it is not one yet. A client that reads only JSON does not get it.
    /// The caller has checked that the sled reporting it serves the call.
    pub(super) fn call_event(&mut self, key: calls::CallId, data: String) {
        let Some(call) = self.calls.call_mut(key) else {
            // The call finished, or the id is not a call's.
            return;
        };
        // A parked stateless call has no request to carry it until its client retries.
        if !call.stream_ok || call.mrtr.as_ref().is_some_and(|m| m.is_parked()) {
            return;
        }
        let token = call.token;
        if !call.streamed {
            call.streamed = true;
            self.post_streams.insert(token);
            self.outputs.push_back(Output::StreamOpen { token });
        }
        let id = Some(self.next_event_id());
        self.outputs
            .push_back(Output::StreamEvent { token, id, data });
    }

    /// Arms the idle sweep, if sessions exist and it is not armed.
    pub(super) fn arm_sweep(&mut self, now: Instant) {
        if self.sweep_armed || self.sessions.len() == 0 {
            return;
        }
        // A quarter of the TTL, so a session lives at most 1.25 × TTL after its last use.
        let every = (self.config.session_idle_ttl / 4).max(Duration::from_secs(1));
        self.timers.insert((now + every, Timer::SessionSweep));
        self.sweep_armed = true;
    }

    /// Sends a notification to a session's GET stream wherever it is: here when it is open
    /// here, else (in a cluster) through the replica that holds it.
    pub(super) fn notify_session_anywhere(&mut self, session: &str, data: String) {
        let open_here = self
            .sessions
            .get(session)
            .is_some_and(|s| s.stream.is_some());
        if !open_here && self.clustered() {
            self.cluster_output(ClusterAction::Announce(Announcement::ToSessions {
                sessions: vec![session.to_owned()],
                data: data.clone(),
            }));
        }
        self.notify_session(session, data);
    }
}

/// The `error.code` of a JSON-RPC response, if it is an error.
fn error_code(body: &str) -> Option<i64> {
    #[derive(Deserialize)]
    struct Code {
        code: i64,
    }
    #[derive(Deserialize)]
    struct Response {
        error: Option<Code>,
    }
    serde_json::from_str::<Response>(body)
        .ok()?
        .error
        .map(|e| e.code)
}

/// The notification a session gets when its tool list changed.
pub(super) const TOOLS_LIST_CHANGED: &str =
    r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#;
