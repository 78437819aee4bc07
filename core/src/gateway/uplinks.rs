//! An uplink's end and its tool listing: closing one, and everything that follows when one
//! goes (its calls failed, its project's listeners, holds, probes and coordination told); and
//! asking a live sled for its tools. Every door may call it; it calls only the features below.

use super::*;

impl Gateway {
    pub(super) fn close_uplink(
        &mut self,
        now: Instant,
        id: UplinkId,
        code: CloseCode,
        reason: String,
    ) {
        self.drop_uplink(now, id, UplinkLoss::Closed, Some((code, reason)));
    }

    /// Forgets an uplink: its project loses its sled and tools, its pending calls fail now.
    /// With `close`, the driver is told to close the socket with that code and reason.
    pub(super) fn drop_uplink(
        &mut self,
        now: Instant,
        id: UplinkId,
        loss: UplinkLoss,
        close: Option<(CloseCode, String)>,
    ) {
        let Some(uplink) = self.uplinks.remove(&id) else {
            return;
        };
        self.retiring.remove(&id);
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
        let mut probe_now = None;
        let mut gone_from = None;
        if let UplinkState::AwaitingClaim { project } | UplinkState::Live { project } =
            &uplink.state
        {
            if !self.pin_uplink_gone(id, project) {
                self.cluster_uplink_gone(now, id, project);
            }
        }
        if let UplinkState::Live { project } = &uplink.state {
            if self.unhook_uplink(id, project, uplink.last_rx) {
                gone_from = Some(project.clone());
                probe_now = (loss != UplinkLoss::Shutdown && loss != UplinkLoss::Unregistered)
                    .then(|| project.clone());
            }
        }
        // The sled's requests to clients go with their calls.
        for (_, pending) in self.calls.uplink_gone(id) {
            match pending {
                Pending::Call(call) => {
                    let e = RpcError::UplinkLost {
                        project: call.project.clone(),
                        sled: self.sled_of(&call.project),
                        loss,
                    };
                    let body = e.response(Some(call.client_id.as_str()));
                    self.finish_call(now, call, body, Outcome::UplinkLost, None);
                }
                Pending::FanoutPart {
                    fanout, project, ..
                } => {
                    self.fail_fanout_part(
                        now,
                        fanout,
                        &project,
                        "error",
                        format!("the sled did not answer: {}", loss.describe()),
                        Outcome::UplinkLost,
                    );
                }
                Pending::ToolsList { .. }
                | Pending::Subscription { .. }
                | Pending::TaskFetch { .. } => {}
            }
        }
        // Find out at once whether the project's server is still there.
        if let Some(project) = probe_now {
            self.start_probe(now, project);
        }
        // Writes held for its tools are answered as any call without a sled is.
        if let Some(project) = gone_from {
            self.release_listing_holds(&project);
        }
    }

    /// `project` loses its live uplink `id` (last heard from at `last_rx`): its sled and
    /// tools, as its listeners are told. False when `id` was not its live uplink.
    fn unhook_uplink(&mut self, id: UplinkId, project: &str, last_rx: Instant) -> bool {
        let Some(state) = self.projects.get_mut(project) else {
            return false;
        };
        if state.uplink != Some(id) {
            return false;
        }
        tracing::info!(uplink = id.0, project, "uplink gone");
        state.uplink = None;
        state.health.last_seen = Some(last_rx);
        state.health.connected_at = None;
        let had_tools = state.set_tools(None).is_some();
        state.refresh += 1;
        self.modern_listing = None;
        if had_tools {
            self.notify_tools_changed(project);
            self.notify_listeners_tools_changed();
        }
        self.end_project_listens(project);
        true
    }

    /// Make-before-break (issue 30): the live uplink `id` of a project handed over to another
    /// replica takes no new call; the calls running on it are answered, then it is closed
    /// ([`Gateway::close_retired`]).
    pub(super) fn retire_uplink(&mut self, now: Instant, id: UplinkId) {
        let Some(uplink) = self.uplinks.get_mut(&id) else {
            return;
        };
        let UplinkState::Live { project } = uplink.state.clone() else {
            return;
        };
        uplink.state = UplinkState::Retiring {
            project: project.clone(),
        };
        let last_rx = uplink.last_rx;
        self.unhook_uplink(id, &project, last_rx);
        // The claim is already the other replica's: nothing to release.
        self.cluster_uplink_gone(now, id, &project);
        self.release_listing_holds(&project);
        self.retiring.insert(id);
    }

    /// Retired uplinks on which no call runs any more are closed.
    pub(super) fn close_retired(&mut self, now: Instant) {
        if self.retiring.is_empty() {
            return;
        }
        let done: Vec<UplinkId> = self
            .retiring
            .iter()
            .copied()
            .filter(|id| self.calls.on_uplink(*id) == 0)
            .collect();
        for id in done {
            self.close_uplink(
                now,
                id,
                CloseCode::Superseded,
                "this gateway replica handed the project over; its calls are answered".into(),
            );
        }
    }

    pub(super) fn start_refresh(&mut self, now: Instant, id: UplinkId, project: String) {
        let Some(state) = self.projects.get_mut(&project) else {
            return;
        };
        state.refresh += 1;
        let refresh = state.refresh;
        self.send_tools_list(now, id, project, refresh, 0, Vec::new(), None);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_tools_list(
        &mut self,
        now: Instant,
        id: UplinkId,
        project: String,
        refresh: u64,
        page: u32,
        tools: Vec<Value>,
        cursor: Option<String>,
    ) {
        if !self.uplinks.contains_key(&id) {
            return;
        }
        let rpc_id = self.calls.next_id();
        let deadline = now + self.config.refresh_timeout;
        let params = match &cursor {
            Some(c) => json!({ "cursor": c }).to_string(),
            None => "{}".to_owned(),
        };
        self.calls.start(
            id,
            rpc_id,
            Pending::ToolsList {
                project,
                refresh,
                page,
                tools,
                deadline,
            },
        );
        self.outputs.push_back(Output::UplinkSend {
            uplink: id,
            text: jsonrpc::request(rpc_id, "tools/list", &params),
        });
    }
}
