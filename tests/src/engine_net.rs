//! The model of the cluster engine ([`crate::engine_model::Model`]) on a host of its own, reached
//! over turmoil's network: the replicas of a simulated cluster each hold a [`NetEngine`], which
//! implements [`Engine`] over one TCP connection to [`serve_engine`] on the engine host. So a
//! partition, a pause or a crash between a replica and the engine is a real one: bytes stop,
//! streams stall, connections drop, and the client has to notice.
//!
//! # The protocol
//!
//! One JSON object per line, both ways. The client opens with `{"hello":NAME}` (the server
//! serves the connection with one `ModelEngine`, `model.client(NAME)`), then sends requests,
//! each with an `id` and an `op`:
//!
//! | op | fields | `ok` |
//! |---|---|---|
//! | `ensure_bucket` | `bucket`, `max_age_ms` (or null) | null |
//! | `get` | `bucket`, `key` | null or `{key, value, revision}` |
//! | `create`, `put` | `bucket`, `key`, `value` | the revision |
//! | `update` | `bucket`, `key`, `value`, `expected` | the revision |
//! | `delete` | `bucket`, `key`, `expected` (or null) | the revision |
//! | `watch` | `bucket`, `filter`, `watch` (the client's id for it) | null |
//! | `publish` | `subject`, `payload` | null |
//! | `request` | `subject`, `payload`, `timeout_ms` | the answer's payload |
//! | `subscribe` | `subject`, `sub` (the client's id for it) | null |
//!
//! and, without an `id`, `{"op":"unwatch","watch":W}`, `{"op":"unsubscribe","sub":S}` and
//! `{"op":"ping"}`. Values and payloads are base64. The server answers each request with
//! `{"id":N,"ok":…}` or `{"id":N,"err":{"kind":…,"detail":…}}` (`kind` one per
//! [`EngineError`] variant, `current_revision` for a conflict), a ping with `{"pong":true}`,
//! and pushes `{"watch":W,"key":…,"revision":…,"kind":"put"|"deleted"|"expired","value":…}`
//! and `{"sub":S,"subject":…,"payload":…,"reply":…}` as they happen.
//!
//! The server handles a connection's requests in the order they come (only a `request` waiting
//! for its answer runs on beside the rest), as a NATS server does a client's. A connection
//! the server hears nothing from for [`SERVER_SILENCE`] is closed, and with it the
//! connection's subscriptions and watches, as NATS drops a client that stopped answering its
//! pings.
//!
//! # The client
//!
//! A [`NetEngine`] keeps one connection, made by a task of its own on the host that created
//! it, and made again whenever it is lost (closed, or silent for [`CLIENT_SILENCE`]: turmoil
//! does not retransmit, so a segment lost to a partition stalls the stream for good, and only
//! the heartbeat finds it). While it has no connection every operation fails at once with
//! [`EngineError::Unavailable`]; an operation in flight when it is lost fails so too, and so
//! does one without an answer within [`OP_TIMEOUT`] (a `request`: its own timeout plus that),
//! so nothing waits for ever. Names are checked before anything is sent, as both real
//! implementations do.
//!
//! After a reconnect the client subscribes again to every subject it had, and watches every
//! watch again from scratch: the server's new watch starts with the latest write of every
//! matching key; the client drops what it has already delivered (revisions at or below the
//! last one it passed on), so a watch goes on in revision order, having skipped only
//! superseded writes, as NATS's ordered consumer re-made after its last sequence does. Messages
//! published meanwhile are lost to its subscriptions (at most once), as with NATS.
//!
//! # Outages
//!
//! [`serve_engine_switched`] serves under an [`EngineSwitch`]: turned off, the engine goes
//! down ([`Model::stop`]), closes every connection and refuses new ones; turned on, it comes
//! back with every bucket as it was ([`Model::start`], called on the engine host, whose clock
//! the model keeps). The engine host itself is never crashed: a new runtime would bring a new
//! clock, and the model's instants (its expiry times) would no longer mean anything.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Poll;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use gateway_server::cluster::{
    check_bucket, check_key, check_key_filter, check_subject, check_subject_pattern, BucketConfig,
    Change, ChangeKind, Engine, EngineError, Entry, Incoming, Revision, Store, Subscription, Watch,
};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::{timeout, Instant};

use crate::engine_model::{Model, ModelEngine};

/// The engine host's port.
pub const ENGINE_PORT: u16 = 4222;

/// How often the client pings the server.
pub const PING_EVERY: Duration = Duration::from_millis(250);

/// How long the client waits for any line from the server before it takes the connection for
/// dead.
pub const CLIENT_SILENCE: Duration = Duration::from_millis(1_000);

/// How long the server waits for any line from a client before it closes the connection.
pub const SERVER_SILENCE: Duration = Duration::from_secs(2);

/// How long an operation waits for its answer (a `request`: this past its own timeout).
pub const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// How long connecting, and re-establishing watches and subscriptions, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1_000);

/// How long the client waits between connection attempts.
const RECONNECT_AFTER: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------------------------
// Errors and values on the wire.

fn error_json(e: &EngineError) -> Value {
    match e {
        EngineError::Conflict { current_revision } => {
            json!({"kind": "conflict", "current_revision": current_revision})
        }
        EngineError::BucketNotFound(d) => json!({"kind": "bucket_not_found", "detail": d}),
        EngineError::NoResponders(d) => json!({"kind": "no_responders", "detail": d}),
        EngineError::Timeout => json!({"kind": "timeout"}),
        EngineError::Unavailable(d) => json!({"kind": "unavailable", "detail": d}),
        EngineError::Invalid(d) => json!({"kind": "invalid", "detail": d}),
        EngineError::Other(d) => json!({"kind": "other", "detail": d}),
    }
}

fn error_of(v: &Value) -> EngineError {
    let detail = v["detail"].as_str().unwrap_or_default().to_owned();
    match v["kind"].as_str() {
        Some("conflict") => match v["current_revision"].as_u64() {
            Some(current_revision) => EngineError::Conflict { current_revision },
            None => EngineError::Other(format!("a conflict without a revision: {v}")),
        },
        Some("bucket_not_found") => EngineError::BucketNotFound(detail),
        Some("no_responders") => EngineError::NoResponders(detail),
        Some("timeout") => EngineError::Timeout,
        Some("unavailable") => EngineError::Unavailable(detail),
        Some("invalid") => EngineError::Invalid(detail),
        Some("other") => EngineError::Other(detail),
        _ => EngineError::Other(format!("an error the client cannot read: {v}")),
    }
}

fn b64(bytes: &[u8]) -> Value {
    Value::String(B64.encode(bytes))
}

fn unb64(v: &Value) -> Result<Bytes, EngineError> {
    let text = v
        .as_str()
        .ok_or_else(|| EngineError::Other(format!("not base64 text: {v}")))?;
    B64.decode(text)
        .map(Bytes::from)
        .map_err(|e| EngineError::Other(format!("bad base64: {e}")))
}

fn str_of<'a>(v: &'a Value, field: &str) -> Result<&'a str, EngineError> {
    v[field]
        .as_str()
        .ok_or_else(|| EngineError::Other(format!("a request without {field}")))
}

fn u64_of(v: &Value, field: &str) -> Result<u64, EngineError> {
    v[field]
        .as_u64()
        .ok_or_else(|| EngineError::Other(format!("a request without {field}")))
}

fn change_json(watch: u64, c: &Change) -> Value {
    let mut v = json!({"watch": watch, "key": c.key, "revision": c.revision});
    match &c.kind {
        ChangeKind::Put(value) => {
            v["kind"] = json!("put");
            v["value"] = b64(value);
        }
        ChangeKind::Deleted => v["kind"] = json!("deleted"),
        ChangeKind::Expired => v["kind"] = json!("expired"),
    }
    v
}

fn change_of(v: &Value) -> Option<Change> {
    let kind = match v["kind"].as_str()? {
        "put" => ChangeKind::Put(unb64(&v["value"]).ok()?),
        "deleted" => ChangeKind::Deleted,
        "expired" => ChangeKind::Expired,
        _ => return None,
    };
    Some(Change {
        key: v["key"].as_str()?.to_owned(),
        revision: v["revision"].as_u64()?,
        kind,
    })
}

// ---------------------------------------------------------------------------------------------
// The server.

/// Turns the engine host's engine off (down, every connection closed) and on again.
#[derive(Debug, Clone)]
pub struct EngineSwitch(Arc<watch::Sender<bool>>);

impl Default for EngineSwitch {
    fn default() -> Self {
        EngineSwitch(Arc::new(watch::channel(true).0))
    }
}

impl EngineSwitch {
    /// Up (`true`) or down. Callable from outside the simulation (the fault driver): the
    /// engine host acts on it when it next runs.
    pub fn set(&self, up: bool) {
        self.0.send_replace(up);
    }

    pub fn is_up(&self) -> bool {
        *self.0.borrow()
    }
}

/// Serves `model` on `port` of this host for ever: see the module docs.
pub async fn serve_engine(model: Model, port: u16) -> std::io::Result<()> {
    serve_engine_switched(model, port, EngineSwitch::default()).await
}

/// [`serve_engine`], down while `switch` is off.
pub async fn serve_engine_switched(
    model: Model,
    port: u16,
    switch: EngineSwitch,
) -> std::io::Result<()> {
    let mut up = switch.0.subscribe();
    loop {
        while !*up.borrow_and_update() {
            if up.changed().await.is_err() {
                return Ok(());
            }
        }
        if !model.is_up() {
            model.start();
            tracing::info!("the engine is back");
        }
        let listener = turmoil::net::TcpListener::bind(("0.0.0.0", port)).await?;
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    if let Ok((stream, _)) = accepted {
                        connections.spawn(serve_connection(model.clone(), stream));
                    }
                }
                changed = up.changed() => {
                    if changed.is_err() || !*up.borrow_and_update() {
                        break;
                    }
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        tracing::warn!("the engine goes down");
        model.stop();
        connections.abort_all();
        while connections.join_next().await.is_some() {}
        drop(listener);
    }
}

/// Serves one client connection with one `ModelEngine` until it closes or falls silent.
async fn serve_connection(model: Model, stream: turmoil::net::TcpStream) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let name = match timeout(SERVER_SILENCE, lines.next_line()).await {
        Ok(Ok(Some(line))) => match serde_json::from_str::<Value>(&line) {
            Ok(v) => match v["hello"].as_str() {
                Some(name) => name.to_owned(),
                None => return,
            },
            Err(_) => return,
        },
        _ => return,
    };
    let engine = Arc::new(model.client(&name));
    let (tx, mut rx) = mpsc::unbounded_channel::<Value>();
    // The one writer.
    let writer = tokio::spawn(async move {
        while let Some(v) = rx.recv().await {
            let mut line = v.to_string();
            line.push('\n');
            if write.write_all(line.as_bytes()).await.is_err() {
                return;
            }
        }
    });
    let _writer = AbortOnDrop(writer);
    // The pumps of watches and subscriptions, and requests waiting for answers.
    let mut pumps: BTreeMap<(u8, u64), AbortOnDrop> = BTreeMap::new();
    let mut waiting = JoinSet::new();
    let mut heard = Instant::now();
    loop {
        let line = tokio::select! {
            line = tokio::time::timeout_at(heard + SERVER_SILENCE, lines.next_line()) => line,
            Some(_) = waiting.join_next(), if !waiting.is_empty() => continue,
        };
        heard = Instant::now();
        let line = match line {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) | Ok(Err(_)) => break,
            Err(_) => {
                tracing::debug!(client = name, "an engine client fell silent; closed");
                break;
            }
        };
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            tracing::warn!(
                client = name,
                line,
                "an unreadable line from an engine client"
            );
            break;
        };
        let op = msg["op"].as_str().unwrap_or_default();
        match op {
            "ping" => {
                let _ = tx.send(json!({"pong": true}));
                continue;
            }
            "unwatch" => {
                pumps.remove(&(0, msg["watch"].as_u64().unwrap_or_default()));
                continue;
            }
            "unsubscribe" => {
                pumps.remove(&(1, msg["sub"].as_u64().unwrap_or_default()));
                continue;
            }
            _ => {}
        }
        let Some(id) = msg["id"].as_u64() else {
            continue;
        };
        let answer = move |r: Result<Value, EngineError>| match r {
            Ok(v) => json!({"id": id, "ok": v}),
            Err(e) => json!({"id": id, "err": error_json(&e)}),
        };
        let result = match op {
            "watch" => match start_watch(&engine, &msg, tx.clone()).await {
                Ok((w, pump)) => {
                    pumps.insert((0, w), pump);
                    Ok(Value::Null)
                }
                Err(e) => Err(e),
            },
            "subscribe" => match start_subscription(&engine, &msg, tx.clone()).await {
                Ok((s, pump)) => {
                    pumps.insert((1, s), pump);
                    Ok(Value::Null)
                }
                Err(e) => Err(e),
            },
            "request" => {
                // Sent now (the model delivers it when first polled); answered when it is.
                let mut pending = match request_of(&engine, &msg) {
                    Ok(f) => f,
                    Err(e) => {
                        let _ = tx.send(answer(Err(e)));
                        continue;
                    }
                };
                let first = std::future::poll_fn(|cx| Poll::Ready(pending.as_mut().poll(cx))).await;
                match first {
                    Poll::Ready(r) => r.map(|b| b64(&b)),
                    Poll::Pending => {
                        let tx = tx.clone();
                        waiting.spawn(async move {
                            let r = pending.await.map(|b| b64(&b));
                            let _ = tx.send(answer(r));
                        });
                        continue;
                    }
                }
            }
            _ => {
                let r = one_op(&engine, op, &msg).await;
                if op != "get" {
                    tracing::debug!(client = %name, op, key = %msg["key"], expected = %msg["expected"], result = ?r, "engine op");
                }
                r
            }
        };
        let _ = tx.send(answer(result));
    }
    // Dropping the pumps and the engine client ends the connection's watches and
    // subscriptions.
    waiting.abort_all();
    drop(pumps);
}

/// A task aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn request_of(
    engine: &Arc<ModelEngine>,
    msg: &Value,
) -> Result<BoxFuture<'static, Result<Bytes, EngineError>>, EngineError> {
    let subject = str_of(msg, "subject")?;
    let payload = unb64(&msg["payload"])?;
    let timeout_ms = u64_of(msg, "timeout_ms")?;
    Ok(engine.request(subject, payload, Duration::from_millis(timeout_ms)))
}

async fn start_watch(
    engine: &Arc<ModelEngine>,
    msg: &Value,
    tx: mpsc::UnboundedSender<Value>,
) -> Result<(u64, AbortOnDrop), EngineError> {
    let w = u64_of(msg, "watch")?;
    let mut watch = engine
        .watch(str_of(msg, "bucket")?, str_of(msg, "filter")?)
        .await?;
    let pump = tokio::spawn(async move {
        while let Some(change) = watch.next().await {
            if tx.send(change_json(w, &change)).is_err() {
                return;
            }
        }
    });
    Ok((w, AbortOnDrop(pump)))
}

async fn start_subscription(
    engine: &Arc<ModelEngine>,
    msg: &Value,
    tx: mpsc::UnboundedSender<Value>,
) -> Result<(u64, AbortOnDrop), EngineError> {
    let s = u64_of(msg, "sub")?;
    let mut sub = engine.subscribe(str_of(msg, "subject")?).await?;
    let pump = tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            let v = json!({
                "sub": s, "subject": m.subject, "payload": b64(&m.payload), "reply": m.reply,
            });
            if tx.send(v).is_err() {
                return;
            }
        }
    });
    Ok((s, AbortOnDrop(pump)))
}

/// The operations answered at once.
async fn one_op(engine: &Arc<ModelEngine>, op: &str, msg: &Value) -> Result<Value, EngineError> {
    match op {
        "ensure_bucket" => {
            let config = BucketConfig {
                name: str_of(msg, "bucket")?.to_owned(),
                max_age: msg["max_age_ms"].as_u64().map(Duration::from_millis),
            };
            engine.ensure_bucket(config).await.map(|()| Value::Null)
        }
        "get" => {
            let entry = engine
                .get(str_of(msg, "bucket")?, str_of(msg, "key")?)
                .await?;
            Ok(entry.map_or(
                Value::Null,
                |e| json!({"key": e.key, "value": b64(&e.value), "revision": e.revision}),
            ))
        }
        "create" | "put" | "update" => {
            let (bucket, key) = (str_of(msg, "bucket")?, str_of(msg, "key")?);
            let value = unb64(&msg["value"])?;
            let revision = match op {
                "create" => engine.create(bucket, key, value).await?,
                "put" => engine.put(bucket, key, value).await?,
                _ => {
                    engine
                        .update(bucket, key, value, u64_of(msg, "expected")?)
                        .await?
                }
            };
            Ok(json!(revision))
        }
        "delete" => {
            let expected = msg["expected"].as_u64();
            let revision = engine
                .delete(str_of(msg, "bucket")?, str_of(msg, "key")?, expected)
                .await?;
            Ok(json!(revision))
        }
        "publish" => {
            let payload = unb64(&msg["payload"])?;
            engine
                .publish(str_of(msg, "subject")?, payload)
                .await
                .map(|()| Value::Null)
        }
        other => Err(EngineError::Other(format!("unknown operation {other:?}"))),
    }
}

// ---------------------------------------------------------------------------------------------
// The client.

/// The [`Engine`] of a replica on a simulated host: the model on the engine host, over
/// turmoil TCP (see the module docs). Create it inside the host's runtime: its connection task
/// runs there, and ends when this is dropped.
pub struct NetEngine {
    inner: Arc<Inner>,
    task: tokio::task::AbortHandle,
}

impl std::fmt::Debug for NetEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetEngine")
            .field("name", &self.inner.name)
            .field("addr", &self.inner.addr)
            .field("connected", &self.is_connected())
            .finish()
    }
}

impl Drop for NetEngine {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Inner {
    name: String,
    addr: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The live connection's queue of lines to send; `None` while there is none.
    conn: Option<mpsc::UnboundedSender<Value>>,
    next_id: u64,
    pending: BTreeMap<u64, oneshot::Sender<Result<Value, EngineError>>>,
    watches: BTreeMap<u64, WatchSlot>,
    subs: BTreeMap<u64, SubSlot>,
    /// How many times a connection was made.
    connections: u64,
}

struct WatchSlot {
    bucket: String,
    filter: String,
    tx: mpsc::UnboundedSender<Change>,
    /// The last revision passed on: a watch made again skips up to here.
    last: Revision,
}

struct SubSlot {
    pattern: String,
    tx: mpsc::UnboundedSender<Incoming>,
}

impl State {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn unavailable(&self) -> EngineError {
        EngineError::Unavailable(format!("{} is not connected to the engine", self.name))
    }

    /// Sends `msg` with a fresh id and waits up to `wait` for its answer.
    async fn call(&self, msg: Value, wait: Duration) -> Result<Value, EngineError> {
        self.call_with(msg, wait, EngineError::Unavailable).await
    }

    /// [`Inner::call`], with `lost` making the error of an operation lost once sent (a
    /// `request` must not say `Unavailable` then: that means nothing was sent).
    async fn call_with(
        &self,
        mut msg: Value,
        wait: Duration,
        lost: fn(String) -> EngineError,
    ) -> Result<Value, EngineError> {
        let (id, answer) = {
            let mut state = self.lock();
            let Some(conn) = state.conn.clone() else {
                return Err(self.unavailable());
            };
            let id = state.next_id();
            msg["id"] = json!(id);
            let (tx, rx) = oneshot::channel();
            state.pending.insert(id, tx);
            if conn.send(msg).is_err() {
                state.pending.remove(&id);
                return Err(self.unavailable());
            }
            (id, rx)
        };
        match timeout(wait, answer).await {
            Ok(Ok(result)) => result,
            // The connection was lost in flight (`Inner::lost` drops the waiters).
            Ok(Err(_)) => Err(lost(format!(
                "{} lost its connection to the engine",
                self.name
            ))),
            Err(_) => {
                self.lock().pending.remove(&id);
                Err(lost(format!("no answer from the engine within {wait:?}")))
            }
        }
    }

    /// Sends a line that needs no answer, if connected.
    fn tell(&self, msg: Value) {
        if let Some(conn) = &self.lock().conn {
            let _ = conn.send(msg);
        }
    }

    /// A line from the server.
    fn received(&self, msg: Value) {
        let mut state = self.lock();
        if let Some(id) = msg["id"].as_u64() {
            let result = match msg.get("err") {
                Some(e) => Err(error_of(e)),
                None => Ok(msg["ok"].clone()),
            };
            if let Some(waiter) = state.pending.remove(&id) {
                let _ = waiter.send(result);
            }
        } else if let Some(w) = msg["watch"].as_u64() {
            let Some(change) = change_of(&msg) else {
                tracing::warn!(%msg, "an unreadable watch change");
                return;
            };
            if let Some(slot) = state.watches.get_mut(&w) {
                // Already passed on before a reconnect: the new watch starts over.
                if change.revision > slot.last {
                    slot.last = change.revision;
                    let _ = slot.tx.send(change);
                }
            }
        } else if let Some(s) = msg["sub"].as_u64() {
            let message = (|| {
                Some(Incoming {
                    subject: msg["subject"].as_str()?.to_owned(),
                    payload: unb64(&msg["payload"]).ok()?,
                    reply: msg["reply"].as_str().map(str::to_owned),
                })
            })();
            match (message, state.subs.get(&s)) {
                (Some(m), Some(slot)) => {
                    let _ = slot.tx.send(m);
                }
                (None, _) => tracing::warn!(%msg, "an unreadable message"),
                (Some(_), None) => {}
            }
        }
    }

    /// The connection is gone: what waits on it fails now.
    fn lost(&self) {
        let mut state = self.lock();
        state.conn = None;
        // Dropped: each waiter fails as its operation says (`Inner::call_with`).
        state.pending.clear();
    }
}

impl NetEngine {
    /// A client of the engine at `addr` (`host:port`), named `name` there; it connects (and
    /// reconnects) in the background.
    pub fn new(addr: impl Into<String>, name: impl Into<String>) -> NetEngine {
        let inner = Arc::new(Inner {
            name: name.into(),
            addr: addr.into(),
            state: Mutex::new(State::default()),
        });
        let task = tokio::spawn(connection_loop(Arc::downgrade(&inner))).abort_handle();
        NetEngine { inner, task }
    }

    /// Whether it has a connection to the engine now.
    pub fn is_connected(&self) -> bool {
        self.inner.lock().conn.is_some()
    }

    /// How many connections it has made so far.
    pub fn connections(&self) -> u64 {
        self.inner.lock().connections
    }

    /// Waits until it has a connection, at most `limit`; whether it has.
    pub async fn wait_connected(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.is_connected() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn op(&self, msg: Value) -> BoxFuture<'static, Result<Value, EngineError>> {
        let inner = self.inner.clone();
        Box::pin(async move { inner.call(msg, OP_TIMEOUT).await })
    }
}

/// Connects, re-establishes watches and subscriptions, serves the connection until it is lost,
/// and again, until the client is dropped.
async fn connection_loop(inner: Weak<Inner>) {
    loop {
        let Some(addr) = inner.upgrade().map(|i| i.addr.clone()) else {
            return;
        };
        let stream = timeout(CONNECT_TIMEOUT, turmoil::net::TcpStream::connect(addr)).await;
        if let Ok(Ok(stream)) = stream {
            serve_client_connection(&inner, stream).await;
            if let Some(i) = inner.upgrade() {
                i.lost();
                tracing::debug!(client = i.name, "lost the engine connection");
            }
        }
        tokio::time::sleep(RECONNECT_AFTER).await;
    }
}

/// One connection of the client's, until it is lost.
async fn serve_client_connection(inner: &Weak<Inner>, stream: turmoil::net::TcpStream) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let (tx, mut rx) = mpsc::unbounded_channel::<Value>();
    // The hello and the watches and subscriptions to make again, before anything else.
    let mut setup = Vec::new();
    {
        let Some(i) = inner.upgrade() else { return };
        let _ = tx.send(json!({"hello": i.name}));
        let mut state = i.lock();
        let watches: Vec<Value> = state
            .watches
            .iter()
            .map(
                |(w, s)| json!({"op": "watch", "watch": w, "bucket": s.bucket, "filter": s.filter}),
            )
            .chain(
                state
                    .subs
                    .iter()
                    .map(|(s, slot)| json!({"op": "subscribe", "sub": s, "subject": slot.pattern})),
            )
            .collect();
        for mut msg in watches {
            let id = state.next_id();
            msg["id"] = json!(id);
            setup.push(id);
            let _ = tx.send(msg);
        }
    }
    let mut heard = Instant::now();
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let mut up = false;
    loop {
        if !up && setup.is_empty() {
            // Everything is in place again: operations may use the connection.
            let Some(i) = inner.upgrade() else { return };
            let mut state = i.lock();
            state.conn = Some(tx.clone());
            state.connections += 1;
            up = true;
            drop(state);
            tracing::debug!(client = i.name, "connected to the engine");
        }
        tokio::select! {
            line = lines.next_line() => {
                let Ok(Some(line)) = line else { return };
                heard = Instant::now();
                let Ok(msg) = serde_json::from_str::<Value>(&line) else {
                    tracing::warn!(line, "an unreadable line from the engine");
                    return;
                };
                if let Some(id) = msg["id"].as_u64().filter(|id| setup.contains(id)) {
                    if msg.get("err").is_some() {
                        tracing::debug!(%msg, "could not make a watch or subscription again");
                        return;
                    }
                    setup.retain(|s| *s != id);
                    continue;
                }
                let Some(i) = inner.upgrade() else { return };
                i.received(msg);
            }
            out = rx.recv() => {
                let Some(msg) = out else { return };
                let mut line = msg.to_string();
                line.push('\n');
                if write.write_all(line.as_bytes()).await.is_err() {
                    return;
                }
            }
            _ = ping.tick() => {
                if heard.elapsed() > CLIENT_SILENCE {
                    return;
                }
                if !up && started.elapsed() > CONNECT_TIMEOUT {
                    return;
                }
                let _ = tx.send(json!({"op": "ping"}));
            }
        }
    }
}

/// Removes a watch (or subscription) when its stream is dropped, and tells the server.
struct SlotGuard {
    inner: Weak<Inner>,
    id: u64,
    watch: bool,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let msg = {
            let mut state = inner.lock();
            if self.watch {
                state.watches.remove(&self.id);
                json!({"op": "unwatch", "watch": self.id})
            } else {
                state.subs.remove(&self.id);
                json!({"op": "unsubscribe", "sub": self.id})
            }
        };
        inner.tell(msg);
    }
}

impl Store for NetEngine {
    fn ensure_bucket(&self, config: BucketConfig) -> BoxFuture<'static, Result<(), EngineError>> {
        if let Err(e) = config.validate() {
            return Box::pin(async move { Err(e) });
        }
        let max_age = config
            .max_age
            .map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX));
        let f =
            self.op(json!({"op": "ensure_bucket", "bucket": config.name, "max_age_ms": max_age}));
        Box::pin(async move { f.await.map(drop) })
    }

    fn get(
        &self,
        bucket: &str,
        key: &str,
    ) -> BoxFuture<'static, Result<Option<Entry>, EngineError>> {
        if let Err(e) = check_bucket(bucket).and_then(|()| check_key(key)) {
            return Box::pin(async move { Err(e) });
        }
        let f = self.op(json!({"op": "get", "bucket": bucket, "key": key}));
        Box::pin(async move {
            let v = f.await?;
            if v.is_null() {
                return Ok(None);
            }
            Ok(Some(Entry {
                key: str_of(&v, "key")?.to_owned(),
                value: unb64(&v["value"])?,
                revision: u64_of(&v, "revision")?,
            }))
        })
    }

    fn create(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        self.write(json!({"op": "create", "bucket": bucket, "key": key, "value": b64(&value)}))
    }

    fn put(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        self.write(json!({"op": "put", "bucket": bucket, "key": key, "value": b64(&value)}))
    }

    fn update(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        self.write(json!({
            "op": "update", "bucket": bucket, "key": key, "value": b64(&value),
            "expected": expected,
        }))
    }

    fn delete(
        &self,
        bucket: &str,
        key: &str,
        expected: Option<Revision>,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        self.write(json!({"op": "delete", "bucket": bucket, "key": key, "expected": expected}))
    }

    fn watch(&self, bucket: &str, filter: &str) -> BoxFuture<'static, Result<Watch, EngineError>> {
        if let Err(e) = check_bucket(bucket).and_then(|()| check_key_filter(filter)) {
            return Box::pin(async move { Err(e) });
        }
        let inner = self.inner.clone();
        let (bucket, filter) = (bucket.to_owned(), filter.to_owned());
        Box::pin(async move {
            let (tx, rx) = mpsc::unbounded_channel();
            let id = {
                let mut state = inner.lock();
                let id = state.next_id();
                state.watches.insert(
                    id,
                    WatchSlot {
                        bucket: bucket.clone(),
                        filter: filter.clone(),
                        tx,
                        last: 0,
                    },
                );
                id
            };
            let guard = SlotGuard {
                inner: Arc::downgrade(&inner),
                id,
                watch: true,
            };
            let msg = json!({"op": "watch", "watch": id, "bucket": bucket, "filter": filter});
            inner.call(msg, OP_TIMEOUT).await?;
            Ok(Watch::new(futures_util::stream::unfold(
                (rx, guard),
                |(mut rx, guard)| async move {
                    let change = rx.recv().await?;
                    Some((change, (rx, guard)))
                },
            )))
        })
    }
}

impl Engine for NetEngine {
    fn publish(
        &self,
        subject: &str,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        if let Err(e) = check_subject(subject) {
            return Box::pin(async move { Err(e) });
        }
        let f = self.op(json!({"op": "publish", "subject": subject, "payload": b64(&payload)}));
        Box::pin(async move { f.await.map(drop) })
    }

    fn request(
        &self,
        subject: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Bytes, EngineError>> {
        if let Err(e) = check_subject(subject) {
            return Box::pin(async move { Err(e) });
        }
        let inner = self.inner.clone();
        let msg = json!({
            "op": "request", "subject": subject, "payload": b64(&payload),
            "timeout_ms": u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        });
        Box::pin(async move {
            let v = inner
                .call_with(msg, timeout + OP_TIMEOUT, EngineError::Other)
                .await?;
            unb64(&v)
        })
    }

    fn subscribe(&self, subject: &str) -> BoxFuture<'static, Result<Subscription, EngineError>> {
        if let Err(e) = check_subject_pattern(subject) {
            return Box::pin(async move { Err(e) });
        }
        let inner = self.inner.clone();
        let pattern = subject.to_owned();
        Box::pin(async move {
            let (tx, rx) = mpsc::unbounded_channel();
            let id = {
                let mut state = inner.lock();
                let id = state.next_id();
                state.subs.insert(
                    id,
                    SubSlot {
                        pattern: pattern.clone(),
                        tx,
                    },
                );
                id
            };
            let guard = SlotGuard {
                inner: Arc::downgrade(&inner),
                id,
                watch: false,
            };
            let msg = json!({"op": "subscribe", "sub": id, "subject": pattern});
            inner.call(msg, OP_TIMEOUT).await?;
            Ok(Subscription::new(futures_util::stream::unfold(
                (rx, guard),
                |(mut rx, guard)| async move {
                    let message = rx.recv().await?;
                    Some((message, (rx, guard)))
                },
            )))
        })
    }
}

impl NetEngine {
    /// A write (create, put, update, delete): its revision.
    fn write(&self, msg: Value) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let checked = check_bucket(msg["bucket"].as_str().unwrap_or_default())
            .and_then(|()| check_key(msg["key"].as_str().unwrap_or_default()));
        if let Err(e) = checked {
            return Box::pin(async move { Err(e) });
        }
        let f = self.op(msg);
        Box::pin(async move {
            let v = f.await?;
            v.as_u64()
                .ok_or_else(|| EngineError::Other(format!("a revision that is not one: {v}")))
        })
    }
}
