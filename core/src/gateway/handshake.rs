//! A sled's handshake, from its hello to its welcome: the hello is checked (registration,
//! token, protocol), the sled's identity proved against its pin (story 1206, first use pins it,
//! in the engine in a cluster), the project claimed (in a cluster), and the uplink goes live
//! with its epoch. `sled.rs` hands hellos and proofs here; the engine's door (`engine.rs`)
//! hands won claims and created pins. It calls down, into `uplinks.rs` and the features.

use super::*;
use crate::identity::{self, Pin};
use fleet::Refusal;
use rand_chacha::rand_core::RngCore;

impl Gateway {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_hello(
        &mut self,
        now: Instant,
        id: UplinkId,
        protocol: u32,
        project: String,
        sled: String,
        token: Option<String>,
        key: Option<String>,
    ) {
        if protocol != PROTOCOL_VERSION {
            return self.close_uplink(now,
                id,
                CloseCode::ProtocolError,
                format!("uplink protocol {protocol} is not supported; this gateway speaks {PROTOCOL_VERSION}"),
            );
        }
        if self.registry.get(&project).is_none() {
            tracing::warn!(
                uplink = id.0,
                project,
                sled,
                "uplink for an unregistered project refused"
            );
            // The reason names no other project: an uplink has proved nothing yet, and the
            // registered names are not its to learn (security review, finding 11).
            return self.close_uplink(
                now,
                id,
                CloseCode::UnknownProject,
                format!("project '{project}' is not registered at this gateway"),
            );
        }
        let (_, spec) = self.registry.get(&project).expect("checked just above");
        if let Some(required) = &spec.token {
            if !token.as_deref().is_some_and(|t| required.matches(t)) {
                let why = if token.is_none() {
                    "no token"
                } else {
                    "a wrong token"
                };
                tracing::warn!(uplink = id.0, project, sled, "uplink refused: {why}");
                return self.close_uplink(
                    now,
                    id,
                    CloseCode::Unauthorized,
                    format!("project '{project}' requires its uplink token; the hello had {why}"),
                );
            }
        }
        self.hello_identity(now, id, project, sled, key);
    }

    /// Makes a sled that passed every check its project's uplink: an older one is replaced,
    /// the sled is welcomed and its tools are fetched. In a cluster, the uplink first waits
    /// for this replica to win the project's claim (`cluster.rs`), and is welcomed with the
    /// claim's epoch.
    pub(super) fn accept_uplink(
        &mut self,
        now: Instant,
        id: UplinkId,
        project: String,
        sled: String,
        key: Option<String>,
    ) {
        if self.clustered() && self.registry.get(&project).is_some() {
            return self.await_claim(now, id, project, sled, key);
        }
        self.go_live(now, id, project, sled, key, None);
    }

    /// Parks an uplink that passed every check until its project's claim is won. A newer
    /// uplink of the project replaces the one waiting, and the one serving, as on one gateway.
    fn await_claim(
        &mut self,
        now: Instant,
        id: UplinkId,
        project: String,
        sled: String,
        key: Option<String>,
    ) {
        let waiting = crate::replica::Waiting {
            uplink: id,
            sled,
            key,
        };
        let older = self.wait_for_claim(&project, waiting);
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
        self.claim(now, &project, epoch_seen);
    }

    /// The second half of [`Gateway::accept_uplink`]: `epoch` is the claim's, in a cluster.
    pub(super) fn go_live(
        &mut self,
        now: Instant,
        id: UplinkId,
        project: String,
        sled: String,
        key: Option<String>,
        epoch: Option<u64>,
    ) {
        if self.registry.get(&project).is_none() {
            return self.close_uplink(
                now,
                id,
                CloseCode::UnknownProject,
                format!("project '{project}' is no longer registered"),
            );
        }
        let state = self
            .projects
            .get_mut(&project)
            .expect("registered projects have a state");
        if let Some(old) = state.uplink.take() {
            tracing::info!(
                project,
                old = old.0,
                new = id.0,
                "uplink replaced by a newer connection"
            );
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
        tracing::info!(uplink = id.0, project, sled, "uplink live");
        let state = self
            .projects
            .get_mut(&project)
            .expect("registered projects have a state");
        state.uplink = Some(id);
        state.set_tools(None);
        state.health.connected_at = Some(now);
        state.health.probe = None;
        self.modern_listing = None;
        let uplink = self.uplinks.get_mut(&id).expect("the uplink said hello");
        uplink.key = key;
        // Fences never go back: the next grant is above the highest this sled accepted.
        if let Some(floor) = uplink.fence_floor {
            match self.coordination.coord.raise_fence_floor(&project, floor) {
                Ok(fence) => tracing::info!(project, floor, fence, "fence floor from the sled"),
                Err(e) => tracing::warn!(project, floor, "fence floor refused: {e}"),
            }
        }
        let uplink = self.uplinks.get_mut(&id).expect("the uplink said hello");
        uplink.state = UplinkState::Live {
            project: project.clone(),
        };
        if let Some(at) = uplink.timer.take() {
            self.timers.remove(&(at, Timer::Uplink(id)));
        }
        let at = now + self.config.heartbeat_interval;
        uplink.timer = Some(at);
        self.timers.insert((at, Timer::Uplink(id)));
        let welcome = Control::Welcome {
            protocol: PROTOCOL_VERSION,
            heartbeat_ms: u64::try_from(self.config.heartbeat_interval.as_millis())
                .unwrap_or(u64::MAX),
            epoch,
        };
        self.outputs.push_back(Output::UplinkSend {
            uplink: id,
            text: welcome.to_text(),
        });
        self.resubscribe_listeners(now, &project);
        self.start_refresh(now, id, project);
    }

    /// After a hello (its token already checked): a sled with a key is challenged; one without
    /// is accepted unless its project has a pin or identity is required.
    pub(in crate::gateway) fn hello_identity(
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
    pub(in crate::gateway) fn on_proof(&mut self, now: Instant, id: UplinkId, signature: &str) {
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
            None if self.pins_shared() => {
                let older = self.create_pin(id, project.clone(), sled, key);
                if let Some(old) = older {
                    self.close_uplink(
                        now,
                        old,
                        CloseCode::Replaced,
                        format!("replaced by a newer uplink for project '{project}'"),
                    );
                }
                return;
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

    pub(in crate::gateway) fn refuse_identity(
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
}

/// A sled's identity while it proves it holds its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::gateway) struct Proving {
    project: String,
    sled: String,
    /// The key as presented (base64).
    key: String,
    verifying: ed25519_dalek::VerifyingKey,
    nonce: [u8; 32],
}
