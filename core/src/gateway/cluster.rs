//! The gateway's side of the replica machine ([`crate::replica::Replica`]): the engine's
//! events go in, the machine's events are carried out, and its actions go out. The rest of
//! the gateway asks where a project is served through [`Gateway::place`] and the few doors
//! below; only this file and `mod.rs` touch the machine.
//!
//! - **Uplinks.** A sled that passed every check waits in [`UplinkState::AwaitingClaim`] while
//!   the machine claims its project; it is welcomed with the won epoch
//!   ([`ReplicaEvent::Serve`]), and closed with `Superseded` when the claim is lost
//!   ([`ReplicaEvent::StopServing`]). The hello timer keeps running meanwhile, so a replica
//!   cut off from the engine sends the sled away.
//! - **Calls.** A request whose project's sled is held by another replica is relayed whole to
//!   that replica; its answer comes back message by message and goes to the client as if it
//!   were this replica's. A relay that gets no whole answer is failed with `uplink_lost`:
//!   `outcome: "not_sent"` when nobody took it, `"unknown"` when the owner took it and fell
//!   silent. A relayed request is never relayed again.

use std::time::{Duration, Instant};

use crate::cluster::{ClusterAction, ClusterEvent};
use crate::directory::Loss;
use crate::error::{HttpError, RpcError, UplinkLoss};
use crate::gather::Gathers;
use crate::replica::{Place, RelayError, Replica, ReplicaEvent, Waiting};
use crate::uplink::CloseCode;
use crate::{HttpRequest, HttpToken, UplinkId};

use super::{Gateway, Output, UplinkState};

impl Gateway {
    // ---- questions ----

    /// Whether this gateway is a replica of a cluster.
    pub(super) fn clustered(&self) -> bool {
        self.cluster.is_some()
    }

    /// This replica's name, in a cluster.
    pub(super) fn replica_name(&self) -> Option<&str> {
        self.cluster.as_ref().map(Replica::name)
    }

    /// Where `project` is served; always [`Place::Here`] on a single gateway.
    pub(super) fn place(&self, now: Instant, project: &str) -> Place {
        self.cluster
            .as_ref()
            .map_or(Place::Here, |r| r.place(now, project))
    }

    /// The replica that takes relays for `project`, when it is another one.
    pub(super) fn relay_target(&self, project: &str) -> Option<String> {
        self.cluster.as_ref()?.relay_target(project)
    }

    /// The replica holding `project`'s sled when it is another one, for listings.
    pub(super) fn held_elsewhere(&self, project: &str) -> Option<String> {
        self.cluster.as_ref()?.held_elsewhere(project)
    }

    /// Which replica holds `project`'s sled, for listings: this one's name when it does.
    pub(super) fn holder_of(&self, project: &str) -> Option<String> {
        self.cluster.as_ref()?.holder(project)
    }

    // ---- doors ----

    /// Carries out `f` on the machine, then what it decided.
    fn with_replica(&mut self, now: Instant, f: impl FnOnce(&mut Replica)) {
        let Some(replica) = self.cluster.as_mut() else {
            return;
        };
        f(replica);
        self.run_replica(now);
    }

    /// The machine's actions go out; its events are carried out, those queued now first (an
    /// event carried out may queue more, which a nested call carries out at once).
    fn run_replica(&mut self, now: Instant) {
        let Some(replica) = self.cluster.as_mut() else {
            return;
        };
        let mut events = Vec::new();
        while let Some(event) = replica.poll_event() {
            events.push(event);
        }
        while let Some(action) = replica.poll_action() {
            self.outputs.push_back(Output::Cluster(action));
        }
        for event in events {
            self.on_replica_event(now, event);
        }
    }

    /// Relays a request whose project's sled is on `replica`; `id` is its JSON-RPC id.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn relay(
        &mut self,
        now: Instant,
        token: HttpToken,
        replica: String,
        project: String,
        id: &str,
        modern: bool,
        request: HttpRequest,
    ) {
        let timeout = self
            .registry
            .get(&project)
            .map_or(self.config.refresh_timeout, |(_, spec)| spec.call_timeout);
        self.with_replica(now, |r| {
            r.relay(token, replica, project, id, modern, request, timeout)
        });
    }

    /// The relay just made is a stateless retry for the replica that parked its call.
    pub(super) fn relay_is_retry(&mut self, token: HttpToken) {
        if let Some(r) = self.cluster.as_mut() {
            r.relay_is_retry(token);
        }
    }

    /// Holds a request until `project` has a holder again, or its move takes too long.
    pub(super) fn hold(&mut self, token: HttpToken, project: String, request: HttpRequest) {
        if let Some(r) = self.cluster.as_mut() {
            r.hold(token, project, request);
        }
    }

    /// The client of a relayed or held request went away; `true` when `token` was one.
    pub(super) fn relay_or_hold_aborted(&mut self, now: Instant, token: HttpToken) -> bool {
        let Some(replica) = self.cluster.as_mut() else {
            return false;
        };
        let was = replica.abort_relay(token) || replica.unhold(token);
        self.run_replica(now);
        was
    }

    /// Relays a part of a fleet tool asked of another replica (`crate::gather`).
    pub(super) fn send_part(
        &mut self,
        now: Instant,
        token: HttpToken,
        replica: String,
        request: HttpRequest,
        timeout: Duration,
    ) {
        self.with_replica(now, |r| r.relay_part(token, replica, request, timeout));
    }

    /// A part still open is given up: its replica is told.
    pub(super) fn cancel_part(&mut self, token: HttpToken) {
        let Some(replica) = self.cluster.as_mut() else {
            return;
        };
        replica.abort_part(token);
        while let Some(action) = replica.poll_action() {
            self.outputs.push_back(Output::Cluster(action));
        }
    }

    /// A request another replica relayed here is served (counted).
    pub(super) fn admit_relayed(&mut self) {
        if let Some(r) = self.cluster.as_mut() {
            r.relayed_in();
        }
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
        let Some(replica) = self.cluster.as_mut() else {
            return;
        };
        let older = replica.wait_for_claim(
            &project,
            Waiting {
                uplink: id,
                sled,
                key,
            },
        );
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
        self.with_replica(now, |r| r.claim(now, &project, epoch_seen));
    }

    /// An uplink that waited for a claim or a pin, or held a claim, is gone (called by
    /// `drop_uplink`).
    pub(super) fn cluster_uplink_gone(&mut self, now: Instant, id: UplinkId, project: &str) {
        if self.pin_uplink_gone(id, project) {
            return;
        }
        self.with_replica(now, |r| r.handle_uplink_gone(now, id, project));
    }

    // ---- events in ----

    pub(super) fn on_cluster(&mut self, now: Instant, event: ClusterEvent) {
        if self.cluster.is_none() {
            tracing::debug!(?event, "a cluster event for a gateway outside any cluster");
            return;
        }
        match event {
            ClusterEvent::Entry {
                project,
                revision,
                state,
            } => self.with_replica(now, |r| r.handle_entry(now, &project, revision, state)),
            ClusterEvent::Claimed { project, outcome } => {
                self.with_replica(now, |r| r.handle_claim_outcome(now, &project, outcome))
            }
            ClusterEvent::Engine { up } => self.with_replica(now, |r| r.handle_engine(now, up)),
            ClusterEvent::Relayed { token, message } => {
                if Gathers::is_internal(token) {
                    self.part_message(now, token, message);
                } else {
                    self.with_replica(now, |r| r.handle_relayed(token, message));
                }
            }
            ClusterEvent::RelayFailed { token, sent } => {
                if Gathers::is_internal(token) {
                    self.part_failed(now, token, sent);
                } else {
                    self.with_replica(now, |r| r.handle_relay_failed(now, token, sent));
                }
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
            ClusterEvent::PinCreated { project, outcome } => {
                self.pin_created(now, project, outcome)
            }
            ClusterEvent::PinChanged { project, pin } => self.pin_changed(now, project, pin),
            ClusterEvent::Announced(news) => self.announced(news),
            ClusterEvent::ToolsChanged { project, listing } => {
                self.tools_changed_elsewhere(&project, listing)
            }
        }
    }

    pub(super) fn cluster_timeout(&mut self, now: Instant) {
        let due = self
            .cluster
            .as_ref()
            .and_then(Replica::poll_timeout)
            .is_some_and(|at| at <= now);
        if due {
            self.with_replica(now, |r| r.handle_timeout(now));
        }
        self.parts_expired(now);
    }

    /// Shutdown: no new claims; relays and requests still waiting are failed.
    pub(super) fn cluster_shutdown(&mut self, now: Instant) {
        self.records_shutdown();
        self.with_replica(now, Replica::handle_shutdown);
    }

    // ---- events out ----

    fn on_replica_event(&mut self, now: Instant, event: ReplicaEvent) {
        match event {
            ReplicaEvent::Serve {
                project,
                epoch,
                waiting,
            } => self.go_live(
                now,
                waiting.uplink,
                project,
                waiting.sled,
                waiting.key,
                Some(epoch),
            ),
            ReplicaEvent::StopServing {
                project,
                waiting,
                reason,
            } => self.stop_serving(now, &project, waiting, reason),
            ReplicaEvent::ServeAgain { token, request } => self.on_http(now, token, request),
            ReplicaEvent::Answer { token, message } => {
                use crate::cluster::RelayMessage;
                let output = match message {
                    RelayMessage::Reply(reply) => Output::Http { token, reply },
                    RelayMessage::Open => Output::StreamOpen { token },
                    RelayMessage::Event { id, data } => Output::StreamEvent { token, id, data },
                    RelayMessage::Close => Output::StreamClose { token },
                };
                self.outputs.push_back(output);
            }
            ReplicaEvent::RelayFailed {
                token,
                relay,
                error,
            } => {
                let e = match error {
                    RelayError::Lost(loss) => RpcError::UplinkLost {
                        sled: self.sled_of(&relay.project),
                        project: relay.project,
                        loss,
                    },
                    RelayError::ShuttingDown => RpcError::ShuttingDown,
                };
                self.answer_relay_error(token, &relay.id, relay.modern, relay.streaming, &e);
            }
            ReplicaEvent::Refused { token } => self.http_error(token, HttpError::ShuttingDown),
            ReplicaEvent::HolderChanged { project } => self.holder_news(&project),
        }
    }

    /// The claim was lost: this replica's uplinks of the project must not serve any more.
    fn stop_serving(
        &mut self,
        now: Instant,
        project: &str,
        waiting: Option<UplinkId>,
        reason: Loss,
    ) {
        let why = match &reason {
            Loss::TakenOver { by: Some(r), .. } => format!("gateway replica '{r}' claimed it"),
            Loss::TakenOver { by: None, .. } => "another claim was written".into(),
            Loss::Deleted { .. } => "its claim was deleted".into(),
            Loss::Expired { .. } => "its claim expired".into(),
            Loss::Conflict { .. } => "a refresh of its claim found another write".into(),
            Loss::EpochOutOfReach { epoch_seen, .. } => {
                format!("the sled reports epoch {epoch_seen}, beyond what the cluster can reach")
            }
            // Shutting down closes every uplink itself, as going away.
            Loss::ShuttingDown => return,
        };
        tracing::warn!(project, ?reason, "no longer serving the project: {why}");
        #[cfg(feature = "planted-bugs")]
        if self.config.planted == Some(super::PlantedBug::ServeAfterLosingClaim) {
            return;
        }
        let live = self.projects.get(project).and_then(|s| s.uplink);
        for id in waiting.into_iter().chain(live) {
            self.drop_uplink(
                now,
                id,
                UplinkLoss::Superseded,
                Some((
                    CloseCode::Superseded,
                    format!(
                        "this gateway replica no longer holds project '{project}': {why}; \
                         connect again"
                    ),
                )),
            );
        }
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

    /// What the engine must do that no machine decides (announcements, tool listings).
    pub(super) fn cluster_output(&mut self, action: ClusterAction) {
        if self.clustered() {
            self.outputs.push_back(Output::Cluster(action));
        }
    }
}
