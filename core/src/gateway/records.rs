//! The gateway's side of the records machine ([`crate::records::Records`]): sessions and
//! first-use pins kept in the engine. A request naming a session this gateway does not know
//! waits while the session is read; every change of a session is written; a pin is created
//! once, by whichever gateway first sees the sled's key. Only this file and `mod.rs` touch
//! the machine.

use std::time::Instant;

use crate::cluster::{EngineDown, PinOutcome, SessionRecord};
use crate::error::HttpError;
use crate::replica::Waiting;
use crate::uplink::CloseCode;
use crate::{HttpReply, HttpRequest, HttpToken, UplinkId};

use super::{Gateway, Output, UplinkState};

impl Gateway {
    /// The machine's actions go out.
    fn flush_records(&mut self) {
        let Some(records) = self.records.as_mut() else {
            return;
        };
        while let Some(action) = records.poll_action() {
            self.outputs.push_back(Output::Cluster(action));
        }
    }

    /// Whether the request must wait for its session to be read from the engine; then it is
    /// kept, and handled again when the answer comes.
    pub(super) fn park_for_session(&mut self, token: HttpToken, request: &HttpRequest) -> bool {
        let Some(session) = request.session.as_deref() else {
            return false;
        };
        if self.sessions.get(session).is_some() {
            return false;
        }
        let Some(records) = self.records.as_mut() else {
            return false;
        };
        records.park(session, token, request.clone());
        self.flush_records();
        true
    }

    pub(super) fn session_loaded(
        &mut self,
        now: Instant,
        session: String,
        record: Result<Option<SessionRecord>, EngineDown>,
    ) {
        let found = matches!(record, Ok(Some(_)));
        let Some(records) = self.records.as_mut() else {
            return;
        };
        let parked = records.handle_loaded(now, &session, found);
        match record {
            Ok(Some(record)) => {
                if self.sessions.get(&session).is_none() {
                    self.sessions.restore(session.clone(), record, now);
                    self.arm_sweep(now);
                }
                // Handled again, now with the session known.
                for (token, request) in parked {
                    self.on_http(now, token, request);
                }
            }
            Ok(None) => {
                for (token, _) in parked {
                    self.http_error(token, HttpError::UnknownSession);
                }
            }
            Err(EngineDown) => {
                for (token, _) in parked {
                    self.http_error(token, HttpError::SessionStoreUnavailable);
                }
            }
        }
    }

    /// Another replica changed (or deleted) a session; a copy held here follows.
    pub(super) fn session_changed_elsewhere(
        &mut self,
        session: String,
        record: Option<SessionRecord>,
    ) {
        let Some(records) = self.records.as_mut() else {
            return;
        };
        // While writes of ours are in flight, ours is the newest.
        if records.writing(&session) {
            return;
        }
        match record {
            Some(record) => {
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.default_project = record.default_project;
                    s.log_level = record.log_level;
                    s.protocol_version = record.protocol_version;
                    s.client_capabilities = record.client_capabilities;
                    s.owner = record.owner;
                }
            }
            None => {
                records.forget(&session);
                if let Some(s) = self.sessions.remove(&session) {
                    if let Some(stream) = s.stream {
                        self.close_session_stream(stream);
                    }
                }
            }
        }
    }

    /// A session was created, changed or deleted here: it is written to the engine.
    pub(super) fn store_session(&mut self, now: Instant, session: &str) {
        let record = self.sessions.get(session).map(|s| SessionRecord {
            default_project: s.default_project.clone(),
            protocol_version: s.protocol_version.clone(),
            log_level: s.log_level,
            client_capabilities: s.client_capabilities.clone(),
            owner: s.owner.clone(),
        });
        let Some(records) = self.records.as_mut() else {
            return;
        };
        records.store(now, session, record);
        self.flush_records();
    }

    /// A session was used: written again when its record is a third of the idle TTL old, so
    /// that the engine ends only idle sessions.
    pub(super) fn touch_session(&mut self, now: Instant, session: &str) {
        let every = self.config.session_idle_ttl / 3;
        if self
            .records
            .as_ref()
            .is_some_and(|r| r.due(now, session, every))
        {
            self.store_session(now, session);
        }
    }

    /// A write of the session's record is done (whatever its outcome): the answers waiting
    /// for it go out.
    pub(super) fn session_stored(&mut self, session: &str, written: bool) {
        let Some(records) = self.records.as_mut() else {
            return;
        };
        for (token, reply) in records.handle_stored(session, written) {
            self.outputs.push_back(Output::Http { token, reply });
        }
    }

    /// Answers now, or, with a write of `session` in flight, once it is done.
    pub(super) fn reply_when_stored(&mut self, token: HttpToken, session: &str, reply: HttpReply) {
        let now = match self.records.as_mut() {
            Some(records) => records.after_store(token, session, reply),
            None => Some((token, reply)),
        };
        if let Some((token, reply)) = now {
            self.outputs.push_back(Output::Http { token, reply });
        }
    }

    /// Whether pins are created in the engine (in a cluster) rather than here alone.
    pub(super) fn pins_shared(&self) -> bool {
        self.records.is_some()
    }

    /// A sled proved a key for a project with no pin: the pin is created in the engine (the
    /// first replica to do so wins), and the uplink waits for the answer.
    pub(super) fn create_pin(
        &mut self,
        now: Instant,
        id: UplinkId,
        project: String,
        sled: String,
        key: String,
    ) {
        let Some(records) = self.records.as_mut() else {
            return;
        };
        tracing::info!(
            project,
            sled,
            key,
            "pinning the sled's identity cluster-wide"
        );
        let older = records.create_pin(
            &project,
            Waiting {
                uplink: id,
                sled,
                key: Some(key),
            },
        );
        if let Some(old) = older {
            self.close_uplink(
                now,
                old,
                CloseCode::Replaced,
                format!("replaced by a newer uplink for project '{project}'"),
            );
        }
        if let Some(u) = self.uplinks.get_mut(&id) {
            u.state = UplinkState::AwaitingClaim { project };
        }
        self.flush_records();
    }

    /// An uplink is gone; `true` when it was waiting for its pin.
    pub(super) fn pin_uplink_gone(&mut self, id: UplinkId, project: &str) -> bool {
        self.records
            .as_mut()
            .is_some_and(|r| r.handle_uplink_gone(id, project))
    }

    pub(super) fn pin_created(&mut self, now: Instant, project: String, outcome: PinOutcome) {
        let Some(w) = self
            .records
            .as_mut()
            .and_then(|r| r.handle_pin_created(&project))
        else {
            return;
        };
        if let Some(u) = self.uplinks.get_mut(&w.uplink) {
            u.state = UplinkState::AwaitingHello;
        }
        let key = w.key.clone().unwrap_or_default();
        let pin = match outcome {
            PinOutcome::Created => {
                tracing::info!(
                    project,
                    sled = w.sled,
                    key,
                    "sled identity pinned on first use"
                );
                crate::Pin {
                    key: key.clone(),
                    sled: w.sled.clone(),
                }
            }
            PinOutcome::Exists(pin) => pin,
            PinOutcome::Unavailable => {
                return self.close_uplink(
                    now,
                    w.uplink,
                    CloseCode::HelloTimeout,
                    format!(
                        "project '{project}' has no pinned key yet and this gateway replica \
                         cannot reach the cluster's engine to pin one; connect again"
                    ),
                );
            }
        };
        let matches = pin.key == key;
        self.pins.pins.insert(project.clone(), pin.clone());
        self.save_pins_soon(now);
        if !matches {
            let reason = format!(
                "project '{project}' is pinned to key {}; this sled presented {key}",
                pin.key
            );
            return self.refuse_identity(now, w.uplink, &project, w.sled, Some(key), reason);
        }
        self.accept_uplink(now, w.uplink, project, w.sled, Some(key));
    }

    /// Another replica pinned (or re-pinned) a project: this one follows.
    pub(super) fn pin_changed(&mut self, now: Instant, project: String, pin: Option<crate::Pin>) {
        let changed = match &pin {
            Some(p) => self.pins.pins.get(&project) != Some(p),
            None => self.pins.pins.contains_key(&project),
        };
        if !changed {
            return;
        }
        match pin {
            Some(p) => {
                tracing::info!(project, key = p.key, "pin from the cluster");
                self.pins.pins.insert(project.clone(), p);
            }
            None => {
                self.pins.pins.remove(&project);
            }
        }
        self.save_pins_soon(now);
        // A live uplink's key is always its project's pin.
        let live = self.projects.get(&project).and_then(|s| s.uplink);
        if let Some(u) = live {
            let key = self.uplinks.get(&u).and_then(|u| u.key.clone());
            let pinned = self.pins.pins.get(&project).map(|p| p.key.clone());
            if pinned.is_some() && key != pinned {
                self.close_uplink(
                    now,
                    u,
                    CloseCode::IdentityRefused,
                    format!("project '{project}' was re-pinned to another key"),
                );
            }
        }
    }

    /// A re-pin here goes to the engine too.
    pub(super) fn store_pin(&mut self, project: &str) {
        let Some(pin) = self.pins.pins.get(project).cloned() else {
            return;
        };
        let Some(records) = self.records.as_mut() else {
            return;
        };
        records.store_pin(project, pin);
        self.flush_records();
    }

    /// Shutdown: requests waiting for a session are refused, answers waiting for a write go.
    pub(super) fn records_shutdown(&mut self) {
        let Some(records) = self.records.as_mut() else {
            return;
        };
        let (parked, stored) = records.handle_shutdown();
        for (token, reply) in stored {
            self.outputs.push_back(Output::Http { token, reply });
        }
        for token in parked {
            self.http_error(token, HttpError::ShuttingDown);
        }
    }
}
