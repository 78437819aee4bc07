//! The embedded engine of the store ([`super::Store`]): one redb file, `state.redb`, in the
//! gateway's state directory. It keeps the store's contract (`super`'s docs) on one machine:
//!
//! - **Durable acknowledgements, with group commit.** One writer task takes every write. It
//!   gathers the writes waiting for it into one redb write transaction, commits it with
//!   [`Durability::Immediate`] (an fsync) on tokio's blocking pool, and only then answers each
//!   of them. A burst of writes costs one sync; no write is answered before its sync.
//! - **Revisions** are kept per bucket in the file, written in the same transaction as the
//!   write they number, so they never go back across a restart or a power cut.
//! - **Expiry** by a bucket's `max_age` is kept as wall-clock time in the file (each write
//!   records when it was made), so a restart neither shortens nor lengthens an age. The clock
//!   is read once, when the file is opened, and moved on by `tokio::time` from then on (as
//!   the OAuth resource server does), so under turmoil expiry follows simulated time. The
//!   writer applies the expiries that fell due before every batch, and wakes on a tokio timer
//!   for the next one, so watchers see [`ChangeKind::Expired`] on time; a read never sees a
//!   value past its age.
//! - **Watches** are fed by the writer from committed (synced) writes only. Each has a bounded
//!   queue; a watcher that lets it fill is marked behind and, once it has read what was
//!   queued, catches up from the file (the latest write of each key after the last revision
//!   it saw), so it may skip superseded revisions but never sees one out of order.
//!
//! Reads run on the blocking pool, a few at a time. Nothing here spawns a thread of its own.
//!
//! # The file
//!
//! Table `meta` (`format` = [`FORMAT`]: a file from a newer version is refused), table
//! `buckets` (per bucket: its last revision and its `max_age`), and one table `kv.<bucket>`
//! per bucket: per key, its latest write (revision, time, kind, value), deletions and expiry
//! markers included until they age out. The directory is made `0700` and the file `0600`
//! when they are created.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::redb::{
    Database, Durability, ReadableDatabase, ReadableTable, StorageBackend, TableDefinition,
    WriteTransaction,
};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use super::{
    check_bucket, check_key, check_key_filter, subject_matches, BucketConfig, Change, ChangeKind,
    EngineError, Entry, Revision, Store, Watch,
};

/// The version of the file's layout this gateway writes and reads.
pub const FORMAT: u64 = 1;

/// The state file's name in the state directory.
pub const STATE_FILE: &str = "state.redb";

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const BUCKETS: TableDefinition<&str, &[u8]> = TableDefinition::new("buckets");

/// The most writes committed in one transaction.
const MAX_BATCH: usize = 512;
/// The most changes waiting for one watcher before it is marked behind.
const WATCH_QUEUE: usize = 1024;
/// The most reads on the blocking pool at once.
const READS: usize = 8;
/// How long expiries wait after a transaction that could not be written.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// Why the state file could not be opened. Its message names the file.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("the state directory {path} cannot be made: {source}")]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the state file {path} is open in another process (another gateway on the same --state-dir?)")]
    InUse { path: String },
    #[error("the state file {path} was written by a newer version of the gateway (format {found}; this one reads format {FORMAT} and older); refusing to start")]
    Newer { path: String, found: u64 },
    #[error("the state file {path} cannot be used: {reason}; refusing to start with an empty state (move the file away to start afresh)")]
    Unreadable { path: String, reason: String },
}

/// Test-only switches (feature `planted-bugs`).
#[cfg(feature = "planted-bugs")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreBug {
    /// Writes are acknowledged once committed in memory (redb's [`Durability::None`]), before
    /// they are synced: a power cut loses acknowledged writes.
    AckBeforeDurable,
}

/// How [`RedbStore::open_with_backend`] opens the file.
#[derive(Debug, Clone, Default)]
pub struct RedbOptions {
    /// The wall-clock time at opening (`None`: the system's). Tests use it to open the file
    /// "later".
    pub wall_clock: Option<SystemTime>,
    /// A bug to plant.
    #[cfg(feature = "planted-bugs")]
    pub planted: Option<StoreBug>,
}

/// The embedded engine; see the module docs. Close it with [`RedbStore::close`] so that the
/// file is closed before the process ends (dropping it closes it too, a moment later).
pub struct RedbStore {
    shared: Arc<Shared>,
    ops: mpsc::UnboundedSender<Msg>,
    writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("file", &self.shared.name)
            .finish_non_exhaustive()
    }
}

struct Shared {
    /// The file, for messages.
    name: String,
    /// `None` once closed.
    db: Mutex<Option<Database>>,
    clock: Clock,
    reads: Semaphore,
    watchers: Mutex<Watchers>,
    durability: Durability,
}

impl Shared {
    fn db(&self) -> MutexGuard<'_, Option<Database>> {
        self.db.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn watchers(&self) -> MutexGuard<'_, Watchers> {
        self.watchers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn closed(&self) -> EngineError {
        EngineError::Unavailable(format!("the state file {} is closed", self.name))
    }

    fn io(&self, e: impl Into<::redb::Error>) -> EngineError {
        EngineError::Unavailable(format!("the state file {}: {}", self.name, e.into()))
    }
}

/// Wall-clock microseconds, read once and moved on by tokio's clock.
#[derive(Debug, Clone, Copy)]
struct Clock {
    wall_at_open: u64,
    at_open: Instant,
}

impl Clock {
    fn new(wall: Option<SystemTime>) -> Clock {
        let wall = wall.unwrap_or_else(SystemTime::now);
        Clock {
            wall_at_open: wall
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            at_open: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        let elapsed = u64::try_from(self.at_open.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.wall_at_open.saturating_add(elapsed)
    }

    /// The tokio instant at which the wall clock reads `micros`.
    fn instant_of(&self, micros: u64) -> Instant {
        self.at_open + Duration::from_micros(micros.saturating_sub(self.wall_at_open))
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

// ---- what the file holds ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Value,
    Deleted,
    Expired,
}

/// A key's latest write, as the bucket's table keeps it.
#[derive(Debug, Clone)]
struct Record {
    revision: Revision,
    /// When it was written (an expiry marker: when its write fell due), wall-clock µs.
    at: u64,
    kind: Kind,
    value: Bytes,
}

impl Record {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(17 + self.value.len());
        out.extend_from_slice(&self.revision.to_le_bytes());
        out.extend_from_slice(&self.at.to_le_bytes());
        out.push(match self.kind {
            Kind::Value => 0,
            Kind::Deleted => 1,
            Kind::Expired => 2,
        });
        out.extend_from_slice(&self.value);
        out
    }

    fn decode(bytes: &[u8]) -> Option<Record> {
        let revision = u64::from_le_bytes(bytes.get(0..8)?.try_into().ok()?);
        let at = u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?);
        let kind = match bytes.get(16)? {
            0 => Kind::Value,
            1 => Kind::Deleted,
            2 => Kind::Expired,
            _ => return None,
        };
        Some(Record {
            revision,
            at,
            kind,
            value: Bytes::copy_from_slice(&bytes[17..]),
        })
    }

    fn change(&self, key: &str) -> Change {
        Change {
            key: key.to_owned(),
            revision: self.revision,
            kind: match self.kind {
                Kind::Value => ChangeKind::Put(self.value.clone()),
                Kind::Deleted => ChangeKind::Deleted,
                Kind::Expired => ChangeKind::Expired,
            },
        }
    }
}

/// A bucket's settings and its last revision.
#[derive(Debug, Clone, Copy)]
struct BucketMeta {
    last: Revision,
    /// µs; 0: for ever.
    max_age: u64,
}

impl BucketMeta {
    fn encode(&self) -> [u8; 16] {
        let mut out = [0; 16];
        out[..8].copy_from_slice(&self.last.to_le_bytes());
        out[8..].copy_from_slice(&self.max_age.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<BucketMeta> {
        Some(BucketMeta {
            last: u64::from_le_bytes(bytes.get(0..8)?.try_into().ok()?),
            max_age: u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?),
        })
    }

    fn max_age(&self) -> Option<u64> {
        (self.max_age > 0).then_some(self.max_age)
    }
}

fn table_name(bucket: &str) -> String {
    format!("kv.{bucket}")
}

fn corrupt(name: &str, what: &str) -> EngineError {
    EngineError::Other(format!("the state file {name} holds an unreadable {what}"))
}

// ---- opening ----

impl RedbStore {
    /// Opens (or makes) `state.redb` in `dir`, making `dir` (mode `0700`) if it is missing.
    /// A file that is not a store, or one from a newer version, is refused, never replaced.
    pub async fn open(dir: &Path) -> Result<RedbStore, OpenError> {
        let dir = dir.to_owned();
        let path = dir.join(STATE_FILE);
        let name = path.display().to_string();
        let file = tokio::task::spawn_blocking(move || open_file(&dir, &path))
            .await
            .map_err(|e| OpenError::Unreadable {
                path: name.clone(),
                reason: e.to_string(),
            })??;
        Self::open_with_backend(
            ::redb::backends::FileBackend::new(file),
            name,
            RedbOptions::default(),
        )
        .await
    }

    /// Opens a store on `backend` (a file, or a test's simulated disk); `name` names it in
    /// messages.
    pub async fn open_with_backend(
        backend: impl StorageBackend,
        name: String,
        options: RedbOptions,
    ) -> Result<RedbStore, OpenError> {
        let clock = Clock::new(options.wall_clock);
        let opened = {
            let for_open = name.clone();
            tokio::task::spawn_blocking(move || open_db(backend, &for_open))
                .await
                .map_err(|e| OpenError::Unreadable {
                    path: name.clone(),
                    reason: e.to_string(),
                })??
        };
        let (db, index) = opened;
        #[allow(unused_mut)]
        let mut durability = Durability::Immediate;
        #[cfg(feature = "planted-bugs")]
        if options.planted == Some(StoreBug::AckBeforeDurable) {
            durability = Durability::None;
        }
        let shared = Arc::new(Shared {
            name,
            db: Mutex::new(Some(db)),
            clock,
            reads: Semaphore::new(READS),
            watchers: Mutex::new(Watchers::default()),
            durability,
        });
        let (ops, rx) = mpsc::unbounded_channel();
        let writer = tokio::spawn(run_writer(shared.clone(), rx, index));
        Ok(RedbStore {
            shared,
            ops,
            writer: Mutex::new(Some(writer)),
        })
    }

    /// The file, as messages name it.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Finishes the writes already handed over, ends every watch and closes the file; every
    /// operation after it fails `Unavailable`.
    pub async fn close(&self) {
        let (tx, rx) = oneshot::channel();
        if self.ops.send(Msg::Close(tx)).is_ok() {
            let _ = rx.await;
        }
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(writer) = writer {
            let _ = writer.await;
        }
    }

    /// Hands a write to the writer and waits for its answer.
    fn write(&self, op: Op) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let (shared, ops) = (self.shared.clone(), self.ops.clone());
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            ops.send(Msg::Op(op, tx)).map_err(|_| shared.closed())?;
            rx.await.map_err(|_| shared.closed())?
        })
    }
}

/// Makes the directory (0700) and opens the file (0600 when made).
fn open_file(dir: &Path, path: &Path) -> Result<std::fs::File, OpenError> {
    if !dir.is_dir() {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir).map_err(|source| OpenError::Directory {
            path: dir.to_owned(),
            source,
        })?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).map_err(|e| OpenError::Unreadable {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

/// Opens the database, checks (or writes) its format, and reads the expiry index.
fn open_db(backend: impl StorageBackend, name: &str) -> Result<(Database, Expiries), OpenError> {
    let unreadable = |e: &dyn std::fmt::Display| OpenError::Unreadable {
        path: name.to_owned(),
        reason: e.to_string(),
    };
    let repair_name = name.to_owned();
    // redb calls back with each step of one repair's progress: said once.
    let said = std::sync::Once::new();
    let db = Database::builder()
        .set_repair_callback(move |_| {
            said.call_once(|| {
                tracing::warn!(file = %repair_name, "the state file was not closed cleanly; checking and repairing it");
            });
        })
        .create_with_backend(backend)
        .map_err(|e| match e {
            ::redb::DatabaseError::DatabaseAlreadyOpen => OpenError::InUse {
                path: name.to_owned(),
            },
            e => unreadable(&e),
        })?;
    let tx = db.begin_write().map_err(|e| unreadable(&e))?;
    let index = {
        let mut meta = tx.open_table(META).map_err(|e| unreadable(&e))?;
        let found = meta
            .get("format")
            .map_err(|e| unreadable(&e))?
            .map(|g| g.value());
        match found {
            Some(found) if found > FORMAT => {
                return Err(OpenError::Newer {
                    path: name.to_owned(),
                    found,
                })
            }
            Some(_) => {}
            None => {
                meta.insert("format", FORMAT).map_err(|e| unreadable(&e))?;
            }
        }
        drop(meta);
        read_index(&tx, name).map_err(|e| unreadable(&e))?
    };
    tx.commit().map_err(|e| unreadable(&e))?;
    Ok((db, index))
}

/// The expiry of every key in a bucket with a `max_age`.
fn read_index(tx: &WriteTransaction, name: &str) -> Result<Expiries, EngineError> {
    let io = |e: ::redb::Error| EngineError::Other(format!("the state file {name}: {e}"));
    let mut index = Expiries::default();
    let buckets: Vec<(String, BucketMeta)> = {
        let table = tx.open_table(BUCKETS).map_err(|e| io(e.into()))?;
        let mut out = Vec::new();
        for row in table.iter().map_err(|e| io(e.into()))? {
            let (k, v) = row.map_err(|e| io(e.into()))?;
            let meta = BucketMeta::decode(v.value()).ok_or_else(|| corrupt(name, "bucket"))?;
            out.push((k.value().to_owned(), meta));
        }
        out
    };
    for (bucket, meta) in buckets {
        let Some(age) = meta.max_age() else { continue };
        let table_name = table_name(&bucket);
        let table = tx
            .open_table(TableDefinition::<&str, &[u8]>::new(&table_name))
            .map_err(|e| io(e.into()))?;
        for row in table.iter().map_err(|e| io(e.into()))? {
            let (k, v) = row.map_err(|e| io(e.into()))?;
            let record = Record::decode(v.value()).ok_or_else(|| corrupt(name, "record"))?;
            index.set(
                &bucket,
                k.value(),
                record.at.saturating_add(age),
                record.revision,
            );
        }
    }
    Ok(index)
}

// ---- the expiry index (the writer's) ----

/// When each key of a bucket with a `max_age` falls due, by time: (due, bucket, revision, key).
#[derive(Debug, Default)]
struct Expiries {
    by_time: BTreeSet<(u64, String, Revision, String)>,
    by_key: HashMap<(String, String), (u64, Revision)>,
}

impl Expiries {
    fn set(&mut self, bucket: &str, key: &str, due: u64, revision: Revision) {
        self.remove(bucket, key);
        self.by_key
            .insert((bucket.to_owned(), key.to_owned()), (due, revision));
        self.by_time
            .insert((due, bucket.to_owned(), revision, key.to_owned()));
    }

    fn remove(&mut self, bucket: &str, key: &str) {
        if let Some((due, revision)) = self.by_key.remove(&(bucket.to_owned(), key.to_owned())) {
            self.by_time
                .remove(&(due, bucket.to_owned(), revision, key.to_owned()));
        }
    }

    /// The next instant (µs) something falls due.
    fn next(&self) -> Option<u64> {
        self.by_time.first().map(|(due, ..)| *due)
    }

    /// What fell due strictly before `now`.
    fn due(&self, now: u64) -> Vec<(u64, String, Revision, String)> {
        self.by_time
            .iter()
            .take_while(|(due, ..)| *due < now)
            .cloned()
            .collect()
    }

    fn apply(&mut self, updates: Vec<IndexUpdate>) {
        for u in updates {
            match u {
                IndexUpdate::Set {
                    bucket,
                    key,
                    due,
                    revision,
                } => self.set(&bucket, &key, due, revision),
                IndexUpdate::Remove { bucket, key } => self.remove(&bucket, &key),
            }
        }
    }
}

#[derive(Debug)]
enum IndexUpdate {
    Set {
        bucket: String,
        key: String,
        due: u64,
        revision: Revision,
    },
    Remove {
        bucket: String,
        key: String,
    },
}

// ---- the writer ----

enum Msg {
    Op(Op, oneshot::Sender<Result<Revision, EngineError>>),
    Close(oneshot::Sender<()>),
}

#[derive(Debug)]
enum Op {
    /// Answered with revision 0.
    EnsureBucket(BucketConfig),
    Create {
        bucket: String,
        key: String,
        value: Bytes,
    },
    Put {
        bucket: String,
        key: String,
        value: Bytes,
    },
    Update {
        bucket: String,
        key: String,
        value: Bytes,
        expected: Revision,
    },
    Delete {
        bucket: String,
        key: String,
        expected: Option<Revision>,
    },
}

/// What one committed transaction did.
#[derive(Default)]
struct Applied {
    results: Vec<Result<Revision, EngineError>>,
    /// In the order written (so in revision order per bucket).
    changes: Vec<(String, Change)>,
    index: Vec<IndexUpdate>,
}

enum Woke {
    Message(Option<Msg>),
    Timer,
}

async fn run_writer(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    mut index: Expiries,
) {
    let mut closing = None;
    // After a transaction that failed, expiries wait a moment before they are tried again.
    let mut not_before = Instant::now();
    loop {
        let next = index
            .next()
            .map(|due| shared.clock.instant_of(due + 1).max(not_before));
        let woke = tokio::select! {
            m = rx.recv() => Woke::Message(m),
            () = sleep_until(next) => Woke::Timer,
        };
        let mut batch = Vec::new();
        match woke {
            Woke::Message(Some(Msg::Op(op, tx))) => batch.push((op, tx)),
            Woke::Message(Some(Msg::Close(tx))) => closing = Some(tx),
            // Every handle is gone: close.
            Woke::Message(None) => break,
            // An expiry fell due.
            Woke::Timer => {}
        }
        while closing.is_none() && batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(Msg::Op(op, tx)) => batch.push((op, tx)),
                Ok(Msg::Close(tx)) => closing = Some(tx),
                Err(_) => break,
            }
        }
        let now = shared.clock.now();
        let due = index.due(now);
        if !batch.is_empty() || !due.is_empty() {
            let (ops, answers): (Vec<Op>, Vec<_>) = batch.into_iter().unzip();
            let n = ops.len();
            let run = {
                let shared = shared.clone();
                tokio::task::spawn_blocking(move || apply_batch(&shared, now, due, ops))
            };
            let results = match run.await {
                Ok(Ok(applied)) => {
                    index.apply(applied.index);
                    shared.watchers().publish(&applied.changes);
                    applied.results
                }
                Ok(Err(e)) => {
                    tracing::error!(file = %shared.name, error = %e, "the state file could not be written; the writes were refused");
                    not_before = Instant::now() + RETRY_AFTER_FAILURE;
                    vec![Err(e); n]
                }
                Err(e) => {
                    not_before = Instant::now() + RETRY_AFTER_FAILURE;
                    vec![Err(EngineError::Other(e.to_string())); n]
                }
            };
            for (answer, result) in answers.into_iter().zip(results) {
                let _ = answer.send(result);
            }
        }
        if closing.is_some() {
            break;
        }
    }
    // Closing: what comes after is refused, watches end, the file is closed.
    rx.close();
    while let Ok(m) = rx.try_recv() {
        match m {
            Msg::Op(_, tx) => {
                let _ = tx.send(Err(shared.closed()));
            }
            Msg::Close(tx) => {
                let _ = tx.send(());
            }
        }
    }
    shared.watchers().slots.clear();
    let db = shared.db().take();
    let _ = tokio::task::spawn_blocking(move || drop(db)).await;
    if let Some(tx) = closing {
        let _ = tx.send(());
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One transaction: the expiries due, then the writes; committed, or an `Unavailable` for
/// every write when the file could not be written.
fn apply_batch(
    shared: &Shared,
    now: u64,
    due: Vec<(u64, String, Revision, String)>,
    ops: Vec<Op>,
) -> Result<Applied, EngineError> {
    let mut tx = {
        let db = shared.db();
        let db = db.as_ref().ok_or_else(|| shared.closed())?;
        db.begin_write().map_err(|e| shared.io(e))?
    };
    tx.set_durability(shared.durability)
        .map_err(|e| shared.io(e))?;
    let mut applied = Applied::default();
    {
        let mut w = Batch {
            tx: &tx,
            now,
            name: &shared.name,
            applied: &mut applied,
        };
        w.expire(due).map_err(|e| shared.io(e))?;
        for op in ops {
            let result = w.op(op).map_err(|e| shared.io(e))?;
            w.applied.results.push(result);
        }
    }
    tx.commit().map_err(|e| shared.io(e))?;
    Ok(applied)
}

/// The writes of one transaction.
struct Batch<'t> {
    tx: &'t WriteTransaction,
    now: u64,
    name: &'t str,
    applied: &'t mut Applied,
}

type Io<T> = Result<T, ::redb::Error>;

impl Batch<'_> {
    fn meta(&self, bucket: &str) -> Io<Option<BucketMeta>> {
        let table = self.tx.open_table(BUCKETS)?;
        let found = table.get(bucket)?.map(|g| BucketMeta::decode(g.value()));
        Ok(match found {
            Some(Some(m)) => Some(m),
            Some(None) => {
                tracing::error!(
                    file = self.name,
                    bucket,
                    "an unreadable bucket in the state file"
                );
                None
            }
            None => None,
        })
    }

    fn set_meta(&self, bucket: &str, meta: BucketMeta) -> Io<()> {
        let mut table = self.tx.open_table(BUCKETS)?;
        table.insert(bucket, meta.encode().as_slice())?;
        Ok(())
    }

    fn record(&self, bucket: &str, key: &str) -> Io<Option<Result<Record, EngineError>>> {
        let name = table_name(bucket);
        let table = self
            .tx
            .open_table(TableDefinition::<&str, &[u8]>::new(&name))?;
        let found = table.get(key)?;
        Ok(found.map(|g| Record::decode(g.value()).ok_or_else(|| corrupt(self.name, "record"))))
    }

    fn set_record(&self, bucket: &str, key: &str, record: &Record) -> Io<()> {
        let name = table_name(bucket);
        let mut table = self
            .tx
            .open_table(TableDefinition::<&str, &[u8]>::new(&name))?;
        table.insert(key, record.encode().as_slice())?;
        Ok(())
    }

    fn remove_record(&self, bucket: &str, key: &str) -> Io<()> {
        let name = table_name(bucket);
        let mut table = self
            .tx
            .open_table(TableDefinition::<&str, &[u8]>::new(&name))?;
        table.remove(key)?;
        Ok(())
    }

    /// Appends a write of `key`: the bucket's next revision.
    fn append(
        &mut self,
        bucket: &str,
        mut meta: BucketMeta,
        key: &str,
        kind: Kind,
        value: Bytes,
        at: u64,
    ) -> Io<Revision> {
        meta.last += 1;
        let record = Record {
            revision: meta.last,
            at,
            kind,
            value,
        };
        self.set_meta(bucket, meta)?;
        self.set_record(bucket, key, &record)?;
        self.applied
            .changes
            .push((bucket.to_owned(), record.change(key)));
        let update = match meta.max_age() {
            Some(age) => IndexUpdate::Set {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
                due: at.saturating_add(age),
                revision: record.revision,
            },
            None => IndexUpdate::Remove {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
            },
        };
        self.applied.index.push(update);
        Ok(record.revision)
    }

    /// Applies the expiries that fell due, in the order they did: a value or a deletion
    /// becomes an expiry marker (a write of its own, placed when it fell due), a marker goes
    /// silently.
    fn expire(&mut self, due: Vec<(u64, String, Revision, String)>) -> Io<()> {
        let mut work: BTreeSet<(u64, String, Revision, String)> = due.into_iter().collect();
        while let Some((at, bucket, revision, key)) = work.pop_first() {
            // The index follows the file; should it not, it is put right, never left to fire
            // again.
            let (Some(meta), Some(Ok(record))) = (self.meta(&bucket)?, self.record(&bucket, &key)?)
            else {
                self.applied.index.push(IndexUpdate::Remove { bucket, key });
                continue;
            };
            if record.revision != revision {
                self.applied.index.push(match meta.max_age() {
                    Some(age) => IndexUpdate::Set {
                        due: record.at.saturating_add(age),
                        revision: record.revision,
                        bucket,
                        key,
                    },
                    None => IndexUpdate::Remove { bucket, key },
                });
                continue;
            }
            match record.kind {
                Kind::Value | Kind::Deleted => {
                    let marker =
                        self.append(&bucket, meta, &key, Kind::Expired, Bytes::new(), at)?;
                    if let Some(age) = meta.max_age() {
                        let next = at.saturating_add(age);
                        if next < self.now {
                            work.insert((next, bucket, marker, key));
                        }
                    }
                }
                Kind::Expired => {
                    self.remove_record(&bucket, &key)?;
                    self.applied.index.push(IndexUpdate::Remove { bucket, key });
                }
            }
        }
        Ok(())
    }

    /// One write: its answer, or an I/O failure of the whole transaction.
    fn op(&mut self, op: Op) -> Io<Result<Revision, EngineError>> {
        let now = self.now;
        let (bucket, key) = match &op {
            Op::EnsureBucket(config) => return self.ensure_bucket(config),
            Op::Create { bucket, key, .. }
            | Op::Put { bucket, key, .. }
            | Op::Update { bucket, key, .. }
            | Op::Delete { bucket, key, .. } => (bucket.clone(), key.clone()),
        };
        let Some(meta) = self.meta(&bucket)? else {
            return Ok(Err(EngineError::BucketNotFound(bucket)));
        };
        let current = match self.record(&bucket, &key)? {
            Some(Ok(r)) => Some(r),
            Some(Err(e)) => return Ok(Err(e)),
            None => None,
        };
        let at = current.as_ref().map_or(0, |r| r.revision);
        let conflict = Ok(Err(EngineError::Conflict {
            current_revision: at,
        }));
        let (kind, value) = match op {
            Op::EnsureBucket(_) => unreachable!("answered above"),
            Op::Create { value, .. } => {
                if current.as_ref().is_some_and(|r| r.kind == Kind::Value) {
                    return conflict;
                }
                (Kind::Value, value)
            }
            Op::Put { value, .. } => (Kind::Value, value),
            Op::Update {
                value, expected, ..
            } => {
                if expected != at {
                    return conflict;
                }
                (Kind::Value, value)
            }
            Op::Delete { expected, .. } => {
                if expected.is_some_and(|e| e != at) {
                    return conflict;
                }
                (Kind::Deleted, Bytes::new())
            }
        };
        Ok(Ok(self.append(&bucket, meta, &key, kind, value, now)?))
    }

    fn ensure_bucket(&mut self, config: &BucketConfig) -> Io<Result<Revision, EngineError>> {
        let max_age = config.max_age.map_or(0, micros);
        let meta = match self.meta(&config.name)? {
            Some(m) if m.max_age > 0 && max_age == 0 => {
                return Ok(Err(EngineError::Other(format!(
                    "bucket {}: its max_age cannot be removed",
                    config.name
                ))))
            }
            Some(m) if m.max_age == max_age => return Ok(Ok(0)),
            Some(m) => BucketMeta {
                last: m.last,
                max_age,
            },
            None => BucketMeta { last: 0, max_age },
        };
        self.set_meta(&config.name, meta)?;
        // The table is made with the bucket; a changed age moves every key's expiry.
        let name = table_name(&config.name);
        let table = self
            .tx
            .open_table(TableDefinition::<&str, &[u8]>::new(&name))?;
        if let Some(age) = meta.max_age() {
            for row in table.iter()? {
                let (k, v) = row?;
                if let Some(record) = Record::decode(v.value()) {
                    self.applied.index.push(IndexUpdate::Set {
                        bucket: config.name.clone(),
                        key: k.value().to_owned(),
                        due: record.at.saturating_add(age),
                        revision: record.revision,
                    });
                }
            }
        }
        Ok(Ok(0))
    }
}

// ---- reads ----

impl RedbStore {
    /// Runs `read` on a read transaction on the blocking pool, a few at a time.
    async fn read<T: Send + 'static>(
        shared: Arc<Shared>,
        read: impl FnOnce(&Shared, ::redb::ReadTransaction) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, EngineError> {
        let _permit = shared.reads.acquire().await.map_err(|_| shared.closed())?;
        let task = {
            let shared = shared.clone();
            tokio::task::spawn_blocking(move || {
                let tx = {
                    let db = shared.db();
                    let db = db.as_ref().ok_or_else(|| shared.closed())?;
                    db.begin_read().map_err(|e| shared.io(e))?
                };
                read(&shared, tx)
            })
        };
        task.await.map_err(|e| EngineError::Other(e.to_string()))?
    }
}

/// The bucket's settings, or `BucketNotFound`.
fn read_meta(
    shared: &Shared,
    tx: &::redb::ReadTransaction,
    bucket: &str,
) -> Result<BucketMeta, EngineError> {
    let table = match tx.open_table(BUCKETS) {
        Ok(t) => t,
        Err(::redb::TableError::TableDoesNotExist(_)) => {
            return Err(EngineError::BucketNotFound(bucket.to_owned()))
        }
        Err(e) => return Err(shared.io(e)),
    };
    let found = table.get(bucket).map_err(|e| shared.io(e))?;
    match found {
        Some(g) => BucketMeta::decode(g.value()).ok_or_else(|| corrupt(&shared.name, "bucket")),
        None => Err(EngineError::BucketNotFound(bucket.to_owned())),
    }
}

/// Every write of `bucket` matching `filter` after revision `after`, in revision order.
fn read_since(
    shared: &Shared,
    tx: &::redb::ReadTransaction,
    bucket: &str,
    filter: &str,
    after: Revision,
) -> Result<Vec<Change>, EngineError> {
    read_meta(shared, tx, bucket)?;
    let name = table_name(bucket);
    let table = tx
        .open_table(TableDefinition::<&str, &[u8]>::new(&name))
        .map_err(|e| shared.io(e))?;
    let mut out = BTreeMap::new();
    for row in table.iter().map_err(|e| shared.io(e))? {
        let (k, v) = row.map_err(|e| shared.io(e))?;
        let key = k.value();
        if !subject_matches(filter, key) {
            continue;
        }
        let record = Record::decode(v.value()).ok_or_else(|| corrupt(&shared.name, "record"))?;
        if record.revision > after {
            out.insert(record.revision, record.change(key));
        }
    }
    Ok(out.into_values().collect())
}

// ---- watches ----

#[derive(Default)]
struct Watchers {
    next: u64,
    slots: BTreeMap<u64, Slot>,
}

struct Slot {
    bucket: String,
    filter: String,
    tx: mpsc::Sender<Change>,
    /// A change could not be queued: nothing more is, until the watcher has caught up from
    /// the file.
    behind: bool,
}

impl Watchers {
    /// Hands committed changes to the watchers of their buckets.
    fn publish(&mut self, changes: &[(String, Change)]) {
        for (bucket, change) in changes {
            for slot in self.slots.values_mut() {
                if slot.behind
                    || slot.bucket != *bucket
                    || !subject_matches(&slot.filter, &change.key)
                {
                    continue;
                }
                if slot.tx.try_send(change.clone()).is_err() {
                    slot.behind = true;
                }
            }
        }
    }
}

/// A watch's reading end: its queue, and the file to catch up from.
struct WatchReader {
    shared: Weak<Shared>,
    id: u64,
    bucket: String,
    filter: String,
    rx: mpsc::Receiver<Change>,
    /// Changes read from the file, to deliver first.
    caught_up: VecDeque<Change>,
    /// The last revision delivered.
    last: Revision,
}

impl WatchReader {
    async fn next(&mut self) -> Option<Change> {
        loop {
            if let Some(c) = self.caught_up.pop_front() {
                if c.revision > self.last {
                    self.last = c.revision;
                    return Some(c);
                }
                continue;
            }
            match self.rx.try_recv() {
                Ok(c) => {
                    if c.revision > self.last {
                        self.last = c.revision;
                        return Some(c);
                    }
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            // Behind: clear the mark, then read the file, so that every commit is either in
            // what is read or queued after the mark was cleared.
            let shared = self.shared.upgrade()?;
            let behind = {
                let mut watchers = shared.watchers();
                let slot = watchers.slots.get_mut(&self.id)?;
                std::mem::replace(&mut slot.behind, false)
            };
            if behind {
                let (bucket, filter, after) = (self.bucket.clone(), self.filter.clone(), self.last);
                let read = RedbStore::read(shared, move |shared, tx| {
                    read_since(shared, &tx, &bucket, &filter, after)
                })
                .await;
                match read {
                    Ok(changes) => self.caught_up.extend(changes),
                    Err(e) => {
                        tracing::warn!(error = %e, "a watch could not catch up from the state file; it ends");
                        return None;
                    }
                }
                continue;
            }
            drop(shared);
            let c = self.rx.recv().await?;
            if c.revision > self.last {
                self.last = c.revision;
                return Some(c);
            }
        }
    }
}

impl Drop for WatchReader {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.watchers().slots.remove(&self.id);
        }
    }
}

impl Store for RedbStore {
    fn ensure_bucket(&self, config: BucketConfig) -> BoxFuture<'static, Result<(), EngineError>> {
        if let Err(e) = config.validate() {
            return Box::pin(async move { Err(e) });
        }
        let write = self.write(Op::EnsureBucket(config));
        Box::pin(async move { write.await.map(drop) })
    }

    fn get(
        &self,
        bucket: &str,
        key: &str,
    ) -> BoxFuture<'static, Result<Option<Entry>, EngineError>> {
        let (shared, bucket, key) = (self.shared.clone(), bucket.to_owned(), key.to_owned());
        Box::pin(async move {
            check_bucket(&bucket)?;
            check_key(&key)?;
            RedbStore::read(shared, move |shared, tx| {
                let meta = read_meta(shared, &tx, &bucket)?;
                let name = table_name(&bucket);
                let table = tx
                    .open_table(TableDefinition::<&str, &[u8]>::new(&name))
                    .map_err(|e| shared.io(e))?;
                let Some(found) = table.get(key.as_str()).map_err(|e| shared.io(e))? else {
                    return Ok(None);
                };
                let record =
                    Record::decode(found.value()).ok_or_else(|| corrupt(&shared.name, "record"))?;
                // Past its age, a value is gone, whether or not its expiry is written yet.
                let aged = meta
                    .max_age()
                    .is_some_and(|age| record.at.saturating_add(age) < shared.clock.now());
                Ok((record.kind == Kind::Value && !aged).then(|| Entry {
                    key,
                    value: record.value,
                    revision: record.revision,
                }))
            })
            .await
        })
    }

    fn create(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let checked = check_bucket(bucket).and_then(|()| check_key(key));
        match checked {
            Ok(()) => self.write(Op::Create {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
                value,
            }),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn put(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let checked = check_bucket(bucket).and_then(|()| check_key(key));
        match checked {
            Ok(()) => self.write(Op::Put {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
                value,
            }),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn update(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let checked = check_bucket(bucket).and_then(|()| check_key(key));
        match checked {
            Ok(()) => self.write(Op::Update {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
                value,
                expected,
            }),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn delete(
        &self,
        bucket: &str,
        key: &str,
        expected: Option<Revision>,
    ) -> BoxFuture<'static, Result<Revision, EngineError>> {
        let checked = check_bucket(bucket).and_then(|()| check_key(key));
        match checked {
            Ok(()) => self.write(Op::Delete {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
                expected,
            }),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn watch(&self, bucket: &str, filter: &str) -> BoxFuture<'static, Result<Watch, EngineError>> {
        let (shared, bucket, filter) = (self.shared.clone(), bucket.to_owned(), filter.to_owned());
        Box::pin(async move {
            check_bucket(&bucket)?;
            check_key_filter(&filter)?;
            if shared.db().is_none() {
                return Err(shared.closed());
            }
            // Registered first, then the file read: every commit is either in what is read or
            // queued for the watch after it (read twice, it is delivered once).
            let (tx, rx) = mpsc::channel(WATCH_QUEUE);
            let id = {
                let mut watchers = shared.watchers();
                watchers.next += 1;
                let id = watchers.next;
                watchers.slots.insert(
                    id,
                    Slot {
                        bucket: bucket.clone(),
                        filter: filter.clone(),
                        tx,
                        behind: false,
                    },
                );
                id
            };
            let mut reader = WatchReader {
                shared: Arc::downgrade(&shared),
                id,
                bucket,
                filter,
                rx,
                caught_up: VecDeque::new(),
                last: 0,
            };
            let (b, f) = (reader.bucket.clone(), reader.filter.clone());
            let latest =
                RedbStore::read(shared, move |shared, tx| read_since(shared, &tx, &b, &f, 0))
                    .await?;
            reader.caught_up.extend(latest);
            Ok(Watch::new(futures_util::stream::unfold(
                reader,
                |mut reader| async move {
                    let change = reader.next().await?;
                    Some((change, reader))
                },
            )))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(what: &str) -> PathBuf {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gateway-redb-{what}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    async fn open_at(dir: &Path, wall: SystemTime) -> RedbStore {
        let file = open_file(dir, &dir.join(STATE_FILE)).unwrap();
        let options = RedbOptions {
            wall_clock: Some(wall),
            ..RedbOptions::default()
        };
        RedbStore::open_with_backend(
            ::redb::backends::FileBackend::new(file),
            dir.display().to_string(),
            options,
        )
        .await
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn an_age_counts_in_wall_clock_time_across_a_restart() {
        let dir = scratch("age");
        let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let age = Duration::from_secs(60);
        let store = open_at(&dir, t0).await;
        store
            .ensure_bucket(BucketConfig::with_max_age("s", age))
            .await
            .unwrap();
        let r1 = store.put("s", "k", Bytes::from("v")).await.unwrap();
        store.close().await;

        // Opened 50 s of wall-clock time later: 10 s of its age are left, not 60.
        let store = open_at(&dir, t0 + Duration::from_secs(50)).await;
        let got = store.get("s", "k").await.unwrap().map(|e| e.revision);
        assert_eq!(got, Some(r1), "not expired before its age");
        let mut watch = store.watch("s", ">").await.unwrap();
        assert_eq!(watch.next().await.map(|c| c.revision), Some(r1));
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(store.get("s", "k").await.unwrap().is_some(), "at 59 s");
        let expired = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .expect("the expiry is written on time")
            .expect("the watch goes on");
        assert_eq!(
            (expired.revision, expired.kind),
            (r1 + 1, ChangeKind::Expired)
        );
        assert_eq!(store.get("s", "k").await.unwrap(), None);
        store.close().await;

        // Much later, the marker itself has aged out: the key is at revision 0 again.
        let store = open_at(&dir, t0 + Duration::from_secs(1000)).await;
        assert_eq!(
            store.update("s", "k", Bytes::from("w"), 0).await,
            Ok(r1 + 2)
        );
        store.close().await;
    }

    #[tokio::test]
    async fn the_directory_and_the_file_are_private_and_a_second_gateway_is_refused() {
        let dir = scratch("modes").join("state");
        let store = RedbStore::open(&dir).await.unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&dir), 0o700);
            assert_eq!(mode(&dir.join(STATE_FILE)), 0o600);
        }
        let second = RedbStore::open(&dir).await;
        assert!(
            matches!(&second, Err(OpenError::InUse { path }) if path.ends_with(STATE_FILE)),
            "{second:?}"
        );
        store.close().await;
        let again = RedbStore::open(&dir).await.expect("closed: it opens again");
        again.close().await;
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_store_or_from_a_newer_version_is_refused_and_kept() {
        let dir = scratch("bad");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(STATE_FILE);
        let junk = vec![7u8; 9000];
        std::fs::write(&path, &junk).unwrap();
        let refused = RedbStore::open(&dir).await.unwrap_err();
        let message = refused.to_string();
        assert!(
            matches!(refused, OpenError::Unreadable { .. }) && message.contains(STATE_FILE),
            "{message}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), junk, "never replaced");

        let dir = scratch("newer");
        let store = RedbStore::open(&dir).await.unwrap();
        store.close().await;
        {
            let db = Database::open(dir.join(STATE_FILE)).unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(META)
                .unwrap()
                .insert("format", FORMAT + 1)
                .unwrap();
            tx.commit().unwrap();
        }
        let refused = RedbStore::open(&dir).await.unwrap_err();
        assert!(
            matches!(refused, OpenError::Newer { found, .. } if found == FORMAT + 1),
            "{refused}"
        );
        assert!(refused.to_string().contains("newer version"), "{refused}");
    }

    #[tokio::test]
    async fn after_close_everything_is_unavailable_and_watches_end() {
        let store = RedbStore::open(&scratch("closed")).await.unwrap();
        store.ensure_bucket(BucketConfig::new("b")).await.unwrap();
        store.put("b", "k", Bytes::from("v")).await.unwrap();
        let mut watch = store.watch("b", ">").await.unwrap();
        assert!(watch.next().await.is_some());
        store.close().await;
        assert_eq!(watch.next().await, None, "the watch ends with the file");
        assert!(matches!(
            store.put("b", "k", Bytes::from("w")).await,
            Err(EngineError::Unavailable(_))
        ));
        assert!(matches!(
            store.get("b", "k").await,
            Err(EngineError::Unavailable(_))
        ));
    }
}
