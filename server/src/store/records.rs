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

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gateway_core::cluster::{ClusterAction, ClusterEvent, EngineDown, SessionRecord};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{BucketConfig, EngineError, Store, MIN_MAX_AGE};
use crate::driver::Command;

/// The sessions' bucket.
pub const SESSIONS: &str = "sessions";

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
    commands: mpsc::WeakSender<Command>,
) -> Result<(RecordsIo, tokio::task::JoinHandle<()>), EngineError> {
    store
        .ensure_bucket(BucketConfig::with_max_age(
            SESSIONS,
            session_ttl.max(MIN_MAX_AGE),
        ))
        .await?;
    let (tx, rx) = mpsc::unbounded_channel();
    let executor = tokio::spawn(execute(store, rx, commands));
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
    commands: mpsc::WeakSender<Command>,
) {
    let mut reads = JoinSet::new();
    let (writes, write_rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_in_order(store.clone(), write_rx, commands.clone()));
    while let Some(action) = actions.recv().await {
        match action {
            ClusterAction::StoreSession { session, record } => {
                let _ = writes.send((session, record));
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
            other => tracing::error!(
                ?other,
                "an action for a cluster's engine on a single gateway; ignored"
            ),
        }
        // Reap the reads that are done, so the set holds only those in flight.
        while reads.try_join_next().is_some() {}
    }
    // The driver is gone: the writes it asked for are finished.
    drop(writes);
    let _ = writer.await;
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
