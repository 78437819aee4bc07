//! The sled side of the uplink (see `gateway_core::uplink` for the protocol): dial out to the
//! gateway, say hello, then serve JSON-RPC requests over the WebSocket until it breaks, and
//! reconnect with exponential backoff.
//!
//! An uplink serves a [`Backend`]: a [`SyncServer`] such as sled-sim's story model (answered synchronously, after
//! the latency knob), or any [`Handler`], whose requests run as tasks that may talk to the gateway
//! while they run through their [`CallContext`]: progress, notifications for the call's client
//! (log messages), and requests of their own (sampling, elicitation) whose answers come back
//! over the same uplink.
//!
//! With an identity ([`UplinkOptions::identity`]) the hello names the sled's Ed25519 public key
//! and the sled answers the gateway's `challenge` with a `proof`. Every hello reports the
//! highest fence the backend has accepted ([`Backend::fence_high_water`]), read afresh at each
//! connection attempt. Once welcomed, the uplink
//! relays the sled's CRDT events as `event` frames: a `sync` every
//! [`UplinkOptions::relay_interval`] and, for the story model, one per successful mutating
//! `tools/call` (`story_created`, `story_moved`, `story_blocked`, `test_failed`,
//! `story_updated`), numbered by one counter that survives reconnects.
//!
//! In a cluster the welcome carries an epoch: the sled keeps the highest in an
//! [`EpochFence`] (reported in each hello as `epoch_seen`), hangs up on a welcome at or below
//! it, and serves calls only while its connection's epoch is the newest, closing it with
//! [`CloseCode::Superseded`] as soon as another connection sharing the fence is welcomed with a
//! higher one (see [`crate::epoch`]).
//!
//! Only `tokio::time` is used for time and only a seeded RNG for jitter, so the same code runs
//! deterministically inside a simulation.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ed25519_dalek::SigningKey;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, SinkExt, StreamExt};
use gateway_core::identity::{encode_key, sign_challenge};
use gateway_core::uplink::{
    recover_request_id, CloseCode, Control, PROTOCOL_VERSION, RELATED_REQUEST_META,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode as WsCloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tracing::{debug, error, info, warn};

use crate::epoch::EpochFence;
use crate::net::{Connect, GatewayAddr};

/// How long connecting, the WebSocket upgrade, `hello`, the identity challenge and the wait for
/// `welcome` may take together before the attempt counts as failed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// After an `UnknownProject`, `Unauthorized` or `IdentityRefused` close the sled waits this many
/// times `backoff_max` before retrying.
pub const UNKNOWN_PROJECT_BACKOFF_FACTOR: u32 = 6;

/// How long a connection superseded by a newer one (after a move) may go on answering the
/// calls running on it before it is closed anyway.
pub const SUPERSEDED_DRAIN: Duration = Duration::from_secs(30);

/// How a sled's uplink behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UplinkOptions {
    /// How long each `tools/call` waits before the sled answers it.
    pub latency: Duration,
    /// Up to this much extra per-request delay, drawn from the seeded RNG.
    pub jitter: Duration,
    /// Seeds the RNG for latency and backoff jitter.
    pub seed: u64,
    /// The `sled` name sent in `hello`.
    pub sled_name: String,
    /// The first reconnect delay (doubling per failed attempt).
    pub backoff_min: Duration,
    /// The longest reconnect delay.
    pub backoff_max: Duration,
    /// The project's uplink token, sent in the hello when its registration requires one.
    pub token: Option<gateway_core::Secret>,
    /// The sled's identity: its public key goes in the hello and it signs the gateway's
    /// challenge. `None`: a hello without a key, and a challenge from the gateway is a protocol
    /// error (the sled hangs up and counts a failed attempt). Debug prints only the public key.
    pub identity: Option<SigningKey>,
    /// How often a welcomed uplink sends a `sync` event (the CRDT anti-entropy tick); zero
    /// sends none.
    pub relay_interval: Duration,
    /// A stalled relay: the uplink serves calls and pongs as usual but sends no `event` frame.
    pub stall_relay: bool,
    /// The certificate authorities a `wss://` gateway is verified against (default: the
    /// system's).
    pub tls: gateway_client::TlsTrust,
    /// At shutdown, how long the calls running on a connection may take to be answered before
    /// it closes; meanwhile a new request is refused at once (`sled_shutting_down`, not
    /// applied). `None`: close at once, the calls in flight left to the gateway's `uplink_lost`
    /// (outcome unknown).
    pub drain: Option<Duration>,
}

impl Default for UplinkOptions {
    fn default() -> Self {
        UplinkOptions {
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
            seed: 0,
            sled_name: "sled".to_owned(),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            token: None,
            identity: None,
            relay_interval: Duration::from_secs(5),
            stall_relay: false,
            tls: gateway_client::TlsTrust::system(),
            drain: None,
        }
    }
}

/// The sled's CRDT event relay: one sequence for every connection of one uplink.
#[derive(Clone)]
struct Relay {
    /// The last `seq` sent. Locked while an event is numbered and queued, so the frames go out
    /// in `seq` order.
    seq: Arc<Mutex<u64>>,
    stalled: bool,
    /// How many connections of this uplink were welcomed: numbers each one for
    /// [`CallContext::connection`].
    connections: Arc<Mutex<u64>>,
}

impl Relay {
    fn new(stalled: bool) -> Self {
        Relay {
            seq: Arc::default(),
            stalled,
            connections: Arc::default(),
        }
    }

    /// The number of a newly welcomed connection: 1, 2, … over the uplink's life.
    fn next_connection(&self) -> u64 {
        let mut n = self
            .connections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *n += 1;
        *n
    }

    /// Numbers an event and queues its frame (nothing when the relay is stalled).
    fn send(&self, tx: &mpsc::UnboundedSender<Message>, kind: &str, story: Option<String>) {
        if self.stalled {
            return;
        }
        let mut seq = self
            .seq
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *seq += 1;
        let event = Control::Event {
            seq: *seq,
            kind: kind.to_owned(),
            story,
        };
        let _ = tx.send(Message::text(event.to_text()));
    }
}

/// How one connection attempt ended.
enum Outcome {
    /// The shutdown future completed.
    Shutdown,
    /// The attempt failed or the connection was lost.
    Lost {
        /// Whether the gateway had welcomed this connection.
        welcomed: bool,
        /// The WebSocket close code, if the gateway closed it.
        close_code: Option<u16>,
        /// Why an attempt failed before welcome (not logged yet); `None` when the loss of a
        /// welcomed connection was already logged.
        failure: Option<String>,
    },
}

/// Aborts the task when dropped, so nothing outlives the connection it served.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An MCP server that answers the gateway's requests asynchronously and may talk to the
/// gateway while it does (see [`CallContext`]).
pub trait Handler: Send + Sync + 'static {
    /// The project it serves (named in `hello`).
    fn project_name(&self) -> &str;

    /// Handles one JSON-RPC request or notification from the gateway: resolves to the response,
    /// or `None` for a notification. Runs as a task of its own; the gateway's
    /// `notifications/cancelled` for the request aborts it.
    fn handle(self: Arc<Self>, msg: Value, ctx: CallContext) -> BoxFuture<'static, Option<Value>>;

    /// The gateway's `notifications/cancelled` (its `params`) arrived on connection
    /// `connection` (as [`CallContext::connection`] numbers them). Called for every one, whether
    /// or not it names a request still running (which is aborted); the default does nothing.
    fn cancelled(&self, _connection: u64, _params: &Value) {}

    /// The highest fence it has accepted for its project's leased resources, reported in each
    /// `hello` (`None`, the default, when it never accepted one or keeps no fences).
    fn fence_high_water(&self) -> Option<u64> {
        None
    }

    /// Notifications it sends of its own accord, not for one call (a list changed, a
    /// resource updated, progress under a token it was given): each text is sent as it is
    /// on every welcomed connection. `None`, the default: it sends none.
    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }

    /// Frames to send on each newly welcomed connection before anything else (a connector's
    /// `upstream` control frame: the state of its server now). None by default.
    fn welcome_frames(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A server that answers synchronously: an emulator, such as sled-sim's story model. Each
/// request is answered at once, or (a `tools/call`, with the latency knob
/// [`UplinkOptions::latency`] set) by a task that waits it out first.
pub trait SyncServer: Send + Sync + 'static {
    /// The project it serves (named in `hello`).
    fn project_name(&self) -> &str;

    /// Answers one JSON-RPC request (`None` for a notification).
    fn handle(&self, msg: &Value) -> Option<Value>;

    /// The highest fence it has accepted ([`Handler::fence_high_water`]).
    fn fence_high_water(&self) -> Option<u64> {
        None
    }

    /// A receiver that sees a change each time its tool list changes, if it ever does.
    fn subscribe_tools_changed(&self) -> Option<watch::Receiver<u64>> {
        None
    }

    /// Notifications it sends of its own accord ([`Handler::notices`]).
    fn subscribe_notices(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }

    /// The relay `event` a request and its (successful) response make: its kind and the
    /// resource it touched (`("story_moved", Some("beta-1"))`). None by default.
    fn event_of(&self, _msg: &Value, _resp: &Value) -> Option<(&'static str, Option<String>)> {
        None
    }

    /// The requests it answers asynchronously, as a [`Handler`] would, without the latency
    /// knob: `Some(answer)` takes `msg` off the synchronous path (a tool that runs for a while,
    /// a task-augmented call, `tasks/*`), run as a task of its own with `ctx`, aborted by the
    /// gateway's `notifications/cancelled`. None (the default) for everything.
    fn handle_async(
        &self,
        _msg: &Value,
        _ctx: &CallContext,
    ) -> Option<BoxFuture<'static, Option<Value>>> {
        None
    }
}

/// What an uplink serves.
#[derive(Clone)]
pub enum Backend {
    /// A synchronous server (an emulator): answered after the latency knob.
    Sync(Arc<dyn SyncServer>),
    /// A handler whose calls can send progress, notifications and requests mid-call.
    Handler(Arc<dyn Handler>),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Sync(s) => f.debug_tuple("Sync").field(&s.project_name()).finish(),
            Backend::Handler(h) => f.debug_tuple("Handler").field(&h.project_name()).finish(),
        }
    }
}

impl Backend {
    /// The project it serves.
    pub fn project_name(&self) -> &str {
        match self {
            Backend::Sync(s) => s.project_name(),
            Backend::Handler(h) => h.project_name(),
        }
    }

    /// The highest fence it has accepted, for the `hello`.
    pub fn fence_high_water(&self) -> Option<u64> {
        match self {
            Backend::Sync(s) => s.fence_high_water(),
            Backend::Handler(h) => h.fence_high_water(),
        }
    }

    /// Frames for a newly welcomed connection ([`Handler::welcome_frames`]).
    fn welcome_frames(&self) -> Vec<String> {
        match self {
            Backend::Sync(_) => Vec::new(),
            Backend::Handler(h) => h.welcome_frames(),
        }
    }

    /// A receiver that sees a change each time the tool list changes, if it ever does.
    fn tools_changed(&self) -> Option<watch::Receiver<u64>> {
        match self {
            Backend::Sync(s) => s.subscribe_tools_changed(),
            Backend::Handler(_) => None,
        }
    }

    /// A receiver of the notifications the sled is told to send, if it can be.
    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        match self {
            Backend::Sync(s) => s.subscribe_notices(),
            Backend::Handler(h) => h.notices(),
        }
    }
}

/// Why a request a handler made of the gateway got no result.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestError {
    /// The gateway (or the client behind it) answered with a JSON-RPC error.
    Rpc { code: i64, message: String },
    /// No answer within the time allowed.
    Timeout(Duration),
    /// The uplink went away before the answer came.
    Disconnected,
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Rpc { code, message } => write!(f, "error {code}: {message}"),
            RequestError::Timeout(d) => write!(f, "no answer within {d:?}"),
            RequestError::Disconnected => f.write_str("the uplink closed before the answer came"),
        }
    }
}

impl std::error::Error for RequestError {}

/// Requests a handler sent up the uplink, waiting for their answers, by the id's JSON text.
#[derive(Default)]
struct Outstanding {
    next: u64,
    waiting: BTreeMap<String, oneshot::Sender<Value>>,
}

/// One connection's way to the gateway, shared by the tasks serving its requests.
#[derive(Clone)]
struct Peer {
    tx: mpsc::UnboundedSender<Message>,
    outstanding: Arc<Mutex<Outstanding>>,
}

impl Peer {
    fn new(tx: mpsc::UnboundedSender<Message>) -> Self {
        Peer {
            tx,
            outstanding: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Outstanding> {
        self.outstanding
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A response from the gateway: to the request of ours it answers. Returns whether it was
    /// one of ours.
    fn deliver(&self, msg: &Value) -> bool {
        let Some(id) = msg.get("id") else {
            return false;
        };
        match self.lock().waiting.remove(&id.to_string()) {
            Some(waiter) => {
                let _ = waiter.send(msg.clone());
                true
            }
            None => false,
        }
    }
}

/// What a [`Handler`] can do while it serves one request: send the gateway progress,
/// notifications for the call's client, and requests of its own.
#[derive(Clone)]
pub struct CallContext {
    peer: Peer,
    connection: u64,
    request_id: Option<u64>,
    progress_token: Option<Value>,
}

impl std::fmt::Debug for CallContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallContext")
            .field("connection", &self.connection)
            .field("request_id", &self.request_id)
            .field("progress_token", &self.progress_token)
            .finish()
    }
}

impl CallContext {
    /// The gateway's id of the request being served (a number on this uplink).
    pub fn request_id(&self) -> Option<u64> {
        self.request_id
    }

    /// Which connection of the uplink the request came on: 1, 2, … in the order they were
    /// welcomed. The gateway's ids are unique per connection only.
    pub fn connection(&self) -> u64 {
        self.connection
    }

    /// The progress token the gateway put on the request, if the client asked for progress.
    pub fn progress_token(&self) -> Option<&Value> {
        self.progress_token.as_ref()
    }

    fn send(&self, msg: &Value) -> bool {
        self.peer.tx.send(Message::text(msg.to_string())).is_ok()
    }

    /// Sends `msg` up the uplink as it is (a notification already shaped for this call, such
    /// as a server's own progress under the call's token), after whatever was sent before it
    /// and before the call's answer, which goes the same way once the handler returns it.
    pub fn send_as_is(&self, msg: &Value) -> bool {
        self.send(msg)
    }

    /// Sends `notifications/progress` under the request's token; does nothing (and returns
    /// false) when the client asked for no progress.
    pub fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) -> bool {
        let Some(token) = &self.progress_token else {
            return false;
        };
        let mut params = json!({"progressToken": token, "progress": progress});
        if let Some(total) = total {
            params["total"] = json!(total);
        }
        if let Some(message) = message {
            params["message"] = json!(message);
        }
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": params}))
    }

    /// Adds `_meta[RELATED_REQUEST_META]` = this request's id to `params` (an object), so the
    /// gateway relays what carries them to this call's client.
    fn related(&self, mut params: Value) -> Value {
        if let (Some(id), Some(obj)) = (self.request_id, params.as_object_mut()) {
            let meta = obj.entry("_meta").or_insert_with(|| json!({}));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert(RELATED_REQUEST_META.to_owned(), json!(id));
            }
        }
        params
    }

    /// Sends a notification meant for this call's client (e.g. `notifications/message`),
    /// naming the call in `params._meta`.
    pub fn notify(&self, method: &str, params: Value) -> bool {
        let params = self.related(params);
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    /// Sends `notifications/message` (a log message) for this call's client.
    pub fn log(&self, level: &str, logger: &str, data: Value) -> bool {
        self.notify(
            "notifications/message",
            json!({"level": level, "logger": logger, "data": data}),
        )
    }

    /// Sends a request for this call's client (e.g. `sampling/createMessage`), naming the call
    /// in `params._meta`, and waits up to `wait` for its answer: the result, or why there is
    /// none.
    pub async fn request(
        &self,
        method: &str,
        params: Value,
        wait: Duration,
    ) -> Result<Value, RequestError> {
        let (waiter, answer) = oneshot::channel();
        let id = {
            let mut outstanding = self.peer.lock();
            outstanding.waiting.retain(|_, w| !w.is_closed());
            outstanding.next += 1;
            let id = json!(format!("sled-{}", outstanding.next));
            outstanding.waiting.insert(id.to_string(), waiter);
            id
        };
        let params = self.related(params);
        let sent =
            self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        if !sent {
            self.peer.lock().waiting.remove(&id.to_string());
            return Err(RequestError::Disconnected);
        }
        let response = match timeout(wait, answer).await {
            Ok(Ok(response)) => response,
            Ok(Err(_)) => return Err(RequestError::Disconnected),
            Err(_) => {
                self.peer.lock().waiting.remove(&id.to_string());
                return Err(RequestError::Timeout(wait));
            }
        };
        if let Some(error) = response.get("error") {
            return Err(RequestError::Rpc {
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            });
        }
        Ok(response.get("result").cloned().unwrap_or(Value::Null))
    }
}

/// What one text frame from the gateway is.
enum Frame {
    Control(Control),
    BadControl(String),
    Rpc(Value),
    NotJson(String),
}

fn classify(text: &str) -> Frame {
    match serde_json::from_str::<Value>(text) {
        Ok(v) if v.get("uplink").is_some() => match serde_json::from_value::<Control>(v) {
            Ok(c) => Frame::Control(c),
            Err(e) => Frame::BadControl(e.to_string()),
        },
        Ok(v) => Frame::Rpc(v),
        Err(e) => Frame::NotJson(e.to_string()),
    }
}

/// The reconnect delay after `failures` consecutive failed attempts: `backoff_min` doubling up
/// to `backoff_max`, then a uniformly drawn value between half of that and all of it.
fn backoff_delay(opts: &UplinkOptions, failures: u32, rng: &mut ChaCha8Rng) -> Duration {
    let min = opts.backoff_min.max(Duration::from_millis(1));
    let max = opts.backoff_max.max(min);
    let base = min.saturating_mul(1u32 << failures.min(20)).min(max);
    let nanos = u64::try_from(base.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.random_range(nanos / 2..=nanos))
}

fn request_delay(opts: &UplinkOptions, rng: &mut ChaCha8Rng) -> Duration {
    if opts.jitter.is_zero() {
        return opts.latency;
    }
    let nanos = u64::try_from(opts.jitter.as_nanos()).unwrap_or(u64::MAX);
    opts.latency
        .saturating_add(Duration::from_nanos(rng.random_range(0..=nanos)))
}

fn close_name(code: u16) -> &'static str {
    const NAMES: [(CloseCode, &str); 10] = [
        (CloseCode::GoingAway, "going away"),
        (CloseCode::Replaced, "replaced by another connection"),
        (CloseCode::HeartbeatTimeout, "heartbeat timeout"),
        (CloseCode::UnknownProject, "unknown project"),
        (CloseCode::ProtocolError, "protocol error"),
        (CloseCode::HelloTimeout, "hello timeout"),
        (
            CloseCode::Unauthorized,
            "unauthorized: missing or wrong uplink token",
        ),
        (CloseCode::IdentityRefused, "identity refused"),
        (CloseCode::Superseded, "superseded by a newer epoch"),
        (
            CloseCode::Occupied,
            "occupied: an unauthenticated sled cannot replace a live uplink",
        ),
    ];
    NAMES
        .iter()
        .find(|(c, _)| c.code() == code)
        .map_or("other", |(_, name)| name)
}

/// Runs one sled's uplink until `shutdown` completes: connect to `ws://host:port/uplink`, send
/// `hello`, wait for `welcome`, then serve `sled` (answer pings and JSON-RPC requests); on any
/// loss, reconnect with exponential backoff. Never returns before `shutdown` completes. The
/// loop has an epoch fence of its own.
pub async fn run_uplink_with<C: Connect>(
    connector: C,
    gateway: GatewayAddr,
    sled: Backend,
    opts: UplinkOptions,
    shutdown: impl Future<Output = ()>,
) {
    run_uplink_fenced(
        connector,
        gateway,
        sled,
        opts,
        EpochFence::default(),
        shutdown,
    )
    .await;
}

/// [`run_uplink_with`] sharing `fence` with other uplink loops of the same sled: the one
/// welcomed with the highest epoch serves, and the others' connections are closed
/// ([`CloseCode::Superseded`]) and reconnect.
pub async fn run_uplink_fenced<C: Connect>(
    connector: C,
    gateway: GatewayAddr,
    sled: Backend,
    opts: UplinkOptions,
    fence: EpochFence,
    shutdown: impl Future<Output = ()>,
) {
    let shutdown = shutdown.shared();
    // One seeded sequence for the backoff and every connection's latencies, drawn in the
    // same order as when one connection runs at a time.
    let rng = Mutex::new(ChaCha8Rng::seed_from_u64(opts.seed));
    let project = sled.project_name().to_owned();
    let relay = Relay::new(opts.stall_relay);
    // A connection that the gateway asks to move (`Control::Move`) says so here, by number.
    let (mover, mut moves) = mpsc::unbounded_channel::<u64>();
    let connect = |number: u64, moving: bool| {
        let shutdown = shutdown.clone();
        let conn = Conn {
            number,
            moving,
            mover: &mover,
        };
        let (connector, gateway, sled, opts, relay, fence, rng) =
            (&connector, &gateway, &sled, &opts, &relay, &fence, &rng);
        async move {
            let shutdown = std::pin::pin!(shutdown);
            let outcome = connect_once(
                connector, gateway, sled, opts, relay, fence, rng, conn, shutdown,
            )
            .await;
            (number, outcome)
        }
    };
    // Every connection still running: the newest (the one that serves, or is being made),
    // and older ones finishing their calls after a move.
    let mut conns = FuturesUnordered::new();
    let mut newest: u64 = 0;
    let mut failures: u32 = 0;
    let mut next_at = Some(Instant::now());
    // The newest attempt answers a move: an older connection still serves meanwhile.
    let mut moving = false;
    let mut ending = false;
    loop {
        if ending && conns.is_empty() {
            info!(project = %project, "uplink shut down");
            return;
        }
        let next_due = async {
            match next_at {
                Some(at) => sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.clone(), if !ending => {
                // Each connection sees it too, says goodbye and ends.
                ending = true;
                next_at = None;
            }
            () = next_due, if !ending => {
                next_at = None;
                newest += 1;
                conns.push(connect(newest, moving && !conns.is_empty()));
            }
            Some(number) = moves.recv() => {
                // Asked once per connection; only the newest one's ask starts a new one.
                if number == newest && !ending {
                    info!(project = %project, "the gateway asks this sled to move; opening a new uplink");
                    moving = true;
                    next_at = Some(Instant::now());
                }
            }
            Some((number, outcome)) = conns.next(), if !conns.is_empty() => {
                let Outcome::Lost { welcomed, close_code, failure } = outcome else {
                    ending = true;
                    next_at = None;
                    continue;
                };
                if number != newest {
                    debug!(project = %project, connection = number, "an older uplink ended");
                    continue;
                }
                if welcomed {
                    failures = 0;
                }
                moving = moving && !conns.is_empty();
                let delay = {
                    let mut rng = rng.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    backoff_delay(&opts, failures, &mut rng)
                };
                next_at = Some(Instant::now() + lost_delay(&project, &gateway, &opts, delay, failures, close_code, failure));
                failures = failures.saturating_add(1);
            }
        }
    }
}

/// How long to wait after the newest connection was lost (`delay`, the backoff), logged.
fn lost_delay(
    project: &str,
    gateway: &GatewayAddr,
    opts: &UplinkOptions,
    mut delay: Duration,
    failures: u32,
    close_code: Option<u16>,
    failure: Option<String>,
) -> Duration {
    let attempt = failures.saturating_add(1);
    // Refused for who it is: retrying soon would be refused the same way.
    let identity_refused = close_code == Some(CloseCode::IdentityRefused.code());
    let unknown_project = close_code == Some(CloseCode::UnknownProject.code());
    let token_refused = close_code == Some(CloseCode::Unauthorized.code());
    if unknown_project || identity_refused || token_refused {
        delay = opts
            .backoff_max
            .max(opts.backoff_min)
            .saturating_mul(UNKNOWN_PROJECT_BACKOFF_FACTOR);
    }
    match failure {
        Some(reason) if identity_refused => error!(
            project = %project, gateway = %gateway, retry_in = ?delay,
            "identity refused: {reason}; retrying with a long backoff"
        ),
        Some(reason) if token_refused => error!(
            project = %project, gateway = %gateway, %reason, retry_in = ?delay,
            "the gateway refused this sled's uplink: its project's `token` is missing or wrong (sled-sim reads it from --token-env, SLED_UPLINK_TOKEN by default), or the project has neither a token nor a pinned key; retrying with a long backoff"
        ),
        Some(reason) if unknown_project => error!(
            project = %project, gateway = %gateway, %reason, retry_in = ?delay,
            "the gateway does not know this project; retrying with a long backoff"
        ),
        Some(reason) => warn!(
            project = %project, gateway = %gateway, %reason, attempt,
            retry_in = ?delay, "uplink attempt failed"
        ),
        None => debug!(project = %project, retry_in = ?delay, "reconnecting"),
    }
    delay
}

/// One connection of an uplink loop: its number, whether its hello answers a move, and where
/// it says that the gateway asks it to move.
struct Conn<'a> {
    number: u64,
    moving: bool,
    mover: &'a mpsc::UnboundedSender<u64>,
}

/// One connection: handshake, then serve until it is lost or shutdown completes.
#[allow(clippy::too_many_arguments)]
async fn connect_once<C: Connect, F: Future<Output = ()>>(
    connector: &C,
    gateway: &GatewayAddr,
    sled: &Backend,
    opts: &UplinkOptions,
    relay: &Relay,
    fence: &EpochFence,
    rng: &Mutex<ChaCha8Rng>,
    conn: Conn<'_>,
    mut shutdown: Pin<&mut F>,
) -> Outcome {
    let project = sled.project_name().to_owned();
    let url = gateway.uplink_url();
    let key = opts
        .identity
        .as_ref()
        .map(|k| encode_key(&k.verifying_key()));
    let hello = Control::Hello {
        protocol: PROTOCOL_VERSION,
        project: project.clone(),
        sled: opts.sled_name.clone(),
        token: opts.token.clone(),
        key: key.clone(),
        // Read at each attempt: the fences accepted on the last connection count.
        fence: sled.fence_high_water(),
        epoch_seen: fence.seen(),
        moving: conn.moving,
    };
    let attempt = async {
        // TLS over the connection for a `wss://` gateway.
        let stream = gateway_client::dial(connector, &gateway.base_url(), &opts.tls)
            .await
            .map_err(|e| (format!("connecting to {}: {e}", gateway.host_port()), None))?;
        // The request built from the URL carries `Host: host:port`.
        // Small buffers: tungstenite zero-fills its read buffer before each read, and the
        // 128 KiB default costs more than the frames an uplink carries.
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .read_buffer_size(8 * 1024)
            .write_buffer_size(8 * 1024);
        let (mut ws, _response) =
            tokio_tungstenite::client_async_with_config(url.as_str(), stream, Some(config))
                .await
                .map_err(|e| (format!("WebSocket upgrade at {url}: {e}"), None))?;
        // A proof is made for the gateway this sled dialed (and, over TLS, verified).
        let gateway_name = gateway_core::identity::gateway_name(gateway.host());
        let (heartbeat_ms, epoch) = handshake(
            &mut ws,
            &hello,
            &project,
            &gateway_name,
            opts.identity.as_ref(),
        )
        .await?;
        if let Some(epoch) = epoch {
            if !fence.welcome(epoch) {
                let seen = fence.seen().unwrap_or_default();
                let why = format!("welcomed with epoch {epoch}, not above {seen}");
                hang_up_with(&mut ws, CloseCode::Superseded, &why).await;
                return Err((
                    format!("a stale claim: {why}"),
                    Some(CloseCode::Superseded.code()),
                ));
            }
        }
        Ok((ws, heartbeat_ms, epoch))
    };
    let result = tokio::select! {
        () = shutdown.as_mut() => return Outcome::Shutdown,
        r = timeout(HANDSHAKE_TIMEOUT, attempt) => r,
    };
    let (ws, heartbeat_ms, epoch) = match result {
        Ok(Ok(ok)) => ok,
        Ok(Err((reason, close_code))) => {
            return Outcome::Lost {
                welcomed: false,
                close_code,
                failure: Some(reason),
            };
        }
        Err(_) => {
            return Outcome::Lost {
                welcomed: false,
                close_code: None,
                failure: Some(format!("no welcome within {HANDSHAKE_TIMEOUT:?}")),
            };
        }
    };
    let key = key.as_deref().unwrap_or("none");
    info!(project = %project, gateway = %gateway, heartbeat_ms, key, ?epoch, moving = conn.moving, "uplink connected");
    let epoch = epoch.map(|e| (e, fence));
    serve(
        ws,
        heartbeat_ms,
        epoch,
        sled,
        opts,
        relay,
        rng,
        &conn,
        shutdown,
    )
    .await
}

/// Hangs up on a gateway that broke the handshake (best effort).
async fn hang_up<S: AsyncRead + AsyncWrite + Unpin>(ws: &mut WebSocketStream<S>, why: &str) {
    let frame = CloseFrame {
        code: WsCloseCode::Protocol,
        reason: why.to_owned().into(),
    };
    let _ = timeout(Duration::from_millis(500), ws.close(Some(frame))).await;
}

/// Hangs up with one of the uplink protocol's close codes (best effort).
async fn hang_up_with<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<S>,
    code: CloseCode,
    why: &str,
) {
    let frame = CloseFrame {
        code: WsCloseCode::from(code.code()),
        reason: why.to_owned().into(),
    };
    let _ = timeout(Duration::from_millis(500), ws.close(Some(frame))).await;
}

/// Sends `hello`, answers a `challenge` with a `proof` signed by `identity` for the gateway
/// named `gateway_name`, and waits for `welcome`. Returns the heartbeat period and the welcome's epoch, or why it failed and the
/// close code if the gateway closed the connection (for `IdentityRefused`, the reason is just
/// the gateway's).
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<S>,
    hello: &Control,
    project: &str,
    gateway_name: &str,
    identity: Option<&SigningKey>,
) -> Result<(u64, Option<u64>), (String, Option<u16>)> {
    ws.send(Message::text(hello.to_text()))
        .await
        .map_err(|e| (format!("sending hello: {e}"), None))?;
    let mut closing: Option<(u16, String)> = None;
    loop {
        let msg = match ws.next().await {
            Some(Ok(msg)) => msg,
            Some(Err(e)) => {
                return Err((format!("waiting for welcome: {e}"), closing_code(&closing)))
            }
            None => {
                return Err((
                    "the gateway closed the connection before welcome".to_owned(),
                    closing_code(&closing),
                ))
            }
        };
        match msg {
            Message::Text(text) => match classify(&text) {
                Frame::Control(Control::Welcome {
                    protocol,
                    heartbeat_ms,
                    epoch,
                }) => {
                    if protocol != PROTOCOL_VERSION {
                        warn!(
                            project,
                            protocol,
                            ours = PROTOCOL_VERSION,
                            "gateway welcomed with another protocol version"
                        );
                    }
                    return Ok((heartbeat_ms, epoch));
                }
                Frame::Control(Control::Closing { code, reason }) => {
                    info!(project, code, kind = close_name(code), %reason, "gateway is closing the uplink");
                    closing = Some((code, reason));
                }
                Frame::Control(Control::Ping { seq }) => {
                    ws.send(Message::text(Control::Pong { seq }.to_text()))
                        .await
                        .map_err(|e| (format!("sending pong: {e}"), None))?;
                }
                Frame::Control(Control::Challenge { nonce }) => {
                    let Some(key) = identity else {
                        hang_up(ws, "a challenge, but the hello named no key").await;
                        return Err((
                            "protocol error: the gateway sent a challenge, but this sled has no \
                             identity (its hello named no key)"
                                .to_owned(),
                            None,
                        ));
                    };
                    let signature = match sign_challenge(key, gateway_name, project, &nonce) {
                        Ok(signature) => signature,
                        Err(e) => {
                            hang_up(ws, "a malformed challenge").await;
                            return Err((format!("protocol error: bad challenge: {e}"), None));
                        }
                    };
                    debug!(project, "answering the identity challenge");
                    let proof = Control::Proof {
                        signature,
                        gateway: Some(gateway_name.to_owned()),
                    };
                    ws.send(Message::text(proof.to_text()))
                        .await
                        .map_err(|e| (format!("sending proof: {e}"), None))?;
                }
                Frame::Control(other) => {
                    warn!(project, frame = ?other, "unexpected control frame before welcome");
                }
                Frame::BadControl(e) => warn!(project, error = %e, "malformed control frame"),
                Frame::Rpc(_) => warn!(project, "JSON-RPC frame before welcome ignored"),
                Frame::NotJson(e) => warn!(project, error = %e, "non-JSON frame ignored"),
            },
            Message::Close(frame) => {
                let code = frame
                    .as_ref()
                    .map(|f| u16::from(f.code))
                    .or_else(|| closing_code(&closing));
                let reason = match (&frame, &closing) {
                    (Some(f), _) if !f.reason.is_empty() => f.reason.to_string(),
                    (_, Some((_, r))) => r.clone(),
                    _ => String::new(),
                };
                // Best effort: complete the closing handshake.
                let _ = timeout(Duration::from_millis(500), ws.close(None)).await;
                if code == Some(CloseCode::IdentityRefused.code()) {
                    let reason = if reason.is_empty() {
                        "no reason given".to_owned()
                    } else {
                        reason
                    };
                    return Err((reason, code));
                }
                let kind = code.map_or("none", close_name);
                return Err((
                    format!("closed before welcome (code {code:?}, {kind}): {reason}"),
                    code,
                ));
            }
            _ => {}
        }
    }
}

fn closing_code(closing: &Option<(u16, String)>) -> Option<u16> {
    closing.as_ref().map(|(c, _)| *c)
}

/// How long silence from the gateway may last: three heartbeats (none when the gateway sends no
/// heartbeat), at most a day.
fn silence_limit(heartbeat_ms: u64) -> Option<Duration> {
    const DAY_MS: u64 = 24 * 60 * 60 * 1000;
    (heartbeat_ms > 0).then(|| Duration::from_millis(heartbeat_ms.saturating_mul(3).min(DAY_MS)))
}

/// Serves a welcomed connection until it is lost or shutdown completes, or (with the epoch it
/// was welcomed with, and the sled's fence) until a newer epoch supersedes it.
#[allow(clippy::too_many_arguments)]
async fn serve<S, F>(
    ws: WebSocketStream<S>,
    heartbeat_ms: u64,
    epoch: Option<(u64, &EpochFence)>,
    backend: &Backend,
    opts: &UplinkOptions,
    relay: &Relay,
    rng: &Mutex<ChaCha8Rng>,
    conn: &Conn<'_>,
    mut shutdown: Pin<&mut F>,
) -> Outcome
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Future<Output = ()>,
{
    let project = backend.project_name().to_owned();
    let lost = |close_code| Outcome::Lost {
        welcomed: true,
        close_code,
        failure: None,
    };
    let (mut sink, mut stream) = ws.split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
    // The one writer: everything the sled sends goes through `tx`.
    let mut writer = AbortOnDrop(tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            let mut closing = matches!(msg, Message::Close(_));
            sink.feed(msg).await?;
            while !closing {
                let Ok(more) = rx.try_recv() else { break };
                closing = matches!(more, Message::Close(_));
                sink.feed(more).await?;
            }
            sink.flush().await?;
            if closing {
                break;
            }
        }
        Ok::<(), tokio_tungstenite::tungstenite::Error>(())
    }));
    let send = |text: String| {
        // Fails only when the writer is gone, which the loop below notices.
        let _ = tx.send(Message::text(text));
    };
    let silence = silence_limit(heartbeat_ms);
    if silence.is_none() {
        warn!(project = %project, "gateway sends no heartbeat; dead connections go unnoticed");
    }
    let deadline_after = |d: Duration| Instant::now().checked_add(d);
    let mut deadline = silence.and_then(deadline_after);
    let peer = Peer::new(tx.clone());
    let connection = relay.next_connection();
    for frame in backend.welcome_frames() {
        send(frame);
    }
    let (mut tools_changed, mut tools_open) = match backend.tools_changed() {
        Some(rx) => (rx, true),
        None => (watch::channel(0).1, false),
    };
    let (mut notices, mut notices_open) = match backend.notices() {
        Some(rx) => (rx, true),
        None => (tokio::sync::broadcast::channel(1).1, false),
    };
    let mut tasks: JoinSet<()> = JoinSet::new();
    // Calls still waiting out their latency, by the gateway's request id, so that a
    // `notifications/cancelled` stops them before they are applied.
    let mut waiting: BTreeMap<u64, tokio::task::AbortHandle> = BTreeMap::new();
    let mut closing: Option<(u16, String)> = None;
    // A newer epoch welcomed on another connection of this sled ends this one: at once, or
    // (calls running on it) once they are answered, at most `SUPERSEDED_DRAIN` later.
    let superseded = || epoch.is_some_and(|(e, fence)| !fence.is_newest(e));
    let mut draining: Option<Instant> = None;
    // Shutdown asked with a drain and calls running: until when they may finish.
    let mut shutting_down: Option<Instant> = None;
    // Whether the gateway asked this connection to move (it is said once).
    let mut asked_to_move = false;
    let (mut newer, mut newer_open) = match epoch {
        Some((_, fence)) => (fence.subscribe(), true),
        None => (watch::channel(None).1, false),
    };
    // The relay's anti-entropy tick: a `sync` event every `relay_interval`, the first one
    // interval after welcome.
    let mut sync = (!relay.stalled && !opts.relay_interval.is_zero())
        .then(|| Instant::now().checked_add(opts.relay_interval))
        .flatten()
        .map(|first| {
            let mut ticks = tokio::time::interval_at(first, opts.relay_interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks
        });
    loop {
        let sync_due = async {
            match sync.as_mut() {
                Some(ticks) => {
                    ticks.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        let idle = async {
            match deadline {
                Some(d) => sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let drain_over = async {
            match draining {
                Some(d) => sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let drained = async {
            match shutting_down {
                Some(d) => sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.as_mut(), if shutting_down.is_none() => {
                match opts.drain.and_then(|d| Instant::now().checked_add(d)) {
                    Some(until) if !tasks.is_empty() => {
                        info!(project = %project, calls = tasks.len(), limit = ?opts.drain,
                            "shutting down: answering the calls running first");
                        shutting_down = Some(until);
                    }
                    _ => {
                        send_close(&tx, &mut writer).await;
                        return Outcome::Shutdown;
                    }
                }
            }
            () = drained => {
                warn!(project = %project, calls = tasks.len(), limit = ?opts.drain,
                    "shutting down: calls still running at the drain limit; closing");
                send_close(&tx, &mut writer).await;
                return Outcome::Shutdown;
            }
            r = &mut writer.0 => {
                let why = match r {
                    Ok(Ok(())) => "writer stopped".to_owned(),
                    Ok(Err(e)) => e.to_string(),
                    Err(e) => e.to_string(),
                };
                warn!(project = %project, error = %why, "uplink write failed; reconnecting");
                return lost(None);
            }
            () = idle => {
                warn!(project = %project, silence = ?silence,
                    "nothing from the gateway for three heartbeats; reconnecting");
                return lost(None);
            }
            changed = tools_changed.changed(), if tools_open => {
                if changed.is_ok() {
                    debug!(project = %project, "sending tools/list_changed");
                    send(json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}).to_string());
                } else {
                    tools_open = false;
                }
            }
            notice = notices.recv(), if notices_open => match notice {
                Ok(text) => {
                    debug!(project = %project, notice = %text, "sending a notification");
                    send(text);
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    warn!(project = %project, missed = n, "notifications to send were dropped");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => notices_open = false,
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {
                if shutting_down.is_some() && tasks.is_empty() {
                    info!(project = %project, "shutting down: every call answered");
                    send_close(&tx, &mut writer).await;
                    return Outcome::Shutdown;
                }
                if draining.is_some() && tasks.is_empty() {
                    return close_superseded(&project, &tx, &mut writer, &mut stream).await;
                }
            }
            changed = newer.changed(), if newer_open => {
                if changed.is_err() {
                    newer_open = false;
                } else if superseded() {
                    if tasks.is_empty() {
                        return close_superseded(&project, &tx, &mut writer, &mut stream).await;
                    }
                    // Make-before-break: the calls running here were taken while this
                    // connection's epoch was the newest; they are answered before it closes.
                    info!(project = %project, calls = tasks.len(),
                        "a newer epoch was welcomed on another connection; answering the calls running on this one first");
                    newer_open = false;
                    draining = Instant::now().checked_add(SUPERSEDED_DRAIN);
                }
            }
            () = drain_over => {
                warn!(project = %project, calls = tasks.len(), limit = ?SUPERSEDED_DRAIN,
                    "calls still running on a superseded connection; closing it");
                return close_superseded(&project, &tx, &mut writer, &mut stream).await;
            }
            () = sync_due, if !superseded() => relay.send(&tx, "sync", None),
            msg = stream.next() => {
                let msg = match msg {
                    Some(Ok(msg)) => msg,
                    Some(Err(e)) => {
                        warn!(project = %project, error = %e, "uplink read failed; reconnecting");
                        return lost(closing_code(&closing));
                    }
                    None => {
                        warn!(project = %project, "uplink closed; reconnecting");
                        return lost(closing_code(&closing));
                    }
                };
                deadline = silence.and_then(deadline_after);
                match msg {
                    Message::Text(text) => match classify(&text) {
                        Frame::Control(Control::Ping { seq }) => send(Control::Pong { seq }.to_text()),
                        Frame::Control(Control::Closing { code, reason }) => {
                            info!(project = %project, code, kind = close_name(code), %reason,
                                "gateway is closing the uplink");
                            closing = Some((code, reason));
                        }
                        Frame::Control(Control::Move { reason }) => {
                            info!(project = %project, %reason, "asked to move to another replica");
                            if !asked_to_move && !superseded() {
                                asked_to_move = true;
                                let _ = conn.mover.send(conn.number);
                            }
                        }
                        Frame::Control(other) => {
                            warn!(project = %project, frame = ?other, "unexpected control frame ignored");
                        }
                        Frame::BadControl(e) => {
                            warn!(project = %project, error = %e, "malformed control frame ignored");
                        }
                        Frame::NotJson(e) => {
                            // Said at once, naming the request when its id can be read, so
                            // the call fails now instead of at its deadline.
                            let id = recover_request_id(&text);
                            warn!(project = %project, error = %e, request = ?id,
                                "unreadable frame from the gateway; telling it");
                            send(Control::Unreadable { id, reason: e }.to_text());
                        }
                        Frame::Rpc(_) if superseded() && tasks.is_empty() => {
                            // Not served: the gateway's claim is no longer the newest.
                            return close_superseded(&project, &tx, &mut writer, &mut stream).await;
                        }
                        Frame::Rpc(msg) if superseded() && msg.get("method").is_some() && msg.get("id").is_some() => {
                            // A new request on a connection finishing its calls: not served
                            // (the gateway's claim is no longer the newest), and said so.
                            warn!(project = %project, "a request on a superseded connection; refused, not applied");
                            let refusal = json!({
                                "jsonrpc": "2.0",
                                "id": msg.get("id"),
                                "error": {
                                    "code": -32603,
                                    "message": "this uplink was superseded by the sled's newer one; the request was not applied",
                                    "data": {"kind": "superseded", "outcome": "not_sent"},
                                },
                            });
                            send(refusal.to_string());
                        }
                        Frame::Rpc(msg) if shutting_down.is_some() && msg.get("method").is_some() && msg.get("id").is_some() => {
                            // Draining for shutdown: the calls running are answered, a new
                            // one is not taken.
                            info!(project = %project, "a request while shutting down; refused, not applied");
                            let refusal = json!({
                                "jsonrpc": "2.0",
                                "id": msg.get("id"),
                                "error": {
                                    "code": -32603,
                                    "message": format!("project {project}'s sled is shutting down; the request was not applied"),
                                    "data": {"kind": "sled_shutting_down", "project": project, "outcome": "not_sent"},
                                },
                            });
                            send(refusal.to_string());
                        }
                        Frame::Rpc(msg) => {
                            waiting.retain(|_, h| !h.is_finished());
                            let method = msg.get("method").and_then(Value::as_str);
                            // The W3C trace the gateway carried from its client, for operators
                            // who follow one call from end to end.
                            if let Some(parent) = msg.pointer("/params/_meta/traceparent").and_then(Value::as_str) {
                                let mut ids = parent.split('-').skip(1);
                                info!(project = %project, method = method.unwrap_or("-"),
                                    trace_id = ids.next().unwrap_or("-"), parent_span = ids.next().unwrap_or("-"),
                                    "request in a trace");
                            }
                            if method.is_none() && peer.deliver(&msg) {
                                // The answer to a handler's own request, handed to it.
                            } else if method == Some("notifications/cancelled") {
                                let id = msg.pointer("/params/requestId").and_then(Value::as_u64);
                                if let Some(handle) = id.and_then(|id| waiting.remove(&id)) {
                                    handle.abort();
                                    info!(project = %project, request = id, "call cancelled by the gateway; not applied");
                                }
                                if let Backend::Handler(handler) = backend {
                                    handler.cancelled(connection, msg.get("params").unwrap_or(&Value::Null));
                                }
                            } else {
                                let id = msg.get("id").and_then(Value::as_u64);
                                let ctx = CallContext {
                                    peer: peer.clone(),
                                    connection,
                                    request_id: id,
                                    progress_token: msg.pointer("/params/_meta/progressToken").cloned(),
                                };
                                let answer = match backend {
                                    Backend::Sync(sled) => match sled.handle_async(&msg, &ctx) {
                                        Some(answer) => Some(answer),
                                        None => {
                                            let mut rng = rng.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                                            serve_story(sled, msg, opts, relay, &mut rng, &tx, &mut tasks, &mut waiting);
                                            None
                                        }
                                    },
                                    // A handler answers every request itself.
                                    Backend::Handler(handler) => Some(Arc::clone(handler).handle(msg, ctx)),
                                };
                                if let Some(answer) = answer {
                                    let tx = tx.clone();
                                    let handle = tasks.spawn(async move {
                                        if let Some(resp) = answer.await {
                                            let _ = tx.send(Message::text(resp.to_string()));
                                        }
                                    });
                                    if let Some(id) = id {
                                        waiting.insert(id, handle);
                                    }
                                }
                            }
                        }
                    },
                    Message::Binary(_) => warn!(project = %project, "binary frame ignored"),
                    Message::Close(frame) => {
                        let code = frame.as_ref().map(|f| u16::from(f.code)).or_else(|| closing_code(&closing));
                        let reason = match (&frame, &closing) {
                            (Some(f), _) if !f.reason.is_empty() => f.reason.to_string(),
                            (_, Some((_, r))) => r.clone(),
                            _ => String::new(),
                        };
                        let kind = code.map_or("none", close_name);
                        if code == Some(CloseCode::IdentityRefused.code()) {
                            error!(project = %project, ?code, "identity refused: {reason}");
                        } else if code == Some(CloseCode::UnknownProject.code()) {
                            error!(project = %project, ?code, kind, %reason,
                                "the gateway no longer knows this project");
                        } else {
                            warn!(project = %project, ?code, kind, %reason,
                                "gateway closed the uplink; reconnecting");
                        }
                        // Let the writer flush the close reply tungstenite queued.
                        let _ = tx.send(Message::Close(None));
                        let _ = timeout(Duration::from_millis(500), &mut writer.0).await;
                        return lost(code);
                    }
                    // WebSocket pings are answered by tungstenite itself.
                    _ => {}
                }
            }
        }
    }
}

/// One request for the story-model sled: answered at once, or (for a `tools/call` when the
/// latency knob is set) by a task that waits it out, sending progress halfway when asked. A
/// successful mutating call's relay event follows its response.
#[allow(clippy::too_many_arguments)]
fn serve_story(
    sled: &Arc<dyn SyncServer>,
    msg: Value,
    opts: &UplinkOptions,
    relay: &Relay,
    rng: &mut ChaCha8Rng,
    tx: &mpsc::UnboundedSender<Message>,
    tasks: &mut JoinSet<()>,
    waiting: &mut BTreeMap<u64, tokio::task::AbortHandle>,
) {
    // The latency knob emulates slow project tools: it applies to tools/call only, not to
    // listing tools or the handshake.
    let is_call =
        msg.get("method").and_then(|m| m.as_str()) == Some("tools/call") && msg.get("id").is_some();
    let delay = if is_call {
        request_delay(opts, rng)
    } else {
        Duration::ZERO
    };
    if delay.is_zero() {
        answer_story(sled, &msg, tx, relay);
        return;
    }
    let sled = Arc::clone(sled);
    let tx = tx.clone();
    let relay = relay.clone();
    let id = msg.get("id").and_then(Value::as_u64);
    // A call that asked for progress hears of it halfway through.
    let progress_token = msg.pointer("/params/_meta/progressToken").cloned();
    let handle = tasks.spawn(async move {
        if let Some(token) = progress_token {
            sleep(delay / 2).await;
            let progress = json!({
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": token, "progress": 1, "total": 2, "message": "working"},
            });
            let _ = tx.send(Message::text(progress.to_string()));
            sleep(delay - delay / 2).await;
        } else {
            sleep(delay).await;
        }
        answer_story(&sled, &msg, &tx, &relay);
    });
    if let Some(id) = id {
        waiting.insert(id, handle);
    }
}

/// Runs one request against the story-model sled and sends its response, then the relay event
/// of a successful mutating call.
fn answer_story(
    sled: &Arc<dyn SyncServer>,
    msg: &Value,
    tx: &mpsc::UnboundedSender<Message>,
    relay: &Relay,
) {
    if let Some(resp) = sled.handle(msg) {
        let _ = tx.send(Message::text(resp.to_string()));
        if let Some((kind, story)) = sled.event_of(msg, &resp) {
            relay.send(tx, kind, story);
        }
    }
}

/// Closes a connection whose epoch is no longer the sled's newest, with
/// [`CloseCode::Superseded`]: gives the writer a moment to flush it, then waits (a moment) for
/// the gateway's close in answer, reading what comes before it. A connection dropped with
/// bytes unread is reset, and a reset may discard what this side sent last: the answers to
/// the calls it just finished, still on their way to the gateway.
async fn close_superseded<S>(
    project: &str,
    tx: &mpsc::UnboundedSender<Message>,
    writer: &mut AbortOnDrop<Result<(), tokio_tungstenite::tungstenite::Error>>,
    stream: &mut S,
) -> Outcome
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    info!(
        project,
        "a newer epoch was welcomed on another connection; closing this one"
    );
    let frame = CloseFrame {
        code: WsCloseCode::from(CloseCode::Superseded.code()),
        reason: "superseded by a newer epoch".into(),
    };
    if tx.send(Message::Close(Some(frame))).is_ok() {
        let _ = timeout(Duration::from_millis(500), &mut writer.0).await;
        let closed = async {
            while let Some(Ok(msg)) = stream.next().await {
                if matches!(msg, Message::Close(_)) {
                    break;
                }
            }
        };
        let _ = timeout(Duration::from_secs(1), closed).await;
    }
    Outcome::Lost {
        welcomed: true,
        close_code: Some(CloseCode::Superseded.code()),
        failure: None,
    }
}

/// Sends a normal close and gives the writer a moment to flush it.
async fn send_close(
    tx: &mpsc::UnboundedSender<Message>,
    writer: &mut AbortOnDrop<Result<(), tokio_tungstenite::tungstenite::Error>>,
) {
    let frame = CloseFrame {
        code: WsCloseCode::Normal,
        reason: "sled shutting down".into(),
    };
    if tx.send(Message::Close(Some(frame))).is_ok() {
        let _ = timeout(Duration::from_secs(1), &mut writer.0).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_with_jitter() {
        let opts = UplinkOptions::default();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for failures in 0..40 {
            let d = backoff_delay(&opts, failures, &mut rng);
            let base = Duration::from_millis(100)
                .saturating_mul(1 << failures.min(20))
                .min(Duration::from_secs(5));
            assert!(d >= base / 2 && d <= base, "{failures}: {d:?}");
        }
        let zero = UplinkOptions {
            backoff_min: Duration::ZERO,
            backoff_max: Duration::ZERO,
            ..UplinkOptions::default()
        };
        assert!(backoff_delay(&zero, 0, &mut rng) > Duration::ZERO);
    }

    #[test]
    fn request_delay_is_seeded() {
        let opts = UplinkOptions {
            latency: Duration::from_millis(10),
            jitter: Duration::from_millis(5),
            ..UplinkOptions::default()
        };
        let draw = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..10)
                .map(|_| request_delay(&opts, &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
        for d in draw(5) {
            assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(15));
        }
    }

    #[test]
    fn frames_are_classified() {
        assert!(matches!(
            classify(r#"{"uplink":"ping","seq":3}"#),
            Frame::Control(Control::Ping { seq: 3 })
        ));
        assert!(matches!(
            classify(r#"{"uplink":"ping"}"#),
            Frame::BadControl(_)
        ));
        assert!(matches!(
            classify(r#"{"uplink":"nope","seq":1}"#),
            Frame::BadControl(_)
        ));
        assert!(matches!(
            classify(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            Frame::Rpc(_)
        ));
        assert!(matches!(classify("[1]"), Frame::Rpc(_)));
        assert!(matches!(classify("{"), Frame::NotJson(_)));
        assert_eq!(silence_limit(0), None);
        assert_eq!(silence_limit(5000), Some(Duration::from_secs(15)));
        assert_eq!(
            silence_limit(u64::MAX),
            Some(Duration::from_secs(24 * 3600))
        );
        assert_eq!(close_name(4003), "unknown project");
    }
}
