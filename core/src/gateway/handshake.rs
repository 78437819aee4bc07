//! A sled's handshake, from its hello to its welcome: the hello is checked (registration,
//! token, protocol), the sled's identity proved against its pin (story 1206, first use pins it,
//! in the engine in a cluster), the project claimed (in a cluster), and the uplink goes live
//! with its epoch. `sled.rs` hands hellos and proofs here; the engine's door (`engine.rs`)
//! hands won claims and created pins. It calls down, into `uplinks.rs` and the features.

use super::*;
use crate::identity::{self, Pin};
use crate::registry::ProjectSpec;
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
        token: Option<crate::Secret>,
        key: Option<String>,
    ) {
        match self.handshake(&project).hello(
            protocol,
            &project,
            token.as_ref().map(crate::Secret::expose),
            key.as_deref(),
        ) {
            HelloVerdict::Refuse(code, reason) => {
                tracing::warn!(uplink = id.0, project, sled, "uplink refused: {reason}");
                self.close_uplink(now, id, code, reason)
            }
            HelloVerdict::RefuseIdentity(reason) => {
                self.refuse_identity(now, id, &project, sled, None, reason)
            }
            HelloVerdict::Accept { authenticated } => {
                self.accept_uplink(now, id, project, sled, None, authenticated)
            }
            HelloVerdict::Challenge {
                verifying,
                token_checked,
            } => {
                let key = key.expect("a challenge is for a hello with a key");
                self.challenge(id, project, sled, key, verifying, token_checked);
            }
        }
    }

    /// What the handshake knows of `project` now.
    fn handshake(&self, project: &str) -> Handshake<'_> {
        Handshake {
            spec: self.registry.get(project).map(|(_, spec)| spec),
            pin: self.pins.get(project),
            require_identity: self.config.require_identity,
            pins_shared: self.pins_shared(),
            public_name: self.config.public_name.as_deref(),
            allow_unauthenticated: self.registry.allows_unauthenticated_uplinks(),
        }
    }

    /// Makes a sled that passed every check its project's uplink: an older one is replaced,
    /// the sled is welcomed and its tools are fetched. In a cluster, the uplink first waits
    /// for this replica to win the project's claim (`cluster.rs`), and is welcomed with the
    /// claim's epoch. A sled that proved nothing (no token, no pinned key: a project under
    /// `allow_unauthenticated_uplinks`) never replaces a live uplink, here or on another
    /// replica: it is closed 4009 and tries again once that one is gone.
    pub(super) fn accept_uplink(
        &mut self,
        now: Instant,
        id: UplinkId,
        project: String,
        sled: String,
        key: Option<String>,
        authenticated: bool,
    ) {
        if !authenticated && self.has_live_uplink(now, &project) {
            tracing::warn!(
                uplink = id.0,
                project,
                sled,
                "unauthenticated uplink refused: the project has a live one"
            );
            return self.close_uplink(
                now,
                id,
                CloseCode::Occupied,
                format!(
                    "project '{project}' has a live uplink, and a sled that presented neither \
                     its token nor its pinned key cannot replace it"
                ),
            );
        }
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
        let (epoch_seen, moving) = (uplink.epoch_seen, uplink.moving);
        tracing::info!(
            uplink = id.0,
            project,
            ?epoch_seen,
            moving,
            "claiming the project"
        );
        self.claim(now, &project, epoch_seen, moving);
    }

    /// Whether `project` is served by a live uplink, here or (by the directory's live claim)
    /// on another replica.
    fn has_live_uplink(&self, _now: Instant, project: &str) -> bool {
        self.projects
            .get(project)
            .is_some_and(|s| s.uplink.is_some())
            || self.held_elsewhere(project).is_some()
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

    /// Sends a sled that presented a key its challenge: a fresh nonce to sign.
    fn challenge(
        &mut self,
        id: UplinkId,
        project: String,
        sled: String,
        key: String,
        verifying: ed25519_dalek::VerifyingKey,
        token_checked: bool,
    ) {
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
                token_checked,
            }));
            self.outputs.push_back(Output::UplinkSend {
                uplink: id,
                text: challenge.to_text(),
            });
        }
    }

    /// The sled's signature of its challenge, made for the gateway named `gateway`: the name
    /// and the signature verified, then its key is checked against the project's pin (or
    /// pinned, the first time).
    pub(in crate::gateway) fn on_proof(
        &mut self,
        now: Instant,
        id: UplinkId,
        signature: &str,
        gateway: Option<&str>,
    ) {
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
        let verdict = self
            .handshake(&proving.project)
            .proof(&proving, signature, gateway);
        // A key pinned by this very proof proves nothing: without the project's token, such a
        // sled may not replace a live uplink, and its key is not pinned.
        if !proving.token_checked
            && matches!(verdict, ProofVerdict::PinHere | ProofVerdict::PinInEngine)
            && self.has_live_uplink(now, &proving.project)
        {
            let project = &proving.project;
            return self.close_uplink(
                now,
                id,
                CloseCode::Occupied,
                format!(
                    "project '{project}' has a live uplink, and a sled that presented neither \
                     its token nor its pinned key cannot replace it"
                ),
            );
        }
        let Proving {
            project,
            sled,
            key,
            token_checked,
            ..
        } = proving;
        match verdict {
            ProofVerdict::Refuse(code, reason) => self.close_uplink(now, id, code, reason),
            ProofVerdict::RefuseIdentity(reason) => {
                self.refuse_identity(now, id, &project, sled, Some(key), reason)
            }
            ProofVerdict::Accept => self.accept_uplink(now, id, project, sled, Some(key), true),
            ProofVerdict::PinHere => {
                tracing::info!(project, sled, key, "sled identity pinned on first use");
                self.pins.pins.insert(
                    project.clone(),
                    Pin {
                        key: key.clone(),
                        sled: sled.clone(),
                    },
                );
                self.save_pins_soon(now);
                self.accept_uplink(now, id, project, sled, Some(key), token_checked);
            }
            // In a cluster (or with pins in the store), the first use is one create in the
            // engine: the uplink waits for it.
            ProofVerdict::PinInEngine => {
                let older = self.create_pin(id, project.clone(), sled, key);
                if let Some(old) = older {
                    self.close_uplink(
                        now,
                        old,
                        CloseCode::Replaced,
                        format!("replaced by a newer uplink for project '{project}'"),
                    );
                }
            }
        }
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

/// The sled handshake's decisions, pure (like `meta.rs`'s rewrite of a request): what a
/// hello, and then its proof, come to, given what the gateway knows of the project. The
/// gateway carries the verdicts out (`Gateway::on_hello`, `Gateway::on_proof`).
pub(super) struct Handshake<'a> {
    /// The project's registration, if it is registered.
    spec: Option<&'a ProjectSpec>,
    /// The project's pin, if it has one.
    pin: Option<&'a Pin>,
    /// Every sled must present an identity key (`require_identity`).
    require_identity: bool,
    /// A first-use pin is created in the engine (a cluster), not here.
    pins_shared: bool,
    /// The name a proof must be made for (`Config::public_name`); `None`: any.
    public_name: Option<&'a str>,
    /// `allow_unauthenticated_uplinks`: a project with neither a token nor a pin takes any
    /// sled (and pins the first key it sees).
    allow_unauthenticated: bool,
}

/// What a hello comes to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum HelloVerdict {
    /// Closed at once: a protocol this gateway does not speak, an unregistered project (the
    /// reason names no other project: the sled has proved nothing yet), or a missing or wrong
    /// uplink token.
    Refuse(CloseCode, String),
    /// Refused for its identity (recorded in the project's health).
    RefuseIdentity(String),
    /// Challenged to prove it holds the key it presented; `token_checked` when it also
    /// presented its project's uplink token.
    Challenge {
        verifying: ed25519_dalek::VerifyingKey,
        token_checked: bool,
    },
    /// Accepted without an identity: it presented no key and none is needed.
    /// `authenticated` when it presented its project's uplink token; when not, the project
    /// is open (`allow_unauthenticated_uplinks`) and the sled may not replace a live one.
    Accept { authenticated: bool },
}

/// What a proof of identity comes to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ProofVerdict {
    /// Closed: its project was unregistered while it proved itself.
    Refuse(CloseCode, String),
    /// The signature is wrong, or the key is not the pinned one.
    RefuseIdentity(String),
    /// The key is the project's pin.
    Accept,
    /// The project has no pin: this key becomes it, here (the sled is authenticated only
    /// if it presented its project's token: `Proving::token_checked`).
    PinHere,
    /// The project has no pin: this key is pinned in the engine, whose answer it waits for.
    PinInEngine,
}

impl Handshake<'_> {
    /// A hello for `project`, with the uplink `token` and identity `key` it presented.
    pub(super) fn hello(
        &self,
        protocol: u32,
        project: &str,
        token: Option<&str>,
        key: Option<&str>,
    ) -> HelloVerdict {
        if protocol != PROTOCOL_VERSION {
            return HelloVerdict::Refuse(
                CloseCode::ProtocolError,
                format!(
                    "uplink protocol {protocol} is not supported; this gateway speaks \
                     {PROTOCOL_VERSION}"
                ),
            );
        }
        let Some(spec) = self.spec else {
            return HelloVerdict::Refuse(
                CloseCode::UnknownProject,
                format!("project '{project}' is not registered at this gateway"),
            );
        };
        let token_checked = spec.token.is_some();
        if spec.token.is_none() && self.pin.is_none() && !self.allow_unauthenticated {
            return HelloVerdict::Refuse(
                CloseCode::Unauthorized,
                format!(
                    "project '{project}' has neither an uplink token nor a pinned identity key, \
                     so no sled can prove it is its own; give it a `token` in projects.toml, \
                     pin its key (fleet_identity repin), or set \
                     allow_unauthenticated_uplinks = true for local use"
                ),
            );
        }
        if let Some(required) = &spec.token {
            if !token.is_some_and(|t| required.matches(t)) {
                let why = if token.is_none() {
                    "no token"
                } else {
                    "a wrong token"
                };
                return HelloVerdict::Refuse(
                    CloseCode::Unauthorized,
                    format!("project '{project}' requires its uplink token; the hello had {why}"),
                );
            }
        }
        let Some(key) = key else {
            if self.pin.is_some() {
                return HelloVerdict::RefuseIdentity(format!(
                    "project '{project}' has a pinned identity key and the hello presented none"
                ));
            }
            if self.require_identity {
                return HelloVerdict::RefuseIdentity(
                    "this gateway requires every sled to present an identity key".to_owned(),
                );
            }
            return HelloVerdict::Accept {
                authenticated: token_checked,
            };
        };
        match identity::parse_key(key) {
            Ok(verifying) => HelloVerdict::Challenge {
                verifying,
                token_checked,
            },
            Err(e) => HelloVerdict::RefuseIdentity(format!("the hello's key is unusable: {e}")),
        }
    }

    /// The `signature` of the challenge `proving` was sent, made for the gateway named
    /// `gateway`.
    pub(super) fn proof(
        &self,
        proving: &Proving,
        signature: &str,
        gateway: Option<&str>,
    ) -> ProofVerdict {
        let Proving {
            project,
            key,
            verifying,
            nonce,
            ..
        } = proving;
        let Some(gateway) = gateway else {
            return ProofVerdict::RefuseIdentity(
                "the identity proof names no gateway: a sled signs the name of the gateway it \
                 dialed with the nonce and the project (uplink identity v2)"
                    .to_owned(),
            );
        };
        let signed_for = identity::gateway_name(gateway);
        if let Some(public) = self.public_name {
            if signed_for != identity::gateway_name(public) {
                return ProofVerdict::RefuseIdentity(format!(
                    "the identity proof was made for gateway '{signed_for}', and this gateway is \
                     '{public}': a proof is good only for the gateway the sled dialed (the \
                     gateway's public name must be the host in its sleds' uplink URL)"
                ));
            }
        }
        if let Err(e) =
            identity::verify_challenge(verifying, &signed_for, project, nonce, signature)
        {
            return ProofVerdict::RefuseIdentity(format!("the identity proof failed: {e}"));
        }
        if self.spec.is_none() {
            return ProofVerdict::Refuse(
                CloseCode::UnknownProject,
                format!("project '{project}' is no longer registered"),
            );
        }
        match self.pin {
            Some(pin) if pin.key == *key => ProofVerdict::Accept,
            Some(pin) => ProofVerdict::RefuseIdentity(format!(
                "project '{project}' is pinned to key {}; this sled presented {key}",
                pin.key
            )),
            None if self.pins_shared => ProofVerdict::PinInEngine,
            None => ProofVerdict::PinHere,
        }
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
    /// The hello presented its project's uplink token.
    token_checked: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Secret;
    use ed25519_dalek::SigningKey;

    fn spec(token: Option<&str>) -> ProjectSpec {
        let mut spec = ProjectSpec::new("alpha", "http://alpha.invalid");
        spec.token = token.map(Secret::new);
        spec
    }

    fn key(seed: u8) -> (SigningKey, String) {
        let signing = SigningKey::from_bytes(&[seed; 32]);
        let public = identity::encode_key(&signing.verifying_key());
        (signing, public)
    }

    fn proving(public: &str) -> Proving {
        Proving {
            project: "alpha".into(),
            sled: "alpha-sled".into(),
            key: public.to_owned(),
            verifying: identity::parse_key(public).expect("a key"),
            nonce: [7; 32],
            token_checked: false,
        }
    }

    /// A proof made for the gateway `gw.example`.
    fn signed(signing: &SigningKey) -> String {
        signed_for(signing, "gw.example")
    }

    fn signed_for(signing: &SigningKey, gateway: &str) -> String {
        identity::sign_challenge(signing, gateway, "alpha", &identity::encode_bytes(&[7; 32]))
            .expect("a signature")
    }

    const GW: Option<&str> = Some("gw.example");

    #[test]
    fn a_hello_is_refused_for_its_protocol_its_project_or_its_token_and_names_no_other_project() {
        let s = spec(Some("sixteen-chars-token"));
        let h = Handshake {
            spec: Some(&s),
            pin: None,
            require_identity: false,
            pins_shared: false,
            public_name: None,
            allow_unauthenticated: true,
        };
        let code = |v: HelloVerdict| match v {
            HelloVerdict::Refuse(code, _) => Some(code),
            _ => None,
        };
        assert_eq!(
            code(h.hello(PROTOCOL_VERSION + 1, "alpha", None, None)),
            Some(CloseCode::ProtocolError)
        );
        assert_eq!(
            code(h.hello(PROTOCOL_VERSION, "alpha", None, None)),
            Some(CloseCode::Unauthorized)
        );
        assert_eq!(
            code(h.hello(PROTOCOL_VERSION, "alpha", Some("sixteen-chars-tokeN"), None)),
            Some(CloseCode::Unauthorized)
        );
        assert_eq!(
            h.hello(PROTOCOL_VERSION, "alpha", Some("sixteen-chars-token"), None),
            HelloVerdict::Accept {
                authenticated: true
            }
        );
        let unregistered = Handshake { spec: None, ..h };
        assert_eq!(
            unregistered.hello(PROTOCOL_VERSION, "zeta", None, None),
            HelloVerdict::Refuse(
                CloseCode::UnknownProject,
                "project 'zeta' is not registered at this gateway".into()
            )
        );
    }

    #[test]
    fn a_hello_without_a_key_is_refused_when_its_project_is_pinned_or_identity_is_required() {
        let s = spec(None);
        let (_, public) = key(1);
        let pin = Pin {
            key: public.clone(),
            sled: "alpha-sled".into(),
        };
        let pinned = Handshake {
            spec: Some(&s),
            pin: Some(&pin),
            require_identity: false,
            pins_shared: false,
            public_name: None,
            allow_unauthenticated: true,
        };
        assert!(matches!(
            pinned.hello(PROTOCOL_VERSION, "alpha", None, None),
            HelloVerdict::RefuseIdentity(_)
        ));
        let required = Handshake {
            pin: None,
            require_identity: true,
            ..pinned
        };
        assert!(matches!(
            required.hello(PROTOCOL_VERSION, "alpha", None, None),
            HelloVerdict::RefuseIdentity(_)
        ));
        assert!(matches!(
            required.hello(PROTOCOL_VERSION, "alpha", None, Some(&public)),
            HelloVerdict::Challenge { .. }
        ));
        assert!(matches!(
            required.hello(PROTOCOL_VERSION, "alpha", None, Some("not base64!")),
            HelloVerdict::RefuseIdentity(_)
        ));
    }

    #[test]
    fn a_proof_is_checked_then_matched_against_the_pin_or_pins_it_first() {
        let s = spec(None);
        let (signing, public) = key(1);
        let (other, other_public) = key(2);
        let first_use = Handshake {
            spec: Some(&s),
            pin: None,
            require_identity: false,
            pins_shared: false,
            public_name: None,
            allow_unauthenticated: true,
        };
        assert_eq!(
            first_use.proof(&proving(&public), &signed(&signing), GW),
            ProofVerdict::PinHere
        );
        let shared = Handshake {
            pins_shared: true,
            ..first_use
        };
        assert_eq!(
            shared.proof(&proving(&public), &signed(&signing), GW),
            ProofVerdict::PinInEngine
        );
        // A signature by another key proves nothing.
        assert!(matches!(
            first_use.proof(&proving(&public), &signed(&other), GW),
            ProofVerdict::RefuseIdentity(_)
        ));
        let pin = Pin {
            key: public.clone(),
            sled: "alpha-sled".into(),
        };
        let pinned = Handshake {
            pin: Some(&pin),
            ..first_use
        };
        assert_eq!(
            pinned.proof(&proving(&public), &signed(&signing), GW),
            ProofVerdict::Accept
        );
        assert!(matches!(
            pinned.proof(&proving(&other_public), &signed(&other), GW),
            ProofVerdict::RefuseIdentity(_)
        ));
        let gone = Handshake {
            spec: None,
            ..pinned
        };
        assert!(matches!(
            gone.proof(&proving(&public), &signed(&signing), GW),
            ProofVerdict::Refuse(CloseCode::UnknownProject, _)
        ));
    }

    #[test]
    fn a_proof_made_for_another_gateway_name_is_refused() {
        let s = spec(None);
        let (signing, public) = key(1);
        let named = Handshake {
            spec: Some(&s),
            pin: None,
            require_identity: false,
            pins_shared: false,
            public_name: Some("GW.example"),
            allow_unauthenticated: true,
        };
        // Made for this gateway (names compare as hosts do): good.
        assert_eq!(
            named.proof(&proving(&public), &signed(&signing), Some("gw.EXAMPLE.")),
            ProofVerdict::PinHere
        );
        // Made for another name, say by a gateway that relayed this one's challenge: refused,
        // naming both, even though the signature is good for the name it names.
        let elsewhere = signed_for(&signing, "evil.example");
        match named.proof(&proving(&public), &elsewhere, Some("evil.example")) {
            ProofVerdict::RefuseIdentity(reason) => assert!(
                reason.contains("'evil.example'") && reason.contains("'GW.example'"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        // A proof that claims this gateway but was signed for another does not verify.
        assert!(matches!(
            named.proof(&proving(&public), &elsewhere, GW),
            ProofVerdict::RefuseIdentity(_)
        ));
        // No name at all: refused, whatever the configuration.
        let unnamed = Handshake {
            public_name: None,
            ..named
        };
        assert!(matches!(
            unnamed.proof(&proving(&public), &signed(&signing), None),
            ProofVerdict::RefuseIdentity(_)
        ));
        // Without a public name, a proof for any name verifies against the name it names.
        assert_eq!(
            unnamed.proof(&proving(&public), &elsewhere, Some("evil.example")),
            ProofVerdict::PinHere
        );
    }
}
