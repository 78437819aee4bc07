//! Coordination between agent sessions that share projects: presence, leases with fences,
//! messages, a board and waiters. A sans-IO state machine, owned by the caller by `&mut`.
//!
//! Every call that takes `now` first runs every timer due at `now` (the same work as
//! [`Coord::handle_timeout`]), so what a call sees is never stale and correctness never
//! depends on the driver's sweep; the sweep ([`Coord::poll_timeout`],
//! [`Coord::handle_timeout`]) only makes expiry visible without a call (wakes, lost leases).
//! Time is only ever the caller's `now`; unguessable handles ([`WaitToken`]) come from the
//! caller.
//!
//! # Choices
//!
//! - **Presence.** Every coordination call by an agent on a project (`checkin`, `claim`,
//!   `renew`, `release`, `send`, `inbox`, `board_set`, `board_delete`, `wait`) *touches* it
//!   there: the agent becomes present (name unknown until a `checkin`) for its presence TTL
//!   (the last one it checked in with, else the default). Reads without an agent (`roster`,
//!   `claims`, `board_get`, …), `unread`, `take_lost` and `check_write` (the gateway's own
//!   check on a write) touch nothing. `checkin` with `name`/`task` `None` keeps the previous
//!   ones; `Some("")` as the task clears it. Presence ending does not end leases: only their
//!   own TTL does. An agent absent (no presence, no lease, no waiter) for
//!   [`Limits::forget_after`] is forgotten there: its cursors and unreported lost leases go,
//!   and if it returns it starts as a newcomer (direct messages to it that are still live are
//!   kept, since read ones are deleted when read).
//! - **Leases.** `renew` with `ttl: None` renews for the lease's own TTL; `claim` with
//!   `ttl: None` (also a re-entrant one) takes the default. `max_leases_per_agent` counts an
//!   agent's leases over all projects. `NoLease { expired: true }` means the agent's own last
//!   lease on that resource ended by expiry (a forced release gives `expired: false`; the
//!   lost-lease report says which). `force_release` of a resource nobody holds is `NoLease`.
//! - **Messages.** One cursor per (agent, project) over the project's message ids. A direct
//!   message counts against its recipient's `max_inbox` unread; the channel holds at most
//!   `max_inbox` live messages (a channel send beyond is `InboxFull`, it does not wait for the
//!   slowest reader). A project holds at most `max_messages_per_project` live messages, so
//!   mail to agents that never come is bounded. A read deletes the direct messages it passed;
//!   channel messages live to their TTL. `Inbox::unread` is what is still unread after the
//!   call (with `peek`, that includes the page). `inbox` with `limit: 0` returns nothing and
//!   commits nothing. `checkin` returns the first [`CHECKIN_PAGE`] messages (with `more`).
//! - **Board.** Values are stored as given (the gateway has parsed the JSON). A set replaces
//!   the whole entry, TTL included: a set without TTL makes the key live until deleted.
//! - **Waits.** `wait` touches every named project (at most [`MAX_WAIT_PROJECTS`]), clamps
//!   the deadline to `now + max_wait` (reported in [`WaitStart::Parked`]), and if the deadline
//!   is already past answers at once as a timeout. The first named project (in the order
//!   given) with something pending is the one reported; others stay pending (the next `wait`
//!   returns them at once). A wake is evaluated per waiter when something happens: if an
//!   agent has two waiters, the reports consumed by the first (lost leases, released notices,
//!   sled events) are not repeated to the second, which stays parked unless something else
//!   concerns it, so an empty `reasons` always means a timeout. Wakes are evaluated at the
//!   end of each timer pass (every call starts with one) and in `poll_woken`, so what happens
//!   at one instant (several leases expiring together) comes out as one wake. At most
//!   [`MAX_MESSAGE_REASONS`] message reasons (the oldest unread) are listed. Every parked
//!   token comes out of [`Coord::poll_woken`] exactly once, unless [`Coord::cancel_wait`]
//!   or [`Coord::end_agent`] (which returns them) removed it first.
//! - **Sled events.** `sled_event` truncates `kind` to `max_name_len` and `story` to
//!   `max_task_bytes` bytes; an agent sees events numbered after it first touched the
//!   project, as far back as the ring (256) goes.
//! - **Bounds on reports.** At most [`MAX_PENDING`] unreported lost leases and released
//!   notices are kept per agent and project (the gateway drains lost leases on every
//!   result, so these bounds are a defence, not a working limit); beyond, the oldest lost
//!   report goes and new released notices are not kept.
//! - **Fence floor.** A sled's hello reports the highest fence it has accepted; the counter
//!   jumps above it. Leases granted before the project's first report (a restarted gateway's
//!   agents claiming before the sled redials) with a fence not above it are given fresh fences
//!   above it then: their holders could not have written yet, and otherwise a fence the sled
//!   accepted from an older lease would be reissued and their writes refused as stale.
//! - **Counters.** Fences, message ids, board revisions and sled event numbers are per
//!   project and never reused. One that would pass `u64::MAX` (only a fence floor reported
//!   near it can get there) is refused with [`CoordError::Exhausted`], never wrapped.

mod board;
mod leases;
mod messages;
mod persist;
mod presence;
mod wait;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

pub use persist::{project_prefix, RecordChange, Restored, StoredRecord};

/// An agent: a session id or an agent handle. Opaque.
pub type AgentId = String;

/// The caller's handle for one `wait` call, echoed back by [`Coord::poll_woken`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WaitToken(pub u64);

/// The most messages `checkin` returns (the rest are left unread, with `more`).
pub const CHECKIN_PAGE: usize = 100;
/// The most projects one `wait` may name.
pub const MAX_WAIT_PROJECTS: usize = 64;
/// The most message reasons in one [`WaitReady`].
pub const MAX_MESSAGE_REASONS: usize = 32;
/// The most unreported lost leases, and released notices, kept per agent and project.
pub const MAX_PENDING: usize = 1024;
/// The sled events kept per project.
pub const EVENT_RING: usize = 256;

/// Bounds and TTLs. `*_ttl` is the default when a call gives none, `*_ttl_max` the most
/// granted; a longer TTL is clamped, and the answer says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub presence_ttl: Duration,
    pub presence_ttl_max: Duration,
    /// Seen within this long: [`PresenceStatus::Active`]; older: `Stale`.
    pub active_window: Duration,
    pub lease_ttl: Duration,
    pub lease_ttl_max: Duration,
    pub message_ttl: Duration,
    pub message_ttl_max: Duration,
    /// Board keys live until deleted unless given a TTL, at most this.
    pub board_ttl_max: Duration,
    pub max_leases_per_agent: usize,
    /// Live leases per project.
    pub max_resources_per_project: usize,
    /// Unread direct messages per recipient and project; live channel messages per project.
    pub max_inbox: usize,
    pub max_messages_per_project: usize,
    pub max_message_bytes: usize,
    pub max_board_value_bytes: usize,
    pub max_board_keys: usize,
    pub max_waiters: usize,
    pub max_wait: Duration,
    pub max_name_len: usize,
    pub max_task_bytes: usize,
    pub max_agents_per_project: usize,
    pub max_projects: usize,
    pub forget_after: Duration,
    /// Test-only: a known coordination bug to plant, so the coordination simulation can show
    /// that it catches it (`core/src/tests/coordination_sim.rs`).
    #[cfg(feature = "planted-bugs")]
    pub planted: Option<CoordBug>,
}

/// Coordination bugs planted on purpose (feature `planted-bugs`), each a plausible slip the
/// coordination simulation must catch.
#[cfg(feature = "planted-bugs")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordBug {
    /// `<=` for `<`: at the instant a lease expires its holder still holds it (its renew
    /// succeeds, its write is fenced) while another agent's claim also succeeds.
    LeaseExpiryInclusive,
    /// A release gives its fence back: the next grant reuses it.
    FenceReusedAfterRelease,
    /// The lost wakeup: `wait` looks, then registers, and what was committed in between (here:
    /// what is already pending) does not wake it.
    WaitLooksThenRegisters,
    /// `release` checks only that a live lease exists, not who holds it: anyone's release
    /// ends another agent's lease (caught by `coord_planted_release_by_anyone_is_caught`).
    ReleaseByAnyone,
    /// The gateway leaves a client's own `_meta` fence on a write it does not fence itself
    /// (instead of stripping it), so a fence the client chose reaches the sled (caught by
    /// `coord_planted_client_fence_trusted_is_caught`).
    ClientFenceTrusted,
    /// A call that names several leasable resources (a lease spot inside an array) is checked
    /// for the first only: a write to another agent's resource goes through beside a free one
    /// (caught by `coord_planted_first_resource_only_is_caught`).
    FirstResourceOnly,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            presence_ttl: Duration::from_secs(120),
            presence_ttl_max: Duration::from_secs(3600),
            active_window: Duration::from_secs(60),
            lease_ttl: Duration::from_secs(300),
            lease_ttl_max: Duration::from_secs(3600),
            message_ttl: Duration::from_secs(3600),
            message_ttl_max: Duration::from_secs(86400),
            board_ttl_max: Duration::from_secs(7 * 86400),
            max_leases_per_agent: 64,
            max_resources_per_project: 10_000,
            max_inbox: 1_000,
            max_messages_per_project: 100_000,
            max_message_bytes: 16 * 1024,
            max_board_value_bytes: 64 * 1024,
            max_board_keys: 10_000,
            max_waiters: 20_000,
            max_wait: Duration::from_secs(25),
            max_name_len: 256,
            max_task_bytes: 1024,
            max_agents_per_project: 20_000,
            max_projects: 4096,
            forget_after: Duration::from_secs(3600),
            #[cfg(feature = "planted-bugs")]
            planted: None,
        }
    }
}

/// Which bound refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordLimit {
    LeasesPerAgent,
    LeasesPerProject,
    BoardKeys,
    AgentsPerProject,
    Projects,
    MessagesPerProject,
    WaitProjects,
    /// Agent handles issued to callers without a session (the gateway's bound).
    Handles,
}

impl CoordLimit {
    /// The limit's stable name, as errors and metrics carry it.
    pub fn name(self) -> &'static str {
        match self {
            CoordLimit::LeasesPerAgent => "leases_per_agent",
            CoordLimit::LeasesPerProject => "leases_per_project",
            CoordLimit::BoardKeys => "board_keys",
            CoordLimit::AgentsPerProject => "agents_per_project",
            CoordLimit::Projects => "projects",
            CoordLimit::MessagesPerProject => "messages_per_project",
            CoordLimit::WaitProjects => "wait_projects",
            CoordLimit::Handles => "agent_handles",
        }
    }
}

/// Why a coordination call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoordError {
    #[error("bad {what} name: {reason}")]
    BadName {
        what: &'static str,
        reason: &'static str,
    },
    #[error("bad {what} ttl: it must be more than zero")]
    BadTtl { what: &'static str },
    #[error(
        "`{resource}` is not held by the caller ({})",
        holder.as_deref().map_or_else(|| "nobody holds it".to_owned(), |h| format!("{h} holds it"))
    )]
    NotHolder {
        resource: String,
        holder: Option<AgentId>,
    },
    #[error("no lease on `{resource}`{}", if *.expired { " (it expired)" } else { "" })]
    NoLease { resource: String, expired: bool },
    #[error(
        "board key `{key}` is {}, not at the revision given",
        current.map_or_else(|| "absent".to_owned(), |r| format!("at revision {r}"))
    )]
    RevisionMismatch { key: String, current: Option<u64> },
    #[error("no board key `{key}`")]
    NoKey { key: String },
    #[error("limit reached: {} (at most {max})", which.name())]
    Limit { which: CoordLimit, max: usize },
    #[error("{what} too large: {got} bytes, at most {max_bytes}")]
    TooLarge {
        what: &'static str,
        max_bytes: usize,
        got: usize,
    },
    #[error("the inbox of {} is full ({max} unread)", match to { Recipient::Agent(a) => a.as_str(), Recipient::Channel => "the channel" })]
    InboxFull { to: Recipient, max: usize },
    #[error("too many parked waiters (at most {max})")]
    TooManyWaiters { max: usize },
    #[error("wait token {0:?} is already parked")]
    DuplicateToken(WaitToken),
    #[error("{what} counter exhausted")]
    Exhausted { what: &'static str },
}

// ---------------------------------------------------------------------------------------------
// Answers.

/// Why a lease ended other than by its holder's release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LostReason {
    Expired,
    ForcedRelease,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostLease {
    pub project: String,
    pub resource: String,
    pub fence: u64,
    pub reason: LostReason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub resource: String,
    pub holder: AgentId,
    pub holder_name: Option<String>,
    pub fence: u64,
    pub expires_in: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    Acquired {
        fence: u64,
        expires_in: Duration,
        reentrant: bool,
        ttl_clamped: Option<Duration>,
    },
    Held {
        holder: AgentId,
        holder_name: Option<String>,
        expires_in: Duration,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewed {
    pub fence: u64,
    pub expires_in: Duration,
    pub ttl_clamped: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub fence: u64,
}

/// A lease ended by [`Coord::end_agent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasedLease {
    pub project: String,
    pub resource: String,
    pub fence: u64,
}

/// What [`Coord::end_agent`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ended {
    pub released: Vec<ReleasedLease>,
    /// The agent's parked waits, removed: they will not come out of `poll_woken`.
    pub cancelled_waits: Vec<WaitToken>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteCheck {
    Fenced {
        fence: u64,
    },
    Refused {
        holder: AgentId,
        holder_name: Option<String>,
        expires_in: Duration,
    },
    Unfenced,
    LeaseRequired,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Recipient {
    Agent(AgentId),
    Channel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageTo {
    Agent,
    Channel,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub id: u64,
    pub expires_in: Duration,
    pub ttl_clamped: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: u64,
    pub from: AgentId,
    pub from_name: Option<String>,
    pub to: MessageTo,
    pub body: String,
    pub sent_ago: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inbox {
    pub messages: Vec<Message>,
    /// More unread messages past this page.
    pub more: bool,
    /// Unread after this call.
    pub unread: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresenceStatus {
    Active,
    Stale,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RosterEntry {
    pub agent: AgentId,
    pub name: Option<String>,
    pub task: Option<String>,
    pub last_seen_ago: Duration,
    pub status: PresenceStatus,
    pub held: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkin {
    pub expires_in: Duration,
    pub ttl_clamped: Option<Duration>,
    /// Every lease the agent holds in the project, renewed.
    pub renewed: Vec<LeaseView>,
    /// Lost leases in this project not yet reported (now reported).
    pub lost: Vec<LostLease>,
    /// The first unread messages, now read.
    pub inbox: Inbox,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoardSet {
    pub revision: u64,
    pub ttl_clamped: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoardEntry {
    pub key: String,
    pub value: String,
    pub revision: u64,
    pub set_by: AgentId,
    pub expires_in: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitReason {
    Message {
        id: u64,
        from: AgentId,
        to: MessageTo,
    },
    LeaseLost {
        resource: String,
        fence: u64,
        reason: LostReason,
    },
    Released {
        resource: String,
    },
    SledEvent {
        seq: u64,
        kind: String,
        story: Option<String>,
    },
}

/// What ended a wait: `project` and non-empty `reasons`, or `None` and `[]` at the deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitReady {
    pub project: Option<String>,
    pub reasons: Vec<WaitReason>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitStart {
    Ready(WaitReady),
    /// Registered; it comes out of `poll_woken` by `deadline` (the clamped one).
    Parked {
        deadline: Instant,
    },
}

/// Counters since start, and gauges.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CoordStats {
    pub claims_acquired: u64,
    pub claims_reentrant: u64,
    pub claims_conflict: u64,
    pub renewals: u64,
    pub releases: u64,
    pub expiries: u64,
    pub forced: u64,
    pub messages_sent: u64,
    pub messages_refused: u64,
    pub board_sets: u64,
    pub board_cas_failures: u64,
    pub board_deletes: u64,
    pub waits_ready_at_once: u64,
    pub waits_parked: u64,
    pub waits_woken: u64,
    pub waits_timed_out: u64,
    pub refused_by_limit: u64,
    pub live_leases: usize,
    pub present_agents: usize,
    pub parked_waiters: usize,
    /// Records handed out for the store and not deleted since (with [`Coord::persist`]).
    pub records_kept: usize,
}

// ---------------------------------------------------------------------------------------------
// State.

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Presence { project: String, agent: AgentId },
    Lease { project: String, resource: String },
    Message { project: String, id: u64 },
    Board { project: String, key: String },
    Forget { project: String, agent: AgentId },
    // Last, so that at one instant whatever else is due wakes a waiter before its deadline
    // (its firing flushes the wakes of what fired before it).
    Wait(WaitToken),
}

/// Every pending expiry, by instant. Kept exactly in step with the state: whoever changes an
/// `expires_at` moves its entry with [`retime`].
type Timers = BTreeSet<(Instant, Timer)>;

fn retime(timers: &mut Timers, old: Option<Instant>, new: Option<Instant>, timer: Timer) {
    if let Some(old) = old {
        timers.remove(&(old, timer.clone()));
    }
    if let Some(new) = new {
        timers.insert((new, timer));
    }
}

#[derive(Debug)]
struct Lease {
    holder: AgentId,
    fence: u64,
    ttl: Duration,
    expires_at: Instant,
}

#[derive(Debug)]
struct StoredMessage {
    from: AgentId,
    from_name: Option<String>,
    to: Recipient,
    body: String,
    sent_at: Instant,
    expires_at: Instant,
}

#[derive(Debug)]
struct StoredEntry {
    value: String,
    revision: u64,
    set_by: AgentId,
    expires_at: Option<Instant>,
}

#[derive(Debug)]
struct SledEvent {
    seq: u64,
    kind: String,
    story: Option<String>,
}

/// One agent in one project.
#[derive(Debug)]
struct Member {
    name: Option<String>,
    task: Option<String>,
    presence_ttl: Duration,
    last_seen: Instant,
    /// `None` once presence expired.
    present_until: Option<Instant>,
    forget_at: Option<Instant>,
    /// The message counter when it first appeared: channel messages after it are its.
    joined: u64,
    /// The last message id read.
    cursor: u64,
    /// The last sled event reported.
    event_cursor: u64,
    held: BTreeSet<String>,
    lost: VecDeque<LostLease>,
    /// Resources it was refused on that are still held by someone.
    refused_on: BTreeSet<String>,
    /// Resources it was refused on that have since been released: notices for `wait`.
    released: BTreeSet<String>,
    /// Resources whose lease, held by it, last ended by expiry (for `NoLease::expired`).
    expired: VecDeque<String>,
}

#[derive(Debug, Default)]
struct Project {
    fence: u64,
    /// Whether a sled has reported its fence high-water mark ([`Coord::raise_fence_floor`]).
    floor_known: bool,
    leases: BTreeMap<String, Lease>,
    /// Per resource, the agents refused on it while it is held.
    refused: BTreeMap<String, BTreeSet<AgentId>>,
    msg_seq: u64,
    messages: BTreeMap<u64, StoredMessage>,
    channel: BTreeSet<u64>,
    /// Per recipient, its unread direct messages (read ones are deleted).
    direct: BTreeMap<AgentId, BTreeSet<u64>>,
    board_rev: u64,
    board: BTreeMap<String, StoredEntry>,
    event_seq: u64,
    events: VecDeque<SledEvent>,
    members: BTreeMap<AgentId, Member>,
    /// The entries changed since the last [`Coord::take_changes`] (`None`: not kept).
    dirty: Option<BTreeSet<persist::Which>>,
}

#[derive(Debug)]
struct Waiter {
    agent: AgentId,
    projects: Vec<String>,
    deadline: Instant,
}

/// The coordination state of every project. See the module docs.
#[derive(Debug)]
pub struct Coord {
    limits: Limits,
    projects: BTreeMap<String, Project>,
    /// Per agent, the projects where it is a member.
    agents: BTreeMap<AgentId, BTreeSet<String>>,
    waiters: BTreeMap<WaitToken, Waiter>,
    waiters_by_agent: BTreeMap<AgentId, BTreeSet<WaitToken>>,
    waiters_by_project: BTreeMap<String, BTreeSet<WaitToken>>,
    woken: VecDeque<(WaitToken, WaitReady)>,
    /// Agents that hear of what concerns them without waiting (sessions with an event stream).
    watched: BTreeSet<AgentId>,
    /// (watched agent, project) where something concerning it happened, not yet polled.
    notices: BTreeSet<(AgentId, String)>,
    /// Whom something happened to since the last wake pass: (project, agent or everyone).
    dirty: BTreeSet<(String, Option<AgentId>)>,
    timers: Timers,
    stats: CoordStats,
    /// Whether changes are tracked for the store ([`Coord::persist`]).
    persisting: bool,
    /// Projects that may have changed since the last [`Coord::take_changes`].
    changed: BTreeSet<String>,
    /// Per project, the records last handed out for writing, with their fingerprints.
    persisted: BTreeMap<String, persist::Written>,
}

/// Checks a name: non-empty, at most `max` bytes, no control characters.
fn check_name(what: &'static str, name: &str, max: usize) -> Result<(), CoordError> {
    let reason = if name.is_empty() {
        "empty"
    } else if name.len() > max {
        "too long"
    } else if name.chars().any(char::is_control) {
        "has control characters"
    } else {
        return Ok(());
    };
    Err(CoordError::BadName { what, reason })
}

/// The TTL granted for `asked`, and `Some(granted)` when it was clamped.
fn grant_ttl(
    what: &'static str,
    asked: Option<Duration>,
    default: Duration,
    max: Duration,
) -> Result<(Duration, Option<Duration>), CoordError> {
    match asked {
        None => Ok((default.min(max), None)),
        Some(t) if t.is_zero() => Err(CoordError::BadTtl { what }),
        Some(t) if t > max => Ok((max, Some(max))),
        Some(t) => Ok((t, None)),
    }
}

fn deadline(what: &'static str, now: Instant, ttl: Duration) -> Result<Instant, CoordError> {
    now.checked_add(ttl).ok_or(CoordError::BadTtl { what })
}

fn next(counter: u64, what: &'static str) -> Result<u64, CoordError> {
    counter.checked_add(1).ok_or(CoordError::Exhausted { what })
}

/// Cuts `s` to at most `max` bytes, on a character boundary.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

impl Coord {
    pub fn new(limits: Limits) -> Coord {
        Coord {
            limits,
            projects: BTreeMap::new(),
            agents: BTreeMap::new(),
            waiters: BTreeMap::new(),
            waiters_by_agent: BTreeMap::new(),
            waiters_by_project: BTreeMap::new(),
            woken: VecDeque::new(),
            watched: BTreeSet::new(),
            notices: BTreeSet::new(),
            dirty: BTreeSet::new(),
            timers: BTreeSet::new(),
            stats: CoordStats::default(),
            persisting: false,
            changed: BTreeSet::new(),
            persisted: BTreeMap::new(),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether `bug` is planted (feature `planted-bugs`).
    #[cfg(feature = "planted-bugs")]
    fn planted(&self, bug: CoordBug) -> bool {
        self.limits.planted == Some(bug)
    }

    /// The earliest instant something expires: presence, lease, message, board key, waiter.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// Runs everything due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while self.timers.first().is_some_and(|(at, _)| *at <= now) {
            let Some((_, timer)) = self.timers.pop_first() else {
                break;
            };
            self.fire(now, timer);
        }
        self.flush_wakes();
    }

    fn fire(&mut self, now: Instant, timer: Timer) {
        match timer {
            Timer::Presence { project, agent } => self.presence_expired(now, &project, &agent),
            Timer::Lease { project, resource } => {
                let expires_at = self
                    .projects
                    .get(&project)
                    .and_then(|p| p.leases.get(&resource))
                    .map(|l| l.expires_at);
                #[cfg(feature = "planted-bugs")]
                if self.planted(CoordBug::LeaseExpiryInclusive) && expires_at == Some(now) {
                    // The planted `<=`: still held at its expiry instant, gone just after.
                    let later = now + Duration::from_nanos(1);
                    self.timers
                        .insert((later, Timer::Lease { project, resource }));
                    return;
                }
                let due = expires_at.is_some_and(|at| at <= now);
                if due {
                    self.end_lease(&project, &resource, End::Lost(LostReason::Expired));
                }
            }
            Timer::Message { project, id } => {
                if let Some(p) = self.projects.get_mut(&project) {
                    p.remove_message(id);
                    self.changed(&project);
                }
            }
            Timer::Board { project, key } => {
                if let Some(p) = self.projects.get_mut(&project) {
                    if p.board
                        .get(&key)
                        .and_then(|e| e.expires_at)
                        .is_some_and(|t| t <= now)
                    {
                        p.board.remove(&key);
                        self.entry_changed(&project, persist::Which::Board(key));
                    }
                }
            }
            Timer::Forget { project, agent } => self.maybe_forget(now, &project, &agent),
            Timer::Wait(token) => {
                // What else fell due at this instant (ordered before) wakes it first.
                self.flush_wakes();
                if self.unpark(token).is_some() {
                    self.stats.waits_timed_out += 1;
                    let ready = WaitReady {
                        project: None,
                        reasons: Vec::new(),
                    };
                    self.woken.push_back((token, ready));
                }
            }
        }
    }

    /// Whether `agent` holds a live lease anywhere now.
    pub fn holds_leases(&self, now: Instant, agent: &str) -> bool {
        let Some(projects) = self.agents.get(agent) else {
            return false;
        };
        projects.iter().any(|p| {
            self.projects.get(p.as_str()).is_some_and(|p| {
                p.leases
                    .values()
                    .any(|l| l.holder == agent && now < l.expires_at)
            })
        })
    }

    /// The projects where `agent` is present now, in name order.
    pub fn present_in(&self, now: Instant, agent: &str) -> Vec<String> {
        let Some(projects) = self.agents.get(agent) else {
            return Vec::new();
        };
        projects
            .iter()
            .filter(|p| {
                self.projects
                    .get(p.as_str())
                    .and_then(|p| p.members.get(agent))
                    .and_then(|m| m.present_until)
                    .is_some_and(|until| now < until)
            })
            .cloned()
            .collect()
    }

    pub fn stats(&self) -> CoordStats {
        let mut s = self.stats.clone();
        s.live_leases = self.projects.values().map(|p| p.leases.len()).sum();
        s.present_agents = self
            .projects
            .values()
            .flat_map(|p| p.members.values())
            .filter(|m| m.present_until.is_some())
            .count();
        s.parked_waiters = self.waiters.len();
        s.records_kept = self.persisted.values().map(persist::Written::len).sum();
        s
    }
}

/// How a lease ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Released,
    AgentEnded,
    Lost(LostReason),
}
