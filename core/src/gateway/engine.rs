//! The engine's door: what the cluster's engine reports comes in here ([`Gateway::on_cluster`]),
//! and what the replica machine asks of the gateway is carried out here after every input
//! (`Gateway::settle`, in the run loop): uplinks welcomed or closed as claims are won or lost, held requests
//! served again, relayed answers passed to their clients. It sits on the top floor with the
//! other doors (`client.rs`, `sled.rs`): it calls down into them, and nothing calls it but
//! the run loop.

use std::time::Instant;

use crate::cluster::{ClusterAction, ClusterEvent, PinOutcome, RelayMessage, RelaySent};
use crate::directory::Loss;
use crate::error::{HttpError, RpcError, UplinkLoss};
use crate::gather::Gathers;
use crate::gather::{Answer, Purpose};
use crate::metrics::Outcome;
use crate::replica::{RelayError, ReplicaEvent};
use crate::uplink::CloseCode;
use crate::{HttpToken, UplinkId};

use super::fleet::millis;
use super::{Gateway, Output, UplinkState};

impl Gateway {
    // ---- events in ----

    pub(super) fn on_cluster(&mut self, now: Instant, event: ClusterEvent) {
        // A single gateway that keeps its sessions (and pins) in a store hears of its reads
        // and writes.
        let a_store_answer = matches!(
            event,
            ClusterEvent::SessionLoaded { .. }
                | ClusterEvent::SessionStored { .. }
                | ClusterEvent::CoordStored { .. }
        );
        let a_pin = matches!(event, ClusterEvent::PinCreated { .. }) && self.pins_shared();
        let heard = self.clustered() || (a_store_answer && self.keeps_sessions()) || a_pin;
        if !heard {
            tracing::debug!(?event, "a cluster event for a gateway outside any cluster");
            return;
        }
        match event {
            ClusterEvent::Entry {
                project,
                revision,
                state,
            } => self.replica_news(|r| r.handle_entry(now, &project, revision, state)),
            ClusterEvent::Claimed { project, outcome } => {
                self.replica_news(|r| r.handle_claim_outcome(now, &project, outcome))
            }
            ClusterEvent::Engine { up } => self.replica_news(|r| r.handle_engine(now, up)),
            ClusterEvent::Relayed { token, message } => {
                if Gathers::is_internal(token) {
                    self.part_message(now, token, message);
                } else {
                    self.replica_news(|r| r.handle_relayed(token, message));
                }
            }
            ClusterEvent::RelayFailed { token, sent } => {
                if Gathers::is_internal(token) {
                    self.part_failed(now, token, sent);
                } else {
                    self.replica_news(|r| r.handle_relay_failed(now, token, sent));
                }
            }
            ClusterEvent::SessionLoaded {
                session,
                record,
                under_previous_secret,
            } => {
                let found = matches!(record, Ok(Some(_)));
                // Handled again, now with the session known (or refused).
                let parked = self.session_loaded(now, session.clone(), record);
                self.again.extend(parked);
                // During a roll of the cluster secret, a session in use is written again
                // under the current one where it is read (see `reseal_tools`).
                if found && under_previous_secret {
                    self.store_session(now, &session);
                }
            }
            ClusterEvent::SessionChanged { session, record } => {
                self.session_changed_elsewhere(session, record)
            }
            ClusterEvent::SessionStored { session, written } => {
                self.session_stored(&session, written)
            }
            ClusterEvent::CoordStored { batch, failed } => self.coordination_stored(batch, failed),
            ClusterEvent::CoordLoaded { project, records } => {
                // The state is in place before the uplink serves (the replica machine's
                // `Serve` is carried out after this input).
                let read = records.is_ok();
                if project == crate::tasks::GATEWAY_PROJECT {
                    // A replica's own tasks, read back at its start: only those it ran (their
                    // ids name it; another replica's are that one's), and none it has made
                    // since it started.
                    let mine = self.replica_name().map(|r| format!("{r}."));
                    let records: Vec<_> = records
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|r| {
                            crate::tasks::parse_record_key(&r.key).is_some_and(|(p, id)| {
                                p == project
                                    && mine.as_deref().is_some_and(|m| id.starts_with(m))
                                    && self.tasks.get(&p, &id).is_none()
                            })
                        })
                        .collect();
                    let n = self.tasks.restore(now, records);
                    if n > 0 {
                        tracing::info!(tasks = n, "this replica's own tasks are read back");
                    }
                    return;
                }
                if let Ok(records) = records {
                    let (tasks, records): (Vec<_>, Vec<_>) = records
                        .into_iter()
                        .partition(|r| crate::tasks::is_record_key(&r.key));
                    let tasks = self.tasks.replace_project(now, &project, tasks);
                    let restored = self
                        .coordination
                        .coord
                        .replace_project(now, &project, records);
                    tracing::info!(
                        project,
                        leases = restored.leases,
                        board_keys = restored.board_keys,
                        messages = restored.messages,
                        tasks,
                        skipped = restored.skipped,
                        "the project's coordination state is read"
                    );
                }
                self.replica_news(|r| r.handle_coord_loaded(now, &project, read));
            }
            ClusterEvent::PinCreated { project, outcome } => {
                self.pin_created(now, project, outcome)
            }
            ClusterEvent::PinChanged {
                project,
                pin,
                under_previous_secret,
            } => {
                let present = pin.is_some();
                self.pin_changed(now, project.clone(), pin);
                if under_previous_secret && present {
                    self.pins_under_previous.insert(project.clone());
                } else {
                    self.pins_under_previous.remove(&project);
                }
                self.reseal_pin(&project);
            }
            ClusterEvent::Announced(news) => self.announced(news),
            ClusterEvent::ToolsChanged {
                project,
                listing,
                under_previous_secret,
            } => {
                if under_previous_secret && self.is_live(&project) {
                    self.reseal_tools(&project, listing.as_deref());
                }
                self.tools_changed_elsewhere(&project, listing)
            }
        }
    }

    /// The cluster's deadlines: the replica machine's, and parts asked of other replicas.
    pub(super) fn cluster_timeout(&mut self, now: Instant) {
        self.replica_timeout(now);
        self.parts_expired(now);
    }

    // ---- events out ----

    pub(super) fn on_replica_event(&mut self, now: Instant, event: ReplicaEvent) {
        match event {
            ReplicaEvent::Serve {
                project,
                epoch,
                waiting,
            } => {
                self.go_live(
                    now,
                    waiting.uplink,
                    project.clone(),
                    waiting.sled,
                    waiting.key,
                    Some(epoch),
                );
                self.reseal_pin(&project);
            }
            ReplicaEvent::StopServing {
                project,
                waiting,
                reason,
                handover,
            } => self.stop_serving(now, &project, waiting, reason, handover),
            ReplicaEvent::ServeAgain { token, request } => self.again.push_back((token, request)),
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
        handover: bool,
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
        let mut live = self.projects.get(project).and_then(|s| s.uplink);
        #[cfg(feature = "planted-bugs")]
        let handover =
            handover && self.config.planted != Some(super::PlantedBug::HandoverCutsCalls);
        if handover {
            // Make-before-break: the sled moved; the calls running here are answered first.
            if let Some(id) = live.take() {
                tracing::info!(
                    project,
                    "handed over ({why}); the old uplink finishes its calls"
                );
                self.retire_uplink(now, id);
            }
        }
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

    pub(super) fn pin_created(&mut self, now: Instant, project: String, outcome: PinOutcome) {
        let Some(w) = self.pin_waiter(&project) else {
            return;
        };
        if let Some(u) = self.uplinks.get_mut(&w.uplink) {
            u.state = UplinkState::AwaitingHello;
        }
        let key = w.key.clone().unwrap_or_default();
        let created = matches!(outcome, PinOutcome::Created);
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
                let kept = if self.clustered() {
                    "this gateway replica cannot reach the cluster's engine"
                } else {
                    "this gateway cannot write its state store"
                };
                return self.close_uplink(
                    now,
                    w.uplink,
                    CloseCode::HelloTimeout,
                    format!(
                        "project '{project}' has no pinned key yet and {kept} to pin one; \
                         connect again"
                    ),
                );
            }
        };
        let matches = pin.key == key;
        // A key pinned by this very hello proves nothing by itself: the sled is authenticated
        // if its project has a token (which the hello presented), or if the pin was there.
        let authenticated = !created
            || self
                .registry
                .get(&project)
                .is_some_and(|(_, spec)| spec.token.is_some());
        self.pins.pins.insert(project.clone(), pin.clone());
        self.save_pins_soon(now);
        if !matches {
            let reason = format!(
                "project '{project}' is pinned to key {}; this sled presented {key}",
                pin.key
            );
            return self.refuse_identity(now, w.uplink, &project, w.sled, Some(key), reason);
        }
        self.accept_uplink(now, w.uplink, project, w.sled, Some(key), authenticated);
    }

    /// Another replica pinned (or re-pinned) a project: this one follows.
    /// During a roll of the cluster secret, what the holder of a project's sled keeps in the
    /// engine for it and wrote under the previous secret (its tool listing and its pin: values
    /// nothing else writes again) is written again under the current one, so that dropping
    /// the previous secret afterwards leaves nothing unreadable. Only the holder does it, so
    /// replicas on either side of the roll never write a value back and forth.
    fn reseal_pin(&mut self, project: &str) {
        if self.is_live(project) && self.pins_under_previous.remove(project) {
            self.store_pin(project);
        }
    }

    fn reseal_tools(&mut self, project: &str, listing: Option<&str>) {
        if let Some(listing) = listing {
            self.cluster_output(ClusterAction::StoreTools {
                project: project.to_owned(),
                listing: listing.to_owned(),
            });
        }
    }

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

    /// A message of an internal relay's answer; `false` when `token` is a client's.
    pub(super) fn part_message(
        &mut self,
        now: Instant,
        token: HttpToken,
        message: RelayMessage,
    ) -> bool {
        if !Gathers::is_internal(token) {
            return false;
        }
        let done = self.gathers.on_message(token, message);
        if let Some((purpose, answer)) = done {
            self.part_answered(now, purpose, answer, false);
        }
        true
    }

    /// An internal relay that got no whole answer; `false` when `token` is a client's.
    pub(super) fn part_failed(&mut self, now: Instant, token: HttpToken, sent: RelaySent) -> bool {
        if !Gathers::is_internal(token) {
            return false;
        }
        let purpose = self.gathers.take(token);
        if let Some(purpose) = purpose {
            let why = match sent {
                RelaySent::NotSent => "no replica took it",
                RelaySent::EngineDown => "this replica could not reach the cluster's engine",
                RelaySent::Unknown => "the replica fell silent",
            };
            self.part_answered(now, purpose, Answer::Failed(why.into()), false);
        }
        true
    }

    /// Parts whose deadline passed: given up, and told to the replica asked.
    pub(super) fn parts_expired(&mut self, now: Instant) {
        for (token, purpose) in self.gathers.expired(now) {
            self.cancel_part(token);
            self.part_answered(
                now,
                purpose,
                Answer::Failed("no answer in time".into()),
                true,
            );
        }
    }

    fn part_answered(&mut self, now: Instant, purpose: Purpose, answer: Answer, late: bool) {
        match purpose {
            Purpose::Pipeline {
                fanout,
                project,
                replica,
                sent_at,
            } => match answer {
                Answer::Response { result, error } => self.on_fanout_answer(
                    now,
                    fanout,
                    project,
                    sent_at,
                    result.as_deref(),
                    error.as_deref(),
                ),
                Answer::Failed(why) => {
                    let (reason, outcome, detail) = if late {
                        let waited = self.fanout_sled_timeout(fanout);
                        (
                            "timed_out",
                            Outcome::Timeout,
                            format!(
                                "no answer within {} ms from replica '{replica}', which holds its sled",
                                millis(waited)
                            ),
                        )
                    } else {
                        (
                            "error",
                            Outcome::Error,
                            format!("relayed to replica '{replica}', which holds its sled: {why}"),
                        )
                    };
                    self.fail_fanout_part(now, fanout, &project, reason, detail, outcome);
                }
            },
            Purpose::Health { gather, replica } => self.health_part(gather, &replica, answer),
            Purpose::Wait { wait } => self.wait_part_answered(now, wait, answer),
        }
    }
}
