//! What sleds send: frames, answers, notifications, heartbeats, deadlines; reload and shutdown.
//! A hello and an identity proof go on to `handshake.rs`; an uplink's end is `uplinks.rs`'s.

use super::*;

#[derive(Deserialize)]
struct ToolsPage {
    tools: Vec<Value>,
    #[serde(rename = "nextCursor", default)]
    next_cursor: Option<String>,
}

impl Gateway {
    // ---- uplinks ----

    pub(super) fn on_uplink_opened(&mut self, now: Instant, id: UplinkId) {
        let at = now + self.config.hello_timeout;
        self.uplinks.insert(
            id,
            Uplink {
                state: UplinkState::AwaitingHello,
                last_rx: now,
                ping_seq: 0,
                timer: Some(at),
                key: None,
                fence_floor: None,
                upstream: None,
                epoch_seen: None,
                moving: false,
            },
        );
        self.timers.insert((at, Timer::Uplink(id)));
        // A replica handing its projects over takes no new uplink: the sled dials again,
        // and the balancer sends it to another replica.
        if self.shutting_down || self.handing_over {
            self.close_uplink(
                now,
                id,
                CloseCode::GoingAway,
                "the gateway is shutting down".into(),
            );
        }
    }

    pub(super) fn on_uplink_binary(&mut self, now: Instant, id: UplinkId, len: usize) {
        let Some(uplink) = self.uplinks.get(&id) else {
            return;
        };
        self.counters.frames_invalid += 1;
        tracing::warn!(
            uplink = id.0,
            len,
            "binary frame on an uplink; the protocol is text frames"
        );
        if !matches!(
            uplink.state,
            UplinkState::Live { .. } | UplinkState::Retiring { .. }
        ) {
            self.close_uplink(
                now,
                id,
                CloseCode::ProtocolError,
                "expected a hello or proof text frame first".into(),
            );
        }
    }

    pub(super) fn on_uplink_text(&mut self, now: Instant, id: UplinkId, text: &str) {
        let Some(uplink) = self.uplinks.get_mut(&id) else {
            return;
        };
        uplink.last_rx = now;
        let awaiting_hello = !matches!(
            uplink.state,
            UplinkState::Live { .. } | UplinkState::Retiring { .. }
        );
        let expects_hello = uplink.state == UplinkState::AwaitingHello;
        let expects_proof = matches!(uplink.state, UplinkState::AwaitingProof(_));
        let message = match jsonrpc::parse_object(text.as_bytes()) {
            Ok(m) => m,
            Err(e) => return self.invalid_frame(now, id, awaiting_hello, &e.message()),
        };
        if m_is_control(&message) {
            match serde_json::from_str::<Control>(text) {
                Ok(Control::Hello {
                    protocol,
                    project,
                    sled,
                    token,
                    key,
                    fence,
                    epoch_seen,
                    moving,
                }) if expects_hello => {
                    if let Some(u) = self.uplinks.get_mut(&id) {
                        u.fence_floor = fence;
                        u.epoch_seen = epoch_seen;
                        u.moving = moving;
                    }
                    self.on_hello(now, id, protocol, project, sled, token, key)
                }
                Ok(Control::Proof { signature, gateway }) if expects_proof => {
                    self.on_proof(now, id, &signature, gateway.as_deref())
                }
                Ok(Control::Pong { .. }) if !awaiting_hello => {}
                Ok(Control::Event { kind, story, .. }) if !awaiting_hello => {
                    self.on_relay_event(now, id, &kind);
                    if let Some(project) = self.live_project(id) {
                        self.coordination_sled_event(now, &project, &kind, story.as_deref());
                    }
                }
                Ok(Control::Unreadable { id: rid, reason }) if !awaiting_hello => {
                    self.on_unreadable(now, id, rid, &reason)
                }
                Ok(Control::Upstream {
                    state,
                    reason,
                    restarts,
                }) if !awaiting_hello => {
                    if let Some(u) = self.uplinks.get_mut(&id) {
                        // Bounded: a sled's text is kept for the health rows.
                        let reason = reason
                            .map(|r| r.chars().take(crate::uplink::MAX_UPSTREAM_REASON).collect());
                        u.upstream = Some(UpstreamReport {
                            state,
                            reason,
                            restarts,
                        });
                    }
                }
                // Named by kind only: a frame's text may hold a token.
                Ok(other) => self.invalid_frame(
                    now,
                    id,
                    awaiting_hello,
                    &format!("unexpected control frame '{}'", control_kind(&other)),
                ),
                Err(e) => {
                    self.invalid_frame(now, id, awaiting_hello, &format!("bad control frame: {e}"))
                }
            }
            return;
        }
        if awaiting_hello {
            let expected = if expects_proof { "proof" } else { "hello" };
            return self.invalid_frame(
                now,
                id,
                true,
                &format!("expected a {expected} control frame first"),
            );
        }
        if let Some(method) = message.method {
            let method: String = serde_json::from_str(method.get()).unwrap_or_default();
            match message.id {
                // A sled's request: for the client of one of its calls, or a ping.
                Some(rid) => self.relay_server_request(now, id, rid, &method, message.params),
                None if method == TOOLS_CHANGED => {
                    if let Some(project) = self.live_project(id) {
                        self.start_refresh(now, id, project);
                    }
                }
                None if method == "notifications/progress" => {
                    if let Some((token, params)) = self.relay_progress(id, message.params) {
                        self.task_progress(id, &token, params);
                    }
                }
                None if method == "notifications/tasks/status" => {
                    self.on_task_status(now, id, message.params)
                }
                None if method == "notifications/resources/updated" => {
                    if let Some(project) = self.live_project(id) {
                        self.on_resource_updated(&project, message.params);
                    }
                }
                None if method == "notifications/resources/list_changed"
                    || method == "notifications/prompts/list_changed" =>
                {
                    if let Some(project) = self.live_project(id) {
                        self.notify_default_sessions(&project, &method);
                        self.notify_listeners_list_changed(&project, &method);
                        self.announce_list_changed(&project, &method);
                    }
                }
                None => self.relay_related(id, &method, message.params),
            }
            return;
        }
        let Some(rid) = message.id.and_then(|r| r.get().parse::<u64>().ok()) else {
            self.counters.responses_dropped_unknown += 1;
            return;
        };
        self.on_response(now, id, rid, message.result, message.error, None);
    }

    /// The sled's `unreadable` control frame: it could not read a frame the gateway sent. With
    /// the frame's id, the request it carried fails now (not applied) instead of at its
    /// deadline.
    fn on_unreadable(&mut self, now: Instant, id: UplinkId, rid: Option<u64>, reason: &str) {
        self.counters.frames_unreadable_at_sled += 1;
        let project = self.live_project(id).unwrap_or_default();
        tracing::error!(
            uplink = id.0,
            project,
            id = rid,
            reason,
            "the sled could not read a frame the gateway sent"
        );
        if let Some(rid) = rid {
            let error = RpcError::SledUnreadable {
                project: project.clone(),
                sled: self.sled_of(&project),
                reason: reason.to_owned(),
            }
            .to_json()
            .to_string();
            let raw = RawValue::from_string(error).expect("an RpcError serialises to JSON");
            self.on_response(now, id, rid, None, Some(&raw), Some(reason));
        }
    }

    /// A sled's answer to the request `rid` the gateway sent on `id`: a response's `result` or
    /// `error`, or (`unreadable`) the sled's word that it could not read the request, with
    /// `error` then the gateway's error for it.
    fn on_response(
        &mut self,
        now: Instant,
        id: UplinkId,
        rid: u64,
        result: Option<&RawValue>,
        error: Option<&RawValue>,
        unreadable: Option<&str>,
    ) {
        let Some(pending) = self.calls.take_on(id, rid) else {
            // Sent, and answered or ended since: late. Never sent, or another uplink's
            // request: unknown.
            let sent = self.calls.was_sent(rid) && self.calls.uplink_of(rid).is_none();
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
        match pending {
            Pending::TaskFetch {
                project,
                sled_id,
                task,
                ..
            } => self.on_task_fetched(&project, &sled_id, *task, result, error),
            Pending::Subscription { project, .. } => {
                if let Some(e) = error {
                    tracing::info!(
                        project,
                        error = e.get(),
                        "the sled refused a resource subscription"
                    );
                }
            }
            Pending::FanoutPart {
                fanout,
                project,
                sent_at,
                ..
            } => self.on_fanout_answer(now, fanout, project, sent_at, result, error),
            Pending::Call(call) if matches!(call.rewrite, proxy::Rewrite::Task(_)) => {
                match (result, error) {
                    (None, Some(error)) if unreadable.is_some() => {
                        let body =
                            jsonrpc::raw_error_response(call.client_id.as_str(), error.get());
                        let took = now.saturating_duration_since(call.sent_at);
                        self.finish_or_hold(now, call, body, Outcome::Error, took);
                    }
                    _ => self.on_task_answer(now, call, result, error),
                }
            }
            Pending::Call(call) => {
                let id = call.client_id.as_str();
                let (body, outcome) = match (result, error) {
                    (None, Some(error)) if unreadable.is_some() => {
                        (jsonrpc::raw_error_response(id, error.get()), Outcome::Error)
                    }
                    (Some(result), None) if call.rewrite == proxy::Rewrite::PromptsList => {
                        let listed = proxy::rewrite_prompts(result.get());
                        let listed = if call.modern {
                            basics::with_result_type(&listed)
                        } else {
                            listed
                        };
                        (jsonrpc::ok_response(id, &listed), Outcome::Ok)
                    }
                    // A task the client did not ask for (it sent no `task`, or its request did
                    // not declare the extension): never shown to it.
                    (Some(result), None) if super::tasks::is_create_task_result(result.get()) => {
                        self.counters.frames_invalid += 1;
                        let project = call.project.clone();
                        let sled = self.sled_of(&project);
                        tracing::warn!(
                            project,
                            "the sled made a task of a call that asked for none"
                        );
                        (
                            RpcError::BadSledResponse { project, sled }.response(Some(id)),
                            Outcome::BadResponse,
                        )
                    }
                    (Some(result), None) if call.modern => (
                        jsonrpc::ok_response(id, &basics::with_result_type(result.get())),
                        Outcome::Ok,
                    ),
                    (Some(result), None) => (jsonrpc::ok_response(id, result.get()), Outcome::Ok),
                    (None, Some(error)) if error.get().starts_with('{') => {
                        (jsonrpc::raw_error_response(id, error.get()), Outcome::Error)
                    }
                    _ => {
                        self.counters.frames_invalid += 1;
                        let project = call.project.clone();
                        let sled = self.sled_of(&project);
                        (
                            RpcError::BadSledResponse { project, sled }.response(Some(id)),
                            Outcome::BadResponse,
                        )
                    }
                };
                let took = now.saturating_duration_since(call.sent_at);
                self.finish_or_hold(now, call, body, outcome, took);
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
                let parsed = match (result, error) {
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
                                self.store_tools(&project, &tools);
                                let prepared = tools::prepare_sled_tools(&project, tools);
                                tracing::info!(
                                    project,
                                    tools = prepared.len(),
                                    "project tools refreshed"
                                );
                                let changed = match self.projects.get_mut(&project) {
                                    Some(state) => {
                                        let changed = state.tools.as_ref() != Some(&prepared);
                                        state.set_tools(Some(prepared));
                                        changed
                                    }
                                    None => false,
                                };
                                if changed {
                                    self.modern_listing = None;
                                    self.notify_listeners_tools_changed();
                                    self.notify_tools_changed(&project);
                                }
                                // Writes held for this listing can be checked now.
                                #[cfg(feature = "planted-bugs")]
                                let release = self.config.planted
                                    != Some(PlantedBug::ToolsPendingAfterListing);
                                #[cfg(not(feature = "planted-bugs"))]
                                let release = true;
                                if release {
                                    self.release_listing_holds(&project);
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

    pub(super) fn invalid_frame(
        &mut self,
        now: Instant,
        id: UplinkId,
        awaiting_hello: bool,
        detail: &str,
    ) {
        self.counters.frames_invalid += 1;
        tracing::warn!(uplink = id.0, "invalid uplink frame: {detail}");
        if awaiting_hello {
            self.close_uplink(
                now,
                id,
                CloseCode::ProtocolError,
                format!("expected hello: {detail}"),
            );
        }
    }

    /// A request's deadline passed (the call table took it out).
    pub(super) fn on_request_deadline(
        &mut self,
        now: Instant,
        (rpc_id, uplink): (calls::CallId, UplinkId),
        pending: Pending,
    ) {
        match pending {
            Pending::Call(call) => {
                self.counters.calls_timed_out += 1;
                let sled = self.sled_of(&call.project);
                tracing::warn!(project = call.project, sled, "call timed out");
                let e = RpcError::Timeout {
                    project: call.project.clone(),
                    sled,
                    waited: now.saturating_duration_since(call.sent_at),
                };
                let body = e.response(Some(call.client_id.as_str()));
                let took = now.saturating_duration_since(call.sent_at);
                self.finish_call(now, call, body, Outcome::Timeout, Some(took));
                self.send_cancelled(
                    uplink,
                    rpc_id,
                    "the gateway's deadline for this call expired",
                );
            }
            Pending::ToolsList { project, .. } => {
                tracing::warn!(project, "tools/list to the sled timed out");
            }
            Pending::Subscription { project, .. } => {
                tracing::warn!(project, "a resource subscription at the sled timed out");
            }
            Pending::TaskFetch { project, .. } => {
                tracing::warn!(project, "a finished task's result was not given in time");
            }
            Pending::FanoutPart {
                fanout, project, ..
            } => {
                self.counters.calls_timed_out += 1;
                let waited = self.fanout_sled_timeout(fanout);
                self.fail_fanout_part(
                    now,
                    fanout,
                    &project,
                    "timed_out",
                    format!(
                        "no answer within its deadline of {} ms",
                        fleet::millis(waited)
                    ),
                    Outcome::Timeout,
                );
                self.send_cancelled(
                    uplink,
                    rpc_id,
                    "the gateway's deadline for this call expired",
                );
            }
        }
    }

    pub(super) fn on_uplink_timer(&mut self, now: Instant, id: UplinkId) {
        let Some(uplink) = self.uplinks.get_mut(&id) else {
            return;
        };
        uplink.timer = None;
        match uplink.state {
            UplinkState::AwaitingHello => {
                self.close_uplink(
                    now,
                    id,
                    CloseCode::HelloTimeout,
                    "no hello within the hello timeout".into(),
                );
            }
            UplinkState::AwaitingProof(_) => {
                self.close_uplink(
                    now,
                    id,
                    CloseCode::HelloTimeout,
                    "no identity proof within the hello timeout".into(),
                );
            }
            UplinkState::AwaitingClaim { .. } => {
                let reason = if self.clustered() {
                    "this gateway replica could not claim the project within the hello timeout (is the cluster's engine reachable?); connect again"
                } else {
                    "this gateway could not pin the sled's key in its state store within the hello timeout; connect again"
                };
                self.close_uplink(now, id, CloseCode::HelloTimeout, reason.into());
            }
            UplinkState::Live { .. } | UplinkState::Retiring { .. } => {
                let silent = now.saturating_duration_since(uplink.last_rx);
                if silent >= self.config.heartbeat_timeout {
                    let reason = format!("no frame from the sled for {} ms", silent.as_millis());
                    tracing::warn!(uplink = id.0, "{reason}; closing");
                    self.drop_uplink(
                        now,
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

    pub(super) fn on_reload(&mut self, now: Instant, registry: Registry) {
        let removed: Vec<String> = self
            .registry
            .names()
            .filter(|n| registry.get(n).is_none())
            .map(str::to_owned)
            .collect();
        for project in &removed {
            if let Some(uplink) = self.projects.get(project).and_then(|p| p.uplink) {
                self.drop_uplink(
                    now,
                    uplink,
                    UplinkLoss::Unregistered,
                    Some((
                        CloseCode::UnknownProject,
                        format!("project '{project}' is no longer registered"),
                    )),
                );
            }
            self.projects.remove(project);
            self.subscriptions.retain(|(p, _), _| p != project);
        }
        for name in registry.names() {
            self.projects.entry(name.to_owned()).or_default();
        }
        let added = registry
            .names()
            .filter(|n| self.registry.get(n).is_none())
            .count();
        tracing::info!(
            projects = registry.len(),
            added,
            removed = removed.len(),
            "registry reloaded"
        );
        self.registry = registry;
        self.modern_listing = None;
        // What was set up under the old rules and is no longer seen under the new ones ends.
        self.end_revoked_subscriptions();
        self.end_revoked_listens(now);
        self.end_revoked_waits();
    }

    /// Shutdown is coming: in a cluster, every project held here is handed over (see
    /// [`Input::Handover`]). The sleds are asked to move only once the coordination writes in
    /// flight are done, so the next holder reads them; requests for the projects are held
    /// from now, and write nothing meanwhile.
    pub(super) fn on_handover(&mut self, now: Instant) {
        if self.shutting_down || self.handing_over || !self.clustered() {
            return;
        }
        self.handing_over = true;
        let projects = self.begin_handover(now);
        tracing::info!(
            projects = projects.len(),
            "stopping: asking the sleds held here to move to another replica"
        );
        for (project, uplink) in projects {
            self.after_coordination_writes(coordination::AfterWrites::Move { project, uplink });
        }
    }

    /// Whether this replica, stopping, still waits for a project it handed over to be
    /// claimed elsewhere (and the move grace is not over): the server keeps draining.
    #[must_use]
    pub fn handing_over(&self, now: Instant) -> bool {
        self.handing_over && self.handover_pending(now)
    }

    pub(super) fn on_shutdown(&mut self, now: Instant) {
        self.shutting_down = true;
        self.handing_over = false;
        self.records_shutdown();
        self.coordination_shutdown();
        self.cluster_shutdown(now);
        if self.pins_save_at.is_some() {
            self.save_pins_now();
        }
        self.stop_probes();
        self.end_listens();
        let streams: BTreeSet<HttpToken> = self.get_streams.keys().copied().collect();
        for token in streams {
            self.close_session_stream(token);
        }
        let ids: BTreeSet<UplinkId> = self.uplinks.keys().copied().collect();
        for id in ids {
            self.drop_uplink(
                now,
                id,
                UplinkLoss::Shutdown,
                Some((CloseCode::GoingAway, "the gateway is shutting down".into())),
            );
        }
    }
}

/// A control frame's kind, for logs.
fn control_kind(c: &Control) -> &'static str {
    match c {
        Control::Hello { .. } => "hello",
        Control::Welcome { .. } => "welcome",
        Control::Ping { .. } => "ping",
        Control::Pong { .. } => "pong",
        Control::Closing { .. } => "closing",
        Control::Challenge { .. } => "challenge",
        Control::Proof { .. } => "proof",
        Control::Event { .. } => "event",
        Control::Unreadable { .. } => "unreadable",
        Control::Move { .. } => "move",
        Control::Upstream { .. } => "upstream",
    }
}

fn m_is_control(m: &jsonrpc::RawMessage<'_>) -> bool {
    m.uplink.is_some()
}
