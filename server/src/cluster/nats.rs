//! [`Engine`] on NATS, through the official `async-nats` client: each bucket is a JetStream
//! key/value bucket (history 1, file storage; with a `max_age`, *limit markers*, so an expiry is
//! a write that watchers see), and requests, subscriptions and publishes are core NATS.
//!
//! Nothing here runs unless a gateway is configured for a cluster: [`NatsEngine::connect`]
//! opens the connection, whose reader, writer and reconnects are tokio tasks of the client's
//! (no threads). The client reconnects on its own for ever; while it is not connected every
//! operation fails at once with [`EngineError::Unavailable`], and on reconnecting it resumes
//! subscriptions and watches.
//!
//! The server should run JetStream with `sync_interval: always`: with the default lazy fsync,
//! acknowledged writes can be lost when the server's machine fails.

use std::collections::HashMap;
use std::error::Error as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::{self, context::PublishErrorKind, kv};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::StreamExt;

pub use super::nats_auth::NatsAuth;
use super::{
    check_bucket, check_key, check_key_filter, check_subject, check_subject_pattern, BucketConfig,
    Change, ChangeKind, Engine, EngineError, Entry, Incoming, Revision, Store, Subscription, Watch,
};

/// How to reach NATS. Its `Debug` shows no secret.
#[derive(Debug, Clone)]
pub struct NatsOptions {
    /// `nats://host:port` (several, comma-separated, for a NATS cluster); `tls://` demands
    /// TLS. Credentials do not go here but in [`NatsOptions::auth`].
    pub url: String,
    /// The connection's name, as the server's monitoring shows it (the replica's name).
    pub name: String,
    /// How the connection authenticates, and whether it must be TLS.
    pub auth: NatsAuth,
    /// The prefix of the client's reply subjects (its requests', JetStream's answers and its
    /// watches' deliveries); `None`: the client's default, `_INBOX`. A replica uses
    /// [`replica_inbox_prefix`], so that the server's permissions can let each replica
    /// subscribe to its own replies only.
    pub inbox_prefix: Option<String>,
    /// How long a key/value operation waits for JetStream's answer before it fails with
    /// [`EngineError::Unavailable`].
    pub op_timeout: Duration,
    /// How often the client pings the server when idle. A connection that dies silently (a
    /// partition, not a closed socket) is noticed when a third ping is due with two unanswered,
    /// about three intervals in; until then operations fail only by their timeouts.
    pub ping_interval: Duration,
}

impl NatsOptions {
    pub fn new(url: impl Into<String>, name: impl Into<String>) -> NatsOptions {
        NatsOptions {
            url: url.into(),
            name: name.into(),
            auth: NatsAuth::default(),
            inbox_prefix: None,
            op_timeout: Duration::from_secs(5),
            ping_interval: Duration::from_secs(10),
        }
    }
}

/// The prefix of replica `replica`'s reply subjects in cluster `namespace`:
/// `_INBOX.<namespace>.<replica>` (see `examples/nats-server.conf`, which lets each replica
/// subscribe under its own prefix only).
pub fn replica_inbox_prefix(namespace: &str, replica: &str) -> String {
    format!("_INBOX.{namespace}.{replica}")
}

/// The engine on a NATS server; cheap to clone (one connection).
#[derive(Clone)]
pub struct NatsEngine {
    client: async_nats::Client,
    js: jetstream::Context,
    /// Opened buckets, by name (opening one is a round trip).
    stores: Arc<Mutex<HashMap<String, kv::Store>>>,
    /// The permission refusals the server sent.
    refusals: Refusals,
}

impl std::fmt::Debug for NatsEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsEngine")
            .field("state", &self.client.connection_state())
            .finish()
    }
}

impl NatsEngine {
    /// Connects, or fails with [`EngineError::Unavailable`] when the server cannot be reached
    /// now, and with [`EngineError::Other`] when it refuses this client (its credentials, TLS,
    /// or the permissions of its NATS user); the message says what to check and holds no
    /// secret. Once connected, the client reconnects by itself whenever the connection drops.
    pub async fn connect(opts: NatsOptions) -> Result<NatsEngine, EngineError> {
        let name = opts.name.clone();
        let refusals = Refusals::default();
        let heard = refusals.clone();
        let mut options = async_nats::ConnectOptions::new();
        if let Some(prefix) = &opts.inbox_prefix {
            options = options.custom_inbox_prefix(prefix);
        }
        let client = opts
            .auth
            .apply(options)
            .map_err(EngineError::Invalid)?
            .name(&opts.name)
            .connection_timeout(opts.op_timeout)
            .ping_interval(opts.ping_interval)
            .event_callback(move |event| {
                let (name, heard) = (name.clone(), heard.clone());
                async move {
                    match event {
                        async_nats::Event::Connected => {
                            tracing::info!(replica = %name, "connected to the cluster engine")
                        }
                        async_nats::Event::Disconnected => {
                            tracing::warn!(replica = %name, "lost the cluster engine; reconnecting")
                        }
                        async_nats::Event::ServerError(async_nats::ServerError::Other(e))
                            if e.contains(PERMISSIONS_VIOLATION) =>
                        {
                            tracing::error!(
                                replica = %name,
                                refused = %e,
                                "NATS refused this replica a subject it needs: the permissions of \
                                 the NATS user it logs in as must be those of replica {name} (see \
                                 examples/nats-server.conf)"
                            );
                            heard.hear(e);
                        }
                        other => tracing::info!(replica = %name, event = %other, "cluster engine"),
                    }
                }
            })
            .connect(opts.url.split(',').map(str::trim).collect::<Vec<_>>())
            .await
            .map_err(|e| connect_error(&e, &opts.auth))?;
        let mut js = jetstream::new(client.clone());
        js.set_timeout(opts.op_timeout);
        let engine = NatsEngine {
            client,
            js,
            stores: Arc::new(Mutex::new(HashMap::new())),
            refusals,
        };
        // A first round trip through JetStream: it proves that this client may receive its
        // replies (a NATS user whose permissions are another replica's may not) and that its
        // account has JetStream.
        let js = engine.js.clone();
        let asked = js.query_account();
        tokio::pin!(asked);
        let answer = loop {
            tokio::select! {
                answer = &mut asked => break answer,
                () = tokio::time::sleep(Duration::from_millis(10)) => {
                    if let Some(refused) = engine.refusals.any() {
                        return Err(refused_error(&refused, &opts.name));
                    }
                }
            }
        };
        match answer {
            Ok(_) => Ok(engine),
            Err(e) => match engine.refusals.any() {
                Some(refused) => Err(refused_error(&refused, &opts.name)),
                None if matches!(
                    e.kind(),
                    jetstream::context::AccountErrorKind::JetStreamUnavailable
                ) || e.to_string().contains("not enabled") =>
                {
                    Err(EngineError::Other(format!(
                        "JetStream is not enabled for this replica's NATS account ({e}): the \
                         cluster keeps its state in JetStream (see examples/nats-server.conf)"
                    )))
                }
                None => Err(EngineError::Unavailable(format!(
                    "JetStream did not answer: {e}"
                ))),
            },
        }
    }

    /// Whether the connection is up now.
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == State::Connected
    }

    fn connected(&self) -> Result<(), EngineError> {
        match self.client.connection_state() {
            State::Connected => Ok(()),
            state => Err(EngineError::Unavailable(format!("connection {state}"))),
        }
    }

    /// The bucket's handle, opened on first use.
    async fn store(&self, bucket: &str) -> Result<kv::Store, EngineError> {
        if let Some(store) = self.lock_stores().get(bucket) {
            return Ok(store.clone());
        }
        let store = self
            .js
            .get_key_value(bucket)
            .await
            .map_err(|e| open_error(bucket, &e))?;
        self.lock_stores().insert(bucket.to_owned(), store.clone());
        Ok(store)
    }

    fn lock_stores(&self) -> std::sync::MutexGuard<'_, HashMap<String, kv::Store>> {
        // The map holds no invariant a panic could break halfway.
        self.stores.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The key's latest write, value or marker.
    async fn last(&self, bucket: &str, key: &str) -> Result<Option<kv::Entry>, EngineError> {
        let store = self.store(bucket).await?;
        store.entry(key).await.map_err(|e| match e.kind() {
            kv::EntryErrorKind::TimedOut => EngineError::Unavailable(e.to_string()),
            _ => EngineError::Other(e.to_string()),
        })
    }

    /// Appends a write for `key`: a value, or with `delete` a delete marker; with `expected`,
    /// only if the key's latest write is at that revision.
    async fn write(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
        expected: Option<Revision>,
        delete: bool,
    ) -> Result<Revision, EngineError> {
        let mut headers = async_nats::HeaderMap::new();
        if let Some(expected) = expected {
            headers.insert(
                async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                async_nats::HeaderValue::from(expected),
            );
        }
        if delete {
            headers.insert("KV-Operation", "DEL");
        }
        let subject = format!("$KV.{bucket}.{key}");
        let acked = match self.js.publish_with_headers(subject, headers, value).await {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(ack) => Ok(ack.sequence),
            Err(e) => match e.kind() {
                PublishErrorKind::WrongLastSequence => {
                    let current_revision = match server_current_revision(&e) {
                        Some(r) => r,
                        // The server's message names it; should it ever not, read it.
                        None => self
                            .last(bucket, key)
                            .await?
                            .map(|entry| entry.revision)
                            .unwrap_or(0),
                    };
                    Err(EngineError::Conflict { current_revision })
                }
                PublishErrorKind::StreamNotFound => {
                    Err(EngineError::BucketNotFound(bucket.to_owned()))
                }
                PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
                    Err(EngineError::Unavailable(e.to_string()))
                }
                _ => Err(EngineError::Other(e.to_string())),
            },
        }
    }

    async fn create_inner(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
    ) -> Result<Revision, EngineError> {
        // A key may be created over its delete or expiry marker: expect that marker. Two rounds
        // settle it unless others keep writing the key, and then the conflict is real.
        let mut expected = 0;
        for _ in 0..3 {
            match self
                .write(bucket, key, value.clone(), Some(expected), false)
                .await
            {
                // Against a value, the conflict is real; against a marker (or nothing, if the
                // marker has just gone), try again expecting what is there now.
                Err(EngineError::Conflict { .. }) => match self.last(bucket, key).await? {
                    Some(e) if e.operation == kv::Operation::Put => {
                        return Err(EngineError::Conflict {
                            current_revision: e.revision,
                        })
                    }
                    Some(marker) => expected = marker.revision,
                    None => expected = 0,
                },
                done => return done,
            }
        }
        let current_revision = self.last(bucket, key).await?.map_or(0, |e| e.revision);
        Err(EngineError::Conflict { current_revision })
    }
}

impl Store for NatsEngine {
    fn ensure_bucket(&self, config: BucketConfig) -> BoxFuture<'static, Result<(), EngineError>> {
        let this = self.clone();
        Box::pin(async move {
            config.validate()?;
            this.connected()?;
            let kv_config = kv::Config {
                bucket: config.name.clone(),
                history: 1,
                max_age: config.max_age.unwrap_or_default(),
                max_bytes: -1,
                max_value_size: -1,
                storage: jetstream::stream::StorageType::File,
                num_replicas: 1,
                // An expiry leaves a marker that watchers see, itself kept for `max_age`.
                limit_markers: config.max_age,
                ..Default::default()
            };
            let store = this
                .js
                .create_or_update_key_value(kv_config)
                .await
                .map_err(|e| match e.kind() {
                    jetstream::context::CreateKeyValueErrorKind::TimedOut => {
                        EngineError::Unavailable(e.to_string())
                    }
                    _ => EngineError::Other(e.to_string()),
                })?;
            this.lock_stores().insert(config.name, store);
            Ok(())
        })
    }

    fn get(
        &self,
        bucket: &str,
        key: &str,
    ) -> BoxFuture<'static, Result<Option<Entry>, EngineError>> {
        let (this, bucket, key) = (self.clone(), bucket.to_owned(), key.to_owned());
        Box::pin(async move {
            check_bucket(&bucket)?;
            check_key(&key)?;
            this.connected()?;
            Ok(this.last(&bucket, &key).await?.and_then(|e| {
                (e.operation == kv::Operation::Put).then_some(Entry {
                    key: e.key,
                    value: e.value,
                    revision: e.revision,
                })
            }))
        })
    }

    fn create(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let (this, bucket, key) = (self.clone(), bucket.to_owned(), key.to_owned());
        Box::pin(async move {
            check_bucket(&bucket)?;
            check_key(&key)?;
            this.connected()?;
            this.create_inner(&bucket, &key, value).await
        })
    }

    fn put(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let (this, bucket, key) = (self.clone(), bucket.to_owned(), key.to_owned());
        Box::pin(async move {
            check_bucket(&bucket)?;
            check_key(&key)?;
            this.connected()?;
            this.write(&bucket, &key, value, None, false).await
        })
    }

    fn update(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let (this, bucket, key) = (self.clone(), bucket.to_owned(), key.to_owned());
        Box::pin(async move {
            check_bucket(&bucket)?;
            check_key(&key)?;
            this.connected()?;
            this.write(&bucket, &key, value, Some(expected), false)
                .await
        })
    }

    fn delete(
        &self,
        bucket: &str,
        key: &str,
        expected: Option<Revision>,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let (this, bucket, key) = (self.clone(), bucket.to_owned(), key.to_owned());
        Box::pin(async move {
            check_bucket(&bucket)?;
            check_key(&key)?;
            this.connected()?;
            this.write(&bucket, &key, Bytes::new(), expected, true)
                .await
        })
    }

    fn watch(&self, bucket: &str, filter: &str) -> BoxFuture<'static, Result<Watch, EngineError>> {
        let (this, bucket, filter) = (self.clone(), bucket.to_owned(), filter.to_owned());
        Box::pin(async move {
            check_bucket(&bucket)?;
            check_key_filter(&filter)?;
            this.connected()?;
            let store = this.store(&bucket).await?;
            // The latest write per key, then every new one: on a history-1 bucket, the stream.
            let entries = store
                .watch_with_history(&filter)
                .await
                .map_err(|e| match e.kind() {
                    kv::WatchErrorKind::TimedOut => EngineError::Unavailable(e.to_string()),
                    _ => EngineError::Other(e.to_string()),
                })?;
            // A task of its own polls the consumer all the time, as the server pushes: so it
            // sees a disconnection as it happens and re-makes itself from the last revision on
            // reconnecting (not polled, it would notice only by missed heartbeats, 10 s later).
            // It ends when the watch is dropped.
            let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
            tokio::spawn(forward_watch(bucket, entries, tx));
            let changes = futures_util::stream::unfold(rx, |mut rx| async move {
                let change = rx.recv().await?;
                Some((change, rx))
            });
            Ok(Watch::new(changes))
        })
    }
}

impl Engine for NatsEngine {
    fn publish(
        &self,
        subject: &str,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let (this, subject) = (self.clone(), subject.to_owned());
        Box::pin(async move {
            check_subject(&subject)?;
            this.connected()?;
            this.client
                .publish(subject, payload)
                .await
                .map_err(|e| EngineError::Unavailable(e.to_string()))
        })
    }

    fn request(
        &self,
        subject: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Bytes, EngineError>> {
        let (this, subject) = (self.clone(), subject.to_owned());
        Box::pin(async move {
            check_subject(&subject)?;
            this.connected()?;
            let request = async_nats::Request::new()
                .payload(payload)
                .timeout(Some(timeout));
            match this.client.send_request(subject.clone(), request).await {
                Ok(answer) => Ok(answer.payload),
                Err(e) => Err(match e.kind() {
                    async_nats::RequestErrorKind::NoResponders => {
                        EngineError::NoResponders(subject)
                    }
                    async_nats::RequestErrorKind::TimedOut => EngineError::Timeout,
                    async_nats::RequestErrorKind::InvalidSubject => {
                        EngineError::Invalid(format!("subject {subject:?}"))
                    }
                    // It may have gone out before the connection dropped.
                    _ => EngineError::Other(e.to_string()),
                }),
            }
        })
    }

    fn subscribe(&self, subject: &str) -> BoxFuture<'static, Result<Subscription, EngineError>> {
        let (this, subject) = (self.clone(), subject.to_owned());
        Box::pin(async move {
            check_subject_pattern(&subject)?;
            this.connected()?;
            let subscriber = this
                .client
                .subscribe(subject.clone())
                .await
                .map_err(|e| EngineError::Unavailable(e.to_string()))?;
            // The server reads a connection in order: once it has answered a request sent after
            // the subscription, it has the subscription, and a request sent after this returns
            // finds it, from any client of this server. (`flush` only writes the socket.)
            this.js.query_account().await.map_err(|e| {
                EngineError::Unavailable(format!("confirming the subscription: {e}"))
            })?;
            // The server refuses a subscription its permissions do not allow before it answers
            // the request above; the client hears of it as an event, a moment later.
            for _ in 0..10 {
                if let Some(refused) = this.refusals.of_subscription(&subject) {
                    return Err(EngineError::Other(format!(
                        "the NATS server refused the subscription to {subject}: {refused}"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Ok(Subscription::new(subscriber.map(|m| Incoming {
                subject: m.subject.to_string(),
                payload: m.payload,
                reply: m.reply.map(|r| r.to_string()),
            })))
        })
    }
}

/// What nats-server says when a client's permissions refuse a publish or a subscription.
const PERMISSIONS_VIOLATION: &str = "Permissions Violation";

/// The permission refusals the server sent this client (the latest few), which the client
/// hears only as events.
#[derive(Clone, Default)]
struct Refusals(Arc<Mutex<std::collections::VecDeque<String>>>);

impl Refusals {
    fn hear(&self, refusal: String) {
        let mut heard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if heard.len() == 16 {
            heard.pop_front();
        }
        heard.push_back(refusal);
    }

    fn any(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .back()
            .cloned()
    }

    /// The refusal of a subscription to exactly `subject`, if one was heard.
    fn of_subscription(&self, subject: &str) -> Option<String> {
        let quoted = format!("Subscription to \"{subject}\"");
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|r| r.contains(&quoted))
            .cloned()
    }
}

fn refused_error(refused: &str, replica: &str) -> EngineError {
    EngineError::Other(format!(
        "the NATS server refused this replica a subject it needs ({refused}): the NATS user it \
         logs in as (its client certificate's name, --nats-user, or its nkey or creds) must have \
         the permissions of replica {replica:?}; check --replica against the server's \
         configuration (see examples/nats-server.conf)"
    ))
}

/// Why the first connection failed, with what to check: the server refused the credentials,
/// TLS failed, or it cannot be reached. (The client's errors hold the server's reason and
/// TLS's, never the credentials.)
fn connect_error(e: &async_nats::ConnectError, auth: &NatsAuth) -> EngineError {
    use async_nats::ConnectErrorKind as Kind;
    let mut why = e.to_string();
    if let Some(source) = e.source() {
        let source = source.to_string();
        if !why.contains(&source) {
            why = format!("{why}: {source}");
        }
    }
    let refused = |hint: &str| EngineError::Other(format!("{why}; {hint}"));
    if matches!(
        e.kind(),
        Kind::AuthorizationViolation | Kind::Authentication
    ) {
        return match &auth.credentials {
            None if auth.tls.client.is_none() => refused(
                "the NATS server wants credentials and none were given: see --nats-user with \
                 --nats-password-file, --nats-token-file, --nats-nkey-seed-file, --nats-creds, \
                 or --nats-client-cert with --nats-client-key",
            ),
            _ => refused(&format!(
                "the NATS server refused {}: check them against its configuration",
                auth.describe()
            )),
        };
    }
    // TLS fails as the client's TLS error, or as an I/O error carrying rustls's: its own
    // verdict on the server's certificate ("invalid peer certificate: …"), or the server's
    // alert about this client's ("received fatal alert: …").
    let tls_hint = if why.contains("invalid peer certificate: UnknownIssuer") {
        Some(
            "the NATS server's certificate is not signed by a CA this replica trusts: give that \
             CA with --nats-ca-file",
        )
    } else if why.contains("NotValidForName") {
        Some("the NATS server's certificate does not name the host of the --cluster URL")
    } else if why.contains("alert: CertificateRequired") {
        Some(
            "the NATS server admits only clients with a certificate it trusts: give this \
             replica's with --nats-client-cert and --nats-client-key",
        )
    } else if why.contains("alert: BadCertificate")
        || why.contains("alert: UnknownCA")
        || why.contains("alert: CertificateUnknown")
    {
        Some(
            "the NATS server does not accept this replica's client certificate \
             (--nats-client-cert): it must be signed by the CA the server trusts for clients",
        )
    } else if why.contains("InvalidContentType") || why.contains("corrupt message") {
        Some(
            "the NATS server does not speak TLS, and this replica requires it: nothing was sent \
             in clear",
        )
    } else if e.kind() == Kind::Tls || why.contains("HandshakeFailure") || why.contains("alert:") {
        Some("TLS with the NATS server failed")
    } else {
        None
    };
    match tls_hint {
        Some(hint) => refused(hint),
        None => EngineError::Unavailable(why),
    }
}

/// How many changes a watch holds that its reader has not taken.
const WATCH_BUFFER: usize = 256;

/// Turns the key/value watch's entries into changes for `tx`, until its receiver is dropped.
async fn forward_watch(
    bucket: String,
    mut entries: kv::Watch,
    tx: tokio::sync::mpsc::Sender<Change>,
) {
    loop {
        let next = tokio::select! {
            () = tx.closed() => return,
            next = entries.next() => next,
        };
        match next {
            None => return,
            Some(Ok(e)) => {
                let kind = match e.operation {
                    kv::Operation::Put => ChangeKind::Put(e.value),
                    kv::Operation::Delete => ChangeKind::Deleted,
                    // The server's `MaxAge` marker; the gateway never purges.
                    kv::Operation::Purge => ChangeKind::Expired,
                };
                let change = Change {
                    key: e.key,
                    revision: e.revision,
                    kind,
                };
                if tx.send(change).await.is_err() {
                    return;
                }
            }
            // The ordered consumer recovers by itself (it is re-made from the last revision
            // seen); pause so that a lasting fault does not spin.
            Some(Err(e)) => {
                tracing::debug!(%bucket, error = %e, "watch interrupted; resuming");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The revision a refused compare-and-set met, from JetStream's error ("wrong last sequence:
/// 7", error code 10071).
fn server_current_revision(e: &jetstream::context::PublishError) -> Option<Revision> {
    let text = e.to_string();
    let (_, after) = text.rsplit_once("wrong last sequence: ")?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Why a bucket could not be opened: its stream does not exist (JetStream error 10059), or
/// JetStream did not answer.
fn open_error(bucket: &str, e: &jetstream::context::KeyValueError) -> EngineError {
    use jetstream::context::{GetStreamError, GetStreamErrorKind};
    let cause = e
        .source()
        .and_then(|s| s.downcast_ref::<GetStreamError>())
        .map(|s| s.kind());
    match cause {
        Some(GetStreamErrorKind::JetStream(js))
            if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
        {
            EngineError::BucketNotFound(bucket.to_owned())
        }
        Some(GetStreamErrorKind::Request) => EngineError::Unavailable(e.to_string()),
        _ => EngineError::Other(e.to_string()),
    }
}
