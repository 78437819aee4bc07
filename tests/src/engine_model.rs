//! The model of the cluster engine the simulation runs instead of NATS: the semantics of
//! [`gateway_server::cluster::Engine`] in memory, kept equal to a real nats-server by
//! `tests/tests/engine_contract.rs`, which runs the same tests against both.
//!
//! A [`Model`] is the engine (the server); [`Model::client`] opens a connection to it, a
//! [`ModelEngine`], which implements `Engine`. What it models, after JetStream key/value with
//! history 1 and core NATS:
//!
//! - Each bucket is a log of writes: one sequence per bucket (the revisions), the latest write
//!   per key kept, the previous one dropped when its key is written again.
//! - Expiry by `max_age`, on tokio's clock (under turmoil, simulated time): a value or a delete
//!   that reaches its age is replaced by an expiry marker, a write of its own with the next
//!   revision, which goes silently after another `max_age` (as nats-server's limit markers do).
//!   Expiry is applied whenever anything looks (every operation, and every watch while it
//!   waits, with a timer for the next expiry), so the model runs no task of its own.
//! - A watch is JetStream's ordered push consumer: it starts with the kept writes that match,
//!   and each new write is pushed to it as it happens (so a slow reader misses nothing), except
//!   while its client is cut off; then, on reconnecting, it catches up from the log, after the
//!   last revision it had, so it skips what was superseded meanwhile, as NATS's consumer
//!   re-made from its last sequence does.
//! - Subjects with `*` and `>`; a request gets an inbox of its own and fails with no responders
//!   when no reachable subscriber matches; messages are delivered at most once.
//! - Faults: the whole engine down and up again ([`Model::stop`], [`Model::start`]; data,
//!   subscriptions and watches survive, as with NATS's file storage and its client's
//!   reconnects), and one client cut off from it ([`ModelEngine::cut_off`],
//!   [`ModelEngine::reconnect`]). Meanwhile the client's operations fail with `Unavailable`,
//!   messages for its subscriptions are lost, and its watches fall behind.
//!
//! Drive one `Model` from one runtime (one turmoil host): its instants come from whichever task
//! calls it, and different hosts' clocks are not one clock. Everything is kept in `BTreeMap`s,
//! so a run is a function of the order of calls.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use gateway_server::cluster::{
    check_bucket, check_key, check_key_filter, check_subject, check_subject_pattern,
    subject_matches, BucketConfig, Change, ChangeKind, Engine, EngineError, Entry, Incoming,
    Revision, Store, Subscription, Watch,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// The engine: buckets, subscriptions, watches, and whether it is up. Cheap to clone (one
/// engine).
#[derive(Clone)]
pub struct Model {
    shared: Arc<Shared>,
}

impl Default for Model {
    fn default() -> Model {
        Model::new()
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("up", &self.shared.lock().up)
            .finish()
    }
}

impl Model {
    /// An engine that is up, with no bucket.
    pub fn new() -> Model {
        let (changed, _) = watch::channel(0);
        Model {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    up: true,
                    buckets: BTreeMap::new(),
                    clients: BTreeMap::new(),
                    subs: BTreeMap::new(),
                    watches: BTreeMap::new(),
                    next_id: 0,
                }),
                changed,
            }),
        }
    }

    /// A new connection to the engine (a replica's client); `name` appears in its errors.
    pub fn client(&self, name: &str) -> ModelEngine {
        let id = {
            let mut state = self.shared.lock();
            let id = state.next_id();
            state.clients.insert(
                id,
                ClientState {
                    name: name.to_owned(),
                    connected: true,
                },
            );
            id
        };
        ModelEngine {
            client: Arc::new(Client {
                shared: self.shared.clone(),
                id,
            }),
        }
    }

    /// The engine goes down: every operation of every client fails with `Unavailable` until
    /// [`Model::start`]; answers to requests in flight are lost (the requests time out).
    pub fn stop(&self) {
        self.shared.lock().up = false;
        self.shared.bump();
    }

    /// The engine is back with every bucket as it was (NATS's file storage with
    /// `sync_interval: always`); clients' subscriptions and watches carry on, watches catching
    /// up on what they missed.
    pub fn start(&self) {
        let mut state = self.shared.lock();
        state.up = true;
        state.expire(Instant::now());
        state.catch_up();
        drop(state);
        self.shared.bump();
    }

    pub fn is_up(&self) -> bool {
        self.shared.lock().up
    }
}

/// One connection to a [`Model`]: the [`Engine`] a replica uses. The connection closes, and
/// its subscriptions with it, when this and every watch and subscription made through it are
/// dropped.
pub struct ModelEngine {
    client: Arc<Client>,
}

impl std::fmt::Debug for ModelEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelEngine")
            .field("client", &self.client.id)
            .finish()
    }
}

impl ModelEngine {
    /// Cuts this client off from the engine (its connection closed, say by a partition): its
    /// operations fail with `Unavailable`, its subscriptions hear nothing and do not count as
    /// responders, and its watches fall behind, until [`ModelEngine::reconnect`].
    pub fn cut_off(&self) {
        self.client.set_connected(false);
    }

    /// Ends [`ModelEngine::cut_off`]: subscriptions carry on, and watches catch up.
    pub fn reconnect(&self) {
        self.client.set_connected(true);
    }
}

struct Shared {
    state: Mutex<State>,
    /// Bumped on every change a watch may be waiting for.
    changed: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock fails a test already; the state stays usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }
}

/// A connection; it leaves the engine, with its subscriptions, when the last handle goes.
struct Client {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.clients.remove(&self.id);
        let id = self.id;
        state.subs.retain(|_, s| s.client != id);
    }
}

struct State {
    up: bool,
    buckets: BTreeMap<String, Bucket>,
    clients: BTreeMap<u64, ClientState>,
    subs: BTreeMap<u64, Sub>,
    watches: BTreeMap<u64, WatchState>,
    next_id: u64,
}

struct ClientState {
    name: String,
    connected: bool,
}

struct Bucket {
    max_age: Option<Duration>,
    /// The last revision given.
    last: Revision,
    /// The kept writes, by revision: the latest per key.
    log: BTreeMap<Revision, Write>,
    /// Each key's latest write.
    latest: BTreeMap<String, Revision>,
}

#[derive(Clone)]
struct Write {
    key: String,
    kind: WriteKind,
    /// When it was written; it expires `max_age` later.
    at: Instant,
}

#[derive(Clone)]
enum WriteKind {
    Value(Bytes),
    Deleted,
    Expired,
}

struct Sub {
    client: u64,
    pattern: String,
    to: SubTarget,
}

enum SubTarget {
    Stream(mpsc::UnboundedSender<Incoming>),
    /// A request's inbox: the first answer, once.
    Reply(Option<oneshot::Sender<Bytes>>),
}

struct WatchState {
    client: u64,
    bucket: String,
    filter: String,
    /// Pushed, not yet read.
    queue: VecDeque<Change>,
    /// The last revision pushed.
    last: Revision,
    /// Whether a write was missed while the client was cut off.
    behind: bool,
}

impl State {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn reachable(&self, client: u64) -> Result<(), EngineError> {
        if !self.up {
            return Err(EngineError::Unavailable("the engine is down".into()));
        }
        match self.clients.get(&client) {
            Some(c) if c.connected => Ok(()),
            Some(c) => Err(EngineError::Unavailable(format!(
                "{} is cut off from the engine",
                c.name
            ))),
            None => Err(EngineError::Unavailable("the connection is closed".into())),
        }
    }

    fn connected(&self, client: u64) -> bool {
        self.up && self.clients.get(&client).is_some_and(|c| c.connected)
    }

    fn bucket(&mut self, name: &str) -> Result<&mut Bucket, EngineError> {
        self.buckets
            .get_mut(name)
            .ok_or_else(|| EngineError::BucketNotFound(name.to_owned()))
    }

    /// Appends a write to a bucket and pushes it to the watches; its revision.
    fn append(&mut self, bucket: &str, key: &str, kind: WriteKind, at: Instant) -> Revision {
        let b = self.buckets.get_mut(bucket).expect("checked by the caller");
        let revision = b.append(key, kind, at);
        let change = change(revision, &b.log[&revision]);
        self.push(bucket, change);
        revision
    }

    /// Pushes a write to the watches of its bucket that match it: to the queue of those whose
    /// client is connected; the others will catch up.
    fn push(&mut self, bucket: &str, change: Change) {
        let up = self.up;
        let clients = &self.clients;
        for w in self.watches.values_mut() {
            if w.bucket != bucket || !subject_matches(&w.filter, &change.key) {
                continue;
            }
            if up && clients.get(&w.client).is_some_and(|c| c.connected) {
                w.last = change.revision;
                w.queue.push_back(change.clone());
            } else {
                w.behind = true;
            }
        }
    }

    /// Brings every watch that fell behind and whose client is connected up to date from the
    /// log: the kept writes after the last it had.
    fn catch_up(&mut self) {
        let up = self.up;
        let clients = &self.clients;
        for w in self.watches.values_mut() {
            if !(w.behind && up && clients.get(&w.client).is_some_and(|c| c.connected)) {
                continue;
            }
            w.behind = false;
            if let Some(bucket) = self.buckets.get(&w.bucket) {
                for (&revision, write) in bucket.log.range(w.last + 1..) {
                    if subject_matches(&w.filter, &write.key) {
                        w.last = revision;
                        w.queue.push_back(change(revision, write));
                    }
                }
            }
        }
    }

    /// Applies every expiry due by `now`, in the order they fell due; whether any was.
    fn expire(&mut self, now: Instant) -> bool {
        let names: Vec<String> = self.buckets.keys().cloned().collect();
        let mut any = false;
        for name in names {
            while let Some((revision, write)) = self.buckets[&name].due(now) {
                any = true;
                let b = self.buckets.get_mut(&name).expect("listed above");
                b.log.remove(&revision);
                b.latest.remove(&write.key);
                // A value or a delete that ages out leaves a marker, placed when it fell due; a
                // marker goes silently.
                if !matches!(write.kind, WriteKind::Expired) {
                    let at = b.expires_at(&write).expect("it expired");
                    self.append(&name, &write.key, WriteKind::Expired, at);
                }
            }
        }
        any
    }

    /// Delivers `payload` on `subject` to every reachable subscriber; how many got it.
    fn deliver(&mut self, subject: &str, payload: &Bytes, reply: Option<&str>) -> usize {
        let reachable: Vec<u64> = self
            .subs
            .iter()
            .filter(|(_, s)| subject_matches(&s.pattern, subject) && self.connected(s.client))
            .map(|(id, _)| *id)
            .collect();
        let mut delivered = 0;
        for id in reachable {
            let Some(sub) = self.subs.get_mut(&id) else {
                continue;
            };
            let got = match &mut sub.to {
                SubTarget::Stream(tx) => tx
                    .send(Incoming {
                        subject: subject.to_owned(),
                        payload: payload.clone(),
                        reply: reply.map(str::to_owned),
                    })
                    .is_ok(),
                SubTarget::Reply(tx) => {
                    tx.take().is_some_and(|tx| tx.send(payload.clone()).is_ok())
                }
            };
            delivered += usize::from(got);
        }
        delivered
    }
}

impl Bucket {
    fn new(max_age: Option<Duration>) -> Bucket {
        Bucket {
            max_age,
            last: 0,
            log: BTreeMap::new(),
            latest: BTreeMap::new(),
        }
    }

    /// The revision of the key's latest kept write, 0 when none.
    fn current(&self, key: &str) -> Revision {
        self.latest.get(key).copied().unwrap_or(0)
    }

    fn latest(&self, key: &str) -> Option<(Revision, &Write)> {
        let revision = *self.latest.get(key)?;
        Some((revision, &self.log[&revision]))
    }

    /// Appends a write for `key`, dropping the key's previous one; its revision.
    fn append(&mut self, key: &str, kind: WriteKind, at: Instant) -> Revision {
        self.last += 1;
        let revision = self.last;
        if let Some(old) = self.latest.insert(key.to_owned(), revision) {
            self.log.remove(&old);
        }
        self.log.insert(
            revision,
            Write {
                key: key.to_owned(),
                kind,
                at,
            },
        );
        revision
    }

    fn expires_at(&self, write: &Write) -> Option<Instant> {
        self.max_age.map(|age| write.at + age)
    }

    /// The next instant an expiry falls due.
    fn next_expiry(&self) -> Option<Instant> {
        self.log.values().filter_map(|w| self.expires_at(w)).min()
    }

    /// The write due to expire first by `now`, the lowest revision first among equals (NATS
    /// expires in sequence order).
    fn due(&self, now: Instant) -> Option<(Revision, Write)> {
        self.log
            .iter()
            .filter_map(|(r, w)| Some((self.expires_at(w)?, *r)))
            .filter(|(at, _)| *at <= now)
            .min()
            .map(|(_, r)| (r, self.log[&r].clone()))
    }
}

fn change(revision: Revision, write: &Write) -> Change {
    Change {
        key: write.key.clone(),
        revision,
        kind: match &write.kind {
            WriteKind::Value(value) => ChangeKind::Put(value.clone()),
            WriteKind::Deleted => ChangeKind::Deleted,
            WriteKind::Expired => ChangeKind::Expired,
        },
    }
}

/// A watch's reading end; dropping it removes the watch.
struct WatchReader {
    client: Arc<Client>,
    id: u64,
    bucket: String,
    changed: watch::Receiver<u64>,
}

impl WatchReader {
    async fn next(&mut self) -> Option<Change> {
        loop {
            self.changed.borrow_and_update();
            let next_expiry = {
                let mut state = self.client.shared.lock();
                // Expiry is the engine's: it goes on while this client is cut off.
                if state.up && state.expire(Instant::now()) {
                    self.client.shared.bump();
                }
                if let Some(change) = state.watches.get_mut(&self.id)?.queue.pop_front() {
                    return Some(change);
                }
                match state.up {
                    true => state.buckets.get(&self.bucket)?.next_expiry(),
                    false => None,
                }
            };
            tokio::select! {
                changed = self.changed.changed() => changed.ok()?,
                () = sleep_until(next_expiry) => {}
            }
        }
    }
}

impl Drop for WatchReader {
    fn drop(&mut self) {
        self.client.shared.lock().watches.remove(&self.id);
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Removes a subscription or a request's inbox when dropped.
struct SubGuard {
    client: Arc<Client>,
    id: u64,
}

impl Drop for SubGuard {
    fn drop(&mut self) {
        self.client.shared.lock().subs.remove(&self.id);
    }
}

impl Client {
    /// Locks the state once this client can reach the engine, with expiries applied.
    fn reach(&self) -> Result<MutexGuard<'_, State>, EngineError> {
        let mut state = self.shared.lock();
        state.reachable(self.id)?;
        if state.expire(Instant::now()) {
            self.shared.bump();
        }
        Ok(state)
    }

    fn set_connected(&self, connected: bool) {
        let mut state = self.shared.lock();
        if let Some(c) = state.clients.get_mut(&self.id) {
            c.connected = connected;
        }
        if connected && state.up {
            state.expire(Instant::now());
            state.catch_up();
        }
        drop(state);
        self.shared.bump();
    }

    fn ensure_bucket(&self, config: BucketConfig) -> Result<(), EngineError> {
        config.validate()?;
        let mut state = self.reach()?;
        match state.buckets.get_mut(&config.name) {
            Some(bucket) if bucket.max_age.is_some() && config.max_age.is_none() => {
                return Err(EngineError::Other(format!(
                    "bucket {}: its limit markers cannot be turned off",
                    config.name
                )))
            }
            Some(bucket) => bucket.max_age = config.max_age,
            None => {
                state
                    .buckets
                    .insert(config.name, Bucket::new(config.max_age));
            }
        }
        drop(state);
        self.shared.bump();
        Ok(())
    }

    fn get(&self, bucket: &str, key: &str) -> Result<Option<Entry>, EngineError> {
        check_bucket(bucket)?;
        check_key(key)?;
        let mut state = self.reach()?;
        let bucket = state.bucket(bucket)?;
        Ok(bucket
            .latest(key)
            .and_then(|(revision, write)| match &write.kind {
                WriteKind::Value(value) => Some(Entry {
                    key: key.to_owned(),
                    value: value.clone(),
                    revision,
                }),
                WriteKind::Deleted | WriteKind::Expired => None,
            }))
    }

    /// Appends `kind` for `key` if `allowed` says so, given the bucket.
    fn write(
        &self,
        bucket: &str,
        key: &str,
        kind: WriteKind,
        allowed: impl FnOnce(&Bucket) -> Result<(), EngineError>,
    ) -> Result<Revision, EngineError> {
        check_bucket(bucket)?;
        check_key(key)?;
        let mut state = self.reach()?;
        allowed(state.bucket(bucket)?)?;
        let revision = state.append(bucket, key, kind, Instant::now());
        drop(state);
        self.shared.bump();
        Ok(revision)
    }

    fn watch(self: &Arc<Self>, bucket: &str, filter: &str) -> Result<Watch, EngineError> {
        check_bucket(bucket)?;
        check_key_filter(filter)?;
        let mut state = self.reach()?;
        let kept = &state.bucket(bucket)?.log;
        // The kept writes that match, as the consumer's first deliveries.
        let queue: VecDeque<Change> = kept
            .iter()
            .filter(|(_, w)| subject_matches(filter, &w.key))
            .map(|(&r, w)| change(r, w))
            .collect();
        let id = state.next_id();
        state.watches.insert(
            id,
            WatchState {
                client: self.id,
                bucket: bucket.to_owned(),
                filter: filter.to_owned(),
                last: queue.back().map_or(0, |c| c.revision),
                queue,
                behind: false,
            },
        );
        drop(state);
        let reader = WatchReader {
            client: self.clone(),
            id,
            bucket: bucket.to_owned(),
            changed: self.shared.changed.subscribe(),
        };
        Ok(Watch::new(futures_util::stream::unfold(
            reader,
            |mut reader| async move {
                let change = reader.next().await?;
                Some((change, reader))
            },
        )))
    }

    fn publish(&self, subject: &str, payload: Bytes) -> Result<(), EngineError> {
        check_subject(subject)?;
        self.reach()?.deliver(subject, &payload, None);
        Ok(())
    }

    async fn request(
        self: Arc<Self>,
        subject: String,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, EngineError> {
        check_subject(&subject)?;
        let (answer, _inbox) = {
            let mut state = self.reach()?;
            let id = state.next_id();
            let inbox = format!("_INBOX.m{}.{id}", self.id);
            let (tx, rx) = oneshot::channel();
            state.subs.insert(
                id,
                Sub {
                    client: self.id,
                    pattern: inbox.clone(),
                    to: SubTarget::Reply(Some(tx)),
                },
            );
            if state.deliver(&subject, &payload, Some(&inbox)) == 0 {
                state.subs.remove(&id);
                return Err(EngineError::NoResponders(subject));
            }
            drop(state);
            let guard = SubGuard {
                client: self.clone(),
                id,
            };
            (rx, guard)
        };
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(payload)) => Ok(payload),
            // The inbox went with the connection, after the request went out: not
            // `Unavailable`, which says nothing was sent.
            Ok(Err(_)) => Err(EngineError::Other(
                "the connection closed before the answer".into(),
            )),
            Err(_) => Err(EngineError::Timeout),
        }
    }

    fn subscribe(self: &Arc<Self>, pattern: &str) -> Result<Subscription, EngineError> {
        check_subject_pattern(pattern)?;
        let mut state = self.reach()?;
        let id = state.next_id();
        let (tx, rx) = mpsc::unbounded_channel();
        state.subs.insert(
            id,
            Sub {
                client: self.id,
                pattern: pattern.to_owned(),
                to: SubTarget::Stream(tx),
            },
        );
        drop(state);
        let guard = SubGuard {
            client: self.clone(),
            id,
        };
        Ok(Subscription::new(futures_util::stream::unfold(
            (rx, guard),
            |(mut rx, guard)| async move {
                let message = rx.recv().await?;
                Some((message, (rx, guard)))
            },
        )))
    }
}

/// A compare-and-set's check: the key's latest write is at `expected` (0: none).
fn expect(bucket: &Bucket, key: &str, expected: Option<Revision>) -> Result<(), EngineError> {
    match expected {
        Some(expected) if bucket.current(key) != expected => Err(EngineError::Conflict {
            current_revision: bucket.current(key),
        }),
        _ => Ok(()),
    }
}

/// Each operation runs when its future is first polled, as NATS's is sent then.
impl Store for ModelEngine {
    fn ensure_bucket(&self, config: BucketConfig) -> BoxFuture<'static, Result<(), EngineError>> {
        let client = self.client.clone();
        Box::pin(async move { client.ensure_bucket(config) })
    }

    fn get(
        &self,
        bucket: &str,
        key: &str,
    ) -> BoxFuture<'static, Result<Option<Entry>, EngineError>> {
        let (client, bucket, key) = (self.client.clone(), bucket.to_owned(), key.to_owned());
        Box::pin(async move { client.get(&bucket, &key) })
    }

    fn create(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let (client, bucket, key) = (self.client.clone(), bucket.to_owned(), key.to_owned());
        Box::pin(async move {
            // Over nothing, a deletion or an expiry; not over a value.
            client.write(&bucket, &key, WriteKind::Value(value), |b| {
                match b.latest(&key) {
                    Some((current_revision, w)) if matches!(w.kind, WriteKind::Value(_)) => {
                        Err(EngineError::Conflict { current_revision })
                    }
                    _ => Ok(()),
                }
            })
        })
    }

    fn put(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let (client, bucket, key) = (self.client.clone(), bucket.to_owned(), key.to_owned());
        Box::pin(async move { client.write(&bucket, &key, WriteKind::Value(value), |_| Ok(())) })
    }

    fn update(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let (client, bucket, key) = (self.client.clone(), bucket.to_owned(), key.to_owned());
        Box::pin(async move {
            client.write(&bucket, &key, WriteKind::Value(value), |b| {
                expect(b, &key, Some(expected))
            })
        })
    }

    fn delete(
        &self,
        bucket: &str,
        key: &str,
        expected: Option<Revision>,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let (client, bucket, key) = (self.client.clone(), bucket.to_owned(), key.to_owned());
        Box::pin(async move {
            client.write(&bucket, &key, WriteKind::Deleted, |b| {
                expect(b, &key, expected)
            })
        })
    }

    fn watch(&self, bucket: &str, filter: &str) -> BoxFuture<'static, Result<Watch, EngineError>> {
        let (client, bucket, filter) = (self.client.clone(), bucket.to_owned(), filter.to_owned());
        Box::pin(async move { client.watch(&bucket, &filter) })
    }
}

impl Engine for ModelEngine {
    fn publish(
        &self,
        subject: &str,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let (client, subject) = (self.client.clone(), subject.to_owned());
        Box::pin(async move { client.publish(&subject, payload) })
    }

    fn request(
        &self,
        subject: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Bytes, EngineError>> {
        Box::pin(
            self.client
                .clone()
                .request(subject.to_owned(), payload, timeout),
        )
    }

    fn subscribe(&self, subject: &str) -> BoxFuture<'static, Result<Subscription, EngineError>> {
        let (client, subject) = (self.client.clone(), subject.to_owned());
        Box::pin(async move { client.subscribe(&subject) })
    }
}
