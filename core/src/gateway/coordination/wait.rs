//! `wait`: parked until something concerns the agent (or its timeout), answered from the
//! coordination state's notices; with progress on a stream when asked.

use super::*;
use crate::gather::Answer;

impl Gateway {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn coordination_wait(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        (agent, handle): (&str, Option<&str>),
        arguments: &Map<String, Value>,
        meta: Option<&Value>,
        mode: CallMode,
    ) -> Result<Served, RpcError> {
        let Req { now, token, .. } = *req;
        let named: Option<Vec<String>> = arg(WAIT, arguments, "projects")?;
        let named_any = named.is_some();
        let projects = match named {
            Some(ps) => {
                for p in &ps {
                    if self.registry.get(p).is_none() || !self.sees(req.principal, p) {
                        return Err(RpcError::UnknownProject {
                            project: p.clone(),
                            registered: self.visible_projects(req.principal),
                        });
                    }
                }
                ps
            }
            None => {
                let present = self.coordination.coord.present_in(now, agent);
                present
                    .into_iter()
                    .filter(|p| self.sees(req.principal, p))
                    .collect()
            }
        };
        let limit = self.coordination.coord.limits().max_wait;
        let timeout = seconds(WAIT, arguments, "timeout_s")?
            .unwrap_or(limit)
            .min(limit);
        let covers = projects.clone();
        // In a cluster, projects held by other replicas are waited in there.
        let (projects, elsewhere) = self.wait_places(req, projects, named_any);
        if projects.is_empty() && elsewhere.is_empty() {
            return Err(RpcError::InvalidParams {
                method: WAIT.into(),
                detail: "you are present in no project: checkin first, or name `projects`".into(),
            });
        }
        self.coordination.next_wait += 1;
        let wait = WaitToken(self.coordination.next_wait);
        let started = if projects.is_empty() {
            WaitStart::Parked {
                deadline: now + timeout,
            }
        } else {
            self.coordination
                .coord
                .wait(now, agent, &projects, wait, now + timeout)
                .map_err(|e| coord_error(WAIT, e))?
        };
        match started {
            WaitStart::Ready(ready) => {
                let project = ready.project.clone();
                Ok(Served::Now(self.wait_result(
                    now,
                    agent,
                    project.as_deref(),
                    &ready,
                )))
            }
            WaitStart::Parked { .. } => {
                let progress = match meta.and_then(|m| m.get("progressToken")) {
                    Some(t @ (Value::String(_) | Value::Number(_))) if mode.stream_ok => {
                        Some(serde_json::value::to_raw_value(t).expect("a JSON value serialises"))
                    }
                    _ => None,
                };
                self.coordination.park(
                    wait,
                    Parked {
                        http: token,
                        client_id: id.clone(),
                        agent: agent.to_owned(),
                        project: projects.first().cloned(),
                        progress,
                        streamed: false,
                        next_progress: now + WAIT_PROGRESS_EVERY,
                        sent_progress: 0,
                        holder: crate::auth::Holder::of(req.principal, &self.registry),
                        projects: covers,
                    },
                );
                if !elsewhere.is_empty() {
                    let local = !projects.is_empty();
                    self.spread_wait(req, wait, local, elsewhere, handle, timeout);
                }
                Ok(Served::Later)
            }
        }
    }

    /// A `wait` answer, with the caller's lost leases and unread count.
    pub(in crate::gateway) fn wait_result(
        &mut self,
        now: Instant,
        agent: &str,
        project: Option<&str>,
        ready: &WaitReady,
    ) -> String {
        let c = &mut self.coordination.coord;
        let mut out = ready_json(ready);
        // A lost lease reported in `reasons` was taken there; any other goes in `lost`.
        out["lost"] = lost_json(&c.take_lost(now, agent, None));
        if let Some(p) = project {
            out["unread"] = json!(c.unread(now, agent, p));
        }
        basics::tool_result(out)
    }

    /// Answers every `wait` the coordination state has woken, and tells sessions on their
    /// event stream (GET) when something concerns them.
    pub(in crate::gateway) fn drain_woken(&mut self, now: Instant) {
        while let Some((agent, project)) = self.coordination.coord.poll_notice() {
            let Some(session) = self.coordination.sessions.get(&agent).cloned() else {
                continue;
            };
            // Only to a session that still sees the project (a reload may have taken it).
            let sees = self
                .sessions
                .get(&session)
                .is_some_and(|s| self.holder_sees(&s.holder, &project));
            if !sees {
                continue;
            }
            let data = json!({
                "jsonrpc": "2.0",
                "method": COORDINATION_NOTIFICATION,
                "params": {
                    "project": project,
                    "agent": agent,
                    "hint": "something concerns you here: call wait (it returns at once with what), inbox or claims",
                },
            })
            .to_string();
            self.notify_session_anywhere(&session, data);
        }
        while let Some((wait, ready)) = self.coordination.coord.poll_woken() {
            let Some(parked) = self.coordination.unpark(wait) else {
                continue;
            };
            let project = ready.project.clone().or(parked.project.clone());
            let result = self.wait_result(now, &parked.agent, project.as_deref(), &ready);
            self.answer_parked(parked, &result);
            self.wait_ended(wait);
        }
    }

    /// After a reload: the parked waits whose holder no longer sees one of their projects end
    /// at once, answered `woke: false` with `ended` saying why (security review finding 14):
    /// nothing of that project reaches them. Waiting again is decided on the rules in force.
    pub(in crate::gateway) fn end_revoked_waits(&mut self) {
        let mut revoked: Vec<WaitToken> = self
            .coordination
            .parked
            .iter()
            .filter(|(_, p)| p.projects.iter().any(|pr| !self.holder_sees(&p.holder, pr)))
            .map(|(w, _)| *w)
            .collect();
        revoked.sort();
        if !revoked.is_empty() {
            tracing::info!(
                waits = revoked.len(),
                "parked waits ended: their callers no longer see one of the projects"
            );
        }
        for wait in revoked {
            self.coordination.coord.cancel_wait(wait);
            self.wait_ended(wait);
            if let Some(parked) = self.coordination.unpark(wait) {
                let result = basics::tool_result(json!({
                    "woke": false, "reasons": [],
                    "ended": "the rights in force changed: call wait again",
                }));
                self.answer_parked(parked, &result);
            }
        }
    }

    pub(in crate::gateway) fn answer_parked(&mut self, parked: Parked, result: &str) {
        let body = jsonrpc::ok_response(parked.client_id.as_str(), result);
        self.deliver_parked(parked, body);
    }

    /// Answers a parked wait with a JSON-RPC error object (raw JSON).
    pub(in crate::gateway) fn fail_parked(&mut self, parked: Parked, error: &str) {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{error}}}"#,
            parked.client_id.as_str()
        );
        self.deliver_parked(parked, body);
    }

    fn deliver_parked(&mut self, parked: Parked, body: String) {
        if parked.streamed {
            let id = Some(self.next_event_id());
            self.outputs.push_back(Output::StreamEvent {
                token: parked.http,
                id,
                data: body,
            });
            self.outputs
                .push_back(Output::StreamClose { token: parked.http });
            self.post_streams.remove(&parked.http);
        } else {
            self.reply(parked.http, 200, Vec::new(), Some(body));
        }
    }

    /// Coordination timers: expiries and wait deadlines, and progress for parked waits.
    pub(in crate::gateway) fn coordination_timeout(&mut self, now: Instant) {
        self.coordination_write_timeout(now);
        self.coordination.coord.handle_timeout(now);
        self.drain_woken(now);
        while let Some(&(at, wait)) = self.coordination.progress_due.first() {
            if at > now {
                break;
            }
            self.coordination.progress_due.pop_first();
            let Some(p) = self.coordination.parked.get_mut(&wait) else {
                continue;
            };
            p.next_progress = now + WAIT_PROGRESS_EVERY;
            self.coordination
                .progress_due
                .insert((p.next_progress, wait));
            p.sent_progress += 1;
            let (http, count, first) = (p.http, p.sent_progress, !p.streamed);
            p.streamed = true;
            let Some(client_token) = p.progress.as_ref().map(|t| t.get().to_owned()) else {
                continue;
            };
            if first {
                self.outputs.push_back(Output::StreamOpen { token: http });
                self.post_streams.insert(http);
            }
            let data = format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{client_token},"progress":{count},"message":"waiting"}}}}"#
            );
            let id = Some(self.next_event_id());
            self.outputs.push_back(Output::StreamEvent {
                token: http,
                id,
                data,
            });
        }
    }

    /// The client behind a parked `wait` went away: the wait is withdrawn. Returns whether
    /// `token` was one.
    pub(in crate::gateway) fn coordination_aborted(&mut self, token: HttpToken) -> bool {
        let Some(&wait) = self.coordination.by_http.get(&token) else {
            return false;
        };
        self.coordination.unpark(wait);
        self.coordination.coord.cancel_wait(wait);
        self.post_streams.remove(&token);
        self.wait_ended(wait);
        true
    }

    /// A part of a spread wait answered (or failed).
    pub(in crate::gateway) fn wait_part_answered(
        &mut self,
        now: Instant,
        wait: u64,
        answer: Answer,
    ) {
        let Some(g) = self.gathers.waits.get_mut(&wait) else {
            return;
        };
        g.parts = g.parts.saturating_sub(1);
        match answer {
            Answer::Response {
                result: Some(result),
                ..
            } if woke(&result) => {
                return self.finish_spread(now, WaitToken(wait), Ok(Some(result.get())));
            }
            Answer::Response {
                error: Some(error), ..
            } => {
                g.error.get_or_insert(error);
            }
            Answer::Response { .. } => {}
            Answer::Failed(why) => {
                tracing::debug!(wait, why, "a part of a wait across replicas failed");
            }
        }
        if g.parts == 0 && !g.local {
            let error = g.error.take();
            match error {
                Some(e) => self.finish_spread(now, WaitToken(wait), Err(e.get())),
                None => self.finish_spread(now, WaitToken(wait), Ok(None)),
            }
        }
    }

    /// Answers a spread wait: with a part's result (`Ok(Some)`), a timeout (`Ok(None)`), or a
    /// part's error; what else waits for it is withdrawn.
    pub(super) fn finish_spread(
        &mut self,
        now: Instant,
        wait: WaitToken,
        answer: Result<Option<&str>, &str>,
    ) {
        self.wait_ended(wait);
        self.coordination.coord.cancel_wait(wait);
        let Some(parked) = self.coordination.unpark(wait) else {
            return;
        };
        match answer {
            Ok(Some(result)) => self.answer_parked(parked, result),
            Ok(None) => {
                let ready = WaitReady {
                    project: None,
                    reasons: Vec::new(),
                };
                let agent = parked.agent.clone();
                let result = self.wait_result(now, &agent, None, &ready);
                self.answer_parked(parked, &result);
            }
            Err(error) => self.fail_parked(parked, error),
        }
    }
}

/// Whether a part's `wait` result woke (something concerns the agent there).
fn woke(result: &RawValue) -> bool {
    #[derive(Deserialize)]
    struct Woke {
        #[serde(rename = "structuredContent")]
        structured: Option<Flag>,
    }
    #[derive(Deserialize)]
    struct Flag {
        #[serde(default)]
        woke: bool,
    }
    serde_json::from_str::<Woke>(result.get())
        .ok()
        .and_then(|w| w.structured)
        .is_some_and(|f| f.woke)
}
