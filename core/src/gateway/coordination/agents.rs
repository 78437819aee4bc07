//! Who is who: a session is an agent, so is a handle `checkin` issues to a caller without
//! one; each known to others only by its public name. Who writes a project tool call, and
//! what a session's end does to its agent.

use super::*;

impl Gateway {
    /// The calling agent's public name, and a handle when this call issued one.
    pub(super) fn agent_of(
        &mut self,
        req: &Req<'_>,
        arguments: &Map<String, Value>,
        tool: &'static str,
    ) -> Result<(String, Option<String>), RpcError> {
        if let Some(handle) = arg::<String>(tool, arguments, "agent")? {
            return match self.handle_agent(req, &handle)? {
                Some(name) => Ok((name, None)),
                None => Err(RpcError::UnknownAgent { tool }),
            };
        }
        match req.scope {
            Scope::Session(s) => Ok((self.session_agent(s), None)),
            Scope::Sessionless if tool == CHECKIN => {
                let owner = req.principal.session_owner(&self.registry);
                self.room_for_handle(req.now, &owner)?;
                use rand_chacha::rand_core::RngCore;
                let mut bytes = [0u8; 16];
                self.rng.fill_bytes(&mut bytes);
                let handle = crate::agents::issue(bytes, self.agent_key(), owner.as_deref());
                let name = self.coordination.name_of(&handle);
                self.coordination
                    .handles
                    .insert(name.clone(), handle.clone());
                self.coordination.handle_use.insert(
                    name.clone(),
                    HandleUse {
                        owner,
                        last_used: req.now,
                    },
                );
                Ok((name, Some(handle)))
            }
            Scope::Sessionless => Err(RpcError::NoAgent { tool }),
        }
    }

    /// Makes room for one more handle of `owner`: at a quota (the table's, `max_sessions`, or
    /// the identity's, `max_sessions_per_identity`), handles unused for the session idle TTL
    /// whose agents hold no lease and are present nowhere are forgotten first; if that frees
    /// nothing, the quota's limit error.
    fn room_for_handle(&mut self, now: Instant, owner: &Option<String>) -> Result<(), RpcError> {
        let table = self.config.max_sessions;
        let per_identity = self.config.max_sessions_per_identity;
        let full = |c: &Coordination| {
            let mine = c
                .handle_use
                .values()
                .filter(|u| u.owner.is_some() && u.owner == *owner)
                .count();
            if c.handles.len() >= table {
                Some(table)
            } else if owner.is_some() && mine >= per_identity {
                Some(per_identity)
            } else {
                None
            }
        };
        if full(&self.coordination).is_none() {
            return Ok(());
        }
        self.expire_handles(now);
        match full(&self.coordination) {
            None => Ok(()),
            Some(max) => Err(coord_error(
                CHECKIN,
                CoordError::Limit {
                    which: crate::coord::CoordLimit::Handles,
                    max,
                },
            )),
        }
    }

    /// Forgets the handles unused for the session idle TTL whose agents hold no lease and are
    /// present nowhere: such a handle is then unknown (`unknown_agent`), as one never issued.
    pub(in crate::gateway) fn expire_handles(&mut self, now: Instant) {
        let Some(cutoff) = now.checked_sub(self.config.session_idle_ttl) else {
            return;
        };
        #[cfg(feature = "planted-bugs")]
        let leases_count = self.config.planted != Some(PlantedBug::HandleExpiryIgnoresLeases);
        #[cfg(not(feature = "planted-bugs"))]
        let leases_count = true;
        let c = &self.coordination;
        let stale: Vec<String> = c
            .handle_use
            .iter()
            .filter(|(name, u)| {
                u.last_used < cutoff
                    && !(leases_count && c.coord.holds_leases(now, name))
                    && c.coord.present_in(now, name).is_empty()
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            self.coordination.handle_use.remove(&name);
            if let Some(handle) = self.coordination.handles.remove(&name) {
                self.coordination.forget_name(&handle);
            }
        }
    }

    /// The key agent handles are issued under: the cluster's, or a single gateway's own.
    fn agent_key(&self) -> Option<&crate::agents::AgentKey> {
        match self.config.cluster.as_ref() {
            Some(c) => c.agent_key.as_ref(),
            None => self.config.agent_key.as_ref(),
        }
    }

    /// Whether `handle` was issued to the identity `owner` under this gateway's key: by
    /// another replica under the cluster's (or, during a roll of the cluster secret, the
    /// previous one), or by this gateway before a restart under its own.
    fn issued_under_our_key(&self, handle: &str, owner: Option<&str>) -> bool {
        let keys = match self.config.cluster.as_ref() {
            Some(c) => [c.agent_key.as_ref(), c.previous_agent_key.as_ref()],
            None => [self.config.agent_key.as_ref(), None],
        };
        keys.into_iter()
            .flatten()
            .any(|k| crate::agents::verify(handle, k, owner))
    }

    /// The public name of the agent behind a handle its caller presents: one issued here to
    /// the caller's identity, or (in a cluster) one another replica issued to it under the
    /// cluster's key, which is then known here too. `None`: a handle nobody issued, one
    /// forgotten after it went unused, or one issued to another identity (answered alike, so
    /// a caller learns nothing of another's handles).
    fn handle_agent(&mut self, req: &Req<'_>, handle: &str) -> Result<Option<String>, RpcError> {
        let owner = req.principal.session_owner(&self.registry);
        if let Some(name) = self.coordination.known_name(handle) {
            #[cfg(feature = "planted-bugs")]
            let owner_counts = self.config.planted != Some(PlantedBug::HandleAcrossIdentities);
            #[cfg(not(feature = "planted-bugs"))]
            let owner_counts = true;
            let issued = self.coordination.handles.get(name).map(String::as_str) == Some(handle)
                && (!owner_counts
                    || self
                        .coordination
                        .handle_use
                        .get(name)
                        .is_some_and(|u| u.owner == owner));
            let name = name.to_owned();
            if issued {
                if let Some(u) = self.coordination.handle_use.get_mut(&name) {
                    u.last_used = req.now;
                }
            }
            return Ok(issued.then_some(name));
        }
        if !self.issued_under_our_key(handle, owner.as_deref()) {
            return Ok(None);
        }
        self.room_for_handle(req.now, &owner)?;
        let name = self.coordination.name_of(handle);
        self.coordination
            .handles
            .insert(name.clone(), handle.to_owned());
        self.coordination.handle_use.insert(
            name.clone(),
            HandleUse {
                owner,
                last_used: req.now,
            },
        );
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
        let Some(name) = self.coordination.forget_name(session) else {
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
        req: &Req<'_>,
        handle: Option<&Value>,
    ) -> Result<Option<String>, RpcError> {
        if let Some(h) = handle {
            let known = match h.as_str() {
                Some(h) => self.handle_agent(req, h)?,
                None => None,
            };
            return known
                .map(Some)
                .ok_or(RpcError::UnknownAgent { tool: "tools/call" });
        }
        Ok(match req.scope {
            Scope::Session(s) => Some(self.session_agent(s)),
            Scope::Sessionless => None,
        })
    }
}
