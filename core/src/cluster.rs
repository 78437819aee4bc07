//! A replica's part in a cluster of gateways (issue 15): what it asks of the engine and what
//! the engine tells it, and the state the gateway keeps for it.
//!
//! The gateway owns a `Replica` (`replica.rs`) and a `Records` (`records.rs`) when
//! [`crate::Config::cluster`] is set, and nothing of them otherwise: a single-process gateway
//! needs no engine. (A single gateway with [`crate::Config::store_sessions`] owns a `Records`
//! alone, whose session actions and answers travel as these too.) The decisions are those machines' (and the
//! [`crate::directory::Directory`]'s, which the
//! replica machine owns); this module holds their vocabulary:
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
//!   in the engine, decided by compare-and-set ([`crate::directory::Directory`]).
//! - **Sessions** (default project, protocol version, capabilities, log level, owner): in the
//!   engine, as a [`SessionRecord`] written whenever one changes (and re-written when in use
//!   for a third of the idle TTL, so that the bucket's `max_age` ends only idle sessions), and
//!   cached by every replica that serves them; the engine's watch keeps the caches current.
//!   GET streams and their replay buffers stay with the replica that holds the stream.
//! - **A sled's calls** are correlated by the replica that holds its uplink, as on one
//!   gateway; another replica relays the client's whole HTTP request to it and relays the
//!   answer back.

use serde::{Deserialize, Serialize};

use crate::directory::{ClaimOutcome, ClaimValue, DirectoryConfig, EntryState, Revision};
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
    /// The cluster's key for agent handles (derived from the cluster secret,
    /// [`crate::keys::KeyRing::agent_keys`]): a handle any replica issued is recognised by
    /// every other.
    pub agent_key: Option<crate::agents::AgentKey>,
    /// During a roll of the cluster secret, the previous secret's key: handles issued under
    /// it are still recognised; new ones are issued under `agent_key`.
    pub previous_agent_key: Option<crate::agents::AgentKey>,
    /// The cluster's key for task ids ([`crate::keys::KeyRing::task_keys`]), and during a roll
    /// the previous secret's: a task id any replica made is routed and checked by every other.
    pub task_keys: Option<(crate::tasks::TaskKey, Option<crate::tasks::TaskKey>)>,
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
        /// Sealed under the previous cluster secret (a roll is under way): written again
        /// under the current one.
        under_previous_secret: bool,
    },
    /// The sessions bucket's watch reported a write (`None`: deleted or expired).
    SessionChanged {
        session: String,
        record: Option<SessionRecord>,
    },
    /// A [`ClusterAction::StoreSession`] is done: `written`, or not (the engine out of reach;
    /// the record is written again at the session's next use).
    SessionStored { session: String, written: bool },
    /// A [`ClusterAction::StoreCoord`] is done: the keys whose write failed (none: all durable).
    CoordStored { batch: u64, failed: Vec<String> },
    /// The answer to a [`ClusterAction::LoadCoord`]: every coordination record of the
    /// project, each with its age (an engine out of reach: the load is asked again).
    CoordLoaded {
        project: String,
        records: Result<Vec<crate::coord::StoredRecord>, EngineDown>,
    },
    /// The answer to a [`ClusterAction::CreatePin`].
    PinCreated {
        project: String,
        outcome: PinOutcome,
    },
    /// The pins bucket's watch reported a write of a project's pin (`None`: deleted).
    PinChanged {
        project: String,
        pin: Option<crate::Pin>,
        /// Sealed under the previous cluster secret (a roll is under way): the replica
        /// holding the project's sled writes it again under the current one.
        under_previous_secret: bool,
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
        /// Sealed under the previous cluster secret: written again under the current one
        /// by the replica holding the project's sled.
        under_previous_secret: bool,
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
    /// This replica could not reach the engine: nothing was sent. The request waits for the
    /// engine, at most its call's timeout, and is then answered `not_sent`.
    EngineDown,
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
    /// Write a batch of coordination records (a single gateway's store, or a cluster's engine
    /// for the projects a replica holds; issue 25): each
    /// change a put or (`value: None`) a delete. Batches are carried out in the order given;
    /// answer with [`ClusterEvent::CoordStored`] once every write of the batch is durable (or
    /// has failed).
    StoreCoord {
        batch: u64,
        changes: Vec<crate::coord::RecordChange>,
    },
    /// Read every coordination record of `project` (a replica that won its claim, before it
    /// serves it: the state the last holder kept); answer with [`ClusterEvent::CoordLoaded`].
    LoadCoord { project: String },
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
