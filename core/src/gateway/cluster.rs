//! The gateway as a replica of a cluster (see `crate::cluster` for the vocabulary and where
//! state lives, and `crate::directory` for the rules of ownership).
//!
//! - **Uplinks.** A sled that passed every check waits in [`UplinkState::AwaitingClaim`] while
//!   the [`crate::directory::Directory`] claims its project; it is welcomed with the won epoch
//!   (`Serve`), and closed with `Superseded` when the claim is lost (`StopServing`). The hello
//!   timer keeps running meanwhile, so a replica cut off from the engine sends the sled away.
//! - **Calls.** A request whose project's sled is held by another replica is relayed whole to
//!   that replica ([`ClusterAction::Relay`]); its answer comes back message by message and goes
//!   to the client as if it were this replica's. A relay that gets no whole answer is failed
//!   with `uplink_lost`: `outcome: "not_sent"` when nobody took it, `"unknown"` when the owner
//!   took it and fell silent. A relayed request is never relayed again.
//! - **Sessions.** A request naming a session this replica does not know waits while the
//!   session is read from the engine; every change of a session is written there.

use std::time::Instant;

use crate::cluster::{
    ClusterAction, ClusterEvent, EngineDown, PinOutcome, Relay, RelayMessage, RelaySent,
    SessionRecord, Waiting,
};
use crate::directory::{Action, EntryState, Loss, Owner};
use crate::error::{HttpError, RpcError, UplinkLoss};
use crate::uplink::CloseCode;
use crate::{HttpReply, HttpRequest, HttpToken, UplinkId};

use super::{Gateway, Output, UplinkState};

impl Gateway {
    pub(super) fn on_cluster(&mut self, now: Instant, event: ClusterEvent) {
        let Some(cluster) = self.cluster.as_mut() else {
            tracing::debug!(?event, "a cluster event for a gateway outside any cluster");
            return;
        };
        match event {
            ClusterEvent::Entry {
                project,
                revision,
                state,
            } => {
                cluster.unanswering.remove(&project);
                let gone = matches!(state, EntryState::Deleted | EntryState::Expired);
                if gone && !cluster.move_grace.is_zero() {
                    cluster
                        .moving
                        .insert(project.clone(), now + cluster.move_grace);
                }
                // Relays to a replica that lost the project to another claim, or whose claim
                // expired, will get no answer from its sled (it closed that uplink, or died):
                // they fail now (`unknown`), not when the replica's silence is noticed. A
                // release (a delete) comes after the releasing replica answered its calls.
                let holder = match &state {
                    EntryState::Claimed(v) => Some(Some(v.owner.clone())),
                    EntryState::Expired | EntryState::Unreadable => Some(None),
                    EntryState::Deleted => None,
                };
                let mut orphaned: Vec<HttpToken> = match &holder {
                    None => Vec::new(),
                    Some(holder) => cluster
                        .relays
                        .iter()
                        .filter(|(_, r)| {
                            r.project == project && Some(&r.replica) != holder.as_ref()
                        })
                        .map(|(t, _)| *t)
                        .collect(),
                };
                // In token order: the relays are a HashMap, and the simulation replays seeds.
                orphaned.sort_unstable();
                let was_elsewhere = self.held_elsewhere(&project).is_some();
                let Some(cluster) = self.cluster.as_mut() else {
                    return;
                };
                cluster.directory.handle_entry(&project, revision, state);
                self.holder_news(&project, was_elsewhere);
                for token in orphaned {
                    self.cluster_output(ClusterAction::RelayAbort { token });
                    self.relay_failed(now, token, RelaySent::Unknown);
                }
                if !gone {
                    self.drain_directory(now);
                    self.release_held(now, &project);
                }
            }
            ClusterEvent::Claimed { project, outcome } => {
                match outcome {
                    crate::directory::ClaimOutcome::Conflict { .. } => {
                        cluster.counts.claim_conflicts += 1
                    }
                    crate::directory::ClaimOutcome::Won(_)
                    | crate::directory::ClaimOutcome::Unavailable => {}
                }
                cluster
                    .directory
                    .handle_claim_outcome(now, &project, outcome)
            }
            ClusterEvent::Engine { up } => {
                if up && !cluster.directory.engine_up() {
                    cluster.counts.engine_reconnects += 1;
                    tracing::info!("the cluster's engine is reachable again");
                } else if !up && cluster.directory.engine_up() {
                    tracing::warn!(
                        "lost the cluster's engine: live uplinks keep serving, no new claims"
                    );
                }
                cluster.directory.handle_engine(now, up);
            }
            ClusterEvent::SessionLoaded { session, record } => {
                self.session_loaded(now, session, record)
            }
            ClusterEvent::SessionChanged { session, record } => {
                self.session_changed_elsewhere(session, record)
            }
            ClusterEvent::SessionStored { session, written } => {
                self.session_stored(&session, written)
            }
            ClusterEvent::Relayed { token, message } => self.relayed(now, token, message),
            ClusterEvent::PinCreated { project, outcome } => {
                self.pin_created(now, project, outcome)
            }
            ClusterEvent::PinChanged { project, pin } => self.pin_changed(now, project, pin),
            ClusterEvent::RelayFailed { token, sent } => self.relay_failed(now, token, sent),
            ClusterEvent::Announced(news) => self.announced(news),
            ClusterEvent::ToolsChanged { project, listing } => {
                self.tools_changed_elsewhere(&project, listing)
            }
        }
        self.drain_directory(now);
    }

    pub(super) fn cluster_timeout(&mut self, now: Instant) {
        let mut over = Vec::new();
        if let Some(c) = self.cluster.as_mut() {
            if c.directory.poll_timeout().is_some_and(|at| at <= now) {
                c.directory.handle_timeout(now);
            }
            // Moves that took too long: their held requests are answered as they are now.
            c.moving.retain(|project, until| {
                let going = *until > now;
                if !going {
                    over.push(project.clone());
                }
                going
            });
        }
        self.drain_directory(now);
        for project in over {
            self.release_held(now, &project);
        }
        self.parts_expired(now);
    }

    /// Carries out what the directory decided.
    pub(super) fn drain_directory(&mut self, now: Instant) {
        loop {
            let Some(action) = self
                .cluster
                .as_mut()
                .and_then(|c| c.directory.poll_action())
            else {
                return;
            };
            match action {
                Action::Claim {
                    project,
                    expected_revision,
                    value,
                } => self.cluster_output(ClusterAction::Claim {
                    project,
                    expected_revision,
                    value,
                }),
                Action::Release { project, revision } => {
                    self.cluster_output(ClusterAction::Release { project, revision })
                }
                Action::Serve { project, epoch } => self.serve_claimed(now, project, epoch),
                Action::StopServing { project, reason } => self.stop_serving(now, &project, reason),
            }
        }
    }

    pub(super) fn cluster_output(&mut self, action: ClusterAction) {
        self.outputs.push_back(Output::Cluster(action));
    }

    /// Parks an uplink that passed every check until its project's claim is won. A newer
    /// uplink of the project replaces the one waiting, and the one serving, as on one gateway.
    pub(super) fn await_claim(
        &mut self,
        now: Instant,
        id: UplinkId,
        project: String,
        sled: String,
        key: Option<String>,
    ) {
        let Some(cluster) = self.cluster.as_mut() else {
            return;
        };
        let older = cluster
            .waiting
            .insert(
                project.clone(),
                Waiting {
                    uplink: id,
                    sled,
                    key,
                },
            )
            .map(|w| w.uplink);
        let live = self.projects.get(&project).and_then(|s| s.uplink);
        for old in older.into_iter().chain(live) {
            self.drop_uplink(
                now,
                old,
                UplinkLoss::Replaced,
                Some((
                    CloseCode::Replaced,
                    format!("replaced by a newer uplink for project '{project}'"),
                )),
            );
        }
        let Some(uplink) = self.uplinks.get_mut(&id) else {
            return;
        };
        uplink.state = UplinkState::AwaitingClaim {
            project: project.clone(),
        };
        let epoch_seen = uplink.epoch_seen;
        tracing::info!(uplink = id.0, project, ?epoch_seen, "claiming the project");
        if let Some(c) = self.cluster.as_mut() {
            c.directory.handle_hello(now, &project, epoch_seen);
        }
        self.drain_directory(now);
    }

    /// The claim was won: the waiting uplink goes live, welcomed with the epoch.
    fn serve_claimed(&mut self, now: Instant, project: String, epoch: u64) {
        let Some(cluster) = self.cluster.as_mut() else {
            return;
        };
        let Some(w) = cluster.waiting.remove(&project) else {
            tracing::debug!(project, epoch, "claim won with no uplink waiting");
            return;
        };
        cluster.counts.claims_won += 1;
        cluster.moving.remove(&project);
        tracing::info!(uplink = w.uplink.0, project, epoch, "claim won; serving");
        self.go_live(now, w.uplink, project.clone(), w.sled, w.key, Some(epoch));
        self.release_held(now, &project);
    }

    /// The claim was lost: this replica's uplink of the project must not serve any more.
    fn stop_serving(&mut self, now: Instant, project: &str, reason: Loss) {
        let waiting = self
            .cluster
            .as_mut()
            .and_then(|c| c.waiting.remove(project))
            .map(|w| w.uplink);
        let live = self.projects.get(project).and_then(|s| s.uplink);
        if live.is_some() && reason != Loss::ShuttingDown {
            if let Some(c) = self.cluster.as_mut() {
                c.counts.claims_lost += 1;
            }
        }
        let why = match &reason {
            Loss::TakenOver { by: Some(r), .. } => format!("gateway replica '{r}' claimed it"),
            Loss::TakenOver { by: None, .. } => "another claim was written".into(),
            Loss::Deleted { .. } => "its claim was deleted".into(),
            Loss::Expired { .. } => "its claim expired".into(),
            Loss::Conflict { .. } => "a refresh of its claim found another write".into(),
            Loss::EpochOutOfReach { epoch_seen, .. } => {
                format!("the sled reports epoch {epoch_seen}, beyond what the cluster can reach")
            }
            Loss::ShuttingDown => "this gateway replica is shutting down".into(),
        };
        tracing::warn!(project, ?reason, "no longer serving the project: {why}");
        #[cfg(feature = "planted-bugs")]
        if self.config.planted == Some(super::PlantedBug::ServeAfterLosingClaim)
            && reason != Loss::ShuttingDown
        {
            return;
        }
        for id in waiting.into_iter().chain(live) {
            self.drop_uplink(now,
                id,
                UplinkLoss::Superseded,
                Some((
                    CloseCode::Superseded,
                    format!("this gateway replica no longer holds project '{project}': {why}; connect again"),
                )),
            );
        }
    }

    /// An uplink that waited for or held a claim is gone (called by `drop_uplink`).
    pub(super) fn cluster_uplink_gone(&mut self, now: Instant, id: UplinkId, project: &str) {
        let live = self.projects.get(project).and_then(|s| s.uplink);
        let Some(cluster) = self.cluster.as_mut() else {
            return;
        };
        if cluster.pinning.get(project).is_some_and(|w| w.uplink == id) {
            cluster.pinning.remove(project);
            return;
        }
        let was_waiting = cluster.waiting.get(project).is_some_and(|w| w.uplink == id);
        if was_waiting {
            cluster.waiting.remove(project);
        }
        if was_waiting || live == Some(id) {
            // Its sled will dial again, here or elsewhere: requests wait for it a moment.
            if !cluster.move_grace.is_zero() {
                cluster
                    .moving
                    .insert(project.to_owned(), now + cluster.move_grace);
            }
            cluster.directory.handle_uplink_closed(project);
            // Only releases come of it, which need no time.
            while let Some(action) = cluster.directory.poll_action() {
                match action {
                    Action::Release { project, revision } => {
                        self.outputs
                            .push_back(Output::Cluster(ClusterAction::Release {
                                project,
                                revision,
                            }))
                    }
                    other => tracing::debug!(?other, "unexpected directory action on a close"),
                }
            }
        }
    }

    /// The replica that holds `project`'s sled, when it is another one. A request relayed
    /// here is not relayed again (`on_post`, `on_modern`): it is answered `sled_elsewhere`.
    pub(super) fn relay_target(&self, project: &str) -> Option<String> {
        let cluster = self.cluster.as_ref()?;
        match cluster.directory.owner(project) {
            Owner::Replica(r) if cluster.unanswering.get(project) != Some(&r) => Some(r),
            Owner::Replica(_) | Owner::Local { .. } | Owner::Nobody => None,
        }
    }

    /// Whether `project`'s sled left its replica a moment ago (so a request for it may wait
    /// for its next one; a request relayed here never waits, its caller asks).
    pub(super) fn is_moving(&self, now: Instant, project: &str) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| c.moving.get(project).is_some_and(|until| *until > now))
    }

    /// Holds a request until `project` has a holder again, or its move takes too long.
    pub(super) fn hold(&mut self, token: HttpToken, project: String, request: HttpRequest) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        c.counts.held += 1;
        tracing::debug!(token = token.0, project, "held while the project moves");
        c.held.entry(project).or_default().push((token, request));
    }

    /// Serves again the requests held for `project`: it has a holder, or its move is over.
    fn release_held(&mut self, now: Instant, project: &str) {
        let Some(held) = self.cluster.as_mut().and_then(|c| c.held.remove(project)) else {
            return;
        };
        for (token, request) in held {
            self.on_http(now, token, request);
        }
    }

    /// The client of a held request went away; `true` when `token` was one.
    pub(super) fn unhold(&mut self, token: HttpToken) -> bool {
        let Some(c) = self.cluster.as_mut() else {
            return false;
        };
        for held in c.held.values_mut() {
            if let Some(i) = held.iter().position(|(t, _)| *t == token) {
                held.remove(i);
                return true;
            }
        }
        false
    }

    /// Which replica holds `project`'s sled, for listings: this one's name when it does.
    pub(super) fn holder_of(&self, project: &str) -> Option<String> {
        let cluster = self.cluster.as_ref()?;
        match cluster.directory.owner(project) {
            Owner::Local { .. } => Some(cluster.directory.replica().to_owned()),
            Owner::Replica(r) => Some(r),
            Owner::Nobody => None,
        }
    }

    /// Relays a request whose project's sled is on `replica`; `id` is its JSON-RPC id.
    pub(super) fn relay(
        &mut self,
        token: HttpToken,
        replica: String,
        project: String,
        id: &str,
        modern: bool,
        mut request: HttpRequest,
    ) {
        let Some(cluster) = self.cluster.as_mut() else {
            return;
        };
        cluster.counts.relays += 1;
        let project_of_relay = project.clone();
        tracing::debug!(
            token = token.0,
            project,
            replica,
            "relaying to the project's holder"
        );
        cluster.relays.insert(
            token,
            Relay {
                id: id.to_owned(),
                project,
                replica: replica.clone(),
                modern,
                streaming: false,
                request: (!cluster.move_grace.is_zero()).then(|| Box::new(request.clone())),
                retry: false,
            },
        );
        request.relayed = true;
        let timeout = self
            .registry
            .get(&project_of_relay)
            .map_or(self.config.refresh_timeout, |(_, spec)| spec.call_timeout);
        self.cluster_output(ClusterAction::Relay {
            token,
            replica,
            request: Box::new(request),
            timeout,
        });
    }

    /// The relay just made is a stateless retry for the replica that parked its call.
    pub(super) fn relay_is_retry(&mut self, token: HttpToken) {
        if let Some(r) = self.cluster.as_mut().and_then(|c| c.relays.get_mut(&token)) {
            r.request = None;
            r.retry = true;
        }
    }

    fn relayed(&mut self, now: Instant, token: HttpToken, message: RelayMessage) {
        if self.part_message(now, token, message.clone()) {
            return;
        }
        let Some(cluster) = self.cluster.as_mut() else {
            return;
        };
        let Some(relay) = cluster.relays.get_mut(&token) else {
            tracing::debug!(token = token.0, "an answer for a relay that is over");
            return;
        };
        match message {
            RelayMessage::Reply(reply) => {
                cluster.relays.remove(&token);
                self.outputs.push_back(Output::Http { token, reply });
            }
            RelayMessage::Open => {
                relay.streaming = true;
                self.outputs.push_back(Output::StreamOpen { token });
            }
            RelayMessage::Event { id, data } => {
                self.outputs
                    .push_back(Output::StreamEvent { token, id, data });
            }
            RelayMessage::Close => {
                cluster.relays.remove(&token);
                self.outputs.push_back(Output::StreamClose { token });
            }
        }
    }

    fn relay_failed(&mut self, now: Instant, token: HttpToken, sent: RelaySent) {
        if self.part_failed(now, token, sent) {
            return;
        }
        let Some(cluster) = self.cluster.as_mut() else {
            return;
        };
        let Some(relay) = cluster.relays.remove(&token) else {
            return;
        };
        cluster.counts.relays_failed += 1;
        // Nobody took it: that replica is gone. The request was not sent, so it is served
        // again, and waits for the project's next holder (the sled dials again).
        if let (RelaySent::NotSent, Some(request), false) = (sent, &relay.request, relay.streaming)
        {
            tracing::info!(
                project = relay.project,
                replica = relay.replica,
                "nobody takes relays for the project's holder; waiting for its next"
            );
            cluster
                .unanswering
                .insert(relay.project.clone(), relay.replica.clone());
            let until = now + cluster.move_grace;
            cluster.moving.entry(relay.project.clone()).or_insert(until);
            let request = (**request).clone();
            return self.on_http(now, token, request);
        }
        let loss = match sent {
            RelaySent::NotSent if !relay.retry => UplinkLoss::NotRelayed,
            RelaySent::NotSent | RelaySent::Unknown => UplinkLoss::OwnerLost,
        };
        tracing::warn!(
            token = token.0,
            project = relay.project,
            replica = relay.replica,
            ?sent,
            "a relayed request got no whole answer"
        );
        let e = RpcError::UplinkLost {
            sled: self.sled_of(&relay.project),
            project: relay.project,
            loss,
        };
        self.answer_relay_error(token, &relay.id, relay.modern, relay.streaming, &e);
    }

    fn answer_relay_error(
        &mut self,
        token: HttpToken,
        id: &str,
        modern: bool,
        streaming: bool,
        e: &RpcError,
    ) {
        let body = e.response(Some(id));
        if streaming {
            self.outputs.push_back(Output::StreamEvent {
                token,
                id: None,
                data: body,
            });
            self.outputs.push_back(Output::StreamClose { token });
        } else {
            let status = if modern {
                crate::http::modern_status(e.code())
            } else {
                200
            };
            self.reply(token, status, Vec::new(), Some(body));
        }
    }

    /// The client of a relayed request went away; `true` when `token` was one.
    pub(super) fn relay_aborted(&mut self, token: HttpToken) -> bool {
        let Some(cluster) = self.cluster.as_mut() else {
            return false;
        };
        if cluster.relays.remove(&token).is_none() {
            return false;
        }
        self.cluster_output(ClusterAction::RelayAbort { token });
        true
    }

    /// Whether the request must wait for its session to be read from the engine; then it is
    /// kept, and handled again when the answer comes.
    pub(super) fn park_for_session(&mut self, token: HttpToken, request: &HttpRequest) -> bool {
        let Some(cluster) = self.cluster.as_mut() else {
            return false;
        };
        let Some(session) = request.session.as_deref() else {
            return false;
        };
        if self.sessions.get(session).is_some() {
            return false;
        }
        let first = !cluster.parked.contains_key(session);
        cluster
            .parked
            .entry(session.to_owned())
            .or_default()
            .push((token, request.clone()));
        if first {
            cluster.counts.sessions_loaded += 1;
            let session = session.to_owned();
            self.cluster_output(ClusterAction::LoadSession { session });
        }
        true
    }

    fn session_loaded(
        &mut self,
        now: Instant,
        session: String,
        record: Result<Option<SessionRecord>, EngineDown>,
    ) {
        let Some(cluster) = self.cluster.as_mut() else {
            return;
        };
        let parked = cluster.parked.remove(&session).unwrap_or_default();
        match record {
            Ok(Some(record)) => {
                if self.sessions.get(&session).is_none() {
                    self.sessions.restore(session.clone(), record, now);
                    self.arm_sweep(now);
                }
                if let Some(c) = self.cluster.as_mut() {
                    c.written.insert(session, now);
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
    fn session_changed_elsewhere(&mut self, session: String, record: Option<SessionRecord>) {
        let Some(cluster) = self.cluster.as_ref() else {
            return;
        };
        // While writes of ours are in flight, ours is the newest.
        if cluster.in_flight.get(&session).is_some_and(|n| *n > 0) {
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
                if let Some(s) = self.sessions.remove(&session) {
                    if let Some(stream) = s.stream {
                        self.close_session_stream(stream);
                    }
                }
                if let Some(c) = self.cluster.as_mut() {
                    c.written.remove(&session);
                }
            }
        }
    }

    /// A session was created, changed or deleted here: write it to the engine.
    pub(super) fn store_session(&mut self, now: Instant, session: &str) {
        let Some(cluster) = self.cluster.as_mut() else {
            return;
        };
        let record = self.sessions.get(session).map(|s| SessionRecord {
            default_project: s.default_project.clone(),
            protocol_version: s.protocol_version.clone(),
            log_level: s.log_level,
            client_capabilities: s.client_capabilities.clone(),
            owner: s.owner.clone(),
        });
        match record {
            Some(_) => {
                cluster.written.insert(session.to_owned(), now);
            }
            None => {
                cluster.written.remove(session);
            }
        }
        *cluster.in_flight.entry(session.to_owned()).or_insert(0) += 1;
        self.cluster_output(ClusterAction::StoreSession {
            session: session.to_owned(),
            record,
        });
    }

    /// A session was used: written again when its record is a third of the idle TTL old, so
    /// that the engine ends only idle sessions.
    pub(super) fn touch_session(&mut self, now: Instant, session: &str) {
        let due = self.cluster.as_ref().is_some_and(|c| {
            c.written.get(session).is_none_or(|at| {
                now.saturating_duration_since(*at) >= self.config.session_idle_ttl / 3
            })
        });
        if due {
            self.store_session(now, session);
        }
    }

    /// A write of the session's record is done (whatever its outcome): the answers waiting
    /// for it go out.
    fn session_stored(&mut self, session: &str, written: bool) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        // Not written (the engine out of reach): written again at the session's next use.
        if !written {
            c.written.remove(session);
        }
        if let Some(n) = c.in_flight.get_mut(session) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.in_flight.remove(session);
            }
        }
        if !c.in_flight.contains_key(session) {
            for (token, reply) in c.after_store.remove(session).unwrap_or_default() {
                self.outputs.push_back(Output::Http { token, reply });
            }
        }
    }

    /// Answers now, or, in a cluster with a write of `session` in flight, once it is done.
    pub(super) fn reply_when_stored(&mut self, token: HttpToken, session: &str, reply: HttpReply) {
        match self.cluster.as_mut() {
            Some(c) if c.in_flight.contains_key(session) => {
                c.after_store
                    .entry(session.to_owned())
                    .or_default()
                    .push((token, reply));
            }
            _ => self.outputs.push_back(Output::Http { token, reply }),
        }
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
        let Some(cluster) = self.cluster.as_mut() else {
            return;
        };
        let older = cluster.pinning.insert(
            project.clone(),
            Waiting {
                uplink: id,
                sled: sled.clone(),
                key: Some(key.clone()),
            },
        );
        if let Some(old) = older {
            self.close_uplink(
                now,
                old.uplink,
                CloseCode::Replaced,
                format!("replaced by a newer uplink for project '{project}'"),
            );
        }
        if let Some(u) = self.uplinks.get_mut(&id) {
            u.state = UplinkState::AwaitingClaim {
                project: project.clone(),
            };
        }
        tracing::info!(
            project,
            sled,
            key,
            "pinning the sled's identity cluster-wide"
        );
        self.cluster_output(ClusterAction::CreatePin {
            project,
            pin: crate::Pin { key, sled },
        });
    }

    fn pin_created(&mut self, now: Instant, project: String, outcome: PinOutcome) {
        let Some(w) = self
            .cluster
            .as_mut()
            .and_then(|c| c.pinning.remove(&project))
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
                return self.close_uplink(now,
                    w.uplink,
                    CloseCode::HelloTimeout,
                    format!("project '{project}' has no pinned key yet and this gateway replica cannot reach the cluster's engine to pin one; connect again"),
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
    fn pin_changed(&mut self, now: Instant, project: String, pin: Option<crate::Pin>) {
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
        if self.cluster.is_none() {
            return;
        }
        if let Some(pin) = self.pins.pins.get(project).cloned() {
            self.cluster_output(ClusterAction::StorePin {
                project: project.to_owned(),
                pin,
            });
        }
    }

    /// Shutdown: no new claims; relays and parked requests still waiting are failed.
    pub(super) fn cluster_shutdown(&mut self) {
        let Some(cluster) = self.cluster.as_mut() else {
            return;
        };
        cluster.directory.handle_shutdown();
        let parked: Vec<HttpToken> = std::mem::take(&mut cluster.parked)
            .into_values()
            .flatten()
            .map(|(t, _)| t)
            .collect();
        let mut relays: Vec<(HttpToken, Relay)> = cluster.relays.drain().collect();
        relays.sort_unstable_by_key(|(t, _)| *t);
        let stored: Vec<(HttpToken, HttpReply)> = std::mem::take(&mut cluster.after_store)
            .into_values()
            .flatten()
            .collect();
        for (token, reply) in stored {
            self.outputs.push_back(Output::Http { token, reply });
        }
        let Some(cluster) = self.cluster.as_mut() else {
            return;
        };
        let held: Vec<HttpToken> = std::mem::take(&mut cluster.held)
            .into_values()
            .flatten()
            .map(|(t, _)| t)
            .collect();
        for token in parked.into_iter().chain(held) {
            self.http_error(token, HttpError::ShuttingDown);
        }
        for (token, relay) in relays {
            self.cluster_output(ClusterAction::RelayAbort { token });
            self.answer_relay_error(
                token,
                &relay.id,
                relay.modern,
                relay.streaming,
                &RpcError::ShuttingDown,
            );
        }
    }
}
