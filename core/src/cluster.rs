//! A replica's part in a cluster of gateways (issue 15): what it asks of the engine and what
//! the engine tells it, and the state the gateway keeps for it.
//!
//! The gateway owns one [`Cluster`] when [`crate::Config::cluster`] is set, and nothing of it
//! otherwise: a single-process gateway needs no engine. The decisions are the gateway's
//! (`gateway/cluster.rs`) and the [`Directory`]'s; this module holds their vocabulary:
//!
//! - [`ClusterEvent`]s come in as [`crate::Input::Cluster`]: the directory bucket's watch, the
//!   answers to claims, the engine's reachability, sessions read or changed in the engine, and
//!   what the owner of a relayed request answered.
//! - [`ClusterAction`]s go out as [`crate::Output::Cluster`]: the directory's writes, session
//!   reads and writes, and requests relayed to the replica that owns their project.
//!
//! # Where state lives
//!
//! - **The directory** (one key per project: which replica holds its sled, at which epoch):
//!   in the engine, decided by compare-and-set ([`Directory`]).
//! - **Sessions** (default project, protocol version, capabilities, log level, owner): in the
//!   engine, as a [`SessionRecord`] written whenever one changes (and re-written when in use
//!   for a third of the idle TTL, so that the bucket's `max_age` ends only idle sessions), and
//!   cached by every replica that serves them; the engine's watch keeps the caches current.
//!   GET streams and their replay buffers stay with the replica that holds the stream.
//! - **A sled's calls** are correlated by the replica that holds its uplink, as on one
//!   gateway; another replica relays the client's whole HTTP request to it and relays the
//!   answer back.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::directory::{
    ClaimOutcome, ClaimValue, Directory, DirectoryConfig, EntryState, Revision,
};
use crate::io::{HttpReply, HttpRequest, HttpToken};

/// How a gateway joins a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This replica's name: unique in the cluster, written in its claims, and the address
    /// other replicas relay requests to.
    pub replica: String,
    pub directory: DirectoryConfig,
    /// How long a request for a project whose sled just left its replica (a released or
    /// expired claim, a replica nobody answers for) waits for the sled to be claimed again
    /// somewhere, before it is answered `sled_not_connected`. Zero: never held.
    pub move_grace: std::time::Duration,
    /// The cluster's key for agent handles (kept in the engine; the first replica's wins):
    /// a handle any replica issued is recognised by every other.
    pub agent_key: Option<crate::agents::AgentKey>,
}

/// What the engine said, for [`crate::Input::Cluster`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterEvent {
    /// The directory bucket's watch reported a write of the project's key.
    Entry {
        project: String,
        revision: Revision,
        state: EntryState,
    },
    /// The answer to a [`ClusterAction::Claim`].
    Claimed {
        project: String,
        outcome: ClaimOutcome,
    },
    /// The engine became reachable (`true`) or was lost.
    Engine { up: bool },
    /// The answer to a [`ClusterAction::LoadSession`]: the record (`None`: no such session),
    /// or `Err` when the engine could not be asked.
    SessionLoaded {
        session: String,
        record: Result<Option<SessionRecord>, EngineDown>,
    },
    /// The sessions bucket's watch reported a write (`None`: deleted or expired).
    SessionChanged {
        session: String,
        record: Option<SessionRecord>,
    },
    /// A [`ClusterAction::StoreSession`] is done: `written`, or not (the engine out of reach;
    /// the record is written again at the session's next use).
    SessionStored { session: String, written: bool },
    /// The answer to a [`ClusterAction::CreatePin`].
    PinCreated {
        project: String,
        outcome: PinOutcome,
    },
    /// The pins bucket's watch reported a write of a project's pin (`None`: deleted).
    PinChanged {
        project: String,
        pin: Option<crate::Pin>,
    },
    /// A message of the answer to a relayed request ([`ClusterAction::Relay`]).
    Relayed {
        token: HttpToken,
        message: RelayMessage,
    },
    /// A relayed request ended without a whole answer.
    RelayFailed { token: HttpToken, sent: RelaySent },
    /// Another replica's [`ClusterAction::Announce`].
    Announced(Announcement),
    /// The tools bucket's watch reported a write of a project's tool listing (`None`:
    /// deleted): the definitions its holder lists, as a JSON array.
    ToolsChanged {
        project: String,
        listing: Option<String>,
    },
}

/// News for the streams other replicas hold ([`ClusterAction::Announce`]). Not kept: a
/// replica that misses one (cut off from the engine) misses it, as a client whose stream was
/// closed does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "news", rename_all = "snake_case", deny_unknown_fields)]
pub enum Announcement {
    /// A list of `project`'s sled changed: `method` is the notification
    /// (`notifications/prompts/list_changed` or `notifications/resources/list_changed`). Each
    /// replica tells the sessions whose default it is and its listeners of the project.
    ListChanged { project: String, method: String },
    /// A notification (a JSON-RPC message, `data`) for these sessions' GET streams, made by a
    /// replica that holds none of them: the replica holding a stream sends it there.
    ToSessions { sessions: Vec<String>, data: String },
}

/// How a first-use pin went in the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinOutcome {
    /// This replica's create won: the key is the project's pin, cluster-wide.
    Created,
    /// The project was pinned already (by another replica, or a moment ago): to this pin.
    Exists(crate::Pin),
    /// The engine could not be asked (the sled is sent away to try again).
    Unavailable,
}

/// The engine could not be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineDown;

/// Whether a relayed request that got no whole answer reached the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelaySent {
    /// Nobody took it (no replica listens at the owner's address): it was not executed.
    NotSent,
    /// The owner took it and then fell silent (died, or was cut off): it may or may not have
    /// been executed.
    Unknown,
}

/// One message of a relayed answer, as the owner's driver produced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayMessage {
    /// The whole answer; the relay ends.
    Reply(HttpReply),
    /// The answer is an SSE stream; events and one `Close` follow.
    Open,
    Event {
        id: Option<u64>,
        data: String,
    },
    /// The stream ended; the relay ends.
    Close,
}

/// What the engine must do, for [`crate::Output::Cluster`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterAction {
    /// Write the project's directory key: `create` when `expected_revision` is `None`, else
    /// `update` at it. Answer with [`ClusterEvent::Claimed`].
    Claim {
        project: String,
        expected_revision: Option<Revision>,
        value: ClaimValue,
    },
    /// Delete the project's directory key at `revision`; a conflict is ignored.
    Release { project: String, revision: Revision },
    /// Read a session's record; answer with [`ClusterEvent::SessionLoaded`].
    LoadSession { session: String },
    /// Write a session's record (`None`: delete it). Writes of one session are carried out
    /// in the order given.
    StoreSession {
        session: String,
        record: Option<SessionRecord>,
    },
    /// Send this HTTP request to `replica`, which holds the uplink of its project, and report
    /// its answer with [`ClusterEvent::Relayed`] (or [`ClusterEvent::RelayFailed`]). The
    /// request is marked [`HttpRequest::relayed`], so the owner never relays it again.
    Relay {
        token: HttpToken,
        replica: String,
        request: Box<HttpRequest>,
        /// The project's call timeout: the owner answers by then (with the sled's answer, or
        /// its own timeout error), so a relay silent past it (and a margin) has lost its owner.
        timeout: std::time::Duration,
    },
    /// The client of a relayed request went away: tell the owner, which cancels the call.
    RelayAbort { token: HttpToken },
    /// Pin a sled's key for the project on first use: a `create`, so the first replica to pin
    /// wins and no replica overwrites it. Answer with [`ClusterEvent::PinCreated`] (with the
    /// existing pin, read back, on a conflict).
    CreatePin { project: String, pin: crate::Pin },
    /// Replace the project's pin (an operator's re-pin): a `put`.
    StorePin { project: String, pin: crate::Pin },
    /// Tell every other replica, for the streams they hold; reported there as
    /// [`ClusterEvent::Announced`].
    Announce(Announcement),
    /// Write the tool listing of a project whose sled is here (a JSON array of the
    /// definitions, `project` injected) to the tools bucket, so that every replica's stateless
    /// `tools/list` lists it; reported to all as [`ClusterEvent::ToolsChanged`]. Writes of one
    /// project are carried out in the order given.
    StoreTools { project: String, listing: String },
}

/// A session as the engine keeps it: what any replica needs to serve it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_project: Option<String>,
    pub protocol_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<u8>,
    #[serde(default)]
    pub client_capabilities: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl SessionRecord {
    /// The bytes to write.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a SessionRecord always serialises")
    }

    /// Reads a record from the bucket.
    pub fn parse(bytes: &[u8]) -> Result<SessionRecord, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// Counts of the cluster's work, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterCounts {
    /// Requests relayed to the replica holding their project's uplink.
    pub relays: u64,
    /// Relayed requests that ended without a whole answer (not sent, or owner lost).
    pub relays_failed: u64,
    /// Requests that came from another replica to be served here.
    pub relayed_in: u64,
    /// Claims won (each a new epoch).
    pub claims_won: u64,
    /// Claims (and refreshes) that conflicted.
    pub claim_conflicts: u64,
    /// Times this replica stopped serving a project because its claim was lost.
    pub claims_lost: u64,
    /// Times the engine came back after being lost.
    pub engine_reconnects: u64,
    /// Sessions read from the engine because this replica did not know them.
    pub sessions_loaded: u64,
    /// Requests held while their project moved between replicas.
    pub held: u64,
}

/// The gateway's state for the cluster; see the module docs.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) directory: Directory,
    /// Uplinks that passed every check and wait for their project's claim, by project.
    pub(crate) waiting: BTreeMap<String, Waiting>,
    /// Requests that name a session this replica is reading from the engine.
    pub(crate) parked: BTreeMap<String, Vec<(HttpToken, HttpRequest)>>,
    /// Requests relayed to another replica, until their answer ends.
    pub(crate) relays: HashMap<HttpToken, Relay>,
    /// When each session served here was last written to the engine.
    pub(crate) written: BTreeMap<String, Instant>,
    /// Writes of each session's record not done yet; the watch's news of a session is
    /// older than this replica's own while there are any.
    pub(crate) in_flight: BTreeMap<String, u32>,
    /// Projects whose sled just left its replica, until when requests for them are held.
    pub(crate) moving: BTreeMap<String, Instant>,
    /// Requests held for a moving project, by project.
    pub(crate) held: BTreeMap<String, Vec<(HttpToken, HttpRequest)>>,
    /// A replica that took no relay for a project: not relayed to again for it until the
    /// directory reports a new write of the project's key.
    pub(crate) unanswering: BTreeMap<String, String>,
    pub(crate) move_grace: std::time::Duration,
    /// Uplinks whose first-use pin is being created in the engine, by project.
    pub(crate) pinning: BTreeMap<String, Waiting>,
    /// Answers that wait for their session's write to be done (a new session's id is given
    /// out only once any replica can read it).
    pub(crate) after_store: BTreeMap<String, Vec<(HttpToken, HttpReply)>>,
    /// What this replica asks of the others to answer a fleet tool for the whole cluster.
    pub(crate) gathers: crate::gather::Gathers,
    /// The tools of projects whose sleds other replicas hold, as their holders listed them
    /// (the tools bucket), for the stateless `tools/list`.
    pub(crate) remote_tools: BTreeMap<String, Vec<crate::tools::CachedTool>>,
    pub(crate) counts: ClusterCounts,
}

/// An uplink waiting for its project's claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Waiting {
    pub(crate) uplink: crate::io::UplinkId,
    pub(crate) sled: String,
    pub(crate) key: Option<String>,
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
}

impl Cluster {
    pub(crate) fn new(config: &ClusterConfig) -> Cluster {
        Cluster {
            directory: Directory::new(config.replica.clone(), config.directory.clone()),
            waiting: BTreeMap::new(),
            parked: BTreeMap::new(),
            relays: HashMap::new(),
            written: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            moving: BTreeMap::new(),
            held: BTreeMap::new(),
            unanswering: BTreeMap::new(),
            move_grace: config.move_grace,
            pinning: BTreeMap::new(),
            after_store: BTreeMap::new(),
            gathers: crate::gather::Gathers::default(),
            remote_tools: BTreeMap::new(),
            counts: ClusterCounts::default(),
        }
    }

    /// The next instant something is due: the directory's, the end of a move that holds
    /// requests, or the deadline of a part asked of another replica.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let held_until = self
            .held
            .keys()
            .filter_map(|p| self.moving.get(p))
            .min()
            .copied();
        [
            self.directory.poll_timeout(),
            held_until,
            self.gathers.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_records_round_trip_and_refuse_unknown_fields() {
        let r = SessionRecord {
            default_project: Some("alpha".into()),
            protocol_version: "2025-06-18".into(),
            log_level: Some(3),
            client_capabilities: serde_json::json!({"sampling": {}}),
            owner: None,
        };
        assert_eq!(SessionRecord::parse(r.to_json().as_bytes()).unwrap(), r);
        assert!(SessionRecord::parse(br#"{"protocol_version":"x","extra":1}"#).is_err());
        assert!(SessionRecord::parse(b"not json").is_err());
    }

    #[test]
    fn announcements_round_trip_and_refuse_unknown_news() {
        for a in [
            Announcement::ListChanged {
                project: "alpha".into(),
                method: "notifications/prompts/list_changed".into(),
            },
            Announcement::ToSessions {
                sessions: vec!["s1".into(), "s2".into()],
                data: r#"{"jsonrpc":"2.0","method":"m"}"#.into(),
            },
        ] {
            let text = serde_json::to_string(&a).unwrap();
            assert_eq!(serde_json::from_str::<Announcement>(&text).unwrap(), a);
        }
        assert!(serde_json::from_str::<Announcement>(r#"{"news":"other"}"#).is_err());
        assert!(serde_json::from_str::<Announcement>(
            r#"{"news":"list_changed","project":"a","method":"m","extra":1}"#
        )
        .is_err());
    }
}
