//! The gateway state machine.
//!
//! Methods come in four groups, in the quinn-proto order: getters; [`Gateway::handle`] and
//! [`Gateway::handle_timeout`] take events in; [`Gateway::poll_output`] and
//! [`Gateway::poll_timeout`] take decisions out. After every `handle*` call, drain
//! `poll_output` and re-read `poll_timeout`.
//!
//! The handlers live beside this file, in floors: each file calls only files on lower
//! floors (ARCHITECTURE.md, "Which file may call which", lists them; `tests/tests/layers.rs`
//! checks it). This file is the top: it takes events in, fires timers, and `settle`s what
//! comes back up without a call (requests to handle again, the replica machine's events).
//! The doors are `client.rs` (HTTP), `modern.rs` (the stateless era), `sled.rs` (uplinks) and
//! `engine.rs` (the cluster's engine); what goes in and out is in `io.rs`.

mod access;
mod basics;
mod calls;
mod client;
mod cluster;
pub(crate) mod coordination;
mod engine;
mod fleet;
mod gather;
mod handshake;
mod listen;
mod listing_holds;
mod meta;
mod modern;
mod mrtr;
mod news;
mod own_tasks;
mod proxy;
mod records;
mod sled;
mod spread;
mod streams;
mod tasks;
mod tool_call;
mod uplinks;

/// The notification of a changed tool list (a sled's, and the gateway's to its clients).
const TOOLS_CHANGED: &str = "notifications/tools/list_changed";

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::error::{CallLimit, HttpError, RpcError, SledRequestRefused, UplinkLoss};
use crate::http::{self as headers, PROTOCOL_VERSIONS};
use crate::jsonrpc::{self, ClientMessage, RawId};
use crate::lease_spot::LeaseSpot;
use crate::metrics::Outcome;
use crate::registry::Registry;
use crate::rights::Right;
use crate::session::Sessions;
use crate::tools::{
    self, CachedTool, AGGREGATE_PIPELINE_STATUS, FLEET_IDENTITY, GATEWAY_HEALTH, LIST_PROJECTS,
    SWITCH_PROJECT,
};
use crate::uplink::{CloseCode, Control, FENCE_META, PROTOCOL_VERSION, RELATED_REQUEST_META};

use crate::io::{
    HttpMethod, HttpReply, HttpRequest, HttpToken, Input, Output, ProbeId, ProbeOutcome, UplinkId,
};

/// Settings of the state machine that are not per project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// How often the gateway pings each uplink.
    pub heartbeat_interval: Duration,
    /// Silence from a sled for this long closes its uplink.
    pub heartbeat_timeout: Duration,
    /// A new uplink must say hello within this.
    pub hello_timeout: Duration,
    /// Deadline of the gateway's own `tools/list` requests to a sled.
    pub refresh_timeout: Duration,
    /// A session unused for this long (and with no open GET stream) ends; its id then gets 404.
    pub session_idle_ttl: Duration,
    /// Browser origins allowed beside loopback ones (`*`: any). Requests without `Origin`
    /// (not from a browser) are always allowed.
    pub allowed_origins: Vec<String>,
    /// The most tools one `tools/list` page holds; longer lists get a `nextCursor`.
    pub tools_page_size: usize,
    /// How many events of a session's GET stream are kept for `Last-Event-ID` resumption.
    pub replay_events: usize,
    /// The most sessions held at once. At the limit, `initialize` ends the least recently used
    /// idle session (no open GET stream, no call in flight); with none idle it gets 503 and
    /// `Retry-After`.
    pub max_sessions: usize,
    /// The most sessions one identity (a client token, an OAuth subject) may hold; at it, its
    /// `initialize` ends its own least recently used idle session, or gets 503. Without
    /// client authentication only `max_sessions` holds.
    pub max_sessions_per_identity: usize,
    /// The most calls one session may have in flight; past it a call is refused at once
    /// (`too_many_calls`), never queued.
    pub max_calls_per_session: usize,
    /// The most calls (and the gateway's own requests) one sled may have in flight; past it a
    /// call is refused at once (`too_many_calls`), never queued.
    pub max_calls_per_sled: usize,
    /// The most calls one identity (a client token, an OAuth subject) may have in flight, in
    /// all its sessions, without one, and in the stateless era (parked calls included); past
    /// it a call is refused at once (`too_many_calls`). Without client authentication there
    /// is no identity to count by: only the per-session and per-sled limits hold.
    pub max_calls_per_identity: usize,
    /// The most `aggregate_pipeline_status` fan-outs (one call to every visible sled each) one
    /// identity may have running; past it one is refused at once (`too_many_calls`). Only
    /// with client authentication, as `max_calls_per_identity`.
    pub max_fanouts_per_identity: usize,
    /// The retry hint given with a refusal by a limit (`retry_after_ms`, `Retry-After`).
    pub retry_after: Duration,
    /// How long a write to a project whose sled just connected, whose tools this gateway has
    /// never listed and which has live leases, waits for that listing (bounded by the call's
    /// own timeout) before it is refused `tools_pending` (`listing_holds.rs`).
    pub listing_hold: Duration,
    /// How often a project without a live uplink has its `url` probed over HTTP for
    /// `gateway_health` (zero: never).
    pub probe_interval: Duration,
    /// A probe without an answer after this long counts as failed.
    pub probe_timeout: Duration,
    /// A project whose sled sent no relay event for this long has a stale relay.
    pub relay_stale_after: Duration,
    /// Refuse sleds that present no identity key (close 4007), pinned or not.
    pub require_identity: bool,
    /// The name sleds dial this gateway by (the host of their uplink URL): a sled's identity
    /// proof must be made for it, else the sled is refused (close 4007). `None`: a proof made
    /// for any gateway name is accepted (it is still bound to the nonce and the project).
    /// A single gateway's key for agent handles, derived from the gateway secret it keeps in
    /// its state directory (`crate::keys::KeyRing::agent_keys`): a handle issued before a
    /// restart is recognised after it, and nobody without the key can make one. `None`:
    /// handles are remembered, not signed, and end with the gateway. In a cluster the
    /// cluster's key ([`crate::cluster::ClusterConfig::agent_key`]) is used instead.
    pub agent_key: Option<crate::agents::AgentKey>,
    /// A single gateway's key for task ids, derived from the same secret
    /// (`crate::keys::KeyRing::task_keys`): a task id given out before a restart still opens
    /// after it. `None`: a random key, good for this process's life. In a cluster the
    /// cluster's keys ([`crate::cluster::ClusterConfig::task_keys`]) are used instead.
    pub task_key: Option<crate::tasks::TaskKey>,
    /// The wall-clock time when the gateway takes its first input, in milliseconds since the
    /// Unix epoch: the `createdAt` of the tasks it runs itself is counted from it on the
    /// inputs' clock (`None`: from the epoch, as a simulation wants).
    pub wall_clock_ms: Option<u64>,
    pub public_name: Option<String>,
    /// `aggregate_pipeline_status`: the default overall deadline (a call may ask for less).
    pub fanout_timeout: Duration,
    /// `aggregate_pipeline_status`: the default deadline of each sled's answer.
    pub fanout_sled_timeout: Duration,
    /// How long a sled's first-use pin may wait before the pin file is saved, so that a fleet
    /// connecting at once is saved a few times rather than once per sled (each save is the
    /// whole file). A re-pin, and shutdown, save at once. Zero: every pin at once.
    pub pin_save_delay: Duration,
    /// Coordination's TTLs and bounds (presence, leases, messages, board, waits).
    pub coordination: crate::coord::Limits,
    /// Emit an [`Output::Span`] for every forwarded request of a client's trace (a valid
    /// `_meta.traceparent`) when it ends. Off by default: then no span is kept or made.
    pub export_spans: bool,
    /// Join a cluster of replicas as this one (`None`: a single-process gateway).
    pub cluster: Option<crate::cluster::ClusterConfig>,
    /// Keep sessions in a store outside the process, through the records machine
    /// (`crate::records`): a single gateway with a state directory (issue 25). Each change of a
    /// session goes out as a [`crate::cluster::ClusterAction::StoreSession`] (its answer waits
    /// for the write), and a request naming a session this gateway does not know waits for a
    /// [`crate::cluster::ClusterAction::LoadSession`] (it was made before a restart). In a
    /// cluster the engine keeps sessions whatever this says.
    pub store_sessions: bool,
    /// Keep sled pins in that store too (with [`Config::store_sessions`]): a first-use pin is
    /// created there ([`crate::cluster::ClusterAction::CreatePin`]) before its sled is
    /// accepted, and a re-pin is written there, instead of asking for the pin file to be saved
    /// ([`Output::SavePins`]). In a cluster pins are kept in the engine whatever this says.
    pub store_pins: bool,
    /// Test-only: a known bug to plant, so the test suites can show that they catch it.
    #[cfg(feature = "planted-bugs")]
    pub planted: Option<PlantedBug>,
}

/// Bugs the simulation must be able to catch, planted on purpose (feature `planted-bugs`).
#[cfg(feature = "planted-bugs")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlantedBug {
    /// The design before story 1208: `switch_project` sets one active project shared by every
    /// session, and calls without `project` go there.
    SharedActiveProject,
    /// The proxy bug: the client's own id goes up the uplink and responses are matched by it
    /// alone, so two sessions using the same id get each other's answers.
    CorrelateByClientId,
    /// The progress relay finds its call by the client's progress token instead of the
    /// gateway's: a sled's progress goes to the most recently started pending call whose client
    /// chose the same token, which may be another session's (or a stateless client's).
    ProgressByClientToken,
    /// A client's `notifications/cancelled` releases the latest pending call with that
    /// request id of any session, not only of the session that sent it.
    CancelAcrossSessions,
    /// `[[access]]`: the `read` right lets writes through too (any tool, claims).
    RightsIgnoreReadOnly,
    /// `[[access]]`: the projects a caller may see are every registered one where a list of
    /// them is given (an `unknown_project`'s `registered`, the fleet tools).
    HiddenProjectsListed,
    /// In a cluster: a replica believes whatever the engine gives it, sealed or not, as the
    /// gateway did before the cluster secret (the server's `cluster::seal`).
    TrustTheEngine,
    /// In a cluster: a replica keeps no nonces (neither its seal's nor its record of the relays
    /// it served), so a relay envelope or an announcement heard again is acted on again.
    ForgetNonces,
    /// In a cluster: a replica that loses a project's claim keeps its uplink and goes on
    /// sending it calls (only a sled's epoch fence, if the same sled, would stop them).
    ServeAfterLosingClaim,
    /// In a cluster: a `wait` waits in every project on the replica it came to, as one
    /// gateway would, though the state of projects held elsewhere (and what wakes it) is
    /// there.
    WaitHereOnly,
    /// In a cluster: replicas do not follow the tools bucket, so a stateless `tools/list`
    /// lists only the projects whose sleds are on the replica answering.
    IgnoreRemoteTools,
    /// A write held until its project's tools are listed is not served when they are: it
    /// waits out the hold and is refused `tools_pending` though the tools are known.
    ToolsPendingAfterListing,
    /// Tasks: a caller's task id is taken as the sled's own id in the caller's default
    /// project (else the first registered one), as a gateway that relayed ids unsealed would:
    /// ids collide across projects, and anyone's id works for anyone.
    TaskIdsUnsealed,
    /// Tasks: `tasks/list` shows every caller's tasks, not only the asker's.
    TasksListUnfiltered,
    /// Tasks: a 2025-11-25 `tasks/cancel` is acknowledged `cancelled` on the strength of a
    /// `tasks/get` to the sled, which never hears of the cancellation (as a gateway that
    /// acknowledged optimistically would): the task runs on and completes.
    TaskCancelNotSent,
    /// In a cluster: a relay that could not be sent because the engine was out of reach is
    /// answered at once as taken and lost (`outcome: "unknown"`, `owner_lost`), the old
    /// behaviour, instead of waiting for the engine and then saying `not_sent`.
    UnknownWhenNotSent,
    /// What a principal set up on a project (resource subscriptions, `subscriptions/listen`
    /// streams, parked `wait`s, a session's coordination notices and list changes) is checked
    /// against the rules only when set up: a reload that takes the project away ends none of
    /// it (security review finding 14, before its fix).
    RightsCheckedOnlyAtSetUp,
    /// The per-identity budget counts only calls made in a session: sessionless and stateless
    /// calls go past `max_calls_per_identity`, as they went past `max_calls_per_session`
    /// (security review finding 15, before its fix).
    BudgetSkipsSessionless,
    /// Agent-handle expiry forgets a handle unused for the session TTL though its agent still
    /// holds a lease, so the holder can no longer renew, release or write under it.
    HandleExpiryIgnoresLeases,
    /// A handle issued here is the agent of whoever presents it, not only of the identity it
    /// was issued to: a leaked handle lets another caller claim, write and release as its
    /// agent.
    HandleAcrossIdentities,
    /// A gateway asked to stop does not wait for its calls in flight: its uplinks close at
    /// once, cutting the calls running on them (issue 30: a graceful stop fails no call).
    /// Planted in the server's driver.
    StopWithoutDrain,
    /// A single gateway with a store answers a coordination write as soon as it is made,
    /// without waiting for the store to have it (issue 25: acknowledged means durable).
    CoordAckBeforeDurable,
    /// In a cluster: a replica that loses the engine with a relay in flight answers its client
    /// `outcome: "unknown"` at once, without asking the owner what became of it once the
    /// engine is back (issue 31). Planted in the server's replica.
    NoOutcomeRecovery,
    /// In a cluster: a replica keeps no record of the relays it served, and answers every
    /// question about one "never seen", so the relaying replica sends a call that ran there
    /// again. Planted in the server's replica.
    ForgetOutcomes,
    /// In a cluster: a replica that wins a project's claim serves it at once, without first
    /// reading the coordination state its last holder kept (issue 25: a board write, a lease
    /// or a message acknowledged before a move is gone after it).
    ServeBeforeCoordLoaded,
    /// In a cluster: a stopping replica whose project was taken over by the replica its sled
    /// moved to closes the old uplink at once, cutting the calls still running on it, instead
    /// of letting them answer first (issue 30: make-before-break).
    HandoverCutsCalls,
    /// In a cluster: a new session is given out even when the engine did not take its
    /// record, as before `session_not_stored`: the next request naming it on another replica
    /// finds no such session (issue 25).
    HandOutUnwrittenSession,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heartbeat_interval: Duration::from_secs(5),
            heartbeat_timeout: Duration::from_secs(15),
            hello_timeout: Duration::from_secs(10),
            refresh_timeout: Duration::from_secs(30),
            session_idle_ttl: Duration::from_secs(30 * 60),
            allowed_origins: Vec::new(),
            tools_page_size: 2000,
            replay_events: 64,
            max_sessions: 10_000,
            max_sessions_per_identity: 1_000,
            max_calls_per_session: 64,
            max_calls_per_sled: 1024,
            max_calls_per_identity: 256,
            max_fanouts_per_identity: 4,
            retry_after: Duration::from_secs(1),
            listing_hold: Duration::from_secs(1),
            probe_interval: Duration::from_secs(10),
            probe_timeout: Duration::from_secs(2),
            relay_stale_after: Duration::from_secs(30),
            require_identity: false,
            public_name: None,
            agent_key: None,
            task_key: None,
            wall_clock_ms: None,
            fanout_timeout: Duration::from_secs(5),
            fanout_sled_timeout: Duration::from_secs(2),
            pin_save_delay: Duration::from_millis(500),
            coordination: crate::coord::Limits::default(),
            export_spans: false,
            cluster: None,
            store_sessions: false,
            store_pins: false,
            #[cfg(feature = "planted-bugs")]
            planted: None,
        }
    }
}

/// Counters and gauges, for logs, metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub sessions: usize,
    pub live_uplinks: usize,
    pub pending_calls: usize,
    pub calls_forwarded: u64,
    pub calls_timed_out: u64,
    /// Responses from a sled that arrived after their call's deadline.
    pub responses_dropped_late: u64,
    /// Responses from a sled with an id the gateway never sent on that uplink.
    pub responses_dropped_unknown: u64,
    /// Frames from a sled that were not valid protocol messages.
    pub frames_invalid: u64,
    /// `unreadable` control frames: a sled said it could not read a frame the gateway sent.
    pub frames_unreadable_at_sled: u64,
    /// Stateless requests answered `input_required` (a sled asked their client for input).
    pub input_required: u64,
    /// Stateless calls parked for their client's retry, or holding an answer for it.
    pub parked_calls: usize,
    /// Calls the client cancelled.
    pub calls_cancelled: u64,
    /// Sessions ended by the idle TTL.
    pub sessions_expired: u64,
    /// Open SSE streams (GET streams and streamed POST answers).
    pub open_streams: usize,
    /// Idle sessions ended to make room under `max_sessions`.
    pub sessions_evicted: u64,
    /// `initialize`s refused at `max_sessions` (503).
    pub sessions_refused: u64,
    /// Calls refused by `max_calls_per_session`, `max_calls_per_sled`,
    /// `max_calls_per_identity` or `max_fanouts_per_identity`.
    pub calls_refused: u64,
}

/// A sled's tool list is followed for at most this many pages.
const MAX_TOOL_PAGES: u32 = 100;

const INSTRUCTIONS: &str = "This gateway fronts many projects. Project tools take an optional \"project\" argument naming the registered project to run on (list_projects names them); without it a call goes to this session's default project, which switch_project sets for this session only.";

/// The gateway: registry, sessions, uplinks and the calls pending on them.
#[derive(Debug)]
pub struct Gateway {
    registry: Registry,
    config: Config,
    sessions: Sessions,
    /// The gateway's own tools, serialised once.
    gateway_tools: Vec<String>,
    /// The gateway's tools, joined with commas: the start of every `tools/list`.
    gateway_listing: String,
    /// The stateless-era `tools/list` result, until some project's tools change.
    modern_listing: Option<String>,
    /// Live state per registered project, by name.
    projects: HashMap<String, ProjectState>,
    uplinks: HashMap<UplinkId, Uplink>,
    /// Requests sent up an uplink and not yet answered, with their indexes (`calls.rs`).
    calls: calls::Calls,
    /// Open GET streams, by token, to their session.
    get_streams: HashMap<HttpToken, String>,
    /// Open streamed POST answers.
    post_streams: BTreeSet<HttpToken>,
    /// Id of the next SSE event; unique across the gateway, so unique per session.
    next_event: u64,
    /// Whether the session-expiry sweep timer is armed.
    sweep_armed: bool,
    /// Open stateless-era `subscriptions/listen` streams, with the id of the listen request.
    listens: BTreeMap<HttpToken, listen::Listen>,
    /// Sessions subscribed to each (project, resource URI), with who subscribed them.
    subscriptions:
        std::collections::BTreeMap<(String, String), BTreeMap<String, crate::auth::Holder>>,
    /// The number in the gateway's id for the next sled's request relayed to a client.
    next_server_request: u64,
    /// Stateless calls parked until their client retries with input (`requestState`).
    retries: mrtr::Retries,
    /// Writes held until their project's tools are listed (`listing_holds.rs`).
    listing_holds: listing_holds::ListingHolds,
    timers: BTreeSet<(Instant, Timer)>,
    outputs: VecDeque<Output>,
    shutting_down: bool,
    /// Shutdown is coming: this replica hands its projects over (`Input::Handover`).
    handing_over: bool,
    /// Uplinks in [`UplinkState::Retiring`]: closed once no call runs on them.
    retiring: BTreeSet<UplinkId>,
    counters: Counters,
    /// Calls by tool, project and outcome; latencies.
    call_metrics: crate::metrics::CallMetrics,
    /// Pinned sled keys (trust on first use), as in the pin file.
    pins: crate::identity::Pins,
    /// When the pins changed since the last `SavePins` are due to be saved.
    pins_save_at: Option<Instant>,
    /// The projects whose pin in the engine is sealed under the previous cluster secret: the
    /// replica that comes to hold the sled writes it again under the current one.
    pins_under_previous: BTreeSet<String>,
    /// Challenge nonces (a stream of its own from the seed).
    rng: rand_chacha::ChaCha20Rng,
    /// Whether the probe round timer is armed.
    probes_armed: bool,
    next_probe: u64,
    /// HTTP probes in flight.
    probes: HashMap<ProbeId, fleet::Probe>,
    /// `aggregate_pipeline_status` calls waiting for sleds, with their overall deadline.
    fanouts: HashMap<u64, (fleet::Fanout, Duration)>,
    fanout_by_token: HashMap<HttpToken, u64>,
    next_fanout: u64,
    /// Presence, leases, messages, board and waits between sessions.
    coordination: coordination::Coordination,
    /// Requests to handle again from the top once the event that released them is over (held
    /// for a listing, for a moving project, or for their session's read): drained by
    /// [`Gateway::settle`] after every input.
    again: VecDeque<(HttpToken, HttpRequest)>,
    /// The replica machine, in a cluster (`None`: a single-process gateway); only
    /// `cluster.rs` and this file touch it.
    cluster: Option<crate::replica::Replica>,
    /// Sessions and pins kept in the engine, in a cluster, and sessions kept in the store of a
    /// single gateway ([`Config::store_sessions`]); only `records.rs` and this file touch it.
    records: Option<crate::records::Records>,
    /// Task ids and the records of tasks made through this gateway (`crate::tasks`).
    tasks: crate::tasks::Tasks,
    /// `tasks/result` requests waiting for a task the gateway runs itself, by its id.
    own_waiters: BTreeMap<String, Vec<(HttpToken, RawId)>>,
    /// The first input's time and the wall-clock time then ([`Config::wall_clock_ms`]).
    wall_origin: Option<(Instant, u64)>,
    /// Fleet tools' parts asked of other replicas (`gather.rs`, `spread.rs`).
    gathers: crate::gather::Gathers,
    /// The tools of projects whose sleds other replicas hold, as their holders listed them
    /// (the tools bucket), for the stateless `tools/list` (`news.rs`).
    remote_tools: BTreeMap<String, Vec<crate::tools::CachedTool>>,
    /// Only with [`PlantedBug::SharedActiveProject`]: the one active project of the old design.
    #[cfg(feature = "planted-bugs")]
    shared_active: Option<String>,
}

#[derive(Debug, Default)]
struct ProjectState {
    /// The project's live uplink, if any.
    uplink: Option<UplinkId>,
    /// The tools its sled reported, once the first `tools/list` completed.
    tools: Option<Vec<CachedTool>>,
    /// `tools`' definitions joined with commas, so that a `tools/list` is two copies.
    listing: Option<String>,
    /// Bumped at every new refresh, so an older refresh's pages are ignored.
    refresh: u64,
    /// The lease annotations of its tools as last listed (tool → where it names resources),
    /// kept when the uplink goes, so that writes stay checked until the tools are listed
    /// again; `None` until a listing arrived in this gateway's life.
    leases_known: Option<HashMap<String, LeaseSpot>>,
    /// Heartbeats, probes, relay and identity, for the fleet tools.
    health: fleet::Health,
}

impl ProjectState {
    /// Replaces the project's tools (and their joined listing); returns the old ones.
    fn set_tools(&mut self, tools: Option<Vec<CachedTool>>) -> Option<Vec<CachedTool>> {
        self.listing = tools.as_ref().map(|ts| {
            let mut s = String::with_capacity(ts.iter().map(|t| t.json.len() + 1).sum());
            for (i, t) in ts.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                s.push_str(&t.json);
            }
            s
        });
        if let Some(ts) = &tools {
            self.leases_known = Some(
                ts.iter()
                    .filter_map(|t| Some((t.name.clone(), t.lease.clone()?)))
                    .collect(),
            );
        }
        std::mem::replace(&mut self.tools, tools)
    }
}

#[derive(Debug)]
struct Uplink {
    state: UplinkState,
    last_rx: Instant,
    ping_seq: u64,
    /// The armed hello or heartbeat timer.
    timer: Option<Instant>,
    /// The identity key the sled proved it holds (base64), once live.
    key: Option<String>,
    /// The highest fence the sled said (in its hello) it has accepted.
    fence_floor: Option<u64>,
    /// The highest epoch the sled said (in its hello) it has been welcomed with.
    epoch_seen: Option<u64>,
    /// The hello answers a move (`Control::Move`) of the sled's other uplink.
    moving: bool,
    /// What the sled last said of the MCP server behind it (`Control::Upstream`), when it
    /// fronts one.
    upstream: Option<UpstreamReport>,
}

/// A connector sled's word on its MCP server (`Control::Upstream`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct UpstreamReport {
    state: crate::uplink::UpstreamState,
    reason: Option<String>,
    restarts: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum UplinkState {
    AwaitingHello,
    /// The hello named a key; the sled must sign the challenge.
    AwaitingProof(Box<handshake::Proving>),
    /// Passed every check; waits for this replica to win the project's claim in the
    /// cluster's directory (the hello timer still runs).
    AwaitingClaim {
        project: String,
    },
    Live {
        project: String,
    },
    /// Was live; its project was handed over to the replica its sled moved to (issue 30).
    /// It takes no new call; the calls running on it are answered, then it is closed.
    Retiring {
        project: String,
    },
}

#[derive(Debug)]
enum Pending {
    /// A client's `tools/call`.
    Call(Call),
    /// The gateway's own `tools/list`, one page of a refresh.
    ToolsList {
        project: String,
        refresh: u64,
        page: u32,
        tools: Vec<Value>,
        deadline: Instant,
    },
    /// The gateway's own `resources/subscribe` or `unsubscribe` for its stateless listeners.
    Subscription { project: String, deadline: Instant },
    /// The gateway's own `tasks/result` for a task that became terminal, whose
    /// `notifications/tasks` to stateless listeners carries its result (`tasks.rs`).
    TaskFetch {
        project: String,
        sled_id: String,
        task: Box<Map<String, Value>>,
        deadline: Instant,
    },
    /// One sled's `pipeline_status` for an `aggregate_pipeline_status`.
    FanoutPart {
        fanout: u64,
        project: String,
        sent_at: Instant,
        deadline: Instant,
    },
}

/// A client's `tools/call`, forwarded to a sled and not yet answered.
#[derive(Debug)]
struct Call {
    token: HttpToken,
    /// The client's id, as it wrote it.
    client_id: RawId,
    project: String,
    /// The metrics label: the tool's name if the project lists it, else `_unlisted`; the
    /// method for a proxied request.
    tool: String,
    sent_at: Instant,
    deadline: Instant,
    /// The calling session, for `notifications/cancelled`.
    session: Option<String>,
    /// The gateway's progress token for this call, and the client's own, when the client
    /// asked for progress. The sled only ever sees the gateway's.
    progress: Option<(String, Box<RawValue>)>,
    /// Whether the client reads SSE answers (its Accept names `text/event-stream`).
    stream_ok: bool,
    /// A request of the stateless era: its result carries `resultType` and its errors the
    /// era's HTTP statuses.
    modern: bool,
    /// How the result is changed on its way back.
    rewrite: proxy::Rewrite,
    /// The W3C trace id the client's `_meta.traceparent` carried, for the log lines.
    trace_id: Option<String>,
    /// The gateway's span of the client's trace, with span export on.
    span: Option<Box<crate::trace::CallSpan>>,
    /// A stateless-era request's own log level (`_meta["io.modelcontextprotocol/logLevel"]`):
    /// the threshold of the log messages relayed to it.
    log_level: Option<u8>,
    /// Whether the answer has become an SSE stream: it does at the first message for the
    /// client before the response (progress, a log message); until then it is plain JSON.
    streamed: bool,
    /// A stateless `tools/call`, `prompts/get` or `resources/read`: its multi round-trip
    /// state (the sled's requests for the client, and the `requestState` while parked).
    mrtr: Option<Box<mrtr::Rounds>>,
    /// Who made the call, for its audit line (kept only when audit lines are on).
    principal: Option<Box<str>>,
    /// The identity whose budget it counts in ([`crate::Identity::session_owner`];
    /// `max_calls_per_identity`), when client authentication is on.
    owner: Option<Box<str>>,
}

impl Pending {
    fn deadline(&self) -> Instant {
        match self {
            Pending::Call(Call { deadline, .. })
            | Pending::ToolsList { deadline, .. }
            | Pending::Subscription { deadline, .. }
            | Pending::TaskFetch { deadline, .. }
            | Pending::FanoutPart { deadline, .. } => *deadline,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// The hello deadline, or the next heartbeat, of an uplink.
    Uplink(UplinkId),
    /// Ends sessions idle past the TTL.
    SessionSweep,
    /// Probes the projects without an uplink.
    ProbeRound,
    /// The deadline of an HTTP probe.
    Probe(ProbeId),
    /// The overall deadline of an `aggregate_pipeline_status`.
    Fanout(u64),
    /// Saves the pins changed since the last save.
    SavePins,
}

#[derive(Debug, Default)]
struct Counters {
    calls_forwarded: u64,
    calls_timed_out: u64,
    responses_dropped_late: u64,
    responses_dropped_unknown: u64,
    frames_invalid: u64,
    frames_unreadable_at_sled: u64,
    input_required: u64,
    calls_cancelled: u64,
    sessions_expired: u64,
    sessions_evicted: u64,
    sessions_refused: u64,
    calls_refused: u64,
}

/// How a forwarded call is answered.
#[derive(Debug, Clone, Copy)]
struct CallMode {
    /// The client reads SSE answers.
    stream_ok: bool,
    /// The request is of the stateless era.
    modern: bool,
}

/// Where a request's project is served, when not here: a value, never an error (a relayed
/// request is never placed away again; it is answered `sled_elsewhere` or
/// `sled_not_connected` instead).
#[derive(Debug)]
enum Away {
    /// Its sled is on another replica of the cluster: the request is relayed there whole.
    Relay { project: String, replica: String },
    /// Its sled left its replica a moment ago: the request waits for its next one
    /// (`cluster.rs`, `hold`).
    Hold { project: String },
}

/// Where a request for a project goes ([`Gateway::route`]).
enum Placement {
    /// Up this replica's uplink to the project's sled.
    Here(proxy::Route),
    Away(Away),
}

/// What handling a client's request came to. Every request handler answers one of these;
/// only a refusal is an error.
#[derive(Debug)]
enum Served {
    /// Answered now, with this JSON-RPC result.
    Now(String),
    /// A coordination tool's result: answered once what it changed is durable (a single
    /// gateway with a store; else at once, as `Now`).
    Coordinated {
        result: String,
        tool: &'static str,
        project: String,
    },
    /// Forwarded to a sled or parked: the answer comes later.
    Later,
    Away(Away),
    /// A write whose project's tools this gateway has not listed since its sled came, while
    /// the project has live leases: held until they are (`listing_holds.rs`), else refused
    /// `tools_pending`.
    AwaitListing {
        project: String,
    },
}

/// The session a request belongs to, or its absence (a sessionless or stateless-era request).
#[derive(Debug, Clone, Copy)]
enum Scope<'a> {
    Session(&'a str),
    Sessionless,
}

/// What is true only while one HTTP request is handled: built by `on_http`, passed down the
/// request path by reference. Nothing outside that path has one, so a sled's frame or a timer
/// cannot be decided with some request's identity.
///
/// Three things were once all called "caller": the principal (who the credentials prove the
/// sender is, [`crate::Identity`]), the scope (its session or none, [`Scope`]) and the subject
/// that `[[access]]` rules match ([`crate::rights::Caller`]), which is made from the principal.
#[derive(Clone, Copy)]
struct Req<'r> {
    now: Instant,
    token: HttpToken,
    /// Who sent it, as its credentials proved.
    principal: &'r crate::auth::Identity,
    /// Relayed here by another replica of the cluster: served here, never relayed again.
    relayed: bool,
    scope: Scope<'r>,
    /// What it was authenticated with, for the parts a fleet tool asks of other replicas in
    /// its name (empty outside a cluster).
    credentials: &'r crate::gather::Credentials,
}

impl<'r> Req<'r> {
    /// The same request, in `scope`.
    fn in_scope(&self, scope: Scope<'r>) -> Req<'r> {
        Req { scope, ..*self }
    }

    /// Its session id, if it has one.
    fn session(&self) -> Option<&'r str> {
        match self.scope {
            Scope::Session(s) => Some(s),
            Scope::Sessionless => None,
        }
    }
}

impl Gateway {
    /// A gateway for `registry`. `seed` drives the session-id generator: give it fresh OS
    /// randomness in production, and a fixed value in tests and simulations.
    pub fn new(registry: Registry, config: Config, seed: [u8; 32]) -> Gateway {
        let projects = registry
            .names()
            .map(|n| (n.to_owned(), ProjectState::default()))
            .collect();
        let mut gateway = Gateway {
            coordination: {
                #[allow(unused_mut)]
                // A single gateway with a store keeps coordination there; a replica in the
                // cluster's engine, for the projects it holds.
                let mut c = coordination::Coordination::new(
                    config.coordination.clone(),
                    config.store_sessions || config.cluster.is_some(),
                    config.cluster.is_some(),
                );
                #[cfg(feature = "planted-bugs")]
                if config.planted == Some(PlantedBug::CoordAckBeforeDurable) {
                    c.ack_before_durable();
                }
                c
            },
            cluster: config.cluster.as_ref().map(|c| {
                #[allow(unused_mut)]
                let mut replica = crate::replica::Replica::new(c);
                replica.load_coordination();
                #[cfg(feature = "planted-bugs")]
                replica.plant(config.planted);
                replica
            }),
            again: VecDeque::new(),
            records: (config.cluster.is_some() || config.store_sessions)
                .then(crate::records::Records::default),
            gathers: crate::gather::Gathers::default(),
            tasks: {
                let cluster = config.cluster.as_ref().and_then(|c| c.task_keys.clone());
                let single = config.task_key.clone().map(|k| (k, None));
                let (current, previous) = cluster.or(single).unwrap_or_else(|| {
                    // No secret: a key from the seed, good for this process's life.
                    use hmac::{Hmac, Mac};
                    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&seed)
                        .expect("HMAC takes any key length");
                    mac.update(b"mcp-gateway process task key");
                    (
                        crate::tasks::TaskKey::new([0; 4], mac.finalize().into_bytes().into()),
                        None,
                    )
                });
                crate::tasks::Tasks::new(current, previous)
            },
            remote_tools: BTreeMap::new(),
            own_waiters: BTreeMap::new(),
            wall_origin: None,
            registry,
            config,
            sessions: Sessions::new(seed),
            gateway_listing: tools::gateway_tool_definitions().join(","),
            gateway_tools: tools::gateway_tool_definitions(),
            modern_listing: None,
            projects,
            uplinks: HashMap::new(),
            calls: calls::Calls::default(),
            get_streams: HashMap::new(),
            post_streams: BTreeSet::new(),
            next_event: 0,
            sweep_armed: false,
            subscriptions: std::collections::BTreeMap::new(),
            listens: std::collections::BTreeMap::new(),
            next_server_request: 0,
            retries: mrtr::Retries::default(),
            listing_holds: listing_holds::ListingHolds::default(),
            timers: BTreeSet::new(),
            outputs: VecDeque::new(),
            shutting_down: false,
            handing_over: false,
            retiring: BTreeSet::new(),
            counters: Counters::default(),
            call_metrics: crate::metrics::CallMetrics::default(),
            pins: crate::identity::Pins::default(),
            pins_save_at: None,
            pins_under_previous: BTreeSet::new(),
            rng: {
                use rand_chacha::rand_core::SeedableRng;
                let mut rng = rand_chacha::ChaCha20Rng::from_seed(seed);
                // Session ids use stream 0 of the same seed.
                rng.set_stream(1);
                rng
            },
            probes_armed: false,
            next_probe: 0,
            probes: HashMap::new(),
            fanouts: HashMap::new(),
            fanout_by_token: HashMap::new(),
            next_fanout: 0,
            #[cfg(feature = "planted-bugs")]
            shared_active: None,
        };
        if gateway.cluster.is_some() {
            // A replica's own tasks, kept in the engine by its last life, are read back.
            gateway
                .outputs
                .push_back(Output::Cluster(crate::cluster::ClusterAction::LoadCoord {
                    project: crate::tasks::GATEWAY_PROJECT.to_owned(),
                }));
        }
        gateway
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    #[cfg(test)]
    pub(crate) fn config_mut(&mut self) -> &mut Config {
        &mut self.config
    }

    /// Sleds' requests relayed to clients and not yet answered.
    #[cfg(test)]
    pub(crate) fn sled_requests_waiting(&self) -> usize {
        self.calls.asked_len()
    }

    pub fn stats(&self) -> Stats {
        Stats {
            sessions: self.sessions.len(),
            live_uplinks: self
                .projects
                .values()
                .filter(|p| p.uplink.is_some())
                .count(),
            pending_calls: self.calls.waiting(),
            calls_forwarded: self.counters.calls_forwarded,
            calls_timed_out: self.counters.calls_timed_out,
            responses_dropped_late: self.counters.responses_dropped_late,
            responses_dropped_unknown: self.counters.responses_dropped_unknown,
            frames_invalid: self.counters.frames_invalid,
            frames_unreadable_at_sled: self.counters.frames_unreadable_at_sled,
            input_required: self.counters.input_required,
            parked_calls: self.retries.len(),
            calls_cancelled: self.counters.calls_cancelled,
            sessions_expired: self.counters.sessions_expired,
            open_streams: self.get_streams.len() + self.post_streams.len() + self.listens.len(),
            sessions_evicted: self.counters.sessions_evicted,
            sessions_refused: self.counters.sessions_refused,
            calls_refused: self.counters.calls_refused,
        }
    }

    /// Coordination's counters and gauges.
    pub fn coordination_stats(&self) -> crate::coord::CoordStats {
        self.coordination.stats()
    }

    /// Everything the core counts, for a metrics endpoint.
    pub fn metrics(&self) -> crate::Metrics {
        let mut m = self
            .call_metrics
            .snapshot(self.stats(), self.coordination.stats());
        m.cluster = self
            .cluster
            .as_ref()
            .map(|c| crate::cluster::ClusterCounts {
                sessions_loaded: self.records.as_ref().map_or(0, |r| r.sessions_loaded()),
                ..c.counts()
            });
        m
    }

    /// The default project of a session, or `None` when the session is unknown or has none.
    pub fn session_default(&self, session: &str) -> Option<&str> {
        self.sessions.get(session)?.default_project.as_deref()
    }

    /// Arms the probe round at the first event (the core has no clock of its own: its time is
    /// what each event carries, passed down as an argument).
    fn see_time(&mut self, now: Instant) {
        if self.wall_origin.is_none() {
            self.wall_origin = Some((now, self.config.wall_clock_ms.unwrap_or(0)));
        }
        self.arm_probes(now);
    }

    /// Takes one event in.
    pub fn handle(&mut self, now: Instant, input: Input) {
        self.see_time(now);
        match input {
            Input::Http { token, request } => self.on_http(now, token, request),
            Input::HttpAborted { token } => self.on_http_aborted(now, token),
            Input::UplinkOpened { uplink } => self.on_uplink_opened(now, uplink),
            Input::UplinkText { uplink, text } => self.on_uplink_text(now, uplink, &text),
            Input::UplinkBinary { uplink, len } => self.on_uplink_binary(now, uplink, len),
            Input::UplinkClosed { uplink } => {
                self.drop_uplink(now, uplink, UplinkLoss::Closed, None);
            }
            Input::Shutdown => self.on_shutdown(now),
            Input::Handover => self.on_handover(now),
            Input::Reload { registry } => {
                self.on_reload(now, registry);
                self.end_revoked_sessions(now);
            }
            Input::ProbeDone { probe, outcome } => self.on_probe_done(now, probe, outcome),
            Input::Cluster(event) => self.on_cluster(now, event),
        }
        self.settle(now);
    }

    /// Fires every timer due at `now` (pass the current time, not the deadline).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.see_time(now);
        loop {
            // The due timers and the call table's deadlines, earliest first (a request's
            // deadline first at the same instant).
            let own = self.timers.first().copied().filter(|&(at, _)| at <= now);
            let call = self.calls.poll_timeout().filter(|&at| at <= now);
            let timer = match (own, call) {
                (None, None) => break,
                (Some((at, timer)), call) if call.is_none_or(|c| c > at) => timer,
                _ => {
                    if let Some((id, uplink, pending)) = self.calls.take_expired(now) {
                        self.on_request_deadline(now, (id, uplink), pending);
                    }
                    continue;
                }
            };
            self.timers.pop_first();
            match timer {
                Timer::Uplink(uplink) => self.on_uplink_timer(now, uplink),
                Timer::SessionSweep => self.on_session_sweep(now),
                Timer::ProbeRound => self.on_probe_round(now),
                Timer::Probe(probe) => self.on_probe_deadline(now, probe),
                Timer::Fanout(fanout) => self.on_fanout_deadline(now, fanout),
                Timer::SavePins => {
                    self.pins_save_at = None;
                    self.save_pins_now();
                }
            }
        }
        if self.coordination.poll_timeout().is_some_and(|at| at <= now) {
            self.coordination_timeout(now);
        }
        self.cluster_timeout(now);
        self.listing_holds_timeout(now);
        if self.tasks.poll_timeout().is_some_and(|at| at <= now) {
            self.tasks.handle_timeout(now);
        }
        self.settle(now);
    }

    /// The next decision to carry out, if any.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// After every input: what the replica machine asked of the gateway is carried out, and
    /// the requests released meanwhile are handled again, until nothing is left.
    fn settle(&mut self, now: Instant) {
        loop {
            if let Some(event) = self.replica_event() {
                self.on_replica_event(now, event);
            } else if let Some((token, request)) = self.again.pop_front() {
                self.on_http(now, token, request);
            } else {
                // Changes that came with no call (a session's end, a sled's fence floor).
                self.flush_coordination(now);
                // Waits the coordination state woke or expired during this event's steps
                // (each of its calls looks at the time first), answered now rather than at
                // the next timer.
                self.drain_woken(now);
                self.close_retired(now);
                return;
            }
        }
    }

    /// When [`Gateway::handle_timeout`] should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let own = self.timers.first().map(|&(at, _)| at);
        let cluster = self.cluster.as_ref().and_then(|c| c.poll_timeout());
        [
            own,
            self.gathers.poll_timeout(),
            self.calls.poll_timeout(),
            self.coordination.poll_timeout(),
            cluster,
            self.listing_holds.poll_timeout(),
            self.tasks.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}
