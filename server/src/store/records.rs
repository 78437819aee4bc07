//! A single gateway's side of the records machine (`gateway_core::records`): the sessions
//! the core asks to keep ([`ClusterAction::StoreSession`]) are written to the store, and those
//! it asks for after a restart ([`ClusterAction::LoadSession`]) are read from it; the answers
//! go back to the driver as [`ClusterEvent::SessionStored`] and [`ClusterEvent::SessionLoaded`].
//! Nothing here decides; it only moves bytes. (In a cluster, `cluster/replica.rs` does the same
//! with the cluster's engine, besides everything else a replica does.)
//!
//! Bucket `sessions` (`max_age` the session idle TTL): key the session id, value a
//! [`SessionRecord`]. A session's writes are carried out in the order the core made them, by
//! one task; reads run beside it.
//!
//! Bucket `coordination` (issue 25): the coordination records the core hands out in numbered
//! batches ([`ClusterAction::StoreCoord`]; keys and contents are the core's,
//! `gateway_core::coord::persist`), each value stamped with the wall-clock time of its write
//! (`<milliseconds since the epoch>\n<record>`) so that a restart gives each record back with
//! its age. One task writes the batches in order: every batch waiting when it is free is
//! written at once (the embedded engine commits what arrives together with one sync), and
//! each is reported done, in order, once all its writes are durable. [`load_coordination`]
//! reads them all back at start.
//!
//! Bucket `pins` (with `ServerOptions::pins_in_store`): sled identity pins, key
//! `p.<project>`, value the pin's JSON. A first-use pin is a create
//! ([`ClusterAction::CreatePin`]; a key there already wins, answered
//! [`ClusterEvent::PinCreated`]) and a re-pin a put ([`ClusterAction::StorePin`]).
//! [`load_pins`] reads them at start; [`import_pin_file`] moves a pin file of an earlier
//! version in, once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gateway_core::cluster::{ClusterAction, ClusterEvent, EngineDown, PinOutcome, SessionRecord};
use gateway_core::coord::{RecordChange, StoredRecord};
use gateway_core::{Pin, Pins};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{BucketConfig, EngineError, Store, MIN_MAX_AGE};
use crate::cluster::replica::{key_project, project_key};
use crate::cluster::seal::WallClock;
use crate::driver::Command;

/// The sessions' bucket.
pub const SESSIONS: &str = "sessions";

/// The coordination records' bucket.
pub const COORDINATION: &str = "coordination";

/// The sled identity pins' bucket.
pub const PINS: &str = "pins";

/// What a pin file is renamed to (`<file>.imported`) once its pins are in the store.
pub const IMPORTED_SUFFIX: &str = "imported";

/// The key written last when the records are read back: once the watch reports it, it has
/// reported every record before it.
const LOADED_MARK: &str = "_loaded";

/// How a coordination record's bytes go into its bucket: as they are (a single gateway's own
/// file), or sealed under the cluster secret (a cluster's engine, `cluster/replica.rs`).
pub(crate) type Wrap = Arc<dyn Fn(&str, &[u8]) -> Bytes + Send + Sync>;

/// How they come back: `None` for a value that does not verify (skipped).
pub(crate) type Unwrap = Arc<dyn Fn(&str, &[u8]) -> Option<Bytes> + Send + Sync>;

/// Records kept as they are.
fn plain() -> (Wrap, Unwrap) {
    (
        Arc::new(|_, v| Bytes::copy_from_slice(v)),
        Arc::new(|_, v| Some(Bytes::copy_from_slice(v))),
    )
}

/// The driver's handle on the records' tasks.
#[derive(Debug)]
pub(crate) struct RecordsIo {
    actions: mpsc::UnboundedSender<ClusterAction>,
}

impl RecordsIo {
    /// Hands an action over. Unbounded: each answers an event the driver took in (a new
    /// session, a change of one, a request naming one), so they are bounded by those.
    pub(crate) fn act(&self, action: ClusterAction) {
        if self.actions.send(action).is_err() {
            tracing::error!("the store's executor is gone; a session action was dropped");
        }
    }
}

/// Makes the sessions' bucket and starts the executor, which ends (after finishing what it
/// was handed) once the driver is gone. Fails when the store cannot be written.
pub(crate) async fn start(
    store: Arc<dyn Store>,
    session_ttl: Duration,
    clock: WallClock,
    counters: Arc<crate::fleet::ServerCounters>,
    commands: mpsc::WeakSender<Command>,
) -> Result<(RecordsIo, tokio::task::JoinHandle<()>), EngineError> {
    store
        .ensure_bucket(BucketConfig::with_max_age(
            SESSIONS,
            session_ttl.max(MIN_MAX_AGE),
        ))
        .await?;
    store.ensure_bucket(BucketConfig::new(COORDINATION)).await?;
    store.ensure_bucket(BucketConfig::new(PINS)).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    let executor = tokio::spawn(execute(store, rx, (clock, counters), commands));
    Ok((RecordsIo { actions: tx }, executor))
}

/// Sends an event to the driver; `false` when it is gone.
async fn tell(commands: &mpsc::WeakSender<Command>, event: ClusterEvent) -> bool {
    match commands.upgrade() {
        Some(tx) => tx.send(Command::Cluster(event)).await.is_ok(),
        None => false,
    }
}

async fn execute(
    store: Arc<dyn Store>,
    mut actions: mpsc::UnboundedReceiver<ClusterAction>,
    clocked: (WallClock, Arc<crate::fleet::ServerCounters>),
    commands: mpsc::WeakSender<Command>,
) {
    let mut reads = JoinSet::new();
    let (writes, write_rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_in_order(store.clone(), write_rx, commands.clone()));
    let (batches, batch_rx) = mpsc::unbounded_channel();
    let coord_writer = tokio::spawn(write_batches(
        store.clone(),
        (COORDINATION.to_owned(), plain().0),
        batch_rx,
        clocked,
        commands.clone(),
    ));
    while let Some(action) = actions.recv().await {
        match action {
            ClusterAction::StoreSession { session, record } => {
                let _ = writes.send((session, record));
            }
            ClusterAction::StoreCoord { batch, changes } => {
                let _ = batches.send((batch, changes));
            }
            ClusterAction::LoadSession { session } => {
                let (store, commands) = (store.clone(), commands.clone());
                reads.spawn(async move {
                    let record = match store.get(SESSIONS, &session).await {
                        Ok(None) => Ok(None),
                        Ok(Some(entry)) => match SessionRecord::parse(&entry.value) {
                            Ok(r) => Ok(Some(r)),
                            Err(e) => {
                                tracing::warn!(error = %e, "an unreadable session record");
                                Ok(None)
                            }
                        },
                        // A session id that is not a key (not one this gateway made).
                        Err(EngineError::Invalid(_)) => Ok(None),
                        Err(e) => {
                            tracing::warn!(error = %e, "reading a session from the store");
                            Err(EngineDown)
                        }
                    };
                    let under_previous_secret = false;
                    tell(
                        &commands,
                        ClusterEvent::SessionLoaded {
                            session,
                            record,
                            under_previous_secret,
                        },
                    )
                    .await;
                });
            }
            ClusterAction::CreatePin { project, pin } => {
                let (store, commands) = (store.clone(), commands.clone());
                reads.spawn(async move {
                    let outcome = create_pin(&store, &project, &pin).await;
                    tell(&commands, ClusterEvent::PinCreated { project, outcome }).await;
                });
            }
            ClusterAction::StorePin { project, pin } => {
                let store = store.clone();
                reads.spawn(async move {
                    let value = Bytes::from(serde_json::to_vec(&pin).expect("a pin serialises"));
                    if let Err(e) = store.put(PINS, &project_key(&project), value).await {
                        tracing::error!(project, error = %e, "a re-pin was not written to the store; the old pin is back after a restart");
                    }
                });
            }
            other => tracing::error!(
                ?other,
                "an action for a cluster's engine on a single gateway; ignored"
            ),
        }
        // Reap the reads that are done, so the set holds only those in flight.
        while reads.try_join_next().is_some() {}
    }
    // The driver is gone: the writes it asked for are finished.
    drop((writes, batches));
    let _ = writer.await;
    let _ = coord_writer.await;
    while reads.join_next().await.is_some() {}
}

async fn write_in_order(
    store: Arc<dyn Store>,
    mut writes: mpsc::UnboundedReceiver<(String, Option<SessionRecord>)>,
    commands: mpsc::WeakSender<Command>,
) {
    while let Some((session, record)) = writes.recv().await {
        let written = match &record {
            Some(r) => store
                .put(SESSIONS, &session, Bytes::from(r.to_json()))
                .await
                .map(drop),
            None => store.delete(SESSIONS, &session, None).await.map(drop),
        };
        if let Err(e) = &written {
            tracing::warn!(error = %e, "writing a session to the store");
        }
        let written = written.is_ok();
        tell(&commands, ClusterEvent::SessionStored { session, written }).await;
    }
}

/// Writes the coordination batches to `bucket` in order: all those waiting together, then
/// each reported.
pub(crate) async fn write_batches(
    store: Arc<dyn Store>,
    (bucket, wrap): (String, Wrap),
    mut batches: mpsc::UnboundedReceiver<(u64, Vec<RecordChange>)>,
    (clock, counters): (WallClock, Arc<crate::fleet::ServerCounters>),
    commands: mpsc::WeakSender<Command>,
) {
    while let Some(first) = batches.recv().await {
        let mut waiting = vec![first];
        while let Ok(more) = batches.try_recv() {
            waiting.push(more);
        }
        // The last change of each key wins: writes of one key in one go would race.
        let mut last: BTreeMap<String, Option<Vec<u8>>> = BTreeMap::new();
        for (_, changes) in &waiting {
            for c in changes {
                last.insert(c.key.clone(), c.value.clone());
            }
        }
        let at = clock();
        let started = tokio::time::Instant::now();
        let writes = last.into_iter().map(|(key, value)| {
            let (store, bucket) = (store.clone(), bucket.clone());
            let value = value.map(|v| {
                let mut stamped = format!("{at}\n").into_bytes();
                stamped.extend_from_slice(&v);
                wrap(&key, &stamped)
            });
            async move {
                let done = match value {
                    Some(v) => store.put(&bucket, &key, v).await.map(drop),
                    None => store.delete(&bucket, &key, None).await.map(drop),
                };
                (key, done)
            }
        });
        let failed: Vec<String> = futures_util::future::join_all(writes)
            .await
            .into_iter()
            .filter_map(|(key, done)| match done {
                Ok(()) => None,
                Err(e) => {
                    tracing::warn!(key, error = %e, "writing a coordination record to the store");
                    Some(key)
                }
            })
            .collect();
        counters
            .store_writes
            .observe(started.elapsed(), failed.len());
        for (batch, changes) in waiting {
            let failed: Vec<String> = changes
                .into_iter()
                .map(|c| c.key)
                .filter(|k| failed.contains(k))
                .collect();
            if !tell(&commands, ClusterEvent::CoordStored { batch, failed }).await {
                // The driver is gone: what is left is still written.
                continue;
            }
        }
    }
}

/// Reads every coordination record back, each with its age, for the core to take back at
/// start (`gateway_core::Gateway::restore_coordination`). A record that does not carry its
/// write time is given back as written now (the core skips what it cannot read).
pub async fn load_coordination(
    store: &Arc<dyn Store>,
    clock: &WallClock,
) -> Result<Vec<StoredRecord>, EngineError> {
    store.ensure_bucket(BucketConfig::new(COORDINATION)).await?;
    load_records(
        store,
        (COORDINATION, ">", LOADED_MARK),
        clock,
        &plain().1,
        Duration::ZERO,
    )
    .await
}

/// Reads the records of `bucket` under `filter` back, each with its age, by a watch and then
/// a `mark` written after it (once the watch reports the mark, it reported everything before
/// it). `skew` is taken off each age: a record written by another machine, whose clock may be
/// ahead, is never taken for older than it is.
pub(crate) async fn load_records(
    store: &Arc<dyn Store>,
    (bucket, filter, mark_key): (&str, &str, &str),
    clock: &WallClock,
    unwrap: &Unwrap,
    skew: Duration,
) -> Result<Vec<StoredRecord>, EngineError> {
    let mut watch = store.watch(bucket, filter).await?;
    let mark = store
        .put(bucket, mark_key, Bytes::from_static(b"1"))
        .await?;
    let now = clock();
    let mut records: BTreeMap<String, StoredRecord> = BTreeMap::new();
    while let Some(change) = watch.next().await {
        if change.key == mark_key {
            if change.revision >= mark {
                return Ok(records.into_values().collect());
            }
            continue;
        }
        match change.kind {
            super::ChangeKind::Put(value) => {
                let Some(value) = unwrap(&change.key, &value) else {
                    records.remove(&change.key);
                    continue;
                };
                let (at, record) = match value.iter().position(|b| *b == b'\n') {
                    Some(nl) => (
                        std::str::from_utf8(&value[..nl])
                            .ok()
                            .and_then(|s| s.parse::<u64>().ok()),
                        value[nl + 1..].to_vec(),
                    ),
                    None => (None, value.to_vec()),
                };
                let age = Duration::from_millis(now.saturating_sub(at.unwrap_or(now)))
                    .saturating_sub(skew);
                records.insert(
                    change.key.clone(),
                    StoredRecord {
                        key: change.key,
                        value: record,
                        age,
                    },
                );
            }
            _ => {
                records.remove(&change.key);
            }
        }
    }
    Err(EngineError::Unavailable(
        "the coordination records' watch ended before they were all read".into(),
    ))
}

/// A first-use pin's create: `Created`, or the pin the store holds already (it wins), or
/// `Unavailable` when the store cannot be asked (the sled is sent away to try again).
async fn create_pin(store: &Arc<dyn Store>, project: &str, pin: &Pin) -> PinOutcome {
    let key = project_key(project);
    let value = Bytes::from(serde_json::to_vec(pin).expect("a pin serialises"));
    match store.create(PINS, &key, value).await {
        Ok(_) => PinOutcome::Created,
        Err(EngineError::Conflict { .. }) => match store.get(PINS, &key).await {
            Ok(Some(entry)) => match serde_json::from_slice(&entry.value) {
                Ok(existing) => PinOutcome::Exists(existing),
                Err(e) => {
                    tracing::error!(project, error = %e, "an unreadable pin in the store");
                    PinOutcome::Unavailable
                }
            },
            Ok(None) | Err(_) => PinOutcome::Unavailable,
        },
        Err(e) => {
            tracing::warn!(project, error = %e, "pinning a sled's key in the store");
            PinOutcome::Unavailable
        }
    }
}

/// Reads the pins kept in the store, for the core to take before its first event. A pin that
/// does not parse stops the start: forgetting it would let any key pin its project anew.
pub async fn load_pins(store: &Arc<dyn Store>) -> Result<Pins, String> {
    store
        .ensure_bucket(BucketConfig::new(PINS))
        .await
        .map_err(|e| e.to_string())?;
    let clock: WallClock = Arc::new(|| 0);
    let records = load_records(
        store,
        (PINS, ">", LOADED_MARK),
        &clock,
        &plain().1,
        Duration::ZERO,
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut pins = Pins::default();
    for r in records {
        let Some(project) = key_project(&r.key) else {
            continue;
        };
        let pin: Pin = serde_json::from_slice(&r.value).map_err(|e| {
            format!("the pin of project '{project}' in the store does not parse: {e}")
        })?;
        pins.pins.insert(project, pin);
    }
    Ok(pins)
}

/// Moves the pins of a pin file (as an earlier version kept them) into the store, once: each
/// is created there (a pin the store holds already wins, with a warning), then the file is
/// renamed `<file>.imported`. `Ok(None)`: there is no file. A crash before the rename imports
/// it again at the next start, which changes nothing.
pub async fn import_pin_file(
    store: &Arc<dyn Store>,
    file: &std::path::Path,
) -> Result<Option<(usize, std::path::PathBuf)>, String> {
    let Some(pins) = crate::fleet::load_pins(file).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    store
        .ensure_bucket(BucketConfig::new(PINS))
        .await
        .map_err(|e| e.to_string())?;
    for (project, pin) in &pins.pins {
        match create_pin(store, project, pin).await {
            PinOutcome::Created => {}
            PinOutcome::Exists(kept) if kept == *pin => {}
            PinOutcome::Exists(kept) => tracing::warn!(
                project,
                file_key = pin.key,
                kept_key = kept.key,
                "the pin file and the store pin a project to different keys; the store's is kept"
            ),
            PinOutcome::Unavailable => {
                return Err(format!(
                    "cannot move the pin of project '{project}' from {} into the state store",
                    file.display()
                ))
            }
        }
    }
    let mut imported = file.as_os_str().to_owned();
    imported.push(".");
    imported.push(IMPORTED_SUFFIX);
    let imported = std::path::PathBuf::from(imported);
    std::fs::rename(file, &imported).map_err(|e| {
        format!(
            "the pins of {} are in the state store, but the file cannot be renamed to {}: {e}",
            file.display(),
            imported.display()
        )
    })?;
    crate::fleet::sync_dir(&imported);
    Ok(Some((pins.pins.len(), imported)))
}
