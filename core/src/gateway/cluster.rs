//! The replica machine's doors ([`crate::replica::Replica`]): where a project is served
//! ([`Gateway::place`], [`Gateway::away`]), and the requests and uplinks the gateway hands it
//! (relays, holds, fleet-tool parts, uplinks waiting for a claim or gone). A door carries out
//! what the engine must do at once; what the gateway must do (welcome or close an uplink,
//! serve a request again, answer a relayed call) waits in the machine for the run loop's
//! `settle`, which hands it to `engine.rs`. Only this file and `mod.rs` touch the machine.
//!
//! - **Uplinks.** A sled that passed every check waits in `UplinkState::AwaitingClaim` while
//!   the machine claims its project; it is welcomed with the won epoch, and closed with
//!   `Superseded` when the claim is lost. The hello timer keeps running meanwhile, so a
//!   replica cut off from the engine sends the sled away.
//! - **Calls.** A request whose project's sled is held by another replica is relayed whole to
//!   that replica; its answer comes back message by message and goes to the client as if it
//!   were this replica's. A relay that gets no whole answer is failed with `uplink_lost`:
//!   `outcome: "not_sent"` when nobody took it or the engine stayed out of reach,
//!   `"unknown"` when the owner may have taken it. A relayed request is never relayed again.

use std::time::{Duration, Instant};

use crate::cluster::ClusterAction;
use crate::replica::{Place, Replica, Waiting};
use crate::{HttpRequest, HttpToken, UplinkId};

use crate::error::RpcError;

use super::coordination::AfterWrites;
use super::{Away, Gateway, Output, Req};

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

    /// Carries out `f` on the machine; what it asks of the engine goes out now, and what it
    /// asks of the gateway waits for the run loop ([`Gateway::settle`]).
    fn with_replica(&mut self, f: impl FnOnce(&mut Replica)) {
        let Some(replica) = self.cluster.as_mut() else {
            return;
        };
        f(replica);
        while let Some(action) = replica.poll_action() {
            // A claim is released only once the coordination writes handed out before it are
            // done: the next holder reads what this one kept.
            let action = match action {
                ClusterAction::Release { .. } => {
                    match self.coordination.after_writes(AfterWrites::Engine(action)) {
                        Some(AfterWrites::Engine(action)) => action,
                        Some(AfterWrites::Move { .. }) | None => continue,
                    }
                }
                action => action,
            };
            self.outputs.push_back(Output::Cluster(action));
        }
    }

    /// The replica machine's next event for the gateway (`engine.rs` carries it out).
    pub(super) fn replica_event(&mut self) -> Option<crate::replica::ReplicaEvent> {
        self.cluster.as_mut()?.poll_event()
    }

    /// The replica machine takes the engine's news of the directory, its claims and itself.
    pub(super) fn replica_news(&mut self, f: impl FnOnce(&mut Replica)) {
        self.with_replica(f);
    }

    /// The replica machine's deadlines, if one is due.
    pub(super) fn replica_timeout(&mut self, now: Instant) {
        let due = self
            .cluster
            .as_ref()
            .and_then(Replica::poll_timeout)
            .is_some_and(|at| at <= now);
        if due {
            self.with_replica(|r| r.handle_timeout(now));
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
        self.with_replica(|r| r.relay(now, token, replica, project, id, modern, request, timeout));
    }

    /// The relay just made is a stateless retry for the replica that parked its call.
    pub(super) fn relay_is_retry(&mut self, token: HttpToken) {
        if let Some(r) = self.cluster.as_mut() {
            r.relay_is_retry(token);
        }
    }

    /// Holds a request until `project` has a holder again, or its move takes too long.
    pub(super) fn hold(
        &mut self,
        now: Instant,
        token: HttpToken,
        project: String,
        request: HttpRequest,
    ) {
        if let Some(r) = self.cluster.as_mut() {
            r.hold(now, token, project, request);
        }
    }

    /// The client of a relayed or held request went away; `true` when `token` was one.
    pub(super) fn relay_or_hold_aborted(&mut self, token: HttpToken) -> bool {
        let Some(replica) = self.cluster.as_mut() else {
            return false;
        };
        let was = replica.abort_relay(token) || replica.unhold(token);
        while let Some(action) = replica.poll_action() {
            self.outputs.push_back(Output::Cluster(action));
        }
        was
    }

    /// Relays a part of a fleet tool asked of another replica (`crate::gather`).
    pub(super) fn send_part(
        &mut self,
        token: HttpToken,
        replica: String,
        request: HttpRequest,
        timeout: Duration,
    ) {
        self.with_replica(|r| r.relay_part(token, replica, request, timeout));
    }

    /// A part still open is given up: its replica is told.
    pub(super) fn cancel_part(&mut self, token: HttpToken) {
        self.with_replica(|r| r.abort_part(token));
    }

    /// A request another replica relayed here is served (counted).
    pub(super) fn admit_relayed(&mut self) {
        if let Some(r) = self.cluster.as_mut() {
            r.relayed_in();
        }
    }

    /// An uplink that passed every check waits for `project`'s claim; the older one waiting,
    /// which it replaces, is answered (its caller closes it).
    pub(super) fn wait_for_claim(&mut self, project: &str, waiting: Waiting) -> Option<UplinkId> {
        self.cluster.as_mut()?.wait_for_claim(project, waiting)
    }

    /// Claims `project` for the uplink waiting for it; `epoch_seen` is the sled's, and
    /// `moving` whether its hello answers a move.
    pub(super) fn claim(
        &mut self,
        now: Instant,
        project: &str,
        epoch_seen: Option<u64>,
        moving: bool,
    ) {
        self.with_replica(|r| r.claim(now, project, epoch_seen, moving));
    }

    /// This replica is stopping: the projects it serves are handed over (requests for them
    /// held from now); answers them with their uplinks.
    pub(super) fn begin_handover(&mut self, now: Instant) -> Vec<(String, UplinkId)> {
        let mut out = Vec::new();
        self.with_replica(|r| out = r.begin_handover(now));
        out
    }

    /// Whether a project handed over still waits for its next holder.
    pub(super) fn handover_pending(&self, now: Instant) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|r| r.handover_pending(now))
    }

    /// An uplink that waited for a claim or a pin, or held a claim, is gone (called by
    /// `drop_uplink`).
    pub(super) fn cluster_uplink_gone(&mut self, now: Instant, id: UplinkId, project: &str) {
        self.with_replica(|r| r.handle_uplink_gone(now, id, project));
    }

    /// Shutdown: no new claims; relays and requests still waiting are failed.
    pub(super) fn cluster_shutdown(&mut self, now: Instant) {
        self.with_replica(|r| r.handle_shutdown(now));
    }

    /// What the engine must do that no machine decides (announcements, tool listings).
    pub(super) fn cluster_output(&mut self, action: ClusterAction) {
        if self.clustered() {
            self.outputs.push_back(Output::Cluster(action));
        }
    }

    /// Whether a request for `project`, whose sled is connected here, waits for its next holder
    /// instead: this replica is stopping and hands the project over (issue 30), and nothing
    /// is done for it here meanwhile (a coordination write would race the next holder's read).
    pub(super) fn handing_off(&self, req: &Req<'_>, project: &str) -> bool {
        self.handing_over && !req.relayed && self.place(req.now, project) == Place::Moving
    }

    /// Where a request for `project`, whose sled is not connected here, is served instead:
    /// `None` when nowhere. In a cluster, on the replica holding the sled (the request is
    /// relayed there whole, unless it was relayed here: the holder lost the sled meanwhile);
    /// or, for a sled that just left its replica, wherever it lands next.
    ///
    /// A request relayed here while this replica claims the project waits for the claim's
    /// answer: the replica that relayed it saw the claim in the directory before this one
    /// heard it was won (a move's race, seen as `sled_not_connected` in a rolling restart
    /// under `wrk -c16`).
    pub(super) fn away(&self, req: &Req<'_>, project: &str) -> Result<Option<Away>, RpcError> {
        let project = project.to_owned();
        if req.relayed
            && self
                .cluster
                .as_ref()
                .is_some_and(|r| r.claiming(req.now, &project))
        {
            return Ok(Some(Away::Hold { project }));
        }
        match self.place(req.now, &project) {
            Place::Relay(replica) if !req.relayed => Ok(Some(Away::Relay { project, replica })),
            Place::Relay(replica) => Err(RpcError::OwnedElsewhere {
                sled: self.sled_of(&project),
                project,
                replica,
            }),
            Place::Moving if !req.relayed => Ok(Some(Away::Hold { project })),
            // This replica holds it and reads its coordination state: a moment.
            Place::Loading => Ok(Some(Away::Hold { project })),
            Place::Moving | Place::Here | Place::Nowhere => Ok(None),
        }
    }
}
