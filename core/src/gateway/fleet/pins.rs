//! Sled identity pins (story 1206): loaded and saved, re-pinned by an operator, and the
//! `fleet_identity` tool.

use super::*;

impl Gateway {
    /// Loads the pins kept from an earlier run (the pin file, or the store). Call before the
    /// first event.
    pub fn load_pins(&mut self, pins: Pins) {
        self.pins = pins;
    }

    /// The pins in force.
    pub fn pins(&self) -> &Pins {
        &self.pins
    }

    // ---- identity ----

    /// Saves the pins by [`Config::pin_save_delay`] from now, with whatever else changes
    /// until then: one save (of the whole file) for a fleet pinned in a burst.
    pub(in crate::gateway) fn save_pins_soon(&mut self, now: Instant) {
        if self.pins_in_store() {
            return;
        }
        if self.config.pin_save_delay.is_zero() {
            return self.save_pins_now();
        }
        if self.pins_save_at.is_none() {
            let at = now + self.config.pin_save_delay;
            self.timers.insert((at, Timer::SavePins));
            self.pins_save_at = Some(at);
        }
    }

    /// Saves the pins now; a save that was due later is then not needed.
    pub(in crate::gateway) fn save_pins_now(&mut self) {
        if let Some(at) = self.pins_save_at.take() {
            self.timers.remove(&(at, Timer::SavePins));
        }
        if self.pins_in_store() {
            return;
        }
        self.outputs.push_back(Output::SavePins {
            text: self.pins.to_toml(),
        });
    }

    /// `fleet_identity`: every project's pinned key against its live sled's, and refused
    /// attempts; or, with `action: "repin"`, a re-pin of one project to the key named (one
    /// refused for it, or a key provisioned before its sled first connects).
    pub(in crate::gateway) fn fleet_identity(
        &mut self,
        req: &Req<'_>,
        arguments: &Map<String, Value>,
    ) -> Result<Identity, RpcError> {
        let now = req.now;
        basics::only_arguments(FLEET_IDENTITY, arguments, &["action", "project", "key"])?;
        let bad = |detail: String| RpcError::InvalidParams {
            method: FLEET_IDENTITY.into(),
            detail,
        };
        let action = match arguments.get("action") {
            None => "show",
            Some(Value::String(a)) if a == "show" || a == "repin" => a.as_str(),
            Some(other) => {
                return Err(bad(format!(
                    "`action` must be \"show\" or \"repin\", not {other}"
                )))
            }
        };
        let project = match arguments.get("project") {
            None => None,
            Some(Value::String(p))
                if self.registry.get(p).is_some() && self.sees(req.principal, p) =>
            {
                Some(p.clone())
            }
            Some(Value::String(p)) => {
                return Err(RpcError::UnknownProject {
                    project: p.clone(),
                    registered: self.visible_projects(req.principal),
                })
            }
            Some(_) => return Err(bad("`project` must be a string".into())),
        };
        let key = match arguments.get("key") {
            None => None,
            Some(Value::String(k)) => Some(k.clone()),
            Some(_) => return Err(bad("`key` must be a string".into())),
        };
        if action == "repin" {
            let Some(project) = project else {
                return Err(bad(
                    "a re-pin must name its project: {\"action\":\"repin\",\"project\":\"<name>\"}"
                        .into(),
                ));
            };
            self.require(
                req.principal,
                &project,
                Right::Admin,
                format_args!("fleet_identity repin"),
            )?;
            let r = self.repin(now, &project, key.as_deref());
            tracing::info!(
                target: "audit",
                principal = self.principal_label(req.principal),
                project,
                tool = FLEET_IDENTITY,
                action = "repin",
                outcome = if r.is_ok() { "ok" } else { "error" },
                "admin action"
            );
            return r.map(Identity::Done);
        }
        if key.is_some() {
            return Err(bad("`key` is only taken with action \"repin\"".into()));
        }
        let mut rows = Vec::new();
        let mut summary: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for spec in self.registry.projects() {
            if project.as_deref().is_some_and(|p| p != spec.name)
                || !self.sees(req.principal, &spec.name)
            {
                continue;
            }
            let state = &self.projects[&spec.name];
            let live = state.uplink.and_then(|u| self.uplinks.get(&u));
            let pinned = self.pins.get(&spec.name);
            let status = match (live, pinned) {
                (None, _) => "offline",
                (Some(u), Some(p)) if u.key.as_deref() == Some(p.key.as_str()) => "verified",
                (Some(u), None) if u.key.is_none() => "unsigned",
                // Cannot happen: a live uplink's key is its project's pin.
                (Some(_), _) => "mismatch",
            };
            summary.entry(status).or_default().push(spec.name.clone());
            let refused = state.health.refused.as_ref().map(|r| {
                summary
                    .entry("refused")
                    .or_default()
                    .push(spec.name.clone());
                json!({
                    "key": r.key,
                    "sled": r.sled,
                    "reason": r.reason,
                    "attempts": r.attempts,
                    "last_ms_ago": millis(now.saturating_duration_since(r.at)),
                })
            });
            rows.push(json!({
                "project": spec.name,
                "sled": spec.sled,
                "status": status,
                "pinned": pinned.map(|p| &p.key),
                "live": live.and_then(|u| u.key.as_ref()),
                "refused": refused,
            }));
        }
        Ok(Identity::Rows(json!({
            "projects": rows,
            "summary": summary,
            "require_identity": self.config.require_identity,
        })))
    }

    fn repin(
        &mut self,
        now: Instant,
        project: &str,
        key: Option<&str>,
    ) -> Result<String, RpcError> {
        let bad = |detail: String| RpcError::InvalidParams {
            method: FLEET_IDENTITY.into(),
            detail,
        };
        // The key is named, never taken from whoever knocked last: on a project anyone can
        // reach, the last refused key may be an impostor's (security review finding 6).
        let Some(key) = key else {
            return Err(bad(format!(
                "a re-pin must name the key to pin: {{\"action\":\"repin\",\"project\":\"{project}\",\"key\":\"<base64 Ed25519 key>\"}} (fleet_identity shows the keys refused for it)"
            )));
        };
        if let Err(e) = crate::identity::parse_key(key) {
            return Err(bad(format!("`key` is not an Ed25519 public key: {e}")));
        }
        let refused = key.to_owned();
        let sled_named = self
            .registry
            .get(project)
            .map(|(_, spec)| spec.sled.clone());
        let state = self
            .projects
            .get_mut(project)
            .expect("registered projects have a state");
        let sled = match &state.health.refused {
            Some(Refusal {
                key: Some(k), sled, ..
            }) if *k == refused => sled.clone(),
            _ => sled_named.unwrap_or_default(),
        };
        if state
            .health
            .refused
            .as_ref()
            .is_some_and(|r| r.key.as_deref() == Some(refused.as_str()))
        {
            state.health.refused = None;
        }
        let live = state.uplink;
        let previous = self
            .pins
            .pins
            .insert(
                project.to_owned(),
                Pin {
                    key: refused.clone(),
                    sled: sled.clone(),
                },
            )
            .map(|p| p.key);
        tracing::warn!(
            project,
            previous,
            key = refused,
            "project re-pinned on request"
        );
        self.save_pins_now();
        self.store_pin(project);
        // A live uplink's key is always its project's pin: one with the old key goes.
        let mut closed = false;
        if let Some(u) = live {
            if self.uplinks.get(&u).and_then(|u| u.key.as_deref()) != Some(refused.as_str()) {
                closed = true;
                self.close_uplink(
                    now,
                    u,
                    CloseCode::IdentityRefused,
                    format!("project '{project}' was re-pinned to another key"),
                );
            }
        }
        Ok(basics::tool_result(json!({
            "action": "repin",
            "project": project,
            "previous": previous,
            "pinned": refused,
            "sled": sled,
            "closed_live_uplink": closed,
            "note": "the sled presenting the pinned key is accepted at its next connection",
        })))
    }
}

/// What `fleet_identity` comes to: a re-pin's answer, or the rows to show (in a cluster, the
/// rows of projects other replicas hold are taken from them: `gather.rs`).
pub(in crate::gateway) enum Identity {
    Done(String),
    Rows(Value),
}
