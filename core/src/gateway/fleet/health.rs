//! A project's health beyond its uplink: relay events, HTTP probes of projects without one, and
//! the `gateway_health` tool.

use super::*;
use crate::uplink::UpstreamState;

/// Relay event kinds are kept for display only; longer ones are cut.
const MAX_EVENT_KIND: usize = 64;

impl Gateway {
    // ---- relay ----

    pub(in crate::gateway) fn on_relay_event(&mut self, now: Instant, id: UplinkId, kind: &str) {
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
    pub(in crate::gateway) fn arm_probes(&mut self, now: Instant) {
        if self.probes_armed || self.shutting_down || self.config.probe_interval.is_zero() {
            return;
        }
        self.probes_armed = true;
        self.timers
            .insert((now + self.config.probe_interval, Timer::ProbeRound));
    }

    pub(in crate::gateway) fn on_probe_round(&mut self, now: Instant) {
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
    pub(in crate::gateway) fn start_probe(&mut self, now: Instant, project: String) {
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

    pub(in crate::gateway) fn on_probe_done(
        &mut self,
        now: Instant,
        probe: ProbeId,
        outcome: ProbeOutcome,
    ) {
        let Some(p) = self.probes.remove(&probe) else {
            return;
        };
        self.timers.remove(&(p.deadline, Timer::Probe(probe)));
        self.end_probe(now, probe, p, outcome);
    }

    pub(in crate::gateway) fn on_probe_deadline(&mut self, now: Instant, probe: ProbeId) {
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
    pub(in crate::gateway) fn stop_probes(&mut self) {
        for (probe, p) in std::mem::take(&mut self.probes) {
            self.timers.remove(&(p.deadline, Timer::Probe(probe)));
        }
        self.timers.retain(|(_, t)| *t != Timer::ProbeRound);
        self.probes_armed = false;
    }

    // ---- gateway_health ----

    /// This replica's `gateway_health` result (`gather.rs` adds the other replicas' rows).
    pub(in crate::gateway) fn gateway_health(
        &self,
        req: &Req<'_>,
        arguments: &Map<String, Value>,
    ) -> Result<Value, RpcError> {
        let now = req.now;
        basics::only_arguments(GATEWAY_HEALTH, arguments, &[])?;
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
                    // A connector sled's server: down (calls refused) or starting.
                    let server = u.upstream.as_ref().map(|r| (r.state, r));
                    match server {
                        Some((UpstreamState::Down, r)) => {
                            reasons.insert(
                                0,
                                format!(
                                    "its MCP server is down: {} ({} restarts)",
                                    r.reason.as_deref().unwrap_or("no reason given"),
                                    r.restarts
                                ),
                            );
                            ("down", "uplink")
                        }
                        Some((UpstreamState::Starting, r)) => {
                            reasons.insert(
                                0,
                                format!("its MCP server is starting ({} restarts)", r.restarts),
                            );
                            ("unknown", "uplink")
                        }
                        _ => (if reasons.is_empty() { "up" } else { "stale" }, "uplink"),
                    }
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
            let mut row = json!({
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
            });
            // A connector sled's server, when it fronts one.
            if let Some(r) = uplink.and_then(|u| u.upstream.as_ref()) {
                row["upstream"] = json!({
                    "state": r.state.as_str(),
                    "reason": r.reason,
                    "restarts": r.restarts,
                });
            }
            rows.push(row);
        }
        Ok(json!({
            "projects": rows,
            "summary": summary,
            "heartbeat_ms": millis(self.config.heartbeat_interval),
            "probe_interval_ms": millis(self.config.probe_interval),
        }))
    }
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
