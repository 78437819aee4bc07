//! The replica machine: where this replica of a cluster serves each project, and what becomes
//! of the requests it sends to, or holds for, another replica (issue 23).
//!
//! Like [`Directory`], which it owns, it is sans-IO: the gateway feeds it the engine's news
//! (`handle_entry`, `handle_claim_outcome`, `handle_engine`, `handle_relayed`,
//! `handle_relay_failed`), uplinks that wait for a claim or went away, and the requests it
//! decides to relay or hold; it answers [`Replica::place`], and says what the gateway must do
//! through [`Replica::poll_event`] (uplinks to welcome or close, requests to serve again,
//! answers for clients) and [`Replica::poll_action`] (what the engine must do). Its deadlines
//! come out of [`Replica::poll_timeout`], and [`Replica::handle_timeout`] takes them.
//!
//! It does not keep sessions or pins: those are records kept in the engine
//! ([`crate::records::Records`]), the same on one gateway and on many.
//!
//! # Invariants
//! - A request is relayed at most once: a relayed request is served where it lands
//!   ([`Place::Relay`] is the caller's to refuse for one).
//! - Every relay ends exactly once: with its whole answer ([`ReplicaEvent::Answer`] ending in a
//!   reply or a close), served again here when nobody took it ([`ReplicaEvent::ServeAgain`]),
//!   or failed ([`ReplicaEvent::RelayFailed`]), including at shutdown.
//! - A relay to a replica that lost its project's claim fails as soon as the directory says so
//!   (`outcome: "unknown"`), not when its silence is noticed.
//! - A held request is served again when its project has a holder, when its move took longer
//!   than `move_grace`, or refused at shutdown; never kept for ever.
//! - A relay that could not be sent because the engine was out of reach waits for the engine,
//!   at most its call's timeout: served again when the engine is back, else answered
//!   `not_sent` (`engine_unreachable`). `outcome: "unknown"` is only ever said of a relay the
//!   owner may have taken and cannot account for: a relay lost in flight is asked after by the
//!   server's replica (`server/src/cluster/outcomes.rs`), which reports its owner's answer, or
//!   `RelaySent::EngineDown` when the owner never took it (so it is sent again here).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::cluster::{ClusterAction, ClusterConfig, ClusterCounts, RelayMessage, RelaySent};
use crate::directory::{Action, ClaimOutcome, Directory, EntryState, Epoch, Loss, Owner, Revision};
use crate::error::UplinkLoss;
use crate::io::{HttpRequest, HttpToken, UplinkId};
#[cfg(feature = "planted-bugs")]
use crate::PlantedBug;

/// How often a relay waiting for the engine is tried again, besides when the engine is said
/// to be back.
const ENGINE_RETRY: Duration = Duration::from_millis(500);

/// Where a project is served, as this replica knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    /// By this replica's own uplink (or by nobody, if it has none live).
    Here,
    /// By another replica, which takes relayed requests for it.
    Relay(String),
    /// Its sled left its replica a moment ago: a request may wait for its next one.
    Moving,
    /// This replica won its claim and reads the coordination state the last holder kept
    /// before it serves: a request waits (relayed here or not).
    Loading,
    /// By nobody this replica knows of.
    Nowhere,
}

/// A won claim whose project's coordination records are being read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Loading {
    epoch: Epoch,
    waiting: Waiting,
    /// A read that failed is asked again at this instant.
    again_at: Option<Instant>,
}

/// An uplink waiting for its project's claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Waiting {
    pub(crate) uplink: UplinkId,
    pub(crate) sled: String,
    pub(crate) key: Option<String>,
}

/// What the gateway must do, from [`Replica::poll_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReplicaEvent {
    /// The claim was won: the uplink that waited for it goes live at `epoch`.
    Serve {
        project: String,
        epoch: Epoch,
        waiting: Waiting,
    },
    /// The claim was lost: the project's uplinks here (the one that waited, and the live
    /// one) must not serve any more.
    StopServing {
        project: String,
        waiting: Option<UplinkId>,
        reason: Loss,
        /// This replica was handing the project over ([`Replica::begin_handover`]): its live
        /// uplink takes no new call, but the calls running on it are answered before it closes.
        handover: bool,
    },
    /// A request to handle again as if it just came: released from a hold, or a relay that
    /// nobody took.
    ServeAgain {
        token: HttpToken,
        request: HttpRequest,
    },
    /// A message of a relayed request's answer, for its client.
    Answer {
        token: HttpToken,
        message: RelayMessage,
    },
    /// A relayed request ended without a whole answer: its client gets `error`.
    RelayFailed {
        token: HttpToken,
        relay: Relay,
        error: RelayError,
    },
    /// A held request is refused: the replica shuts down.
    Refused { token: HttpToken },
    /// Whether another replica holds `project` changed (listings show it).
    HolderChanged { project: String },
}

/// Why a relay failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RelayError {
    Lost(UplinkLoss),
    ShuttingDown,
}

/// A request relayed to another replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relay {
    /// The JSON-RPC id the client gave it, as written.
    pub(crate) id: String,
    pub(crate) project: String,
    pub(crate) replica: String,
    pub(crate) modern: bool,
    /// The answer is a stream that is open.
    pub(crate) streaming: bool,
    /// The request, to serve again should nobody take it (the project is moving).
    pub(crate) request: Option<Box<HttpRequest>>,
    /// A stateless retry sent to the replica that parked its call: never served again, and
    /// without a whole answer the call's outcome is unknown (the call died with that replica).
    pub(crate) retry: bool,
    /// When the call's timeout ends, counted from the relay.
    pub(crate) deadline: Instant,
    /// It could not be sent (the engine was out of reach): it waits for the engine, and is
    /// sent again then, or at this instant, whichever comes first.
    pub(crate) awaiting_engine: Option<Instant>,
}

/// The replica machine; see the module docs.
#[derive(Debug)]
pub(crate) struct Replica {
    directory: Directory,
    /// Uplinks that passed every check and wait for their project's claim, by project.
    waiting: BTreeMap<String, Waiting>,
    /// When this replica last asked for each project's claim.
    claims_asked: BTreeMap<String, Instant>,
    /// Projects whose claim this replica won and whose uplink serves (until it goes).
    serving: BTreeMap<String, UplinkId>,
    /// Projects whose claim this replica won, whose coordination records are being read before
    /// the uplink serves: the claim's epoch, the uplink, and when to ask again if a read failed.
    loading: BTreeMap<String, Loading>,
    /// Whether a won claim waits for its project's coordination records (a replica whose
    /// gateway keeps coordination in the engine).
    loads_coordination: bool,
    /// Requests relayed to another replica, until their answer ends.
    relays: HashMap<HttpToken, Relay>,
    /// Projects whose sled just left its replica, until when requests for them are held.
    moving: BTreeMap<String, Instant>,
    /// Projects this replica, stopping, asked its sled to move away from (issue 30): requests
    /// for them are held here until another replica claims them, or until the move grace is
    /// over (then served here, on the uplink still live).
    handing_over: BTreeSet<String>,
    /// Requests held for a moving project, by project.
    held: BTreeMap<String, Vec<(HttpToken, HttpRequest)>>,
    /// A replica that took no relay for a project: not relayed to again for it until the
    /// directory reports a new write of the project's key.
    unanswering: BTreeMap<String, String>,
    move_grace: Duration,
    counts: ClusterCounts,
    events: VecDeque<ReplicaEvent>,
    actions: VecDeque<ClusterAction>,
    #[cfg(feature = "planted-bugs")]
    planted: Option<PlantedBug>,
}

impl Replica {
    pub(crate) fn new(config: &ClusterConfig) -> Replica {
        Replica {
            directory: Directory::new(config.replica.clone(), config.directory.clone()),
            waiting: BTreeMap::new(),
            claims_asked: BTreeMap::new(),
            serving: BTreeMap::new(),
            loading: BTreeMap::new(),
            loads_coordination: false,
            relays: HashMap::new(),
            moving: BTreeMap::new(),
            handing_over: BTreeSet::new(),
            held: BTreeMap::new(),
            unanswering: BTreeMap::new(),
            move_grace: config.move_grace,
            counts: ClusterCounts::default(),
            events: VecDeque::new(),
            actions: VecDeque::new(),
            #[cfg(feature = "planted-bugs")]
            planted: None,
        }
    }

    /// A bug to plant, for the simulation's oracle to find.
    #[cfg(feature = "planted-bugs")]
    pub(crate) fn plant(&mut self, planted: Option<PlantedBug>) {
        self.planted = planted;
    }

    /// A won claim serves only once its project's coordination records are read
    /// ([`ClusterAction::LoadCoord`], then [`Replica::handle_coord_loaded`]).
    pub(crate) fn load_coordination(&mut self) {
        self.loads_coordination = true;
    }

    /// This replica's name.
    pub(crate) fn name(&self) -> &str {
        self.directory.replica()
    }

    pub(crate) fn counts(&self) -> ClusterCounts {
        self.counts
    }

    // ---- where projects are served ----

    /// Where `project` is served.
    pub(crate) fn place(&self, now: Instant, project: &str) -> Place {
        match self.directory.owner(project) {
            // Requests wait for the read up to the move grace (no call waits on a read that
            // never ends); past it, they are answered as the project is (not served yet).
            Owner::Local { .. }
                if self.loading.contains_key(project)
                    && self.moving.get(project).is_some_and(|until| *until > now) =>
            {
                Place::Loading
            }
            // Handed over: requests wait for the next holder (they write nothing here while
            // the last coordination writes land), up to the move grace.
            Owner::Local { .. }
                if self.handing_over.contains(project)
                    && self.moving.get(project).is_some_and(|until| *until > now) =>
            {
                Place::Moving
            }
            Owner::Local { .. } => Place::Here,
            Owner::Replica(r) if self.unanswering.get(project) != Some(&r) => Place::Relay(r),
            Owner::Replica(_) | Owner::Nobody
                if self.moving.get(project).is_some_and(|until| *until > now) =>
            {
                Place::Moving
            }
            Owner::Replica(_) | Owner::Nobody => Place::Nowhere,
        }
    }

    /// Whether an uplink of `project` here waits for the claim this replica asked for less
    /// than a move's grace ago (a request held for it is answered when the grace is over, and
    /// not held again for the same claim).
    pub(crate) fn claiming(&self, now: Instant, project: &str) -> bool {
        self.waiting.contains_key(project)
            && self
                .claims_asked
                .get(project)
                .is_some_and(|at| now < *at + self.move_grace)
    }

    /// The replica that takes relays for `project`, when it is another one.
    pub(crate) fn relay_target(&self, project: &str) -> Option<String> {
        match self.directory.owner(project) {
            Owner::Replica(r) if self.unanswering.get(project) != Some(&r) => Some(r),
            Owner::Replica(_) | Owner::Local { .. } | Owner::Nobody => None,
        }
    }

    /// The replica holding `project`'s sled when it is another one, for listings (unlike
    /// [`Replica::relay_target`], a replica that took no relay a moment ago still counts).
    pub(crate) fn held_elsewhere(&self, project: &str) -> Option<String> {
        match self.directory.owner(project) {
            Owner::Replica(r) => Some(r),
            Owner::Local { .. } | Owner::Nobody => None,
        }
    }

    /// Which replica holds `project`'s sled, for listings: this one's name when it does.
    pub(crate) fn holder(&self, project: &str) -> Option<String> {
        match self.directory.owner(project) {
            Owner::Local { .. } => Some(self.name().to_owned()),
            Owner::Replica(r) => Some(r),
            Owner::Nobody => None,
        }
    }

    // ---- the engine's news ----

    /// The directory's watch: `project`'s key was written, deleted or expired.
    pub(crate) fn handle_entry(
        &mut self,
        now: Instant,
        project: &str,
        revision: Revision,
        state: EntryState,
    ) {
        self.unanswering.remove(project);
        let gone = matches!(state, EntryState::Deleted | EntryState::Expired);
        if gone && !self.move_grace.is_zero() {
            self.moving
                .insert(project.to_owned(), now + self.move_grace);
        }
        // Relays to a replica that lost the project to another claim, or whose claim expired,
        // will get no answer from its sled (it closed that uplink, or died): they fail now
        // (`unknown`), not when the replica's silence is noticed. A release (a delete) comes
        // after the releasing replica answered its calls.
        let holder = match &state {
            EntryState::Claimed(v) => Some(Some(v.owner.clone())),
            EntryState::Expired | EntryState::Unreadable => Some(None),
            EntryState::Deleted => None,
        };
        // A handover's claim (issue 30): the last holder lives, and answers the calls running
        // on its old uplink; relays to it wait for their answers (this replica may be the one
        // that claimed, and already know it holds the project).
        let handover = matches!(&state, EntryState::Claimed(v) if v.handover);
        let mut orphaned: Vec<HttpToken> = match &holder {
            None => Vec::new(),
            Some(_) if handover => Vec::new(),
            Some(holder) => self
                .relays
                .iter()
                .filter(|(_, r)| {
                    r.project == project
                        && Some(&r.replica) != holder.as_ref()
                        && r.awaiting_engine.is_none()
                })
                .map(|(t, _)| *t)
                .collect(),
        };
        // Relays that wait for the engine were not sent: the engine speaks again, so they go
        // wherever the project is now.
        let mut waited: Vec<HttpToken> = self
            .relays
            .iter()
            .filter(|(_, r)| r.project == project && r.awaiting_engine.is_some())
            .map(|(t, _)| *t)
            .collect();
        waited.sort_unstable();
        // In token order: the relays are a HashMap, and the simulation replays seeds.
        orphaned.sort_unstable();
        let was_elsewhere = self.held_elsewhere(project).is_some();
        self.directory.handle_entry(project, revision, state);
        if was_elsewhere != self.held_elsewhere(project).is_some() {
            self.events.push_back(ReplicaEvent::HolderChanged {
                project: project.to_owned(),
            });
        }
        for token in orphaned {
            self.actions.push_back(ClusterAction::RelayAbort { token });
            self.relay_failed(now, token, RelaySent::Unknown);
        }
        for token in waited {
            self.serve_again(token);
        }
        self.drain_directory(now);
        if !gone {
            self.release_held(project);
        }
    }

    /// The answer to a claim this replica asked for.
    pub(crate) fn handle_claim_outcome(
        &mut self,
        now: Instant,
        project: &str,
        outcome: ClaimOutcome,
    ) {
        if let ClaimOutcome::Conflict { .. } = outcome {
            self.counts.claim_conflicts += 1;
        }
        self.directory.handle_claim_outcome(now, project, outcome);
        self.drain_directory(now);
    }

    /// Whether the engine is reachable.
    pub(crate) fn handle_engine(&mut self, now: Instant, up: bool) {
        if up && !self.directory.engine_up() {
            self.counts.engine_reconnects += 1;
            tracing::info!("the cluster's engine is reachable again");
        } else if !up && self.directory.engine_up() {
            tracing::warn!("lost the cluster's engine: live uplinks keep serving, no new claims");
        }
        self.directory.handle_engine(now, up);
        self.drain_directory(now);
        if up {
            self.engine_back(now);
        }
    }

    /// The engine is back: the relays that waited for it are sent again (in token order).
    fn engine_back(&mut self, now: Instant) {
        let back = self.awaiting(|r| r.deadline > now);
        for token in back {
            self.send_again(now, token);
        }
    }

    /// The relays waiting for the engine that `pick` picks, in token order.
    fn awaiting(&self, pick: impl Fn(&Relay) -> bool) -> Vec<HttpToken> {
        let mut tokens: Vec<HttpToken> = self
            .relays
            .iter()
            .filter(|(_, r)| r.awaiting_engine.is_some() && pick(r))
            .map(|(t, _)| *t)
            .collect();
        tokens.sort_unstable();
        tokens
    }

    /// Sends again a relay that waited for the engine, to the same replica, within what is
    /// left of its call's timeout (a newer holder comes with the engine's news, and
    /// `handle_entry` serves the request again for it).
    fn send_again(&mut self, now: Instant, token: HttpToken) {
        let Some(relay) = self.relays.get_mut(&token) else {
            return;
        };
        let Some(request) = relay.request.as_deref() else {
            return;
        };
        relay.awaiting_engine = None;
        let mut request = request.clone();
        request.relayed = true;
        self.actions.push_back(ClusterAction::Relay {
            token,
            replica: relay.replica.clone(),
            request: Box::new(request),
            timeout: relay.deadline.saturating_duration_since(now),
        });
    }

    /// A relay that waited for the engine is handled again from the top.
    fn serve_again(&mut self, token: HttpToken) {
        if let Some(Relay {
            request: Some(request),
            ..
        }) = self.relays.remove(&token)
        {
            self.events.push_back(ReplicaEvent::ServeAgain {
                token,
                request: *request,
            });
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let held_until = self
            .held
            .keys()
            .filter_map(|p| self.moving.get(p))
            .min()
            .copied();
        let engine_wait = self
            .relays
            .values()
            .filter_map(|r| r.awaiting_engine.map(|retry| retry.min(r.deadline)))
            .min();
        let reload = self.loading.values().filter_map(|l| l.again_at).min();
        [
            self.directory.poll_timeout(),
            held_until,
            engine_wait,
            reload,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if self.directory.poll_timeout().is_some_and(|at| at <= now) {
            self.directory.handle_timeout(now);
        }
        self.drain_directory(now);
        // Moves that took too long: their held requests are answered as they are now.
        let mut over = Vec::new();
        self.moving.retain(|project, until| {
            let going = *until > now;
            if !going {
                over.push(project.clone());
            }
            going
        });
        for project in over {
            self.release_held(&project);
        }
        // Reads of coordination records that failed are asked again.
        for (project, l) in &mut self.loading {
            if l.again_at.is_some_and(|at| at <= now) {
                l.again_at = None;
                self.actions.push_back(ClusterAction::LoadCoord {
                    project: project.clone(),
                });
            }
        }
        // Relays that waited for the engine past their call's timeout: not sent. The others
        // are tried again now and then: the engine may be back before anyone says so.
        let expired = self.awaiting(|r| r.deadline <= now);
        let due =
            self.awaiting(|r| r.deadline > now && r.awaiting_engine.is_some_and(|at| at <= now));
        for token in due {
            self.send_again(now, token);
        }
        for token in expired {
            if let Some(relay) = self.relays.remove(&token) {
                self.counts.relays_failed += 1;
                self.events.push_back(ReplicaEvent::RelayFailed {
                    token,
                    relay,
                    error: RelayError::Lost(UplinkLoss::EngineUnreachable),
                });
            }
        }
    }

    /// What the directory decided, as the gateway's events and the engine's actions.
    fn drain_directory(&mut self, now: Instant) {
        while let Some(action) = self.directory.poll_action() {
            match action {
                Action::Claim {
                    project,
                    expected_revision,
                    value,
                } => self.actions.push_back(ClusterAction::Claim {
                    project,
                    expected_revision,
                    value,
                }),
                Action::Release { project, revision } => self
                    .actions
                    .push_back(ClusterAction::Release { project, revision }),
                Action::Serve { project, epoch } => {
                    let Some(waiting) = self.waiting.remove(&project) else {
                        tracing::debug!(project, epoch, "claim won with no uplink waiting");
                        continue;
                    };
                    #[cfg(feature = "planted-bugs")]
                    let loads = self.loads_coordination
                        && self.planted != Some(PlantedBug::ServeBeforeCoordLoaded);
                    #[cfg(not(feature = "planted-bugs"))]
                    let loads = self.loads_coordination;
                    if loads {
                        // Requests wait (as for a move) while the last holder's state is read.
                        tracing::info!(project, epoch, "claim won; reading its coordination state");
                        self.begin_move(now, &project);
                        self.loading.insert(
                            project.clone(),
                            Loading {
                                epoch,
                                waiting,
                                again_at: None,
                            },
                        );
                        self.actions.push_back(ClusterAction::LoadCoord { project });
                        continue;
                    }
                    self.serve(project, epoch, waiting);
                }
                Action::StopServing { project, reason } => {
                    let waiting = self
                        .waiting
                        .remove(&project)
                        .map(|w| w.uplink)
                        .or_else(|| self.loading.remove(&project).map(|l| l.waiting.uplink));
                    let handover = self.handing_over.remove(&project);
                    if self.serving.remove(&project).is_some()
                        && reason != Loss::ShuttingDown
                        && !handover
                    {
                        self.counts.claims_lost += 1;
                    }
                    self.events.push_back(ReplicaEvent::StopServing {
                        project,
                        waiting,
                        reason,
                        handover,
                    });
                }
            }
        }
    }

    /// The claim of `project` was won (and its coordination records read, where they are):
    /// the uplink that waited serves, and requests held for it go.
    fn serve(&mut self, project: String, epoch: Epoch, waiting: Waiting) {
        self.counts.claims_won += 1;
        self.moving.remove(&project);
        tracing::info!(
            uplink = waiting.uplink.0,
            project,
            epoch,
            "claim won; serving"
        );
        self.serving.insert(project.clone(), waiting.uplink);
        self.events.push_back(ReplicaEvent::Serve {
            project: project.clone(),
            epoch,
            waiting,
        });
        self.release_held(&project);
    }

    /// The coordination records of `project` were read (`read`; the gateway took them in
    /// first) or could not be (asked again soon): a claim still held serves now.
    pub(crate) fn handle_coord_loaded(&mut self, now: Instant, project: &str, read: bool) {
        if !read {
            if let Some(l) = self.loading.get_mut(project) {
                tracing::warn!(
                    project,
                    "could not read the project's coordination state; asking again"
                );
                l.again_at = Some(now + ENGINE_RETRY);
                // Held requests wait for it up to a move's grace from now.
                self.begin_move(now, project);
            }
            return;
        }
        let still_ours = matches!(self.directory.owner(project), Owner::Local { .. });
        match self.loading.remove(project) {
            Some(l) if still_ours => self.serve(project.to_owned(), l.epoch, l.waiting),
            // The claim went meanwhile (its loss was reported with the uplink): nothing.
            Some(_) | None => {}
        }
    }

    // ---- uplinks ----

    /// An uplink that passed every check waits for `project`'s claim; a newer one replaces
    /// the one waiting, whose id is answered (the gateway closes it, and the live one, then
    /// asks for the claim with [`Replica::claim`]).
    pub(crate) fn wait_for_claim(&mut self, project: &str, waiting: Waiting) -> Option<UplinkId> {
        self.waiting
            .insert(project.to_owned(), waiting)
            .map(|w| w.uplink)
    }

    /// Claims `project` for the uplink waiting for it; `epoch_seen` is the sled's, and
    /// `moving` whether its hello answers a move (the claim then says it is a handover).
    pub(crate) fn claim(
        &mut self,
        now: Instant,
        project: &str,
        epoch_seen: Option<Epoch>,
        moving: bool,
    ) {
        self.claims_asked.insert(project.to_owned(), now);
        self.directory
            .handle_hello(now, project, epoch_seen, moving);
        self.drain_directory(now);
    }

    /// This replica is stopping (issue 30): every project it serves is handed over. Requests
    /// for them are held from now (up to the move grace), and the gateway asks each sled to
    /// open a new uplink, which another replica claims. Returns the projects and their
    /// uplinks.
    pub(crate) fn begin_handover(&mut self, now: Instant) -> Vec<(String, UplinkId)> {
        let serving: Vec<(String, UplinkId)> = self
            .serving
            .iter()
            .filter(|(p, _)| !self.handing_over.contains(*p))
            .map(|(p, u)| (p.clone(), *u))
            .collect();
        for (project, _) in &serving {
            self.handing_over.insert(project.clone());
            self.begin_move(now, project);
        }
        serving
    }

    /// Whether a project this replica hands over still waits for its next holder (and the
    /// move grace is not over): a stopping replica keeps its uplinks that long.
    pub(crate) fn handover_pending(&self, now: Instant) -> bool {
        self.handing_over.iter().any(|p| {
            self.serving.contains_key(p) && self.moving.get(p).is_some_and(|until| *until > now)
        })
    }

    /// An uplink of `project` is gone. When it waited for the claim or held it, the claim is
    /// released, and requests for the project wait a moment for its sled's next uplink.
    pub(crate) fn handle_uplink_gone(&mut self, now: Instant, id: UplinkId, project: &str) {
        let was_waiting = self.waiting.get(project).is_some_and(|w| w.uplink == id)
            || self
                .loading
                .get(project)
                .is_some_and(|l| l.waiting.uplink == id);
        if was_waiting {
            self.waiting.remove(project);
            self.loading.remove(project);
        }
        let was_serving = self.serving.get(project) == Some(&id);
        if was_serving {
            self.serving.remove(project);
            self.handing_over.remove(project);
        }
        if was_waiting || was_serving {
            if !self.move_grace.is_zero() {
                self.moving
                    .insert(project.to_owned(), now + self.move_grace);
            }
            self.directory.handle_uplink_closed(project);
            self.drain_directory(now);
        }
    }

    // ---- requests ----

    /// Requests for `project` are held for its next holder until the move grace is over,
    /// counted from now unless a move still going on began earlier (a move that is over, kept
    /// since an earlier one, counts for nothing: seed 919 of the graceful-stop sweep).
    fn begin_move(&mut self, now: Instant, project: &str) {
        let until = now + self.move_grace;
        let entry = self.moving.entry(project.to_owned()).or_insert(until);
        if *entry <= now {
            *entry = until;
        }
    }

    /// Relays a request to `replica`, which holds `project`'s sled; `id` is its JSON-RPC id
    /// and `timeout` the project's call timeout.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn relay(
        &mut self,
        now: Instant,
        token: HttpToken,
        replica: String,
        project: String,
        id: &str,
        modern: bool,
        mut request: HttpRequest,
        timeout: Duration,
    ) {
        self.counts.relays += 1;
        tracing::debug!(
            token = token.0,
            project,
            replica,
            "relaying to the project's holder"
        );
        self.relays.insert(
            token,
            Relay {
                id: id.to_owned(),
                project,
                replica: replica.clone(),
                modern,
                streaming: false,
                // Kept to serve again: when nobody takes it, or the engine is out of reach.
                request: Some(Box::new(request.clone())),
                retry: false,
                deadline: now + timeout,
                awaiting_engine: None,
            },
        );
        request.relayed = true;
        self.actions.push_back(ClusterAction::Relay {
            token,
            replica,
            request: Box::new(request),
            timeout,
        });
    }

    /// The relay just made is a stateless retry for the replica that parked its call.
    pub(crate) fn relay_is_retry(&mut self, token: HttpToken) {
        if let Some(r) = self.relays.get_mut(&token) {
            r.request = None;
            r.retry = true;
        }
    }

    /// Sends a part of a request of this replica's own (a fleet tool asked of another
    /// replica, `crate::gather`); its answer is reported under `token` like any relay's.
    pub(crate) fn relay_part(
        &mut self,
        token: HttpToken,
        replica: String,
        request: HttpRequest,
        timeout: Duration,
    ) {
        self.counts.relays += 1;
        self.actions.push_back(ClusterAction::Relay {
            token,
            replica,
            request: Box::new(request),
            timeout,
        });
    }

    /// A part is given up: the replica asked is told.
    pub(crate) fn abort_part(&mut self, token: HttpToken) {
        self.actions.push_back(ClusterAction::RelayAbort { token });
    }

    /// A request relayed here by another replica is served.
    pub(crate) fn relayed_in(&mut self) {
        self.counts.relayed_in += 1;
    }

    /// A message of a relay's answer.
    pub(crate) fn handle_relayed(&mut self, token: HttpToken, message: RelayMessage) {
        let Some(relay) = self.relays.get_mut(&token) else {
            tracing::debug!(token = token.0, "an answer for a relay that is over");
            return;
        };
        match &message {
            RelayMessage::Reply(_) | RelayMessage::Close => {
                self.relays.remove(&token);
            }
            RelayMessage::Open => relay.streaming = true,
            RelayMessage::Event { .. } => {}
        }
        self.events
            .push_back(ReplicaEvent::Answer { token, message });
    }

    /// A relay got no whole answer: `sent` says whether the replica asked took it.
    pub(crate) fn handle_relay_failed(&mut self, now: Instant, token: HttpToken, sent: RelaySent) {
        self.relay_failed(now, token, sent);
    }

    fn relay_failed(&mut self, now: Instant, token: HttpToken, sent: RelaySent) {
        let Some(mut relay) = self.relays.remove(&token) else {
            return;
        };
        // Not sent, for want of the engine: it waits for the engine, within its deadline.
        #[cfg(feature = "planted-bugs")]
        let sent = match (sent, self.planted) {
            (RelaySent::EngineDown, Some(PlantedBug::UnknownWhenNotSent)) => RelaySent::Unknown,
            (sent, _) => sent,
        };
        if sent == RelaySent::EngineDown
            && !relay.retry
            && !relay.streaming
            && relay.request.is_some()
            && now < relay.deadline
        {
            tracing::info!(
                token = token.0,
                project = relay.project,
                "the engine is out of reach: the relay waits for it"
            );
            relay.awaiting_engine = Some(now + ENGINE_RETRY);
            self.relays.insert(token, relay);
            return;
        }
        self.counts.relays_failed += 1;
        // Nobody took it: that replica is gone. The request was not sent, so it is served
        // again, and waits for the project's next holder (the sled dials again).
        if let (RelaySent::NotSent, Some(request), false, false) = (
            sent,
            &relay.request,
            relay.streaming,
            self.move_grace.is_zero(),
        ) {
            tracing::info!(
                project = relay.project,
                replica = relay.replica,
                "nobody takes relays for the project's holder; waiting for its next"
            );
            self.unanswering
                .insert(relay.project.clone(), relay.replica.clone());
            self.begin_move(now, &relay.project);
            self.events.push_back(ReplicaEvent::ServeAgain {
                token,
                request: (**request).clone(),
            });
            return;
        }
        // A stateless retry's call was parked at the replica asked: what became of it there
        // is unknown.
        let loss = match sent {
            RelaySent::NotSent if !relay.retry => UplinkLoss::NotRelayed,
            RelaySent::EngineDown if !relay.retry => UplinkLoss::EngineUnreachable,
            RelaySent::NotSent | RelaySent::EngineDown | RelaySent::Unknown => {
                UplinkLoss::OwnerLost
            }
        };
        tracing::warn!(
            token = token.0,
            project = relay.project,
            replica = relay.replica,
            ?sent,
            "a relayed request got no whole answer"
        );
        self.events.push_back(ReplicaEvent::RelayFailed {
            token,
            relay,
            error: RelayError::Lost(loss),
        });
    }

    /// The client of a relayed request went away; `true` when `token` was one (the replica
    /// asked is told, and cancels it).
    pub(crate) fn abort_relay(&mut self, token: HttpToken) -> bool {
        match self.relays.remove(&token) {
            None => false,
            // Never sent: nobody to tell.
            Some(r) if r.awaiting_engine.is_some() => true,
            Some(_) => {
                self.actions.push_back(ClusterAction::RelayAbort { token });
                true
            }
        }
    }

    /// Holds a request until `project` has a holder again, or its move takes too long (a
    /// request held where no move is going on yet begins one: every hold ends).
    pub(crate) fn hold(
        &mut self,
        now: Instant,
        token: HttpToken,
        project: String,
        request: HttpRequest,
    ) {
        self.counts.held += 1;
        self.begin_move(now, &project);
        tracing::debug!(token = token.0, project, "held while the project moves");
        self.held.entry(project).or_default().push((token, request));
    }

    /// The client of a held request went away; `true` when `token` was one.
    pub(crate) fn unhold(&mut self, token: HttpToken) -> bool {
        for held in self.held.values_mut() {
            if let Some(i) = held.iter().position(|(t, _)| *t == token) {
                held.remove(i);
                return true;
            }
        }
        false
    }

    /// Serves again the requests held for `project`: it has a holder, or its move is over.
    fn release_held(&mut self, project: &str) {
        for (token, request) in self.held.remove(project).unwrap_or_default() {
            self.events
                .push_back(ReplicaEvent::ServeAgain { token, request });
        }
    }

    /// Shutdown: no new claims; held requests are refused, and relays still open failed.
    pub(crate) fn handle_shutdown(&mut self, now: Instant) {
        self.handing_over.clear();
        self.directory.handle_shutdown();
        self.drain_directory(now);
        let held: Vec<HttpToken> = std::mem::take(&mut self.held)
            .into_values()
            .flatten()
            .map(|(t, _)| t)
            .collect();
        for token in held {
            self.events.push_back(ReplicaEvent::Refused { token });
        }
        let mut relays: Vec<(HttpToken, Relay)> = self.relays.drain().collect();
        relays.sort_unstable_by_key(|(t, _)| *t);
        for (token, relay) in relays {
            self.actions.push_back(ClusterAction::RelayAbort { token });
            self.events.push_back(ReplicaEvent::RelayFailed {
                token,
                relay,
                error: RelayError::ShuttingDown,
            });
        }
    }

    /// The next thing the gateway must do.
    pub(crate) fn poll_event(&mut self) -> Option<ReplicaEvent> {
        self.events.pop_front()
    }

    /// The next thing the engine must do.
    pub(crate) fn poll_action(&mut self) -> Option<ClusterAction> {
        self.actions.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory::{ClaimValue, DirectoryConfig};
    use crate::io::HttpReply;

    const GRACE: Duration = Duration::from_secs(2);

    /// The fake clock's origin: the one real reading, made once per test.
    #[allow(clippy::disallowed_methods)]
    fn t0() -> Instant {
        Instant::now()
    }

    fn replica(name: &str) -> Replica {
        Replica::new(&ClusterConfig {
            replica: name.into(),
            directory: DirectoryConfig::new(Duration::from_secs(30)),
            move_grace: GRACE,
            agent_key: None,
            previous_agent_key: None,
            task_keys: None,
        })
    }

    fn events(r: &mut Replica) -> Vec<ReplicaEvent> {
        std::iter::from_fn(|| r.poll_event()).collect()
    }

    fn actions(r: &mut Replica) -> Vec<ClusterAction> {
        std::iter::from_fn(|| r.poll_action()).collect()
    }

    fn claimed_by(owner: &str) -> EntryState {
        EntryState::Claimed(ClaimValue {
            owner: owner.into(),
            epoch: None,
            handover: false,
        })
    }

    fn waiting(uplink: u64) -> Waiting {
        Waiting {
            uplink: UplinkId(uplink),
            sled: "alpha-sled".into(),
            key: None,
        }
    }

    fn request(n: u8) -> HttpRequest {
        HttpRequest {
            body: vec![n],
            ..HttpRequest::default()
        }
    }

    /// `r1` serving `alpha` through uplink 1 at epoch 3.
    fn serving(now: Instant) -> Replica {
        let mut r = replica("r1");
        assert_eq!(r.wait_for_claim("alpha", waiting(1)), None);
        r.claim(now, "alpha", None, false);
        assert!(matches!(
            &actions(&mut r)[..],
            [ClusterAction::Claim { .. }]
        ));
        assert_eq!(events(&mut r), []);
        r.handle_claim_outcome(now, "alpha", ClaimOutcome::Won(3));
        assert_eq!(
            events(&mut r),
            [ReplicaEvent::Serve {
                project: "alpha".into(),
                epoch: 3,
                waiting: waiting(1),
            }]
        );
        r
    }

    #[test]
    fn a_won_claim_serves_only_once_the_coordination_state_is_read() {
        let t0 = t0();
        let mut r = replica("r1");
        r.load_coordination();
        r.wait_for_claim("alpha", waiting(1));
        r.claim(t0, "alpha", None, false);
        actions(&mut r);
        r.handle_claim_outcome(t0, "alpha", ClaimOutcome::Won(3));
        assert_eq!(
            actions(&mut r),
            [ClusterAction::LoadCoord {
                project: "alpha".into()
            }]
        );
        assert_eq!(events(&mut r), [], "not served yet");
        // Requests wait meanwhile, relayed here or not.
        assert_eq!(r.place(t0, "alpha"), Place::Loading);
        assert_eq!(
            r.place(t0 + GRACE, "alpha"),
            Place::Here,
            "no longer than the grace"
        );
        r.hold(t0, HttpToken(1), "alpha".into(), request(1));
        // A read that failed is asked again, and the held request keeps waiting.
        r.handle_coord_loaded(t0, "alpha", false);
        assert_eq!(r.poll_timeout(), Some(t0 + ENGINE_RETRY));
        r.handle_timeout(t0 + ENGINE_RETRY);
        assert_eq!(
            actions(&mut r),
            [ClusterAction::LoadCoord {
                project: "alpha".into()
            }]
        );
        assert_eq!(events(&mut r), []);
        r.handle_coord_loaded(t0 + ENGINE_RETRY, "alpha", true);
        assert_eq!(
            events(&mut r),
            [
                ReplicaEvent::Serve {
                    project: "alpha".into(),
                    epoch: 3,
                    waiting: waiting(1),
                },
                ReplicaEvent::ServeAgain {
                    token: HttpToken(1),
                    request: request(1)
                }
            ]
        );
        assert_eq!(r.place(t0, "alpha"), Place::Here);
        // A read that ends after the uplink went serves nothing.
        let mut r = replica("r1");
        r.load_coordination();
        r.wait_for_claim("alpha", waiting(1));
        r.claim(t0, "alpha", None, false);
        r.handle_claim_outcome(t0, "alpha", ClaimOutcome::Won(3));
        r.handle_uplink_gone(t0, UplinkId(1), "alpha");
        actions(&mut r);
        events(&mut r);
        r.handle_coord_loaded(t0, "alpha", true);
        assert_eq!(events(&mut r), []);
    }

    #[test]
    fn a_won_claim_welcomes_the_uplink_that_waited_and_serves_here() {
        let t0 = t0();
        let r = serving(t0);
        assert_eq!(r.place(t0, "alpha"), Place::Here);
        assert_eq!(r.holder("alpha").as_deref(), Some("r1"));
        assert_eq!(r.place(t0, "beta"), Place::Nowhere);
        assert_eq!(r.counts().claims_won, 1);
    }

    #[test]
    fn a_newer_uplink_replaces_the_one_waiting() {
        let mut r = replica("r1");
        assert_eq!(r.wait_for_claim("alpha", waiting(1)), None);
        assert_eq!(r.wait_for_claim("alpha", waiting(2)), Some(UplinkId(1)));
    }

    #[test]
    fn a_request_for_a_project_held_elsewhere_is_relayed_whole_and_its_answer_comes_back() {
        let t0 = t0();
        let mut r = replica("r1");
        r.handle_entry(t0, "alpha", 5, claimed_by("r2"));
        assert_eq!(
            events(&mut r),
            [ReplicaEvent::HolderChanged {
                project: "alpha".into()
            }]
        );
        assert_eq!(r.place(t0, "alpha"), Place::Relay("r2".into()));
        r.relay(
            t0,
            HttpToken(7),
            "r2".into(),
            "alpha".into(),
            "1",
            false,
            request(1),
            GRACE,
        );
        let [ClusterAction::Relay {
            token,
            replica,
            request,
            ..
        }] = &actions(&mut r)[..]
        else {
            panic!("one relay");
        };
        assert_eq!((*token, replica.as_str()), (HttpToken(7), "r2"));
        assert!(request.relayed, "marked, so that it is never relayed again");
        r.handle_relayed(HttpToken(7), RelayMessage::Open);
        r.handle_relayed(HttpToken(7), RelayMessage::Close);
        // Over: a late message is dropped.
        r.handle_relayed(HttpToken(7), RelayMessage::Close);
        assert_eq!(
            events(&mut r),
            [
                ReplicaEvent::Answer {
                    token: HttpToken(7),
                    message: RelayMessage::Open
                },
                ReplicaEvent::Answer {
                    token: HttpToken(7),
                    message: RelayMessage::Close
                },
            ]
        );
        assert_eq!(r.counts().relays, 1);
    }

    #[test]
    fn a_relay_nobody_took_is_served_again_and_that_replica_is_not_asked_again() {
        let t0 = t0();
        let mut r = replica("r1");
        r.handle_entry(t0, "alpha", 5, claimed_by("r2"));
        events(&mut r);
        r.relay(
            t0,
            HttpToken(7),
            "r2".into(),
            "alpha".into(),
            "1",
            false,
            request(1),
            GRACE,
        );
        actions(&mut r);
        r.handle_relay_failed(t0, HttpToken(7), RelaySent::NotSent);
        assert_eq!(
            events(&mut r),
            [ReplicaEvent::ServeAgain {
                token: HttpToken(7),
                request: request(1)
            }]
        );
        // Held for the project's next holder, not relayed to r2 again...
        assert_eq!(r.place(t0, "alpha"), Place::Moving);
        assert_eq!(r.place(t0 + GRACE, "alpha"), Place::Nowhere);
        // ...until the directory reports a new write of its key.
        r.handle_entry(t0, "alpha", 6, claimed_by("r2"));
        assert_eq!(r.place(t0, "alpha"), Place::Relay("r2".into()));
    }

    #[test]
    fn a_relay_nobody_took_is_held_even_when_an_earlier_move_of_its_project_is_over() {
        let t0 = t0();
        let mut r = replica("r1");
        // An earlier move: released, then claimed by r2; its move grace is long over.
        r.handle_entry(t0, "alpha", 4, EntryState::Deleted);
        r.handle_entry(t0, "alpha", 5, claimed_by("r2"));
        let later = t0 + GRACE * 10;
        assert_eq!(r.place(later, "alpha"), Place::Relay("r2".into()));
        r.relay(
            later,
            HttpToken(7),
            "r2".into(),
            "alpha".into(),
            "1",
            false,
            request(1),
            GRACE,
        );
        events(&mut r);
        // r2 is stopping and does not take it: held for the next holder, for a whole grace.
        r.handle_relay_failed(later, HttpToken(7), RelaySent::NotSent);
        assert_eq!(r.place(later, "alpha"), Place::Moving);
        assert_eq!(
            r.place(later + GRACE - Duration::from_millis(1), "alpha"),
            Place::Moving
        );
        assert_eq!(r.place(later + GRACE, "alpha"), Place::Nowhere);
    }

    #[test]
    fn a_relay_to_a_replica_that_lost_the_claim_fails_at_once_as_unknown() {
        let t0 = t0();
        let mut r = replica("r1");
        r.handle_entry(t0, "alpha", 5, claimed_by("r2"));
        r.relay(
            t0,
            HttpToken(7),
            "r2".into(),
            "alpha".into(),
            "1",
            true,
            request(1),
            GRACE,
        );
        r.handle_relayed(HttpToken(7), RelayMessage::Open);
        events(&mut r);
        actions(&mut r);
        r.handle_entry(t0, "alpha", 6, claimed_by("r3"));
        assert_eq!(
            actions(&mut r),
            [ClusterAction::RelayAbort {
                token: HttpToken(7)
            }]
        );
        let ev = events(&mut r);
        let [ReplicaEvent::RelayFailed {
            token,
            relay,
            error,
        }] = &ev[..]
        else {
            panic!("one failure: {ev:?}");
        };
        assert_eq!(*token, HttpToken(7));
        assert_eq!(*error, RelayError::Lost(UplinkLoss::OwnerLost));
        assert!(relay.streaming && relay.modern);
        assert_eq!(r.counts().relays_failed, 1);
    }

    #[test]
    fn a_relay_taken_and_never_answered_is_unknown_and_a_retry_is_never_served_twice() {
        let t0 = t0();
        let mut r = replica("r1");
        r.handle_entry(t0, "alpha", 5, claimed_by("r2"));
        r.relay(
            t0,
            HttpToken(1),
            "r2".into(),
            "alpha".into(),
            "1",
            false,
            request(1),
            GRACE,
        );
        r.relay(
            t0,
            HttpToken(2),
            "r2".into(),
            "alpha".into(),
            "2",
            true,
            request(2),
            GRACE,
        );
        r.relay_is_retry(HttpToken(2));
        events(&mut r);
        r.handle_relay_failed(t0, HttpToken(1), RelaySent::Unknown);
        r.handle_relay_failed(t0, HttpToken(2), RelaySent::NotSent);
        let errors: Vec<RelayError> = events(&mut r)
            .into_iter()
            .filter_map(|e| match e {
                ReplicaEvent::RelayFailed { error, .. } => Some(error),
                _ => None,
            })
            .collect();
        assert_eq!(
            errors,
            [
                RelayError::Lost(UplinkLoss::OwnerLost),
                RelayError::Lost(UplinkLoss::OwnerLost)
            ]
        );
    }

    #[test]
    fn a_held_request_is_served_again_when_its_project_has_a_holder_or_its_move_is_over() {
        let t0 = t0();
        let mut r = serving(t0);
        // Its uplink goes: the claim is released, and requests wait a moment.
        r.handle_uplink_gone(t0, UplinkId(1), "alpha");
        assert!(matches!(
            &actions(&mut r)[..],
            [ClusterAction::Release { .. }]
        ));
        assert_eq!(r.place(t0, "alpha"), Place::Moving);
        r.hold(t0, HttpToken(1), "alpha".into(), request(1));
        r.hold(t0, HttpToken(2), "alpha".into(), request(2));
        assert!(r.unhold(HttpToken(2)), "its client went away");
        assert_eq!(r.poll_timeout(), Some(t0 + GRACE));
        // Another replica claims it: the held request goes there.
        r.handle_entry(t0 + GRACE / 2, "alpha", 9, claimed_by("r2"));
        assert_eq!(
            events(&mut r),
            [
                ReplicaEvent::HolderChanged {
                    project: "alpha".into()
                },
                ReplicaEvent::ServeAgain {
                    token: HttpToken(1),
                    request: request(1)
                },
            ]
        );
        // A move that takes too long: answered as it is then.
        r.handle_entry(t0, "beta", 3, EntryState::Deleted);
        r.hold(t0, HttpToken(3), "beta".into(), request(3));
        r.handle_timeout(t0 + GRACE - Duration::from_millis(1));
        assert_eq!(events(&mut r), []);
        r.handle_timeout(t0 + GRACE);
        assert_eq!(
            events(&mut r),
            [ReplicaEvent::ServeAgain {
                token: HttpToken(3),
                request: request(3)
            }]
        );
        assert_eq!(r.counts().held, 3);
    }

    #[test]
    fn a_lost_claim_stops_the_uplinks_here_and_counts_once() {
        let t0 = t0();
        let mut r = serving(t0);
        assert_eq!(r.wait_for_claim("alpha", waiting(2)), None);
        r.handle_entry(t0, "alpha", 4, claimed_by("r2"));
        let ev = events(&mut r);
        assert!(
            ev.contains(&ReplicaEvent::StopServing {
                project: "alpha".into(),
                waiting: Some(UplinkId(2)),
                reason: Loss::TakenOver {
                    by: Some("r2".into()),
                    revision: 4
                },
                handover: false,
            }),
            "{ev:?}"
        );
        assert_eq!(r.counts().claims_lost, 1);
        assert_eq!(r.place(t0, "alpha"), Place::Relay("r2".into()));
    }

    #[test]
    fn shutdown_releases_refuses_held_requests_and_fails_open_relays() {
        let t0 = t0();
        let mut r = serving(t0);
        r.handle_entry(t0, "beta", 5, claimed_by("r2"));
        r.relay(
            t0,
            HttpToken(1),
            "r2".into(),
            "beta".into(),
            "1",
            false,
            request(1),
            GRACE,
        );
        r.handle_entry(t0, "gamma", 3, EntryState::Expired);
        r.hold(t0, HttpToken(2), "gamma".into(), request(2));
        events(&mut r);
        actions(&mut r);
        r.handle_shutdown(t0);
        let a = actions(&mut r);
        assert!(
            a.iter()
                .any(|a| matches!(a, ClusterAction::Release { project, .. } if project == "alpha")),
            "{a:?}"
        );
        assert!(a.contains(&ClusterAction::RelayAbort {
            token: HttpToken(1)
        }));
        let ev = events(&mut r);
        assert!(
            ev.contains(&ReplicaEvent::Refused {
                token: HttpToken(2)
            }),
            "{ev:?}"
        );
        assert!(
            ev.iter().any(|e| matches!(
                e,
                ReplicaEvent::RelayFailed {
                    token: HttpToken(1),
                    error: RelayError::ShuttingDown,
                    ..
                }
            )),
            "{ev:?}"
        );
        // Nothing is kept for ever: no relay or hold is left.
        r.handle_relayed(
            HttpToken(1),
            RelayMessage::Reply(HttpReply {
                status: 200,
                headers: Vec::new(),
                body: None,
            }),
        );
        assert_eq!(events(&mut r), []);
        assert_eq!(r.poll_timeout(), None);
    }

    #[test]
    fn a_relay_the_engine_could_not_carry_waits_for_it_then_is_not_sent() {
        let t0 = t0();
        let mut r = replica("r1");
        r.handle_engine(t0, true);
        r.handle_entry(t0, "alpha", 5, claimed_by("r2"));
        let timeout = Duration::from_secs(10);
        let relay = |r: &mut Replica, t: u64, at: Instant| {
            let id = t.to_string();
            r.relay(
                at,
                HttpToken(t),
                "r2".into(),
                "alpha".into(),
                &id,
                false,
                request(t as u8),
                timeout,
            );
        };
        let resent = |r: &mut Replica| -> Vec<(HttpToken, Duration)> {
            actions(r)
                .into_iter()
                .filter_map(|a| match a {
                    ClusterAction::Relay {
                        token,
                        timeout,
                        request,
                        ..
                    } => {
                        assert!(request.relayed);
                        Some((token, timeout))
                    }
                    _ => None,
                })
                .collect()
        };
        relay(&mut r, 1, t0);
        relay(&mut r, 2, t0);
        relay(&mut r, 3, t0);
        r.relay_is_retry(HttpToken(3));
        events(&mut r);
        actions(&mut r);
        // The engine is out of reach: nothing was sent, and nothing is answered yet...
        r.handle_engine(t0, false);
        for t in [1, 2, 3] {
            r.handle_relay_failed(t0, HttpToken(t), RelaySent::EngineDown);
        }
        let ev = events(&mut r);
        // ...but a stateless retry's call was parked at r2: what became of it is unknown.
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert!(matches!(
            &ev[0],
            ReplicaEvent::RelayFailed {
                token: HttpToken(3),
                error: RelayError::Lost(UplinkLoss::OwnerLost),
                ..
            }
        ));
        // Tried again now and then, within what is left of the call's timeout: the engine may
        // be back before anyone says so.
        assert_eq!(r.poll_timeout(), Some(t0 + ENGINE_RETRY));
        r.handle_timeout(t0 + ENGINE_RETRY);
        let left = timeout - ENGINE_RETRY;
        assert_eq!(resent(&mut r), [(HttpToken(1), left), (HttpToken(2), left)]);
        for t in [1, 2] {
            r.handle_relay_failed(t0 + ENGINE_RETRY, HttpToken(t), RelaySent::EngineDown);
        }
        assert_eq!(events(&mut r), []);
        // Its client goes away: nothing to tell r2, which never had it.
        assert!(r.abort_relay(HttpToken(2)));
        assert_eq!(actions(&mut r), []);
        // The engine is said to be back: sent again at once, to the same replica.
        let back = t0 + Duration::from_secs(3);
        r.handle_engine(back, true);
        assert_eq!(
            resent(&mut r),
            [(HttpToken(1), timeout - Duration::from_secs(3))]
        );
        r.handle_relayed(HttpToken(1), RelayMessage::Close);
        assert_eq!(
            events(&mut r),
            [ReplicaEvent::Answer {
                token: HttpToken(1),
                message: RelayMessage::Close
            }]
        );
        // Another relay waits past its call's timeout: answered not sent.
        relay(&mut r, 4, t0);
        actions(&mut r);
        r.handle_engine(t0 + Duration::from_secs(4), false);
        let mut at = t0 + Duration::from_secs(4);
        r.handle_relay_failed(at, HttpToken(4), RelaySent::EngineDown);
        while let Some(next) = r.poll_timeout().filter(|n| *n < t0 + timeout) {
            at = next;
            r.handle_timeout(at);
            for (token, _) in resent(&mut r) {
                r.handle_relay_failed(at, token, RelaySent::EngineDown);
            }
            assert_eq!(events(&mut r), [], "answered before its deadline");
        }
        r.handle_timeout(t0 + timeout);
        let ev = events(&mut r);
        assert!(
            matches!(
                &ev[..],
                [ReplicaEvent::RelayFailed {
                    token: HttpToken(4),
                    error: RelayError::Lost(UplinkLoss::EngineUnreachable),
                    ..
                }]
            ),
            "{ev:?}"
        );
        assert_eq!(r.poll_timeout().filter(|at| *at <= t0 + timeout), None);
    }
}
