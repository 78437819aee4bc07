//! Who is who: a session is an agent, so is a handle `checkin` issues to a caller without
//! one; each known to others only by its public name. Who writes a project tool call, and
//! what a session's end does to its agent.

use super::*;

impl Gateway {
    /// The calling agent's public name, and a handle when this call issued one.
    pub(super) fn agent_of(
        &mut self,
        scope: Scope<'_>,
        arguments: &Map<String, Value>,
        tool: &'static str,
    ) -> Result<(String, Option<String>), RpcError> {
        if let Some(handle) = arg::<String>(tool, arguments, "agent")? {
            return match self.handle_agent(&handle)? {
                Some(name) => Ok((name, None)),
                None => Err(RpcError::UnknownAgent { tool }),
            };
        }
        match scope {
            Scope::Session(s) => Ok((self.session_agent(s), None)),
            Scope::Sessionless if tool == CHECKIN => {
                let max = self.config.max_sessions;
                if self.coordination.handles.len() >= max {
                    return Err(coord_error(
                        tool,
                        CoordError::Limit {
                            which: crate::coord::CoordLimit::Handles,
                            max,
                        },
                    ));
                }
                use rand_chacha::rand_core::RngCore;
                let mut bytes = [0u8; 16];
                self.rng.fill_bytes(&mut bytes);
                let handle = crate::agents::issue(bytes, self.agent_key());
                let name = self.coordination.name_of(&handle);
                self.coordination
                    .handles
                    .insert(name.clone(), handle.clone());
                Ok((name, Some(handle)))
            }
            Scope::Sessionless => Err(RpcError::NoAgent { tool }),
        }
    }

    /// The cluster's key for agent handles, in a cluster.
    fn agent_key(&self) -> Option<&crate::agents::AgentKey> {
        self.config.cluster.as_ref()?.agent_key.as_ref()
    }

    /// The public name of the agent behind a handle: one issued here, or (in a cluster) by
    /// another replica under the cluster's key, which is then known here too. `None`: a
    /// handle nobody issued.
    fn handle_agent(&mut self, handle: &str) -> Result<Option<String>, RpcError> {
        if let Some(name) = self.coordination.known_name(handle) {
            let issued = self.coordination.handles.get(name).map(String::as_str) == Some(handle);
            return Ok(issued.then(|| name.to_owned()));
        }
        if !self
            .agent_key()
            .is_some_and(|k| crate::agents::verify(handle, k))
        {
            return Ok(None);
        }
        let max = self.config.max_sessions;
        if self.coordination.handles.len() >= max {
            return Err(coord_error(
                "checkin",
                CoordError::Limit {
                    which: crate::coord::CoordLimit::Handles,
                    max,
                },
            ));
        }
        let name = self.coordination.name_of(handle);
        self.coordination
            .handles
            .insert(name.clone(), handle.to_owned());
        Ok(Some(name))
    }

    /// The public name of a session's agent, made on its first coordination call or leased
    /// write.
    fn session_agent(&mut self, session: &str) -> String {
        let name = self.coordination.name_of(session);
        // A session hears of what concerns it on its event stream too.
        if !self.coordination.sessions.contains_key(&name) {
            self.coordination
                .sessions
                .insert(name.clone(), session.to_owned());
            self.coordination.coord.watch(&name);
        }
        name
    }

    /// A session ended (DELETE, idle TTL, eviction): its agent leaves every roster and
    /// releases what it held; its parked waits are answered.
    pub(in crate::gateway) fn coordination_session_ended(&mut self, now: Instant, session: &str) {
        let Some(name) = self.coordination.names.remove(session) else {
            return;
        };
        self.coordination.sessions.remove(&name);
        let ended = self.coordination.coord.end_agent(now, &name);
        for wait in ended.cancelled_waits {
            self.wait_ended(wait);
            if let Some(parked) = self.coordination.unpark(wait) {
                let result = basics::tool_result(json!({
                    "woke": false, "reasons": [], "ended": "the session ended",
                }));
                self.answer_parked(parked, &result);
            }
        }
        if !ended.released.is_empty() {
            tracing::info!(
                agent = name,
                leases = ended.released.len(),
                "a session ended; its leases were released"
            );
        }
        self.drain_woken(now);
    }

    /// Who writes in a project tool call: the agent behind the `_meta` handle when one is
    /// given (it must be one this gateway issued), else the session's agent, else nobody
    /// (then the write holds no lease).
    pub(in crate::gateway) fn writer_of(
        &mut self,
        scope: Scope<'_>,
        handle: Option<&Value>,
    ) -> Result<Option<String>, RpcError> {
        if let Some(h) = handle {
            let known = match h.as_str() {
                Some(h) => self.handle_agent(h)?,
                None => None,
            };
            return known
                .map(Some)
                .ok_or(RpcError::UnknownAgent { tool: "tools/call" });
        }
        Ok(match scope {
            Scope::Session(s) => Some(self.session_agent(s)),
            Scope::Sessionless => None,
        })
    }
}
