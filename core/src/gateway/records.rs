//! The gateway's side of the records machine ([`crate::records::Records`]): sessions and
//! first-use pins kept in the engine of a cluster, and sessions kept in the store of a single
//! gateway ([`crate::Config::store_sessions`]). A request naming a session this gateway does
//! not know waits while the session is read; every change of a session is written; a pin is
//! created once, by whichever gateway first sees the sled's key (in a cluster). Only this
//! file and `mod.rs` touch the machine.

use std::time::Instant;

use crate::cluster::{EngineDown, SessionRecord};
use crate::error::HttpError;
use crate::replica::Waiting;
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

    /// A session was read from the engine: the requests that waited for it, to handle again
    /// (those it cannot serve are refused here).
    #[must_use]
    pub(super) fn session_loaded(
        &mut self,
        now: Instant,
        session: String,
        record: Result<Option<SessionRecord>, EngineDown>,
    ) -> Vec<(HttpToken, HttpRequest)> {
        let found = matches!(record, Ok(Some(_)));
        let Some(records) = self.records.as_mut() else {
            return Vec::new();
        };
        let parked = records.handle_loaded(now, &session, found);
        match record {
            Ok(Some(record)) => {
                if self.sessions.get(&session).is_none() {
                    self.sessions.restore(session.clone(), record, now);
                    self.arm_sweep(now);
                }
                parked
            }
            Ok(None) => {
                for (token, _) in parked {
                    self.http_error(token, HttpError::UnknownSession);
                }
                Vec::new()
            }
            Err(EngineDown) => {
                for (token, _) in parked {
                    self.http_error(token, HttpError::SessionStoreUnavailable);
                }
                Vec::new()
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
                }
                self.sessions.set_owner(&session, record.owner);
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
        let (answers, replaced) = records.handle_stored(session, written);
        for (token, reply) in answers {
            self.outputs.push_back(Output::Http { token, reply });
        }
        // A new session the engine did not take: its initialize was refused, so it is not
        // kept here either (nothing else of it exists yet).
        if replaced {
            self.sessions.remove(session);
        }
    }

    /// Answers now, or, with a write of `session` in flight, once it is done.
    pub(super) fn reply_when_stored(&mut self, token: HttpToken, session: &str, reply: HttpReply) {
        self.reply_when_stored_or(token, session, reply, None);
    }

    /// [`Gateway::reply_when_stored`], answering `if_unwritten` instead if a write of the
    /// session in flight fails.
    pub(super) fn reply_when_stored_or(
        &mut self,
        token: HttpToken,
        session: &str,
        reply: HttpReply,
        if_unwritten: Option<HttpReply>,
    ) {
        let now = match self.records.as_mut() {
            Some(records) => records.after_store(token, session, reply, if_unwritten),
            None => Some((token, reply)),
        };
        if let Some((token, reply)) = now {
            self.outputs.push_back(Output::Http { token, reply });
        }
    }

    /// Whether sessions are kept outside the process (in a cluster's engine, or a single
    /// gateway's store).
    pub(super) fn keeps_sessions(&self) -> bool {
        self.records.is_some()
    }

    /// Whether pins are created in the engine (in a cluster) or the store (a single gateway
    /// with [`crate::Config::store_pins`]) rather than here alone, saved to a pin file.
    pub(super) fn pins_shared(&self) -> bool {
        self.clustered() || (self.config.store_pins && self.records.is_some())
    }

    /// Whether the pins are kept only in the store: then there is no pin file to save.
    pub(super) fn pins_in_store(&self) -> bool {
        self.pins_shared() && !self.clustered()
    }

    /// A sled proved a key for a project with no pin: the pin is created in the engine (the
    /// first replica to do so wins), and the uplink waits for the answer. The uplink that
    /// waited before it, which it replaces, is answered (its caller closes it).
    pub(super) fn create_pin(
        &mut self,
        id: UplinkId,
        project: String,
        sled: String,
        key: String,
    ) -> Option<UplinkId> {
        let records = self.records.as_mut()?;
        tracing::info!(
            project,
            sled,
            key,
            "pinning the sled's identity on first use"
        );
        let older = records.create_pin(
            &project,
            Waiting {
                uplink: id,
                sled,
                key: Some(key),
            },
        );
        if let Some(u) = self.uplinks.get_mut(&id) {
            u.state = UplinkState::AwaitingClaim { project };
        }
        self.flush_records();
        older
    }

    /// The engine answered a pin's creation: the uplink that waited for it.
    pub(super) fn pin_waiter(&mut self, project: &str) -> Option<Waiting> {
        self.records.as_mut()?.handle_pin_created(project)
    }

    /// An uplink is gone; `true` when it was waiting for its pin.
    pub(super) fn pin_uplink_gone(&mut self, id: UplinkId, project: &str) -> bool {
        self.records
            .as_mut()
            .is_some_and(|r| r.handle_uplink_gone(id, project))
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
