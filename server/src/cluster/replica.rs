//! A replica's tasks: what the core asks of the engine ([`gateway_core::cluster::ClusterAction`])
//! is carried out here, and what the engine says goes back to the driver as
//! [`gateway_core::cluster::ClusterEvent`]s. Nothing here decides; it only moves bytes.
//!
//! # Names in the engine
//!
//! With namespace `N` (default `mcpgw`) and replica `R`:
//!
//! - bucket `N_directory` (`max_age` the claim TTL): key `p.<project>` (a `.` in the project's
//!   name is written `=`), value a [`ClaimValue`];
//! - bucket `N_sessions` (`max_age` the session idle TTL): key `s.<SHA-256 of the session id>`
//!   ([`session_key`]: whoever reads the bucket learns no session id to act with), value a
//!   [`SessionRecord`];
//! - bucket `N_pins`: key `p.<project>`, value a sled identity [`gateway_core::Pin`] (made by
//!   `create` on first use, so the first replica wins; replaced by a re-pin);
//! - bucket `N_tools`: key `p.<project>`, value the JSON array of tools the project's sled
//!   listed to the replica holding it (written after every listing), for every replica's
//!   stateless `tools/list`;
//! - subject `N.news`: announcements for the streams other replicas hold (an `Announced`);
//! - subject `N.relay.R`: requests relayed to R ([`relay::Envelope`]); answers go to
//!   `N.inbox.<relaying replica>.<run>.<token>.<n>` (`n` numbers the relays).
//!
//! # Sealed
//!
//! Every value written to a bucket and every message sent on a subject is sealed under the
//! cluster secret ([`super::seal`], `gateway_core::keys`), and nothing read or heard is acted
//! on before it verifies: a value for its bucket and key, not older than one seen of the key;
//! a relay envelope or an announcement for the subject it came on, once, before its expiry;
//! an owner's reply for the envelope it answers; a streamed answer's messages for their inbox,
//! each number once and in order. The agent-handle key is derived from the secret, never kept
//! in the engine. A claim meets a value that does not verify (a forged claim over its own) by
//! writing over it, so that the holder keeps its sled. Whoever can write to NATS without the
//! secret can still delete keys (a replica then loses a claim and claims again), or put a pin
//! no replica wrote where none was (a first sled is sent away to try again): that is denial
//! of service, which NATS's own permissions guard against, not forgery.
//!
//! # Tasks
//!
//! Each holds only a weak sender of the driver's commands, so that the driver ends as before:
//! the directory watch, the sessions watch, the pins watch, the tools watch, the news
//! subscription, the engine probe (a read every second; its
//! failures and recoveries are the core's `Engine { up }`), the relay server, and the
//! executor of actions, which runs each in a task of its own (a session's writes in order, on
//! one task) and, once the driver has gone, finishes the ones in flight (the releases of a
//! shutdown among them).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use gateway_core::cluster::{
    Announcement, ClusterAction, ClusterConfig, ClusterEvent, EngineDown, PinOutcome, RelayMessage,
    RelaySent, SessionRecord,
};
use gateway_core::directory::{ClaimOutcome, ClaimValue, DirectoryConfig, EntryState};
use gateway_core::HttpToken;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::outcomes::{Outcomes, Recovered};
use super::relay::{self, Answer, Envelope, Handoff, WireRequest};
use super::seal::{self, Seal, WallClock};
use super::{BucketConfig, ChangeKind, Engine, EngineError};
use crate::driver::{Command, HttpMsg, STREAM_QUEUE};
use crate::store::records;
use crate::Ids;
use gateway_core::keys::KeyRing;

/// The default of [`ClusterOptions::claim_ttl`].
pub const DEFAULT_CLAIM_TTL: Duration = Duration::from_secs(10);

/// The default of [`ClusterOptions::move_grace`]: a sled's reconnect (sled-sim backs off up
/// to a few seconds) and a claim.
pub const DEFAULT_MOVE_GRACE: Duration = Duration::from_secs(5);

/// How many times in a row a claim is written over a directory value that does not verify.
const OVERWRITES_OF_FORGED_CLAIMS: usize = 3;

/// How far apart the replicas' wall clocks may be (NTP keeps them far closer): a coordination
/// record read by a project's next holder is taken for this much younger than its stamp says,
/// so a lease written on a machine whose clock is ahead never ends early on the next one (it
/// may last this much longer: the safe side for mutual exclusion).
pub const CLOCK_SKEW: Duration = Duration::from_secs(1);

/// How often the engine is probed.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The pauses before reading a session again when the engine could not be asked.
const SESSION_READ_RETRIES: [Duration; 2] =
    [Duration::from_millis(100), Duration::from_millis(300)];

/// How a gateway joins a cluster (see `ServerOptions::cluster`).
#[derive(Clone)]
pub struct ClusterOptions {
    pub engine: Arc<dyn Engine>,
    /// This replica's name: `[A-Za-z0-9_-]+`, unique in the cluster.
    pub replica: String,
    /// Replicas with the same namespace (`[A-Za-z0-9_-]+`) form one cluster.
    pub namespace: String,
    /// How long a claim lives without being refreshed (the directory bucket's `max_age`); a
    /// replica refreshes its claims every third of it.
    pub claim_ttl: Duration,
    /// How long a request for a project whose sled just left its replica waits for the sled
    /// to be claimed again (by any replica) before it fails `sled_not_connected`: a rolling
    /// restart moves sleds without failing calls. Zero: no waiting.
    pub move_grace: Duration,
    /// The cluster secret's keys (and the previous secret's, during a roll): everything in
    /// the engine is sealed and verified under them.
    pub keys: KeyRing,
    /// The wall clock sealed messages' expiries are read on.
    pub clock: WallClock,
    /// Test-only: a planted bug of the relay protocol's (`NoOutcomeRecovery`,
    /// `ForgetOutcomes`).
    #[cfg(feature = "planted-bugs")]
    pub planted: Option<gateway_core::PlantedBug>,
}

impl std::fmt::Debug for ClusterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterOptions")
            .field("replica", &self.replica)
            .field("namespace", &self.namespace)
            .field("claim_ttl", &self.claim_ttl)
            .field("move_grace", &self.move_grace)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl ClusterOptions {
    pub fn new(
        engine: Arc<dyn Engine>,
        replica: impl Into<String>,
        keys: KeyRing,
    ) -> ClusterOptions {
        ClusterOptions {
            engine,
            replica: replica.into(),
            namespace: "mcpgw".into(),
            claim_ttl: DEFAULT_CLAIM_TTL,
            move_grace: DEFAULT_MOVE_GRACE,
            keys,
            clock: seal::system_clock(),
            #[cfg(feature = "planted-bugs")]
            planted: None,
        }
    }

    /// Whether a relay lost with the engine is asked after (`NoOutcomeRecovery` plants not).
    fn recovers_outcomes(&self) -> bool {
        #[cfg(feature = "planted-bugs")]
        if self.planted == Some(gateway_core::PlantedBug::NoOutcomeRecovery) {
            return false;
        }
        true
    }

    /// Whether the relays served here are recorded (`ForgetOutcomes` plants not, and neither
    /// does `ForgetNonces`: the records, which refuse a relay taken before, are nonces kept).
    fn keeps_outcomes(&self) -> bool {
        #[cfg(feature = "planted-bugs")]
        if matches!(
            self.planted,
            Some(gateway_core::PlantedBug::ForgetOutcomes | gateway_core::PlantedBug::ForgetNonces)
        ) {
            return false;
        }
        true
    }

    /// The core's side of these options, with the cluster's keys for agent handles (derived
    /// from the cluster secret).
    pub fn core_config(&self) -> ClusterConfig {
        let (agent_key, previous_agent_key) = self.keys.agent_keys();
        let task_keys = Some(self.keys.task_keys());
        ClusterConfig {
            replica: self.replica.clone(),
            directory: DirectoryConfig::new(self.claim_ttl),
            move_grace: self.move_grace,
            agent_key: Some(agent_key),
            previous_agent_key,
            task_keys,
        }
    }

    fn directory(&self) -> String {
        format!("{}_directory", self.namespace)
    }

    fn sessions(&self) -> String {
        format!("{}_sessions", self.namespace)
    }

    fn pins(&self) -> String {
        format!("{}_pins", self.namespace)
    }

    /// The coordination records of the projects the replicas hold (issue 25).
    fn coordination(&self) -> String {
        format!("{}_coordination", self.namespace)
    }

    fn relay_subject(&self, replica: &str) -> String {
        format!("{}.relay.{replica}", self.namespace)
    }

    fn tools(&self) -> String {
        format!("{}_tools", self.namespace)
    }

    /// Where replicas announce news for the streams the others hold.
    fn changes_subject(&self) -> String {
        format!("{}.news", self.namespace)
    }
}

/// An announcement on the changes subject ([`ClusterAction::Announce`]), with the replica
/// that made it (which skips its own).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Announced {
    from: String,
    news: Announcement,
}

/// Where the streamed answers of this replica's relays go: one subject per relay under it.
fn inbox_prefix(opts: &ClusterOptions, run: &str) -> String {
    format!("{}.inbox.{}.{run}", opts.namespace, opts.replica)
}

/// A replica name made of a host name: every character outside `[A-Za-z0-9_-]` becomes `-`,
/// and `-` at either end goes; `None` when nothing is left.
pub fn name_from_host(host: &str) -> Option<String> {
    let name: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_matches('-');
    (!name.is_empty()).then(|| name.to_owned())
}

/// The key of a project in the directory bucket.
pub fn project_key(project: &str) -> String {
    format!("p.{}", project.replace('.', "="))
}

/// The key of a session's record in the sessions bucket: a hash of its id, so that the id, which
/// is what a client presents to act in the session, is never written to the engine. A replica
/// knows the ids of the sessions it has made or read ([`SessionNames`]), which is all it needs
/// to follow their records.
pub fn session_key(session: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"mcp-gateway v1 session key\0");
    h.update(session.as_bytes());
    let digest = h.finalize();
    format!("s.{}", hex::encode(digest))
}

/// The ids of the sessions this replica made or read, by their key in the engine: the sessions
/// watch tells the driver of changes to these only (the driver knows no other session). An
/// entry goes when its record is deleted or expires.
#[derive(Debug, Default)]
struct SessionNames(Mutex<HashMap<String, String>>);

impl SessionNames {
    /// The engine's key of `session`, remembered.
    fn key_of(&self, session: &str) -> String {
        let key = session_key(session);
        self.0
            .lock()
            .expect("not poisoned")
            .insert(key.clone(), session.to_owned());
        key
    }

    fn session(&self, key: &str) -> Option<String> {
        self.0.lock().expect("not poisoned").get(key).cloned()
    }

    fn forget(&self, key: &str) {
        self.0.lock().expect("not poisoned").remove(key);
    }
}

/// The project of a directory key, `None` for a key that is not one.
pub fn key_project(key: &str) -> Option<String> {
    key.strip_prefix("p.").map(|p| p.replace('=', "."))
}

/// The driver's handle on the replica's tasks.
#[derive(Debug)]
pub(crate) struct ClusterIo {
    actions: mpsc::UnboundedSender<ClusterAction>,
}

impl ClusterIo {
    /// Hands an action over. Unbounded: each action answers an event the driver took in (a
    /// request it holds, a sled's hello, a change of a session), so they are bounded by those.
    pub(crate) fn act(&self, action: ClusterAction) {
        if self.actions.send(action).is_err() {
            tracing::error!("the cluster executor is gone; an action was dropped");
        }
    }
}

/// The replica's running tasks: the executor (awaited at shutdown) and the rest (aborted).
pub(crate) struct Running {
    pub(crate) executor: tokio::task::JoinHandle<()>,
    pub(crate) others: Vec<tokio::task::JoinHandle<()>>,
    /// The directory as it stood at the start, one entry per project that has one: for the
    /// driver before any request (see [`read_directory`]).
    pub(crate) directory: Vec<ClusterEvent>,
}

/// Makes the buckets, subscribes to the relay subject and starts the tasks. Fails when the
/// engine cannot be reached or a name breaks the rules: a replica must not serve without it.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn start(
    opts: &ClusterOptions,
    seal: Arc<Seal>,
    session_ttl: Duration,
    run: String,
    commands: mpsc::WeakSender<Command>,
    ids: Arc<Ids>,
    (draining, counters): (Arc<AtomicBool>, Arc<crate::fleet::ServerCounters>),
    projects: Vec<String>,
) -> Result<(ClusterIo, Running), EngineError> {
    super::check_bucket(&opts.replica)
        .map_err(|_| EngineError::Invalid(format!("replica name {:?}", opts.replica)))?;
    super::check_bucket(&opts.namespace)
        .map_err(|_| EngineError::Invalid(format!("cluster namespace {:?}", opts.namespace)))?;
    let engine = opts.engine.clone();
    engine
        .ensure_bucket(BucketConfig::with_max_age(opts.directory(), opts.claim_ttl))
        .await?;
    engine
        .ensure_bucket(BucketConfig::with_max_age(opts.sessions(), session_ttl))
        .await?;
    engine.ensure_bucket(BucketConfig::new(opts.pins())).await?;
    engine
        .ensure_bucket(BucketConfig::new(opts.coordination()))
        .await?;
    engine
        .ensure_bucket(BucketConfig::new(opts.tools()))
        .await?;
    let relays_in = engine.subscribe(&opts.relay_subject(&opts.replica)).await?;
    let changes = engine.subscribe(&opts.changes_subject()).await?;
    // One subscription for the streamed answers of every relay this replica makes.
    let inbox_messages = engine
        .subscribe(&format!("{}.>", inbox_prefix(opts, &run)))
        .await?;
    let inboxes: Inboxes = Arc::default();
    let names: Arc<SessionNames> = Arc::default();
    let directory = engine.watch(&opts.directory(), "p.>").await?;
    let now = read_directory(
        engine.as_ref(),
        &bucket_of(&seal, opts.directory(), Some(opts.claim_ttl)),
        projects,
    )
    .await;
    let sessions = engine.watch(&opts.sessions(), ">").await?;
    let pins = engine.watch(&opts.pins(), "p.>").await?;
    let tools = engine.watch(&opts.tools(), "p.>").await?;
    let opts = Arc::new(opts.clone());
    let (tx, rx) = mpsc::unbounded_channel();
    let claim_ttl = opts.claim_ttl;
    let bucket = |name: String, max_age| bucket_of(&seal, name, max_age);
    let others = vec![
        tokio::spawn(watch_directory(
            directory,
            bucket(opts.directory(), Some(claim_ttl)),
            commands.clone(),
        )),
        tokio::spawn(watch_sessions(
            sessions,
            bucket(opts.sessions(), Some(session_ttl)),
            names.clone(),
            commands.clone(),
        )),
        tokio::spawn(watch_pins(
            pins,
            bucket(opts.pins(), None),
            commands.clone(),
        )),
        tokio::spawn(watch_tools(
            tools,
            bucket(opts.tools(), None),
            commands.clone(),
        )),
        tokio::spawn(follow_changes(
            changes,
            seal.clone(),
            opts.clone(),
            commands.clone(),
        )),
        tokio::spawn(route_inboxes(inbox_messages, inboxes.clone())),
        tokio::spawn(probe(opts.clone(), commands.clone())),
        tokio::spawn(serve_relays(
            opts.clone(),
            seal.clone(),
            relays_in,
            commands.clone(),
            ids,
            draining,
        )),
    ];
    let executor = tokio::spawn(execute(
        opts,
        seal,
        session_ttl,
        run,
        rx,
        commands,
        (inboxes, names, counters),
    ));
    let running = Running {
        executor,
        others,
        directory: now,
    };
    Ok((ClusterIo { actions: tx }, running))
}

fn bucket_of(seal: &Arc<Seal>, name: String, max_age: Option<Duration>) -> Bucket {
    Bucket {
        seal: seal.clone(),
        name,
        max_age,
    }
}

/// Each project's directory entry as it stands (read after the watch is made, so the watch
/// tells every later change). A replica that has just started learns from the watch only a
/// moment after the driver starts; a request taken before that found no holder anywhere and
/// was answered `sled_not_connected` though the project was held elsewhere (seen in a rolling
/// restart under `wrk -c16`: 4 calls of 135,184). The driver takes these before any request.
/// A read that fails is left to the watch.
async fn read_directory(
    engine: &dyn Engine,
    bucket: &Bucket,
    projects: Vec<String>,
) -> Vec<ClusterEvent> {
    let reads = projects.into_iter().map(|project| {
        let read = engine.get(&bucket.name, &project_key(&project));
        async move { (project, read.await) }
    });
    let mut events = Vec::new();
    for (project, read) in futures_util::future::join_all(reads).await {
        match read {
            Ok(Some(entry)) => {
                let change = super::Change {
                    key: entry.key,
                    revision: entry.revision,
                    kind: ChangeKind::Put(entry.value),
                };
                events.extend(entry_event(bucket, change));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(project, error = %e, "reading the directory at the start; the watch will tell")
            }
        }
    }
    events
}

/// The event a change of the directory is, `None` for a key that names no project or a value
/// no replica wrote.
fn entry_event(bucket: &Bucket, change: super::Change) -> Option<ClusterEvent> {
    let project = key_project(&change.key)?;
    let state = match change.kind {
        ChangeKind::Put(value) => match ClaimValue::parse(&bucket.open(&change.key, &value)?) {
            Ok(v) => EntryState::Claimed(v),
            Err(e) => {
                tracing::warn!(project, error = %e, "an unreadable claim in the directory");
                EntryState::Unreadable
            }
        },
        ChangeKind::Deleted => EntryState::Deleted,
        ChangeKind::Expired => EntryState::Expired,
    };
    Some(ClusterEvent::Entry {
        project,
        revision: change.revision,
        state,
    })
}

/// Sends an event to the driver; `false` when the driver is gone.
async fn tell(commands: &mpsc::WeakSender<Command>, event: ClusterEvent) -> bool {
    match commands.upgrade() {
        Some(tx) => tx.send(Command::Cluster(event)).await.is_ok(),
        None => false,
    }
}

/// One of the replica's buckets, as its values are sealed and verified.
struct Bucket {
    seal: Arc<Seal>,
    /// The bucket's name in the engine.
    name: String,
    /// How long its values live when not written again, if they expire.
    max_age: Option<Duration>,
}

impl Bucket {
    /// The payload of a value read from `key`, if it verifies (else counted, logged once).
    fn open(&self, key: &str, value: &[u8]) -> Option<Bytes> {
        let source = self
            .name
            .rsplit_once('_')
            .map_or("bucket", |(_, kind)| match kind {
                "directory" => "directory",
                "sessions" => "sessions",
                "pins" => "pins",
                "tools" => "tools",
                "coordination" => "coordination",
                _ => "bucket",
            });
        self.seal
            .open_value(source, &self.name, key, value, self.max_age)
    }

    fn seal(&self, key: &str, payload: &[u8]) -> Bytes {
        self.seal.seal_value(&self.name, key, payload)
    }
}

async fn watch_directory(
    mut watch: super::Watch,
    bucket: Bucket,
    commands: mpsc::WeakSender<Command>,
) {
    while let Some(change) = watch.next().await {
        // A value not written by a replica is ignored, as if never written.
        let Some(event) = entry_event(&bucket, change) else {
            continue;
        };
        if !tell(&commands, event).await {
            return;
        }
    }
}

async fn watch_sessions(
    mut watch: super::Watch,
    bucket: Bucket,
    names: Arc<SessionNames>,
    commands: mpsc::WeakSender<Command>,
) {
    while let Some(change) = watch.next().await {
        let Some(session) = names.session(&change.key) else {
            // A session this replica never made nor read: nothing here to change.
            continue;
        };
        let record = match change.kind {
            ChangeKind::Put(value) => {
                let Some(value) = bucket.open(&change.key, &value) else {
                    continue;
                };
                match SessionRecord::parse(&value) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        tracing::warn!(error = %e, "an unreadable session record; ignored");
                        continue;
                    }
                }
            }
            ChangeKind::Deleted | ChangeKind::Expired => {
                names.forget(&change.key);
                None
            }
        };
        let event = ClusterEvent::SessionChanged { session, record };
        if !tell(&commands, event).await {
            return;
        }
    }
}

async fn watch_pins(mut watch: super::Watch, bucket: Bucket, commands: mpsc::WeakSender<Command>) {
    while let Some(change) = watch.next().await {
        let Some(project) = key_project(&change.key) else {
            continue;
        };
        let mut under_previous_secret = false;
        let pin = match change.kind {
            ChangeKind::Put(value) => {
                under_previous_secret = bucket.seal.keys().under_previous(&value);
                let Some(value) = bucket.open(&change.key, &value) else {
                    continue;
                };
                match serde_json::from_slice::<gateway_core::Pin>(&value) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        tracing::warn!(project, error = %e, "an unreadable pin; ignored");
                        continue;
                    }
                }
            }
            ChangeKind::Deleted | ChangeKind::Expired => None,
        };
        if !tell(
            &commands,
            ClusterEvent::PinChanged {
                project,
                pin,
                under_previous_secret,
            },
        )
        .await
        {
            return;
        }
    }
}

async fn watch_tools(mut watch: super::Watch, bucket: Bucket, commands: mpsc::WeakSender<Command>) {
    while let Some(change) = watch.next().await {
        let Some(project) = key_project(&change.key) else {
            continue;
        };
        let mut under_previous_secret = false;
        let listing = match change.kind {
            ChangeKind::Put(value) => {
                under_previous_secret = bucket.seal.keys().under_previous(&value);
                let Some(value) = bucket.open(&change.key, &value) else {
                    continue;
                };
                match String::from_utf8(value.to_vec()) {
                    Ok(text) => Some(text),
                    Err(_) => {
                        tracing::warn!(project, "a tool listing that is not UTF-8; ignored");
                        continue;
                    }
                }
            }
            ChangeKind::Deleted | ChangeKind::Expired => None,
        };
        if !tell(
            &commands,
            ClusterEvent::ToolsChanged {
                project,
                listing,
                under_previous_secret,
            },
        )
        .await
        {
            return;
        }
    }
}

/// Other replicas' announcements, for the driver.
async fn follow_changes(
    mut changes: super::Subscription,
    seal: Arc<Seal>,
    opts: Arc<ClusterOptions>,
    commands: mpsc::WeakSender<Command>,
) {
    let (replica, subject) = (opts.replica.clone(), opts.changes_subject());
    while let Some(m) = changes.next().await {
        let Some((_, payload)) = seal.open_message("news", &subject, &m.payload, true) else {
            continue;
        };
        let a = match serde_json::from_slice::<Announced>(&payload) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "an unreadable announcement from another replica; ignored");
                continue;
            }
        };
        if a.from == replica {
            continue;
        }
        if !tell(&commands, ClusterEvent::Announced(a.news)).await {
            return;
        }
    }
}

/// Reads a key every [`PROBE_EVERY`] and reports when the engine is lost or back.
async fn probe(opts: Arc<ClusterOptions>, commands: mpsc::WeakSender<Command>) {
    let mut up = true;
    let bucket = opts.directory();
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        let now_up = match opts.engine.get(&bucket, "probe").await {
            Ok(_) => true,
            Err(EngineError::Unavailable(_) | EngineError::Timeout) => false,
            Err(e) => {
                tracing::warn!(error = %e, "probing the cluster's engine");
                true
            }
        };
        if now_up != up {
            up = now_up;
            if !tell(&commands, ClusterEvent::Engine { up }).await {
                return;
            }
        }
    }
}

/// Carries out the core's actions until the driver is gone, then finishes those in flight.
async fn execute(
    opts: Arc<ClusterOptions>,
    seal: Arc<Seal>,
    session_ttl: Duration,
    run: String,
    mut actions: mpsc::UnboundedReceiver<ClusterAction>,
    commands: mpsc::WeakSender<Command>,
    (inboxes, names, counters): (
        Inboxes,
        Arc<SessionNames>,
        Arc<crate::fleet::ServerCounters>,
    ),
) {
    let bucket = |name: String, max_age| {
        Arc::new(Bucket {
            seal: seal.clone(),
            name,
            max_age,
        })
    };
    let directory = bucket(opts.directory(), Some(opts.claim_ttl));
    let sessions = bucket(opts.sessions(), Some(session_ttl));
    let pins = bucket(opts.pins(), None);
    let tools = bucket(opts.tools(), None);
    // A relay's task ends with its request's token and the relay's number: a request sent
    // again (nobody took it, and its project's next holder is known) is a relay of its own,
    // with an inbox and an abort of its own, which the end of the first must not touch.
    let mut tasks: JoinSet<Option<(HttpToken, u64)>> = JoinSet::new();
    let mut aborts: HashMap<HttpToken, (u64, oneshot::Sender<()>)> = HashMap::new();
    let mut relays_sent: u64 = 0;
    // A session's writes go in order: one writer for all of them.
    let (stores, store_rx) = mpsc::unbounded_channel();
    tasks.spawn(store_sessions(
        opts.clone(),
        sessions.clone(),
        names.clone(),
        store_rx,
        commands.clone(),
    ));
    // Coordination records of the projects held here, batch after batch (issue 25), sealed.
    let coordination = bucket(opts.coordination(), None);
    let (coord_batches, coord_rx) = mpsc::unbounded_channel();
    {
        let sealed = coordination.clone();
        let wrap: records::Wrap = Arc::new(move |key: &str, v: &[u8]| sealed.seal(key, v));
        let store: Arc<dyn crate::store::Store> = opts.engine.clone();
        let writer = records::write_batches(
            store,
            (opts.coordination(), wrap),
            coord_rx,
            (opts.clock.clone(), counters),
            commands.clone(),
        );
        tasks.spawn(async move {
            writer.await;
            None
        });
    }
    // Tool listings and announcements too, each in the order made.
    let (ordered, ordered_rx) = mpsc::unbounded_channel();
    tasks.spawn(write_in_order(
        opts.clone(),
        tools,
        seal.clone(),
        ordered_rx,
    ));
    loop {
        let action = tokio::select! {
            a = actions.recv() => match a {
                Some(a) => a,
                None => break,
            },
            Some(done) = tasks.join_next() => {
                if let Ok(Some((token, relay))) = done {
                    if aborts.get(&token).is_some_and(|(r, _)| *r == relay) {
                        aborts.remove(&token);
                    }
                }
                continue;
            }
        };
        let (engine, commands) = (opts.engine.clone(), commands.clone());
        match action {
            ClusterAction::Claim {
                project,
                expected_revision,
                value,
            } => {
                let (bucket, key) = (opts.directory(), project_key(&project));
                let value = directory.seal(&key, value.to_json().as_bytes());
                let sealed = directory.clone();
                tasks.spawn(async move {
                    let mut written = match expected_revision {
                        None => engine.create(&bucket, &key, value.clone()).await,
                        Some(r) => engine.update(&bucket, &key, value.clone(), r).await,
                    };
                    // What beat the write may be a value no replica wrote (it does not verify
                    // under the cluster secret): no claim, as the watch ignores it. It is
                    // written over at its revision, so that a forged value cannot take a
                    // project from its holder (a few times at most; a stale read, or a value
                    // that verifies, is the conflict it says).
                    for _ in 0..OVERWRITES_OF_FORGED_CLAIMS {
                        let Err(EngineError::Conflict { current_revision }) = written else {
                            break;
                        };
                        let forged = matches!(
                            engine.get(&bucket, &key).await,
                            Ok(Some(e)) if e.revision == current_revision
                                && sealed.open(&key, &e.value).is_none()
                        );
                        if !forged {
                            break;
                        }
                        written = engine
                            .update(&bucket, &key, value.clone(), current_revision)
                            .await;
                    }
                    let outcome = match written {
                        Ok(revision) => ClaimOutcome::Won(revision),
                        Err(EngineError::Conflict { current_revision }) => {
                            ClaimOutcome::Conflict { current_revision }
                        }
                        Err(e) => {
                            tracing::warn!(project, error = %e, "claiming a project");
                            ClaimOutcome::Unavailable
                        }
                    };
                    tell(&commands, ClusterEvent::Claimed { project, outcome }).await;
                    None
                });
            }
            ClusterAction::Release { project, revision } => {
                let (bucket, key) = (opts.directory(), project_key(&project));
                tasks.spawn(async move {
                    match engine.delete(&bucket, &key, Some(revision)).await {
                        Ok(_) => tracing::info!(project, revision, "claim released"),
                        Err(e) => tracing::info!(project, error = %e, "claim not released"),
                    }
                    None
                });
            }
            ClusterAction::LoadSession { session } => {
                let (bucket, sealed) = (opts.sessions(), sessions.clone());
                let key = names.key_of(&session);
                tasks.spawn(async move {
                    // A request waits on this read: a passing hiccup of the engine (a
                    // JetStream request timing out while it settles) is tried again before
                    // the client is told to retry.
                    let mut read = engine.get(&bucket, &key).await;
                    for pause in SESSION_READ_RETRIES {
                        if read.is_ok() {
                            break;
                        }
                        tokio::time::sleep(pause).await;
                        read = engine.get(&bucket, &key).await;
                    }
                    let mut under_previous_secret = false;
                    let record = match read {
                        Ok(None) => Ok(None),
                        Ok(Some(entry)) => match sealed.open(&key, &entry.value) {
                            Some(value) => match SessionRecord::parse(&value) {
                                Ok(r) => {
                                    under_previous_secret =
                                        sealed.seal.keys().under_previous(&entry.value);
                                    Ok(Some(r))
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "an unreadable session record");
                                    Ok(None)
                                }
                            },
                            // Not written by a replica: no such session.
                            None => Ok(None),
                        },
                        Err(e) => {
                            tracing::warn!(error = %e, "reading a session from the engine");
                            Err(EngineDown)
                        }
                    };
                    let loaded = ClusterEvent::SessionLoaded {
                        session,
                        record,
                        under_previous_secret,
                    };
                    tell(&commands, loaded).await;
                    None
                });
            }
            ClusterAction::CreatePin { project, pin } => {
                let (bucket, key, sealed) = (opts.pins(), project_key(&project), pins.clone());
                tasks.spawn(async move {
                    let value =
                        sealed.seal(&key, &serde_json::to_vec(&pin).expect("a pin serialises"));
                    let outcome = match engine.create(&bucket, &key, value).await {
                        Ok(_) => PinOutcome::Created,
                        Err(EngineError::Conflict { .. }) => {
                            match engine.get(&bucket, &key).await {
                                Ok(Some(entry)) => match sealed
                                    .open(&key, &entry.value)
                                    .map(|v| serde_json::from_slice(&v))
                                {
                                    Some(Ok(existing)) => PinOutcome::Exists(existing),
                                    Some(Err(e)) => {
                                        tracing::warn!(project, error = %e, "an unreadable pin");
                                        PinOutcome::Unavailable
                                    }
                                    // Not written by a replica: the sled is sent away to try
                                    // again (counted and logged as unverified).
                                    None => PinOutcome::Unavailable,
                                },
                                // Deleted between the two: try again at the next connection.
                                Ok(None) | Err(_) => PinOutcome::Unavailable,
                            }
                        }
                        Err(e) => {
                            tracing::warn!(project, error = %e, "pinning a sled's key");
                            PinOutcome::Unavailable
                        }
                    };
                    tell(&commands, ClusterEvent::PinCreated { project, outcome }).await;
                    None
                });
            }
            ClusterAction::StorePin { project, pin } => {
                let (bucket, key) = (opts.pins(), project_key(&project));
                let value = pins.seal(&key, &serde_json::to_vec(&pin).expect("a pin serialises"));
                tasks.spawn(async move {
                    if let Err(e) = engine.put(&bucket, &key, value).await {
                        tracing::error!(project, error = %e, "a re-pin did not reach the cluster's engine; other replicas keep the old pin");
                    }
                    None
                });
            }
            ClusterAction::StoreSession { session, record } => {
                let _ = stores.send((session, record));
            }
            ClusterAction::Relay {
                token,
                replica,
                request,
                timeout,
            } => {
                let (abort_tx, abort_rx) = oneshot::channel();
                relays_sent += 1;
                let number = relays_sent;
                aborts.insert(token, (number, abort_tx));
                let relay = RelayOut {
                    token,
                    to: opts.relay_subject(&replica),
                    inbox: format!("{}.{}.{number}", inbox_prefix(&opts, &run), token.0),
                    request: WireRequest::from_request(*request),
                    timeout,
                    recover: opts.recovers_outcomes(),
                };
                let (inboxes, seal) = (inboxes.clone(), seal.clone());
                tasks.spawn(async move {
                    relay_out(engine, seal, commands, relay, inboxes, abort_rx).await;
                    Some((token, number))
                });
            }
            ClusterAction::Announce(news) => {
                let _ = ordered.send(Ordered::Announce(news));
            }
            ClusterAction::StoreTools { project, listing } => {
                let _ = ordered.send(Ordered::Tools { project, listing });
            }
            ClusterAction::RelayAbort { token } => {
                if let Some((_, abort)) = aborts.remove(&token) {
                    let _ = abort.send(());
                }
            }
            ClusterAction::StoreCoord { batch, changes } => {
                let _ = coord_batches.send((batch, changes));
            }
            ClusterAction::LoadCoord { project } => {
                let (sealed, bucket) = (coordination.clone(), opts.coordination());
                let clock = opts.clock.clone();
                tasks.spawn(async move {
                    let prefix = gateway_core::coord::project_prefix(&project);
                    let (filter, mark) = (format!("{prefix}>"), format!("{prefix}_loaded"));
                    let unwrap: records::Unwrap =
                        Arc::new(move |key: &str, v: &[u8]| sealed.open(key, v));
                    let store: Arc<dyn crate::store::Store> = engine;
                    let read = records::load_records(
                        &store,
                        (&bucket, &filter, &mark),
                        &clock,
                        &unwrap,
                        CLOCK_SKEW,
                    )
                    .await;
                    let records = read.map_err(|e| {
                        tracing::warn!(project, error = %e, "reading a project's coordination state");
                        EngineDown
                    });
                    tell(&commands, ClusterEvent::CoordLoaded { project, records }).await;
                    None
                });
            }
        }
    }
    drop((stores, ordered, coord_batches));
    // The driver is gone: what is in flight (a shutdown's releases) finishes.
    for (_, (_, abort)) in aborts.drain() {
        let _ = abort.send(());
    }
    while tasks.join_next().await.is_some() {}
}

async fn store_sessions(
    opts: Arc<ClusterOptions>,
    sealed: Arc<Bucket>,
    names: Arc<SessionNames>,
    mut stores: mpsc::UnboundedReceiver<(String, Option<SessionRecord>)>,
    commands: mpsc::WeakSender<Command>,
) -> Option<(HttpToken, u64)> {
    let bucket = opts.sessions();
    while let Some((session, record)) = stores.recv().await {
        let key = names.key_of(&session);
        let written = match &record {
            Some(r) => opts
                .engine
                .put(&bucket, &key, sealed.seal(&key, r.to_json().as_bytes()))
                .await
                .map(drop),
            None => opts.engine.delete(&bucket, &key, None).await.map(drop),
        };
        if let Err(e) = &written {
            tracing::warn!(error = %e, "writing a session to the engine");
        }
        let written = written.is_ok();
        tell(&commands, ClusterEvent::SessionStored { session, written }).await;
    }
    None
}

/// A write carried out in the order it was made.
enum Ordered {
    Tools { project: String, listing: String },
    Announce(Announcement),
}

async fn write_in_order(
    opts: Arc<ClusterOptions>,
    sealed: Arc<Bucket>,
    seal: Arc<Seal>,
    mut writes: mpsc::UnboundedReceiver<Ordered>,
) -> Option<(HttpToken, u64)> {
    let (tools, subject) = (opts.tools(), opts.changes_subject());
    while let Some(write) = writes.recv().await {
        match write {
            Ordered::Tools { project, listing } => {
                let key = project_key(&project);
                let value = sealed.seal(&key, listing.as_bytes());
                if let Err(e) = opts.engine.put(&tools, &key, value).await {
                    tracing::warn!(project, error = %e, "writing a project's tool listing to the engine; the other replicas list its old tools");
                }
            }
            Ordered::Announce(news) => {
                let payload = Announced {
                    from: opts.replica.clone(),
                    news,
                };
                let payload = seal.seal_message(
                    &subject,
                    &serde_json::to_vec(&payload).expect("an announcement serialises"),
                );
                if let Err(e) = opts.engine.publish(&subject, payload).await {
                    tracing::warn!(error = %e, "announcing news to the other replicas");
                }
            }
        }
    }
    None
}

/// The relay tasks waiting for streamed answers, by their inbox (one per relay).
type Inboxes = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Bytes>>>>;

/// Hands each message on this replica's inboxes to the relay task of its inbox.
async fn route_inboxes(mut incoming: super::Subscription, inboxes: Inboxes) {
    while let Some(m) = incoming.next().await {
        let tx = inboxes
            .lock()
            .expect("not poisoned")
            .get(m.subject.as_str())
            .cloned();
        match tx {
            Some(tx) => {
                let _ = tx.send(m.payload);
            }
            None => tracing::debug!(subject = m.subject, "a message for a relay that is over"),
        }
    }
}

/// One relay out: what it sends and where its answer goes.
struct RelayOut {
    token: HttpToken,
    to: String,
    inbox: String,
    request: WireRequest,
    timeout: Duration,
    /// Whether a relay lost with the engine is asked after ([`recover`]).
    recover: bool,
}

/// What a relay that got no answer ended as.
enum Heard {
    /// The engine request's end.
    Reply(Result<Bytes, EngineError>),
    /// The owner said nothing for [`relay::SILENT_AFTER`]; the request may still be answered.
    Silent(BoxFuture<'static, Result<Bytes, EngineError>>),
}

/// What [`recover`] learned of a lost relay.
enum Recovery {
    /// The owner's answer: the request's own late reply, or the one it recorded.
    Handoff { handoff: Handoff, late_reply: bool },
    /// Never taken, and refused if it comes late: it may be sent again.
    Unseen,
    /// Nobody can say.
    Unknown,
    /// The client went away meanwhile.
    Aborted,
}

/// The context an owner's reply is sealed for: the envelope it answers.
fn handoff_context(to: &str, nonce: &[u8; 16]) -> String {
    format!("{to} handoff {}", hex::encode(nonce))
}

/// The messages of one relay's inbox as they are verified: sealed for this inbox, each number
/// once and in order (a message heard again, or an old one put back, is dropped).
struct InboxReader {
    seal: Arc<Seal>,
    inbox: String,
    last: u64,
}

impl InboxReader {
    fn read(&mut self, payload: &[u8]) -> Option<Answer> {
        let (nonce, payload) = self
            .seal
            .open_message("inbox", &self.inbox, payload, false)?;
        let n = seal::sequence_of(&nonce);
        if n <= self.last {
            tracing::debug!(
                inbox = self.inbox,
                n,
                "a streamed answer's message heard again; dropped"
            );
            return None;
        }
        self.last = n;
        match serde_json::from_slice::<Answer>(&payload) {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::warn!(error = %e, "an unreadable message of a streamed relay; ignored");
                None
            }
        }
    }
}

/// Relays one request to the replica at `to` and its answer back to the driver.
async fn relay_out(
    engine: Arc<dyn Engine>,
    seal: Arc<Seal>,
    commands: mpsc::WeakSender<Command>,
    relay: RelayOut,
    inboxes: Inboxes,
    mut abort: oneshot::Receiver<()>,
) {
    let RelayOut {
        token,
        to,
        inbox,
        request,
        timeout,
        recover: recovers,
    } = relay;
    let deadline = tokio::time::Instant::now() + timeout + relay::RELAY_MARGIN;
    let failed = |sent| ClusterEvent::RelayFailed { token, sent };
    // Registered before the request goes, so no streamed message can come first.
    let (tx, mut streamed) = mpsc::unbounded_channel();
    inboxes
        .lock()
        .expect("not poisoned")
        .insert(inbox.clone(), tx);
    let envelope = Envelope::Request {
        inbox: inbox.clone(),
        request: Box::new(request),
    };
    let nonce: [u8; 16] = rand::random();
    let sealed_ms = seal.now_ms();
    let payload = seal.seal_message_with(
        &to,
        nonce,
        &serde_json::to_vec(&envelope).expect("an envelope serialises"),
    );
    let abort_at_owner = |engine: Arc<dyn Engine>, to: String, inbox: String| {
        let payload = seal.seal_message(
            &to,
            &serde_json::to_vec(&Envelope::Abort { inbox }).expect("an envelope serialises"),
        );
        async move {
            if let Err(e) = engine.publish(&to, payload).await {
                tracing::debug!(error = %e, "telling the owner of an abort");
            }
        }
    };
    let mut reader = InboxReader {
        seal: seal.clone(),
        inbox: inbox.clone(),
        last: 0,
    };
    // While the call runs, the owner says `alive` on the inbox every second: silence for
    // SILENT_AFTER means it is gone. Only what verifies counts as the owner's word.
    let mut request = engine.request(&to, payload, timeout + relay::RELAY_MARGIN);
    // A stream's first events may overtake the handoff (they come on another subscription):
    // kept for the stream, in order.
    let mut early: Vec<Answer> = Vec::new();
    let mut silent_at = tokio::time::Instant::now() + relay::SILENT_AFTER;
    let heard = loop {
        tokio::select! {
            h = &mut request => break Heard::Reply(h),
            _ = &mut abort => {
                abort_at_owner(engine.clone(), to, inbox.clone()).await;
                inboxes.lock().expect("not poisoned").remove(&inbox);
                return;
            }
            heard = tokio::time::timeout_at(silent_at, streamed.recv()) => match heard {
                Ok(Some(payload)) => {
                    if let Some(answer) = reader.read(&payload) {
                        silent_at = tokio::time::Instant::now() + relay::SILENT_AFTER;
                        if answer != Answer::Alive {
                            early.push(answer);
                        }
                    }
                }
                Ok(None) | Err(_) => {
                    tracing::warn!(to, "the owner of a relayed request fell silent");
                    break Heard::Silent(request);
                }
            }
        }
    };
    let context = handoff_context(&to, &nonce);
    let open = |b: Bytes| {
        seal.open_message("handoff", &context, &b, false)
            .ok_or_else(|| "a reply that did not verify under the cluster secret".to_owned())
            .and_then(|(_, b)| serde_json::from_slice::<Handoff>(&b).map_err(|e| e.to_string()))
    };
    let handoff = match heard {
        Heard::Reply(Ok(b)) => open(b).map(|handoff| Recovery::Handoff {
            handoff,
            late_reply: false,
        }),
        Heard::Reply(Err(EngineError::NoResponders(_))) => {
            inboxes.lock().expect("not poisoned").remove(&inbox);
            tell(&commands, failed(RelaySent::NotSent)).await;
            return;
        }
        // The engine was out of reach: nothing was sent (the contract of `Engine::request`).
        Heard::Reply(Err(EngineError::Unavailable(e))) => {
            tracing::info!(to, error = %e, "the engine is out of reach: the relay was not sent");
            inboxes.lock().expect("not poisoned").remove(&inbox);
            tell(&commands, failed(RelaySent::EngineDown)).await;
            return;
        }
        Heard::Reply(Err(e)) if !recovers => Err(e.to_string()),
        Heard::Silent(_) if !recovers => Err("the owner fell silent".into()),
        Heard::Reply(Err(e)) => {
            tracing::warn!(to, error = %e, "a relay lost in flight: asking its owner what became of it");
            let at = (to.as_str(), nonce, sealed_ms);
            recover(&engine, &seal, at, None, deadline, &mut abort).await
        }
        // The request may have reached the owner, and its answer is not here: it is asked.
        Heard::Silent(late) => {
            let at = (to.as_str(), nonce, sealed_ms);
            recover(&engine, &seal, at, Some(late), deadline, &mut abort).await
        }
    };
    let event = match handoff {
        Ok(Recovery::Handoff {
            handoff,
            late_reply,
        }) => match handoff {
            Handoff::Answered {
                status,
                headers,
                body,
            } => ClusterEvent::Relayed {
                token,
                message: RelayMessage::Reply(relay::reply_of(status, headers, body)),
            },
            // A stream whose owner fell silent may have lost events meanwhile: unknown.
            Handoff::Streaming if late_reply => failed(RelaySent::Unknown),
            Handoff::Streaming => {
                let open = ClusterEvent::Relayed {
                    token,
                    message: RelayMessage::Open,
                };
                if tell(&commands, open).await {
                    stream_in(
                        &engine,
                        &seal,
                        &commands,
                        token,
                        (&to, &inbox),
                        early,
                        &mut reader,
                        &mut streamed,
                        &mut abort,
                    )
                    .await;
                }
                inboxes.lock().expect("not poisoned").remove(&inbox);
                return;
            }
            Handoff::Refused { reason } => {
                tracing::info!(to, reason, "the owner did not take a relayed request");
                failed(RelaySent::NotSent)
            }
            Handoff::Lost => failed(RelaySent::Unknown),
        },
        // Never taken, and it never will be: the core sends it again once the engine is back.
        Ok(Recovery::Unseen) => failed(RelaySent::EngineDown),
        Ok(Recovery::Unknown) => failed(RelaySent::Unknown),
        Ok(Recovery::Aborted) => {
            abort_at_owner(engine.clone(), to, inbox.clone()).await;
            inboxes.lock().expect("not poisoned").remove(&inbox);
            return;
        }
        Err(e) => {
            tracing::warn!(to, error = %e, "a relay got no readable answer");
            failed(RelaySent::Unknown)
        }
    };
    inboxes.lock().expect("not poisoned").remove(&inbox);
    tell(&commands, event).await;
}

/// Asks the owner at `to` what became of the relay whose envelope had `nonce` (sealed at
/// `sealed_ms`), every [`relay::RECOVER_EVERY`] until `deadline`, while listening for the
/// request's own late reply (`late`, when it may still come): the answer it gave, `unseen`,
/// or unknown when the owner is gone for good ([`relay::RECOVER_NO_RESPONDERS`] questions in a
/// row taken by nobody), says so, or the deadline passes. `Err` for a reply that does not
/// read.
async fn recover(
    engine: &Arc<dyn Engine>,
    seal: &Seal,
    (to, nonce, sealed_ms): (&str, [u8; 16], u64),
    mut late: Option<BoxFuture<'static, Result<Bytes, EngineError>>>,
    deadline: tokio::time::Instant,
    abort: &mut oneshot::Receiver<()>,
) -> Result<Recovery, String> {
    let question = serde_json::to_vec(&Envelope::Outcome {
        nonce: relay::nonce_hex(&nonce),
        sealed_ms,
    })
    .expect("an envelope serialises");
    let mut nobody = 0;
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            tracing::warn!(to, "a lost relay's owner could not say what became of it");
            return Ok(Recovery::Unknown);
        }
        let asked: [u8; 16] = rand::random();
        let ask = engine.request(
            to,
            seal.seal_message_with(to, asked, &question),
            relay::RECOVER_ASK.min(deadline - now),
        );
        let wait_late = async {
            match late.as_mut() {
                Some(f) => f.await,
                None => std::future::pending().await,
            }
        };
        let answer = tokio::select! {
            a = ask => a,
            _ = &mut *abort => return Ok(Recovery::Aborted),
            reply = wait_late => match reply {
                Ok(b) => {
                    let context = handoff_context(to, &nonce);
                    return seal
                        .open_message("handoff", &context, &b, false)
                        .ok_or_else(|| "a reply that did not verify under the cluster secret".to_owned())
                        .and_then(|(_, b)| serde_json::from_slice::<Handoff>(&b).map_err(|e| e.to_string()))
                        .map(|handoff| Recovery::Handoff { handoff, late_reply: true });
                }
                // The request's own wait is over; the questions go on.
                Err(_) => {
                    late = None;
                    continue;
                }
            },
        };
        match answer {
            Ok(b) => {
                let context = handoff_context(to, &asked);
                let said = seal
                    .open_message("handoff", &context, &b, false)
                    .and_then(|(_, b)| serde_json::from_slice::<Recovered>(&b).ok());
                nobody = 0;
                match said {
                    Some(Recovered::Done { handoff }) => {
                        return Ok(Recovery::Handoff {
                            handoff,
                            late_reply: true,
                        })
                    }
                    Some(Recovered::Unseen) => return Ok(Recovery::Unseen),
                    Some(Recovered::Lost) => return Ok(Recovery::Unknown),
                    Some(Recovered::Running) => {}
                    None => {
                        tracing::warn!(to, "an unreadable answer about a lost relay; asked again")
                    }
                }
            }
            Err(EngineError::NoResponders(_)) => {
                nobody += 1;
                if nobody >= relay::RECOVER_NO_RESPONDERS {
                    tracing::warn!(to, "a lost relay's owner is gone: its outcome is unknown");
                    return Ok(Recovery::Unknown);
                }
            }
            // Still out of reach, or no answer yet: asked again.
            Err(_) => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(relay::RECOVER_EVERY) => {}
            _ = &mut *abort => return Ok(Recovery::Aborted),
        }
    }
}

/// The events of a streamed answer, until its close, the owner's silence, or an abort.
#[allow(clippy::too_many_arguments)]
async fn stream_in(
    engine: &Arc<dyn Engine>,
    seal: &Seal,
    commands: &mpsc::WeakSender<Command>,
    token: HttpToken,
    (to, inbox): (&str, &str),
    early: Vec<Answer>,
    reader: &mut InboxReader,
    streamed: &mut mpsc::UnboundedReceiver<Bytes>,
    abort: &mut oneshot::Receiver<()>,
) {
    for answer in early {
        if !stream_message(commands, token, answer).await {
            return;
        }
    }
    let mut silent_at = tokio::time::Instant::now() + relay::SILENT_AFTER;
    loop {
        let next = tokio::select! {
            next = tokio::time::timeout_at(silent_at, streamed.recv()) => next,
            _ = &mut *abort => {
                let abort = Envelope::Abort { inbox: inbox.to_owned() };
                let payload = seal.seal_message(
                    to,
                    &serde_json::to_vec(&abort).expect("an envelope serialises"),
                );
                if let Err(e) = engine.publish(to, payload).await {
                    tracing::debug!(error = %e, "telling the owner of an abort");
                }
                return;
            }
        };
        let payload = match next {
            Ok(Some(p)) => p,
            Ok(None) | Err(_) => {
                tracing::warn!(to, "the owner of a streamed relay fell silent");
                tell(
                    commands,
                    ClusterEvent::RelayFailed {
                        token,
                        sent: RelaySent::Unknown,
                    },
                )
                .await;
                return;
            }
        };
        let Some(answer) = reader.read(&payload) else {
            continue;
        };
        silent_at = tokio::time::Instant::now() + relay::SILENT_AFTER;
        if !stream_message(commands, token, answer).await {
            return;
        }
    }
}

/// Passes one verified message of a streamed relay to the driver; `false` when the stream is
/// over (closed, or the driver gone).
async fn stream_message(
    commands: &mpsc::WeakSender<Command>,
    token: HttpToken,
    answer: Answer,
) -> bool {
    let (message, last) = match answer {
        Answer::Alive => return true,
        Answer::Event { id, data } => (RelayMessage::Event { id, data }, false),
        Answer::Close => (RelayMessage::Close, true),
    };
    tell(commands, ClusterEvent::Relayed { token, message }).await && !last
}

/// Serves the requests other replicas relay here: each becomes an HTTP request of the driver's,
/// whose answer is the engine request's reply (and, for a stream, messages on its inbox). An
/// envelope that does not verify for this replica's relay subject, or was heard before, is
/// dropped unanswered. What became of each relay taken is recorded ([`Outcomes`]), and told to
/// the relaying replica that asks.
async fn serve_relays(
    opts: Arc<ClusterOptions>,
    seal: Arc<Seal>,
    mut incoming: super::Subscription,
    commands: mpsc::WeakSender<Command>,
    ids: Arc<Ids>,
    draining: Arc<AtomicBool>,
) {
    let subject = opts.relay_subject(&opts.replica);
    // The relays being served, by inbox: an abort names its inbox.
    let serving: Arc<Mutex<HashMap<String, HttpToken>>> = Arc::default();
    let outcomes = Arc::new(Mutex::new(Outcomes::new(seal.started_ms())));
    let keeps = opts.keeps_outcomes();
    let publish = |to: String, payload: Bytes| {
        let engine = opts.engine.clone();
        async move {
            if let Err(e) = engine.publish(&to, payload).await {
                tracing::debug!(error = %e, "answering a relay envelope");
            }
        }
    };
    while let Some(message) = incoming.next().await {
        // Gone once the driver is: from then on every relay is refused (see below).
        let tx = commands.upgrade();
        let Some((nonce, payload)) = seal.open_message("relay", &subject, &message.payload, true)
        else {
            continue;
        };
        let handoff_to = handoff_context(&subject, &nonce);
        let envelope = serde_json::from_slice::<Envelope>(&payload).map_err(|e| e.to_string());
        let now_ms = seal.now_ms();
        let refused = match envelope {
            Err(reason) => {
                tracing::warn!(reason, "an unreadable relayed request; refused");
                reason
            }
            Ok(Envelope::Abort { inbox }) => {
                let token = serving.lock().expect("not poisoned").remove(&inbox);
                if let (Some(token), Some(tx)) = (token, &tx) {
                    let _ = tx.send(Command::HttpAborted { token }).await;
                }
                continue;
            }
            // Answered even while shutting down: the relaying replica's client waits on it.
            Ok(Envelope::Outcome {
                nonce: asked,
                sealed_ms,
            }) => {
                let said = match relay::nonce_of_hex(&asked) {
                    None => {
                        tracing::warn!("a question about a relay that names no nonce; dropped");
                        continue;
                    }
                    Some(_) if !keeps => Recovered::Unseen,
                    Some(asked) => outcomes
                        .lock()
                        .expect("not poisoned")
                        .handle_query(now_ms, asked, sealed_ms),
                };
                if let Some(reply) = message.reply {
                    let payload = seal.seal_message(
                        &handoff_to,
                        &serde_json::to_vec(&said).expect("an outcome serialises"),
                    );
                    publish(reply, payload).await;
                }
                continue;
            }
            Ok(Envelope::Request { inbox, request }) => match request.into_request() {
                Err(reason) => {
                    tracing::warn!(reason, "an unreadable relayed request; refused");
                    reason
                }
                // Shutting down: the relaying replica holds the request for the project's
                // next holder (its sled is about to move), rather than have it refused here.
                // Said even after the driver has stopped: a relay dropped unanswered would
                // end `unknown`.
                Ok(_) if draining.load(Ordering::Relaxed) || tx.is_none() => {
                    "this replica is shutting down".into()
                }
                Ok(request) => {
                    let Some(tx) = tx else { continue };
                    let Some(reply_to) = message.reply else {
                        tracing::warn!("a relayed request with nowhere to answer; dropped");
                        continue;
                    };
                    // Asked about before it came: the relaying replica was told it never
                    // came, and may have sent it again.
                    if keeps
                        && !outcomes
                            .lock()
                            .expect("not poisoned")
                            .handle_taken(now_ms, nonce)
                    {
                        tracing::info!(
                            "a relayed request that came after it was given up; refused"
                        );
                        continue;
                    }
                    let token = ids.next_http();
                    let (reply_tx, reply_rx) = mpsc::channel(STREAM_QUEUE);
                    serving
                        .lock()
                        .expect("not poisoned")
                        .insert(inbox.clone(), token);
                    let command = Command::Http {
                        token,
                        request: Box::new(request),
                        reply: reply_tx,
                    };
                    if tx.send(command).await.is_err() {
                        return;
                    }
                    tokio::spawn(answer_relay(
                        opts.engine.clone(),
                        seal.clone(),
                        (reply_to, handoff_to),
                        inbox,
                        reply_rx,
                        serving.clone(),
                        keeps.then(|| (outcomes.clone(), nonce)),
                    ));
                    continue;
                }
            },
        };
        let handoff = Handoff::Refused { reason: refused };
        let sealed = seal.seal_message(
            &handoff_to,
            &serde_json::to_vec(&handoff).expect("a handoff serialises"),
        );
        if keeps {
            let mut outcomes = outcomes.lock().expect("not poisoned");
            if outcomes.handle_taken(now_ms, nonce) {
                outcomes.handle_answered(now_ms, nonce, handoff);
            }
        }
        if let Some(reply) = message.reply {
            publish(reply, sealed).await;
        }
    }
}

/// Sends the driver's answer to a relayed request: a whole answer as the request's reply; a
/// stream's opening as the reply, then its events on the inbox, with `alive`s while it is open.
/// The reply is sealed for the envelope it answers, and each message on the inbox for the
/// inbox with its number.
async fn answer_relay(
    engine: Arc<dyn Engine>,
    seal: Arc<Seal>,
    (reply_to, handoff_to): (String, String),
    inbox: String,
    mut replies: mpsc::Receiver<HttpMsg>,
    serving: Arc<Mutex<HashMap<String, HttpToken>>>,
    outcome: Option<(Arc<Mutex<Outcomes>>, [u8; 16])>,
) {
    let publish = |subject: String, payload: Bytes| {
        let engine = engine.clone();
        async move {
            if let Err(e) = engine.publish(&subject, payload).await {
                tracing::warn!(error = %e, "answering a relayed request");
            }
        }
    };
    let mut sent = 0u64;
    let mut on_inbox = |answer: &Answer| {
        sent += 1;
        seal.seal_message_with(
            &inbox,
            seal::sequence_nonce(sent),
            &serde_json::to_vec(answer).expect("an answer serialises"),
        )
    };
    // While the call runs, `alive` on the inbox every second.
    let first = loop {
        match tokio::time::timeout(relay::ALIVE_EVERY, replies.recv()).await {
            Ok(first) => break first,
            Err(_) => {
                let alive = on_inbox(&Answer::Alive);
                publish(inbox.clone(), alive).await;
            }
        }
    };
    let handoff = match first {
        Some(HttpMsg::Reply(reply)) => Handoff::answered(reply),
        Some(HttpMsg::Open) => Handoff::Streaming,
        // The driver dropped it (shutdown), or a stream message came first (never): lost.
        Some(HttpMsg::Event { .. } | HttpMsg::Close) | None => Handoff::Lost,
    };
    let streaming = handoff == Handoff::Streaming;
    let sealed = seal.seal_message(
        &handoff_to,
        &serde_json::to_vec(&handoff).expect("a handoff serialises"),
    );
    // Recorded before it is sent: a relaying replica that loses the reply asks for it.
    if let Some((outcomes, nonce)) = &outcome {
        let now_ms = seal.now_ms();
        outcomes
            .lock()
            .expect("not poisoned")
            .handle_answered(now_ms, *nonce, handoff);
    }
    publish(reply_to, sealed).await;
    if !streaming {
        serving.lock().expect("not poisoned").remove(&inbox);
        return;
    }
    loop {
        let msg = match tokio::time::timeout(relay::ALIVE_EVERY, replies.recv()).await {
            Err(_) => Answer::Alive,
            // The driver dropped it: the relaying replica hears silence.
            Ok(None) | Ok(Some(HttpMsg::Reply(_) | HttpMsg::Open)) => break,
            Ok(Some(HttpMsg::Event { id, data })) => Answer::Event { id, data },
            Ok(Some(HttpMsg::Close)) => Answer::Close,
        };
        let last = msg == Answer::Close;
        let payload = on_inbox(&msg);
        publish(inbox.clone(), payload).await;
        if last {
            break;
        }
    }
    serving.lock().expect("not poisoned").remove(&inbox);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_make_replica_names() {
        assert_eq!(name_from_host("gw1").as_deref(), Some("gw1"));
        assert_eq!(
            name_from_host("gw-1.example.com").as_deref(),
            Some("gw-1-example-com")
        );
        assert_eq!(name_from_host("höst_2.").as_deref(), Some("h-st_2"));
        assert_eq!(name_from_host(""), None);
        assert_eq!(name_from_host("..."), None);
        for host in ["gw1", "gw-1.example.com", "höst_2."] {
            super::super::check_bucket(&name_from_host(host).unwrap()).unwrap();
        }
    }

    #[test]
    fn project_names_make_keys_and_come_back() {
        for name in ["alpha", "a.b.c", "x_y-z", "v1.2"] {
            let key = project_key(name);
            super::super::check_key(&key).unwrap();
            assert_eq!(key_project(&key).as_deref(), Some(name));
        }
        assert_eq!(key_project("probe"), None);
    }
}
