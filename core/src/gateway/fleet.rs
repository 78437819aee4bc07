//! The fleet: sled identity pins (story 1206), health (heartbeats, HTTP probes of projects
//! without an uplink, relay staleness) and the fan-out of `aggregate_pipeline_status`.
//!
//! Everything here is a decision on the `now` it is given: the driver carries out
//! [`Output::Probe`] and [`Output::SavePins`], and reports probes back with
//! [`Input::ProbeDone`].

use std::collections::BTreeMap;

use rand_chacha::rand_core::RngCore;

use super::*;
use crate::identity::{self, Pin, Pins};

/// The sled tool `aggregate_pipeline_status` calls on every project.
pub(super) const PIPELINE_TOOL: &str = "pipeline_status";

/// The longest overall deadline a caller may ask of `aggregate_pipeline_status`.
const MAX_FANOUT_TIMEOUT: Duration = Duration::from_secs(60);

/// Relay event kinds are kept for display only; longer ones are cut.
const MAX_EVENT_KIND: usize = 64;

/// A refused identity: the latest attempt for a project, kept for `fleet_identity`.
#[derive(Debug, Clone)]
pub(super) struct Refusal {
    /// The key presented (None: none was).
    pub(super) key: Option<String>,
    pub(super) sled: String,
    pub(super) reason: String,
    pub(super) at: Instant,
    /// Attempts in a row with this key.
    pub(super) attempts: u64,
}

/// A finished HTTP probe.
#[derive(Debug, Clone)]
pub(super) struct ProbeRecord {
    pub(super) at: Instant,
    pub(super) took: Duration,
    pub(super) outcome: ProbeOutcome,
}

impl ProbeRecord {
    /// An HTTP answer below 500 means the project's server is there.
    fn ok(&self) -> bool {
        matches!(self.outcome, ProbeOutcome::Status(s) if s < 500)
    }
}

/// What the gateway knows of a project's health beyond its uplink.
#[derive(Debug, Default)]
pub(super) struct Health {
    /// When its current uplink went live.
    pub(super) connected_at: Option<Instant>,
    /// The last frame from its last uplink, kept when the uplink goes.
    pub(super) last_seen: Option<Instant>,
    /// The newest relay event.
    pub(super) last_event: Option<Instant>,
    pub(super) last_event_kind: Option<String>,
    pub(super) events: u64,
    /// A probe in flight.
    pub(super) probing: Option<ProbeId>,
    /// The last probe since the project last lost its uplink.
    pub(super) probe: Option<ProbeRecord>,
    /// The latest refused identity.
    pub(super) refused: Option<Refusal>,
}

/// One `aggregate_pipeline_status` call, waiting for its sleds.
#[derive(Debug)]
pub(super) struct Fanout {
    token: HttpToken,
    client_id: RawId,
    modern: bool,
    started: Instant,
    deadline: Instant,
    per_sled: Duration,
    parts: BTreeMap<String, Part>,
    waiting: usize,
}

#[derive(Debug)]
enum Part {
    Waiting {
        uplink: UplinkId,
        rpc_id: u64,
    },
    /// Asked of the replica that holds the project's sled (`gather.rs`).
    Relayed {
        token: HttpToken,
    },
    Answered(Answered),
    Failed {
        reason: &'static str,
        detail: String,
    },
}

impl Part {
    /// Still waiting for its answer.
    fn open(&self) -> bool {
        matches!(self, Part::Waiting { .. } | Part::Relayed { .. })
    }
}

/// A sled's pipeline status, taken apart when it arrives: its row of the answer, already
/// serialised, and what it adds to the fleet's totals. The rows are then only joined when the
/// last sled has answered.
#[derive(Debug)]
pub(super) struct Answered {
    row: String,
    total: u64,
    stages: BTreeMap<String, u64>,
    blocked: usize,
    failing: usize,
}

/// An HTTP probe in flight.
#[derive(Debug)]
pub(super) struct Probe {
    project: String,
    sent: Instant,
    deadline: Instant,
}

impl Gateway {
    /// Loads the pins kept from an earlier run (the pin file). Call before the first event.
    pub fn load_pins(&mut self, pins: Pins) {
        self.pins = pins;
    }

    /// The pins in force.
    pub fn pins(&self) -> &Pins {
        &self.pins
    }

    // ---- identity ----

    /// After a hello (its token already checked): a sled with a key is challenged; one without
    /// is accepted unless its project has a pin or identity is required.
    pub(super) fn hello_identity(
        &mut self,
        now: Instant,
        id: UplinkId,
        project: String,
        sled: String,
        key: Option<String>,
    ) {
        let Some(key) = key else {
            if self.pins.get(&project).is_some() {
                let reason = format!(
                    "project '{project}' has a pinned identity key and the hello presented none"
                );
                return self.refuse_identity(now, id, &project, sled, None, reason);
            }
            if self.config.require_identity {
                let reason =
                    "this gateway requires every sled to present an identity key".to_owned();
                return self.refuse_identity(now, id, &project, sled, None, reason);
            }
            return self.accept_uplink(now, id, project, sled, None);
        };
        let verifying = match identity::parse_key(&key) {
            Ok(k) => k,
            Err(e) => {
                let reason = format!("the hello's key is unusable: {e}");
                return self.refuse_identity(now, id, &project, sled, None, reason);
            }
        };
        let mut nonce = [0u8; 32];
        self.rng.fill_bytes(&mut nonce);
        let challenge = Control::Challenge {
            nonce: identity::encode_bytes(&nonce),
        };
        if let Some(uplink) = self.uplinks.get_mut(&id) {
            uplink.state = UplinkState::AwaitingProof(Box::new(Proving {
                project,
                sled,
                key,
                verifying,
                nonce,
            }));
            self.outputs.push_back(Output::UplinkSend {
                uplink: id,
                text: challenge.to_text(),
            });
        }
    }

    /// The sled's signature of its challenge: verified, then its key is checked against the
    /// project's pin (or pinned, the first time).
    pub(super) fn on_proof(&mut self, now: Instant, id: UplinkId, signature: &str) {
        let Some(uplink) = self.uplinks.get_mut(&id) else {
            return;
        };
        let proving = match std::mem::replace(&mut uplink.state, UplinkState::AwaitingHello) {
            UplinkState::AwaitingProof(p) => *p,
            other => {
                uplink.state = other;
                return;
            }
        };
        let Proving {
            project,
            sled,
            key,
            verifying,
            nonce,
        } = proving;
        if let Err(e) = identity::verify_challenge(&verifying, &project, &nonce, signature) {
            let reason = format!("the identity proof failed: {e}");
            return self.refuse_identity(now, id, &project, sled, Some(key), reason);
        }
        if self.registry.get(&project).is_none() {
            // Unregistered by a reload while it was proving itself.
            return self.close_uplink(
                now,
                id,
                CloseCode::UnknownProject,
                format!("project '{project}' is no longer registered"),
            );
        }
        match self.pins.get(&project) {
            Some(pin) if pin.key == key => {}
            Some(pin) => {
                let reason = format!(
                    "project '{project}' is pinned to key {}; this sled presented {key}",
                    pin.key
                );
                return self.refuse_identity(now, id, &project, sled, Some(key), reason);
            }
            // In a cluster, the first use is one create in the engine: the uplink waits for it.
            None if self.cluster.is_some() => {
                return self.create_pin(now, id, project, sled, key);
            }
            None => {
                tracing::info!(project, sled, key, "sled identity pinned on first use");
                self.pins.pins.insert(
                    project.clone(),
                    Pin {
                        key: key.clone(),
                        sled: sled.clone(),
                    },
                );
                self.save_pins_soon(now);
            }
        }
        self.accept_uplink(now, id, project, sled, Some(key));
    }

    pub(super) fn refuse_identity(
        &mut self,
        now: Instant,
        id: UplinkId,
        project: &str,
        sled: String,
        key: Option<String>,
        reason: String,
    ) {
        tracing::warn!(
            uplink = id.0,
            project,
            sled,
            "sled identity refused: {reason}"
        );
        if let Some(state) = self.projects.get_mut(project) {
            let attempts = match &state.health.refused {
                Some(r) if r.key == key => r.attempts + 1,
                _ => 1,
            };
            state.health.refused = Some(Refusal {
                key,
                sled,
                reason: reason.clone(),
                at: now,
                attempts,
            });
        }
        self.close_uplink(now, id, CloseCode::IdentityRefused, reason);
    }

    /// Saves the pins by [`Config::pin_save_delay`] from now, with whatever else changes
    /// until then: one save (of the whole file) for a fleet pinned in a burst.
    pub(super) fn save_pins_soon(&mut self, now: Instant) {
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
    pub(super) fn save_pins_now(&mut self) {
        if let Some(at) = self.pins_save_at.take() {
            self.timers.remove(&(at, Timer::SavePins));
        }
        self.outputs.push_back(Output::SavePins {
            text: self.pins.to_toml(),
        });
    }

    /// `fleet_identity`: every project's pinned key against its live sled's, and refused
    /// attempts; or, with `action: "repin"`, a re-pin of one project to its refused key.
    pub(super) fn fleet_identity(
        &mut self,
        req: &Req<'_>,
        arguments: &Map<String, Value>,
    ) -> Result<String, RpcError> {
        let now = req.now;
        client::only_arguments(FLEET_IDENTITY, arguments, &["action", "project", "key"])?;
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
            return r;
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
        Ok(client::tool_result(json!({
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
        let state = self
            .projects
            .get_mut(project)
            .expect("registered projects have a state");
        let Some(Refusal {
            key: Some(refused),
            sled,
            ..
        }) = state.health.refused.clone()
        else {
            return Err(bad(format!(
                "project '{project}' has no refused key to re-pin to: a re-pin accepts the key of the last sled refused for it (fleet_identity shows it)"
            )));
        };
        if let Some(k) = key {
            if k != refused {
                return Err(bad(format!(
                    "the key given is not the one last refused for project '{project}' ({refused}); nothing changed"
                )));
            }
        }
        state.health.refused = None;
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
        Ok(client::tool_result(json!({
            "action": "repin",
            "project": project,
            "previous": previous,
            "pinned": refused,
            "sled": sled,
            "closed_live_uplink": closed,
            "note": "the sled presenting the pinned key is accepted at its next connection",
        })))
    }

    // ---- relay ----

    pub(super) fn on_relay_event(&mut self, now: Instant, id: UplinkId, kind: &str) {
        let Some(project) = self.live_project(id) else {
            return;
        };
        if let Some(state) = self.projects.get_mut(&project) {
            let h = &mut state.health;
            h.last_event = Some(now);
            h.events += 1;
            let mut kind = kind.to_owned();
            if kind.len() > MAX_EVENT_KIND {
                let mut end = MAX_EVENT_KIND;
                while !kind.is_char_boundary(end) {
                    end -= 1;
                }
                kind.truncate(end);
            }
            h.last_event_kind = Some(kind);
        }
    }

    // ---- probes ----

    /// Arms the probe round, unless it is armed, the gateway stops, or probes are off.
    pub(super) fn arm_probes(&mut self, now: Instant) {
        if self.probes_armed || self.shutting_down || self.config.probe_interval.is_zero() {
            return;
        }
        self.probes_armed = true;
        self.timers
            .insert((now + self.config.probe_interval, Timer::ProbeRound));
    }

    pub(super) fn on_probe_round(&mut self, now: Instant) {
        self.probes_armed = false;
        if self.shutting_down {
            return;
        }
        let due: Vec<String> = self
            .registry
            .projects()
            .iter()
            .filter(|p| !p.url.is_empty())
            .filter(|p| {
                self.projects
                    .get(&p.name)
                    .is_some_and(|s| s.uplink.is_none() && s.health.probing.is_none())
            })
            .map(|p| p.name.clone())
            .collect();
        for project in due {
            self.start_probe(now, project);
        }
        self.arm_probes(now);
    }

    /// Asks the driver to probe a project's url now.
    pub(super) fn start_probe(&mut self, now: Instant, project: String) {
        if self.shutting_down || self.config.probe_interval.is_zero() {
            return;
        }
        let Some((_, spec)) = self.registry.get(&project) else {
            return;
        };
        if spec.url.is_empty() {
            return;
        }
        let url = spec.url.clone();
        let Some(state) = self.projects.get_mut(&project) else {
            return;
        };
        if state.health.probing.is_some() {
            return;
        }
        let probe = ProbeId(self.next_probe);
        self.next_probe += 1;
        state.health.probing = Some(probe);
        let deadline = now + self.config.probe_timeout;
        self.probes.insert(
            probe,
            Probe {
                project: project.clone(),
                sent: now,
                deadline,
            },
        );
        self.timers.insert((deadline, Timer::Probe(probe)));
        self.outputs.push_back(Output::Probe {
            probe,
            project,
            url,
            timeout: self.config.probe_timeout,
        });
    }

    pub(super) fn on_probe_done(&mut self, now: Instant, probe: ProbeId, outcome: ProbeOutcome) {
        let Some(p) = self.probes.remove(&probe) else {
            return;
        };
        self.timers.remove(&(p.deadline, Timer::Probe(probe)));
        self.end_probe(now, probe, p, outcome);
    }

    pub(super) fn on_probe_deadline(&mut self, now: Instant, probe: ProbeId) {
        let Some(p) = self.probes.remove(&probe) else {
            return;
        };
        let outcome = ProbeOutcome::Failed(format!(
            "no answer within {} ms",
            millis(self.config.probe_timeout)
        ));
        self.end_probe(now, probe, p, outcome);
    }

    fn end_probe(&mut self, now: Instant, probe: ProbeId, p: Probe, outcome: ProbeOutcome) {
        let Some(state) = self.projects.get_mut(&p.project) else {
            return;
        };
        if state.health.probing != Some(probe) {
            return;
        }
        state.health.probing = None;
        tracing::debug!(project = p.project, ?outcome, "health probe ended");
        state.health.probe = Some(ProbeRecord {
            at: now,
            took: now.saturating_duration_since(p.sent),
            outcome,
        });
    }

    /// Forgets probes and their timers (shutdown).
    pub(super) fn stop_probes(&mut self) {
        for (probe, p) in std::mem::take(&mut self.probes) {
            self.timers.remove(&(p.deadline, Timer::Probe(probe)));
        }
        self.timers.retain(|(_, t)| *t != Timer::ProbeRound);
        self.probes_armed = false;
    }

    // ---- gateway_health ----

    /// This replica's `gateway_health` result (`gather.rs` adds the other replicas' rows).
    pub(super) fn gateway_health(
        &self,
        req: &Req<'_>,
        arguments: &Map<String, Value>,
    ) -> Result<Value, RpcError> {
        let now = req.now;
        client::only_arguments(GATEWAY_HEALTH, arguments, &[])?;
        let stale_heartbeat = self.config.heartbeat_interval * 2;
        let threshold = self.config.relay_stale_after;
        let mut rows = Vec::new();
        let mut summary: BTreeMap<&str, Vec<String>> = ["up", "down", "stale", "unknown"]
            .into_iter()
            .map(|s| (s, Vec::new()))
            .collect();
        for spec in self.registry.projects() {
            if !self.sees(req.principal, &spec.name) {
                continue;
            }
            let state = &self.projects[&spec.name];
            let h = &state.health;
            let uplink = state.uplink.and_then(|u| self.uplinks.get(&u));
            let mut reasons: Vec<String> = Vec::new();
            let heard = uplink.map(|u| u.last_rx).or(h.last_seen);
            // The relay, measured from its newest event, or from the connection when the sled
            // has sent none since.
            let relay_since = match (h.last_event, h.connected_at, uplink.is_some()) {
                (Some(e), _, _) => Some(e),
                (None, Some(c), true) => Some(c),
                (None, _, _) => None,
            };
            let relay_age = relay_since.map(|t| now.saturating_duration_since(t));
            let relay_status = match relay_age {
                None => "none",
                Some(age) if age > threshold => "stale",
                Some(_) => "fresh",
            };
            let (status, via) = match uplink {
                Some(u) => {
                    let silent = now.saturating_duration_since(u.last_rx);
                    if silent > stale_heartbeat {
                        reasons.push(format!(
                            "no heartbeat for {} ms (expected every {} ms)",
                            millis(silent),
                            millis(self.config.heartbeat_interval)
                        ));
                    }
                    if relay_status == "stale" {
                        let age = relay_age.unwrap_or_default();
                        reasons.push(match h.last_event {
                            Some(_) => format!(
                                "relay: no event for {} ms (threshold {} ms)",
                                millis(age),
                                millis(threshold)
                            ),
                            None => format!(
                                "relay: no event since the sled connected {} ms ago (threshold {} ms)",
                                millis(age),
                                millis(threshold)
                            ),
                        });
                    }
                    (if reasons.is_empty() { "up" } else { "stale" }, "uplink")
                }
                None => match &h.probe {
                    Some(p) if p.ok() => {
                        reasons.push(format!(
                            "no uplink; its url answered HTTP {} {} ms ago",
                            probe_status(&p.outcome),
                            millis(now.saturating_duration_since(p.at))
                        ));
                        ("up", "http")
                    }
                    Some(p) => {
                        reasons.push(format!(
                            "no uplink, and probing its url failed: {}",
                            probe_detail(&p.outcome)
                        ));
                        ("down", "http")
                    }
                    None => match (
                        h.last_seen,
                        spec.url.is_empty() || self.config.probe_interval.is_zero(),
                    ) {
                        (Some(seen), _) => {
                            reasons.push(format!(
                                "uplink lost; last heard {} ms ago{}",
                                millis(now.saturating_duration_since(seen)),
                                if h.probing.is_some() {
                                    "; probing its url"
                                } else {
                                    ""
                                }
                            ));
                            ("down", "uplink")
                        }
                        (None, true) => {
                            reasons.push("no uplink, and no url to probe".into());
                            ("down", "none")
                        }
                        (None, false) => {
                            reasons.push("no uplink yet; its url has not been probed yet".into());
                            ("unknown", "none")
                        }
                    },
                },
            };
            summary.entry(status).or_default().push(spec.name.clone());
            rows.push(json!({
                "project": spec.name,
                "sled": spec.sled,
                "status": status,
                "via": via,
                "reasons": reasons,
                "uplink": uplink.is_some(),
                "last_heartbeat_ms_ago": heard.map(|t| millis(now.saturating_duration_since(t))),
                "connected_ms_ago": uplink.and(h.connected_at).map(|t| millis(now.saturating_duration_since(t))),
                "probe": h.probe.as_ref().map(|p| json!({
                    "url": spec.url,
                    "ok": p.ok(),
                    "status": match p.outcome { ProbeOutcome::Status(s) => Some(s), ProbeOutcome::Failed(_) => None },
                    "error": match &p.outcome { ProbeOutcome::Failed(e) => Some(e), ProbeOutcome::Status(_) => None },
                    "ms_ago": millis(now.saturating_duration_since(p.at)),
                    "took_ms": millis(p.took),
                })),
                "relay": {
                    "status": relay_status,
                    "last_event_ms_ago": h.last_event.map(|t| millis(now.saturating_duration_since(t))),
                    "last_kind": h.last_event_kind,
                    "events": h.events,
                    "threshold_ms": millis(threshold),
                },
            }));
        }
        Ok(json!({
            "projects": rows,
            "summary": summary,
            "heartbeat_ms": millis(self.config.heartbeat_interval),
            "probe_interval_ms": millis(self.config.probe_interval),
        }))
    }

    // ---- aggregate_pipeline_status ----

    /// Sends `pipeline_status` to every registered project's sled at once; answers when all
    /// have answered or failed, or at the overall deadline, naming every project that did not
    /// answer and why.
    pub(super) fn aggregate_pipeline_status(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        modern: bool,
        arguments: &Map<String, Value>,
    ) -> Result<Served, RpcError> {
        let Req { now, token, .. } = *req;
        client::only_arguments(
            AGGREGATE_PIPELINE_STATUS,
            arguments,
            &["timeout_ms", "per_project_timeout_ms"],
        )?;
        let ms = |name: &str, default: Duration| -> Result<Duration, RpcError> {
            match arguments.get(name) {
                None => Ok(default),
                Some(v) => match v.as_u64() {
                    Some(n) if n >= 1 && Duration::from_millis(n) <= MAX_FANOUT_TIMEOUT => {
                        Ok(Duration::from_millis(n))
                    }
                    _ => Err(RpcError::InvalidParams {
                        method: AGGREGATE_PIPELINE_STATUS.into(),
                        detail: format!(
                            "`{name}` must be a whole number of milliseconds from 1 to {}, not {v}",
                            millis(MAX_FANOUT_TIMEOUT)
                        ),
                    }),
                },
            }
        };
        let overall = ms("timeout_ms", self.config.fanout_timeout)?;
        let per_sled = ms(
            "per_project_timeout_ms",
            self.config.fanout_sled_timeout.min(overall),
        )?
        .min(overall);
        let fanout_id = self.next_fanout;
        self.next_fanout += 1;
        let mut parts = BTreeMap::new();
        let mut waiting = 0;
        let names = self.visible_projects(req.principal);
        let params = json!({ "name": PIPELINE_TOOL, "arguments": {} }).to_string();
        for project in names {
            let part = self.send_pipeline_status(req, fanout_id, &project, per_sled, &params);
            if part.open() {
                waiting += 1;
            }
            parts.insert(project, part);
        }
        let fanout = Fanout {
            token,
            client_id: id.clone(),
            modern,
            started: now,
            deadline: now + overall,
            per_sled,
            parts,
            waiting,
        };
        if waiting == 0 {
            return Ok(Served::Now(fanout_result(now, fanout, overall)));
        }
        self.timers
            .insert((fanout.deadline, Timer::Fanout(fanout_id)));
        self.fanout_by_token.insert(token, fanout_id);
        self.fanouts.insert(fanout_id, (fanout, overall));
        Ok(Served::Later)
    }

    fn send_pipeline_status(
        &mut self,
        req: &Req<'_>,
        fanout: u64,
        project: &str,
        per_sled: Duration,
        params: &str,
    ) -> Part {
        let state = &self.projects[project];
        let Some(uplink_id) = state.uplink else {
            // In a cluster, another replica may hold its sled: asked there.
            if let Some(token) = self.relay_pipeline_part(req, fanout, project, per_sled) {
                return Part::Relayed { token };
            }
            let sled = self.sled_of(project);
            return Part::Failed {
                reason: "no_uplink",
                detail: format!("sled '{sled}' is not connected"),
            };
        };
        if state
            .tools
            .as_ref()
            .is_some_and(|ts| !ts.iter().any(|t| t.name == PIPELINE_TOOL))
        {
            return Part::Failed {
                reason: "error",
                detail: format!("the sled does not list a `{PIPELINE_TOOL}` tool"),
            };
        }
        let uplink = self
            .uplinks
            .get_mut(&uplink_id)
            .expect("a project's live uplink exists");
        if self.calls.on_uplink(uplink_id) >= self.config.max_calls_per_sled {
            self.counters.calls_refused += 1;
            self.call_metrics
                .count(PIPELINE_TOOL, project, Outcome::Refused);
            return Part::Failed {
                reason: "error",
                detail: format!(
                    "the sled has {} calls in flight, its limit (max_calls_per_sled)",
                    self.config.max_calls_per_sled
                ),
            };
        }
        let rpc_id = uplink.next_id;
        uplink.next_id += 1;
        let now = req.now;
        self.calls.start(
            (uplink_id, rpc_id),
            Pending::FanoutPart {
                fanout,
                project: project.to_owned(),
                sent_at: now,
                deadline: now + per_sled,
            },
        );
        self.counters.calls_forwarded += 1;
        self.outputs.push_back(Output::UplinkSend {
            uplink: uplink_id,
            text: jsonrpc::request(rpc_id, "tools/call", params),
        });
        Part::Waiting {
            uplink: uplink_id,
            rpc_id,
        }
    }

    /// A sled's answer to its part of a fan-out (its pending entry already removed).
    pub(super) fn on_fanout_answer(
        &mut self,
        now: Instant,
        fanout: u64,
        project: String,
        sent_at: Instant,
        result: Option<&RawValue>,
        error: Option<&RawValue>,
    ) {
        let took = now.saturating_duration_since(sent_at);
        let (part, outcome) = match (result, error) {
            (Some(r), None) => match parse_pipeline_status(r.get(), &project, took) {
                Ok(answered) => (Part::Answered(answered), Outcome::Ok),
                Err(detail) => (
                    Part::Failed {
                        reason: "error",
                        detail,
                    },
                    Outcome::Error,
                ),
            },
            (None, Some(e)) => {
                let message = serde_json::from_str::<Value>(e.get())
                    .ok()
                    .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_else(|| e.get().to_owned());
                (
                    Part::Failed {
                        reason: "error",
                        detail: format!("the sled answered with an error: {message}"),
                    },
                    Outcome::Error,
                )
            }
            _ => {
                self.counters.frames_invalid += 1;
                (
                    Part::Failed {
                        reason: "error",
                        detail: "the sled's response had neither a result nor an error".into(),
                    },
                    Outcome::BadResponse,
                )
            }
        };
        self.call_metrics.count(PIPELINE_TOOL, &project, outcome);
        self.call_metrics.observe(&project, took);
        self.settle_part(now, fanout, &project, part);
    }

    /// A fan-out part that will get no answer: its sled's deadline passed or its uplink went.
    pub(super) fn fail_fanout_part(
        &mut self,
        now: Instant,
        fanout: u64,
        project: &str,
        reason: &'static str,
        detail: String,
        outcome: Outcome,
    ) {
        self.call_metrics.count(PIPELINE_TOOL, project, outcome);
        self.settle_part(now, fanout, project, Part::Failed { reason, detail });
    }

    pub(super) fn fanout_sled_timeout(&self, fanout: u64) -> Duration {
        self.fanouts
            .get(&fanout)
            .map_or(Duration::ZERO, |(f, _)| f.per_sled)
    }

    fn settle_part(&mut self, now: Instant, fanout: u64, project: &str, part: Part) {
        let Some((f, _)) = self.fanouts.get_mut(&fanout) else {
            return;
        };
        let Some(slot) = f.parts.get_mut(project) else {
            return;
        };
        if !slot.open() {
            return;
        }
        *slot = part;
        f.waiting -= 1;
        if f.waiting == 0 {
            self.finish_fanout(now, fanout);
        }
    }

    /// The overall deadline: every sled still waited for is given up on.
    pub(super) fn on_fanout_deadline(&mut self, now: Instant, fanout: u64) {
        let Some((f, overall)) = self.fanouts.get_mut(&fanout) else {
            return;
        };
        let overall = *overall;
        let late: Vec<(String, Part)> = f
            .parts
            .iter()
            .filter_map(|(p, part)| match part {
                Part::Waiting { uplink, rpc_id } => Some((
                    p.clone(),
                    Part::Waiting {
                        uplink: *uplink,
                        rpc_id: *rpc_id,
                    },
                )),
                Part::Relayed { token } => Some((p.clone(), Part::Relayed { token: *token })),
                _ => None,
            })
            .collect();
        for (project, part) in late {
            match part {
                Part::Waiting { uplink, rpc_id } => {
                    self.calls.take((uplink, rpc_id));
                    self.send_cancelled(
                        uplink,
                        rpc_id,
                        "the gateway's overall deadline for aggregate_pipeline_status passed",
                    );
                }
                Part::Relayed { token } => self.abort_part(token),
                _ => {}
            }
            if let Some((f, _)) = self.fanouts.get_mut(&fanout) {
                if let Some(slot) = f.parts.get_mut(&project) {
                    *slot = Part::Failed {
                        reason: "timed_out",
                        detail: format!(
                            "no answer before the overall deadline of {} ms",
                            millis(overall)
                        ),
                    };
                    f.waiting -= 1;
                }
            }
            self.counters.calls_timed_out += 1;
            self.call_metrics
                .count(PIPELINE_TOOL, &project, Outcome::Timeout);
        }
        self.finish_fanout(now, fanout);
    }

    fn finish_fanout(&mut self, now: Instant, fanout: u64) {
        let Some((f, overall)) = self.fanouts.remove(&fanout) else {
            return;
        };
        self.timers.remove(&(f.deadline, Timer::Fanout(fanout)));
        self.fanout_by_token.remove(&f.token);
        let (token, client_id, modern) = (f.token, f.client_id.clone(), f.modern);
        let result = fanout_result(now, f, overall);
        let body = if modern {
            jsonrpc::ok_response(client_id.as_str(), &modern::with_result_type(&result))
        } else {
            jsonrpc::ok_response(client_id.as_str(), &result)
        };
        self.reply(token, 200, Vec::new(), Some(body));
    }

    /// The client of a fan-out went away: its sleds' requests are cancelled.
    pub(super) fn abort_fanout(&mut self, token: HttpToken) -> bool {
        let Some(fanout) = self.fanout_by_token.remove(&token) else {
            return false;
        };
        let Some((f, _)) = self.fanouts.remove(&fanout) else {
            return true;
        };
        self.timers.remove(&(f.deadline, Timer::Fanout(fanout)));
        for (project, part) in f.parts {
            if let Part::Relayed { token } = part {
                self.abort_part(token);
                self.call_metrics
                    .count(PIPELINE_TOOL, &project, Outcome::Aborted);
            }
            if let Part::Waiting { uplink, rpc_id } = part {
                self.calls.take((uplink, rpc_id));
                self.send_cancelled(uplink, rpc_id, "the client went away");
                self.call_metrics
                    .count(PIPELINE_TOOL, &project, Outcome::Aborted);
            }
        }
        true
    }
}

/// A sled's identity while it proves it holds its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Proving {
    project: String,
    sled: String,
    /// The key as presented (base64).
    key: String,
    verifying: ed25519_dalek::VerifyingKey,
    nonce: [u8; 32],
}

/// The members of a `pipeline_status` tool result the aggregate reads, each kept raw.
#[derive(Deserialize)]
struct ToolAnswer<'a> {
    #[serde(borrow, default, rename = "isError")]
    is_error: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "structuredContent")]
    structured: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// A sled's pipeline status object, each member kept raw.
#[derive(Deserialize)]
struct StatusMembers<'a> {
    #[serde(borrow, default)]
    stages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    blocked: Option<&'a RawValue>,
    #[serde(borrow, default)]
    failing: Option<&'a RawValue>,
    #[serde(borrow, default)]
    total: Option<&'a RawValue>,
}

/// The text of a tool result's first content block, if it has one.
fn first_text(content: Option<&RawValue>) -> Option<String> {
    #[derive(Deserialize)]
    struct Block {
        text: Option<String>,
    }
    let blocks: Vec<&RawValue> = serde_json::from_str(content?.get()).ok()?;
    serde_json::from_str::<Block>(blocks.first()?.get())
        .ok()?
        .text
}

/// A `pipeline_status` tool result, reduced to what the aggregate shows: the sled's `stages`,
/// `blocked` and `failing` go into the row as the sled wrote them, read only to be counted.
fn parse_pipeline_status(result: &str, project: &str, took: Duration) -> Result<Answered, String> {
    let is_object = |s: &str| s.trim_start().starts_with('{');
    if !is_object(result) {
        return Err("not a tool result: a result must be a JSON object".into());
    }
    let answer: ToolAnswer = serde_json::from_str(result).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            format!("not JSON: {e}")
        } else {
            format!("not a tool result: {e}")
        }
    })?;
    if answer.is_error.is_some_and(|e| e.get() == "true") {
        let text = first_text(answer.content).unwrap_or_else(|| "(no text)".into());
        return Err(format!("{PIPELINE_TOOL} failed at the sled: {text}"));
    }
    match answer.structured.filter(|s| is_object(s.get())) {
        Some(s) => status_row(s.get(), project, took),
        None => {
            let unreadable =
                || format!("{PIPELINE_TOOL} answered without structured content or a JSON text");
            let text = first_text(answer.content).ok_or_else(unreadable)?;
            if !is_object(&text) || serde_json::from_str::<&RawValue>(&text).is_err() {
                return Err(unreadable());
            }
            status_row(&text, project, took)
        }
    }
}

/// The row and counts of one status object's text.
fn status_row<'a>(status: &'a str, project: &str, took: Duration) -> Result<Answered, String> {
    let m: StatusMembers<'a> =
        serde_json::from_str(status).map_err(|e| format!("{PIPELINE_TOOL}'s status: {e}"))?;
    // `stages`, `blocked` and `failing` go into the row as the sled wrote them: read only to
    // be checked and counted, never serialised again.
    let no_stages = || format!("{PIPELINE_TOOL}'s answer has no `stages` object of counts");
    let stages_raw = m.stages.ok_or_else(no_stages)?.get();
    let stages: BTreeMap<String, u64> =
        serde_json::from_str(stages_raw).map_err(|_| no_stages())?;
    let list = |raw: Option<&'a RawValue>, k: &str| match raw {
        None => Ok(("[]", 0)),
        Some(r) => serde_json::from_str::<Vec<&RawValue>>(r.get())
            .map(|items| (r.get(), items.len()))
            .map_err(|_| format!("{PIPELINE_TOOL}'s `{k}` is not a list")),
    };
    let (blocked, n_blocked) = list(m.blocked, "blocked")?;
    let (failing, n_failing) = list(m.failing, "failing")?;
    let total = m
        .total
        .and_then(|t| serde_json::from_str::<u64>(t.get()).ok())
        .unwrap_or_else(|| stages.values().fold(0u64, |sum, n| sum.saturating_add(*n)));
    // In serde_json's (sorted) key order, as the other rows are.
    let row = format!(
        r#"{{"blocked":{blocked},"failing":{failing},"project":{},"stages":{stages_raw},"status":"ok","took_ms":{},"total":{total}}}"#,
        Value::from(project),
        millis(took),
    );
    Ok(Answered {
        row,
        total,
        stages,
        blocked: n_blocked,
        failing: n_failing,
    })
}

fn fanout_result(now: Instant, f: Fanout, overall: Duration) -> String {
    let mut rows: Vec<String> = Vec::with_capacity(f.parts.len());
    let mut not_answered = Vec::new();
    let mut stages: BTreeMap<String, u64> = BTreeMap::new();
    let (mut stories, mut blocked, mut failing, mut answered) = (0u64, 0usize, 0usize, 0usize);
    let registered = f.parts.len();
    for (project, part) in f.parts {
        let (reason, detail) = match part {
            Part::Answered(a) => {
                answered += 1;
                // Saturating: the counts are a sled's to choose.
                stories = stories.saturating_add(a.total);
                for (stage, n) in &a.stages {
                    let sum = stages.entry(stage.clone()).or_default();
                    *sum = sum.saturating_add(*n);
                }
                blocked += a.blocked;
                failing += a.failing;
                rows.push(a.row);
                continue;
            }
            Part::Failed { reason, detail } => (reason, detail),
            // Only finished fan-outs are reported; the overall deadline settles every part.
            Part::Waiting { .. } | Part::Relayed { .. } => {
                ("timed_out", "no answer yet".to_owned())
            }
        };
        rows.push(json!({ "project": project, "status": reason, "detail": detail }).to_string());
        not_answered.push(json!({ "project": project, "reason": reason, "detail": detail }));
    }
    let totals = json!({
        "registered": registered,
        "answered": answered,
        "not_answered": registered - answered,
        "stories": stories,
        "stages": stages,
        "blocked": blocked,
        "failing": failing,
    });
    let deadlines = json!({ "overall": millis(overall), "per_project": millis(f.per_sled) });
    let not_answered = Value::Array(not_answered).to_string();
    let took = millis(now.saturating_duration_since(f.started));
    // The object by hand around the rows serialised as they came (keys in serde_json's sorted
    // order, as a `Value` would write them): the last answer only joins them.
    let mut out = String::with_capacity(rows.iter().map(|r| r.len() + 1).sum::<usize>() + 512);
    out.push_str(r#"{"deadline_ms":"#);
    out.push_str(&deadlines.to_string());
    out.push_str(r#","not_answered":"#);
    out.push_str(&not_answered);
    out.push_str(r#","projects":["#);
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(row);
    }
    out.push_str(r#"],"took_ms":"#);
    out.push_str(&took.to_string());
    out.push_str(r#","totals":"#);
    out.push_str(&totals.to_string());
    out.push('}');
    client::tool_result_raw(&out)
}

fn probe_status(o: &ProbeOutcome) -> String {
    match o {
        ProbeOutcome::Status(s) => s.to_string(),
        ProbeOutcome::Failed(_) => "-".into(),
    }
}

fn probe_detail(o: &ProbeOutcome) -> String {
    match o {
        ProbeOutcome::Status(s) => format!("HTTP {s}"),
        ProbeOutcome::Failed(e) => e.clone(),
    }
}

/// Whole milliseconds, for JSON.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(result: Value) -> Result<(Value, Answered), String> {
        let a = parse_pipeline_status(&result.to_string(), "alpha", Duration::from_millis(7))?;
        let row: Value = serde_json::from_str(&a.row).expect("a row is JSON");
        Ok((row, a))
    }

    #[test]
    fn a_pipeline_status_becomes_a_row_and_its_counts() {
        let status = json!({"total": 5, "stages": {"backlog": 3, "done": 2},
            "blocked": [{"id": "s1"}], "failing": [], "extra": "dropped"});
        let (row, a) = parse(json!({"content": [{"type": "text", "text": "…"}],
            "structuredContent": status}))
        .unwrap();
        assert_eq!(
            row,
            json!({"project": "alpha", "status": "ok", "took_ms": 7, "total": 5,
                "stages": {"backlog": 3, "done": 2}, "blocked": [{"id": "s1"}], "failing": []})
        );
        assert_eq!((a.total, a.blocked, a.failing), (5, 1, 0));
        assert_eq!(a.stages.get("backlog"), Some(&3));

        // No total: the stages' sum. No lists: empty. Only a JSON text: read from the text.
        let text = json!({"stages": {"backlog": 1, "review": 4}}).to_string();
        let (row, a) = parse(json!({"content": [{"type": "text", "text": text}]})).unwrap();
        assert_eq!(a.total, 5);
        assert_eq!(row["blocked"], json!([]));
        assert_eq!(row["failing"], json!([]));
        // A structuredContent that is not an object falls back to the text too.
        let (_, a) = parse(json!({"content": [{"type": "text", "text": text}],
            "structuredContent": [1]}))
        .unwrap();
        assert_eq!(a.total, 5);
    }

    #[test]
    fn a_pipeline_status_that_cannot_be_read_is_an_error_naming_why() {
        let err = |result: Value| parse(result).expect_err("an error");
        assert!(
            err(json!({"isError": true, "content": [{"type": "text", "text": "db down"}]}))
                .contains("failed at the sled: db down")
        );
        assert!(
            err(json!({"content": [{"type": "text", "text": "not json"}]}))
                .contains("without structured content or a JSON text")
        );
        assert!(err(json!({"content": []})).contains("without structured content"));
        assert!(err(json!({"structuredContent": {"total": 1}})).contains("`stages`"));
        assert!(err(json!({"structuredContent": {"stages": {"a": -1}}})).contains("`stages`"));
        assert!(err(json!({"structuredContent": {"stages": {"a": 1.5}}})).contains("`stages`"));
        assert!(
            err(json!({"structuredContent": {"stages": {}, "blocked": 3}}))
                .contains("`blocked` is not a list")
        );
        assert!(
            err(json!({"structuredContent": {"stages": {}, "failing": {}}}))
                .contains("`failing` is not a list")
        );
        let e = parse_pipeline_status("{", "alpha", Duration::ZERO)
            .err()
            .unwrap();
        assert!(e.starts_with("not JSON"), "{e}");
        let e = parse_pipeline_status("[1]", "alpha", Duration::ZERO).expect_err("an array");
        assert!(e.starts_with("not a tool result"), "{e}");
        // Only the first content block is read.
        let text = json!({"stages": {"a": 2}}).to_string();
        let (_, a) =
            parse(json!({"content": [{"type": "text", "text": text}, {"text": 5}]})).unwrap();
        assert_eq!(a.total, 2);
        // isError that is not a bool is not an error flag.
        assert!(parse(json!({"isError": "yes", "structuredContent": {"stages": {}}})).is_ok());
        // Counts near the top of u64 saturate instead of overflowing.
        let (_, a) =
            parse(json!({"structuredContent": {"stages": {"a": u64::MAX, "b": 1}}})).unwrap();
        assert_eq!(a.total, u64::MAX);
    }
}
